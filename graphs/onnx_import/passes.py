"""Clean-ups on the lowered program that keep it exact."""
import numpy as np


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


def simplify(prog):
    _fold_flatten_matmul(prog, prog.consumers())
    prog.prune()
