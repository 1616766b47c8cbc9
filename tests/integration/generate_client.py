#!/usr/bin/env python3
"""A client of the generate extension for the integration tests (stdlib only).

  check URL MODEL TOKENS [--concurrent N] [--stream]
      sends every prompt of TOKENS ({"prompts": [[ids]], "output_ids": [[ids]]},
      the reference continuations) N at a time in all (cycling through the
      prompts), each asking for as many tokens as its reference has, and
      checks every answer token for token.
  disconnect URL MODEL PROMPT_ID ROUTE
      ROUTE generate_stream: opens a stream, reads two tokens; generate:
      sends a request and waits for a token (/metrics); then closes the
      socket, and checks that the slot is free again (/metrics) and the
      cancel was counted.
  saturate URL MODEL SLOTS
      sends SLOTS + 1 long generations at once: exactly one must get 503
      naming the slots, the others run until their cache is full.
Exit status 0 when every check passed; failures are printed.
"""
import http.client
import json
import re
import sys
import threading
import time
from urllib.parse import urlparse


def connect(url):
    u = urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def post(url, model, route, prompt, max_tokens):
    """POST a generate request to route; (connection, response) once its
    status is 200, else RuntimeError with the answer."""
    c = connect(url)
    c.request("POST", "/v2/models/%s/%s" % (model, route),
              json.dumps({"input_ids": prompt, "max_tokens": max_tokens}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read().decode()))
    return c, r


def generate(url, model, prompt, max_tokens):
    c, r = post(url, model, "generate", prompt, max_tokens)
    body = r.read()
    c.close()
    doc = json.loads(body)
    if doc.get("model_name") != model or doc.get("model_version") != "1":
        raise RuntimeError("bad answer header: %s" % body.decode())
    return doc["output_ids"], doc["finish_reason"]


def events(resp):
    """The server-sent events of resp as (event, data) pairs."""
    event, data = "message", []
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.decode().rstrip("\r\n")
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def stream(url, model, prompt, max_tokens):
    c, r = post(url, model, "generate_stream", prompt, max_tokens)
    if not r.getheader("Content-Type", "").startswith("text/event-stream"):
        raise RuntimeError("Content-Type %s" % r.getheader("Content-Type"))
    ids, final = [], None
    for ev, data in events(r):
        doc = json.loads(data)
        if ev == "error":
            raise RuntimeError("error event: %s" % data)
        if final is not None:
            raise RuntimeError("an event after the final one: %s" % data)
        if "finish_reason" in doc:
            final = doc
        elif len(doc.get("output_ids", [])) == 1:
            ids += doc["output_ids"]
        else:
            raise RuntimeError("an event with other than one token: %s" % data)
    c.close()
    if final is None:
        raise RuntimeError("the stream ended without its final event after %d tokens" % len(ids))
    if final.get("output_tokens") != len(ids) or final.get("model_name") != model:
        raise RuntimeError("final event %s after %d tokens" % (final, len(ids)))
    return ids, final["finish_reason"]


def check(url, model, tokens_file, concurrent, use_stream):
    ref = json.load(open(tokens_file))
    prompts, outs = ref["prompts"], ref["output_ids"]
    jobs = [(i % len(prompts)) for i in range(concurrent)]
    errors = []
    start = threading.Barrier(len(jobs))

    def run(k, i):
        try:
            start.wait()
            fn = stream if use_stream else generate
            got, why = fn(url, model, prompts[i], len(outs[i]))
            if got != outs[i]:
                first = next(j for j in range(min(len(got), len(outs[i])) + 1)
                             if j >= len(got) or j >= len(outs[i]) or got[j] != outs[i][j])
                errors.append("request %d (prompt %d): tokens differ from the reference at %d: got %s want %s"
                              % (k, i, first, got, outs[i]))
            elif why != "length":
                errors.append("request %d: finish_reason %s, want length" % (k, why))
        except Exception as e:  # noqa: BLE001 - reported as a failure
            errors.append("request %d (prompt %d): %s" % (k, i, e))

    threads = [threading.Thread(target=run, args=(k, i)) for k, i in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        print(e)
    return not errors


def metric(url, name):
    c = connect(url)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def disconnect(url, model, prompt_id, route):
    """A client of route that goes mid-sequence (a stream after two events,
    /generate once its sequence has produced a token): its slot is freed
    and the cancel counted."""
    cancelled = metric(url, "tpserve_generate_cancelled_total") or 0
    tokens = metric(url, "tpserve_generate_output_tokens_total") or 0
    if route == "generate_stream":
        c, r = post(url, model, route, [prompt_id], 1000000)
        got = 0
        for _ in events(r):
            got += 1
            if got == 2:
                break
    else:
        c = connect(url)
        c.request("POST", "/v2/models/%s/generate" % model, json.dumps({"input_ids": [prompt_id],
                                                                         "max_tokens": 1000000}))
        while (metric(url, "tpserve_generate_output_tokens_total") or 0) == tokens:
            time.sleep(0.005)
    c.sock.close()
    c.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        if metric(url, "tpserve_generate_slots_in_use") == 0:
            break
        time.sleep(0.05)
    ok = True
    if metric(url, "tpserve_generate_slots_in_use") != 0:
        print("a slot is still held 10 s after the client went")
        ok = False
    if (metric(url, "tpserve_generate_cancelled_total") or 0) != cancelled + 1:
        print("the cancel was not counted")
        ok = False
    return ok


def saturate(url, model, slots):
    results = []
    start = threading.Barrier(slots + 1)

    def run(k):
        c = connect(url)
        start.wait()
        c.request("POST", "/v2/models/%s/generate" % model, json.dumps({"input_ids": [k], "max_tokens": 1000000}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        results.append((r.status, r.read().decode()))
        c.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(slots + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    busy = [b for s, b in results if s == 503]
    done = [b for s, b in results if s == 200 and '"finish_reason":"cache_full"' in b]
    if len(busy) != 1 or "all %d sequence slots are in use" % slots not in busy[0] or len(done) != slots:
        print("answers: %s" % [(s, b[:120]) for s, b in results])
        return False
    return True


def main(argv):
    if len(argv) >= 4 and argv[0] == "check":
        n = int(argv[argv.index("--concurrent") + 1]) if "--concurrent" in argv else 1
        return 0 if check(argv[1], argv[2], argv[3], n, "--stream" in argv) else 1
    if len(argv) == 5 and argv[0] == "disconnect":
        return 0 if disconnect(argv[1], argv[2], int(argv[3]), argv[4]) else 1
    if len(argv) == 4 and argv[0] == "saturate":
        return 0 if saturate(argv[1], argv[2], int(argv[3])) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
