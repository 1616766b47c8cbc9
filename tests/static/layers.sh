#!/bin/sh
# The build's include paths are the layering: each directory compiles with
# the paths of what it may use, so a forbidden include does not compile.
# This shows each rule both ways (an allowed header compiles, a forbidden
# one does not). Run by `make static-checks`, which passes the Makefile's
# INC_* flags; from the repository root.
CC=${CC:-cc}
fail=0
# check LAYER FLAGS HEADER ok|refused
check() {
    if printf '#include "%s"\n' "$3" | $CC -std=c11 -D_GNU_SOURCE $2 -fsyntax-only -x c - >/dev/null 2>&1; then
        got=ok
    else
        got=refused
    fi
    if [ "$got" = "$4" ]; then echo "ok: $1 including $3: $got"; else echo "FAIL: $1 including $3: $got, want $4"; fail=1; fi
}
check util "$INC_util" status.h ok
check util "$INC_util" engine.h refused
check engine "$INC_engine" backend.h ok
check engine "$INC_engine" log.h ok
check engine "$INC_engine" http.h refused
check engine "$INC_engine" cpu/cpu_backend.h refused
check kernels "$INC_kernels" backend.h ok
check kernels "$INC_kernels" log.h ok
check kernels "$INC_kernels" http.h refused
check kernels "$INC_kernels" config.h refused
check server "$INC_server" engine.h ok
check server "$INC_server" cpu/cpu_backend.h refused
check server "$INC_server" cuda/cuda_internal.h refused
exit $fail
