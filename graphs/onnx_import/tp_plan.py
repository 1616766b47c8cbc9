"""The tensor-parallel plan: global ir.Program -> SPMD tpgraph nodes.

Placements propagate forward through the program (Megatron by default):
a matmul whose input is replicated is column-parallel (its weight split on
the output features), one whose input is split on the contraction dim is
row-parallel and followed by an all_reduce (with --sequence-parallel a
reduce_scatter along the sequence, and an all_gather before the next
column-parallel matmul). Embeddings are vocab-parallel. A plan file
(weight-name glob -> colwise | rowwise | replicate | vocab_parallel)
overrides the choice per weight. A consumer that cannot take a split input
gets an all_gather first, so every program stays exact.

A vocab that does not divide the world size (GPT-2's 50257) is padded, as
Megatron does, to a multiple of VOCAB_PAD x world size: the embedding table
(and a tied or untied LM head) gets zero rows at the end, which no id
reaches; the head's padded logits are gathered and sliced back to the vocab
before anything reads them. Any other dim that does not divide is an error
naming the weight and the --plan entry that replicates it.

A split may be "grouped": a fused QKV weight's output dim is [q | k | v],
and each segment is split across ranks separately. Such a weight is stored
rank-major (rank r's chunks of every segment side by side) so a plain
shard(k) hands each rank whole heads of q, k and v."""
import fnmatch
from collections import namedtuple

import numpy as np

from .errors import ImportFailure
from .ir import Joined

MODES = ("colwise", "rowwise", "replicate", "vocab_parallel")
# Megatron's make-vocab-size-divisible-by: a padded vocab is a multiple of
# 128 x world size, so every rank's shard is whole 128-row tiles (aligned
# logit rows for the GEMM kernels) and its layout is Megatron's. The cost is
# under 128 rows per rank, only where the vocab does not divide.
VOCAB_PAD = 128

# dim: the split dim; segs: segment sizes along it (each split d ways);
# origin: the weight the split comes from (for error messages); pad: zero
# entries at the end of dim (a padded vocab) that must go before any use.
Shard = namedtuple("Shard", "dim segs origin pad", defaults=(0,))


def _fmt(shape):
    return "[%s]" % ", ".join(str(s) for s in shape)


def _reshape_groups(src, dst):
    """Pairs (src dims, dst dims) with equal element counts, in order."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj, pi, pj = [], [], 1, 1
        if i < len(src):
            gi, pi, i = [i], src[i], i + 1
        if j < len(dst):
            gj, pj, j = [j], dst[j], j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi, i = pi * src[i], i + 1
            else:
                gj.append(j)
                pj, j = pj * dst[j], j + 1
        groups.append((gi, gj))
    return groups


class Planner:
    def __init__(self, prog, world, plan=None, sequence_parallel=False, generate=None, states=()):
        """generate: the generation graph's block (generate.py): the output
        ends in the greedy argmax chain; states: its kv caches (ir.Value)."""
        self.prog, self.d, self.plan, self.sp = prog, world, plan or {}, sequence_parallel
        self.generate, self.states = generate, list(states)
        self.state_place = {}  # state name -> placement string
        self.place = {}  # IR value -> Shard or None (replicated)
        self.name = {}   # IR value -> emitted name
        self.nodes = []  # emitted tpgraph nodes (dicts)
        self.params = {}  # emitted param name -> dict(source, dim, segs, placement)
        self.param_key = {}  # (source, dim, segs) -> emitted param name
        self.gathered = {}
        self.out_place = {}  # emitted output name -> its placement when not replicate
        self.taken = {v.name for v in prog.inputs} | {v.name for v in self.states}
        self.uses = prog.consumers()
        self.used_plan = set()

    # -- helpers --------------------------------------------------------------

    def shape(self, v):
        return self.prog.values[v].shape

    def local_shape(self, v, shape=None, pl="auto"):
        s = list(self.shape(v) if shape is None else shape)
        pl = self.place.get(v) if pl == "auto" else pl
        if pl is not None:
            s[pl.dim] //= self.d
        return s

    def add(self, name, op, inputs, attrs=None):
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        self.nodes.append({"name": name, "op": op, "inputs": list(inputs), "attrs": dict(attrs or {})})
        return name

    def mode_for(self, weight):
        for glob, mode in self.plan.items():
            if fnmatch.fnmatchcase(weight, glob):
                self.used_plan.add(glob)
                return mode
        return None

    def use_param(self, p, dim=None, segs=None, vocab=False):
        """The emitted param for IR param p split on dim (None: replicated);
        a vocab dim that does not divide is padded (see VOCAB_PAD)."""
        arr = self.prog.params[p]
        pad = 0
        if dim is not None:
            dim %= arr.ndim
            segs = tuple(segs or (arr.shape[dim],))
            if vocab and len(segs) == 1 and segs[0] % self.d:
                pad = -segs[0] % (VOCAB_PAD * self.d)
            for i, s in enumerate(segs):
                if s % self.d and not pad:
                    name, shape, sizes = p, arr.shape, " + ".join(map(str, segs))
                    if isinstance(arr, Joined) and len(segs) == len(arr.names):
                        # the model's own weight, which the plan can name (fuse_sibling_matmuls)
                        name, shape, sizes = arr.names[i], arr.parts[i].shape, str(s)
                    raise ImportFailure("weight '%s' %s: dim %d (%s) is not divisible by world size %d: "
                                        "replicate it with a --plan file holding {\"%s\": \"replicate\"}"
                                        % (name, _fmt(shape), dim, sizes, self.d, name))
        k = (p, dim, segs if dim is not None and len(segs) > 1 else None)
        if k in self.param_key:
            return self.param_key[k]
        name = p if not any(v["source"] == p for v in self.params.values()) else "%s.%s" % (p, "replicate" if dim is None else "shard%d" % dim)
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        self.param_key[k] = name
        self.params[name] = {"source": p, "dim": dim, "segs": k[2], "pad": pad}
        return name

    def replicated(self, v):
        """v's emitted name as a whole tensor: all_gather it if split."""
        pl = self.place.get(v)
        if pl is None:
            return self.name[v]
        if len(pl.segs) > 1:
            raise ImportFailure("'%s' is split in segments %s (from weight '%s') and needed whole: set the weight to replicate in a --plan"
                                % (v, list(pl.segs), pl.origin))
        if v not in self.gathered:
            g = self.add(self.name[v] + ".all_gather", "all_gather", [self.name[v]], {"dim": pl.dim})
            if pl.pad:
                g = self.add(self.name[v] + ".unpad", "slice", [g], {"dim": pl.dim, "start": 0, "length": self.shape(v)[pl.dim]})
            self.gathered[v] = g
        return self.gathered[v]

    def output(self, v):
        """v's emitted name as a graph output. Split in d contiguous chunks
        (one segment, no padded vocab), it stays split and is declared
        shard(dim): the server concatenates the ranks' chunks as it copies
        them out, where an all_gather would copy the whole output on every
        rank first (a 127M Llama's logits at world size 2: engine 226 ms
        against 241)."""
        pl = self.place.get(v)
        if pl is not None and len(pl.segs) == 1 and not pl.pad:
            self.out_place[self.name[v]] = "shard(%d)" % pl.dim
            return self.name[v]
        return self.replicated(v)

    def seq_dim(self, v):
        """The sequence dim of an activation [B, S, ...] when --sequence-parallel applies."""
        val = self.prog.values[v]
        if not self.sp or val.bdim != 0 or len(val.shape) < 3 or val.shape[1] % self.d:
            return None
        return 1

    def reduce(self, v, partial, origin):
        sd = self.seq_dim(v)
        if sd is None:
            self.name[v] = self.add(v, "all_reduce", [partial], {"op": "sum"})
            self.place[v] = None
        else:
            self.name[v] = self.add(v, "reduce_scatter", [partial], {"dim": sd, "op": "sum"})
            self.place[v] = Shard(sd, (self.shape(v)[sd],), origin)

    def emit_same(self, n, inputs, pl, attrs=None):
        self.name[n.name] = self.add(n.name, n.op, inputs, n.attrs if attrs is None else attrs)
        self.place[n.name] = pl

    # -- the walk -------------------------------------------------------------

    def run(self):
        for v in self.prog.inputs + self.states:
            self.name[v.name], self.place[v.name] = v.name, None
        for n in self.prog.nodes:
            for i in n.inputs:
                if getattr(self.place.get(i), "pad", 0):  # a padded vocab: no op sees the padding
                    self.name[i], self.place[i] = self.replicated(i), None
            getattr(self, "op_" + n.op, self.op_elementwise)(n)
        if self.generate:
            outs = [self.greedy(o) for o in self.prog.outputs]
        else:
            outs = [self.output(o) for o in self.prog.outputs]
        unused = set(self.plan) - self.used_plan
        if unused:
            raise ImportFailure("--plan: pattern '%s' matches no weight" % sorted(unused)[0])
        return outs

    def is_param(self, v):
        return v in self.prog.params

    # -- matmul / embedding ---------------------------------------------------

    def segments_after(self, v):
        """Segments of v's last dim cut by the slices that consume it (through
        a bias add and reshapes keeping the last dim)."""
        n_last = self.shape(v)[-1]
        seen = v
        while True:
            us = self.uses.get(seen, [])
            if len(us) == 1 and us[0].op == "add" and any(self.is_param(i) for i in us[0].inputs):
                seen = us[0].name
            elif len(us) == 1 and us[0].op == "reshape" and us[0].shape[-1] == n_last:
                seen = us[0].name
            else:
                break
        us = self.uses.get(seen, [])
        rank = len(self.shape(seen))
        cuts = sorted((u.attrs["start"], u.attrs["length"]) for u in us
                      if u.op == "slice" and u.attrs["dim"] % rank == rank - 1)
        if not us or len(cuts) != len(us):
            return (n_last,)
        pos, segs = 0, []
        for s, length in cuts:
            if s != pos:
                return (n_last,)
            segs.append(length)
            pos += length
        return tuple(segs) if pos == n_last else (n_last,)

    def op_matmul(self, n):
        a, b = n.inputs
        if not self.is_param(b):
            return self.matmul_activations(n)
        tb = n.attrs.get("transpose_b", False)
        pa = self.place.get(a)
        rank_a = len(self.shape(a))
        mode = self.mode_for(b)
        if mode is None:
            mode = "rowwise" if pa is not None and pa.dim == rank_a - 1 else "colwise"
        if self.d == 1 or self.prog.params[b].ndim != 2:
            mode = "replicate"  # batched weights: no Megatron split
        if mode == "colwise":
            segs = self.segments_after(n.name)
            # an LM head: its weight is the (tied) embedding table, or it gives the logits
            vocab = n.name in self.prog.outputs or any(u.op == "embedding" and u.inputs[1] == b for u in self.uses.get(b, []))
            w = self.use_param(b, 0 if tb else 1, segs, vocab)
            pad = self.params[w]["pad"]
            self.emit_same(n, [self.replicated(a), w], Shard(len(n.shape) - 1, (segs[0] + pad,) if pad else segs, b, pad))
        elif mode == "rowwise":
            if pa is None or pa.dim != rank_a - 1 or len(pa.segs) > 1:
                raise ImportFailure("--plan: weight '%s' is rowwise but its input '%s' is not split on the contraction dim: "
                                    "make it colwise or replicate" % (b, a))
            w = self.use_param(b, 1 if tb else 0)
            partial = self.add(n.name + ".partial", "matmul", [self.name[a], w], n.attrs)
            self.reduce(n.name, partial, b)
        elif mode == "replicate":
            self.emit_same(n, [self.replicated(a), self.use_param(b)], None)
        else:
            raise ImportFailure("--plan: weight '%s' feeds a matmul: %s does not apply" % (b, mode))

    def matmul_activations(self, n):
        a, b = n.inputs
        pa, pb = self.place.get(a), self.place.get(b)
        ra, rb = len(self.shape(a)), len(self.shape(b))
        if (pa is not None and pb is not None and pa.segs == pb.segs and pa.dim < ra - 2
                and pb.dim < rb - 2 and ra - pa.dim == rb - pb.dim):
            self.emit_same(n, [self.name[a], self.name[b]], Shard(len(n.shape) - (ra - pa.dim), pa.segs, pa.origin))
        else:
            self.emit_same(n, [self.replicated(a), self.replicated(b)], None)

    def op_embedding(self, n):
        ids, table = n.inputs
        mode = self.mode_for(table) or "vocab_parallel"
        if self.d == 1:
            mode = "replicate"
        ids_name = self.replicated(ids)
        if mode in ("vocab_parallel", "rowwise"):
            w = self.use_param(table, 0, vocab=True)
            partial = self.add(n.name + ".partial", "embedding", [ids_name, w], {"vocab_parallel": True})
            self.reduce(n.name, partial, table)
        elif mode == "colwise":
            self.emit_same(n, [ids_name, self.use_param(table, 1)], Shard(len(n.shape) - 1, (n.shape[-1],), table))
        else:
            self.emit_same(n, [ids_name, self.use_param(table)], None)

    # -- elementwise and friends -----------------------------------------------

    def op_elementwise(self, n):
        """add/sub/mul/gelu/silu/relu: NumPy broadcasting, aligned right."""
        rank = len(n.shape)
        split = set()
        for i in n.inputs:
            pl = self.place.get(i)
            if pl is not None and not self.is_param(i):
                split.add((pl.dim + rank - len(self.shape(i)), pl.segs, pl.origin))
        target = None
        if len({(s[0], s[1]) for s in split}) == 1:
            target = Shard(*next(iter(split)))
            for i in n.inputs:
                if self.is_param(i) or self.place.get(i) is not None:
                    continue
                k = target.dim - (rank - len(self.shape(i)))
                if k >= 0 and self.shape(i)[k] != 1:
                    target = None
                    break
        ins = []
        for i in n.inputs:
            k = None if target is None else target.dim - (rank - len(self.shape(i)))
            if self.is_param(i):
                split_it = k is not None and k >= 0 and self.shape(i)[k] == n.shape[target.dim]
                ins.append(self.use_param(i, k, target.segs) if split_it else self.use_param(i))
            elif target is None:
                ins.append(self.replicated(i))
            else:
                ins.append(self.name[i])
        self.emit_same(n, ins, target)

    def op_rope(self, n):
        """Elementwise but along the last dim, whose halves rotate into each
        other: x split there (never by the default plan: heads are dim 1)
        is gathered first, with cos and sin whole."""
        x = n.inputs[0]
        pl = self.place.get(x)
        if pl is None or pl.dim != len(self.shape(x)) - 1:
            self.op_elementwise(n)
            return
        rest = [self.use_param(i) if self.is_param(i) else self.replicated(i) for i in n.inputs[1:]]
        self.emit_same(n, [self.replicated(x)] + rest, None)

    def _along(self, n, dim):
        """Unary op along `dim` (softmax, norms): that dim must be whole."""
        x = n.inputs[0]
        pl = self.place.get(x)
        rank = len(self.shape(x))
        if pl is not None and pl.dim == dim % rank:
            pl, xs = None, self.replicated(x)
        else:
            xs = self.name[x]
        rest = [self.use_param(p) if self.is_param(p) else self.replicated(p) for p in n.inputs[1:]]
        self.emit_same(n, [xs] + rest, pl)

    def op_softmax(self, n):
        self._along(n, n.attrs.get("dim", -1))

    def op_layer_norm(self, n):
        self._along(n, -1)

    op_rms_norm = op_layer_norm

    def _keep_split(self, x, out_dim):
        """x's emitted name and the output's split: x's split dim moves to
        out_dim(dim), or x is gathered where out_dim gives None. A param is
        used whole."""
        if self.is_param(x):
            return self.use_param(x), None
        pl = self.place.get(x)
        if pl is None:
            return self.name[x], None
        d = out_dim(pl.dim)
        if d is None:
            return self.replicated(x), None
        return self.name[x], pl._replace(dim=d)

    def _reduce(self, n):
        rank = len(self.shape(n.inputs[0]))
        dim, keep = n.attrs["dim"] % rank, n.attrs.get("keepdim", False)
        xs, pl = self._keep_split(n.inputs[0], lambda k: None if k == dim else k - (k > dim and not keep))
        self.emit_same(n, [xs], pl, dict(n.attrs, dim=dim))

    op_reduce_mean = _reduce
    op_reduce_sum = _reduce

    def op_gather(self, n):
        x, ids = n.inputs
        dim, n_ids = n.attrs["dim"] % len(self.shape(x)), len(self.shape(ids))
        xs, pl = self._keep_split(x, lambda k: None if k == dim else (k if k < dim else k + n_ids - 1))
        idn = self.use_param(ids) if self.is_param(ids) else self.replicated(ids)
        self.emit_same(n, [xs, idn], pl, {"dim": dim})

    def op_expand(self, n):
        """A dim the expand grows was size 1, so never the split one."""
        lead = len(n.shape) - len(self.shape(n.inputs[0]))
        xs, pl = self._keep_split(n.inputs[0], lambda k: k + lead)
        self.emit_same(n, [xs], pl)

    def op_attention(self, n):
        # q, k, v split by heads; a key-padding mask [B, T] (input 3) is per
        # batch row and key, the same for every head: replicated
        qkv, mask = n.inputs[:3], [self.replicated(i) for i in n.inputs[3:]]
        pls = [self.place.get(i) for i in qkv]
        if all(p is not None and p.dim == 1 and len(p.segs) == 1 for p in pls):
            self.emit_same(n, [self.name[i] for i in qkv] + mask, pls[0])
        else:
            self.emit_same(n, [self.replicated(i) for i in qkv] + mask, None)

    def op_kv_attention(self, n):
        """Heads split across ranks (q on H, k/v on Hkv, on dim 1): the
        caches are split on their KV-head dim 1 the same way; otherwise
        everything is whole on every rank."""
        qkv, (kc, vc), rows = n.inputs[:3], n.inputs[3:5], [self.replicated(i) for i in n.inputs[5:]]
        pls = [self.place.get(i) for i in qkv]
        split = all(p is not None and p.dim == 1 and len(p.segs) == 1 for p in pls)
        for c in (kc, vc):
            self.state_place[c] = "shard(1)" if split else "replicate"
        ins = [self.name[i] for i in qkv] if split else [self.replicated(i) for i in qkv]
        self.emit_same(n, ins + [kc, vc] + rows, pls[0] if split else None)

    def greedy(self, o):
        """The logits [B, 1, V] -> next_token [B]: argmax over each rank's
        vocab shard (ids past the true vocab, the padding, ignored), the
        largest key across ranks, its token id, as [B]."""
        pl, rank = self.place.get(o), len(self.shape(o))
        if pl is not None and (pl.dim != rank - 1 or len(pl.segs) > 1):
            x, pl = self.replicated(o), None
        else:
            x = self.name[o]
        out = self.generate["next_token"]
        if out in self.taken:
            raise ImportFailure("--generate: the graph already has a value named '%s'" % out)
        self.taken.add(out)
        attrs = {"limit": self.generate["vocab_size"]}
        if pl is not None:
            attrs["vocab_parallel"] = True
        key = self.add(out + ".key", "argmax", [x], attrs)
        if pl is not None:
            key = self.add(out + ".max", "all_reduce", [key], {"op": "max"})
        index = self.add(out + ".index", "argmax_index", [key])
        self.nodes.append({"name": out, "op": "view", "inputs": [index], "attrs": {"shape": [-1]}})
        return out

    def op_cat(self, n):
        dim = n.attrs["dim"] % len(n.shape)
        pls = {self.place.get(i) for i in n.inputs}
        if len(pls) == 1 and None not in pls and next(iter(pls)).dim != dim:
            self.emit_same(n, [self.name[i] for i in n.inputs], next(iter(pls)), {"dim": dim})
        else:
            self.emit_same(n, [self.replicated(i) for i in n.inputs], None, {"dim": dim})

    # -- views ----------------------------------------------------------------

    def op_permute(self, n):
        pl = self.place.get(n.inputs[0])
        out = None if pl is None else pl._replace(dim=list(n.attrs["dims"]).index(pl.dim))
        self.emit_same(n, [self.name[n.inputs[0]]], out)

    def op_transpose(self, n):
        pl = self.place.get(n.inputs[0])
        rank = len(n.shape)
        d0, d1 = n.attrs["dim0"] % rank, n.attrs["dim1"] % rank
        out = None if pl is None else pl._replace(dim={d0: d1, d1: d0}.get(pl.dim, pl.dim))
        self.emit_same(n, [self.name[n.inputs[0]]], out)

    def op_slice(self, n):
        x = n.inputs[0]
        pl = self.place.get(x)
        dim, start, length = n.attrs["dim"] % len(n.shape), n.attrs["start"], n.attrs["length"]
        whole = {"dim": dim, "start": start, "length": length}
        if pl is None or pl.dim != dim:
            return self.emit_same(n, [self.name[x]], pl, whole)
        # Rank r holds chunk r of every segment side by side, so a slice made
        # of whole segments is the same slice scaled by 1/d on every rank.
        bounds = list(np.cumsum((0,) + pl.segs))
        if start in bounds and start + length in bounds:
            i, j = bounds.index(start), bounds.index(start + length)
            self.emit_same(n, [self.name[x]], Shard(dim, pl.segs[i:j], self._part_origin(pl.origin, i, j)),
                           {"dim": dim, "start": start // self.d, "length": length // self.d})
        else:
            self.emit_same(n, [self.replicated(x)], None, whole)

    def _part_origin(self, origin, i, j):
        """The weight segment i of a joined param came from, when a slice
        takes that segment alone: errors then name the model's weight."""
        w = self.prog.params.get(origin)
        return w.names[i] if isinstance(w, Joined) and j == i + 1 else origin

    def op_reshape(self, n):
        x = n.inputs[0]
        pl, src, dst = self.place.get(x), self.shape(x), n.shape
        out = None
        if pl is not None:
            out = self.reshape_split(n, pl, src, dst)
        xs = self.replicated(x) if pl is not None and out is None else self.name[x]
        local = self.local_shape(n.name, pl=out)
        if n.bdim is not None:
            local[n.bdim] = -1
        self.emit_same(n, [xs], out, {"shape": local})

    def reshape_split(self, n, pl, src, dst):
        for gi, gj in _reshape_groups(src, dst):
            if pl.dim not in gi:
                continue
            si = [k for k in gi if src[k] != 1]
            sj = [k for k in gj if dst[k] != 1]
            if not sj or si[0] != pl.dim:
                return None
            if len(pl.segs) > 1 and not (len(si) == 1 and len(sj) == 1):
                return None
            o = sj[0]
            if dst[o] % self.d:
                w = self.prog.weight(pl.origin)
                raise ImportFailure("weight '%s'%s: '%s' splits its dim of %d into %s and %d (heads) is not divisible by world size %d: "
                                    "replicate it with a --plan file holding {\"%s\": \"replicate\"}"
                                    % (pl.origin, "" if w is None else " " + _fmt(w.shape), n.name, src[pl.dim],
                                       " x ".join(str(dst[k]) for k in sj), dst[o], self.d, pl.origin))
            return Shard(o, pl.segs if len(pl.segs) > 1 else (dst[o],), pl.origin)
        return None
