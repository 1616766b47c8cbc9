#!/usr/bin/env python3
"""synthetic.py OUTDIR

Writes small hand-built ONNX models (onnx.helper, fixed-seed weights) for
what the exported fixtures do not cover:

- decomposed.onnx (and external.onnx, the same with its weights in
  external.onnx.data as exports of large models have them): LayerNorm spelled out (ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add),
  an MLP with Relu and a Div by 2, RMSNorm in its Div form, x [batch, 8, 32];
- fused_gqa.onnx: one fused QKV weight for grouped-query attention (4 query
  heads, 2 KV heads of 8: output dim 32 | 16 | 16, cut by an unequal Split),
  KV heads repeated by Unsqueeze/Expand/Reshape, a constant -inf causal mask,
  kᵀ by a Transpose, x [batch, 8, 32];
- two_dynamic.onnx: x [batch, seq, 16] -> MatMul -> Softmax (seq must be fixed
  with --dim seq=N);
- unmapped_op.onnx: x [batch, 16] -> Sin (no tpgraph mapping);
- foreign_op.onnx: an onnxruntime fusion (com.microsoft FastGelu);
  bad_matmul.onnx: a [12, 16] weight for a 16-wide input (both errors);
- unary_ops.onnx: Exp, Sigmoid, Tanh, Erf, Neg, Pow by constants, Sqrt,
  Reciprocal of a Sqrt (rsqrt), Reciprocal, Div by an activation, between
  two MatMuls, x [batch, 8, 16];
- index_ops.onnx: ReduceMean/ReduceSum (keepdims 1 and 0), Where with a
  constant mask, Gather along axis 1 with constant INT64 ids and on a 3-D
  table with INT32 request ids, Unsqueeze + Expand, Cast to FLOAT16, to INT32
  and back, x [batch, 8, 16] and idx [batch, 4];
- gather_elements.onnx: BERT's token_type buffer: a constant [1, 100] INT64
  buffer Expanded to the batch and read by GatherElements along its 100
  entries (onnx's reference GatherElements fails past 64) at constant
  positions, the ids then an embedding added to x [batch, 8, 16]
  (gather_elements_oob.onnx: one position past the buffer);
- odd_vocab.onnx: GPT-2's vocab (50257, a prime: divisible by no world
  size): ids [batch, 8] -> embedding [50257, 16] -> MLP -> LayerNorm -> LM
  head tied to the embedding (MatMul by its Transpose) -> logits
  [batch, 8, 50257] (odd_vocab_untied.onnx: a head of its own, [16, 50257]).
Needs numpy and onnx."""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(7)


def init(name, shape, scale=0.3, offset=0.0):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale + offset).astype(np.float32), name)


def scalar(name, v):
    return numpy_helper.from_array(np.array(v, dtype=np.float32), name)


def axes(name, v):
    return numpy_helper.from_array(np.array(v, dtype=np.int64), name)


def save(nodes, inits, inputs, outputs, path, opset=18, external=False):
    g = helper.make_graph(nodes, os.path.basename(path)[:-5], inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    onnx.save(m, path, save_as_external_data=external, location=os.path.basename(path) + ".data",
              size_threshold=256)


def decomposed(path, external=False):
    N = helper.make_node
    nodes = [
        N("ReduceMean", ["x", "ax"], ["mu"]),
        N("Sub", ["x", "mu"], ["d"]),
        N("Pow", ["d", "two"], ["d2"]),
        N("ReduceMean", ["d2", "ax"], ["var"]),
        N("Add", ["var", "eps"], ["var_eps"]),
        N("Sqrt", ["var_eps"], ["std"]),
        N("Div", ["d", "std"], ["xhat"]),
        N("Mul", ["xhat", "ln_w"], ["xw"]),
        N("Add", ["xw", "ln_b"], ["ln"]),
        N("MatMul", ["ln", "w1"], ["h"]),
        N("Add", ["h", "b1"], ["hb"]),
        N("Relu", ["hb"], ["r"]),
        N("Div", ["r", "two"], ["half"]),
        N("MatMul", ["half", "w2"], ["o"]),
        N("Add", ["o", "x"], ["res"]),
        N("Mul", ["res", "res"], ["sq"]),
        N("ReduceMean", ["sq", "ax"], ["ms"]),
        N("Add", ["ms", "eps"], ["ms_eps"]),
        N("Sqrt", ["ms_eps"], ["rms"]),
        N("Div", ["res", "rms"], ["normed"]),
        N("Mul", ["rms_w", "normed"], ["y"]),
    ]
    inits = [axes("ax", [-1]), scalar("two", 2.0), scalar("eps", 1e-5), init("ln_w", [32], 0.2, 1.0),
             init("ln_b", [32]), init("w1", [32, 64]), init("b1", [64]), init("w2", [64, 32]),
             init("rms_w", [32], 0.2, 1.0)]
    save(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 32])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 32])], path, external=external)


def fused_gqa(path):
    """Attention with a fused, unequally split QKV projection and GQA."""
    N = helper.make_node
    S, H, KV, D = 8, 4, 2, 8
    mask = np.triu(np.full((S, S), -np.inf, np.float32), 1)
    nodes = [
        N("MatMul", ["x", "w_qkv"], ["qkv"]),
        N("Split", ["qkv", "split"], ["q2", "k2", "v2"], axis=2),
        N("Reshape", ["q2", "q_shape"], ["q4"]),
        N("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3]),
    ]
    for t in ("k", "v"):
        nodes += [N("Reshape", [t + "2", "kv_shape"], [t + "4"]),
                  N("Transpose", [t + "4"], [t + "h"], perm=[0, 2, 1, 3]),
                  N("Unsqueeze", [t + "h", "axis2"], [t + "u"]),
                  N("Expand", [t + "u", "rep_shape"], [t + "e"]),
                  N("Reshape", [t + "e", "heads_shape"], [t + "r"])]
    nodes += [
        N("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
        N("MatMul", ["q", "kt"], ["scores"]),
        N("Mul", ["scores", "scale"], ["scaled"]),
        N("Add", ["scaled", "mask"], ["masked"]),
        N("Softmax", ["masked"], ["p"], axis=-1),
        N("MatMul", ["p", "vr"], ["o4"]),
        N("Transpose", ["o4"], ["o_t"], perm=[0, 2, 1, 3]),
        N("Reshape", ["o_t", "o_shape"], ["o"]),
        N("MatMul", ["o", "w_o"], ["y"]),
    ]
    inits = [init("w_qkv", [32, H * D + 2 * KV * D]), axes("split", [H * D, KV * D, KV * D]),
             axes("q_shape", [-1, S, H, D]), axes("kv_shape", [-1, S, KV, D]), axes("axis2", [2]),
             axes("rep_shape", [1, KV, H // KV, S, D]), axes("heads_shape", [-1, H, S, D]),
             scalar("scale", 1 / np.sqrt(D) * 0.5), numpy_helper.from_array(mask, "mask"),
             axes("o_shape", [-1, S, H * D]), init("w_o", [H * D, 32])]
    save(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", S, 32])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", S, 32])], path)


def two_dynamic(path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    save(nodes, [init("w", [16, 16])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])], path)


def unmapped_op(path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sin", ["h"], ["y"], name="the_sine")]
    save(nodes, [init("w", [16, 16])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], path)


def foreign_op(path):
    """An onnxruntime fusion (com.microsoft), as optimized exports have."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("FastGelu", ["h"], ["y"], domain="com.microsoft", name="the_fusion")]
    g = helper.make_graph(nodes, "foreign_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [init("w", [16, 16])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(m, path)


def bad_matmul(path):
    """A weight whose rows do not match its input: fails when evaluated."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="the_matmul")]
    save(nodes, [init("w", [12, 16])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], path)


def pow_dynamic(path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Pow", ["h", "h"], ["y"], name="the_pow")]
    save(nodes, [init("w", [16, 16])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], path)


def unary_ops(path):
    N = helper.make_node
    nodes = [
        N("MatMul", ["x", "w1"], ["h"]),
        N("Exp", ["h"], ["e"]),
        N("Sigmoid", ["h"], ["s"]),
        N("Tanh", ["h"], ["t"]),
        N("Erf", ["h"], ["r"]),
        N("Neg", ["h"], ["ng"]),
        N("Pow", ["h", "three"], ["p3"]),
        N("Pow", ["e", "one_half"], ["p15"]),
        N("Sqrt", ["e"], ["sq"]),
        N("Add", ["e", "one"], ["e1"]),
        N("Sqrt", ["e1"], ["sq1"]),
        N("Reciprocal", ["sq1"], ["rs"]),
        N("Reciprocal", ["e1"], ["inv"]),
        N("Div", ["s", "e1"], ["q"]),
        N("Add", ["s", "t"], ["st"]),
        N("Add", ["r", "ng"], ["rn"]),
        N("Add", ["sq", "rs"], ["sr"]),
        N("Add", ["inv", "q"], ["iq"]),
        N("Add", ["st", "rn"], ["strn"]),
        N("Add", ["sr", "iq"], ["sriq"]),
        N("Add", ["strn", "sriq"], ["a0"]),
        N("Mul", ["p3", "tenth"], ["p3s"]),
        N("Mul", ["p15", "tenth"], ["p15s"]),
        N("Add", ["a0", "p3s"], ["a1"]),
        N("Add", ["a1", "p15s"], ["a"]),
        N("MatMul", ["a", "w2"], ["y"]),
    ]
    inits = [init("w1", [16, 32]), init("w2", [32, 16]), scalar("three", 3.0), scalar("one_half", 1.5),
             scalar("one", 1.0), scalar("tenth", 0.1)]
    save(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 16])], path)


def index_ops(path):
    N = helper.make_node
    mask = RNG.random((8, 32)) < 0.5
    nodes = [
        N("MatMul", ["x", "w1"], ["h"]),
        N("ReduceMean", ["h", "ax_last"], ["m"]),
        N("Sub", ["h", "m"], ["d"]),
        N("ReduceSum", ["d", "ax1"], ["sm"], keepdims=0),
        N("Where", ["mask", "d", "minus1"], ["wh"]),
        N("Gather", ["wh", "ids"], ["g"], axis=1),
        N("ReduceSum", ["g", "ax1"], ["gs"], keepdims=0),
        N("Add", ["sm", "gs"], ["sg"]),
        N("Unsqueeze", ["sg", "ax1"], ["u"]),
        N("Expand", ["u", "ex_shape"], ["ex"]),
        N("Gather", ["table", "idx"], ["tb"], axis=0),
        N("ReduceMean", ["tb", "ax2"], ["tm"], keepdims=0),
        N("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        N("Cast", ["x16"], ["x32"], to=TensorProto.FLOAT),
        N("Mul", ["x", "ten"], ["x10"]),
        N("Cast", ["x10"], ["xi"], to=TensorProto.INT32),
        N("Cast", ["xi"], ["xf"], to=TensorProto.FLOAT),
        N("Mul", ["xf", "hundredth"], ["xfs"]),
        N("Add", ["x32", "xfs"], ["c"]),
        N("MatMul", ["c", "w3"], ["c2"]),
        N("ReduceMean", ["c2", "ax1"], ["c2m"]),
        N("Add", ["ex", "tm"], ["y0"]),
        N("Add", ["y0", "c2m"], ["y1"]),
        N("MatMul", ["y1", "w2"], ["y"]),
    ]
    inits = [init("w1", [16, 32]), init("w2", [32, 16]), init("w3", [16, 32]), init("table", [5, 4, 32]),
             numpy_helper.from_array(mask, "mask"), axes("ax_last", [-1]), axes("ax1", [1]), axes("ax2", [2]),
             axes("ids", [7, 0, 2]), axes("ex_shape", [1, 4, 32]), scalar("minus1", -1.0), scalar("ten", 10.0),
             scalar("hundredth", 0.01)]
    save(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16]),
                        helper.make_tensor_value_info("idx", TensorProto.INT32, ["batch", 4])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 16])], path)


def gather_elements(path, last=80):
    N = helper.make_node
    positions = np.array([[90, 3, 70, 65, 99, 0, 64, last]], np.int64)
    nodes = [
        N("Shape", ["x"], ["x_shape"], start=0, end=1),
        N("Concat", ["x_shape", "buf_len"], ["buf_shape"], axis=0),
        N("Expand", ["buffer", "buf_shape"], ["buf_b"]),
        N("Concat", ["x_shape", "seq_len"], ["pos_shape"], axis=0),
        N("Expand", ["positions", "pos_shape"], ["pos_b"]),
        N("GatherElements", ["buf_b", "pos_b"], ["type_ids"], axis=1, name="type_ids_gather"),
        N("Gather", ["type_table", "type_ids"], ["type_emb"], axis=0),
        N("Add", ["x", "type_emb"], ["xt"]),
        N("MatMul", ["xt", "w"], ["y"]),
    ]
    inits = [numpy_helper.from_array(RNG.integers(0, 3, (1, 100)).astype(np.int64), "buffer"),
             numpy_helper.from_array(positions, "positions"), axes("buf_len", [100]), axes("seq_len", [8]),
             init("type_table", [3, 16]), init("w", [16, 16])]
    save(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 16])], path)


def odd_vocab(path, vocab=50257, tied=True):
    N = helper.make_node
    nodes = [
        N("Gather", ["table", "ids"], ["emb"], axis=0),
        N("MatMul", ["emb", "w1"], ["h"]),
        N("Gelu", ["h"], ["g"]),
        N("MatMul", ["g", "w2"], ["m"]),
        N("LayerNormalization", ["m", "ln_w", "ln_b"], ["ln"], axis=-1),
    ]
    inits = [init("table", [vocab, 16]), init("w1", [16, 32]), init("w2", [32, 16]),
             init("ln_w", [16], 0.2, 1.0), init("ln_b", [16])]
    if tied:
        nodes += [N("Transpose", ["table"], ["table_t"], perm=[1, 0]), N("MatMul", ["ln", "table_t"], ["logits"])]
    else:
        nodes.append(N("MatMul", ["ln", "head"], ["logits"]))
        inits.append(init("head", [16, vocab]))
    save(nodes, inits,
         [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
         [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 8, vocab])], path, opset=20)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    decomposed(os.path.join(out, "decomposed.onnx"))
    decomposed(os.path.join(out, "external.onnx"), external=True)
    fused_gqa(os.path.join(out, "fused_gqa.onnx"))
    two_dynamic(os.path.join(out, "two_dynamic.onnx"))
    unmapped_op(os.path.join(out, "unmapped_op.onnx"))
    unary_ops(os.path.join(out, "unary_ops.onnx"))
    index_ops(os.path.join(out, "index_ops.onnx"))
    pow_dynamic(os.path.join(out, "pow_dynamic.onnx"))
    gather_elements(os.path.join(out, "gather_elements.onnx"))
    gather_elements(os.path.join(out, "gather_elements_oob.onnx"), last=100)
    odd_vocab(os.path.join(out, "odd_vocab.onnx"))
    odd_vocab(os.path.join(out, "odd_vocab_untied.onnx"), tied=False)
    foreign_op(os.path.join(out, "foreign_op.onnx"))
    bad_matmul(os.path.join(out, "bad_matmul.onnx"))


if __name__ == "__main__":
    main()
