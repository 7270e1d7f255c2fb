#!/usr/bin/env bash
# Validates the Kubernetes manifests in examples/k8s offline against the API schemas bundled in
# the PyPI package kubernetes-validate. Strict: an unknown or misspelt field is an error, not a
# silently ignored key. Consistency between the manifests (grace period, env, ports) is checked
# by `cargo test --test k8s_manifests`.
#
# Usage: .ci/k8s-validate.sh [manifest.yaml ...]   (default: examples/k8s/*.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned, so a new release cannot change the verdict under us.
PACKAGE_VERSION=1.37.0
# The oldest Kubernetes minor still in common use that the manifests must work on, and the
# newest schema the package bundles.
KUBERNETES_VERSIONS=(1.29.0 1.37.0)

venv="${LAMEDUCK_K8S_VENV:-target/k8s-validate-venv}"
if [ ! -x "$venv/bin/kubernetes-validate" ] ||
    ! "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$PACKAGE_VERSION"; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "kubernetes-validate==$PACKAGE_VERSION"
fi

if [ "$#" -gt 0 ]; then
    manifests=("$@")
else
    manifests=(examples/k8s/*.yaml)
fi
for version in "${KUBERNETES_VERSIONS[@]}"; do
    "$venv/bin/kubernetes-validate" --strict --kubernetes-version "$version" "${manifests[@]}"
done
echo "k8s-validate: ${#manifests[@]} manifests valid for Kubernetes ${KUBERNETES_VERSIONS[*]}"
