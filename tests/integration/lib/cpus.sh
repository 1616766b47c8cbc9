# cpus.sh — sourced by the scripts that put servers or clients on CPUs of
# their own (tests/integration/test_server.sh, tests/load/bench_http.sh).
# shellcheck shell=sh

# two_cpus: the first two CPUs this shell may run on ("0 1 "), or nothing
# without taskset or a second CPU.
two_cpus() {
    command -v taskset >/dev/null 2>&1 || return 0
    cpus=$(taskset -c -p $$ 2>/dev/null | sed 's/.*: //' | tr ',' '\n' |
        awk -F- '{ for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c }' | head -n 2 | tr '\n' ' ')
    if [ "$(echo "$cpus" | wc -w)" -eq 2 ]; then
        echo "$cpus"
    fi
}
