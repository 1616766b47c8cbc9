#!/usr/bin/env python3
"""export_real.py [--cache build/real] [--force] [--llama-1b] [MODEL ...]

Exports the full-size models `make bench-real` runs (tests/bench/bench_real.py)
with random weights (fixed seed), FP32, input `input_ids` INT64 [batch, 128]
(batch dynamic, sequence fixed at 128), dynamo exporter at opset 20 through
tests/onnx/export_fixtures.py's helpers:

| file | model | output |
|---|---|---|
| gpt2.onnx | GPT2LMHeadModel, GPT-2 small: 12 layers, 768, 12 heads, vocab 50257, the LM head | logits |
| bert.onnx | BertModel, BERT-base: 12 layers, 768, 12 heads, ffn 3072, 512 positions, type vocab 2 | last_hidden_state |
| llama.onnx | LlamaForCausalLM, ~125M: 12 layers, 768, 12 heads, 4 KV heads, ffn 2048, vocab 32000 | logits |
| gpt2_fp16.onnx, bert_fp16.onnx, llama_fp16.onnx (by name only) | the model above after `model.half()`: FP16 weights and compute | as above |
| llama1b.onnx (--llama-1b only) | LlamaForCausalLM, 0.85B parameters (3.4 GB): 16 layers, 2048, 32 heads, 8 KV heads, ffn 5632, vocab 32000; weights in llama1b.onnx.data (> 2 GB) | logits |

Weights are normal with std 0.02 (HF's initializer_range; biases too, and
the norms' 1 + N(0, 0.02)), not the fixtures' 0.2, which at width 768 would
saturate every softmax and make the comparison with onnxruntime meaningless.

A file already in the cache is reused unless --force. Prints each model's
path. Needs torch, transformers, onnx and onnxscript (a few GB; not
installed by scripts/deps.sh)."""
import argparse
import os
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "onnx"))
import export_fixtures as fx  # noqa: E402

SEQ = 128
STD = 0.02  # the fixtures' randomize draws 0.2; scaled down to this


def randomize(model, seed):
    """export_fixtures.randomize (which parameters are norms, 1 + r there),
    then r scaled from std 0.2 to STD."""
    fx.randomize(model, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "norm" in name.lower() or ".ln_" in name
            p.copy_(1.0 + (p - 1.0) * (STD / 0.2) if norm else p * (STD / 0.2))
    return model


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    return fx.LastHidden(randomize(GPT2LMHeadModel(cfg), 2), "logits")


def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                     vocab_size=30522, max_position_embeddings=512, type_vocab_size=2)
    return fx.LastHidden(randomize(BertModel(cfg, add_pooling_layer=False), 3), "last_hidden_state")


def llama(layers=12, hidden=768, heads=12, kv=4, ffn=2048, seed=4):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=ffn, vocab_size=32000,
                      max_position_embeddings=2048, tie_word_embeddings=False)
    return fx.LastHidden(randomize(LlamaForCausalLM(cfg), seed), "logits")


def llama1b():
    return llama(layers=16, hidden=2048, heads=32, kv=8, ffn=5632, seed=5)


MODELS = {"gpt2": (gpt2, "logits"), "bert": (bert, "last_hidden_state"), "llama": (llama, "logits"),
          "llama1b": (llama1b, "logits")}
# NAME_fp16: the same model (same seed) after model.half()
for _name in ("gpt2", "bert", "llama"):
    _make, _out = MODELS[_name]
    MODELS[_name + "_fp16"] = (lambda make=_make: make().half(), _out)


def export_external(model, ids, path):
    """export_fixtures.export's dynamo call with the weights in PATH.data:
    a protobuf holds at most 2 GB."""
    batch = torch.export.Dim("batch", max=64)
    torch.onnx.export(model, (ids,), path, dynamo=True, opset_version=20, input_names=["input_ids"],
                      output_names=["logits"], dynamic_shapes=({0: batch},), external_data=True)
    print("wrote %s (+ %s.data)" % (path, os.path.basename(path)))


def ensure(name, cache, force=False):
    """The path of NAME's ONNX file in CACHE, exported if missing."""
    make, out = MODELS[name]
    path = os.path.join(cache, name + ".onnx")
    if os.path.exists(path) and not force:
        return path
    os.makedirs(cache, exist_ok=True)
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, SEQ))
    # into a directory of its own first: a killed export leaves no file
    # that looks complete (the graph names its data file, which keeps its name)
    tmp = os.path.join(cache, ".export-" + name)
    os.makedirs(tmp, exist_ok=True)
    t0 = time.time()
    with torch.no_grad():
        model = make()
        if name == "llama1b":
            export_external(model, ids, os.path.join(tmp, name + ".onnx"))
        else:
            fx.export(model, ids, "input_ids", out, os.path.join(tmp, name + ".onnx"), True)
    for f in sorted(os.listdir(tmp), reverse=True):  # llama1b.onnx.data before llama1b.onnx
        os.replace(os.path.join(tmp, f), os.path.join(cache, f))
    os.rmdir(tmp)
    print("exported %s in %.0f s" % (path, time.time() - t0))
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=os.path.join(ROOT, "build", "real"))
    ap.add_argument("--force", action="store_true", help="export again even if the file exists")
    ap.add_argument("--llama-1b", action="store_true",
                    help="also the 0.85B-parameter Llama (by hand: minutes, ~5 GB of memory)")
    ap.add_argument("models", nargs="*", help="gpt2, bert, llama (default: all three), or one of them + _fp16")
    a = ap.parse_args()
    names = a.models or ["gpt2", "bert", "llama"]
    if a.llama_1b and "llama1b" not in names:
        names.append("llama1b")
    unknown = set(names) - set(MODELS)
    if unknown:
        ap.error("no model named %s" % ", ".join(sorted(unknown)))
    for n in names:
        print(ensure(n, a.cache, a.force))


if __name__ == "__main__":
    main()
