"""The importer's intermediate program: tpgraph ops on *global* tensors.

Shapes are concrete at the reference batch (normalize.B_REF); `bdim` says
which dim scales with the batch (it becomes -1 in reshapes and "B" in
inputs). The tensor-parallel planner turns this into the SPMD program."""


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

    def replace_uses(self, old, new):
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]
