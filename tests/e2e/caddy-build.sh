#!/usr/bin/env bash
# Builds Caddy, the third L7 proxy of the end-to-end tests (tests/e2e/routers.rs), from the Go
# module proxy into a cache directory outside the repository, and reuses it while the version
# below is unchanged. Prints the binary's path on stdout (progress on stderr).
#
#   bash tests/e2e/caddy-build.sh        # LAMEDUCK_CADDY_DIR overrides the directory
#
# Needs Go (/usr/local/go/bin is searched) and the Go module proxy. Cold: about 2 minutes on 2
# cores (downloads included); warm: nothing to do.
set -euo pipefail
version=v2.11.9
export PATH=$PATH:/usr/local/go/bin
out=${LAMEDUCK_CADDY_DIR:-/var/cache/lameduck-caddy/$version}
if [ -x "$out/caddy" ]; then
  echo "caddy-build.sh: reusing $out/caddy" >&2
  echo "$out/caddy"
  exit 0
fi
command -v go >/dev/null || { echo "caddy-build.sh: no go in PATH or /usr/local/go/bin" >&2; exit 1; }
mkdir -p "$out"
echo "caddy-build.sh: building Caddy $version into $out" >&2
GOBIN="$out.tmp" go install "github.com/caddyserver/caddy/v2/cmd/caddy@$version" >&2
mv "$out.tmp/caddy" "$out/caddy"
rmdir "$out.tmp" 2>/dev/null || true
echo "$out/caddy"
