#!/usr/bin/env bash
# The kube-proxy datapath testbed, as one command (needs root, iproute2, iptables, nftables,
# conntrack):
#
#   bash testbed/run.sh                 # the whole matrix (about 40 minutes)
#   bash testbed/run.sh table           # every server, iptables, 1 s sync, pooled + dense clients
#   bash testbed/run.sh eviction        # single-replica eviction, every server
#   bash testbed/run.sh bursty          # on/off and burst clients, kube-proxy 6 s and 1 s behind
#   bash testbed/run.sh cell --server sleep5 --backend nftables --sync-delay 4s --rate 0.5
#   bash testbed/run.sh --timelines table   # also print every deleted Pod's timeline
#
# Builds release binaries of the example service and the testbed (LAMEDUCK_TESTBED_PROFILE=dev
# for debug ones), then runs `lameduck-testbed` with the arguments given (default `matrix`).
# Files go under target/testbed/<unix-seconds>/, the table to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${LAMEDUCK_TESTBED_PROFILE:-release}
dir=$profile
[ "$profile" = dev ] && dir=debug
cargo build --profile "$profile" --quiet --example service
cargo build --profile "$profile" --quiet -p lameduck-testbed
if [ $# -eq 0 ]; then
  set -- matrix
fi
exec "target/$dir/lameduck-testbed" "$@"
