#!/usr/bin/env python3
"""Hostile tpgraph files (issue 16) and what tpserve must answer for each.

    hostile_graphs.py write DIR      writes every case (graph JSON, weights,
                                     inputs) into DIR
    hostile_graphs.py check DIR      runs `tpserve plan` and `tpserve run` on
                                     each case written there (TPSERVE) and
                                     checks the answer

Each case is a graph the loader used to accept, or a weights file it used to
trip on, with the crash it caused.  Every run must end within a time bound
with exit 1 and exactly one stderr line naming the node (or input, param,
file) and the reason -- or exit 0 for a case that is valid and must simply
run.  A sanitizer report anywhere is a failure.  The JSON files double as
seeds for the graph fuzz harness (tests/fuzz/fuzz_graph.c)."""
import json, os, stat, struct, subprocess, sys

TPSERVE = os.environ.get("TPSERVE", "build/tpserve")
INT64_MAX = 2**63 - 1
DT_ST = {"FP32": ("F32", 4), "INT64": ("I64", 8)}


def st_write(path, tensors):
    """tensors: [(name, datatype, shape, raw bytes)] -> a safetensors file."""
    hdr, off, blob = {}, 0, b""
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": DT_ST[dt][0], "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def graph(name, inputs, nodes, outputs, params=(), weights=None, world=1):
    g = {"format": "tpgraph", "version": 1, "name": name, "world_size": world,
         "inputs": inputs, "params": list(params), "outputs": [{"name": o, "placement": "replicate"}
                                                               for o in outputs], "nodes": nodes}
    if weights:
        g["weights"] = weights
    return g


def inp(name, shape, dt="FP32"):
    return {"name": name, "datatype": dt, "shape": shape, "placement": "replicate"}


def node(name, op, inputs, **attrs):
    return {"name": name, "op": op, "inputs": inputs, "attrs": attrs}


X = [inp("x", ["B", 4])]
# name -> (graph, expected exit, phrases the one stderr line must hold)
CASES = {
    # shapes.c: start + length overflowed and passed the bounds check;
    # copy_rec then read outside the tensor (heap-buffer-overflow).
    "slice_start_int64_max": (graph("h", X, [node("s", "slice", ["x"], dim=1, start=INT64_MAX, length=1),
                                             node("y", "contiguous", ["s"])], ["y"]),
                              1, ["node 's' (slice)", "runs past dim of size 4"]),
    "slice_length_int64_max": (graph("h", X, [node("s", "slice", ["x"], dim=1, start=1, length=INT64_MAX),
                                              node("y", "contiguous", ["s"])], ["y"]),
                               1, ["node 's' (slice)", "runs past dim"]),
    # resolve_shape multiplied the target dims unchecked.
    "view_size_overflow": (graph("h", X, [node("v", "view", ["x"], shape=[2**32, 2**32, 2**32, -1]),
                                          node("y", "relu", ["v"])], ["y"]),
                           1, ["node 'v' (view)", "cannot view input"]),
    "reshape_zero_times_huge": (graph("h", [inp("x", ["B", 0])],
                                      [node("v", "reshape", ["x"], shape=[0, 2**40, 2**40]),
                                       node("y", "relu", ["v"])], ["y"]),
                                1, ["node 'v' (reshape)", "cannot view input"]),
    # numel of an input shape overflowed in plan (tensor.c, shapes.c).
    "input_numel_overflow": (graph("h", [inp("x", ["B", 2**31, 2**31, 2**31])], [node("y", "relu", ["x"])], ["y"]),
                             1, ["input 'x'", "more than 2^48 elements"]),
    # a product of accepted inputs whose strides would overflow.
    "matmul_output_overflow": (graph("h", [inp("a", ["B", 2**30, 1]), inp("b", [1, 2**30])],
                                     [node("y", "matmul", ["a", "b"])], ["y"]),
                               1, ["node 'y' (matmul)", "more than 2^48 elements"]),
    # zero-size dims: memcpy(NULL) and NULL + 0 in the engine's staging.
    "zero_size_dim": (graph("h", [inp("x", ["B", 0])], [node("y", "relu", ["x"])], ["y"]), 0, []),
    # exec.c held a cat's inputs in tp_tensor ins[20] while the loader
    # allowed 64: 21..64 inputs overflowed the stack. The op table's
    # maximum sizes the buffer now: 24 and 64 run, 65 is refused by name.
    "cat_24_inputs": (graph("h", X, [node("y", "cat", ["x"] * 24, dim=1)], ["y"]), 0, []),
    "cat_64_inputs": (graph("h", X, [node("y", "cat", ["x"] * 64, dim=1)], ["y"]), 0, []),
    "cat_65_inputs": (graph("h", X, [node("y", "cat", ["x"] * 65, dim=1)], ["y"]),
                      1, ["node 'y'", "op 'cat' takes 1..64 inputs, got 65"]),
    # weights: a FIFO blocked open() forever; a truncated file read past
    # the end of its mapping (SIGBUS).
    "weights_fifo": (graph("h", X, [node("y", "add", ["x", "w"])], ["y"],
                           params=[inp("w", [4])], weights="weights_fifo.safetensors"),
                     1, ["weights_fifo.safetensors", "not a regular file"]),
    "weights_truncated": (graph("h", X, [node("y", "add", ["x", "w"])], ["y"],
                                params=[inp("w", [4])], weights="weights_truncated.safetensors"),
                          1, ["weights_truncated.safetensors", "tensor 'w'", "run past the end of the file"]),
}


def write(d):
    os.makedirs(d, exist_ok=True)
    for name, (g, _, _) in CASES.items():
        json.dump(g, open(os.path.join(d, name + ".json"), "w"))
    fifo = os.path.join(d, "weights_fifo.safetensors")
    if os.path.exists(fifo):
        os.unlink(fifo)
    os.mkfifo(fifo)
    full = os.path.join(d, "weights_truncated.safetensors")
    st_write(full, [("w", "FP32", [4], struct.pack("<4f", 1, 2, 3, 4))])
    os.truncate(full, os.path.getsize(full) - 4)
    st_write(os.path.join(d, "x1.safetensors"), [("x", "FP32", [1, 4], struct.pack("<4f", 1, 2, 3, 4))])
    st_write(os.path.join(d, "x0.safetensors"), [("x", "FP32", [1, 0], b"")])


def run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", ""


def check(d):
    bad = 0
    for name, (g, want_rc, phrases) in CASES.items():
        path = os.path.join(d, name + ".json")
        x = "x0" if name == "zero_size_dim" else "x1"
        for cmd in ([TPSERVE, "plan", path, "--batch", "1"],
                    [TPSERVE, "run", path, "--inputs", os.path.join(d, x + ".safetensors"),
                     "--output", os.path.join(d, "out.safetensors")]):
            rc, err = run(cmd)
            lines = err.strip().splitlines()
            ok = rc == want_rc and "Sanitizer" not in err and "runtime error" not in err and \
                (want_rc == 0 or (len(lines) == 1 and all(p in lines[0] for p in phrases)))
            print(f"{'ok  ' if ok else 'FAIL'} {name:26s} {cmd[1]:4s} exit {rc}: {lines[0] if lines else ''}")
            if not ok:
                bad += 1
                print(err[-2000:])
    print(f"hostile graphs: {len(CASES)} cases x 2 commands, {bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2]))
