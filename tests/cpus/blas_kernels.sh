#!/bin/sh
# blas_kernels.sh BLAS_CORE — one line for a benchmark's header: the
# OpenBLAS kernel set this environment runs (BLAS_CORE is make's
# blas_core), and, when OPENBLAS_CORETYPE forces it, the set this CPU would
# get without it. The set moves the engine's GEMMs a lot (AVX2 against
# AVX-512 kernels: the example graph's step 3.0 against 2.3 us on a Zen 4),
# and onnxruntime or a user's machine picks its own.
got=$("$1")
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    echo "OpenBLAS kernels $got, forced by OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE in the environment (this CPU's own: $(env -u OPENBLAS_CORETYPE "$1"))."
else
    echo "OpenBLAS kernels $got (what OpenBLAS detects here)."
fi
