#!/usr/bin/env bash
# Issue 11's benchmark (docs/benchmarks.md): capn against the API server's floor on one
# fresh super cluster with the audit log on.
#
#   hack/bench.sh N [--steady-seconds S] [--timeout-seconds T] [--keep]   release build
#   hack/bench.sh --debug N ...                                           debug build (CI's smoke run)
#
# Builds capn and the benchmark (`benches/provisioning`), finds or builds the Kubernetes
# binaries like hack/test.sh, and prints the report. Exits non-zero when anything breaks.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
if [ "${1:-}" = "--debug" ]; then
  profile=debug
  shift
fi
if [ $# -lt 1 ]; then
  echo "usage: hack/bench.sh [--debug] N [--steady-seconds S] [--timeout-seconds T] [--keep]" >&2
  exit 2
fi

if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  KUBEBUILDER_ASSETS="$(hack/kube-assets.sh)"
  export KUBEBUILDER_ASSETS
fi
for b in etcd kube-apiserver kube-controller-manager; do
  [ -x "$KUBEBUILDER_ASSETS/$b" ] || { echo "ERROR: $KUBEBUILDER_ASSETS/$b is missing (run hack/kube-assets.sh)" >&2; exit 1; }
done

# `cargo bench` builds capn and the benchmark with the release profile; `cargo test --bench`
# builds both with the debug one. Either way the benchmark runs the capn binary built with it.
if [ "$profile" = release ]; then
  exec cargo bench --locked --bench provisioning -- "$@"
else
  exec cargo test --locked --bench provisioning -- "$@"
fi
