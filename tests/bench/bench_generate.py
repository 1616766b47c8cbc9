#!/usr/bin/env python3
"""bench_generate.py --tpserve BIN [--cache build/real] [--concurrency 1,8,32] [--new-tokens 64]
                    [--recompute-tokens 64,16,8] [--repeats 2] [--keep DIR]

Text generation on a GPT-2-small-shaped causal LM (tests/bench/export_gen_real.py
exports it into the cache when missing), imported with `--generate
--max-seq-len 128` at world size 1 and 2 and served by tpserve (cpu backend,
ranks as threads, --generate-slots 32, buckets 1..64), against three anchors
run in this process on as many threads as this process may use (onnxruntime
intra-op threads, torch.set_num_threads; tpserve's GEMM threads x ranks, from
its startup log, are printed beside):

- ort recompute: a greedy loop of onnxruntime over the same ONNX file, each
  step running the whole growing sequence (batch = the concurrent sequences,
  equal-length prompts, so no mask);
- ort KV cache: onnxruntime over gpt2_gen_kv.onnx (the model exported with
  use_cache=True), the prompt once, then one token per step on the cache;
- HF generate: transformers' model.generate(do_sample=False) in torch,
  batch = the concurrent sequences.

Every sequence has a PROMPT-token prompt (random ids, fixed seed) and asks
for --new-tokens tokens (no stop ids). tpserve is measured through
/generate_stream with one connection per sequence, all started together;
each token's arrival time is taken when its event is read. Per row:

- tokens/s: all sequences' new tokens / wall time (first request sent to
  last token received);
- TPOT ms: per sequence (t_last - t_first) / (n - 1), median over sequences;
- TTFT ms: per sequence, first token - request sent, median;
- / ort, / HF: tokens/s over the ort recompute and HF generate rows of the
  same concurrency;
- = ref: how many sequences' tokens equal the reference: HF generate's for
  every other engine, the ort recompute loop's for HF generate.

The full recompute grows quadratically, so it generates --recompute-tokens
(one count per concurrency) tokens instead: its tokens/s are then those of
shorter sequences, an upper bound on its rate at --new-tokens. The engines
run interleaved (each round runs every engine at every concurrency), the
round repeated --repeats times; cells are medians over the rounds, and the
load average is printed. Exits 1 when an import fails, a server will not
start, or a sequence's tokens differ from the reference; never on timings.
Needs numpy, onnx, onnxruntime, torch, transformers, onnxscript."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import onnxruntime as ort
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import bench_import as bi  # noqa: E402
import bench_real as br  # noqa: E402
import export_gen_real as eg  # noqa: E402
import generate_client as gc  # noqa: E402

PROMPT = 32
MAX_SEQ = 128
SLOTS = 32
BUCKETS = "1,2,4,8,16,32,64"
VOCAB = 50257


class Run:
    """One engine's run at one concurrency: every sequence's new tokens and
    their arrival times (perf_counter), from a common start."""

    def __init__(self, start, tokens, times):
        self.start, self.tokens, self.times = start, tokens, times

    def summary(self):
        n = sum(len(t) for t in self.tokens)
        end = max(t[-1] for t in self.times)
        return {"tps": n / (end - self.start),
                "tpot": 1e3 * float(np.median([(t[-1] - t[0]) / (len(t) - 1) for t in self.times])),
                "ttft": 1e3 * float(np.median([t[0] - self.start for t in self.times]))}


def tpserve_run(url, model, prompts, new):
    """One /generate_stream connection per prompt, all sent together."""
    c = len(prompts)
    tokens, times, errors = [[] for _ in range(c)], [[] for _ in range(c)], []
    barrier = threading.Barrier(c + 1)

    def one(i):
        try:
            barrier.wait()
            conn, resp = gc.post(url, model, "generate_stream", prompts[i], new)
            for _, data in gc.events(resp):
                doc = json.loads(data)
                if "finish_reason" in doc:
                    break
                tokens[i] += doc["output_ids"]
                times[i].append(time.perf_counter())
            conn.close()
            if len(tokens[i]) != new:
                errors.append("sequence %d: %d tokens of %d" % (i, len(tokens[i]), new))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("sequence %d: %s" % (i, e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(c)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    return Run(start, tokens, times)


def batch_run(step, prompts, new):
    """A batch engine's greedy loop: step(i, ids) -> next tokens [c] for the
    i-th step; every sequence gets its token at the same time."""
    start = time.perf_counter()
    ids = np.array(prompts, np.int64)
    out, stamps = [], []
    for i in range(new):
        nxt = step(i, ids)
        stamps.append(time.perf_counter())
        out.append(nxt)
        ids = np.concatenate([ids, nxt[:, None]], axis=1)
    tokens = np.stack(out, 1).tolist()
    return Run(start, tokens, [stamps] * len(prompts))


def ort_recompute(sess):
    return lambda i, ids: sess.run(None, {"input_ids": ids})[0][:, -1].argmax(-1).astype(np.int64)


def ort_cached(sess):
    state = {}

    def step(i, ids):
        c = ids.shape[0]
        if i == 0:
            feed, pos = ids, np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
            state["past"] = np.zeros((eg.LAYERS, 2, c, eg.HEADS, 0, eg.HEAD_DIM), np.float32)
        else:
            feed, pos = ids[:, -1:], np.full((c, 1), ids.shape[1] - 1)
        logits, state["past"] = sess.run(None, {"input_ids": np.ascontiguousarray(feed),
                                                "position_ids": pos.astype(np.int64), "past": state["past"]})
        return logits.argmax(-1).astype(np.int64)
    return step


class Stamps:
    """A generate() streamer that keeps each new token's arrival time (its
    first put is the prompt)."""

    def __init__(self):
        self.times, self.prompt_seen = [], False

    def put(self, value):
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self):
        pass


def hf_run(model, prompts, new):
    ids = torch.tensor(prompts)
    stamps = Stamps()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             min_new_tokens=new, pad_token_id=0, eos_token_id=None, streamer=stamps)
    return Run(start, out[:, ids.shape[1]:].tolist(), [stamps.times] * len(prompts))


def session(path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def serve(a, graph, ws, prefill, tmp):
    """(process, url, model name, GEMM threads per rank) of tpserve serving GRAPH."""
    log_path = os.path.join(tmp, "tp%d_%s.log" % (ws, prefill))
    with open(log_path, "w") as log:
        try:
            proc, port = bi.start_server(a.tpserve, graph, log, ["--threads", "0", "--generate-slots", str(SLOTS),
                                                                 "--buckets", BUCKETS, "--generate-prefill", prefill])
        except SystemExit as e:
            raise SystemExit("bench_generate: ws %d: tpserve: %s (%s)" % (ws, br.server_error(log_path), e))
    with open(log_path) as f:
        found = re.search(r"GEMMs on (\d+) threads? per rank", f.read())
    with open(graph) as f:
        name = json.load(f)["name"]
    return proc, "http://127.0.0.1:%d" % port, name, int(found.group(1)) if found else 0


def agree(run, ref):
    """Sequences of RUN whose tokens equal REF's, over the tokens both have
    (the full recompute generates fewer)."""
    return sum(t[:len(r)] == r[:len(t)] for t, r in zip(run.tokens, ref.tokens))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tpserve", required=True)
    ap.add_argument("--cache", default=os.path.join(ROOT, "build", "real"), help="the exports (export_gen_real.py)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--recompute-tokens", default="64,16,8", help="the full recompute's tokens, per concurrency")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prefill", default="mixed,separate", help="tpserve's generate_prefill modes to run")
    ap.add_argument("--keep", help="write the imported graphs and server logs here (default: a temporary directory)")
    a = ap.parse_args()
    conc = [int(x) for x in a.concurrency.split(",")]
    modes = a.prefill.split(",")
    recompute = dict(zip(conc, (int(x) for x in a.recompute_tokens.split(","))))
    if len(recompute) != len(conc) or max(conc) > SLOTS or PROMPT + a.new_tokens > MAX_SEQ:
        ap.error("one --recompute-tokens per concurrency, at most %d sequences, prompt %d + new tokens <= %d"
                 % (SLOTS, PROMPT, MAX_SEQ))
    plain, cached = os.path.join(a.cache, "gpt2_gen.onnx"), os.path.join(a.cache, "gpt2_gen_kv.onnx")
    if not (os.path.exists(plain) and os.path.exists(cached)):
        if subprocess.run([sys.executable, os.path.join(HERE, "export_gen_real.py"), "--cache", a.cache]).returncode:
            sys.exit("bench_generate: the export failed (export_gen_real.py, above)")
    tmp = a.keep or tempfile.mkdtemp(prefix="bench_generate.")
    os.makedirs(tmp, exist_ok=True)
    threads = len(os.sched_getaffinity(0))
    servers, imports = {}, {}
    try:
        for ws in (1, 2):
            graph = os.path.join(tmp, "gpt2_gen_tp%d.json" % ws)
            imports[ws], _, err = br.run_import(plain, ws, graph, ["--generate", "--max-seq-len", str(MAX_SEQ)])
            if err:
                sys.exit("bench_generate: import at ws %d failed: %s" % (ws, err))
            for mode in modes:
                servers[(ws, mode)] = serve(a, graph, ws, mode, tmp)
            print("bench_generate: ws %d imported in %.1f s, serving" % (ws, imports[ws]), file=sys.stderr, flush=True)
        torch.set_num_threads(threads)
        model = eg.model()
        full, kv = session(plain, threads), session(cached, threads)
        prompts = np.random.default_rng(53).integers(0, VOCAB, (max(conc), PROMPT)).tolist()
        engines = [("tpserve " + mode, ws, lambda p, n, s=servers[(ws, mode)]: tpserve_run(s[1], s[2], p, n))
                   for ws in (1, 2) for mode in modes]
        engines += [("ort recompute", 1, lambda p, n: batch_run(ort_recompute(full), p, n)),
                    ("ort KV cache", 1, lambda p, n: batch_run(ort_cached(kv), p, n)),
                    ("HF generate", 1, lambda p, n: hf_run(model, p, n))]
        for _, _, fn in engines:  # warm-up: first-run allocations and captures
            fn(prompts[:2], 2)
        results, loads, first = {}, [], {}
        for r in range(a.repeats):
            for c in conc:
                for name, ws, fn in engines:
                    loads.append(os.getloadavg()[0])
                    run = fn(prompts[:c], recompute[c] if name == "ort recompute" else a.new_tokens)
                    results.setdefault((name, ws, c), []).append(run.summary())
                    first.setdefault((name, ws, c), run)
                    print("bench_generate: round %d, %s ws %d, %d sequences: %.1f tokens/s" % (
                        r + 1, name, ws, c, results[(name, ws, c)][-1]["tps"]), file=sys.stderr, flush=True)
    finally:
        for proc, *_ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return report(a, conc, recompute, engines, results, first, loads, imports, servers, threads, modes)


def report(a, conc, recompute, engines, results, first, loads, imports, servers, threads, modes):
    med = {k: {m: float(np.median([s[m] for s in v])) for m in ("tps", "tpot", "ttft")} for k, v in results.items()}
    print("\nGPT-2-small-shaped LM (12 layers, 768, 12 heads, vocab 50257), FP32, random weights; prompt %d, %d new"
          " tokens (ort recompute: %s at %s sequences), greedy, no stop ids. import --generate --max-seq-len %d: %s."
          % (PROMPT, a.new_tokens, "/".join(str(recompute[c]) for c in conc), "/".join(map(str, conc)), MAX_SEQ,
             ", ".join("ws %d %.1f s" % (ws, s) for ws, s in imports.items())))
    print("tpserve: cpu backend, ranks as threads, %d slots, buckets %s, GEMM threads per rank %s; anchors: %d threads."
          " Medians of %d interleaved rounds; load average (1 min) during the rounds %.1f-%.1f (median %.1f)"
          " on %d CPUs.\n" % (SLOTS, BUCKETS, "/".join("%d (ws %d)" % (s[3], ws) for (ws, mode), s in servers.items()
                                                           if mode == modes[0]),
                              threads, a.repeats, min(loads), max(loads), float(np.median(loads)), os.cpu_count()))
    print("| engine | ws | sequences | tokens/s | TPOT ms | TTFT ms | / ort recompute | / ort KV cache | / HF generate"
          " | = ref |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    wrong = []
    for c in conc:
        for name, ws, _ in engines:
            m, run = med[(name, ws, c)], first[(name, ws, c)]
            ref_name = "ort recompute" if name == "HF generate" else "HF generate"
            same = agree(run, first[(ref_name, 1, c)])
            if same != c:
                wrong.append("%s ws %d, %d sequences: %d differ from %s" % (name, ws, c, c - same, ref_name))
            print("| %s | %s | %d | %.1f | %.1f | %.0f | %.2f | %.2f | %.2f | %d/%d %s |" % (
                name, ws if name.startswith("tpserve") else "-", c, m["tps"], m["tpot"], m["ttft"],
                m["tps"] / med[("ort recompute", 1, c)]["tps"], m["tps"] / med[("ort KV cache", 1, c)]["tps"],
                m["tps"] / med[("HF generate", 1, c)]["tps"],
                same, c, "ort" if name == "HF generate" else "HF"))
    if wrong:
        print("\nbench_generate: tokens differ:\n" + "\n".join("  " + w for w in wrong))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
