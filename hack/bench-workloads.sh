#!/usr/bin/env bash
# Issue 35's benchmark (docs/benchmarks.md, "Tenant workloads"): tenant pods through capn's
# syncer, on booted tenants, the real kube-scheduler and the test kit's node.
#
#   hack/bench-workloads.sh [TENANTS] [PODS] [FLOOD]          release build (default 3 tenants ×
#                                                             10 pods, a flood of 1,000 pending pods)
#   hack/bench-workloads.sh --debug [TENANTS] [PODS] [FLOOD]  debug build
#
# Needs what hack/test.sh needs (root, iproute2, iptables, the Kubernetes binaries of
# hack/kube-assets.sh); prints the report and exits non-zero when anything breaks.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
if [ "${1:-}" = "--debug" ]; then
  profile=debug
  shift
fi
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  KUBEBUILDER_ASSETS="$(hack/kube-assets.sh)"
  export KUBEBUILDER_ASSETS
fi
release_dir="$(dirname "$(readlink -f "$KUBEBUILDER_ASSETS/kube-apiserver")")"
for b in kube-scheduler kube-proxy agnhost; do
  [ -x "$release_dir/$b" ] || { echo "ERROR: $release_dir/$b is missing (run hack/kube-assets.sh)" >&2; exit 1; }
done
if [ "$profile" = release ]; then
  exec cargo bench --locked --bench workloads -- "$@"
else
  exec cargo test --locked --bench workloads -- "$@"
fi
