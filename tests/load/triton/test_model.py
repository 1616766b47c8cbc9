#!/usr/bin/env python3
"""test_model.py GRAPHS_DIR TPSERVE_CONFIG.json OUT_DIR

The bench's Triton model without Triton (tests/integration/test_triton_model.sh
runs it): make_repo.py writes the repository for the SP MLP graphs from
tpserve's configuration, and model.py, driven through a stand-in for Triton's
triton_python_backend_utils, reproduces each graph's reference output
(GRAPH.ref.safetensors for GRAPH.inputs.safetensors, the rows split over
two requests as the dynamic batcher hands them) within the graph's manifest
tolerance; graphs it cannot model are refused.

Prints PASS/FAIL lines; exit status 0 when all pass.
"""
import contextlib
import importlib.util
import io
import json
import os
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
import compare  # noqa: E402
import make_repo  # noqa: E402


def fake_pb_utils():
    """The three names of triton_python_backend_utils model.py uses."""
    pb = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    class InferenceResponse:
        def __init__(self, output_tensors):
            self.output_tensors = output_tensors

    pb.Tensor = Tensor
    pb.InferenceResponse = InferenceResponse
    pb.get_input_tensor_by_name = lambda request, name: request[name]
    return pb


def load_model(path):
    sys.modules["triton_python_backend_utils"] = fake_pb_utils()
    spec = importlib.util.spec_from_file_location("triton_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_graph(graphs, name, cfg, out, rtol):
    """None when the generated model answers the reference, else why not."""
    cfg_path = os.path.join(out, name + ".config.json")
    with open(cfg_path, "w") as f:
        json.dump(dict(cfg, name=name), f)
    if make_repo.main(["make_repo.py", graphs, name, cfg_path, out]) != 0:
        return "make_repo refused it"
    with open(os.path.join(out, name, "config.pbtxt")) as f:
        pbtxt = f.read()
    expect = ['name: "%s"' % name, 'backend: "python"', "max_batch_size: %d" % cfg["max_batch_size"],
              'name: "x" data_type: TYPE_FP32 dims: [ 8, 32 ]', "dynamic_batching {"]
    missing = [e for e in expect if e not in pbtxt]
    if missing:
        return "config.pbtxt lacks %s" % missing
    model = load_model(os.path.join(out, name, "1", "model.py")).TritonPythonModel()
    # What Triton hands initialize(): the config as JSON, the repository, the version.
    model.initialize({"model_config": json.dumps(dict(cfg, name=name, parameters={
        "gelu_approximate": {"string_value": "none"}})),
        "model_repository": os.path.join(out, name), "model_version": "1"})
    x = compare.load(os.path.join(graphs, name + ".inputs.safetensors"))["x"][1]
    ref = compare.load(os.path.join(graphs, name + ".ref.safetensors"))["y"][1]
    pb = sys.modules["triton_python_backend_utils"]
    responses = model.execute([{"x": pb.Tensor("x", x[:1])}, {"x": pb.Tensor("x", x[1:])}])
    if len(responses) != 2:
        return "%d responses to 2 requests" % len(responses)
    y = np.concatenate([r.output_tensors[0].array for r in responses])
    if y.dtype != np.float32 or y.shape != ref.shape:
        return "answer is %s %s, reference %s %s" % (y.dtype, y.shape, ref.dtype, ref.shape)
    err = compare.rel_err(y.astype(np.float64), ref.astype(np.float64))
    return None if err <= rtol else "err %.3e > rtol %.1e" % (err, rtol)


def main(argv):
    if len(argv) != 4:
        print("usage: " + __doc__.split("\n")[0], file=sys.stderr)
        return 2
    graphs, cfg_path, out = argv[1:]
    os.makedirs(out, exist_ok=True)
    with open(cfg_path) as f:
        cfg = json.load(f)
    with open(os.path.join(graphs, "manifest.json")) as f:
        rtol = {g["name"]: g["rtol"] for g in json.load(f)["graphs"]}
    failed = 0

    def check(ok, what):
        nonlocal failed
        print("%s: %s" % ("PASS" if ok else "FAIL", what))
        failed += not ok

    for name in ("mlp_sp_tp2", "mlp_sp_tp4"):
        why = run_graph(graphs, name, cfg, out, rtol[name])
        check(why is None, "%s: the NumPy model answers the reference%s" % (name, ": " + why if why else ""))
    for name, cfg_name, why in (("megatron_block_tp2", "megatron_block_tp2", "not the sequence-parallel MLP"),
                                ("mlp_sp_fp16_tp2", "mlp_sp_fp16_tp2", "the NumPy model is FP32 only"),
                                ("mlp_sp_tp4", "mlp_sp_tp2", "is the configuration of 'mlp_sp_tp2'")):
        cfg_named = os.path.join(out, cfg_name + ".config.json")
        with open(cfg_named, "w") as f:
            json.dump(dict(cfg, name=cfg_name), f)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = make_repo.main(["make_repo.py", graphs, name, cfg_named, out])
        msg = err.getvalue().strip()
        check(rc == 1 and why in msg and "\n" not in msg,
              "%s with %s's configuration is refused in one line: %s" % (name, cfg_name, msg))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
