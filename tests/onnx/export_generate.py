#!/usr/bin/env python3
"""export_generate.py [--out tests/onnx]

Exports the causal-LM fixtures of `import_onnx.py --generate` and the
reference tokens they must generate:

| file | model |
|---|---|
| gpt2_gen.onnx | GPT2LMHeadModel, 2 layers, n_embd 64, 4 heads, vocab 251 (padded at |
|   | ws 2 and 4), untied head, n_positions 64 |
| llama_gen.onnx | LlamaForCausalLM, 2 layers, hidden 64, 8 heads, 4 KV heads (GQA), |
|   | ffn 128, vocab 256, untied head, max_position_embeddings 64 |
| bert_gen.onnx | export_fixtures.py's BertModel with a dynamic seq dim: not causal, |
|   | which --generate must refuse (no tokens file) |

Both: dynamo, opset 20, input input_ids INT64 [batch, seq] and output
logits [batch, seq, vocab] with batch and seq dynamic, use_cache=False (no
past_key_values), and the metadata property max_position_embeddings (the
config's position limit, which a RoPE graph does not show). Weights are
random (fixed seed); the untied head's are 5x larger (std 1) so the top
logit of every greedy step stands clear of the second (the smallest gap is
printed and stored; the tokens must not depend on GEMM order).

NAME.tokens.json beside each: {"prompts": [[ids]], "max_new_tokens": 24,
"output_ids": [[ids]] (only the new tokens), "min_gap": the smallest
top-1 minus top-2 logit over all steps} from transformers'
generate(do_sample=False, max_new_tokens=24); the same tokens are checked
against a greedy loop of onnxruntime over the exported file (full recompute)
before anything is written.

Needs torch, transformers, onnx, onnxscript, onnxruntime; run by hand, the
files it writes are committed."""
import argparse
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import torch

from export_fixtures import randomize

NEW_TOKENS = 24
PROMPT_LENS = (1, 5, 13)


def gpt2_gen():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=251, n_positions=64, tie_word_embeddings=False)
    m = randomize(GPT2LMHeadModel(cfg), 11)
    with torch.no_grad():
        m.lm_head.weight.mul_(5.0)
    return m


def llama_gen():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                      intermediate_size=128, vocab_size=256, max_position_embeddings=64, tie_word_embeddings=False)
    m = randomize(LlamaForCausalLM(cfg), 12)
    with torch.no_grad():
        m.lm_head.weight.mul_(5.0)
    return m


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False).logits


def hf_generate(model, prompt):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def ort_greedy(path, prompt):
    """Full recompute per token; -> (new tokens, smallest top-1 - top-2 gap)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    seq, gap = list(prompt), np.inf
    for _ in range(NEW_TOKENS):
        logits = sess.run(None, {"input_ids": np.array([seq], np.int64)})[0][0, -1]
        top = np.sort(logits)[-2:]
        gap = min(gap, float(top[1] - top[0]))
        seq.append(int(np.argmax(logits)))
    return seq[len(prompt):], gap


def export_bert(out):
    from export_fixtures import bert
    path = os.path.join(out, "bert_gen.onnx")
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=32)
    with torch.no_grad():
        torch.onnx.export(bert(), (torch.randint(0, 256, (2, 16)),), path, dynamo=True, opset_version=20,
                          input_names=["input_ids"], output_names=["last_hidden_state"],
                          dynamic_shapes=({0: batch, 1: seq},), external_data=False)
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    export_bert(a.out)
    for name, make in (("gpt2_gen", gpt2_gen), ("llama_gen", llama_gen)):
        model = make()
        vocab = model.config.vocab_size
        rng = np.random.default_rng(53)
        prompts = [rng.integers(0, vocab, n).tolist() for n in PROMPT_LENS]
        path = os.path.join(a.out, name + ".onnx")
        limit = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
        batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=limit)
        with torch.no_grad():
            torch.onnx.export(Logits(model), (torch.tensor([prompts[2], prompts[2]]),), path, dynamo=True,
                              opset_version=20, input_names=["input_ids"], output_names=["logits"],
                              dynamic_shapes=({0: batch, 1: seq},), external_data=False)
        onnx_model = onnx.load(path)
        onnx.helper.set_model_props(onnx_model, {"max_position_embeddings": str(limit)})
        onnx.save(onnx_model, path)
        outs, gaps = [], []
        for p in prompts:
            hf = hf_generate(model, p)
            rt, gap = ort_greedy(path, p)
            if hf != rt:
                raise SystemExit("%s: prompt %s: transformers %s != onnxruntime %s" % (name, p, hf, rt))
            outs.append(hf)
            gaps.append(gap)
        ref = {"prompts": prompts, "max_new_tokens": NEW_TOKENS, "output_ids": outs, "min_gap": round(min(gaps), 4)}
        with open(os.path.join(a.out, name + ".tokens.json"), "w") as f:
            json.dump(ref, f)
            f.write("\n")
        print("wrote %s (%d bytes), %s.tokens.json: smallest top-2 gap %.3f"
              % (path, os.path.getsize(path), name, min(gaps)))


if __name__ == "__main__":
    main()
