"""Clean-ups on the lowered program that keep it exact."""
import fnmatch

import numpy as np

from .ir import Joined, Node


def _fold_flatten_matmul(prog, uses):
    """reshape x -> [M, K]; matmul W; [add bias]; reshape -> [d0, .., N]
    with d0·..·dk = M is one matmul on reshape(x, [d0, .., K]) (tpgraph's
    matmul takes [..., M, K]; the inner reshape goes when x already has that
    shape). Fewer copies, the sequence dim survives for reduce_scatter, and
    an all_gather feeding the matmul stays adjacent so fuse_tp fuses them."""
    for r1 in list(prog.nodes):
        if r1.op != "reshape" or len(r1.shape) != 2 or r1.name in prog.outputs:
            continue
        x = prog.values[r1.inputs[0]]
        chain, t = [], r1
        while True:
            us = uses.get(t.name, [])
            if len(us) != 1 or t.name in prog.outputs:
                break
            u = us[0]
            if not chain and u.op == "matmul" and u.inputs[0] == r1.name and u.inputs[1] in prog.params:
                chain.append(u)
            elif chain and u.op == "add" and any(i in prog.params and prog.params[i].ndim == 1 for i in u.inputs):
                chain.append(u)
            else:
                break
            t = u
        us = uses.get(t.name, [])
        if not chain or len(us) != 1 or us[0].op != "reshape":
            continue
        r2 = us[0]
        lead = r2.shape[:-1]
        if len(lead) < 2 or int(np.prod(lead)) != r1.shape[0] or r2.shape[-1] != t.shape[-1] or r2.bdim is None:
            continue
        if x.shape == lead + (r1.shape[1],):
            chain[0].inputs[0] = x.name
            prog.nodes.remove(r1)
        else:
            r1.shape, r1.bdim = lead + (r1.shape[1],), r2.bdim
        for n in chain:
            n.shape, n.bdim = r2.shape, r2.bdim
        prog.replace_uses(r2.name, t.name)
        prog.nodes.remove(r2)
        uses.clear()
        uses.update(prog.consumers())


def _sole_param(prog, uses, name, ndim):
    """Whether name is an ndim-d param that one node reads, once."""
    return (name in prog.params and prog.params[name].ndim == ndim and len(uses.get(name, [])) == 1
            and uses[name][0].inputs.count(name) == 1)


def _bias_of(prog, uses, m):
    """The add of a 1-d param bias that alone reads matmul m, and the bias;
    (None, None) when m has anything else (or is an output)."""
    us = uses.get(m.name, [])
    if len(us) != 1 or m.name in prog.outputs or us[0].op != "add":
        return None, None
    b = [i for i in us[0].inputs if i != m.name]
    if (len(b) != 1 or not _sole_param(prog, uses, b[0], 1) or prog.params[b[0]].shape != m.shape[-1:]
            or prog.values[b[0]].datatype != m.datatype):
        return None, None
    return us[0], b[0]


def _siblings(prog, uses, planned):
    """Groups of >= 2 matmuls of one input by 2-d params of one dtype, K and
    transpose_b, each param read by its matmul alone and named by no --plan
    glob (a plan decides per weight; a joined weight would hide it)."""
    groups = {}
    for n in prog.nodes:
        if n.op != "matmul" or len(n.inputs) != 2:
            continue
        x, w = n.inputs
        if x == w or not _sole_param(prog, uses, w, 2) or any(fnmatch.fnmatchcase(w, g) for g in planned):
            continue
        tb = bool(n.attrs.get("transpose_b", False))
        k = prog.params[w].shape[1 if tb else 0]
        groups.setdefault((x, tb, k, prog.values[w].datatype), []).append(n)
    return [(tb, ms) for (_, tb, _, _), ms in groups.items() if len(ms) > 1]


def _free(prog, name):
    """name, or name with "_"s appended until no value of prog has it."""
    while name in prog.values:
        name += "_"
    return name


def _join(prog, name, parts, axis, datatype):
    """A param named after name (made free) joining parts along axis."""
    return prog.add_param(_free(prog, name), Joined(parts, [prog.params[p] for p in parts], axis), datatype)


def _fuse_group(prog, uses, tb, ms):
    """matmul(x, w_i) [+ b_i] for the group ms -> one matmul by the joined
    weights [+ one add of the joined biases], each old value a slice of
    the result under its own name (so outputs keep theirs)."""
    first = ms[0]
    at = prog.nodes.index(first)
    ws = [m.inputs[1] for m in ms]
    adds = [_bias_of(prog, uses, m) for m in ms]
    with_bias = all(a is not None for a, _ in adds)
    widths = [m.shape[-1] for m in ms]
    shape = first.shape[:-1] + (sum(widths),)
    w = _join(prog, ws[0] + ".cat%d" % len(ms), ws, 0 if tb else 1, first.datatype)
    mm = Node(_free(prog, first.name + ".cat"), "matmul", [first.inputs[0], w], first.attrs, shape, first.bdim,
              first.datatype, first.onnx_node)
    new, last = [mm], mm
    if with_bias:
        b = _join(prog, adds[0][1] + ".cat%d" % len(ms), [bb for _, bb in adds], 0, first.datatype)
        last = Node(_free(prog, adds[0][0].name + ".cat"), "add", [mm.name, b], {}, shape, first.bdim,
                    first.datatype, adds[0][0].onnx_node)
        new.append(last)
    olds = [a for a, _ in adds] if with_bias else ms
    for n in ms + (olds if with_bias else []):
        prog.nodes.remove(n)
        del prog.values[n.name]
    start = 0
    for old, width in zip(olds, widths):
        new.append(Node(old.name, "slice", [last.name], {"dim": len(shape) - 1, "start": start, "length": width},
                        old.shape, old.bdim, old.datatype, old.onnx_node))
        start += width
    for i, n in enumerate(new):
        prog.nodes.insert(at + i, n)
        prog.values[n.name] = n


def fuse_sibling_matmuls(prog, planned=()):
    """Matmuls of one input by their own weights (attention's q, k and v;
    an MLP's gate and up) become one matmul by the weights joined along N,
    sliced back: the input is packed and read once, one product of N
    1280-4096 runs instead of two or three of 256-2048 (a 128-row q, k, v
    of 768 x 768 ran at 134 GFLOP/s a core where 768 x 2304 runs at 159),
    and their biases are one add. The planner splits a joined weight by
    its segments, rank-major, as it does a fused QKV export. Every column
    is the same dot product as before; planned: the --plan globs."""
    for tb, ms in _siblings(prog, prog.consumers(), planned):
        _fuse_group(prog, prog.consumers(), tb, ms)
    prog.prune()


def before_repeat_kv(prog, t, heads):
    """repeat_kv (k [B,Hkv,T,D] -> reshape -> expand -> reshape [B,H,T,D]):
    the tensor before it when the chain repeats each kv head H/Hkv times
    (replayed on index arrays), else t."""
    chain, x = [], t
    while len(chain) < 4:
        node = prog.values.get(x)
        if not isinstance(node, Node) or node.op not in ("reshape", "expand"):
            break
        chain.append(node)
        x = node.inputs[0]
        s = prog.values[x].shape
        if len(s) == 4 and s[1] < heads and heads % s[1] == 0 and node.op == "reshape":
            idx = np.arange(int(np.prod(s))).reshape(s)
            y = idx
            for n in reversed(chain):
                y = np.broadcast_to(y, n.shape) if n.op == "expand" else y.reshape(n.shape)
            if y.shape == prog.values[t].shape and np.array_equal(y, np.repeat(idx, heads // s[1], axis=1)):
                return x
    return t


def attention_reads_kv_heads(prog):
    """Grouped-query attention: an attention whose k and v are repeat_kv
    chains reads the kv heads before them (the attention op takes k, v
    [B, Hkv, T, D]): the chains copied k and v H/Hkv times on every
    layer (2.7 ms of a 512-row Llama request) and are pruned."""
    for n in prog.nodes:
        if n.op != "attention":
            continue
        q, k, v = n.inputs[:3]
        heads = prog.values[q].shape[1]
        k0, v0 = before_repeat_kv(prog, k, heads), before_repeat_kv(prog, v, heads)
        if k0 != k and v0 != v and prog.values[k0].shape[1] == prog.values[v0].shape[1]:
            n.inputs = [q, k0, v0] + n.inputs[3:]
    prog.prune()


def simplify(prog):
    _fold_flatten_matmul(prog, prog.consumers())
    prog.prune()
