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
| bert512.onnx | bert's config with max_position_embeddings 512 (a token_type_ids buffer of 512) | dynamo, opset 20 |
| gpt2_vocab257.onnx | gpt2's config with vocab 257 (odd, like GPT-2's 50257) | dynamo, opset 20 |
| bert_mask.onnx | bert, Optimum-style inputs input_ids, attention_mask, token_type_ids | dynamo, opset 20 |
| gpt2_mask.onnx | gpt2, inputs input_ids, attention_mask | dynamo, opset 20 |
| gpt2_fp16.onnx, bert_fp16.onnx | gpt2, bert after model.half() | dynamo, opset 20 |
| gpt2_bf16.onnx, bert_bf16.onnx | gpt2, bert after model.bfloat16() | dynamo, opset 20 |
| gpt2_bf16_f32.onnx, bert_bf16_f32.onnx | the BF16 models' weights widened to FP32 (model.bfloat16().float()): their reference, as onnxruntime's CPU provider has no BF16 kernels | dynamo, opset 20 |
| llama_fp16.onnx | llama after model.half() (RMSNorm between Casts to FP32 and back) | dynamo, opset 20 |
| llama_fp16_legacy.onnx | same, eager attention (Casts after the softmax, 1/sqrt as Div) | TorchScript, opset 17 |

Inputs: `x` FP32 [batch, 64] or `input_ids` INT64 [batch, 16] (the mask
fixtures also `attention_mask`, and `token_type_ids`, INT64 [batch, 16]);
the batch dim is dynamic. A model with a dtype suffix has the same random
weights as the FP32 one, rounded to that dtype. Every parameter is random (fixed seed; biases too, so the
bias sharding is exercised), so outputs are not those of a trained model.
The tests compute their references with onnxruntime at test time.

Needs torch, transformers, onnx and onnxscript (not installed by
scripts/deps.sh: a few GB; `pip install torch transformers onnxscript`).
Run by hand (`export_fixtures.py gpt2_fp16 bert_fp16` re-exports only
those); the .onnx files it writes are committed."""
import argparse
import functools
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
    """HF models return dataclasses; the export wants one tensor. The
    optional inputs are passed only when the export gives them."""

    def __init__(self, m, field):
        super().__init__()
        self.m, self.field = m, field

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        kw = {"input_ids": input_ids}
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        if token_type_ids is not None:
            kw["token_type_ids"] = token_type_ids
        if self.field == "logits":
            kw["use_cache"] = False
        return getattr(self.m(**kw), self.field)


def with_dtype(model, dtype):
    """dtype None: FP32; "bf16_f32": BF16-rounded weights computed in FP32."""
    if dtype == "bf16_f32":
        return model.bfloat16().float()
    return model if dtype is None else model.to(dtype)


def mlp():
    return randomize(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), 1)


def gpt2(dtype=None, vocab=VOCAB):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=SEQ * 2)
    return LastHidden(with_dtype(randomize(GPT2LMHeadModel(cfg), 2), dtype), "logits")


def bert(dtype=None, positions=SEQ * 2):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=VOCAB, max_position_embeddings=positions)
    return LastHidden(with_dtype(randomize(BertModel(cfg, add_pooling_layer=False), 3), dtype), "last_hidden_state")


def llama(dtype=None, attn=None):
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=SEQ * 2)
    if attn:
        cfg._attn_implementation = attn
    return LastHidden(with_dtype(randomize(LlamaModel(cfg), 4), dtype), "last_hidden_state")


def export(model, example, in_name, out_name, path, dynamo):
    """example/in_name: one tensor and its name, or tuples of them (every
    input's dim 0 is the batch)."""
    examples = example if isinstance(example, tuple) else (example,)
    in_names = list(in_name) if isinstance(in_name, tuple) else [in_name]
    if dynamo:
        batch = torch.export.Dim("batch", max=64)
        torch.onnx.export(model, examples, path, dynamo=True, opset_version=20,
                          input_names=in_names, output_names=[out_name],
                          dynamic_shapes=tuple({0: batch} for _ in examples), external_data=False)
    else:
        axes = {n: {0: "batch"} for n in in_names + [out_name]}
        torch.onnx.export(model, examples, path, dynamo=False, opset_version=17,
                          input_names=in_names, output_names=[out_name], dynamic_axes=axes)
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("only", nargs="*", help="fixture names (default: all)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    x = torch.randn(2, 64)
    # one padded row, so tracing sees a mask that is not all ones
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    mask[1, SEQ - 4:] = 0
    types = torch.zeros(2, SEQ, dtype=torch.int64)
    types[:, SEQ // 2:] = 1
    P = functools.partial
    jobs = [("mlp", mlp, x, "x", "y", True), ("mlp_legacy", mlp, x, "x", "y", False),
            ("gpt2", gpt2, ids, "input_ids", "logits", True),
            ("bert", bert, ids, "input_ids", "last_hidden_state", True),
            ("bert_legacy", bert, ids, "input_ids", "last_hidden_state", False),
            ("llama", llama, ids, "input_ids", "last_hidden_state", True),
            ("gpt2_legacy", gpt2, ids, "input_ids", "logits", False),
            ("llama_legacy", llama, ids, "input_ids", "last_hidden_state", False),
            ("bert512", P(bert, positions=512), ids, "input_ids", "last_hidden_state", True),
            ("gpt2_vocab257", P(gpt2, vocab=257), ids, "input_ids", "logits", True),
            ("bert_mask", bert, (ids, mask, types), ("input_ids", "attention_mask", "token_type_ids"),
             "last_hidden_state", True),
            ("gpt2_mask", gpt2, (ids, mask), ("input_ids", "attention_mask"), "logits", True)]
    for suffix, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("bf16_f32", "bf16_f32")):
        jobs += [("gpt2_" + suffix, P(gpt2, dt), ids, "input_ids", "logits", True),
                 ("bert_" + suffix, P(bert, dt), ids, "input_ids", "last_hidden_state", True)]
    jobs += [("llama_fp16", P(llama, torch.float16), ids, "input_ids", "last_hidden_state", True),
             ("llama_fp16_legacy", P(llama, torch.float16, "eager"), ids, "input_ids", "last_hidden_state", False)]
    unknown = set(a.only) - {j[0] for j in jobs}
    if unknown:
        ap.error("no fixture named %s" % ", ".join(sorted(unknown)))
    for name, make, ex, i, o, dyn in jobs:
        if a.only and name not in a.only:
            continue
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
