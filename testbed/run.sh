#!/usr/bin/env bash
# The kube-proxy datapath testbed, as one command (needs root, iproute2, iptables, nftables,
# conntrack):
#
#   bash testbed/run.sh                 # the whole matrix (about 40 minutes)
#   bash testbed/run.sh table           # every server, iptables, 1 s sync, pooled + dense clients
#   bash testbed/run.sh eviction        # single-replica eviction, every server
#   bash testbed/run.sh bursty          # on/off and burst clients, kube-proxy 6 s and 1 s behind
#   bash testbed/run.sh nodes           # two and three nodes, a kube-proxy each, one slow
#   bash testbed/run.sh cell --server sleep5 --backend nftables --sync-delay 4s --rate 0.5
#   bash testbed/run.sh --timelines table   # also print every deleted Pod's timeline
#   bash testbed/run.sh real cell --server naive   # on the real Kubernetes components
#   bash testbed/run.sh both table      # each cell on the model, then on the real components
#
# `real` and `both` first build (or reuse) kube-apiserver, kube-controller-manager, kube-proxy
# and etcd with testbed/k8s/build.sh (Go; tens of minutes the first time on a 2-core machine).
#
# Builds release binaries of the example service, the baselines (examples/baseline) and the testbed (LAMEDUCK_TESTBED_PROFILE=dev
# for debug ones), then runs `lameduck-testbed` with the arguments given (default `matrix`).
# Files go under target/testbed/<unix-seconds>/, the table to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${LAMEDUCK_TESTBED_PROFILE:-release}
dir=$profile
[ "$profile" = dev ] && dir=debug
stack=()
features=()
if [ "${1:-}" = real ] || [ "${1:-}" = both ]; then
  stack=(--stack "$1" --k8s-bin "$(bash testbed/k8s/build.sh)")
  # `--kube` cells need the service's EndpointWatch; without POD_NAME (the model's Pods) it
  # stays off, so one build serves both stacks.
  features=(--features kube)
  shift
fi
cargo build --profile "$profile" --quiet --example service --example baseline "${features[@]}"
cargo build --profile "$profile" --quiet -p lameduck-testbed
if [ $# -eq 0 ]; then
  set -- matrix
fi
# Global flags (--timelines, --out, ...) stay in front of the command.
globals=()
while [ $# -gt 0 ] && [[ $1 == --* ]]; do
  case $1 in
    --timelines) globals+=("$1"); shift ;;
    *) globals+=("$1" "$2"); shift 2 ;;
  esac
done
[ $# -eq 0 ] && set -- matrix
set -- "${globals[@]}" "${stack[@]}" "$@"
exec "target/$dir/lameduck-testbed" "$@"
