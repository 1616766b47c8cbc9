"""FP16/BF16 in onnx's reference evaluator: accumulations in FP32.

onnx (>= 1.17) runs BFLOAT16 tensors as ml_dtypes.bfloat16 arrays and
FLOAT16 as numpy's float16, with the op's numpy code in that dtype. For
elementwise ops that is one rounding of the FP32 result (ml_dtypes computes
its ufuncs in float32), but reductions accumulate in BF16 itself: the sum
of 1000 ones is 256 (257 is not a BF16), a ReduceMean of 4096 values near 1
is off by 87%, a Softmax by 14x. FP16 is rounded at places an FP32
accumulation would not round (CumSum, LayerNormalization, Softmax).
NumPy's float16 matmul sums in FP32 but has no BLAS: 180 M multiply-adds
a second, so evaluating an FP16 GPT-2 small at the two probe batches took
9 minutes of an import that takes 10 s in FP32.

fold_in_fp32(ev) makes the evaluator's ops that accumulate (the reductions,
CumSum, softmax, the normalizations and the products) widen FP16/BF16 inputs to FP32 and
round their result once to the input's dtype: what torch's CPU kernels and
tpserve's (graphs/README.md: FP16/BF16 accumulate in FP32) do, so folded
constants are the values the exported model computes. Every other op keeps
onnx's implementation."""
import ml_dtypes
import numpy as np

NARROW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
# op type -> the outputs of the input's float type (the others, such as
# LayerNormalization's Mean and InvStdDev, have the stash type: FP32)
ACCUMULATING = {
    "ReduceSum": (0,), "ReduceMean": (0,), "ReduceSumSquare": (0,), "ReduceProd": (0,), "ReduceL1": (0,),
    "ReduceL2": (0,), "ReduceLogSum": (0,), "ReduceLogSumExp": (0,), "CumSum": (0,), "Softmax": (0,),
    "LogSoftmax": (0,), "LayerNormalization": (0,), "GroupNormalization": (0,), "InstanceNormalization": (0,),
    "MeanVarianceNormalization": (0,), "RMSNormalization": (0,), "MatMul": (0,), "Gemm": (0,),
}


def _widening(run, outs):
    def wrapped(*args, **kwargs):
        narrow = {np.asarray(a).dtype for a in args if isinstance(a, np.ndarray) and a.dtype in NARROW}
        if len(narrow) != 1:
            return run(*args, **kwargs)
        dt = narrow.pop()
        res = run(*[a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == dt else a for a in args], **kwargs)
        return tuple(np.asarray(r).astype(dt) if k in outs and r is not None and np.asarray(r).dtype == np.float32
                     else r for k, r in enumerate(res))
    return wrapped


def fold_in_fp32(ev):
    """Patches a ReferenceEvaluator's accumulating ops (see the module doc)."""
    for node in ev.rt_nodes_:
        outs = ACCUMULATING.get(node.op_type)
        if outs is not None:
            node._run = _widening(node._run, outs)
    return ev
