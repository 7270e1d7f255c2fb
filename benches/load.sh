#!/usr/bin/env bash
# Load benchmark over real sockets: the hello-world server (examples/bench_server) on
# 127.0.0.1, pinned to CPU 0; wrk pinned to CPU 1.
#
# Runs are interleaved and bracketed: each round is  plain V1 plain V2 plain … Vk plain  (the
# order of the Vs rotating each round), and each run of a variant is compared with the mean of
# the two `plain` runs right before and after it, a few seconds apart. A shared machine drifts
# between throughput levels over tens of seconds; a bracket whose two `plain` runs differ by
# more than MAX_DRIFT is discarded (the level changed during it) and counted in the table.
#
# Usage: benches/load.sh [variant ...]
#   default variants: plain-lserve lameduck-lserve lameduck-outer lameduck floor-body from_fn
#                     inflight tasktracker semaphore graceful
#                     (see examples/bench_server.rs; `plain` is implied)
# Env:   ROUNDS (default 6), SECS per run (default 2), CONNS (default 64), PORT (default 18080),
#        MAX_DRIFT (default 0.10)
# Needs: wrk (Debian: apt-get install wrk), taskset (util-linux), python3, 2 CPUs.
# Default run: 6 rounds × 21 runs × 2 s, plus server starts ≈ 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-6}"
SECS="${SECS:-2}"
CONNS="${CONNS:-64}"
PORT="${PORT:-18080}"
MAX_DRIFT="${MAX_DRIFT:-0.10}"
if [ "$#" -gt 0 ]; then
    variants=("$@")
else
    variants=(plain-lserve lameduck-lserve lameduck-outer lameduck floor-body from_fn inflight tasktracker
        semaphore graceful)
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

seq_no=0
run() {
    local round=$1 v=$2 rps
    taskset -c 0 "$bin" "$v" "127.0.0.1:$PORT" 2>/dev/null &
    server=$!
    wait_for_port
    rps=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" "http://127.0.0.1:$PORT/" |
        awk '/^Requests\/sec:/ { print $2 }')
    stop_server
    seq_no=$((seq_no + 1))
    printf '%s\t%s\t%s\t%s\n' "$round" "$seq_no" "$v" "$rps" >>"$results"
    printf '  round %d  %-16s %10s req/s\n' "$round" "$v" "$rps"
}

n=${#variants[@]}
echo "load: plain + ${n} variants, ${ROUNDS} rounds, ${SECS} s per run, wrk -t1 -c${CONNS};" \
    "server on CPU 0, wrk on CPU 1"
for round in $(seq 1 "$ROUNDS"); do
    run "$round" plain
    for i in $(seq 0 $((n - 1))); do
        run "$round" "${variants[$(((i + round - 1) % n))]}"
        run "$round" plain
    done
done

python3 - "$results" "$MAX_DRIFT" "${variants[@]}" <<'PY'
import statistics, sys
path, max_drift, order = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
rows = [line.rstrip("\n").split("\t") for line in open(path)]
rows = [(int(r), int(s), v, float(x)) for r, s, v, x in rows]
rps, ratios, dropped = {}, {}, {}
for i, (rnd, _, v, x) in enumerate(rows):
    rps.setdefault(v, []).append(x)
    if v == "plain":
        continue
    before, after = rows[i - 1][3], rows[i + 1][3]
    if abs(before - after) / max(before, after) > max_drift:
        dropped[v] = dropped.get(v, 0) + 1
        continue
    ratios.setdefault(v, []).append(x / ((before + after) / 2))
print()
print(f"| variant | median req/s | min–max req/s | ratio to plain (median) | ratio min–max | brackets used |")
print("|---|---:|---:|---:|---:|---:|")
for v in ["plain"] + order:
    vals = sorted(rps[v])
    r = sorted(ratios.get(v, []))
    if v == "plain":
        ratio, span, used = "1", "–", "–"
    else:
        ratio = f"{statistics.median(r):.3f}" if r else "–"
        span = f"{r[0]:.3f}–{r[-1]:.3f}" if r else "–"
        used = f"{len(r)}/{len(r) + dropped.get(v, 0)}"
    print(f"| {v} | {statistics.median(vals):,.0f} | {vals[0]:,.0f}–{vals[-1]:,.0f} | {ratio} | {span} | {used} |")
PY
