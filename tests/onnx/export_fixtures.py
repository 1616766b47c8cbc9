#!/usr/bin/env python3
"""export_fixtures.py [--out tests/onnx]

Exports the small random-weight ONNX fixtures the importer is tested on:

| file | model | exporter |
|---|---|---|
| mlp.onnx | Linear(64,256) -> GELU -> Linear(256,64) | dynamo, opset 20 |
| mlp_legacy.onnx | same | TorchScript, opset 17 (GELU as Erf) |
| gpt2.onnx | GPT2LMHeadModel, 2 layers, n_embd 64, 4 heads, vocab 256 | dynamo, opset 20 |
| bert.onnx | BertModel, 2 layers, hidden 64, 4 heads, ffn 128, vocab 256 | dynamo, opset 20 |
| bert_legacy.onnx | same | TorchScript, opset 17 |
| llama.onnx | LlamaModel, 2 layers, hidden 64, 4 heads, 2 KV heads, ffn 128 | dynamo, opset 20 |

Inputs: `x` FP32 [batch, 64] or `input_ids` INT64 [batch, 16]; the batch
dim is dynamic. Every parameter is random (fixed seed; biases too, so the
bias sharding is exercised), so outputs are not those of a trained model.
The tests compute their references with onnxruntime at test time.

Needs torch, transformers, onnx and onnxscript (not installed by
scripts/deps.sh: a few GB; `pip install torch transformers onnxscript`).
Run by hand; the .onnx files it writes are committed."""
import argparse
import os

import torch
from torch import nn

SEQ, VOCAB = 16, 256


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g) * 0.2
            p.copy_(1.0 + r if "norm" in name.lower() or ".ln_" in name else r)
    return model.eval()


class LastHidden(nn.Module):
    """HF models return dataclasses; the export wants one tensor."""

    def __init__(self, m, field):
        super().__init__()
        self.m, self.field = m, field

    def forward(self, input_ids):
        return getattr(self.m(input_ids=input_ids, use_cache=False) if self.field == "logits"
                       else self.m(input_ids=input_ids), self.field)


def mlp():
    return randomize(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), 1)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ * 2)
    return LastHidden(randomize(GPT2LMHeadModel(cfg), 2), "logits")


def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=VOCAB, max_position_embeddings=SEQ * 2)
    return LastHidden(randomize(BertModel(cfg, add_pooling_layer=False), 3), "last_hidden_state")


def llama():
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=SEQ * 2)
    return LastHidden(randomize(LlamaModel(cfg), 4), "last_hidden_state")


def export(model, example, in_name, out_name, path, dynamo):
    if dynamo:
        torch.onnx.export(model, (example,), path, dynamo=True, opset_version=20,
                          input_names=[in_name], output_names=[out_name],
                          dynamic_shapes=({0: torch.export.Dim("batch", max=64)},), external_data=False)
    else:
        torch.onnx.export(model, (example,), path, dynamo=False, opset_version=17,
                          input_names=[in_name], output_names=[out_name],
                          dynamic_axes={in_name: {0: "batch"}, out_name: {0: "batch"}})
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    x = torch.randn(2, 64)
    jobs = [("mlp", mlp, x, "x", "y", True), ("mlp_legacy", mlp, x, "x", "y", False),
            ("gpt2", gpt2, ids, "input_ids", "logits", True),
            ("bert", bert, ids, "input_ids", "last_hidden_state", True),
            ("bert_legacy", bert, ids, "input_ids", "last_hidden_state", False),
            ("llama", llama, ids, "input_ids", "last_hidden_state", True),
            ("gpt2_legacy", gpt2, ids, "input_ids", "logits", False),
            ("llama_legacy", llama, ids, "input_ids", "last_hidden_state", False)]
    for name, make, ex, i, o, dyn in jobs:
        path = os.path.join(a.out, name + ".onnx")
        try:
            with torch.no_grad():
                export(make(), ex, i, o, path, dyn)
        except Exception as e:  # the TorchScript exporter fails on some models
            print("skipped %s: %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            if os.path.exists(path):
                os.remove(path)


if __name__ == "__main__":
    main()
