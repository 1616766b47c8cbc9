"""Load an ONNX model, fix its dims and fold everything that does not depend
on the batch input's values.

Folding runs onnx's reference evaluator's op implementations (a library, not
hand-written op semantics) node by node, at two batch sizes. A tensor that
depends only on initializers and on input *shapes* (Shape, Size) is a
constant; comparing the two runs tells which dims of every tensor scale with
the batch, and which constants merely repeat along the batch dim (those
collapse to size 1 and broadcast).

Memory: weights are never copied: they are arrays over memory maps of the
.onnx file (its initializers' raw_data, cut out before protobuf parses the
rest) and of its external data files; every intermediate is dropped after its last use, and only
the constants a value-dependent node reads keep their values (of every other
tensor only the shape and dtype are kept)."""
import mmap
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference
from onnx.external_data_helper import uses_external_data
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from .errors import ImportFailure
from .narrow_eval import fold_in_fp32

# The two batch sizes the model is evaluated at. B_REF's shapes are the ones
# the importer reasons with; B_ALT only tells which dims follow the batch.
B_REF, B_ALT = 3, 2
# Ops whose output depends on their input's shape, never its values.
SHAPE_ONLY_OPS = {"Shape", "Size"}
# Initializers up to this many bytes stay in the model given to shape
# inference (shape constants for its data propagation); larger ones are
# weights, declared there as typed inputs without their data.
SMALL_INIT_BYTES = 4096


ONNX_TO_TP = {
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.BFLOAT16: "BF16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
}


class Normalized:
    """The model after folding.

    nodes      value-dependent ONNX nodes, topological order
    const      foldable tensor name -> array (batch-independent or collapsed)
    batch_const  foldable tensors whose values really vary with the batch
    shape      every tensor -> concrete shape at B_REF
    bdim       every tensor -> index of its batch-scaled dim, or None
    dtype      every tensor -> numpy dtype
    inputs     [(name, tp datatype, shape with "B")]
    outputs    graph output names
    initializers  names of the model's initializers (before folding)
    producer   tensor -> node producing it (all nodes, folded ones too)
    """

    def __init__(self):
        self.nodes, self.const, self.batch_const = [], {}, set()
        self.shape, self.bdim, self.dtype = {}, {}, {}
        self.inputs, self.outputs = [], []
        self.initializers, self.producer = set(), {}
        self.opset = 0
        self.onnx_node_count = 0


def _first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _varint(buf, pos, end):
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("a varint runs past its message")
        byte = buf[pos]
        value, pos, shift = value | (byte & 0x7F) << shift, pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _varint_bytes(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _fields(buf, pos, end):
    """The protobuf fields of buf[pos:end]: (number, wire type, start,
    payload start, end)."""
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos, end)
        wire = key & 7
        if wire == 0:
            stop = _varint(buf, pos, end)[1]
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            stop = pos + n
        elif wire in (1, 5):
            stop = pos + (8 if wire == 1 else 4)
        else:
            raise ValueError("wire type %d at byte %d" % (wire, start))
        if stop > end:
            raise ValueError("a field at byte %d runs past its message" % start)
        yield key >> 3, wire, start, pos, stop
        pos = stop


def _message(number, payload):
    return _varint_bytes(number << 3 | 2) + _varint_bytes(len(payload)) + payload


# Field numbers: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9


def _strip_raw_data(buf):
    """The serialized model buf without its initializers' raw_data, and
    where each initializer's raw_data is in buf: [(offset, length) or None],
    in order. Parsing only the rest keeps the weights out of the protobuf."""
    out, raws = bytearray(), []
    for num, wire, start, pos, stop in _fields(buf, 0, len(buf)):
        if num != _GRAPH or wire != 2:
            out += buf[start:stop]
            continue
        graph = bytearray()
        for gnum, gwire, gstart, gpos, gstop in _fields(buf, pos, stop):
            if gnum != _INITIALIZER or gwire != 2:
                graph += buf[gstart:gstop]
                continue
            tensor, raw = bytearray(), None
            for tnum, twire, tstart, tpos, tstop in _fields(buf, gpos, gstop):
                if tnum == _RAW_DATA and twire == 2:
                    raw = (tpos, tstop - tpos)
                else:
                    tensor += buf[tstart:tstop]
            raws.append(raw)
            graph += _message(_INITIALIZER, bytes(tensor))
        out += _message(_GRAPH, bytes(graph))
    return bytes(out), raws


def _map(fname):
    with open(fname, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""


def _array(buf, offset, length, t):
    """Initializer t's raw bytes buf[offset:offset+length] as an array (no copy)."""
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    count = int(np.prod(t.dims, dtype=np.int64))
    if length != count * dtype.itemsize:
        raise ValueError("%d bytes are not the %d of %s %s" % (length, count * dtype.itemsize, dtype, list(t.dims)))
    if offset + length > len(buf):
        raise ValueError("bytes %d..%d of a file of %d bytes (truncated?)" % (offset, offset + length, len(buf)))
    return np.frombuffer(buf, dtype, count, offset).reshape(tuple(t.dims))


def load_model(path):
    """The model without its weights' data, and the weights: initializer
    name -> array over a memory map of the .onnx file or of its external
    data files (read on use, never copied)."""
    try:
        buf = _map(path)
    except OSError as e:
        raise ImportFailure("%s: cannot read: %s" % (path, e.strerror))
    try:
        stripped, raws = _strip_raw_data(buf)
        model = onnx.load_from_string(stripped)
    except Exception as e:  # ValueError from the walk; protobuf raises several unrelated types
        raise ImportFailure("%s: not a valid ONNX file (truncated or corrupt?): %s" % (path, _first_line(e)))
    weights = _weights(model, raws, buf, path)
    if not model.graph.output:
        raise ImportFailure("%s: the graph has no outputs (truncated?)" % path)
    return model, weights


def _weights(model, raws, buf, path):
    maps, out = {}, {}
    for t, raw in zip(model.graph.initializer, raws):
        if uses_external_data(t):
            try:
                out[t.name] = _external(t, os.path.dirname(os.path.abspath(path)), maps)
            except (OSError, ValueError) as e:
                raise ImportFailure("%s: cannot read its external tensor data: initializer '%s': %s"
                                    % (path, t.name, "%s: %s" % (e.filename, e.strerror) if isinstance(e, OSError) else e))
            continue
        try:
            out[t.name] = numpy_helper.to_array(t) if raw is None else _array(buf, raw[0], raw[1], t)
        except Exception as e:
            raise ImportFailure("%s: initializer '%s': cannot read its data: %s" % (path, t.name, _first_line(e)))
    return out


def _external(t, base, maps):
    """Initializer t's external data, over a memory map of its file (maps:
    file -> map, shared by the file's tensors)."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    fname = os.path.normpath(os.path.join(base, loc))
    if not loc or os.path.isabs(loc) or not fname.startswith(base + os.sep):
        raise ValueError("location '%s' is not a file beside the model" % loc)
    if fname not in maps:
        maps[fname] = _map(fname)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    length = int(info.get("length", int(np.prod(t.dims, dtype=np.int64)) * dtype.itemsize))
    try:
        return _array(maps[fname], int(info.get("offset", 0)), length, t)
    except ValueError as e:
        raise ValueError("'%s': %s" % (loc, e))


def _graph_inputs(model):
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def fix_dims(model, path, dim_values):
    """Pins --dim values in the inputs; returns the batch dim's name.
    The first dynamic dim of the first input is the batch; it must be dim 0."""
    batch_name, used = None, set()
    for inp in _graph_inputs(model):
        tt = inp.type.tensor_type
        if tt.elem_type not in ONNX_TO_TP:
            raise ImportFailure("%s: input '%s' has element type %s, which tpgraph has no datatype for"
                                % (path, inp.name, onnx.TensorProto.DataType.Name(tt.elem_type)))
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                continue
            name = d.dim_param or "?"
            if name in dim_values:
                d.dim_value = dim_values[name]
                used.add(name)
                continue
            if batch_name is None and k == 0:
                batch_name = name
            if name == batch_name and k == 0:
                d.dim_param = "B"
                continue
            raise ImportFailure("%s: input '%s' dim %d ('%s') is dynamic: fix it with --dim %s=VALUE"
                                % (path, inp.name, k, name, name))
    unused = set(dim_values) - used
    if unused:
        raise ImportFailure("%s: --dim %s: no input has a dynamic dim of that name" % (path, sorted(unused)[0]))
    if batch_name is None:
        raise ImportFailure("%s: no input has a dynamic dim 0 to serve as the batch dim B" % path)
    return batch_name


def _feeds(model, batch):
    feeds = {}
    rng = np.random.default_rng(0)
    for inp in _graph_inputs(model):
        tt = inp.type.tensor_type
        shape = [batch if d.dim_param == "B" else d.dim_value for d in tt.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        # Integer inputs are ids: zeros are valid indices for any table.
        feeds[inp.name] = (np.zeros(shape, dt) if np.issubdtype(dt, np.integer)
                           else rng.standard_normal(shape).astype(dt))
    return feeds


class GatherElements(OpRun):
    """onnx's reference GatherElements (np.choose) takes at most 64 entries
    along the axis (BERT's token_type buffer has 512) and wraps indices that
    are out of range; np.take_along_axis takes any size and refuses those."""
    op_domain = ""

    def _run(self, data, indices, axis=0):
        return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)


def _reads(node):
    """The tensors a node reads: its inputs and, for If/Loop/Scan, the names
    its subgraphs use (an over-approximation: their own tensors too)."""
    names = [i for i in node.input if i]
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs):
            for n in g.node:
                names += _reads(n)
    return names


def _node(n):
    return "ONNX node '%s' (op %s)" % (n.name or n.output[0], n.op_type)


def _skeleton(model, weights, path):
    """The model for the checker, shape inference and the evaluator: small
    initializers kept, weights declared as typed inputs (their data is never
    copied); shape-inferred, so the evaluator can load type-dependent ops."""
    g = model.graph
    small = [numpy_helper.from_array(weights[t.name], t.name) for t in g.initializer
             if weights[t.name].nbytes <= SMALL_INIT_BYTES]
    names = {t.name for t in small}
    big = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer if t.name not in names]
    graph = helper.make_graph(g.node, g.name, _graph_inputs(model) + big, g.output, small, value_info=g.value_info)
    skel = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version,
                             functions=model.functions)
    try:
        onnx.checker.check_model(skel)
    except Exception as e:
        raise ImportFailure("%s: not a valid ONNX model (truncated or corrupt?): %s" % (path, _first_line(e)))
    try:
        return shape_inference.infer_shapes(skel, data_prop=True)
    except Exception as e:
        raise ImportFailure("%s: shape inference failed: %s" % (path, _first_line(e)))


def _evaluate(ev, path, batch, weights, feeds, visit):
    """Runs the model node by node, calling visit(name, value) for every
    tensor; a tensor is dropped after its last use (visit keeps what it needs)."""
    nodes = ev.proto_.graph.node
    last = {}
    for k, n in enumerate(nodes):
        for t in _reads(n):
            last[t] = k
    results = dict(weights)
    results.update(feeds)
    for name, v in results.items():
        visit(name, v)
    for k, (n, rt) in enumerate(zip(nodes, ev.rt_nodes_)):
        try:
            # random inputs may overflow, e.g. an FP16 mask add: not an error
            with np.errstate(all="ignore"):
                ins = [results[i] if i else None for i in n.input]
                outs = rt.run(*ins, context=results) if rt.need_context() else rt.run(*ins)
        except Exception as e:
            while (e.__cause__ or e.__context__) is not None:  # onnx wraps the numpy error
                e = e.__cause__ or e.__context__
            shapes = ", ".join("%s %s" % (list(v.shape), v.dtype) if hasattr(v, "shape") else "none"
                               for v in (results.get(i) for i in n.input))
            raise ImportFailure("%s: %s: evaluating at batch %d failed: %s (inputs: %s)"
                                % (path, _node(n), batch, _first_line(e), shapes))
        for name, v in zip(n.output, outs):
            if name:
                results[name] = v
                visit(name, v)
        for t in _reads(n) + list(n.output):
            if last.get(t, -1) <= k:
                results.pop(t, None)


def _product_shape(op, args, attrs):
    """The shape of MatMul(a, b) or Gemm(a, b[, c]) when numpy would
    compute it, else None (1-d operands, mismatched dims)."""
    a, b = args[0], args[1]
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return None
    try:
        if op == "MatMul":
            if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
                return None
            return np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        if a.ndim != 2 or b.ndim != 2:
            return None
        m, k = a.shape[::-1] if attrs.get("transA") else a.shape
        kb, n = b.shape[::-1] if attrs.get("transB") else b.shape
        c = args[2] if len(args) > 2 else None
        if k != kb or (c is not None and np.broadcast_shapes(np.shape(c), (m, n)) != (m, n)):
            return None
        return (m, n)
    except ValueError:  # batch dims that do not broadcast
        return None


def _shape_only(run, op):
    def wrapped(*args, **kwargs):
        shape = _product_shape(op, args, kwargs)
        return run(*args, **kwargs) if shape is None else (np.zeros(shape, dtype=args[0].dtype),)
    return wrapped


def skip_dependent_products(ev, dep):
    """Makes the evaluator's MatMul and Gemm nodes whose result depends on
    the inputs' values give zeros of the result's shape and dtype.
    normalize needs those tensors' shapes and batch dims, never their
    values (the feeds are synthetic), and computing them at the two probe
    batches was half of importing a 0.85B-parameter Llama (8 of 17 s).
    Operands whose product numpy would refuse still run the real op, so
    the error names the node as before."""
    for node, rt in zip(ev.proto_.graph.node, ev.rt_nodes_):
        if node.op_type in ("MatMul", "Gemm") and any(o in dep for o in node.output):
            rt._run = _shape_only(rt._run, node.op_type)
    return ev


def _value_dependent(model):
    dep = {i.name for i in _graph_inputs(model)}
    for n in model.graph.node:
        if n.op_type in SHAPE_ONLY_OPS:
            continue
        if any(i in dep for i in n.input if i):
            dep.update(o for o in n.output if o)
    return dep


def _batch_dim(name, s_ref, s_alt):
    diff = [k for k, (a, b) in enumerate(zip(s_ref, s_alt)) if a != b]
    if len(s_ref) != len(s_alt) or len(diff) > 1:
        raise ImportFailure("tensor '%s': shapes %s at batch %d and %s at batch %d differ in more than one dim"
                            % (name, list(s_ref), B_REF, list(s_alt), B_ALT))
    if not diff:
        return None
    k = diff[0]
    if s_ref[k] * B_ALT != s_alt[k] * B_REF:
        raise ImportFailure("tensor '%s': dim %d is %d at batch %d and %d at batch %d: not a multiple of the batch"
                            % (name, k, s_ref[k], B_REF, s_alt[k], B_ALT))
    return k


def _collapse(name, v_ref, k):
    """A constant repeated along its batch dim -> size 1 there, else None."""
    if v_ref.shape[k] != B_REF:
        return None
    first = np.take(v_ref, [0], axis=k)
    if all(np.array_equal(np.take(v_ref, [j], axis=k), first, equal_nan=True) for j in range(1, B_REF)):
        return first
    return None


def _same(a, b):
    """a and b hold the same values (the same memory: no need to look)."""
    ia, ib = a.__array_interface__, b.__array_interface__
    if a.dtype == b.dtype and ia["data"] == ib["data"] and a.shape == b.shape and ia["strides"] == ib["strides"]:
        return True
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def normalize(path, dim_values):
    model, weights = load_model(path)
    fix_dims(model, path, dim_values)
    functions = {(f.domain, f.name) for f in model.functions}
    for n in model.graph.node:
        if not onnx.defs.has(n.op_type, n.domain) and (n.domain, n.op_type) not in functions:
            raise ImportFailure("%s: %s: not a standard ONNX op (domain '%s'), so it cannot be folded or lowered: "
                                "export with standard ops only (no onnxruntime fusions)"
                                % (path, _node(n), n.domain or "ai.onnx"))
    skel = _skeleton(model, weights, path)
    try:
        # FP16/BF16: reductions accumulate in FP32 (narrow_eval.py)
        ev = fold_in_fp32(ReferenceEvaluator(skel, new_ops=[GatherElements]))
    except Exception as e:
        raise ImportFailure("%s: onnx's reference evaluator cannot load the model: %s" % (path, _first_line(e)))
    nm = Normalized()
    nm.onnx_node_count = len(model.graph.node)
    nm.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    nm.initializers = set(weights)
    dep = _value_dependent(model)
    skip_dependent_products(ev, dep)
    # The constants lowering reads: those value-dependent nodes take.
    frontier = {t for n in model.graph.node if any(o in dep for o in n.output) for t in _reads(n) if t not in dep}
    ref = {}

    def visit_ref(name, v):
        if v is None or not hasattr(v, "shape"):
            return
        nm.shape[name], nm.dtype[name] = tuple(int(s) for s in v.shape), np.asarray(v).dtype
        if name in frontier:
            ref[name] = np.asarray(v)

    def visit_alt(name, v):
        if name not in nm.shape:
            return
        nm.bdim[name] = _batch_dim(name, nm.shape[name], tuple(v.shape))
        if name not in ref:
            return
        c, k = ref.pop(name), nm.bdim[name]
        if k is None:
            same = _same(c, np.asarray(v))
        else:
            c = _collapse(name, c, k)
            same = c is not None
        if same:
            nm.const[name] = c
        else:
            nm.batch_const.add(name)

    _evaluate(ev, path, B_REF, weights, _feeds(model, B_REF), visit_ref)
    _evaluate(ev, path, B_ALT, weights, _feeds(model, B_ALT), visit_alt)
    for name, w in weights.items():
        nm.const.setdefault(name, w)
    for n in model.graph.node:
        for o in n.output:
            nm.producer[o] = n
        if any(o in dep for o in n.output):
            nm.nodes.append(n)
    for inp in _graph_inputs(model):
        tt = inp.type.tensor_type
        shape = ["B" if d.dim_param == "B" else int(d.dim_value) for d in tt.shape.dim]
        nm.inputs.append((inp.name, ONNX_TO_TP[tt.elem_type], shape))
    nm.outputs = [o.name for o in model.graph.output]
    for o in nm.outputs:
        if o not in dep:
            raise ImportFailure("%s: output '%s' does not depend on any input: nothing to serve" % (path, o))
    return nm
