#!/usr/bin/env python3
"""Mutation fuzzing of the loader and engine: take the example graphs, apply
random structural mutations (drop keys, swap values, duplicate nodes, add
unknown keys), and run `tpserve plan` / `tpserve run` on them. Every run must
end in exit 0 or 1 with a one-line reason: never a crash, a sanitizer report
or a hang.  Use the ASan build:  make fuzz  (or TPSERVE=... ITER=...)."""
import copy, glob, json, os, random, shutil, subprocess, sys, tempfile

TPSERVE = os.environ.get("TPSERVE", "build/asan/tpserve")
GRAPHS = os.environ.get("TP_GRAPHS", "build/asan/graphs")
ITER = int(os.environ.get("ITER", "200"))
VALUES = [0, -1, 1, 2, 3, 7, 64, -100, 10**12, "B", "x", None, True, [], {}, [1, 2],
          "shard(0)", "shard(9)", "replicate", 1.5, "FP16", "matmul"]


def mutate(o, rng):
    if isinstance(o, dict) and o:
        k = rng.choice(list(o))
        r = rng.random()
        if r < 0.15:
            del o[k]
        elif r < 0.3:
            o[k] = rng.choice(VALUES)
        elif r < 0.35:
            o[k + "_x"] = 1
        else:
            mutate(o[k], rng)
    elif isinstance(o, list) and o:
        i = rng.randrange(len(o))
        r = rng.random()
        if r < 0.15:
            del o[i]
        elif r < 0.3:
            o[i] = rng.choice(VALUES)
        elif r < 0.4:
            o.insert(i, copy.deepcopy(o[rng.randrange(len(o))]))
        elif r < 0.43:
            # a long list: node arity past a fixed-size buffer (a 24-input
            # cat once overflowed the executor's stack) or past the op table
            o.extend(copy.deepcopy(o[i]) for _ in range(rng.choice([23, 63, 64, 70])))
        else:
            mutate(o[i], rng)


def main():
    rng = random.Random(int(os.environ.get("SEED", "1")))
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(f"{GRAPHS}/*_tp*.json"))
    if not names:
        sys.exit(f"no graphs in {GRAPHS} (run make graphs)")
    tmp = tempfile.mkdtemp()
    for f in glob.glob(f"{GRAPHS}/*.safetensors"):
        shutil.copy(f, tmp)
    bad = 0
    for it in range(ITER):
        name = rng.choice(names)
        g = json.load(open(f"{GRAPHS}/{name}.json"))
        for _ in range(rng.randint(1, 4)):
            mutate(g, rng)
        path = os.path.join(tmp, "m.json")
        json.dump(g, open(path, "w"))
        cmd = [TPSERVE, "plan", path, "--batch", str(rng.choice([1, 2, 3, 4]))] if it % 2 else \
              [TPSERVE, "run", path, "--inputs", os.path.join(tmp, f"{name}.inputs.safetensors"),
               "--output", os.path.join(tmp, "o.st")] + rng.choice([[], ["--no-passes"], ["--eager"]])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        lines = p.stderr.strip().splitlines()
        if p.returncode not in (0, 1) or "Sanitizer" in p.stderr or "runtime error" in p.stderr or \
                (p.returncode == 1 and len(lines) != 1):
            bad += 1
            keep = f"fuzz-crash-{bad}.json"
            shutil.copy(path, keep)
            print(f"FAIL: {' '.join(cmd[1:2])} exit {p.returncode}, graph kept in {keep}:\n{p.stderr[-1500:]}")
    shutil.rmtree(tmp)
    print(f"fuzz: {ITER} mutated graphs, {bad} failures")
    sys.exit(1 if bad else 0)


main()
