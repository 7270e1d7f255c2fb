#!/usr/bin/env bash
# Feature hygiene: the library builds with no features, with each feature alone, and with all
# of them — so no feature leans on another one it does not enable. Equivalent to
# `cargo hack check --each-feature --no-dev-deps`, without installing cargo-hack.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

# Feature names from Cargo.toml's [features] table (`default` is covered by the plain check).
features=$(awk '
  /^\[features\]/ { on = 1; next }
  /^\[/           { on = 0 }
  on && /^[A-Za-z0-9_-]+[[:space:]]*=/ { sub(/[[:space:]]*=.*/, ""); if ($0 != "default") print }
' Cargo.toml)

# Warnings fail too (an import used only under another feature, say). Checked on the output
# rather than with RUSTFLAGS=-Dwarnings, which would rebuild every dependency.
run() {
  echo "+ cargo check --lib $*"
  local out
  out=$(cargo check --quiet --lib "$@" 2>&1) || { echo "$out"; return 1; }
  if grep -q '^warning' <<<"$out"; then
    echo "$out"
    echo "warnings with: cargo check --lib $*" >&2
    return 1
  fi
}

run --no-default-features
for f in $features; do
  run --no-default-features --features "$f"
done
run
run --all-features

# Intra-doc links to items behind a feature must resolve with that feature off too.
for f in $features; do
  echo "+ cargo doc --no-deps -p lameduck --no-default-features --features $f"
  RUSTDOCFLAGS=-Dwarnings cargo doc --quiet --no-deps -p lameduck --no-default-features --features "$f"
done
echo "features ok: none, $(echo $features | tr ' ' ','), default, all (check; docs for each alone)"
