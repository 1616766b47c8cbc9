"""The importer's intermediate program: tpgraph ops on *global* tensors.

Shapes are concrete at the reference batch (normalize.B_REF); `bdim` says
which dim scales with the batch (it becomes -1 in reshapes and "B" in
inputs). The tensor-parallel planner turns this into the SPMD program."""
import numpy as np


class Value:
    """A tensor of the program: a graph input, a param or a node's result."""

    def __init__(self, name, shape, bdim, datatype):
        self.name, self.shape, self.bdim, self.datatype = name, tuple(shape), bdim, datatype


class Node(Value):
    def __init__(self, name, op, inputs, attrs, shape, bdim, datatype, onnx_node=None):
        super().__init__(name, shape, bdim, datatype)
        self.op, self.inputs, self.attrs = op, list(inputs), dict(attrs)
        # The ONNX node this one came from (for error messages).
        self.onnx_node = onnx_node


class Joined:
    """Params joined along one axis, made only when written (write.py
    streams one tensor at a time), so an import never holds the weights of
    fused sibling matmuls twice; np.asarray gives the array."""

    def __init__(self, names, parts, axis):
        self.names, self.parts, self.axis = list(names), list(parts), axis
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        self.shape, self.ndim, self.dtype = tuple(shape), len(shape), parts[0].dtype

    def __array__(self, dtype=None, copy=None):
        a = np.concatenate(self.parts, axis=self.axis)
        return a if dtype is None else a.astype(dtype)


class Program:
    """inputs: [Value]; params: name -> ndarray (global); nodes in
    topological order; outputs: names of the values the model returns."""

    def __init__(self):
        self.inputs, self.params, self.nodes, self.outputs = [], {}, [], []
        self.output_names = []  # the ONNX names of `outputs`, kept on export
        self.values = {}

    def add_input(self, v):
        self.inputs.append(v)
        self.values[v.name] = v

    def add_param(self, name, array, datatype):
        self.params[name] = array
        self.values[name] = Value(name, array.shape, None, datatype)
        return name

    def add_node(self, node):
        if node.name in self.values:
            raise ValueError("duplicate value name %s" % node.name)
        self.nodes.append(node)
        self.values[node.name] = node
        return node.name

    def consumers(self):
        uses = {}
        for n in self.nodes:
            for i in n.inputs:
                uses.setdefault(i, []).append(n)
        return uses

    def prune(self):
        """Drops nodes and params no output depends on."""
        live = set(self.outputs)
        for n in reversed(self.nodes):
            if n.name in live:
                live.update(n.inputs)
        self.nodes = [n for n in self.nodes if n.name in live]
        self.params = {k: v for k, v in self.params.items() if k in live}
        live.update(i.name for i in self.inputs)
        self.values = {k: v for k, v in self.values.items() if k in live}

    def weight(self, name):
        """Param name, or the part of a joined param that was called name
        (error messages name the ONNX model's weights); None if neither."""
        if name in self.params:
            return self.params[name]
        for j in self.params.values():
            if isinstance(j, Joined) and name in j.names:
                return j.parts[j.names.index(name)]
        return None

    def replace_uses(self, old, new):
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]
