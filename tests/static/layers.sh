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

# Public headers: what server/ may use of the engine (the engine API), and
# what kernels/ may use (the kernel API). Everything else in engine/ is
# internal; a source including it is named here.
engine_api="engine.h dtype.h tensor.h mem_kind.h backend_settings.h rank_group.h safetensors.h io_check.h"
# io_check.h: a decoder (the KServe codec) checks a request against the
# model with the engine's own check and messages while it decodes.
# rank_group.h: a backend whose creation is collective (cuda: the NCCL join)
# runs it as timed steps of the group, so one rank failing fails them all.
kernel_api="backend.h backend_settings.h ops.h tensor.h dtype.h reassembly.h rank_group.h"
# only_public DIR API: DIR's quoted includes are its own, util's, or in API
only_public() {
    bad=0
    for f in "$1"/*.c "$1"/*.h "$1"/*/*.c "$1"/*/*.h "$1"/*/*.cu; do
        [ -f "$f" ] || continue
        for h in $(sed -n 's/^#include "\(.*\)"/\1/p' "$f"); do
            [ -f "$(dirname "$f")/$h" ] || [ -f "$1/$h" ] || [ -f "util/$h" ] && continue
            case " $2 " in *" $h "*) ;; *) echo "FAIL: $f includes engine-internal $h"; bad=1; fail=1 ;; esac
        done
    done
    [ $bad -eq 0 ] && echo "ok: $1/ includes only the public engine headers ($2)"
}
only_public server "$engine_api"
only_public kernels "$kernel_api"
exit $fail
