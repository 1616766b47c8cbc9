#!/usr/bin/env python3
"""Generate the example tpgraph v1 graphs, their weights, inputs and references.

    python3 graphs/gen_examples.py --out DIR [--selfcheck]

For every example and world size this writes into DIR

    NAME.json                the tpgraph (see ../shared/GRAPH_FORMAT.md)
    NAME.safetensors         the UNSHARDED parameters (the loader slices them)
    NAME.inputs.safetensors  the GLOBAL input tensors, with a concrete batch
    NAME.ref.safetensors     the GLOBAL reference outputs, by output name

plus DIR/manifest.json listing them with their dtype and tolerance.

The references are computed by plain, unsharded numpy code (ref_* below) on the
global tensors in float64, from the exact stored (already rounded) values, and
then cast to the output datatype. They never simulate ranks.

--selfcheck reads the files back from DIR and runs every graph through an
independent SPMD interpreter (simulate() below: shards by placement, runs the
node list on each rank, implements the collectives, reassembles the outputs by
placement), once in float64 (must agree with the float64 reference to ~1e-12)
and once emulating the engine's arithmetic (FP32 compute, every node rounded
to its datatype on store; must pass the manifest tolerance with headroom).

Only python3 + numpy. Deterministic: every example has a fixed seed.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# --------------------------------------------------------------------------
# safetensors (minimal, pure numpy)
# --------------------------------------------------------------------------

# safetensors dtype -> numpy storage dtype (BF16 is kept as raw uint16 bits).
ST_NP = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}
# tpgraph (KServe v2) datatype -> safetensors dtype
KS_ST = {"FP32": "F32", "FP16": "F16", "BF16": "BF16", "INT32": "I32", "INT64": "I64"}
FLOAT_TYPES = ("FP32", "FP16", "BF16")
INT_TYPES = ("INT32", "INT64")


def f32_to_bf16_bits(a):
    """float32 -> bf16 bits: top 16 bits with round-to-nearest-even."""
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # quiet NaN
    return r


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_storage(x, datatype):
    """float64/int values -> the raw array stored for a tpgraph datatype."""
    if datatype == "FP32":
        return np.asarray(x, dtype=np.float32)
    if datatype == "FP16":
        return np.asarray(x, dtype=np.float16)
    if datatype == "BF16":
        return f32_to_bf16_bits(np.asarray(x, dtype=np.float32))
    if datatype == "INT32":
        return np.asarray(x, dtype=np.int32)
    if datatype == "INT64":
        return np.asarray(x, dtype=np.int64)
    raise ValueError("datatype %r" % datatype)


def from_storage(raw, st_dtype):
    """raw stored array -> exact values (float64 for floats, int64 for ints)."""
    if st_dtype == "BF16":
        return bf16_bits_to_f32(raw).astype(np.float64)
    if st_dtype in ("I32", "I64"):
        return np.asarray(raw).astype(np.int64)
    return np.asarray(raw).astype(np.float64)


def save_safetensors(path, tensors):
    """tensors: {name: (st_dtype, raw ndarray)}; a BF16 tensor may also be
    given as ml_dtypes.bfloat16 values (stored as their bits)."""
    stream_safetensors(path, {n: (st, raw.shape, lambda raw=raw: raw) for n, (st, raw) in tensors.items()})


def stream_safetensors(path, tensors):
    """tensors: {name: (st_dtype, shape, make)}, make() giving the array when
    its bytes are written, so at most one converted tensor exists at a time.
    Tensors are laid out by decreasing item size (then name) so every tensor
    is naturally aligned; the header is padded with spaces to a multiple of 8."""
    names = sorted(tensors, key=lambda n: (-ST_NP[tensors[n][0]].itemsize, n))
    header, off = {}, 0
    for n in names:
        st, shape, _ = tensors[n]
        size = int(np.prod(shape, dtype=np.int64)) * ST_NP[st].itemsize
        header[n] = {"dtype": st, "shape": [int(s) for s in shape], "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for n in names:
            st, shape, make = tensors[n]
            arr = make()
            if st == "BF16" and arr.dtype.name == "bfloat16":
                arr = arr.view(np.uint16)  # its bits
            arr = np.ascontiguousarray(arr, dtype=ST_NP[st])
            assert arr.size == int(np.prod(shape, dtype=np.int64)), (n, arr.shape, shape)
            f.write(arr.reshape(-1).view(np.uint8))


def load_safetensors(path):
    """-> {name: (st_dtype, raw ndarray)}; validates header and offsets."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError("%s: shorter than the 8-byte header length" % path)
    (hlen,) = struct.unpack("<Q", buf[:8])
    if hlen > len(buf) - 8:
        raise ValueError("%s: header length %d runs past the file" % (path, hlen))
    header = json.loads(buf[8:8 + hlen].decode("utf-8"))
    data = memoryview(buf)[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        st = info["dtype"]
        if st not in ST_NP:
            raise ValueError("%s: tensor %s: unsupported dtype %s" % (path, name, st))
        shape = tuple(int(s) for s in info["shape"])
        b, e = info["data_offsets"]
        nbytes = int(np.prod(shape, dtype=np.int64)) * ST_NP[st].itemsize
        if not (0 <= b <= e <= len(data)) or e - b != nbytes:
            raise ValueError("%s: tensor %s: bad data_offsets %r" % (path, name, [b, e]))
        out[name] = (st, np.frombuffer(data[b:e], dtype=ST_NP[st]).reshape(shape).copy())
    return out


# --------------------------------------------------------------------------
# graph builder
# --------------------------------------------------------------------------

class Graph:
    def __init__(self, name, world):
        self.name = name
        self.world = world
        self.j = {"format": "tpgraph", "version": 1, "name": name, "world_size": world,
                  "weights": name + ".safetensors",
                  "inputs": [], "params": [], "outputs": [], "nodes": []}

    def input(self, name, datatype, shape, placement):
        self.j["inputs"].append({"name": name, "datatype": datatype,
                                 "shape": list(shape), "placement": placement})
        return name

    def param(self, name, datatype, shape, placement, tensor=None):
        p = {"name": name, "datatype": datatype, "shape": list(shape), "placement": placement}
        if tensor is not None:
            p["tensor"] = tensor
        self.j["params"].append(p)
        return name

    def node(self, name, op, inputs, /, **attrs):
        # attrs may themselves be called "op" (collectives), hence positional-only
        fallback = attrs.pop("fallback", False)
        n = {"name": name, "op": op, "inputs": list(inputs)}
        if attrs:
            n["attrs"] = attrs
        if fallback:
            n["fallback"] = True
        self.j["nodes"].append(n)
        return name

    def output(self, name, placement):
        self.j["outputs"].append({"name": name, "placement": placement})


class Example:
    """One generated graph: the JSON plus the stored tensors and the float64
    reference outputs (by output name)."""

    def __init__(self, graph, dtype, rtol, params, inputs, ref, about):
        self.graph = graph          # Graph
        self.dtype = dtype          # manifest dtype (of the float compute)
        self.rtol = rtol
        self.params = params        # {tensor key: (st_dtype, raw)}
        self.inputs = inputs        # {input name: (st_dtype, raw)}
        self.ref = ref              # {output name: (datatype, float64 ndarray)}
        self.about = about

    @property
    def name(self):
        return self.graph.name


def rand(rng, shape, scale, datatype, offset=0.0):
    """Random values, rounded to datatype. Returns (raw, exact float64)."""
    x = offset + scale * rng.standard_normal(shape)
    raw = to_storage(x, datatype)
    return raw, from_storage(raw, KS_ST[datatype])


# --------------------------------------------------------------------------
# references: plain unsharded numpy on global tensors, float64
# --------------------------------------------------------------------------

def ref_gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.frompyfunc(math.erf, 1, 1)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)).astype(np.float64))


def ref_silu(x):
    return x / (1.0 + np.exp(-x))


def ref_softmax_last(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ref_layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def ref_rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def ref_causal_mha(q, k, v, n_heads):
    """q, k, v: [B, S, H] -> [B, S, H], heads are contiguous column blocks."""
    B, S, H = q.shape
    dh = H // n_heads
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(n_heads):
            cols = slice(h * dh, (h + 1) * dh)
            qh, kh, vh = q[b, :, cols], k[b, :, cols], v[b, :, cols]
            for i in range(S):
                s = kh[: i + 1] @ qh[i] / math.sqrt(dh)   # keys 0..i only
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, i, cols] = p @ vh[: i + 1]
    return out


# --------------------------------------------------------------------------
# examples
# --------------------------------------------------------------------------

def ex_mlp_sp(d, dtype="FP32", approximate=None, suffix="", rtol=1e-4, seed=100):
    """Sequence-parallel MLP (Megatron-SP): x sequence-sharded -> all_gather
    -> column-parallel w1 -> gelu -> row-parallel w2 -> reduce_scatter back to
    sequence-sharded."""
    B, S, H, F = 3, 8, 32, 64
    rng = np.random.default_rng(seed + d)
    name = "mlp_sp%s_tp%d" % (suffix, d)
    g = Graph(name, d)
    g.input("x", dtype, ["B", S, H], "shard(1)")
    g.param("w1", dtype, [H, F], "shard(1)")
    g.param("w2", dtype, [F, H], "shard(0)")
    g.node("x_full", "all_gather", ["x"], dim=1)
    g.node("h", "matmul", ["x_full", "w1"])
    gattrs = {} if approximate is None else {"approximate": approximate}
    g.node("a", "gelu", ["h"], **gattrs)
    g.node("y_partial", "matmul", ["a", "w2"])
    g.node("y", "reduce_scatter", ["y_partial"], dim=1, op="sum")
    g.output("y", "shard(1)")

    x_raw, x = rand(rng, (B, S, H), 1.0, dtype)
    w1_raw, w1 = rand(rng, (H, F), 1.0 / math.sqrt(H), dtype)
    w2_raw, w2 = rand(rng, (F, H), 1.0 / math.sqrt(F), dtype)
    st = KS_ST[dtype]
    y = ref_gelu(x @ w1, approximate or "none") @ w2
    return Example(g, dtype, rtol, {"w1": (st, w1_raw), "w2": (st, w2_raw)},
                   {"x": (st, x_raw)}, {"y": (dtype, y)},
                   "sequence-parallel MLP, gelu approximate=%s" % (approximate or "default(none)"))


def _block_tail(g, S, HL, up_transposed):
    """The rest of a block after `attn` [B, heads/d, S, DH]: row-parallel
    out-projection `wo`, all_reduce, residual (`h1`); rms_norm (`rms_w`) and
    a SwiGLU MLP (`w_gate`, `w_up`, row-parallel `w_down`), all_reduce,
    residual (`y`). Outputs y and h1."""
    g.node("attn_bshd", "permute", ["attn"], dims=[0, 2, 1, 3])
    g.node("attn_m", "reshape", ["attn_bshd"], shape=[-1, S, HL])
    g.node("o_partial", "matmul", ["attn_m", "wo"])
    g.node("o", "all_reduce", ["o_partial"], op="sum")
    g.node("h1", "add", ["x", "o"])
    g.node("n2", "rms_norm", ["h1", "rms_w"], eps=1e-6)
    g.node("gate", "matmul", ["n2", "w_gate"])
    g.node("up", "matmul", ["n2", "w_up"], **({"transpose_b": True} if up_transposed else {}))
    g.node("gate_act", "silu", ["gate"])
    g.node("act", "mul", ["gate_act", "up"])
    g.node("down_partial", "matmul", ["act", "w_down"])
    g.node("down", "all_reduce", ["down_partial"], op="sum")
    g.node("y", "add", ["h1", "down"])
    g.output("y", "replicate")
    g.output("h1", "replicate")


def ex_megatron_block(d):
    """A pre-norm transformer block with Megatron tensor parallelism."""
    B, S, H, NH, F = 2, 8, 64, 8, 128
    DH, HL, NHL = H // NH, H // d, NH // d
    dtype, st = "FP32", "F32"
    rng = np.random.default_rng(200 + d)
    name = "megatron_block_tp%d" % d
    g = Graph(name, d)
    g.input("x", dtype, ["B", S, H], "replicate")
    g.param("ln1_w", dtype, [H], "replicate", tensor="ln1.weight")
    g.param("ln1_b", dtype, [H], "replicate", tensor="ln1.bias")
    g.param("w_qkv", dtype, [H, 3 * H], "shard(1)", tensor="attn.qkv.weight")
    g.param("wo", dtype, [H, H], "shard(0)", tensor="attn.out.weight")
    g.param("rms_w", dtype, [H], "replicate", tensor="ln2.weight")
    g.param("w_gate", dtype, [H, F], "shard(1)", tensor="mlp.gate.weight")
    g.param("w_up", dtype, [F, H], "shard(0)", tensor="mlp.up.weight")
    g.param("w_down", dtype, [F, H], "shard(0)", tensor="mlp.down.weight")

    g.node("ln1", "layer_norm", ["x", "ln1_w", "ln1_b"], eps=1e-5)
    g.node("qkv", "matmul", ["ln1", "w_qkv"])                   # [B, S, 3*HL]
    # this rank's columns are [q heads | k heads | v heads] (see the packing)
    g.node("q_cols", "slice", ["qkv"], dim=-1, start=0, length=HL)
    g.node("k_cols", "slice", ["qkv"], dim=2, start=HL, length=HL)
    g.node("v_cols", "slice", ["qkv"], dim=-1, start=2 * HL, length=HL)
    for t in "qkv":
        g.node(t + "_heads", "view", [t + "_cols"], shape=[-1, S, NHL, DH])
        g.node(t, "permute", [t + "_heads"], dims=[0, 2, 1, 3])  # [B, NHL, S, DH]
    g.node("attn", "attention", ["q", "k", "v"], fallback=True, causal=True)
    _block_tail(g, S, HL, up_transposed=True)

    x_raw, x = rand(rng, (B, S, H), 1.0, dtype)
    ln1_w_raw, ln1_w = rand(rng, (H,), 0.1, dtype, offset=1.0)
    ln1_b_raw, ln1_b = rand(rng, (H,), 0.1, dtype)
    wq_raw, wq = rand(rng, (H, H), 1.0 / math.sqrt(H), dtype)
    wk_raw, wk = rand(rng, (H, H), 1.0 / math.sqrt(H), dtype)
    wv_raw, wv = rand(rng, (H, H), 1.0 / math.sqrt(H), dtype)
    wo_raw, wo = rand(rng, (H, H), 1.0 / math.sqrt(H), dtype)
    rms_w_raw, rms_w = rand(rng, (H,), 0.1, dtype, offset=1.0)
    wg_raw, wg = rand(rng, (H, F), 1.0 / math.sqrt(H), dtype)
    wu_raw, wu = rand(rng, (F, H), 1.0 / math.sqrt(H), dtype)   # stored [F, H]
    wd_raw, wd = rand(rng, (F, H), 1.0 / math.sqrt(F), dtype)
    # Rank-major packing: column block r (width 3*HL) = [wq_r | wk_r | wv_r],
    # where wX_r are the columns of rank r's heads.
    blocks = []
    for r in range(d):
        c = slice(r * HL, (r + 1) * HL)
        blocks += [wq_raw[:, c], wk_raw[:, c], wv_raw[:, c]]
    wqkv_raw = np.ascontiguousarray(np.concatenate(blocks, axis=1))

    # reference: the plain block with the logical wq, wk, wv, w_up^T
    ln = ref_layer_norm(x, ln1_w, ln1_b, 1e-5)
    att = ref_causal_mha(ln @ wq, ln @ wk, ln @ wv, NH)
    h1 = x + att @ wo
    n2 = ref_rms_norm(h1, rms_w, 1e-6)
    y = h1 + (ref_silu(n2 @ wg) * (n2 @ wu.T)) @ wd
    params = {"ln1.weight": (st, ln1_w_raw), "ln1.bias": (st, ln1_b_raw),
              "attn.qkv.weight": (st, wqkv_raw), "attn.out.weight": (st, wo_raw),
              "ln2.weight": (st, rms_w_raw), "mlp.gate.weight": (st, wg_raw),
              "mlp.up.weight": (st, wu_raw), "mlp.down.weight": (st, wd_raw)}
    return Example(g, dtype, 1e-4, params, {"x": (st, x_raw)},
                   {"y": (dtype, y), "h1": (dtype, h1)}, "Megatron transformer block")


def ref_rope(x, cos, sin):
    """x [..., S, D] * cos + rotate_half(x) * sin, cos/sin [S, D]."""
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin


def ref_causal_gqa(q, k, v):
    """q [B, H, S, D], k/v [B, Hkv, S, D]: query head h reads kv head h // (H / Hkv)."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    S = s.shape[-1]
    s = np.where(np.triu(np.ones((S, S), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def ex_llama_block(d):
    """A Llama block as the importer writes it: fused q|k|v with grouped-query
    heads (8 query, 4 kv), rope on q and k, attention reading the kv heads,
    SwiGLU MLP; Megatron tensor parallelism."""
    B, S, H, NH, NKV, DH, F = 2, 8, 64, 8, 4, 8, 64
    NHL, NKVL = NH // d, NKV // d
    HL, KL = NHL * DH, NKVL * DH
    dtype, st = "FP32", "F32"
    rng = np.random.default_rng(250 + d)
    g = Graph("llama_block_tp%d" % d, d)
    g.input("x", dtype, ["B", S, H], "replicate")
    g.param("rms1_w", dtype, [H], "replicate", tensor="attn_norm.weight")
    g.param("w_qkv", dtype, [H, (NH + 2 * NKV) * DH], "shard(1)", tensor="attn.qkv.weight")
    g.param("cos", dtype, [S, DH], "replicate", tensor="rope.cos")
    g.param("sin", dtype, [S, DH], "replicate", tensor="rope.sin")
    g.param("wo", dtype, [H, H], "shard(0)", tensor="attn.out.weight")
    g.param("rms_w", dtype, [H], "replicate", tensor="mlp_norm.weight")
    g.param("w_gate", dtype, [H, F], "shard(1)", tensor="mlp.gate.weight")
    g.param("w_up", dtype, [H, F], "shard(1)", tensor="mlp.up.weight")
    g.param("w_down", dtype, [F, H], "shard(0)", tensor="mlp.down.weight")

    g.node("n1", "rms_norm", ["x", "rms1_w"], eps=1e-6)
    g.node("qkv", "matmul", ["n1", "w_qkv"])                   # [B, S, HL + 2 KL]
    # this rank's columns: [q heads | k heads | v heads] (rank-major packing)
    for t, start, width, heads in (("q", 0, HL, NHL), ("k", HL, KL, NKVL), ("v", HL + KL, KL, NKVL)):
        g.node(t + "_cols", "slice", ["qkv"], dim=2, start=start, length=width)
        g.node(t + "_heads", "view", [t + "_cols"], shape=[-1, S, heads, DH])
        g.node(t, "permute", [t + "_heads"], dims=[0, 2, 1, 3])  # [B, heads, S, DH]
    g.node("q_rot", "rope", ["q", "cos", "sin"])
    g.node("k_rot", "rope", ["k", "cos", "sin"])
    g.node("attn", "attention", ["q_rot", "k_rot", "v"], causal=True)  # k, v: the kv heads
    _block_tail(g, S, HL, up_transposed=False)

    x_raw, x = rand(rng, (B, S, H), 1.0, dtype)
    w1_raw, w1 = rand(rng, (H,), 0.1, dtype, offset=1.0)
    wq_raw, wq = rand(rng, (H, NH * DH), 1.0 / math.sqrt(H), dtype)
    wk_raw, wk = rand(rng, (H, NKV * DH), 1.0 / math.sqrt(H), dtype)
    wv_raw, wv = rand(rng, (H, NKV * DH), 1.0 / math.sqrt(H), dtype)
    wo_raw, wo = rand(rng, (H, H), 1.0 / math.sqrt(H), dtype)
    w2_raw, w2 = rand(rng, (H,), 0.1, dtype, offset=1.0)
    wg_raw, wg = rand(rng, (H, F), 1.0 / math.sqrt(H), dtype)
    wu_raw, wu = rand(rng, (H, F), 1.0 / math.sqrt(H), dtype)
    wd_raw, wd = rand(rng, (F, H), 1.0 / math.sqrt(F), dtype)
    # Llama's tables: angle pos * 10000^(-2i/DH), each half repeated
    inv = 10000.0 ** (-np.arange(0, DH, 2) / DH)
    ang = np.arange(S)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    cos_raw, sin_raw = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    cos, sin = cos_raw.astype(np.float64), sin_raw.astype(np.float64)
    blocks = []
    for r in range(d):
        blocks += [wq_raw[:, r * HL:(r + 1) * HL], wk_raw[:, r * KL:(r + 1) * KL], wv_raw[:, r * KL:(r + 1) * KL]]
    wqkv_raw = np.ascontiguousarray(np.concatenate(blocks, axis=1))

    # reference: the plain block with the logical wq, wk, wv
    def heads(t, n):
        return np.swapaxes(t.reshape(B, S, n, DH), 1, 2)
    n1 = ref_rms_norm(x, w1, 1e-6)
    att = ref_causal_gqa(ref_rope(heads(n1 @ wq, NH), cos, sin), ref_rope(heads(n1 @ wk, NKV), cos, sin),
                         heads(n1 @ wv, NKV))
    h1 = x + np.swapaxes(att, 1, 2).reshape(B, S, H) @ wo
    n2 = ref_rms_norm(h1, w2, 1e-6)
    y = h1 + (ref_silu(n2 @ wg) * (n2 @ wu)) @ wd
    params = {"attn_norm.weight": (st, w1_raw), "attn.qkv.weight": (st, wqkv_raw), "rope.cos": (st, cos_raw),
              "rope.sin": (st, sin_raw), "attn.out.weight": (st, wo_raw), "mlp_norm.weight": (st, w2_raw),
              "mlp.gate.weight": (st, wg_raw), "mlp.up.weight": (st, wu_raw), "mlp.down.weight": (st, wd_raw)}
    return Example(g, dtype, 1e-4, params, {"x": (st, x_raw)}, {"y": (dtype, y), "h1": (dtype, h1)},
                   "Llama block: GQA attention reading its kv heads, rope, SwiGLU")


def ex_a2a_reshard(d):
    """Ulysses-style resharding: sequence-sharded -> all_to_all ->
    hidden-sharded (full sequence) -> elementwise -> all_to_all back."""
    B, S, H = 2, 8, 32
    dtype, st = "FP32", "F32"
    rng = np.random.default_rng(300 + d)
    name = "a2a_reshard_tp%d" % d
    g = Graph(name, d)
    g.input("x", dtype, ["B", S, H], "shard(1)")
    g.param("scale", dtype, [H], "shard(0)")
    g.node("xh", "all_to_all", ["x"], split_dim=2, concat_dim=1)      # [B, S, H/d]
    g.node("m", "mul", ["xh", "scale"])
    g.node("r", "relu", ["m"])
    g.node("rt", "transpose", ["r"], dim0=1, dim1=2)                  # [B, H/d, S] view
    g.node("back_t", "all_to_all", ["rt"], split_dim=2, concat_dim=1)  # [B, H, S/d]
    g.node("y_view", "transpose", ["back_t"], dim0=-1, dim1=-2)       # [B, S/d, H] view
    g.node("y", "contiguous", ["y_view"])
    g.node("y_full", "all_gather", ["y"], dim=1)                      # [B, S, H]
    g.node("z", "cat", ["x", "y_view"], dim=2)                        # [B, S/d, 2H]
    g.output("y", "shard(1)")
    g.output("y_full", "replicate")
    g.output("z", "shard(1)")

    x_raw, x = rand(rng, (B, S, H), 1.0, dtype)
    s_raw, s = rand(rng, (H,), 1.0, dtype)
    y = np.maximum(x * s, 0.0)
    return Example(g, dtype, 1e-4, {"scale": (st, s_raw)}, {"x": (st, x_raw)},
                   {"y": (dtype, y), "y_full": (dtype, y),
                    "z": (dtype, np.concatenate([x, y], axis=2))},
                   "all_to_all resharding")


def ex_vocab_embed(d, id_dtype="INT64", suffix=""):
    """Vocab-parallel embedding + tied LM head, and a tour of the remaining
    collective variants (all_reduce max/avg, reduce_scatter avg, broadcast)."""
    B, S, V, E = 2, 8, 64, 32
    VL = V // d
    dtype, st = "FP32", "F32"
    rng = np.random.default_rng(400 + d + (7 if id_dtype == "INT32" else 0))
    name = "vocab_embed%s_tp%d" % (suffix, d)
    g = Graph(name, d)
    g.input("ids", id_dtype, ["B", S], "replicate")
    g.param("table", dtype, [V, E], "shard(0)")
    g.node("emb_partial", "embedding", ["ids", "table"], fallback=True, vocab_parallel=True)
    g.node("emb", "all_reduce", ["emb_partial"], op="sum")            # [B, S, E]
    # exactly one rank has a nonzero row, the others zeros -> max = relu(emb)
    g.node("emb_relu", "all_reduce", ["emb_partial"], op="max")
    g.node("emb_rs_avg", "reduce_scatter", ["emb_partial"], dim=2, op="avg")  # emb/d
    g.node("logits_local", "matmul", ["emb", "table"], transpose_b=True)     # [B, S, V/d]
    g.node("logits", "all_gather", ["logits_local"], dim=-1)                 # [B, S, V]
    g.node("probs", "softmax", ["logits"], dim=-1)
    g.node("logits_mean", "all_reduce", ["logits_local"], op="avg")
    g.node("logits_r1", "broadcast", ["logits_local"], src=1)
    g.node("logits_delta", "sub", ["logits_local", "logits_r1"])
    for o, p in (("emb", "replicate"), ("emb_relu", "replicate"),
                 ("emb_rs_avg", "shard(2)"), ("probs", "replicate"),
                 ("logits_mean", "replicate"), ("logits_r1", "replicate"),
                 ("logits_delta", "shard(2)")):
        g.output(o, p)

    table_raw, table = rand(rng, (V, E), 0.5, dtype)
    ids = rng.integers(0, V, size=(B, S))
    # make sure the ends of every rank's vocab range are hit
    edges = sorted({0, V - 1} | {r * VL for r in range(d)} | {r * VL - 1 for r in range(1, d)})
    ids.reshape(-1)[: len(edges)] = edges
    ids_raw = to_storage(ids, id_dtype)

    emb = table[ids]
    logits = emb @ table.T
    blocks = logits.reshape(B, S, d, VL)
    r1 = logits[..., VL:2 * VL]
    ref = {"emb": emb, "emb_relu": np.maximum(emb, 0.0), "emb_rs_avg": emb / d,
           "probs": ref_softmax_last(logits), "logits_mean": blocks.mean(axis=2),
           "logits_r1": r1, "logits_delta": logits - np.tile(r1, (1, 1, d))}
    return Example(g, dtype, 1e-4, {"table": (st, table_raw)},
                   {"ids": (KS_ST[id_dtype], ids_raw)},
                   {k: (dtype, v) for k, v in ref.items()},
                   "vocab-parallel embedding with %s ids" % id_dtype)


def ex_slice_cat(d):
    """The slice/cat forms functional collectives lower scatter_dim /
    gather_dim 1 to, chained: a row-parallel matmul's partial product split
    into d column chunks stacked on the rows, reduce_scatter(avg) on the
    rows (= reduce_scatter on the columns); then all_gather on the rows, its
    d row chunks laid side by side on the last dim (= all_gather on K) into
    a replicated matmul, relu and a last replicated matmul. fuse_tp turns
    both into fused nodes."""
    B, M, KZ, C, F = 2, 16, 12, 8, 16
    dtype, st = "FP32", "F32"
    rng = np.random.default_rng(500 + d)
    name = "slice_cat_tp%d" % d
    g = Graph(name, d)
    g.input("z", dtype, ["B", M, KZ], "shard(2)")
    g.param("w_in", dtype, [KZ, C * d], "shard(0)")
    g.param("w_out", dtype, [C * d, F], "replicate")
    g.param("w_head", dtype, [F, C], "replicate")
    g.node("y_partial", "matmul", ["z", "w_in"])                             # [B, M, C*d]
    for j in range(d):
        g.node("y_cols%d" % j, "slice", ["y_partial"], dim=2, start=C * j, length=C)
    g.node("y_stack", "cat", ["y_cols%d" % j for j in range(d)], dim=1)      # [B, d*M, C]
    g.node("y", "reduce_scatter", ["y_stack"], dim=1, op="avg")              # [B, M, C]
    g.node("y_rows", "all_gather", ["y"], dim=1)                             # [B, d*M, C]
    for j in range(d):
        g.node("y_row%d" % j, "slice", ["y_rows"], dim=1, start=M * j, length=M)
    g.node("y_full", "cat", ["y_row%d" % j for j in range(d)], dim=2)        # [B, M, C*d]
    g.node("h", "matmul", ["y_full", "w_out"])
    g.node("a", "relu", ["h"])
    g.node("out", "matmul", ["a", "w_head"])
    g.output("y", "shard(2)")
    g.output("out", "replicate")

    z_raw, z = rand(rng, (B, M, KZ), 1.0, dtype)
    wi_raw, wi = rand(rng, (KZ, C * d), 1.0 / math.sqrt(KZ), dtype)
    wo_raw, wo = rand(rng, (C * d, F), 1.0 / math.sqrt(C * d), dtype)
    wh_raw, wh = rand(rng, (F, C), 1.0 / math.sqrt(F), dtype)
    y = z @ wi / d
    return Example(g, dtype, 1e-4, {"w_in": (st, wi_raw), "w_out": (st, wo_raw), "w_head": (st, wh_raw)},
                   {"z": (st, z_raw)}, {"y": (dtype, y), "out": (dtype, np.maximum(y @ wo, 0.0) @ wh)},
                   "slice/cat forms of reduce_scatter and all_gather on another dim")


def all_examples():
    out = []
    for d in (2, 4):
        out.append(ex_mlp_sp(d))
        out.append(ex_megatron_block(d))
        out.append(ex_llama_block(d))
        out.append(ex_a2a_reshard(d))
        out.append(ex_vocab_embed(d))
        out.append(ex_mlp_sp(d, "FP16", approximate="tanh", suffix="_fp16", rtol=5e-3, seed=110))
        out.append(ex_mlp_sp(d, "BF16", approximate="none", suffix="_bf16", rtol=2e-2, seed=120))
        out.append(ex_vocab_embed(d, "INT32", suffix="_i32"))
    out += [ex_slice_cat(d) for d in (2, 3, 4)]
    return out


# --------------------------------------------------------------------------
# generation: a tiny decoder driven step by step (docs/models.md,
# "Generation graphs"), with a NumPy greedy reference
# --------------------------------------------------------------------------

GEN = dict(V=37, VP=40, E=16, H=4, HKV=2, DH=4, F=32, L=16, LAYERS=2, EPS=1e-5)
# (slot, prompt) of each sequence and how many tokens it generates; the
# batched schedule runs them together, sequence "d" reusing "b"'s slot
GEN_SEQS = {"a": (2, [3, 14, 15, 9, 26], 7), "b": (1, [5, 35, 8], 4), "c": (4, [27, 1, 8, 2], 6),
            "d": (1, [31, 4], 5)}


def gen_params(seed=530):
    """Unsharded FP32 weights of the decoder; the vocab padded from V to VP
    columns whose head weights are large, so only argmax's limit keeps
    them from winning."""
    c = GEN
    rng = np.random.default_rng(seed)
    E, F, VP = c["E"], c["F"], c["VP"]
    p = {"tok_emb": rand(rng, (VP, E), 1.0, "FP32"), "pos_emb": rand(rng, (c["L"], E), 0.5, "FP32")}
    for i in range(c["LAYERS"]):
        p["ln1_w.%d" % i] = rand(rng, (E,), 0.1, "FP32", 1.0)
        p["ln1_b.%d" % i] = rand(rng, (E,), 0.1, "FP32")
        p["wq.%d" % i] = rand(rng, (E, c["H"] * c["DH"]), 1.0 / math.sqrt(E), "FP32")
        p["wk.%d" % i] = rand(rng, (E, c["HKV"] * c["DH"]), 1.0 / math.sqrt(E), "FP32")
        p["wv.%d" % i] = rand(rng, (E, c["HKV"] * c["DH"]), 1.0 / math.sqrt(E), "FP32")
        p["wo.%d" % i] = rand(rng, (c["H"] * c["DH"], E), 1.0 / math.sqrt(E), "FP32")
        p["ln2_w.%d" % i] = rand(rng, (E,), 0.1, "FP32", 1.0)
        p["ln2_b.%d" % i] = rand(rng, (E,), 0.1, "FP32")
        p["w1.%d" % i] = rand(rng, (E, F), 1.0 / math.sqrt(E), "FP32")
        p["w2.%d" % i] = rand(rng, (F, E), 1.0 / math.sqrt(F), "FP32")
    p["lnf_w"] = rand(rng, (E,), 0.1, "FP32", 1.0)
    p["lnf_b"] = rand(rng, (E,), 0.1, "FP32")
    head = 3.0 * rng.standard_normal((E, VP)) / math.sqrt(E)
    head[:, c["V"]:] = 50.0  # padding columns: would always win without the limit
    p["lm_head"] = (to_storage(head, "FP32"), from_storage(to_storage(head, "FP32"), "F32"))
    return p


def gen_forward(p, tokens):
    """Logits [n, V] of every position of one sequence: the plain causal
    decoder, float64, unsharded, GQA by repeating each kv head."""
    c = GEN
    H, HKV, DH = c["H"], c["HKV"], c["DH"]
    w = {k: v[1] for k, v in p.items()}
    n = len(tokens)
    x = w["tok_emb"][tokens] + w["pos_emb"][:n]
    for i in range(c["LAYERS"]):
        h = ref_layer_norm(x, w["ln1_w.%d" % i], w["ln1_b.%d" % i], c["EPS"])
        q = (h @ w["wq.%d" % i]).reshape(n, H, DH)
        k = np.repeat((h @ w["wk.%d" % i]).reshape(n, HKV, DH), H // HKV, axis=1)
        v = np.repeat((h @ w["wv.%d" % i]).reshape(n, HKV, DH), H // HKV, axis=1)
        att = np.zeros((n, H, DH))
        for t in range(n):
            s = np.einsum("hd,jhd->hj", q[t], k[: t + 1]) / math.sqrt(DH)
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            att[t] = np.einsum("hj,jhd->hd", e / e.sum(axis=-1, keepdims=True), v[: t + 1])
        x = x + att.reshape(n, H * DH) @ w["wo.%d" % i]
        h = ref_layer_norm(x, w["ln2_w.%d" % i], w["ln2_b.%d" % i], c["EPS"])
        x = x + ref_gelu(h @ w["w1.%d" % i], "none") @ w["w2.%d" % i]
    h = ref_layer_norm(x, w["lnf_w"], w["lnf_b"], c["EPS"])
    return (h @ w["lm_head"])[:, : c["V"]]


def gen_greedy(p, prompt, new_tokens):
    """Greedy generation: the full token list and, per position, the token
    the model picks there. Refuses a near tie, which FP32 could flip."""
    tokens = list(prompt)
    while len(tokens) < len(prompt) + new_tokens:
        tokens.append(int(np.argmax(gen_forward(p, tokens)[-1])))
    logits = gen_forward(p, tokens)
    top2 = np.sort(logits, axis=-1)[:, -2:]
    if (top2[:, 1] - top2[:, 0]).min() < 1e-3:
        raise GraphError("generation reference: a near tie (margin %.2g)" % (top2[:, 1] - top2[:, 0]).min())
    return tokens, [int(t) for t in np.argmax(logits, axis=-1)]


def gen_graph(d):
    """The decoder as a tpgraph at world size d: vocab-parallel embedding and
    head (matmul_rows: only the rows logit_rows wants), Megatron attention
    and MLP, kv_attention over sharded caches. At
    d > HKV each rank gets its own copy of the kv head its query heads read
    (the kv weights' columns repeated, as vLLM does), so the caches still
    shard by head."""
    c = GEN
    E, F, H, DH, VP, L = c["E"], c["F"], c["H"], c["DH"], c["VP"], c["L"]
    hkv = max(c["HKV"], d)
    g = Graph("gen_decoder_tp%d" % d, d)
    g.j["states"] = []
    g.input("input_ids", "INT64", ["B", 1], "replicate")
    g.input("position_ids", "INT64", ["B"], "replicate")
    g.input("cache_slot", "INT64", ["B"], "replicate")
    g.input("logit_rows", "INT64", ["B"], "replicate")
    g.param("tok_emb", "FP32", [VP, E], "shard(0)")
    g.param("pos_emb", "FP32", [L, E], "replicate")
    g.node("tok_part", "embedding", ["input_ids", "tok_emb"], vocab_parallel=True)   # [B, 1, E]
    g.node("tok", "all_reduce", ["tok_part"], op="sum")
    g.node("tok2", "view", ["tok"], shape=[-1, E])
    g.node("pos", "embedding", ["position_ids", "pos_emb"])                         # [B, E]
    x = g.node("x0", "add", ["tok2", "pos"])
    for i in range(c["LAYERS"]):
        for n_, shape, pl in (("ln1_w", [E], "replicate"), ("ln1_b", [E], "replicate"),
                              ("wq", [E, H * DH], "shard(1)"), ("wk", [E, hkv * DH], "shard(1)"),
                              ("wv", [E, hkv * DH], "shard(1)"), ("wo", [H * DH, E], "shard(0)"),
                              ("ln2_w", [E], "replicate"), ("ln2_b", [E], "replicate"),
                              ("w1", [E, F], "shard(1)"), ("w2", [F, E], "shard(0)")):
            g.param("%s.%d" % (n_, i), "FP32", shape, pl)
        for cache in ("k_cache", "v_cache"):
            g.j["states"].append({"name": "%s.%d" % (cache, i), "datatype": "FP32",
                                  "shape": ["S", hkv, L, DH], "placement": "shard(1)"})
        g.node("h1.%d" % i, "layer_norm", [x, "ln1_w.%d" % i, "ln1_b.%d" % i], eps=c["EPS"])
        for t, heads in (("q", H), ("k", hkv), ("v", hkv)):
            g.node("%s_flat.%d" % (t, i), "matmul", ["h1.%d" % i, "w%s.%d" % (t, i)])
            g.node("%s.%d" % (t, i), "view", ["%s_flat.%d" % (t, i)], shape=[-1, heads // d, 1, DH])
        g.node("att.%d" % i, "kv_attention", ["q.%d" % i, "k.%d" % i, "v.%d" % i, "k_cache.%d" % i,
                                               "v_cache.%d" % i, "cache_slot", "position_ids"])
        g.node("att_flat.%d" % i, "view", ["att.%d" % i], shape=[-1, H // d * DH])
        g.node("o_part.%d" % i, "matmul", ["att_flat.%d" % i, "wo.%d" % i])
        g.node("o.%d" % i, "all_reduce", ["o_part.%d" % i], op="sum")
        g.node("x1.%d" % i, "add", [x, "o.%d" % i])
        g.node("h2.%d" % i, "layer_norm", ["x1.%d" % i, "ln2_w.%d" % i, "ln2_b.%d" % i], eps=c["EPS"])
        g.node("u.%d" % i, "matmul", ["h2.%d" % i, "w1.%d" % i])
        g.node("a.%d" % i, "gelu", ["u.%d" % i])
        g.node("m_part.%d" % i, "matmul", ["a.%d" % i, "w2.%d" % i])
        g.node("m.%d" % i, "all_reduce", ["m_part.%d" % i], op="sum")
        x = g.node("x.%d" % i, "add", ["x1.%d" % i, "m.%d" % i])
    g.param("lnf_w", "FP32", [E], "replicate")
    g.param("lnf_b", "FP32", [E], "replicate")
    g.param("lm_head", "FP32", [E, VP], "shard(1)")
    g.node("hf", "layer_norm", [x, "lnf_w", "lnf_b"], eps=c["EPS"])
    # fallback: run eagerly, so the cuda backend reads logit_rows on the host
    # and multiplies only the wanted rows (docs/models.md, "Generation graphs")
    g.node("logits_flat", "matmul_rows", ["hf", "lm_head", "logit_rows"], fallback=True)  # [B, VP/d]
    g.node("logits", "view", ["logits_flat"], shape=[-1, 1, VP // d])
    g.node("key_local", "argmax", ["logits"], vocab_parallel=True, limit=c["V"])       # [B, 1]
    g.node("key", "all_reduce", ["key_local"], op="max")
    g.node("token", "argmax_index", ["key"])
    g.node("next_token", "view", ["token"], shape=[-1])
    g.output("next_token", "replicate")
    g.j["generate"] = {"input_ids": "input_ids", "positions": "position_ids", "slots": "cache_slot",
                       "next_token": "next_token", "max_seq_len": L, "vocab_size": c["V"],
                       "logit_rows": "logit_rows"}
    return g


def gen_param_tensors(p, d):
    """The safetensors of gen_graph(d): the kv weights' head blocks repeated
    when d > HKV (rank r reads kv head r // (d / HKV))."""
    c = GEN
    rep = max(c["HKV"], d) // c["HKV"]
    out = {}
    for k, (raw, _) in p.items():
        if k.startswith(("wk.", "wv.")) and rep > 1:
            raw = np.repeat(raw.reshape(c["E"], c["HKV"], 1, c["DH"]), rep, axis=2).reshape(c["E"], -1)
        out[k] = ("F32", np.ascontiguousarray(raw))
    return out


def gen_schedules(p):
    """Steps of token rows with the reference's next token for each row
    and logit_rows: 1 on the last row of each sequence in a step (a
    prompt's earlier rows want no token; the engine's next_token there is
    the argmax of a zero row, id 0). batched: a and b prefill together; c's prefill joins a and b's decodes;
    d takes b's slot once b is done (the cache is overwritten, never reset).
    alone_a: sequence a by itself in slot 3."""
    ref = {s: gen_greedy(p, prompt, n) for s, (_, prompt, n) in GEN_SEQS.items()}

    def rows(seq, lo, hi, slot=None):
        tokens, picks = ref[seq]
        return [(tokens[i], i, GEN_SEQS[seq][0] if slot is None else slot, picks[i], int(i == hi - 1))
                for i in range(lo, hi)]

    def length(seq):
        return len(GEN_SEQS[seq][1]) + GEN_SEQS[seq][2] - 1  # the last pick is never fed back

    plan = [[("a", 0, 5), ("b", 0, 3)], [("a", 5, 6), ("b", 3, 4), ("c", 0, 4)]]
    pos = {"a": 6, "b": 4, "c": 4}
    while any(pos[s] < length(s) for s in pos):
        step = []
        for s in list(pos):
            if pos[s] < length(s):
                step.append((s, pos[s], pos[s] + 1))
                pos[s] += 1
            elif s == "b" and "d" not in pos:
                step.append(("d", 0, 2))
                pos["d"] = 2
        plan.append(step)
    batched = [sum((rows(*r) for r in step), []) for step in plan]
    alone = [rows("a", 0, 5, 3)] + [rows("a", i, i + 1, 3) for i in range(5, length("a"))]

    def as_json(steps):
        return [{"input_ids": [r[0] for r in st], "positions": [r[1] for r in st], "slots": [r[2] for r in st],
                 "next_token": [r[3] for r in st], "logit_rows": [r[4] for r in st]} for st in steps]

    return {"batched": as_json(batched), "alone_a": as_json(alone),
            "tokens": {s: ref[s][0] for s in ref}}


def write_generate_examples(out_dir):
    """gen_decoder_tpD.{json,safetensors} for D in 1, 2, 4 and one
    gen_decoder.steps.json (the schedules; the same for every D)."""
    p = gen_params()
    names = []
    for d in (1, 2, 4):
        g = gen_graph(d)
        with open(os.path.join(out_dir, g.name + ".json"), "w") as f:
            json.dump(g.j, f, indent=1)
            f.write("\n")
        save_safetensors(os.path.join(out_dir, g.name + ".safetensors"), gen_param_tensors(p, d))
        names.append(g.name)
    with open(os.path.join(out_dir, "gen_decoder.steps.json"), "w") as f:
        json.dump(gen_schedules(p), f, indent=1)
        f.write("\n")
    return names


def write_example(ex, out_dir):
    n = ex.name
    with open(os.path.join(out_dir, n + ".json"), "w") as f:
        json.dump(ex.graph.j, f, indent=1)
        f.write("\n")
    save_safetensors(os.path.join(out_dir, n + ".safetensors"), ex.params)
    save_safetensors(os.path.join(out_dir, n + ".inputs.safetensors"), ex.inputs)
    save_safetensors(os.path.join(out_dir, n + ".ref.safetensors"),
                     {k: (KS_ST[dt], to_storage(v, dt)) for k, (dt, v) in ex.ref.items()})
    return {"name": n, "json": n + ".json", "inputs": n + ".inputs.safetensors",
            "ref": n + ".ref.safetensors", "world_size": ex.graph.world,
            "dtype": ex.dtype, "rtol": ex.rtol}


# --------------------------------------------------------------------------
# selfcheck: an independent SPMD interpreter of the JSON graph
# --------------------------------------------------------------------------

ATTRS = {
    "add": set(), "sub": set(), "mul": set(), "silu": set(), "relu": set(),
    "gelu": {"approximate"}, "softmax": {"dim"}, "layer_norm": {"eps"},
    "rms_norm": {"eps"}, "matmul": {"transpose_b"}, "attention": {"causal", "scale"},
    "embedding": {"vocab_parallel"}, "view": {"shape"}, "reshape": {"shape"},
    "permute": {"dims"}, "transpose": {"dim0", "dim1"},
    "slice": {"dim", "start", "length"}, "cat": {"dim"}, "contiguous": set(),
    "all_gather": {"dim"}, "reduce_scatter": {"dim", "op"}, "all_reduce": {"op"},
    "all_to_all": {"split_dim", "concat_dim"}, "broadcast": {"src"}, "neg": set(),
    "kv_attention": {"scale"}, "argmax": {"vocab_parallel", "limit"}, "argmax_index": set(),
    "matmul_rows": {"transpose_b"}, "rope": set(),
}
# ops whose result is INT64 whatever their input (argmax keys, token ids)
INT64_OPS = {"argmax", "argmax_index"}
VIEW_OPS = {"view", "permute", "transpose", "slice"}
COLLECTIVES = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"}


class GraphError(Exception):
    pass


def _dim(k, nd):
    if not -nd <= k < nd:
        raise GraphError("dim %d out of range for rank-%d tensor" % (k, nd))
    return k % nd


def _placement(p):
    if p == "replicate":
        return None
    if p.startswith("shard(") and p.endswith(")"):
        return int(p[6:-1])
    raise GraphError("bad placement %r" % p)


def _shard(x, p, r, d, what):
    k = _placement(p)
    if k is None:
        return x.copy()
    k = _dim(k, x.ndim)
    if x.shape[k] % d:
        raise GraphError("%s: dim %d (%d) not divisible by %d" % (what, k, x.shape[k], d))
    c = x.shape[k] // d
    return np.ascontiguousarray(np.take(x, range(r * c, (r + 1) * c), axis=k))


def _round(x, datatype):
    """Emulate storing a float32 result in datatype."""
    if datatype == "FP32":
        return x.astype(np.float32)
    if datatype == "FP16":
        return x.astype(np.float16).astype(np.float32)
    if datatype == "BF16":
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    return x


def _compute(op, a, ins, r, d):
    ct = next((x.dtype for x in ins if x.dtype.kind == "f"), np.float64)
    if op in ("add", "sub", "mul"):
        x, y = ins
        np.broadcast_shapes(x.shape, y.shape)
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](x, y)
    x = ins[0]
    if op == "neg":
        return -x
    if op == "rope":  # x cos + rotate_half(x) sin over the last dim
        h = x.shape[-1] // 2
        return x * ins[1] + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * ins[2]
    if op == "kv_attention":
        return _kv_attention(a, *ins)
    if op == "argmax":
        return _argmax_keys(x, a, r)
    if op == "argmax_index":
        return (0xFFFFFFFF - (x & 0xFFFFFFFF)).astype(np.int64)
    if op == "relu":
        return np.maximum(x, 0)
    if op == "silu":
        return x / (1 + np.exp(-x))
    if op == "gelu":
        appr = a.get("approximate", "none")
        if appr == "tanh":
            c = math.sqrt(2 / math.pi)
            return 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x * x * x)))
        if appr != "none":
            raise GraphError("gelu approximate=%r" % appr)
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return (0.5 * x * (1 + erf(x.astype(np.float64) / math.sqrt(2)))).astype(ct)
    if op == "softmax":
        k = _dim(a.get("dim", -1), x.ndim)
        e = np.exp(x - x.max(axis=k, keepdims=True))
        return e / e.sum(axis=k, keepdims=True)
    if op == "layer_norm":
        w, b = ins[1], ins[2]
        if w.shape != x.shape[-1:] or b.shape != x.shape[-1:]:
            raise GraphError("layer_norm shapes %s %s %s" % (x.shape, w.shape, b.shape))
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + ct.type(a.get("eps", 1e-5))) * w + b
    if op == "rms_norm":
        w = ins[1]
        if w.shape != x.shape[-1:]:
            raise GraphError("rms_norm shapes %s %s" % (x.shape, w.shape))
        ms = (x * x).mean(axis=-1, keepdims=True)
        return x / np.sqrt(ms + ct.type(a.get("eps", 1e-6))) * w
    if op == "matmul":
        b = ins[1]
        if a.get("transpose_b", False):
            b = np.swapaxes(b, -1, -2)
        if x.shape[-1] != b.shape[-2]:
            raise GraphError("matmul shapes %s x %s" % (x.shape, b.shape))
        return np.matmul(x, b)
    if op == "matmul_rows":
        b, mask = ins[1], ins[2]
        if a.get("transpose_b", False):
            b = b.T
        if b.ndim != 2 or x.shape[-1] != b.shape[0] or mask.shape != x.shape[:1]:
            raise GraphError("matmul_rows shapes %s x %s, mask %s" % (x.shape, b.shape, mask.shape))
        out = np.zeros(x.shape[:-1] + b.shape[1:], x.dtype)
        want = mask != 0  # the other rows are never read: NaN there stays out
        out[want] = np.matmul(x[want], b)
        return out
    if op == "attention":
        q, k, v = ins
        if q.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or \
                k.shape[1] < 1 or q.shape[1] % k.shape[1]:
            raise GraphError("attention shapes %s %s %s" % (q.shape, k.shape, v.shape))
        # GQA: query head h reads kv head h // (H / Hkv)
        k, v = np.repeat(k, q.shape[1] // k.shape[1], axis=1), np.repeat(v, q.shape[1] // k.shape[1], axis=1)
        scale = a.get("scale", 1.0 / math.sqrt(q.shape[-1]))
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * ct.type(scale)
        if a.get("causal", False):
            S, T = s.shape[-2:]
            if S != T:
                raise GraphError("causal attention with S != T")
            s = np.where(np.triu(np.ones((S, T), bool), 1), -np.inf, s)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        return np.matmul(p, v)
    if op == "embedding":
        ids, table = ins
        if ids.dtype.kind != "i":
            raise GraphError("embedding ids must be integer")
        if a.get("vocab_parallel", False):
            vl = table.shape[0]
            loc = ids - r * vl
            hit = (loc >= 0) & (loc < vl)
            return np.where(hit[..., None], table[np.where(hit, loc, 0)], 0).astype(table.dtype)
        if ids.min() < 0 or ids.max() >= table.shape[0]:
            raise GraphError("embedding id out of range")
        return table[ids]
    if op == "cat":
        k = _dim(a["dim"], x.ndim)
        return np.concatenate(ins, axis=k)
    if op == "contiguous":
        return np.ascontiguousarray(x)
    if op == "reshape":
        return np.reshape(x, a["shape"])
    if op == "view":
        v = x.view()
        try:
            v.shape = tuple(a["shape"])      # raises if the strides do not allow it
        except AttributeError as e:
            raise GraphError("view %s -> %s: %s" % (x.shape, a["shape"], e))
        return v
    if op == "permute":
        dims = [_dim(k, x.ndim) for k in a["dims"]]
        if sorted(dims) != list(range(x.ndim)):
            raise GraphError("permute dims %r" % a["dims"])
        return np.transpose(x, dims)
    if op == "transpose":
        return np.swapaxes(x, _dim(a["dim0"], x.ndim), _dim(a["dim1"], x.ndim))
    if op == "slice":
        k = _dim(a["dim"], x.ndim)
        st, ln = a["start"], a["length"]
        if st < 0 or ln < 0 or st + ln > x.shape[k]:
            raise GraphError("slice out of range")
        idx = [slice(None)] * x.ndim
        idx[k] = slice(st, st + ln)
        return x[tuple(idx)]
    raise GraphError("unknown op %r" % op)


def _kv_attention(a, q, k, v, k_cache, v_cache, slot, pos):
    """The generation contract's kv_attention (docs/models.md): every active
    row (slot >= 1) writes its k/v at positions pos .. pos+T-1 of cache
    sequence slot-1 (the caches are updated in place: they persist across
    steps), then attends causally over positions 0 .. pos+t; slot 0 rows
    give zeros. All writes happen before any read."""
    B, H, T, D = q.shape
    S, hkv, L, _ = k_cache.shape
    if k.shape != (B, hkv, T, D) or v.shape != k.shape or H % hkv or v_cache.shape != k_cache.shape:
        raise GraphError("kv_attention shapes q %s k %s v %s cache %s" % (q.shape, k.shape, v.shape, k_cache.shape))
    slot, pos = slot.astype(np.int64).reshape(-1), pos.astype(np.int64).reshape(-1)
    for b in range(B):
        if slot[b] and not (0 < slot[b] <= S and 0 <= pos[b] and pos[b] + T <= L):
            raise GraphError("kv_attention row %d: slot %d / pos %d out of range (S %d, L %d)" % (b, slot[b], pos[b], S, L))
    for b in np.flatnonzero(slot):
        k_cache[slot[b] - 1, :, pos[b]:pos[b] + T] = k[b]
        v_cache[slot[b] - 1, :, pos[b]:pos[b] + T] = v[b]
    scale = q.dtype.type(a.get("scale", 1.0 / math.sqrt(D)))
    out = np.zeros_like(q)
    for b in np.flatnonzero(slot):
        for t in range(T):
            n = pos[b] + t + 1
            keys = np.repeat(k_cache[slot[b] - 1, :, :n], H // hkv, axis=0)
            vals = np.repeat(v_cache[slot[b] - 1, :, :n], H // hkv, axis=0)
            s = np.einsum("hd,hnd->hn", q[b, :, t], keys) * scale
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            out[b, :, t] = np.einsum("hn,hnd->hd", p / p.sum(axis=-1, keepdims=True), vals)
    return out


def _argmax_keys(x, a, r):
    """argmax's INT64 keys (kernels/common/tp_generate.h): the high word the
    value's order as a signed int, the low word 0xFFFFFFFF - global index,
    so a signed max picks the largest value, then the lowest index."""
    n = x.shape[-1]
    base = r * n if a.get("vocab_parallel", False) else 0
    idx = base + np.arange(n)
    v = np.where(np.isnan(x), -np.inf, x).astype(np.float32)
    v = np.where(idx < a.get("limit", idx[-1] + 1), v, -np.inf) if n else v
    best = np.argmax(v, axis=-1)
    val = np.take_along_axis(v, best[..., None], axis=-1)[..., 0] + np.float32(0)  # -0.0 as +0.0
    bits = val.view(np.uint32).astype(np.uint64)
    ordered = np.where(bits & 0x80000000, ~bits & 0xFFFFFFFF, bits ^ 0x80000000)
    key = ((ordered ^ 0x80000000) << np.uint64(32)) | (0xFFFFFFFF - (base + best).astype(np.uint64))
    key = key.view(np.int64)
    if "limit" in a:  # no candidate below the limit: below every key
        key = np.where(base >= a["limit"], np.iinfo(np.int64).min, key)
    return key


def _collective(op, a, xs, d):
    nd = xs[0].ndim
    for x in xs:
        if x.shape != xs[0].shape:
            raise GraphError("ranks disagree on shape")

    def reduce(kind):
        if kind == "max":
            acc = xs[0]
            for x in xs[1:]:
                acc = np.maximum(acc, x)
            return acc
        acc = xs[0].copy()
        for x in xs[1:]:
            acc = acc + x
        if kind == "avg":
            acc = acc / acc.dtype.type(d)
        elif kind != "sum":
            raise GraphError("reduce op %r" % kind)
        return acc

    def split(x, k):
        if x.shape[k] % d:
            raise GraphError("split dim %d (%d) not divisible by %d" % (k, x.shape[k], d))
        return np.split(x, d, axis=k)

    if op == "all_gather":
        k = _dim(a["dim"], nd)
        full = np.concatenate(xs, axis=k)
        return [full.copy() for _ in range(d)]
    if op == "all_reduce":
        if a["op"] not in ("sum", "avg", "max"):
            raise GraphError("all_reduce op %r" % a["op"])
        red = reduce(a["op"])
        return [red.copy() for _ in range(d)]
    if op == "reduce_scatter":
        if a["op"] not in ("sum", "avg"):
            raise GraphError("reduce_scatter op %r" % a["op"])
        k = _dim(a["dim"], nd)
        return [np.ascontiguousarray(c) for c in split(reduce(a["op"]), k)]
    if op == "all_to_all":
        ks, kc = _dim(a["split_dim"], nd), _dim(a["concat_dim"], nd)
        chunks = [split(x, ks) for x in xs]            # chunks[src][dst]
        return [np.concatenate([chunks[j][r] for j in range(d)], axis=kc) for r in range(d)]
    if op == "broadcast":
        src = a["src"]
        if not 0 <= src < d:
            raise GraphError("broadcast src %d" % src)
        return [np.ascontiguousarray(xs[src]) for _ in range(d)]
    raise GraphError("unknown collective %r" % op)


def init_states(gj, slots, mode):
    """A generation graph's states (zero-filled, dim 0 "S" = slots), per
    rank as placed: {name: [array per rank]}, updated in place by each
    simulate() step that is given them."""
    d, out = gj["world_size"], {}
    for t in gj.get("states", []):
        shape = [slots if s == "S" else s for s in t["shape"]]
        dt = np.float32 if mode == "emulate" else np.float64
        out[t["name"]] = [_shard(np.zeros(shape, dt), t["placement"], r, d, t["name"]) for r in range(d)]
    return out


def simulate(gj, params_st, inputs_st, mode, states=None, loaded=None):
    """Run the graph on gj["world_size"] simulated ranks.
    mode "exact": float64 everywhere; "emulate": float32 compute, every
    non-view node rounded to its datatype. Returns {output: global float64}.
    states: init_states()'s arrays, for a graph that declares states;
    loaded: a dict keeping the params as loaded and sharded across calls
    with the same params_st and mode (a generation loop's steps)."""
    d = gj["world_size"]
    env = [dict() for _ in range(d)]
    dtypes = {}
    for t in gj.get("states", []):
        if states is None or t["name"] not in states:
            raise GraphError("state %s: no arrays given (init_states)" % t["name"])
        for r in range(d):
            env[r][t["name"]] = states[t["name"]][r]
        dtypes[t["name"]] = t["datatype"]

    def load(st_raw, datatype, shape, what):
        st, raw = st_raw
        if st != KS_ST[datatype]:
            raise GraphError("%s: stored dtype %s, declared %s" % (what, st, datatype))
        if len(shape) != raw.ndim or any(s != "B" and s != n for s, n in zip(shape, raw.shape)):
            raise GraphError("%s: stored shape %s, declared %s" % (what, list(raw.shape), shape))
        v = from_storage(raw, st)
        if datatype in FLOAT_TYPES and mode == "emulate":
            v = v.astype(np.float32)
        return v

    for decl, store, kind in ((gj["inputs"], inputs_st, "input"), (gj["params"], params_st, "param")):
        for t in decl:
            key = t.get("tensor", t["name"]) if kind == "param" else t["name"]
            if t["name"] in dtypes:
                raise GraphError("name %s used twice" % t["name"])
            if key not in store:
                raise GraphError("%s %s missing from safetensors" % (kind, key))
            if kind == "param" and "B" in t["shape"]:
                raise GraphError("param %s has a batch dim" % t["name"])
            if kind == "param" and loaded is not None and t["name"] in loaded:
                shards = loaded[t["name"]]
            else:
                g = load(store[key], t["datatype"], t["shape"], "%s %s" % (kind, t["name"]))
                shards = [_shard(g, t["placement"], r, d, t["name"]) for r in range(d)]
                if kind == "param" and loaded is not None:
                    loaded[t["name"]] = shards
            for r in range(d):
                env[r][t["name"]] = shards[r]
            dtypes[t["name"]] = t["datatype"]

    for n in gj["nodes"]:
        name, op, a = n["name"], n["op"], n.get("attrs", {})
        try:
            if name in dtypes:
                raise GraphError("name used twice")
            if op not in ATTRS:
                raise GraphError("unknown op")
            bad = set(a) - ATTRS[op]
            if bad:
                raise GraphError("unknown attrs %s" % sorted(bad))
            for i in n["inputs"]:
                if i not in dtypes:
                    raise GraphError("input %s not defined earlier" % i)
            in_dt = [dtypes[i] for i in n["inputs"]]
            dt = "INT64" if op in INT64_OPS else in_dt[1] if op == "embedding" else in_dt[0]
            floats = {t for t in in_dt if t in FLOAT_TYPES}
            if len(floats) > 1:
                raise GraphError("mixed float datatypes %s" % sorted(floats))
            if op in COLLECTIVES:
                outs = _collective(op, a, [env[r][n["inputs"][0]] for r in range(d)], d)
            else:
                outs = [_compute(op, a, [env[r][i] for i in n["inputs"]], r, d) for r in range(d)]
            if op not in VIEW_OPS and mode == "emulate":
                outs = [_round(o, dt) for o in outs]
        except (GraphError, KeyError, ValueError) as e:
            raise GraphError("%s: node %s (%s): %s" % (gj["name"], name, op, e))
        dtypes[name] = dt
        for r in range(d):
            env[r][name] = outs[r]

    result = {}
    for o in gj["outputs"]:
        locs = [env[r][o["name"]] for r in range(d)]
        k = _placement(o["placement"])
        if k is None:
            for r in range(1, d):
                if not np.array_equal(locs[r], locs[0]):
                    raise GraphError("%s: output %s is 'replicate' but rank %d differs from rank 0"
                                     % (gj["name"], o["name"], r))
            full = locs[0]
        else:
            full = np.concatenate(locs, axis=k)
        result[o["name"]] = (dtypes[o["name"]], np.asarray(full, dtype=np.float64))
    return result


def rel_err(out, ref):
    """The tpserve metric: max|out - ref| / max(max|ref|, 1e-6), in float64."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ref.size == 0:
        return 0.0
    diff = np.abs(out - ref)
    if not np.all(np.isfinite(diff)):
        return float("inf")
    return float(diff.max() / max(float(np.abs(ref).max()), 1e-6))


def selfcheck(examples, out_dir):
    """Re-read every example from out_dir and check the SPMD interpretation
    of its JSON against the unsharded reference."""
    with open(os.path.join(out_dir, "manifest.json")) as f:
        manifest = {m["name"]: m for m in json.load(f)["graphs"]}
    ok = True
    print("%-24s %-14s %10s %10s %8s  %s" % ("graph", "output", "exact", "emulated", "rtol", ""))
    for ex in examples:
        m = manifest[ex.name]
        with open(os.path.join(out_dir, m["json"])) as f:
            gj = json.load(f)
        params = load_safetensors(os.path.join(out_dir, gj["weights"]))
        inputs = load_safetensors(os.path.join(out_dir, m["inputs"]))
        ref_file = load_safetensors(os.path.join(out_dir, m["ref"]))
        try:
            exact = simulate(gj, params, inputs, "exact")
            emul = simulate(gj, params, inputs, "emulate")
        except GraphError as e:
            print("FAIL %s: %s" % (ex.name, e))
            ok = False
            continue
        if set(ref_file) != set(o["name"] for o in gj["outputs"]):
            print("FAIL %s: ref tensors %s != outputs" % (ex.name, sorted(ref_file)))
            ok = False
        for oname, (dt, ref64) in ex.ref.items():
            st, raw = ref_file[oname]
            e_dt, e_val = exact[oname]
            m_dt, m_val = emul[oname]
            bad = []
            if st != KS_ST[dt] or e_dt != dt:
                bad.append("dtype ref=%s graph=%s" % (st, e_dt))
            if raw.shape != ref64.shape or e_val.shape != ref64.shape:
                bad.append("shape ref=%s graph=%s" % (list(raw.shape), list(e_val.shape)))
            err_exact = rel_err(e_val, ref64) if not bad else float("inf")
            err_emul = rel_err(m_val, from_storage(raw, st)) if not bad else float("inf")
            if err_exact > 1e-9:
                bad.append("float64 SPMD run disagrees with the reference")
            if err_emul > m["rtol"] / 2:
                bad.append("emulated engine arithmetic uses more than half the tolerance")
            print("%-24s %-14s %10.2e %10.2e %8.0e  %s"
                  % (ex.name, oname, err_exact, err_emul, m["rtol"], "; ".join(bad) or "ok"))
            ok = ok and not bad
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--selfcheck", action="store_true",
                    help="verify every graph with a simulated SPMD run")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    examples = all_examples()
    entries = [write_example(ex, args.out) for ex in examples]
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump({"graphs": entries}, f, indent=1)
        f.write("\n")
    print("wrote %d graphs to %s" % (len(entries), args.out))
    print("wrote generation graphs %s" % ", ".join(write_generate_examples(args.out)))
    if args.selfcheck:
        if not selfcheck(examples, args.out):
            print("selfcheck FAILED", file=sys.stderr)
            return 1
        print("selfcheck passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
