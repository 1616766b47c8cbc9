#!/usr/bin/env python3
"""export_gen_real.py [--cache build/real] [--force]

Exports the causal LM `make bench-generate` runs (tests/bench/bench_generate.py)
twice, from one model: GPT2LMHeadModel shaped like GPT-2 small (12 layers,
n_embd 768, 12 heads, vocab 50257, n_positions 1024) with an untied LM head,
FP32, random weights (fixed seed): export_real.py's std 0.02, the head's
std 1 (50x) so the top logit of every greedy step stands clear of the
second, as in tests/onnx/export_generate.py (the tokens must not depend on
GEMM order). Dynamo exporter, opset 20; batch and sequence dynamic:

| file | inputs | outputs |
|---|---|---|
| gpt2_gen.onnx | input_ids INT64 [batch, seq] | logits [batch, seq, 50257] (use_cache=False: what `import_onnx.py --generate` takes) |
| gpt2_gen_kv.onnx | input_ids, position_ids INT64 [batch, seq], past FP32 [12, 2, batch, 12, past, 64] | logits [batch, 50257] (the last position's), present [12, 2, batch, 12, past + seq, 64] |

gpt2_gen_kv.onnx is the same model with use_cache=True: the layers' keys and
values stacked into one tensor each way (a DynamicCache built from `past`
inside forward, so the exporter sees plain tensors). A prompt runs with a
past of length 0, each decode step with the previous present.

A file already in the cache is reused unless --force. Needs torch,
transformers, onnx and onnxscript."""
import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export_real  # noqa: E402

HEAD_STD = 1.0
LAYERS, HEADS, HEAD_DIM = 12, 12, 64


def model():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=LAYERS, n_embd=HEADS * HEAD_DIM, n_head=HEADS, vocab_size=50257, n_positions=1024,
                     tie_word_embeddings=False)
    m = export_real.randomize(GPT2LMHeadModel(cfg), 6)
    with torch.no_grad():
        m.lm_head.weight.mul_(HEAD_STD / export_real.STD)
    return m.eval()


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False).logits


class WithCache(torch.nn.Module):
    """past/present: [layers, 2 (keys, values), batch, heads, positions, head dim]."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, position_ids, past):
        from transformers import DynamicCache
        cache = DynamicCache()
        for i in range(LAYERS):
            cache.update(past[i, 0], past[i, 1], i)
        out = self.m.transformer(input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                                 use_cache=True)
        kv = out.past_key_values
        present = torch.stack([torch.stack([kv.layers[i].keys, kv.layers[i].values]) for i in range(LAYERS)])
        return self.m.lm_head(out.last_hidden_state[:, -1]), present


def export(module, args, names, outs, shapes, path):
    """Into PATH via a directory of its own: a killed export leaves no file
    that looks complete."""
    tmp = path + ".export"
    os.makedirs(tmp, exist_ok=True)
    t0 = time.time()
    with torch.no_grad():
        torch.onnx.export(module, args, os.path.join(tmp, "m.onnx"), dynamo=True, opset_version=20, input_names=names,
                          output_names=outs, dynamic_shapes=shapes, external_data=False)
    os.replace(os.path.join(tmp, "m.onnx"), path)
    os.rmdir(tmp)
    print("exported %s in %.0f s" % (path, time.time() - t0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=os.path.join(HERE, "..", "..", "build", "real"))
    ap.add_argument("--force", action="store_true", help="export again even if the files exist")
    a = ap.parse_args()
    os.makedirs(a.cache, exist_ok=True)
    plain, cached = os.path.join(a.cache, "gpt2_gen.onnx"), os.path.join(a.cache, "gpt2_gen_kv.onnx")
    m = model()
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=1024)
    torch.manual_seed(0)
    if a.force or not os.path.exists(plain):
        export(Logits(m), (torch.randint(0, 50257, (2, 16)),), ["input_ids"], ["logits"], ({0: batch, 1: seq},),
               plain)
    if a.force or not os.path.exists(cached):
        past = torch.export.Dim("past", max=1024)
        ids = torch.randint(0, 50257, (2, 3))
        pos = torch.arange(5, 8).expand(2, 3)
        kv = torch.randn(LAYERS, 2, 2, HEADS, 5, HEAD_DIM) * 0.1
        export(WithCache(m), (ids, pos, kv), ["input_ids", "position_ids", "past"], ["logits", "present"],
               ({0: batch, 1: seq}, {0: batch, 1: seq}, {2: batch, 4: past}), cached)
    print(plain)
    print(cached)


if __name__ == "__main__":
    main()
