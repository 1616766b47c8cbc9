"""ONNX nodes (after folding and pattern matching) -> tpgraph ops on global
tensors (ir.Program). Every node without a mapping is an error naming it."""
import math

import ml_dtypes
import numpy as np

from . import patterns
from .errors import ImportFailure
from .ir import Node, Program, Value

# onnx (>= 1.17) gives BFLOAT16 tensors as ml_dtypes.bfloat16 arrays, in
# initializers and in its reference evaluator alike; params keep that dtype
# (write.py stores them as BF16 bits), never widened.
NP_TO_TP = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16", np.dtype(ml_dtypes.bfloat16): "BF16",
            np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64"}


def _tp_dtype(dt, what):
    if dt not in NP_TO_TP:
        raise ImportFailure("%s: element type %s has no tpgraph datatype" % (what, dt))
    return NP_TO_TP[dt]


def _exact_reciprocal(c):
    """1/c when it is exact in binary floating point (c a power of two)."""
    m, _ = math.frexp(c)
    return 1.0 / c if c != 0 and abs(m) == 0.5 else None


class Lowering:
    def __init__(self, nm):
        self.nm, self.g = nm, patterns.Graph(nm)
        self.prog = Program()
        self.alias = {}  # ONNX tensor -> IR value name

    # -- values ---------------------------------------------------------------

    def value(self, t, node):
        """The IR value for ONNX tensor t (a param when it is a constant)."""
        if t in self.alias:
            return self.alias[t]
        if t in self.nm.const:
            return self.param(t)
        if t in self.nm.batch_const:
            raise ImportFailure("ONNX node '%s' (%s): input '%s' is a constant that varies with the batch size: no mapping"
                                % (node.name, node.op_type, t))
        raise ImportFailure("ONNX node '%s' (%s): input '%s' is not available" % (node.name, node.op_type, t))

    def param(self, t, array=None):
        if t not in self.prog.params:
            a = self.nm.const[t] if array is None else array
            if a.ndim == 0:
                a = a.reshape(1)
            self.prog.add_param(t, np.ascontiguousarray(a), _tp_dtype(a.dtype, "constant '%s'" % t))
        return t

    def weight(self, t):
        """A matmul right operand -> (param, transpose_b): a constant that is
        the Transpose of a 2-D initializer stays the initializer, so tied
        weights (embedding + LM head) are stored once."""
        p = self.nm.producer.get(t)
        if (p is not None and p.op_type == "Transpose" and p.input[0] in self.nm.initializers
                and len(self.nm.shape[p.input[0]]) == 2):
            return self.param(p.input[0]), True
        return self.param(t), False

    def emit(self, out, op, inputs, attrs, node, shape=None, bdim="same", dtype=None):
        """Adds node `out` (an ONNX tensor name unless it is a helper)."""
        shape = self.nm.shape[out] if shape is None else shape
        bdim = self.nm.bdim.get(out) if bdim == "same" else bdim
        dtype = dtype or _tp_dtype(self.nm.dtype[out], "tensor '%s'" % out)
        name = self.prog.add_node(Node(out, op, inputs, attrs, shape, bdim, dtype, node))
        self.alias[out] = name
        return name

    def helper(self, base, suffix, op, inputs, attrs, node, shape, bdim, dtype):
        name = base + "." + suffix
        while name in self.prog.values:
            name += "_"
        self.prog.add_node(Node(name, op, inputs, attrs, shape, bdim, dtype, node))
        return name

    def fail(self, node, why):
        raise ImportFailure("ONNX node '%s' (op %s): no tpgraph mapping: %s" % (node.name, node.op_type, why))

    # -- the walk -------------------------------------------------------------

    def run(self):
        for name, dt, shape in self.nm.inputs:
            bdim = 0 if shape and shape[0] == "B" else None
            self.prog.add_input(Value(name, self.nm.shape[name], bdim, dt))
            self.alias[name] = name
        matches, consumed = patterns.find_matches(self.g)
        for n in self.nm.nodes:
            k = patterns.key(n)
            if k in matches:
                self.lower_match(matches[k])
            elif k not in consumed:
                handler = getattr(self, "op_" + n.op_type, None)
                if handler is None:
                    self.fail(n, "op type %s is not supported" % n.op_type)
                handler(n)
        self.prog.outputs = [self.alias[o] for o in self.nm.outputs]
        self.prog.output_names = list(self.nm.outputs)
        self.prog.prune()
        return self.prog

    def lower_match(self, m):
        node, out = m.last, m.last.output[0]
        if m.op == "alias":
            self.alias[out] = self.value(m.inputs[0], node)
            return
        ins = []
        for t in m.inputs:
            if isinstance(t, tuple) and t[0] in ("ones", "zeros"):
                arr = (np.ones if t[0] == "ones" else np.zeros)(t[1], dtype=t[2])
                ins.append(self._const_param(out + "." + t[0], arr))
            elif isinstance(t, tuple) and t[0] == "cast":  # a constant exact in t[2] (patterns._as_dtype)
                dt = np.dtype(t[2])
                ins.append(self._const_param(t[1] + "." + NP_TO_TP[dt].lower(), self.nm.const[t[1]].astype(dt)))
            elif isinstance(t, tuple) and t[0] == "kT":
                ins.append(self.key_from_transposed(t[1], node))
            else:
                ins.append(self.value(t, node))
        self.emit(out, m.op, ins, m.attrs, node)

    def _const_param(self, name, arr):
        self.nm.const[name] = arr
        return self.param(name)

    def key_from_transposed(self, kt, node):
        """attention wants k [B,H,T,D]; the export gives kᵀ. Look for a
        tensor k upstream with chain(k) == kᵀ exactly (an index-tensor replay
        of the Reshape/Transpose chain), else one permute/transpose view."""
        chain, t = [], kt
        while True:
            p = self.g.producer(t, ("Reshape", "Transpose"))
            if p is None:
                break
            chain.append(p)
            t = p.input[0]
            s = self.nm.shape[t]
            if len(s) == 4 and s == tuple(self.nm.shape[kt][i] for i in (0, 1, 3, 2)) and self._replays_transpose(t, chain, kt):
                return self.value(t, node)
        sk = tuple(self.nm.shape[kt][i] for i in (0, 1, 3, 2))
        bd = self.nm.bdim.get(kt)
        return self.helper(kt, "k", "transpose", [self.value(kt, node)], {"dim0": -2, "dim1": -1}, node, sk,
                           {2: 3, 3: 2}.get(bd, bd), _tp_dtype(self.nm.dtype[kt], kt))

    def _replays_transpose(self, k, chain, kt):
        idx = np.arange(int(np.prod(self.nm.shape[k]))).reshape(self.nm.shape[k])
        x = idx
        for p in reversed(chain):
            if p.op_type == "Reshape":
                x = x.reshape(self.nm.shape[p.output[0]])
            else:
                x = x.transpose(self.g.attr(p, "perm"))
        return x.shape == self.nm.shape[kt] and np.array_equal(x, np.swapaxes(idx, -1, -2))

    # -- one handler per ONNX op ------------------------------------------------

    def _binary(self, n, op):
        a, b = (self.value(t, n) for t in n.input)
        self.emit(n.output[0], op, [a, b], {}, n)

    def op_Add(self, n):
        self._binary(n, "add")

    def op_Sub(self, n):
        self._binary(n, "sub")

    def op_Mul(self, n):
        self._binary(n, "mul")

    def op_Div(self, n):
        """A constant power-of-two divisor is an exact mul (which the
        patterns and plan see through); 1 / x is a reciprocal; else div."""
        c = self.g.scalar(n.input[1])
        r = None if c is None else _exact_reciprocal(c)
        if r is not None:
            arr = np.array([r], dtype=self.nm.dtype[n.input[0]])
            self.emit(n.output[0], "mul", [self.value(n.input[0], n), self._const_param(n.output[0] + ".recip", arr)], {}, n)
        elif self.g.scalar(n.input[0]) == 1.0 and n.input[1] not in self.nm.const:
            self._reciprocal(n, n.input[1])
        else:
            self._binary(n, "div")

    def _unary(self, n, op, attrs=None):
        self.emit(n.output[0], op, [self.value(n.input[0], n)], attrs or {}, n)

    def op_Sqrt(self, n):
        self._unary(n, "sqrt")

    def op_Exp(self, n):
        self._unary(n, "exp")

    def op_Neg(self, n):
        self._unary(n, "neg")

    def op_Tanh(self, n):
        self._unary(n, "tanh")

    def op_Erf(self, n):
        self._unary(n, "erf")

    def op_Sigmoid(self, n):
        self._unary(n, "sigmoid")

    def op_Pow(self, n):
        e = self.g.scalar(n.input[1])
        if e is None:
            self.fail(n, "an exponent that is not one constant (tpgraph's pow takes a constant exponent)")
        self._unary(n, "pow", {"exponent": e})

    def _reciprocal(self, n, x):
        """1/x; 1/sqrt(y) (the Sqrt used only here) is rsqrt(y)."""
        sq = self.g.producer(x, "Sqrt")
        if sq is not None and self.g.only_use(x) is n:
            self.emit(n.output[0], "rsqrt", [self.value(sq.input[0], n)], {}, n)
        else:
            self.emit(n.output[0], "pow", [self.value(x, n)], {"exponent": -1.0}, n)

    def op_Reciprocal(self, n):
        self._reciprocal(n, n.input[0])

    def op_Gelu(self, n):
        approx = self.g.attr(n, "approximate", b"none")
        approx = approx.decode() if isinstance(approx, bytes) else approx
        self.emit(n.output[0], "gelu", [self.value(n.input[0], n)], {"approximate": approx} if approx != "none" else {}, n)

    def op_Relu(self, n):
        self.emit(n.output[0], "relu", [self.value(n.input[0], n)], {}, n)

    def op_Softmax(self, n):
        axis = self.g.attr(n, "axis", -1 if self.nm.opset >= 13 else 1)
        rank = len(self.nm.shape[n.input[0]])
        if self.nm.opset < 13 and axis % rank != rank - 1:
            self.fail(n, "opset < 13 Softmax flattens from axis %d" % axis)
        self.emit(n.output[0], "softmax", [self.value(n.input[0], n)], {"dim": axis}, n)

    def op_LayerNormalization(self, n):
        x = n.input[0]
        rank = len(self.nm.shape[x])
        if self.g.attr(n, "axis", -1) % rank != rank - 1:
            self.fail(n, "normalizes from axis %d, tpgraph's layer_norm only over the last dim" % self.g.attr(n, "axis"))
        dim = self.nm.shape[x][-1]
        w = self.value(n.input[1], n)
        b = (self.value(n.input[2], n) if len(n.input) > 2 and n.input[2]
             else self._const_param(n.output[0] + ".zeros", np.zeros(dim, self.nm.dtype[x])))
        if self.prog.values[w].shape != (dim,):
            self.fail(n, "scale of shape %s, not [%d]" % (list(self.prog.values[w].shape), dim))
        self.emit(n.output[0], "layer_norm", [self.value(x, n), w, b], {"eps": float(self.g.attr(n, "epsilon", 1e-5))}, n)

    def _matmul(self, n, a, b_tensor, trans_b_attr, bias):
        out = n.output[0]
        if b_tensor in self.nm.const:
            b, tb = self.weight(b_tensor)
            tb = tb != bool(trans_b_attr)
        else:
            if trans_b_attr:
                self.fail(n, "transB on an activation")
            b, tb = self.value(b_tensor, n), False
        attrs = {"transpose_b": True} if tb else {}
        if bias is None:
            self.emit(out, "matmul", [a, b], attrs, n)
            return
        mm = self.helper(out, "mm", "matmul", [a, b], attrs, n, self.nm.shape[out], self.nm.bdim.get(out),
                         _tp_dtype(self.nm.dtype[out], out))
        self.emit(out, "add", [mm, bias], {}, n)

    def op_MatMul(self, n):
        self._matmul(n, self.value(n.input[0], n), n.input[1], False, None)

    def op_Gemm(self, n):
        if self.g.attr(n, "transA", 0):
            self.fail(n, "transA=1")
        if self.g.attr(n, "alpha", 1.0) != 1.0 or (len(n.input) > 2 and self.g.attr(n, "beta", 1.0) != 1.0):
            self.fail(n, "alpha/beta other than 1")
        bias = self.value(n.input[2], n) if len(n.input) > 2 and n.input[2] else None
        self._matmul(n, self.value(n.input[0], n), n.input[1], self.g.attr(n, "transB", 0), bias)

    def _alias(self, n):
        self.alias[n.output[0]] = self.value(n.input[0], n)

    op_Identity = _alias
    op_Dropout = _alias

    def op_Cast(self, n):
        src, dst = self.nm.dtype[n.input[0]], self.nm.dtype[n.output[0]]
        if src == dst:
            return self._alias(n)
        _tp_dtype(src, "ONNX node '%s' (Cast) source" % n.name)
        self._unary(n, "cast", {"to": _tp_dtype(dst, "ONNX node '%s' (Cast) target" % n.name)})

    def _reduce_axes(self, n):
        """The axes of a ReduceMean/ReduceSum, from its input (opset 18;
        ReduceSum since 13) or its attribute; empty: all (or none)."""
        rank = len(self.nm.shape[n.input[0]])
        if len(n.input) > 1 and n.input[1]:
            if n.input[1] not in self.nm.const:
                self.fail(n, "axes that are not constant")
            axes = [int(a) for a in self.nm.const[n.input[1]].reshape(-1)]
        else:
            axes = list(self.g.attr(n, "axes", []))
        if not axes:
            return [] if self.g.attr(n, "noop_with_empty_axes", 0) else list(range(rank))
        return sorted({a % rank for a in axes})

    def _reduce(self, n, op):
        """One reduce per axis, the highest first (so the others keep their
        index); a mean of means over equal counts is the mean."""
        axes, keep = self._reduce_axes(n), bool(self.g.attr(n, "keepdims", 1))
        if not axes:
            return self._alias(n)
        cur, shape = self.value(n.input[0], n), list(self.nm.shape[n.input[0]])
        bd = self.nm.bdim.get(n.input[0])
        for j, d in enumerate(reversed(axes)):
            attrs = {"dim": d, "keepdim": keep}
            if j == len(axes) - 1:
                return self.emit(n.output[0], op, [cur], attrs, n)
            shape = shape[:d] + ([1] if keep else []) + shape[d + 1:]
            bd = None if bd == d else (bd - 1 if bd is not None and bd > d and not keep else bd)
            cur = self.helper(n.output[0], "%s%d" % (op, d), op, [cur], attrs, n, tuple(shape), bd,
                              _tp_dtype(self.nm.dtype[n.output[0]], n.output[0]))

    def op_ReduceMean(self, n):
        self._reduce(n, "reduce_mean")

    def op_ReduceSum(self, n):
        self._reduce(n, "reduce_sum")

    def op_Where(self, n):
        cond, x, y = n.input
        if cond not in self.nm.const:
            self.fail(n, "a condition that depends on the inputs (tpgraph's where takes a constant mask)")
        mask = self.param(cond + ".int32", self.nm.const[cond].astype(np.int32))
        self.emit(n.output[0], "where", [mask, self.value(x, n), self.value(y, n)], {}, n)

    def _reshape(self, n):
        x = self.value(n.input[0], n)
        if self.nm.shape[n.output[0]] == self.prog.values[x].shape:
            self.alias[n.output[0]] = x
            return
        self.emit(n.output[0], "reshape", [x], {}, n)

    op_Reshape = _reshape
    op_Unsqueeze = _reshape
    op_Squeeze = _reshape
    op_Flatten = _reshape

    def op_Transpose(self, n):
        rank = len(self.nm.shape[n.input[0]])
        perm = self.g.attr(n, "perm", list(range(rank))[::-1])
        self.emit(n.output[0], "permute", [self.value(n.input[0], n)], {"dims": list(perm)}, n)

    def _slices(self, n, x, src_shape, out, start_len):
        """One slice node per sliced dim; start_len: {dim: (start, length)}."""
        cur, shape = x, list(src_shape)
        dims = sorted(start_len)
        for j, d in enumerate(dims):
            if d == self.nm.bdim.get(n.input[0]):
                self.fail(n, "slices the batch dim")
            s, length = start_len[d]
            shape[d] = length
            attrs = {"dim": d, "start": s, "length": length}
            if j == len(dims) - 1:
                return self.emit(out, "slice", [cur], attrs, n)
            cur = self.helper(out, "slice%d" % d, "slice", [cur], attrs, n, tuple(shape), self.nm.bdim.get(out),
                              _tp_dtype(self.nm.dtype[out], out))
        self.alias[out] = cur
        return cur

    def op_Slice(self, n):
        consts = [self.nm.const.get(t) if t else None for t in n.input[1:]]
        if any(t and c is None for t, c in zip(n.input[1:], consts)):
            self.fail(n, "starts/ends/axes/steps that are not constant")
        src = self.nm.shape[n.input[0]]
        starts, ends = consts[0].reshape(-1), consts[1].reshape(-1)
        axes = consts[2].reshape(-1) if len(consts) > 2 and consts[2] is not None else np.arange(len(starts))
        steps = consts[3].reshape(-1) if len(consts) > 3 and consts[3] is not None else np.ones(len(starts), np.int64)
        if np.any(steps != 1):
            self.fail(n, "a step other than 1")
        sl = {}
        for s, e, a in zip(starts, ends, axes):
            a = int(a) % len(src)
            lo, _, _ = slice(int(s), int(e)).indices(src[a])
            length = self.nm.shape[n.output[0]][a]
            if length != src[a]:
                sl[a] = (lo, length)
        self._slices(n, self.value(n.input[0], n), src, n.output[0], sl)

    def op_Split(self, n):
        src = self.nm.shape[n.input[0]]
        axis = self.g.attr(n, "axis", 0) % len(src)
        x, start = self.value(n.input[0], n), 0
        for o in n.output:
            length = self.nm.shape[o][axis]
            self._slices(n, x, src, o, {axis: (start, length)})
            start += length

    def op_Concat(self, n):
        ins = [self.value(t, n) for t in n.input]
        self.emit(n.output[0], "cat", ins, {"dim": self.g.attr(n, "axis")}, n)

    def op_Expand(self, n):
        """ONNX's broadcast: the target keeps 1 wherever the input's size
        stays (the batch dim, a dim the plan splits)."""
        src, dst = self.nm.shape[n.input[0]], self.nm.shape[n.output[0]]
        src = (1,) * (len(dst) - len(src)) + tuple(src)
        grow = [d for d in range(len(dst)) if src[d] != dst[d]]
        if any(d == self.nm.bdim.get(n.output[0]) for d in grow):
            self.fail(n, "expands along the batch dim")
        x = self.value(n.input[0], n)
        if not grow and len(src) == len(self.prog.values[x].shape):
            self.alias[n.output[0]] = x
            return
        self.emit(n.output[0], "expand", [x], {"shape": [dst[d] if d in grow else 1 for d in range(len(dst))]}, n)

    def op_Gather(self, n):
        """A constant 2-D table on axis 0 is an embedding; anything else a
        gather (scalar ids drop the dim: a gather of one id, reshaped)."""
        table, ids = n.input
        axis = self.g.attr(n, "axis", 0) % len(self.nm.shape[table])
        if self.nm.dtype[ids] not in (np.dtype(np.int64), np.dtype(np.int32)):
            self.fail(n, "ids of type %s" % self.nm.dtype[ids])
        if table in self.nm.const and axis == 0 and self.nm.const[table].ndim == 2:
            self.emit(n.output[0], "embedding", [self.value(ids, n), self.param(table)], {}, n)
            return
        if axis == self.nm.bdim.get(table):
            self.fail(n, "gathers along the batch dim")
        x, out = self.value(table, n), n.output[0]
        if self.nm.shape[ids] != ():
            self.emit(out, "gather", [x, self.value(ids, n)], {"dim": axis}, n)
            return
        one = self.value(ids, n)  # a 0-d constant is stored as [1] (param)
        shape = self.nm.shape[table][:axis] + (1,) + self.nm.shape[table][axis + 1:]
        g = self.helper(out, "gather", "gather", [x, one], {"dim": axis}, n, shape, self.nm.bdim.get(table),
                        _tp_dtype(self.nm.dtype[out], out))
        self.emit(out, "reshape", [g], {}, n)


def lower(nm):
    return Lowering(nm).run()
