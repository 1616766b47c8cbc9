"""Triton Python-backend model of the example sequence-parallel MLP
(graphs/gen_examples.py, ex_mlp_sp): y = gelu(x @ w_in) @ w_out on the global
tensors, in FP32 NumPy. make_repo.py puts it in the model repository next to
weights.npz (the graph's weights) and a config.pbtxt copied from tpserve's.

It is written the way a reasonable Python model is: one NumPy pass over all
the requests the dynamic batcher hands it, no per-element Python.
"""
import json
import math
import os

import numpy as np
import triton_python_backend_utils as pb_utils

# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t*(a1 + t*(a2 + ...)) * exp(-z^2),
# t = 1 / (1 + p*|z|), |error| <= 1.5e-7. NumPy has no erf; calling math.erf
# per element would make Triton pay a Python loop tpserve does not, and this
# error is far below the FP32 tolerance the bench checks the answers with.
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(z):
    t = 1.0 / (1.0 + ERF_P * np.abs(z))
    poly = t * (ERF_A[0] + t * (ERF_A[1] + t * (ERF_A[2] + t * (ERF_A[3] + t * ERF_A[4]))))
    return np.sign(z) * (1.0 - poly * np.exp(-z * z))


def gelu_erf(h):
    return 0.5 * h * (1.0 + erf(h * np.float32(1.0 / math.sqrt(2.0))))


def gelu_tanh(h):
    c = np.float32(math.sqrt(2.0 / math.pi))
    return 0.5 * h * (1.0 + np.tanh(c * (h + np.float32(0.044715) * h * h * h)))


GELU = {"none": gelu_erf, "tanh": gelu_tanh}


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        approx = cfg["parameters"]["gelu_approximate"]["string_value"]
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with np.load(os.path.join(version_dir, "weights.npz")) as w:
            self.w_in = w["w_in"].astype(np.float32)
            self.w_out = w["w_out"].astype(np.float32)
        self.gelu = GELU[approx]
        self.input = cfg["input"][0]["name"]
        self.output = cfg["output"][0]["name"]

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, self.input).as_numpy() for r in requests]
        y = (self.gelu(np.concatenate(xs) @ self.w_in) @ self.w_out).astype(np.float32)
        bounds = np.cumsum([len(x) for x in xs])[:-1]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output, part)])
                for part in np.split(y, bounds)]
