#!/bin/sh
# docs/configuration.md's key table and the code's key table agree: every key
# of keys[] in server/config.c (the *_KEY(name, ...) rows) and of
# config/default.json has a row, and every row names a key the code has.
# Then the check proves itself on copies: a key added to the code without
# its row, and a row without its key, must each fail naming the key.
# Usage: sh tests/static/config_doc.sh   (from the repository root)
CONFIG_C=${CONFIG_C:-server/config.c}
DEFAULT_JSON=${DEFAULT_JSON:-config/default.json}
CONFIG_DOC=${CONFIG_DOC:-docs/configuration.md}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# The names in keys[] = { ... }; (one per *_KEY( row, #define lines skipped).
code_keys() {
    awk '/^static const key_desc keys\[\] *= *\{/ {on=1; next} on && /^\};/ {on=0} on' "$1" |
        grep -v '^[[:space:]]*#' | tr '\n' ' ' |
        grep -oE '[A-Z0-9]+_KEY\([[:space:]]*[a-z_][a-z0-9_]*' | sed 's/.*(//; s/[[:space:]]//g'
}
json_keys() { grep -oE '"[a-z_][a-z0-9_]*"[[:space:]]*:' "$1" | sed 's/"//g; s/[[:space:]]*://'; }
# The first cell of each row between the config-table markers: | `name` | ...
doc_keys() {
    awk '/<!-- config-table/ {on=1; next} /<!-- \/config-table -->/ {on=0} on' "$1" |
        grep -oE '^\|[[:space:]]*`[a-z_][a-z0-9_]*`[[:space:]]*\|' | sed 's/[|` ]//g'
}

# check CONFIG_C DEFAULT_JSON DOC: prints one line per disagreement, exits 1 on any
check() {
    code_keys "$1" | sort -u >"$tmp/code"
    json_keys "$2" | sort -u >"$tmp/json"
    doc_keys "$3" | sort >"$tmp/doc.all"
    sort -u "$tmp/doc.all" >"$tmp/doc"
    bad=0
    if [ ! -s "$tmp/code" ]; then echo "no keys found in $1 (keys[] = { ... *_KEY(name, ...) ... })"; return 1; fi
    if [ ! -s "$tmp/doc" ]; then echo "no key rows found in $3 (between the config-table markers)"; return 1; fi
    for k in $(comm -23 "$tmp/code" "$tmp/doc"); do
        echo "key '$k' is in $1 but has no row in $3"; bad=1
    done
    for k in $(comm -23 "$tmp/json" "$tmp/doc"); do
        echo "key '$k' is in $2 but has no row in $3"; bad=1
    done
    for k in $(comm -23 "$tmp/doc" "$tmp/code"); do
        echo "row '$k' in $3 names a key $1 does not have"; bad=1
    done
    for k in $(uniq -d "$tmp/doc.all"); do
        echo "key '$k' has more than one row in $3"; bad=1
    done
    return $bad
}

fail=0
if out=$(check "$CONFIG_C" "$DEFAULT_JSON" "$CONFIG_DOC"); then
    echo "ok: $CONFIG_DOC has a row for each of the $(wc -l <"$tmp/code") keys of $CONFIG_C and no other"
else
    printf 'FAIL: %s\n' "$out" | sed '2,$s/^/FAIL: /'
    fail=1
fi

# The check must catch a key added to the code without a row ...
sed 's/^\(static const key_desc keys\[\] *= *{\)$/\1\n    INT_KEY(zz_undocumented_probe, 0, 1, "probe"),/' "$CONFIG_C" >"$tmp/config.c"
out=$(check "$tmp/config.c" "$DEFAULT_JSON" "$CONFIG_DOC")
if printf '%s' "$out" | grep -q "key 'zz_undocumented_probe' is in"; then
    echo "ok: a key added to the code without its row fails: $(printf '%s\n' "$out" | grep -m1 zz_undocumented_probe)"
else
    echo "FAIL: a key added to a copy of $CONFIG_C without its row was not caught"; fail=1
fi
# ... and a row for a key the code does not have.
sed 's/^<!-- \/config-table -->$/| `zz_stale_probe` | `--zz-stale-probe` | int | `0` | probe |\n&/' "$CONFIG_DOC" >"$tmp/doc.md"
out=$(check "$CONFIG_C" "$DEFAULT_JSON" "$tmp/doc.md")
if printf '%s' "$out" | grep -q "row 'zz_stale_probe'"; then
    echo "ok: a row without its key fails: $(printf '%s\n' "$out" | grep -m1 zz_stale_probe)"
else
    echo "FAIL: a row naming no key in a copy of $CONFIG_DOC was not caught"; fail=1
fi
exit $fail
