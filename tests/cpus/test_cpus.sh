#!/bin/sh
# make test-cpus: the numeric tests under each CPU kernel set OpenBLAS has.
#
# OpenBLAS picks GEMM kernels by CPU (and by matrix size), so a test that
# passes on one machine can fail on another (issue 11: an AMD EPYC). A
# DYNAMIC_ARCH OpenBLAS runs another CPU's kernels when OPENBLAS_CORETYPE
# names it, so one machine can run the suite as Prescott, Haswell, Zen, ...
# A core type is skipped when this CPU lacks its instructions (it would die
# of SIGILL, which says nothing about our code) or when this OpenBLAS build
# does not have it (openblas_get_corename answers another name).
#
# Products by FP32 weights run tpserve's own packed kernel where the CPU has
# AVX2 and FMA (kernels/cpu/packed_gemm.h), whatever OpenBLAS's kernels: so
# the core-type rows run with TPSERVE_CPU_GEMM=openblas, every product on
# that core type's kernels, as a CPU without AVX2 would; a row "packed"
# runs the default (OpenBLAS's own pick for the rest). Where the CPU has
# AVX-512 the packed kernel runs two panels at once in AVX-512 registers; a
# last row, "packed-avx2", runs its AVX2 kernel there (TPSERVE_CPU_GEMM_AVX2),
# as a CPU without AVX-512 would.
#
# Env: BUILD (build dir), TP_GRAPHS, TPSERVE, PYTHON. Prints one line per
# core type; exits 1 if any ran and failed.
set -u
BUILD=${BUILD:-build}
TP_GRAPHS=${TP_GRAPHS:-$BUILD/graphs}
TPSERVE=${TPSERVE:-$BUILD/tpserve}
PYTHON=${PYTHON:-python3}
HERE=$(dirname "$0")
TESTS="engine exec cpu_ops small_gemm pass_fuse_tp pass_choose_collectives pass_place_symmetric collectives cpu_shared batcher"
# core type : CPU flags its kernels need (from /proc/cpuinfo)
CORES="Prescott:pni Nehalem:sse4_2 Sandybridge:avx Haswell:avx2,fma Zen:avx2,fma SkylakeX:avx512f,avx512bw,avx512vl,avx512dq Cooperlake:avx512f,avx512bw,avx512vl,avx512_bf16"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
fail=0
printf '%-12s %-7s %-34s %-10s %s\n' "core type" result "unit suites (checks, failures)" "examples" "max row-alone vs batch (FP32, FP16/BF16)"
for entry in $CORES packed:avx2,fma packed-avx2:avx512f; do
    core=${entry%%:*}
    gemm=openblas
    case "$core" in packed*) gemm="" ;; esac
    missing=""
    for f in $(echo "${entry#*:}" | tr ',' ' '); do
        case "$flags" in *" $f "*) ;; *) missing="$missing $f" ;; esac
    done
    if [ -n "$missing" ]; then
        printf '%-12s %s\n' "$core" "skipped: this CPU lacks$missing"
        continue
    fi
    # the packed row leaves OpenBLAS its own pick: an env entry that changes nothing
    cenv="OPENBLAS_CORETYPE=$core"
    if [ "$core" = packed ]; then cenv="TP_CPUS_ROW=packed"; fi
    if [ "$core" = packed-avx2 ]; then cenv="TPSERVE_CPU_GEMM_AVX2=1"; fi
    got=$(env "$cenv" "$BUILD/tools/blas_core")
    if [ -n "$gemm" ] && [ "$(echo "$got" | tr A-Z a-z)" != "$(echo "$core" | tr A-Z a-z)" ]; then
        printf '%-12s %s\n' "$core" "skipped: this OpenBLAS runs $got kernels when asked for $core"
        continue
    fi
    checks=0; failures=0; suites=0; bad=""
    : >"$TMP/unit.log"
    for t in $TESTS; do
        env "$cenv" TPSERVE_CPU_GEMM=$gemm CK_FORK=yes TP_GRAPHS=$TP_GRAPHS TPSERVE=$TPSERVE TP_REPORT_BATCH_DIFF=1 \
            "$BUILD/tests/test_$t" >"$TMP/$t.log" 2>&1
        rc=$?
        cat "$TMP/$t.log" >>"$TMP/unit.log"
        line=$(grep -E '^[0-9]+%: Checks:' "$TMP/$t.log")
        c=$(echo "$line" | sed -n 's/.*Checks: \([0-9]*\).*/\1/p')
        f=$(echo "$line" | sed -n 's/.*Failures: \([0-9]*\), Errors: \([0-9]*\).*/\1 \2/p')
        suites=$((suites + 1)); checks=$((checks + ${c:-0}))
        nf=$(( $(echo "${f:-0 0}" | cut -d' ' -f1) + $(echo "${f:-0 0}" | cut -d' ' -f2) ))
        failures=$((failures + nf))
        [ "$rc" -eq 0 ] && [ -n "$line" ] || bad="$bad $t"
    done
    ex_ok=0; ex_n=0
    for entry2 in $($PYTHON -c "import json,sys; m=json.load(open(sys.argv[1])); print(' '.join(g['name']+':'+repr(g['rtol']) for g in m['graphs']))" "$TP_GRAPHS/manifest.json"); do
        name=${entry2%%:*}; rtol=${entry2##*:}; ex_n=$((ex_n + 1))
        if env "$cenv" TPSERVE_CPU_GEMM=$gemm "$TPSERVE" run "$TP_GRAPHS/$name.json" --inputs "$TP_GRAPHS/$name.inputs.safetensors" \
               --output "$TMP/$name.out" --backend cpu 2>>"$TMP/unit.log" &&
           $PYTHON "$HERE/../integration/compare.py" "$TMP/$name.out" "$TP_GRAPHS/$name.ref.safetensors" "$rtol" >>"$TMP/unit.log"; then
            ex_ok=$((ex_ok + 1))
        else
            bad="$bad example:$name"
        fi
    done
    diffs=$(awk '/^batch-diff / { d = $3 + 0; if ($2 ~ /fp16|bf16/) { if (d > h) h = d } else if (d > f) f = d }
                 END { printf "%.2g, %.2g", f, h }' "$TMP/unit.log")
    result=ok
    if [ -n "$bad" ]; then result=FAILED; fail=1; fi
    printf '%-12s %-7s %-34s %-10s %s\n' "$core" "$result" "$suites suites ($checks checks, $failures failed)" "$ex_ok/$ex_n" "$diffs"
    if [ -n "$bad" ]; then
        echo "    failed:$bad"
        grep -E ':F:|:E:|FAIL' "$TMP/unit.log" | head -5 | sed 's/^/    /'
    fi
done
exit $fail
