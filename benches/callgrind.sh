#!/usr/bin/env bash
# Instructions per request (the primary overhead figure): runs examples/bench_requests under
# `valgrind --tool=callgrind` at two request counts for every variant, and reports
#   (instructions(N2) − instructions(N1)) / (N2 − N1)
# so the setup (runtime, router, coordinator) cancels out. Deterministic: the same binary gives
# the same counts run after run. Heap allocations per request are counted the same way, with
# `valgrind --tool=dhat`.
#
# Usage: benches/callgrind.sh [variant ...]   (default: the in-process variants, a hyper- and
#        a tcp- selection, and the guards; see examples/bench_requests.rs)
# Env:   N1 (default 2000), N2 (default 12000)
# Env:   CALLGRIND_CODEGEN_UNITS (default 1): codegen units of the measured build. With one,
#        whether a wrapper (axum's `MapIntoResponse::call`, the layer's `call`) is inlined into
#        its caller follows its cost alone; with the release default (16) it also depends on
#        which codegen unit each generic instance lands in, a partition that moves with
#        unrelated code and was seen to add or take ±60 instructions per request to one variant
#        and not another. `CALLGRIND_CODEGEN_UNITS=16` measures the default profile.
# Needs: valgrind. Takes about 15 minutes with the default list on 2 cores (the hyper- and tcp-
#        variants run ~3× more instructions per request), plus the build (~4 minutes the first
#        time: its own target directory, target/callgrind-cgu<N>).
#
# Prints the raw counts, then the counting cost: each counting middleware's instructions and
# allocations per request over a no-op layer applied the same way (`noop` under
# `Router::layer`, `noop-outer` around the whole router), and that cost divided by the floor's
# (`floor`: a bare atomic counter with a Notify, guard released when the response head is
# ready). `floor-body` is the same guard held until the body ends: floor-body − floor is what
# body-scoped counting costs by itself. `floor-body-arc` is floor-body with the counter behind an
# `Arc` (a reference count per guard and per service clone) instead of leaked.
set -euo pipefail
cd "$(dirname "$0")/.."

N1="${N1:-2000}"
N2="${N2:-12000}"
counting=(floor floor-body floor-body-arc semaphore inflight tasktracker graceful from_fn lameduck
    lameduck-named)
if [ "$#" -gt 0 ]; then
    variants=("$@")
else
    inproc=(plain noop floor floor-body floor-body-arc semaphore inflight tasktracker graceful
        from_fn lameduck lameduck-named noop-outer floor-outer floor-body-outer
        floor-body-arc-outer semaphore-outer inflight-outer lameduck-outer lameduck-named-outer)
    over=(plain noop floor floor-body semaphore inflight lameduck noop-outer floor-outer
        floor-body-outer inflight-outer lameduck-outer)
    variants=("${inproc[@]}" "${over[@]/#/hyper-}"
        tcp-plain tcp-noop tcp-floor tcp-floor-body tcp-inflight tcp-lameduck tcp-plain-lserve
        tcp-lameduck-lserve tcp-noop-outer tcp-floor-outer tcp-floor-body-outer tcp-inflight-outer
        tcp-lameduck-outer
        guard-lameduck guard-floor guard-floor-arc guard-tasktracker guard-semaphore guard-graceful)
fi
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 1; }

cgu="${CALLGRIND_CODEGEN_UNITS:-1}"
export CARGO_TARGET_DIR="target/callgrind-cgu$cgu"
CARGO_PROFILE_RELEASE_CODEGEN_UNITS="$cgu" cargo build --quiet --release --example bench_requests
bin="$CARGO_TARGET_DIR/release/examples/bench_requests"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Total instructions executed (callgrind's "Collected" line) for one run, and those of them
# spent inside glibc's allocator (functions of malloc.c and arena.c), separated by a space.
instructions() {
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.out" "$bin" "$1" "$2" \
        >/dev/null 2>"$out/log"
    local total alloc
    total=$(awk '/Collected :/ { print $NF }' "$out/log")
    alloc=$(callgrind_annotate --threshold=100 "$out/cg.out" 2>/dev/null |
        awk '$0 ~ /\.\/malloc\/\.\/malloc\/(malloc|arena)\.c:/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')
    echo "$total $alloc"
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
echo "$(valgrind --version), $(rustc --version), release profile with codegen-units=$cgu"
echo
printf '| %-24s | %12s | %10s | %14s | %14s |\n' variant "instr/op" "allocs/op" "I(N1)" "I(N2)"
printf '|%s|%s:|%s:|%s:|%s:|\n' "--------------------------" "-------------" "-----------" \
    "---------------" "---------------"
# per: instructions per op; pa: the same outside glibc's allocator; al: allocations per op.
declare -A per pa al
for v in "${variants[@]}"; do
    read -r i1 a1 <<<"$(instructions "$v" "$N1")"
    read -r i2 a2 <<<"$(instructions "$v" "$N2")"
    per[$v]=$(per_op "$i1" "$i2")
    pa[$v]=$(per_op "$((i1 - a1))" "$((i2 - a2))")
    al[$v]=$(per_op "$(allocations "$v" "$N1")" "$(allocations "$v" "$N2")")
    printf '| %-24s | %12s | %10s | %14s | %14s |\n' "$v" "${per[$v]}" "${al[$v]}" "$i1" "$i2"
done

# "$1 − $2" with a sign, or "–" if either is missing.
diff_of() {
    if [ -n "$1" ] && [ -n "$2" ]; then
        awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f", a - b }'
    else
        printf '–'
    fi
}

# "$1 ÷ $2", or "–".
ratio_of() {
    if [ -n "$1" ] && [ -n "$2" ] && [ "$1" != "–" ] && [ "$2" != "–" ]; then
        awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "–"; else printf "%.2f", a / b }'
    else
        printf '–'
    fi
}

# The counting cost over the no-op layer, in both placements, from the figures in the array
# named $2 (per or pa), for the variants with prefix $1; $3 says what the figures are.
cost_table() {
    local prefix="$1" what="$3"
    local -n fig="$2"
    local noop="${fig[${prefix}noop]:-}" noop_outer="${fig[${prefix}noop-outer]:-}"
    [ -n "$noop" ] || [ -n "$noop_outer" ] || return 0
    local floor floor_outer
    floor=$(diff_of "${fig[${prefix}floor]:-}" "$noop")
    floor_outer=$(diff_of "${fig[${prefix}floor-outer]:-}" "$noop_outer")
    echo
    echo "Counting cost ${prefix:-in-process }($what per request over ${prefix}noop / ${prefix}noop-outer, and allocations; ÷ floor):"
    echo
    printf '| %-16s | %14s | %8s | %8s | %18s | %8s | %8s |\n' middleware "Router::layer" "÷ floor" allocs \
        "around the router" "÷ floor" allocs
    printf '|%s|%s:|%s:|%s:|%s:|%s:|%s:|\n' "------------------" "----------------" "----------" \
        "----------" "--------------------" "----------" "----------"
    local c inner outer
    for c in "${counting[@]}"; do
        inner=$(diff_of "${fig[${prefix}${c}]:-}" "$noop")
        outer=$(diff_of "${fig[${prefix}${c}-outer]:-}" "$noop_outer")
        [ "$inner" != "–" ] || [ "$outer" != "–" ] || continue
        printf '| %-16s | %14s | %8s | %8s | %18s | %8s | %8s |\n' "$c" \
            "$inner" "$(ratio_of "$inner" "$floor")" \
            "$(diff_of "${al[${prefix}${c}]:-}" "${al[${prefix}noop]:-}")" \
            "$outer" "$(ratio_of "$outer" "$floor_outer")" \
            "$(diff_of "${al[${prefix}${c}-outer]:-}" "${al[${prefix}noop-outer]:-}")"
    done
}

for prefix in "" "hyper-" "tcp-"; do
    cost_table "$prefix" per instructions
done
# Over TCP the run includes the runtime, the client and glibc's allocator, whose path per
# allocation moves with the sizes of the blocks in play (seen: ±150 instructions per request
# between two variants that allocate the same blocks): the same table without the allocator,
# beside the allocation counts.
cost_table tcp- pa "instructions outside glibc's allocator"

# Servers over TCP: what `lameduck::serve` adds over `axum::serve`.
if [ -n "${per[tcp-plain]:-}" ]; then
    echo
    printf '| %-24s | %22s | %10s |\n' "tcp- variant" "added over tcp-plain" "allocs"
    printf '|%s|%s:|%s:|\n' "--------------------------" "-----------------------" "-----------"
    for v in "${variants[@]}"; do
        case "$v" in tcp-*) ;; *) continue ;; esac
        printf '| %-24s | %22s | %10s |\n' "$v" "$(diff_of "${per[$v]}" "${per[tcp-plain]}")" \
            "$(diff_of "${al[$v]}" "${al[tcp-plain]}")"
    done
fi
