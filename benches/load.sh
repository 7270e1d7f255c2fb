#!/usr/bin/env bash
# Load benchmark over real sockets: the hello-world server (examples/bench_server) on
# 127.0.0.1, pinned to CPU 0; wrk pinned to CPU 1. Variants are interleaved round by round
# (A B C … A B C …, the starting variant rotating each round), so slow drifts of a shared machine
# hit every variant alike; each variant's ratio to `plain` is taken within the same round.
#
# Usage: benches/load.sh [variant ...]
#   default variants: plain plain-lserve lameduck-lserve lameduck from_fn inflight tasktracker
#                     semaphore graceful   (see examples/bench_server.rs)
# Env:   ROUNDS (default 7), SECS per run (default 4), CONNS (default 64), PORT (default 18080)
# Needs: wrk (Debian: apt-get install wrk), taskset (util-linux), python3, 2 CPUs.
# Default run: 9 variants × 7 rounds × 4 s ≈ 4.5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-7}"
SECS="${SECS:-4}"
CONNS="${CONNS:-64}"
PORT="${PORT:-18080}"
if [ "$#" -gt 0 ]; then
    variants=("$@")
else
    variants=(plain plain-lserve lameduck-lserve lameduck from_fn inflight tasktracker semaphore graceful)
fi
for tool in wrk taskset python3; do
    command -v "$tool" >/dev/null || { echo "load.sh: $tool is not installed" >&2; exit 1; }
done

cargo build --quiet --release --example bench_server
bin=target/release/examples/bench_server
results="target/load-results.tsv"
mkdir -p target
: >"$results"

server=""
stop_server() {
    if [ -n "$server" ]; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=""
    fi
}
trap stop_server EXIT

wait_for_port() {
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "load.sh: server did not listen on $PORT within 10 s" >&2
    return 1
}

n=${#variants[@]}
echo "load: ${n} variants × ${ROUNDS} rounds × ${SECS} s, wrk -t1 -c${CONNS}, server on CPU 0, wrk on CPU 1"
for round in $(seq 1 "$ROUNDS"); do
    for i in $(seq 0 $((n - 1))); do
        v=${variants[$(((i + round - 1) % n))]}
        taskset -c 0 "$bin" "$v" "127.0.0.1:$PORT" 2>/dev/null &
        server=$!
        wait_for_port
        rps=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" "http://127.0.0.1:$PORT/" |
            awk '/^Requests\/sec:/ { print $2 }')
        stop_server
        printf '%s\t%s\t%s\n' "$round" "$v" "$rps" >>"$results"
        printf '  round %d  %-16s %10s req/s\n' "$round" "$v" "$rps"
    done
done

python3 - "$results" "${variants[@]}" <<'PY'
import statistics, sys
path, order = sys.argv[1], sys.argv[2:]
runs = {}
for line in open(path):
    rnd, v, rps = line.split("\t")
    runs.setdefault(v, {})[int(rnd)] = float(rps)
plain = runs.get("plain", {})
print()
print("| variant | median req/s | min–max req/s | ratio to plain (median) | ratio min–max |")
print("|---|---:|---:|---:|---:|")
for v in order:
    r = runs[v]
    vals = sorted(r.values())
    ratios = sorted(r[k] / plain[k] for k in r if k in plain)
    ratio = f"{statistics.median(ratios):.3f}" if ratios else "–"
    span = f"{ratios[0]:.3f}–{ratios[-1]:.3f}" if ratios else "–"
    print(f"| {v} | {statistics.median(vals):,.0f} | {vals[0]:,.0f}–{vals[-1]:,.0f} | {ratio} | {span} |")
PY
