#!/usr/bin/env bash
# Issue 40's benchmark (docs/benchmarks.md, "Density"): the idle and lightly loaded footprint
# (RSS, PSS, CPU) of a booted tenant's etcd, kube-apiserver and kube-controller-manager, per
# release and size.
#
#   hack/bench-density.sh [--releases A,B] [--sizes A,B] [--idle-seconds S] [--load-seconds S]
#                         [--writes-per-second N] [--channels-dir DIR]      release build
#   hack/bench-density.sh --debug ...                                       debug build (CI's smoke run)
#
# Defaults: every release of the stable channel × small, medium, large; 300 s idle; 10
# writes/s for 120 s. Needs what hack/test.sh needs (root, iproute2, the Kubernetes binaries
# of every release measured: hack/release-assets.sh). Prints the report; exits non-zero when
# anything breaks. The measured processes are the Go binaries: the build profile changes
# nothing in the figures, only the build's time.
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
if [ "$profile" = release ]; then
  exec cargo bench --locked --bench density -- "$@"
else
  exec cargo test --locked --bench density -- "$@"
fi
