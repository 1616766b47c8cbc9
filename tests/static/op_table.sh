#!/bin/sh
# The op table fails closed at build time: an op added to TP_OP_LIST
# without its descriptor does not compile (ops.c), and a shape or batch-rows
# rule added without its case in the engine's exhaustive switches fails
# -Wswitch-enum (shapes.c, plan_rows.c). Each check edits a copy of engine/
# and compiles one file; the unedited copy must compile first.
# Usage: CC=cc sh tests/static/op_table.sh   (from the repository root)
CC=${CC:-cc}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0

# compile FILE EXPECT: EXPECT "ok" or a string the compiler error must name
compile() {
    out=$($CC -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wswitch-enum -I"$tmp" -I"$tmp/engine" -Iutil -Ikernels \
          -fsyntax-only "$tmp/engine/$1" 2>&1)
    rc=$?
    if [ "$2" = ok ]; then
        [ $rc -eq 0 ] || { echo "FAIL: unedited engine/$1 does not compile: $out"; fail=1; }
    elif [ $rc -eq 0 ] || ! printf '%s' "$out" | grep -q "$2"; then
        echo "FAIL: engine/$1 compiled (or failed without naming $2) after the edit"; fail=1
    else
        echo "ok: engine/$1 refuses to build: $(printf '%s' "$out" | grep -m1 "$2")"
    fi
}

fresh() { rm -rf "$tmp/engine"; cp -r engine "$tmp/engine"; }

fresh
for f in ops.c shapes.c plan_rows.c; do compile $f ok; done

fresh
sed -i 's/^#define TP_OP_LIST(X) \\$/#define TP_OP_LIST(X) X(BOGUS) \\/' "$tmp/engine/ops.h"
compile ops.c desc_BOGUS

fresh
sed -i 's/TP_SHAPE_UNSET = 0,/TP_SHAPE_UNSET = 0, TP_SHAPE_BOGUS,/' "$tmp/engine/ops.h"
compile shapes.c TP_SHAPE_BOGUS

fresh
sed -i 's/TP_ROWS_UNSET = 0,/TP_ROWS_UNSET = 0, TP_ROWS_BOGUS,/' "$tmp/engine/ops.h"
compile plan_rows.c TP_ROWS_BOGUS

exit $fail
