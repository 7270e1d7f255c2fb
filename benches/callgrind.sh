#!/usr/bin/env bash
# Instructions per request (the primary overhead figure): runs examples/bench_requests under
# `valgrind --tool=callgrind` at two request counts for every variant, and reports
#   (instructions(N2) − instructions(N1)) / (N2 − N1)
# so the setup (runtime, router, coordinator) cancels out. Deterministic: the same binary gives
# the same counts run after run. Heap allocations per request are counted the same way, with
# `valgrind --tool=dhat`.
#
# Usage: benches/callgrind.sh [variant ...]   (default: every request, hyper- and guard variant;
#        see examples/bench_requests.rs)
# Env:   N1 (default 2000), N2 (default 12000)
# Needs: valgrind. Takes a few minutes (the hyper- variants run ~10× more instructions).
set -euo pipefail
cd "$(dirname "$0")/.."

N1="${N1:-2000}"
N2="${N2:-12000}"
if [ "$#" -gt 0 ]; then
    variants=("$@")
else
    layers=(plain lameduck lameduck-outer atomic-outer atomic from_fn tasktracker semaphore graceful inflight)
    variants=("${layers[@]}" "${layers[@]/#/hyper-}"
        tcp-plain tcp-plain-lserve tcp-lameduck-lserve tcp-lameduck-outer tcp-atomic-outer
        tcp-lameduck tcp-atomic tcp-inflight
        guard-lameduck guard-atomic guard-tasktracker guard-semaphore guard-graceful)
fi
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 1; }

cargo build --quiet --release --example bench_requests
bin=target/release/examples/bench_requests
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Total instructions executed (callgrind's "Collected" line) for one run.
instructions() {
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.out" "$bin" "$1" "$2" \
        >/dev/null 2>"$out/log"
    awk '/Collected :/ { print $NF }' "$out/log"
}

# Heap blocks allocated (dhat's "Total: … bytes in N blocks") for one run.
allocations() {
    valgrind --tool=dhat --dhat-out-file=/dev/null "$bin" "$1" "$2" >/dev/null 2>"$out/log"
    awk '/Total:/ { gsub(",", "", $6); print $6 }' "$out/log"
}

per_op() {
    awk -v a="$1" -v b="$2" -v n1="$N1" -v n2="$N2" 'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }'
}

echo "per request or guard: (X(N2) − X(N1)) / (N2 − N1), N1=$N1, N2=$N2"
echo "$(valgrind --version), $(rustc --version)"
echo
printf '| %-24s | %12s | %10s | %14s | %14s |\n' variant "instr/op" "allocs/op" "I(N1)" "I(N2)"
printf '|%s|%s:|%s:|%s:|%s:|\n' "--------------------------" "-------------" "-----------" \
    "---------------" "---------------"
declare -A per
for v in "${variants[@]}"; do
    i1=$(instructions "$v" "$N1")
    i2=$(instructions "$v" "$N2")
    per[$v]=$(per_op "$i1" "$i2")
    allocs=$(per_op "$(allocations "$v" "$N1")" "$(allocations "$v" "$N2")")
    printf '| %-24s | %12s | %10s | %14s | %14s |\n' "$v" "${per[$v]}" "$allocs" "$i1" "$i2"
done

# Overhead of each middleware over the bare router (in-process, through hyper, over TCP).
for prefix in "" "hyper-" "tcp-"; do
    base="${prefix}plain"
    [ -n "${per[$base]:-}" ] || continue
    echo
    printf '| %-24s | %22s | %14s |\n' "layer" "added over ${base}" "${base} ÷ layer"
    printf '|%s|%s:|%s:|\n' "--------------------------" "-----------------------" "---------------"
    for v in "${variants[@]}"; do
        case "$v" in "$base" | guard-*) continue ;; esac
        if [ -z "$prefix" ]; then case "$v" in hyper-* | tcp-*) continue ;; esac; fi
        case "$v" in "$prefix"*) ;; *) continue ;; esac
        printf '| %-24s | %22s | %14s |\n' "$v" \
            "$(awk -v a="${per[$v]}" -v p="${per[$base]}" 'BEGIN { printf "%+.1f", a - p }')" \
            "$(awk -v a="${per[$v]}" -v p="${per[$base]}" 'BEGIN { printf "%.3f", p / a }')"
    done
done
