"""--generate: a causal-LM export -> a generation graph (docs/models.md,
"Importing for generation").

The export (input_ids [batch, seq] -> logits [batch, seq, vocab], both dims
dynamic, no past_key_values) is imported at sequence length 1, where the
batch dim counts token rows: each row is one token of some sequence at
some position. Then:

- every attention must be causal: at sequence length 1 every mask is
  trivial, so the attentions are matched at a probe length (PROBE_SEQ) too,
  and each must be causal there;
- each attention becomes kv_attention over two states (k_cache.i,
  v_cache.i [S, Hkv, L, D]), its k/v taken before any repeat_kv expand;
- constants that depend on the position (GPT-2's position embedding row,
  Llama's RoPE cos/sin) were folded at position 0: the position-only
  subgraph computing each is evaluated at sequence length L (rows 0..L-1),
  checked against direct evaluations at shorter lengths, and replaced by an
  embedding lookup of the position_ids input;
- the logits end in the greedy chain argmax -> all_reduce max ->
  argmax_index -> view [B] (next_token), done by the planner;
- the LM head (the matmul the chain reads, through views and a bias add)
  becomes matmul_rows over a logit_rows input [B] (rows_head, on the
  written graph), so a step computes logits only for the rows that want a
  next token: a prompt's last row, not the others. The head is marked
  "fallback": it runs eagerly, outside the captured graph, where the cuda
  backend can read logit_rows on the host and run the GEMM on the wanted
  rows only (inside a capture it multiplies every row).

selfcheck() then greedy-generates a few tokens with the SPMD NumPy
interpreter (gen_examples.simulate) on the written files and compares them
with a greedy loop of onnxruntime over the export (full recompute)."""
import copy
import os

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from .errors import ImportFailure
from .ir import Node, Value
from .narrow_eval import fold_in_fp32
from .normalize import GatherElements, _graph_inputs, _reads, _skeleton, load_model
from .passes import before_repeat_kv

# The sequence length the attentions' masks are checked at (causal or not).
PROBE_SEQ = 8
# Metadata keys an export may carry its position limit under (HF configs).
LIMIT_KEYS = ("max_position_embeddings", "n_positions")
# The self-check: prompt lengths and new tokens per prompt.
CHECK_PROMPTS, CHECK_TOKENS = (3, 6), 4
INPUT_POS, INPUT_SLOT, OUTPUT = "position_ids", "cache_slot", "next_token"
INPUT_ROWS = "logit_rows"


class Export:
    """The export's interface: ids input, its sequence dim's name, logits."""

    def __init__(self, path):
        self.path = path
        self.model, self.weights = load_model(path)
        ins = _graph_inputs(self.model)
        pre = "--generate: %s: " % path
        if len(ins) != 1:
            raise ImportFailure(pre + "inputs %s: a generation graph is fed the token ids alone (every token row "
                                "is a real token: no attention_mask): export with input_ids only"
                                % ", ".join(i.name for i in ins))
        if ins[0].type.tensor_type.elem_type != onnx.TensorProto.INT64:
            raise ImportFailure(pre + "input '%s' is %s: expected INT64 token ids [batch, seq]"
                                % (ins[0].name, onnx.TensorProto.DataType.Name(ins[0].type.tensor_type.elem_type)))
        dims = ins[0].type.tensor_type.shape.dim
        self.ids = ins[0].name
        if len(dims) != 2 or dims[0].HasField("dim_value"):
            raise ImportFailure(pre + "input '%s' is not [batch, seq] with a dynamic batch dim" % self.ids)
        if dims[1].HasField("dim_value") or not dims[1].dim_param:
            raise ImportFailure(pre + "no dynamic sequence dim: input '%s' dim 1 is fixed at %d: export with a dynamic "
                                "seq dim (torch.onnx.export dynamic_shapes {1: seq})" % (self.ids, dims[1].dim_value))
        self.seq = dims[1].dim_param
        outs = self.model.graph.output
        odims = outs[0].type.tensor_type.shape.dim if len(outs) == 1 else []
        if len(odims) != 3 or not odims[2].HasField("dim_value"):
            raise ImportFailure(pre + "expected one output (logits [batch, seq, vocab]), found %s"
                                % ", ".join(o.name for o in outs))
        self.vocab = int(odims[2].dim_value)
        meta = {p.key: p.value for p in self.model.metadata_props}
        self.limit = next((int(meta[k]) for k in LIMIT_KEYS if k in meta and meta[k].isdigit()), None)

    def evaluate(self, seq, names):
        """The values of `names` (tensors that do not depend on the ids'
        values) at batch 1 and sequence length seq, evaluated with onnx's
        reference evaluator over the nodes computing them; also the rows of
        the initializer tables they gather along axis 0 (learned positions)."""
        model = copy.deepcopy(self.model)
        for d in _graph_inputs(model)[0].type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.dim_value = seq if d.dim_param == self.seq else 1
        skel = _skeleton(model, self.weights, self.path)
        nodes = list(skel.graph.node)
        prod = {o: k for k, n in enumerate(nodes) for o in n.output}
        keep, stack = set(), list(names)
        while stack:
            k = prod.get(stack.pop())
            if k is not None and k not in keep:
                keep.add(k)
                stack.extend(_reads(nodes[k]))
        cone = [nodes[k] for k in sorted(keep)]
        reads = {t for n in cone for t in _reads(n)}
        rows = [self.weights[n.input[0]].shape[0] for n in cone
                if n.op_type == "Gather" and n.input[0] in self.weights and self.weights[n.input[0]].ndim == 2
                and next((a.i for a in n.attribute if a.name == "axis"), 0) == 0]
        graph = helper.make_graph(cone, "positions", [i for i in skel.graph.input if i.name in reads],
                                  [helper.make_empty_tensor_value_info(t) for t in names],
                                  [t for t in skel.graph.initializer if t.name in reads])
        sub = helper.make_model(graph, opset_imports=skel.opset_import, ir_version=skel.ir_version,
                                functions=skel.functions)
        feeds = {}
        for i in graph.input:
            if i.name in self.weights:
                feeds[i.name] = self.weights[i.name]
            else:
                shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
                feeds[i.name] = np.zeros(shape, helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
        try:
            ev = fold_in_fp32(ReferenceEvaluator(sub, new_ops=[GatherElements]))
            vals = ev.run(list(names), feeds)
        except Exception as e:
            raise ImportFailure("--generate: %s: evaluating the position-dependent constants %s at sequence length %d "
                                "failed: %s" % (self.path, ", ".join(names), seq, str(e).strip().splitlines()[0]))
        return [np.asarray(v) for v in vals], rows


def probe_causal(export, plan_attention):
    """{attention node name: causal} of the import at PROBE_SEQ tokens (or
    the position limit, when smaller and known)."""
    seq = min(PROBE_SEQ, export.limit or PROBE_SEQ)
    return {n.name: bool(n.attrs.get("causal")) for n in plan_attention(seq) if n.op == "attention"}


# -- position-dependent constants ------------------------------------------------

def _position_dim(name, short, longer, seq):
    """The dim along which `name` (shape `short` at length 1) has one entry
    per position (size seq in `longer`); refuses any other dependence."""
    if short.shape == longer.shape:
        return None
    diff = [k for k, (a, b) in enumerate(zip(short.shape, longer.shape)) if a != b]
    if short.ndim != longer.ndim or len(diff) != 1 or short.shape[diff[0]] != 1 or longer.shape[diff[0]] != seq:
        raise ImportFailure("--generate: constant '%s' is %s at sequence length 1 and %s at %d: not one row per "
                            "position, so it cannot be looked up by position" % (name, list(short.shape),
                                                                                 list(longer.shape), seq))
    return diff[0]


def position_tables(export, nm, prog, max_len):
    """-> ({param: (table [L, n], position dim)}, the export's position
    limit or None). max_len None: the limit; no tables when neither is
    known (the caller refuses)."""
    cands = sorted(p for p in prog.params if p in nm.producer and p not in nm.initializers)
    if not cands:
        return {}, export.limit
    at2, _ = export.evaluate(2, cands)
    dims = {}
    for name, v in zip(cands, at2):
        k = _position_dim(name, nm.const[name], v, 2)
        if k is None and not np.array_equal(v, nm.const[name], equal_nan=True):
            raise ImportFailure("--generate: constant '%s' changes with the sequence length but not per position"
                                % name)
        if k is not None:
            dims[name] = k
    if not dims:
        return {}, export.limit
    names = sorted(dims)
    _, rows = export.evaluate(1, names)
    limit = export.limit if export.limit is not None else (min(rows) if rows else None)
    if max_len is not None and limit is not None and max_len > limit:
        raise ImportFailure("--max-seq-len %d: above the model's position limit %d (its position table's rows)"
                            % (max_len, limit))
    L = max_len if max_len is not None else limit
    if L is None:
        return {}, None
    full, _ = export.evaluate(L, names)
    # rows 0, 1, the middle and the last, each from its own evaluation at that length
    direct = {0: [nm.const[n] for n in names], 1: at2}
    if L // 2 + 1 not in (1, 2, L):
        direct[L // 2] = export.evaluate(L // 2 + 1, names)[0]
    tables = {}
    for j, n in enumerate(names):
        k = dims[n]
        if full[j].shape[k] != L:
            raise ImportFailure("--generate: constant '%s' has %d rows at sequence length %d"
                                % (n, full[j].shape[k], L))
        table = np.moveaxis(full[j], k, 0).reshape(L, -1)
        for p, vals in direct.items():
            got = np.take(vals[j], [vals[j].shape[k] - 1], axis=k).reshape(-1)
            if p < L and not np.allclose(table[p], got, rtol=1e-6, atol=1e-6):
                raise ImportFailure("--generate: constant '%s': its row for position %d at sequence length %d differs "
                                    "from its value at length %d: not a per-position table" % (n, p, L, p + 1))
        tables[n] = (np.ascontiguousarray(table), k)
    return tables, limit


def _lookup(prog, name, table, pos_input):
    """Replaces param `name` by embedding(position_ids, table) reshaped to
    [B, ...] so it broadcasts against its users as the constant did."""
    shape = prog.values[name].shape
    users = [n for n in prog.nodes if name in n.inputs]
    ranks = {len(u.shape) for u in users}
    if len(ranks) != 1 or any(u.bdim != 0 for u in users):
        raise ImportFailure("--generate: position-dependent constant '%s' %s: its users %s are not all "
                            "[batch, ...] of one rank" % (name, list(shape), ", ".join(u.name for u in users)))
    rank = ranks.pop()
    b = prog.values[pos_input].shape[0]
    if rank > len(shape):
        out = (b,) + (1,) * (rank - 1 - len(shape)) + tuple(shape)
    elif shape[0] == 1:
        out = (b,) + tuple(shape[1:])
    else:
        raise ImportFailure("--generate: position-dependent constant '%s' %s has no broadcast dim 0 for the token rows"
                            % (name, list(shape)))
    dt = prog.values[name].datatype
    tname = prog.add_param(name + ".by_position", table.astype(prog.params[name].dtype), dt)
    emb = Node(name + ".at_position", "embedding", [pos_input, tname], {}, (b, table.shape[1]), 0, dt)
    view = Node(name + ".rows", "reshape", [emb.name], {}, out, 0, dt)
    first = min(prog.nodes.index(u) for u in users)
    prog.nodes[first:first] = [emb, view]
    prog.values[emb.name], prog.values[view.name] = emb, view
    for u in users:
        u.inputs = [view.name if i == name else i for i in u.inputs]
    return tname


# -- attention -> kv_attention -------------------------------------------------

def to_kv_attention(prog, causal, max_len):
    """Each attention -> kv_attention over two new states; -> [state Values]."""
    states, layer = [], 0
    slot_in, pos_in = INPUT_SLOT, INPUT_POS
    for n in prog.nodes:
        if n.op != "attention":
            continue
        if len(n.inputs) > 3:
            raise ImportFailure("--generate: attention '%s' takes a key-padding mask: not supported" % n.name)
        if not causal.get(n.name, False):
            raise ImportFailure("--generate: attention '%s' is not causal (at sequence length %d a query sees later "
                                "keys, or its mask is not one this importer reads as causal): only causal LMs generate"
                                % (n.name, PROBE_SEQ))
        q, k, v = n.inputs
        heads = prog.values[q].shape[1]
        k0, v0 = before_repeat_kv(prog, k, heads), before_repeat_kv(prog, v, heads)
        _, hkv, _, dim = prog.values[k0].shape
        if prog.values[v0].shape != prog.values[k0].shape:
            raise ImportFailure("--generate: attention '%s': k %s and v %s differ after repeat_kv"
                                % (n.name, list(prog.values[k0].shape), list(prog.values[v0].shape)))
        dt = prog.values[q].datatype
        pair = []
        for kind in ("k", "v"):
            s = Value("%s_cache.%d" % (kind, layer), ("S", hkv, max_len, dim), None, dt)
            states.append(s)
            prog.values[s.name] = s
            pair.append(s.name)
        n.op, n.inputs = "kv_attention", [q, k0, v0] + pair + [slot_in, pos_in]
        n.attrs = {a: x for a, x in n.attrs.items() if a == "scale"}
        layer += 1
    if not layer:
        raise ImportFailure("--generate: no attention matched: nothing reads a KV cache")
    return states


def make_generation(export, nm, prog, causal, max_len):
    """The program at sequence length 1 -> the generation program, in
    place; -> (the "generate" block, the states, the position tables'
    params, which the plan keeps replicated)."""
    if export.limit is not None and max_len is not None and max_len > export.limit:
        raise ImportFailure("--max-seq-len %d: above the model's position limit %d" % (max_len, export.limit))
    tables, limit = position_tables(export, nm, prog, max_len)
    L = max_len if max_len is not None else limit
    if L is None:
        raise ImportFailure("--generate: %s: the model's position limit is not in the export (no position table, no "
                            "metadata %s): give --max-seq-len" % (export.path, " or ".join(LIMIT_KEYS)))
    b = prog.inputs[0].shape[0]
    for name in (INPUT_POS, INPUT_SLOT):
        if name in prog.values:
            raise ImportFailure("--generate: the export already has a tensor named '%s'" % name)
        prog.add_input(Value(name, (b,), 0, "INT64"))
    replicate = [_lookup(prog, n, t, INPUT_POS) for n, (t, _) in sorted(tables.items())]
    states = to_kv_attention(prog, causal, L)
    prog.prune()
    return {"input_ids": export.ids, "positions": INPUT_POS, "slots": INPUT_SLOT, "next_token": OUTPUT,
            "max_seq_len": int(L), "vocab_size": export.vocab}, states, replicate


def rows_head(graph):
    """The built generation graph's LM head -> matmul_rows over a new input
    logit_rows (INT64 [B], replicated), named in its "generate" block; in
    place. The head is the matmul by a 2-d weight that the argmax reads
    through views, reshapes and a bias add. Without one (another head) the
    graph stays as it is: every row computes its logits, as correct."""
    taken = {t["name"] for k in ("inputs", "params", "nodes", "states") for t in graph.get(k, [])}
    if INPUT_ROWS in taken:
        raise ImportFailure("--generate: the graph already has a value named '%s'" % INPUT_ROWS)
    nodes = {n["name"]: n for n in graph["nodes"]}
    params = {p["name"]: p for p in graph["params"]}
    v = next(n for n in graph["nodes"] if n["op"] == "argmax")["inputs"][0]
    while v in nodes:
        n = nodes[v]
        if n["op"] in ("view", "reshape"):
            v = n["inputs"][0]
        elif n["op"] == "add" and sum(i in params for i in n["inputs"]) == 1:
            v = next(i for i in n["inputs"] if i not in params)
        elif n["op"] == "matmul" and len(params.get(n["inputs"][1], {}).get("shape", ())) == 2:
            n["op"] = "matmul_rows"
            n["inputs"].append(INPUT_ROWS)
            n["fallback"] = True  # eager: the cuda backend reads the mask and skips rows
            graph["inputs"].append({"name": INPUT_ROWS, "datatype": "INT64", "shape": ["B"], "placement": "replicate"})
            graph["generate"]["logit_rows"] = INPUT_ROWS
            return True
        else:
            break
    return False


# -- the self-check -------------------------------------------------------------

def _ort_session(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _ort_greedy(sess, ids_name, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        logits = sess.run(None, {ids_name: np.array([seq], np.int64)})[0][0, -1]
        seq.append(int(np.argmax(logits)))
    return seq[len(prompt):]


def graph_greedy(out_json, prompts, n):
    """Greedy tokens of the written generation graph (NumPy SPMD emulation
    of the engine's FP32 arithmetic): every prompt prefilled in one shared
    step (the token rows of every prompt, plus one padding row of slot 0 as
    a bucket would add), then one decode step per token for all sequences
    at once. With logit_rows, only each prompt's last row and the decode
    rows want a token (the other prompt rows and the padding skip the
    head)."""
    import json
    from gen_examples import init_states, load_safetensors, simulate
    with open(out_json) as f:
        gj = json.load(f)
    params = load_safetensors(os.path.join(os.path.dirname(out_json) or ".", gj["weights"]))
    gen = gj["generate"]
    states, loaded = init_states(gj, len(prompts), "emulate"), {}

    def step(rows):
        ids, pos, slot, want = (np.array([r[k] for r in rows] + [0], np.int64) for k in range(4))
        inputs = {gen["input_ids"]: ("I64", ids.reshape(-1, 1)), gen["positions"]: ("I64", pos),
                  gen["slots"]: ("I64", slot)}
        if "logit_rows" in gen:
            inputs[gen["logit_rows"]] = ("I64", want)
        return simulate(gj, params, inputs, "emulate", states, loaded)[gen["next_token"]][1].astype(np.int64)

    rows = [(t, p, s + 1, int(p == len(pr) - 1)) for s, pr in enumerate(prompts) for p, t in enumerate(pr)]
    out = step(rows)
    ends = np.cumsum([len(p) for p in prompts]) - 1
    got = [[int(out[e])] for e in ends]
    for _ in range(n - 1):
        out = step([(g[-1], len(pr) + len(g) - 1, s + 1, 1) for s, (pr, g) in enumerate(zip(prompts, got))])
        for s, g in enumerate(got):
            g.append(int(out[s]))
    return got


def selfcheck(out_json, export, gen):
    """Greedy tokens of the written graph == onnxruntime's; raises if not."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ImportFailure("--generate: the self-check needs onnxruntime (scripts/deps.sh installs it)")
    L, rng = gen["max_seq_len"], np.random.default_rng(53)
    lens = [max(1, min(n, L - CHECK_TOKENS)) for n in CHECK_PROMPTS]
    prompts = [rng.integers(0, gen["vocab_size"], n).tolist() for n in lens]
    tokens = min(CHECK_TOKENS, L - max(lens) + 1)  # the last fed token sits at position L - 1 at most
    got = graph_greedy(out_json, prompts, tokens)
    sess = _ort_session(export.path)
    for p, g in zip(prompts, got):
        want = _ort_greedy(sess, export.ids, p, tokens)
        if g != want:
            raise ImportFailure("--generate self-check: prompt %s: the written graph generates %s, a greedy loop of "
                                "onnxruntime over the export %s" % (p, g, want))
