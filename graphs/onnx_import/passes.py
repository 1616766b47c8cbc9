"""Clean-ups on the lowered program that keep it exact."""
import numpy as np


def _fold_flatten_matmul(prog, uses):
    """reshape [..., K] -> [M, K]; matmul W; [add bias]; reshape -> [..., N]
    is one matmul on the unflattened tensor (tpgraph's matmul takes
    [..., M, K]): fewer copies, and an all_gather feeding it stays adjacent
    to the matmul so fuse_tp can fuse them."""
    for r1 in list(prog.nodes):
        if r1.op != "reshape":
            continue
        x = prog.values[r1.inputs[0]]
        if len(x.shape) < 3 or r1.shape != (int(np.prod(x.shape[:-1])), x.shape[-1]):
            continue
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
        if not chain or len(us) != 1 or us[0].op != "reshape" or us[0].shape != x.shape[:-1] + (t.shape[-1],):
            continue
        r2 = us[0]
        chain[0].inputs[0] = x.name
        for n in chain:
            n.shape, n.bdim = r2.shape, x.bdim
        prog.replace_uses(r2.name, t.name)
        prog.nodes = [n for n in prog.nodes if n is not r1 and n is not r2]
        uses.clear()
        uses.update(prog.consumers())


def simplify(prog):
    _fold_flatten_matmul(prog, prog.consumers())
    prog.prune()
