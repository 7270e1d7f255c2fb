#!/usr/bin/env bash
# Builds the real Kubernetes components the testbed's `real` mode runs — kube-apiserver,
# kube-controller-manager, kube-proxy of the version pinned in go.mod, and the etcd server
# that version pins — into a cache directory outside the repository, and reuses them while
# go.mod and go.sum are unchanged. Prints the directory on stdout (progress on stderr).
#
#   bash testbed/k8s/build.sh            # LAMEDUCK_K8S_BIN overrides the directory
#
# Needs Go (>= the go line of go.mod; /usr/local/go/bin is searched) and the Go module proxy.
# Go's module and build caches stay in their default places, so a second checkout on the same
# machine rebuilds nothing it does not have to.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
export PATH=$PATH:/usr/local/go/bin
version=$(sed -n 's/^[[:space:]]*\(require \)\{0,1\}k8s.io\/kubernetes \(v[0-9.]*\).*/\2/p' go.mod)
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
out=${LAMEDUCK_K8S_BIN:-/var/cache/lameduck-k8s/$version}
stamp=$(cat go.mod go.sum cmd/*/*.go build.sh | sha256sum | cut -c1-16)
bins=(kube-apiserver kube-controller-manager kube-proxy etcd)
ok=1
for b in "${bins[@]}"; do [ -x "$out/$b" ] || ok=0; done
if [ $ok = 1 ] && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build.sh: reusing $out ($version)" >&2
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: no go in PATH or /usr/local/go/bin" >&2; exit 1; }
mkdir -p "$out"
minor=${version#v1.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
start=$(date +%s)
echo "build.sh: building Kubernetes $version and etcd into $out (cold: tens of minutes)" >&2
rm -f "$out/.stamp"
go build -trimpath -ldflags "$ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-proxy \
  ./cmd/etcd
for b in "${bins[@]}"; do [ -x "$out/$b" ] || { echo "build.sh: $out/$b missing after the build" >&2; exit 1; }; done
echo "$stamp" > "$out/.stamp"
echo "build.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
