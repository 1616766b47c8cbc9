"""Load an ONNX model, fix its dims and fold everything that does not depend
on the batch input's values.

Folding uses onnx's reference evaluator (a library, not hand-written op
semantics): the whole model runs twice, at two batch sizes, with every
intermediate kept. A tensor that depends only on initializers and on input
*shapes* (Shape, Size) is a constant; comparing the two runs tells which
dims of every tensor scale with the batch, and which constants merely repeat
along the batch dim (those collapse to size 1 and broadcast)."""
import os

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_model
from onnx import shape_inference
from onnx.reference import ReferenceEvaluator

from .errors import ImportFailure
from .narrow_eval import fold_in_fp32

# The two batch sizes the model is evaluated at. B_REF's shapes are the ones
# the importer reasons with; B_ALT only tells which dims follow the batch.
B_REF, B_ALT = 3, 2
# Ops whose output depends on their input's shape, never its values.
SHAPE_ONLY_OPS = {"Shape", "Size"}

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


def load_model(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ImportFailure("%s: cannot read: %s" % (path, e.strerror))
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf raises several unrelated types
        raise ImportFailure("%s: not a valid ONNX file (truncated or corrupt?): %s" % (path, str(e).splitlines()[0] if str(e) else type(e).__name__))
    try:
        # Exports of large models keep initializers in files beside the model.
        load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    except Exception as e:  # OSError, ValueError or onnx's ValidationError
        raise ImportFailure("%s: cannot read its external tensor data: %s" % (path, str(e).splitlines()[0]))
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise ImportFailure("%s: not a valid ONNX model (truncated or corrupt?): %s" % (path, str(e).splitlines()[0]))
    if not model.graph.output:
        raise ImportFailure("%s: the graph has no outputs (truncated?)" % path)
    return model


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


def _run_all(model, path, batch):
    try:
        # FP16/BF16: reductions accumulate in FP32 (narrow_eval.py)
        sess = fold_in_fp32(ReferenceEvaluator(model))
        return sess.run(None, _feeds(model, batch), intermediate=True)
    except Exception as e:
        raise ImportFailure("%s: evaluating the model at batch %d failed: %s" % (path, batch, str(e).splitlines()[0]))


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


def normalize(path, dim_values):
    model = load_model(path)
    fix_dims(model, path, dim_values)
    try:
        model = shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:
        raise ImportFailure("%s: shape inference failed: %s" % (path, str(e).splitlines()[0]))
    ref, alt = _run_all(model, path, B_REF), _run_all(model, path, B_ALT)
    nm = Normalized()
    nm.onnx_node_count = len(model.graph.node)
    nm.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    nm.initializers = {i.name for i in model.graph.initializer}
    dep = _value_dependent(model)
    for name, v in ref.items():
        if v is None or not hasattr(v, "shape"):
            continue
        v = np.asarray(v)
        nm.shape[name] = tuple(int(s) for s in v.shape)
        nm.dtype[name] = v.dtype
        nm.bdim[name] = _batch_dim(name, v.shape, np.asarray(alt[name]).shape)
        if name in dep:
            continue
        if nm.bdim[name] is None:
            if np.array_equal(v, np.asarray(alt[name]), equal_nan=True):
                nm.const[name] = v
            else:
                nm.batch_const.add(name)
            continue
        c = _collapse(name, v, nm.bdim[name])
        if c is None:
            nm.batch_const.add(name)
        else:
            nm.const[name] = c
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

