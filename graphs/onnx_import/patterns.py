"""Pattern matching on the folded ONNX graph: decomposed subgraphs that are
exactly one fused tpgraph op (gelu, silu, rms_norm, layer_norm, attention,
rope).

Each matcher takes an anchor node and returns a Match or None. A match is
accepted only when every tensor inside it is used by the match alone, so
replacing the subgraph by one op changes nothing else."""
import math

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator


class Match:
    """`nodes`: ONNX nodes replaced; `last`: the one whose output the fused
    op produces; `inputs`: ONNX tensor names, or ("kT", tensor) for an
    attention key given transposed; `op`/`attrs`: the tpgraph op (op
    "alias" forwards inputs[0])."""

    def __init__(self, op, inputs, attrs, nodes, last):
        self.op, self.inputs, self.attrs, self.nodes, self.last = op, inputs, attrs, nodes, last
        # nodes other matches may share (an attention's key-padding mask
        # subgraph): dropped once nothing outside the matches uses them
        self.shared = []


class Graph:
    """Producer/consumer lookups over the value-dependent nodes."""

    def __init__(self, nm):
        self.nm = nm
        self.prod = {o: n for n in nm.nodes for o in n.output}
        self.uses = {}
        for n in nm.nodes:
            for i in n.input:
                self.uses.setdefault(i, []).append(n)
        self.outputs = set(nm.outputs)
        # key_padding's answers by (tensor, s, t): every layer adds the same mask
        self.key_padding = {}

    def producer(self, t, op_type=None):
        n = self.prod.get(t)
        if n is None or (op_type is not None and n.op_type not in (op_type if isinstance(op_type, tuple) else (op_type,))):
            return None
        return n

    def scalar(self, t):
        """The value of a constant with one element, else None."""
        c = self.nm.const.get(t)
        if c is None or c.size != 1:
            return None
        return float(c.reshape(-1)[0])

    def other(self, node, t):
        """For a binary node with input t, the other input (None if not)."""
        a, b = node.input[0], node.input[1]
        if a == t:
            return b
        if b == t:
            return a
        return None

    def split_const(self, node, pred=None):
        """Binary node with one scalar-constant operand satisfying pred ->
        (the other operand, constant value); else None."""
        if node is None or len(node.input) != 2:
            return None
        for k in (0, 1):
            c = self.scalar(node.input[k])
            if c is not None and (pred is None or pred(c)) and node.input[1 - k] not in self.nm.const:
                return node.input[1 - k], c
        return None

    def only_use(self, t):
        u = self.uses.get(t, [])
        if len(u) != 1 or t in self.outputs:
            return None
        return u[0]

    def attr(self, node, name, default=None):
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default


def key(node):
    """A node's identity: its first output (ONNX node names may be empty)."""
    return node.output[0]


def near(c, target, tol=1e-6):
    return abs(c - target) <= tol * max(1.0, abs(target))


def _split_near(g, node, target, tol=1e-6):
    """split_const for a constant that is target: near() it, or, in an
    FP16/BF16 export, target rounded to that dtype."""
    if node is None or len(node.input) != 2:
        return None
    for k in (0, 1):
        t, c = node.input[k], g.scalar(node.input[k])
        if c is None or node.input[1 - k] in g.nm.const:
            continue
        dt = g.nm.dtype.get(t)
        if near(c, target, tol) or (dt in NARROW and c == float(np.asarray(target).astype(dt))):
            return node.input[1 - k], c
    return None


def _internal_ok(g, nodes, last):
    """Every output of `nodes` except last's is consumed only inside."""
    names = {key(n) for n in nodes}
    for n in nodes:
        for o in n.output:
            if n is last:
                continue
            if o in g.outputs or any(key(u) not in names for u in g.uses.get(o, [])):
                return False
    return True


def _accept(g, m):
    return m if m is not None and _internal_ok(g, m.nodes, m.last) else None


# -- casts -------------------------------------------------------------------
#
# FP16/BF16 exports compute norms and softmax in FP32 between Casts (HF's
# RMSNorm: x.to(float32) ... .to(dtype) * weight; softmax(dtype=float32)).
# The fused ops compute in FP32 whatever their dtype (graphs/README.md) and
# round once on store, so the Casts fold into the fused op in the FP16/BF16
# dtype: one rounding where the export has two, nothing computed in a lower
# precision than the export does.

NARROW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
FLOATS = (np.dtype(np.float32), np.dtype(np.float64)) + NARROW


def _float_cast(g, n):
    return (n is not None and n.op_type == "Cast" and g.nm.dtype.get(n.input[0]) in FLOATS
            and g.nm.dtype.get(n.output[0]) in FLOATS)


def _widened(g, t):
    """t = Cast(x0) of an FP16/BF16 x0 to FP32 -> (x0, the Cast), else None."""
    c = g.producer(t, "Cast")
    if c is None or g.nm.dtype[c.input[0]] not in NARROW or g.nm.dtype[t] != np.float32:
        return None
    return c.input[0], c


def _narrowed(g, t, dt):
    """t's only use is a Cast to dt -> that Cast, else None."""
    c = g.only_use(t)
    return c if c is not None and c.op_type == "Cast" and g.nm.dtype[c.output[0]] == dt else None


def _uncast(g, t, nodes):
    """Steps back over float-to-float Casts producing t (appended to nodes)."""
    while _float_cast(g, g.producer(t)):
        n = g.producer(t)
        nodes.append(n)
        t = n.input[0]
    return t


def _softmax_tail(g, p):
    """After a softmax: the IsNaN/Where guard and float-to-float Casts, in
    any order -> (their nodes, the tensor they give)."""
    nodes = []
    while True:
        guard, q = _not_nan_guard(g, p)
        u = g.only_use(q)
        if guard:
            nodes += guard
        elif _float_cast(g, u):
            nodes.append(u)
            q = u.output[0]
        else:
            return nodes, q
        p = q


def _as_dtype(g, t, dt):
    """A norm's weight/bias input of a match in FP32 -> the same in dt
    (("ones"/"zeros") or ("cast", constant, dt) when every value is exact
    in dt), else None."""
    if isinstance(t, tuple):
        return (t[0], t[1], dt)
    c = g.nm.const.get(t)
    if c is None or not np.array_equal(c.astype(dt).astype(c.dtype), c):
        return None
    return ("cast", t, dt)


def _narrow_norm(g, m, x, dim, plain=True):
    """A norm match m on FP32 x: when x = Cast(x0) of FP16/BF16 and m's
    result is only cast back to x0's dtype (then, if m has no weight, maybe
    a Mul by a [dim] weight and, for layer_norm, an Add of a [dim] bias in
    that dtype: HF's Llama), the same op on x0 in x0's dtype. Else m (None
    if not `plain`), each only when accepted."""
    wid = _widened(g, x)
    cout = wid and _narrowed(g, m.last.output[0], g.nm.dtype[wid[0]])
    if not cout:
        return _accept(g, m) if plain else None
    x0, cin = wid
    dt = g.nm.dtype[x0]
    params = [_as_dtype(g, t, dt) for t in m.inputs[1:]]
    if any(p is None for p in params):
        return _accept(g, m) if plain else None
    nodes, last = m.nodes + [cout], cout
    if all(isinstance(t, tuple) for t in m.inputs[1:]):
        w, wm = _scale_weight(g, cout.output[0], dim)
        if w is not None and g.nm.dtype[w] == dt:
            params[0], nodes, last = w, nodes + [wm], wm
            add = g.only_use(wm.output[0]) if m.op == "layer_norm" else None
            b = g.other(add, wm.output[0]) if add is not None and add.op_type == "Add" else None
            if b is not None and b in g.nm.const and g.nm.const[b].shape == (dim,) and g.nm.dtype[b] == dt:
                params[1], nodes, last = b, nodes + [add], add
    for used in (nodes + [cin], nodes):  # the widening Cast too when only the match reads it
        n = _accept(g, Match(m.op, [x0] + params, m.attrs, used, last))
        if n is not None:
            return n
    return _accept(g, m) if plain else None


def match_layer_norm_cast(g, ln):
    """Cast(x0 FP16/BF16 -> FP32), LayerNormalization, Cast back."""
    x = ln.input[0]
    shape = g.nm.shape.get(x)
    if not shape or g.attr(ln, "axis", -1) % len(shape) != len(shape) - 1 or len(ln.input) < 2:
        return None
    w = ln.input[1]
    b = ln.input[2] if len(ln.input) > 2 and ln.input[2] else ("zeros", shape[-1], np.dtype(np.float32))
    if w not in g.nm.const or (not isinstance(b, tuple) and b not in g.nm.const):
        return None
    m = Match("layer_norm", [x, w, b], {"eps": float(g.attr(ln, "epsilon", 1e-5))}, [ln], ln)
    return _narrow_norm(g, m, x, shape[-1], plain=False)


def match_softmax_cast(g, sm):
    """Cast(x0 FP16/BF16 -> FP32), Softmax, Cast back (opset 13 or the last axis)."""
    shape = g.nm.shape.get(sm.input[0])
    axis = g.attr(sm, "axis", -1 if g.nm.opset >= 13 else 1)
    wid = _widened(g, sm.input[0])
    if not shape or not wid or (g.nm.opset < 13 and axis % len(shape) != len(shape) - 1):
        return None
    cout = _narrowed(g, sm.output[0], g.nm.dtype[wid[0]])
    if cout is None:
        return None
    return (_accept(g, Match("softmax", [wid[0]], {"dim": axis}, [wid[1], sm, cout], cout))
            or _accept(g, Match("softmax", [wid[0]], {"dim": axis}, [sm, cout], cout)))


EXACT_WIDENING = {(np.dtype(a), np.dtype(b)) for a, b in (
    (np.float16, np.float32), (ml_dtypes.bfloat16, np.float32), (np.float16, np.float64),
    (ml_dtypes.bfloat16, np.float64), (np.float32, np.float64), (np.int32, np.int64))}


def match_cast_roundtrip(g, c):
    """Cast(Cast(x, a wider type that holds every x exactly), x's type) is x."""
    inner = g.producer(c.input[0], "Cast")
    if inner is None:
        return None
    src, mid, dst = g.nm.dtype[inner.input[0]], g.nm.dtype[c.input[0]], g.nm.dtype[c.output[0]]
    if src != dst or (src, mid) not in EXACT_WIDENING:
        return None
    return _accept(g, Match("alias", [inner.input[0]], {}, [c], c))


# -- gelu ------------------------------------------------------------------

def _times_half_of(g, node, x):
    """node = Mul(y, 0.5) -> y; None otherwise."""
    r = g.split_const(node, lambda c: near(c, 0.5))
    return r[0] if r else None


def _gelu_tail(g, x, inner, nodes):
    """inner = 1 + f(x). Accepts 0.5*x*inner, (x*inner)*0.5, (0.5*x)*inner.
    Returns (nodes, last) or None."""
    m = g.only_use(inner)
    if m is None or m.op_type != "Mul":
        return None
    o = g.other(m, inner)
    if o == x:
        h = g.only_use(m.output[0])
        if h is not None and h.op_type == "Mul" and _times_half_of(g, h, x) == m.output[0]:
            return nodes + [m, h], h
        return None
    half = g.producer(o, "Mul")
    if half is not None and _times_half_of(g, half, x) == x:
        return nodes + [half, m], m
    return None


def match_gelu_erf(g, erf):
    src = g.producer(erf.input[0], ("Div", "Mul"))
    if src is None:
        return None
    r = _split_near(g, src, math.sqrt(2.0) if src.op_type == "Div" else 1 / math.sqrt(2.0))
    if r is None or (src.op_type == "Div" and src.input[0] != r[0]):
        return None
    x = r[0]
    plus = g.only_use(erf.output[0])
    if plus is None or plus.op_type != "Add" or g.split_const(plus, lambda c: near(c, 1.0)) is None:
        return None
    tail = _gelu_tail(g, x, plus.output[0], [src, erf, plus])
    if tail is None:
        return None
    return _accept(g, Match("gelu", [x], {}, tail[0], tail[1]))


def match_gelu_tanh(g, tanh):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    s = g.producer(tanh.input[0], "Mul")
    r = _split_near(g, s, math.sqrt(2 / math.pi), 1e-5)
    if r is None:
        return None
    inner = g.producer(r[0], "Add")
    if inner is None:
        return None
    for k in (0, 1):
        x, cube_mul = inner.input[k], g.producer(inner.input[1 - k], "Mul")
        rc = _split_near(g, cube_mul, 0.044715, 1e-5)
        if rc is None:
            continue
        p = g.producer(rc[0], "Pow")
        if p is None or p.input[0] != x or g.scalar(p.input[1]) != 3.0:
            continue
        plus = g.only_use(tanh.output[0])
        if plus is None or plus.op_type != "Add" or g.split_const(plus, lambda c: near(c, 1.0)) is None:
            return None
        tail = _gelu_tail(g, x, plus.output[0], [p, cube_mul, inner, s, tanh, plus])
        if tail is None:
            return None
        return _accept(g, Match("gelu", [x], {"approximate": "tanh"}, tail[0], tail[1]))
    return None


# -- silu ------------------------------------------------------------------

def match_silu(g, sig):
    x = sig.input[0]
    m = g.only_use(sig.output[0])
    if m is None or m.op_type != "Mul" or g.other(m, sig.output[0]) != x:
        return None
    return _accept(g, Match("silu", [x], {}, [sig, m], m))


# -- rope ------------------------------------------------------------------

def _half_slice(g, node, x, first):
    """node = x[..., :D/2] (first) or x[..., D/2:] on x's last axis, D even,
    from constant starts, ends, axes and steps -> True."""
    if node is None or node.op_type != "Slice" or node.input[0] != x or len(node.input) < 4:
        return False
    shape = g.nm.shape.get(x)
    consts = [g.nm.const.get(t) for t in node.input[1:]]
    if not shape or shape[-1] % 2 or any(c is None or c.size != 1 for c in consts):
        return False
    d, h = shape[-1], shape[-1] // 2
    start, end, axis = (int(c.reshape(-1)[0]) for c in consts[:3])
    step = int(consts[3].reshape(-1)[0]) if len(consts) > 3 else 1
    if axis % len(shape) != len(shape) - 1 or step != 1:
        return False
    return (start, min(end, d)) == ((0, h) if first else (h, d))


def match_rope(g, neg):
    """Hugging Face's apply_rotary_pos_emb on one tensor: x cos +
    rotate_half(x) sin, rotate_half(x) = Concat(-x[..., D/2:], x[..., :D/2])
    on the last axis -> rope(x, cos, sin). Anchored at the Neg; cos and sin
    are whatever the export multiplies by (folded tables, or a gather of
    position ids)."""
    hi = g.producer(neg.input[0], "Slice")
    cat = g.only_use(neg.output[0])
    if hi is None or cat is None or cat.op_type != "Concat" or list(cat.input[:1]) != [neg.output[0]]:
        return None
    x, lo = hi.input[0], g.producer(cat.input[-1])
    if len(cat.input) != 2 or not _half_slice(g, hi, x, False) or not _half_slice(g, lo, x, True):
        return None
    axis = g.attr(cat, "axis")
    if axis is None or axis % len(g.nm.shape[x]) != len(g.nm.shape[x]) - 1:
        return None
    m_sin = g.only_use(cat.output[0])
    if m_sin is None or m_sin.op_type != "Mul":
        return None
    sin = g.other(m_sin, cat.output[0])
    add = g.only_use(m_sin.output[0])
    if add is None or add.op_type != "Add":
        return None
    m_cos = g.producer(g.other(add, m_sin.output[0]), "Mul")
    cos = g.other(m_cos, x) if m_cos is not None else None
    if cos is None or g.nm.shape.get(add.output[0]) != g.nm.shape[x] or g.nm.dtype.get(cos) != g.nm.dtype[x] or \
            g.nm.dtype.get(sin) != g.nm.dtype[x]:
        return None
    return _accept(g, Match("rope", [x, cos, sin], {}, [hi, lo, neg, cat, m_sin, m_cos, add], add))


# -- norms -----------------------------------------------------------------

def _last_axis_mean(g, node):
    """ReduceMean over the last axis with keepdims -> its input, else None."""
    if node is None or node.op_type != "ReduceMean" or g.attr(node, "keepdims", 1) != 1:
        return None
    axes = g.attr(node, "axes")
    if axes is None and len(node.input) > 1:
        c = g.nm.const.get(node.input[1])
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    rank = len(g.nm.shape[node.input[0]])
    if axes is None or len(axes) != 1 or axes[0] % rank != rank - 1:
        return None
    return node.input[0]


def _squared(g, t):
    """t = Pow(x, 2) or Mul(x, x) -> x."""
    n = g.producer(t, ("Pow", "Mul"))
    if n is None:
        return None
    if n.op_type == "Pow":
        return n.input[0] if g.scalar(n.input[1]) == 2.0 else None
    return n.input[0] if n.input[0] == n.input[1] else None


def _inv_std(g, var_t):
    """var_t = mean(sq) -> the nodes computing 1/sqrt(var + eps) used by a
    Mul, or sqrt(var + eps) used by a Div: (eps, nodes, tail tensor, kind)."""
    add = g.only_use(var_t)
    r = g.split_const(add, lambda c: 0 <= c < 1) if add is not None and add.op_type == "Add" else None
    if r is None:
        return None
    sq = g.only_use(add.output[0])
    if sq is None or sq.op_type != "Sqrt":
        return None
    nxt = g.only_use(sq.output[0])
    if nxt is not None and (nxt.op_type == "Reciprocal" or (
            nxt.op_type == "Div" and nxt.input[1] == sq.output[0] and g.scalar(nxt.input[0]) == 1.0)):
        return r[1], [add, sq, nxt], nxt.output[0], "mul"
    return r[1], [add, sq], sq.output[0], "div"


def _scale_weight(g, t, last_dim):
    """Optional Mul(t, w) with w a constant vector of the last dim ->
    (weight name or None, final node or None)."""
    m = g.only_use(t)
    if m is None or m.op_type != "Mul":
        return None, None
    w = g.other(m, t)
    c = g.nm.const.get(w)
    if c is None or c.shape != (last_dim,):
        return None, None
    return w, m


def match_rms_norm(g, mean):
    sq_src = _last_axis_mean(g, mean)
    x = _squared(g, sq_src) if sq_src else None
    if x is None:
        return None
    sq_node = g.producer(sq_src)
    inv = _inv_std(g, mean.output[0])
    if inv is None:
        return None
    eps, nodes, tail, kind = inv
    norm = g.only_use(tail)
    if norm is None or norm.op_type != ("Mul" if kind == "mul" else "Div"):
        return None
    if (kind == "mul" and g.other(norm, tail) != x) or (kind == "div" and list(norm.input) != [x, tail]):
        return None
    dim = g.nm.shape[x][-1]
    w, wm = _scale_weight(g, norm.output[0], dim)
    used = [sq_node, mean] + nodes + [norm] + ([wm] if wm else [])
    inputs = [x, w] if w else [x, ("ones", dim, g.nm.dtype[x])]
    return _narrow_norm(g, Match("rms_norm", inputs, {"eps": eps}, used, wm or norm), x, dim)


def match_layer_norm_decomposed(g, mean):
    """(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * w + b."""
    x = _last_axis_mean(g, mean)
    if x is None:
        return None
    sub = g.only_use(mean.output[0])
    if sub is None or sub.op_type != "Sub" or list(sub.input) != [x, mean.output[0]]:
        return None
    d = sub.output[0]
    users = g.uses.get(d, [])
    sq = [u for u in users if u.op_type in ("Pow", "Mul") and _squared(g, u.output[0]) == d]
    if len(sq) != 1 or len(users) != 2:
        return None
    var = g.only_use(sq[0].output[0])
    if _last_axis_mean(g, var) is None:
        return None
    inv = _inv_std(g, var.output[0])
    if inv is None:
        return None
    eps, nodes, tail, kind = inv
    norm = [u for u in users if u is not sq[0]][0]
    if norm.op_type != ("Mul" if kind == "mul" else "Div") or g.other(norm, d) != tail:
        return None
    dim = g.nm.shape[x][-1]
    w, wm = _scale_weight(g, norm.output[0], dim)
    last, b = wm or norm, None
    add = g.only_use(last.output[0])
    if add is not None and add.op_type == "Add":
        bc = g.nm.const.get(g.other(add, last.output[0]))
        if bc is not None and bc.shape == (dim,):
            b, last = g.other(add, last.output[0]), add
    dt = g.nm.dtype[x]
    inputs = [x, w or ("ones", dim, dt), b or ("zeros", dim, dt)]
    used = [mean, sub, sq[0], var] + nodes + [norm] + ([wm] if wm else []) + ([last] if b else [])
    return _narrow_norm(g, Match("layer_norm", inputs, {"eps": eps}, used, last), x, dim)


# -- attention ---------------------------------------------------------------

def _scaled(g, t):
    """t = Mul(y, c) / Div(y, c) with scalar c -> (y, factor, node); else (t, 1, None)."""
    n = g.producer(t, ("Mul", "Div"))
    if n is not None:
        r = g.split_const(n)
        if r is not None and (n.op_type == "Mul" or n.input[1] in g.nm.const):
            return r[0], (r[1] if n.op_type == "Mul" else 1.0 / r[1]), n
    return t, 1.0, None


def masked_below(dtype):
    """The additive-mask values of a dtype that count as -inf: <= -1e9, whose
    exp() after the max is subtracted is exactly 0 in FP32 and FP64; in FP16,
    whose lowest finite value is -65504, that value (HF's
    torch.finfo(float16).min mask): score + mask rounds to it or to -inf in
    FP16, and exp(-65504 - max) is 0 in FP16 and FP32 (our kernels compute
    softmax in FP32) for any row with one unmasked score above -65000."""
    if np.dtype(dtype) == np.float16:
        return float(np.finfo(np.float16).min)
    return -1e9


def mask_kind(mask, s, t):
    """A constant additive mask broadcast to [..., s, t] -> "none" (zeros),
    "causal", or None (anything else). Values <= masked_below(its dtype)
    count as -inf."""
    low = masked_below(np.asarray(mask).dtype)
    m = np.asarray(mask, dtype=np.float64)
    if m.ndim < 2:
        m = m.reshape((1,) * (2 - m.ndim) + m.shape)
    lead = m.reshape(-1, *m.shape[-2:])
    if not all(np.array_equal(lead[0], x) for x in lead[1:]):
        return None
    m2 = np.broadcast_to(lead[0], (s, t))
    if not np.any(m2):
        return "none"
    if s != t:
        return None
    upper = np.triu(np.ones((s, t), bool), 1)
    if np.all(m2[~upper] == 0) and np.all(m2[upper] <= low):
        return "causal"
    return None


# -- key-padding mask ----------------------------------------------------------
#
# HF exports build the additive mask of every attention layer from the
# attention_mask input [B, T] (1 = token, 0 = padding): BERT's legacy path
# as (1 - mask) * finfo.min through Unsqueeze/Cast/Sub/Mul, the SDPA path as
# Where(bool mask [& causal], 0, -inf) with the bool mask gathered by index
# tensors. Rather than one matcher per exporter, the subgraph from the input
# to the added tensor is evaluated (onnx's reference evaluator, as
# normalize.py folds) on probe masks and accepted when it is exactly the
# attention op's key-padding rule (tp_attn_mask.h), with or without causal:
# 0 where a key is attended, masked_below its dtype where not. Queries
# that see no key are not compared: the op gives them zeros (as the SDPA
# export's IsNaN guard does), the legacy mask a uniform average.

class KeyPadding:
    """`input`: the graph input holding the mask; `causal`; `nodes`: the
    value-dependent nodes computing the added tensor (shared by the layers)."""

    def __init__(self, inp, causal, nodes):
        self.input, self.causal, self.nodes = inp, causal, nodes


def _cone(g, t):
    """The nodes computing t from graph inputs and constants, topologically
    ordered (folded ones too), the constants they read, and the graph inputs
    t depends on by value (not only through Shape/Size). Raises KeyError for
    a tensor nothing produces."""
    nm, inputs = g.nm, {name for name, _, _ in g.nm.inputs}
    order, consts, done = [], set(), set()
    stack = [(t, False)]
    while stack:
        x, expanded = stack.pop()
        if x in nm.const:
            consts.add(x)
            continue
        if x in inputs:
            continue
        n = nm.producer[x]
        if key(n) in done:
            continue
        if expanded:
            done.add(key(n))
            order.append(n)
            continue
        stack.append((x, True))
        stack.extend((i, False) for i in n.input if i)
    value_inputs, stack, seen = set(), [t], set()
    while stack:
        x = stack.pop()
        if x in seen or x in nm.const:
            continue
        seen.add(x)
        if x in inputs:
            value_inputs.add(x)
        elif nm.producer[x].op_type not in ("Shape", "Size"):
            stack.extend(i for i in nm.producer[x].input if i)
    return order, consts, value_inputs


def _probe_masks(b, t):
    """Masks [b, t] the added tensor is checked on: no padding, trailing
    padding of a different length per row, and scattered zeros."""
    full = np.ones((b, t), np.int64)
    trailing = np.ones((b, t), np.int64)
    for r in range(b):
        trailing[r, max(1, t - r * max(1, t // b)):] = 0
    scattered = (np.random.default_rng(0).random((b, t)) < 0.6).astype(np.int64)
    scattered[:, 0] = 1
    return [full, trailing, scattered, 1 - scattered]


def _keeps(mask, s, t, causal):
    """[b, s, t]: whether query i of row b attends key j (tp_attn_mask.h)."""
    i = np.arange(s)[:, None]
    j = np.arange(t)[None, :]
    ok = (j <= i + (t - s)) if causal else np.ones((s, t), bool)
    return (mask[:, None, :] != 0) & ok[None]


def key_padding(g, t, s, tk):
    """The added tensor t of an attention's scores [B, H, s, tk] -> KeyPadding
    when it is a key-padding mask of one INT32/INT64 graph input [B, tk]
    (with or without causal), else None."""
    if (t, s, tk) not in g.key_padding:
        g.key_padding[(t, s, tk)] = _key_padding(g, t, s, tk)
    return g.key_padding[(t, s, tk)]


def _key_padding(g, t, s, tk):
    nm = g.nm
    try:
        nodes, consts, value_inputs = _cone(g, t)
    except KeyError:
        return None
    if len(value_inputs) != 1:
        return None
    inp = next(iter(value_inputs))
    ishape = nm.shape[inp]
    if nm.dtype[inp] not in (np.dtype(np.int32), np.dtype(np.int64)) or len(ishape) != 2 or ishape[1] != tk \
            or nm.bdim.get(inp) != 0:
        return None
    b = ishape[0]
    reached = {i for n in nodes for i in n.input} | {t}
    feeds_in = [name for name, _, _ in nm.inputs if name in reached]
    graph = onnx.helper.make_graph(
        nodes, "key_padding",
        [onnx.helper.make_tensor_value_info(x, onnx.helper.np_dtype_to_tensor_dtype(nm.dtype[x]), nm.shape[x])
         for x in feeds_in],
        [onnx.helper.make_tensor_value_info(t, onnx.helper.np_dtype_to_tensor_dtype(nm.dtype[t]), nm.shape[t])],
        # a constant collapsed along the batch (normalize.py) is repeated back
        [numpy_helper.from_array(np.ascontiguousarray(np.broadcast_to(nm.const[c], nm.shape[c])), c)
         for c in sorted(consts)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", nm.opset)])
    fits = {False: True, True: True}
    try:
        ev = ReferenceEvaluator(model)
        for m in _probe_masks(b, tk):
            feeds = {x: (m.astype(nm.dtype[x]) if x == inp else np.zeros(nm.shape[x], nm.dtype[x])) for x in feeds_in}
            raw = np.asarray(ev.run(None, feeds)[0])
            low, add = masked_below(raw.dtype), raw.astype(np.float64)
            if add.ndim > 4:
                return None
            add = add.reshape((1,) * (4 - add.ndim) + add.shape)
            add = np.broadcast_to(add, (b, add.shape[1], s, tk))
            for causal in (False, True):
                keep = _keeps(m, s, tk, causal)[:, None]
                seen = keep.any(axis=-1, keepdims=True)  # queries with no key are not compared
                fits[causal] &= bool(np.all(np.where(keep, add == 0, True)) and
                                     np.all(np.where(~keep & seen, add <= low, True)))
    except Exception:  # a subgraph the evaluator cannot run is not a mask we know
        return None
    if not (fits[False] or fits[True]):
        return None
    dep = {key(n) for n in nm.nodes}
    return KeyPadding(inp, not fits[False], [n for n in nodes if key(n) in dep])


def _not_nan_guard(g, p):
    """Where(IsNaN(p), 0, p) after the softmax -> (its nodes, output)."""
    users = g.uses.get(p, [])
    isnan = [u for u in users if u.op_type == "IsNaN"]
    where = [u for u in users if u.op_type == "Where"]
    if len(isnan) != 1 or len(where) != 1 or len(users) != 2:
        return [], p
    w = where[0]
    if w.input[0] != isnan[0].output[0] or w.input[2] != p or g.scalar(w.input[1]) != 0.0:
        return [], p
    return [isnan[0], w], w.output[0]


def match_attention(g, sm):
    if g.attr(sm, "axis", -1) not in (-1, 3) or len(g.nm.shape[sm.input[0]]) != 4:
        return None
    scores, mask, padding, nodes = sm.input[0], None, None, [sm]
    scores = _uncast(g, scores, nodes)
    add = g.producer(scores, "Add")
    if add is not None:
        cands = [i for i in add.input if i in g.nm.const]
        if len(cands) == 1:
            mask = cands[0]
        else:
            # the other operand of the scores' MatMul (through a scaling)
            mm_side = [i for i in add.input if g.producer(_scaled(g, i)[0], "MatMul") is not None]
            if len(mm_side) != 1:
                return None
            mask = g.other(add, mm_side[0])
            s4 = g.nm.shape[scores]
            padding = key_padding(g, mask, s4[2], s4[3])
            if padding is None:
                return None
        scores = g.other(add, mask)
        nodes.append(add)
    scores, post, post_node = _scaled(g, _uncast(g, scores, nodes))
    nodes += [post_node] if post_node else []
    mm = g.producer(scores, "MatMul")
    if mm is None:
        return None
    q, s1, n1 = _scaled(g, mm.input[0])
    kt, s2, n2 = _scaled(g, mm.input[1])
    nodes += [mm] + [n for n in (n1, n2) if n]
    sq, skt = g.nm.shape[q], g.nm.shape[kt]
    if len(sq) != 4 or len(skt) != 4 or sq[-1] != skt[-2]:
        return None
    s, t = sq[2], skt[3]
    if padding is not None:
        kind = "causal" if padding.causal else "none"
    else:
        kind = "none" if mask is None else mask_kind(g.nm.const[mask], s, t)
    if kind is None:
        return None
    guard, p = _softmax_tail(g, sm.output[0])
    nodes += guard
    pv = g.only_use(p)
    if pv is None or pv.op_type != "MatMul" or pv.input[0] != p:
        return None
    v = pv.input[1]
    if g.nm.shape[v] != (sq[0], sq[1], t, sq[3]) or skt[:2] != sq[:2]:
        return None
    if len({g.nm.dtype[x] for x in (q, kt, v, pv.output[0])}) != 1:
        return None
    nodes.append(pv)
    attrs = {"causal": kind == "causal"}
    scale = np.float32(s1 * s2 * post)
    if scale != np.float32(1.0 / math.sqrt(sq[3])):
        attrs["scale"] = float(scale)
    inputs = [q, ("kT", kt), v] + ([padding.input] if padding else [])
    m = _accept(g, Match("attention", inputs, attrs, nodes, pv))
    if m is not None and padding is not None:
        m.shared = padding.nodes
    return m


# anchor op type -> matchers tried in order
MATCHERS = {
    "Erf": [match_gelu_erf],
    "Tanh": [match_gelu_tanh],
    "Sigmoid": [match_silu],
    "Neg": [match_rope],
    "ReduceMean": [match_rms_norm, match_layer_norm_decomposed],
    "Softmax": [match_attention, match_softmax_cast],
    "LayerNormalization": [match_layer_norm_cast],
    "Cast": [match_cast_roundtrip],
}


def find_matches(g):
    """-> {name of the last node of a match: Match}, consumed node names."""
    by_last, consumed = {}, set()
    for n in g.nm.nodes:
        if key(n) in consumed:
            continue
        for f in MATCHERS.get(n.op_type, []):
            m = f(g, n)
            if m is not None and not any(key(x) in consumed for x in m.nodes):
                by_last[key(m.last)] = m
                consumed.update(key(x) for x in m.nodes)
                break
    consumed |= _unused_shared(g, by_last.values(), consumed)
    return by_last, consumed


def _unused_shared(g, matches, consumed):
    """The matches' shared nodes whose outputs only consumed or other such
    nodes read (repeated until none is added: users come later in order)."""
    shared = {key(n): n for m in matches for n in m.shared}
    drop = set()
    changed = True
    while changed:
        changed = False
        for k, n in shared.items():
            if k in drop or any(o in g.outputs for o in n.output):
                continue
            users = [u for o in n.output for u in g.uses.get(o, [])]
            if all(key(u) in consumed or key(u) in drop for u in users):
                drop.add(k)
                changed = True
    return drop
