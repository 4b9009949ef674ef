#!/usr/bin/env bash
# Upstream conformance on demand (issue 13, part 5; docs/developer/testing.md "Upstream conformance"): boots a tenant of
# a stable-channel release through the runner and runs that release's upstream e2e suite
# against it, focused on the sig-api-machinery and sig-auth [Conformance] tests (their
# pods run through the syncer on the test kit's node). Prints pass, fail and skip counts with every
# failure and why. Not part of CI.
#
#   hack/conformance.sh                       # the channel's default release
#   hack/conformance.sh 1.37.2                # another release (with its default etcd)
#   hack/conformance.sh 1.35.4 --upgrade-to 1.37.2
#                                             # boot 1.35.4, let capn move it to 1.37.2
#                                             # (spec.version), then run 1.37.2's suite
#
# Builds what is missing first, cached by version (hack/kube-assets.sh): the release's
# binaries and its e2e.test (`go test -c k8s.io/kubernetes/test/e2e`, tens of minutes cold on
# 2 cores). Needs root (the runner). Results go to $CAPN_CONFORMANCE_DIR (default
# /tmp/capn-conformance-<release>-<time>): kubeconfig, e2e.log, report.json, junit, summary.txt.
# Environment: CAPN_CONFORMANCE_FOCUS (ginkgo focus), CAPN_E2E_ARGS (extra e2e.test
# arguments), CAPN_ASSETS_CACHE, KUBEBUILDER_ASSETS (the super cluster's binaries).
# Exit status: 0 when every failure is explained (an image the test node does not run, a
# pod the workload Pod Security level refuses), 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[conformance %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

release="" target=""
while [ $# -gt 0 ]; do
  case "$1" in
    --upgrade-to) target="${2:-}"; [ -n "$target" ] || die "--upgrade-to needs a release"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) die "unknown option $1 (allowed: --upgrade-to <release>)" ;;
    *) [ -z "$release" ] || die "one release only (got $release and $1)"; release="$1"; shift ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "the runner needs root (network and mount namespaces): run as root"

pairs="$(hack/release-assets.sh --list)"
default="$(sed -n 's/^  kubernetes: "\(.*\)"/\1/p' channels/stable/channel.yaml)"
release="${release:-$default}"
release="${release#v}"; target="${target#v}"
etcd_of() { awk -v k="$1" '$1 == k {print $2}' <<<"$pairs"; }
for r in "$release" ${target:+"$target"}; do
  [ -n "$(etcd_of "$r")" ] || die "release $r is not in the stable channel (it has: $(awk '{printf "%s ", $1}' <<<"$pairs"))"
done
final="${target:-$release}"

log "binaries of $release (etcd $(etcd_of "$release"))${target:+ and of $target (etcd $(etcd_of "$target"))}"
KUBE_VERSION="v$release" ETCD_VERSION="v$(etcd_of "$release")" hack/kube-assets.sh >/dev/null
[ -z "$target" ] || KUBE_VERSION="v$target" ETCD_VERSION="v$(etcd_of "$target")" hack/kube-assets.sh >/dev/null
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  KUBEBUILDER_ASSETS="$(hack/kube-assets.sh)"
  export KUBEBUILDER_ASSETS
fi
# The test node's exec and port-forward (kubectl exec is how many specs read a pod's files).
hack/kube-assets.sh test-kubelet >/dev/null
# The aggregator spec's sample-apiserver of the suite's own release: the super cluster's
# lists admission APIs (v1 MutatingAdmissionPolicies since 1.36) an older tenant does not
# serve, and never gets ready against it.
log "sample-apiserver of $final (the node runs it for the aggregator spec)"
KUBE_VERSION="v$final" ETCD_VERSION="v$(etcd_of "$final")" KUBE_NODE_BINARIES=1 hack/kube-assets.sh >/dev/null
export CAPN_NODE_SAMPLE_APISERVER="${CAPN_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets}/kubernetes-v$final/sample-apiserver"
[ -x "$CAPN_NODE_SAMPLE_APISERVER" ] || die "no $CAPN_NODE_SAMPLE_APISERVER after building it"
log "upstream e2e suite of $final"
e2e="$(KUBE_VERSION="v$final" hack/kube-assets.sh e2e)"

dir="${CAPN_CONFORMANCE_DIR:-/tmp/capn-conformance-$release${target:+-to-$target}-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$dir"
log "building the integration tests (cargo test --no-run)"
cargo test --locked --test integration --no-run >&2
log "booting $release${target:+, upgrading to $target,} and running $e2e (results in $dir)"
status=0
CAPN_CONFORMANCE_RELEASE="$release" CAPN_CONFORMANCE_UPGRADE_TO="$target" \
  CAPN_E2E_BINARY="$e2e" CAPN_CONFORMANCE_DIR="$dir" \
  cargo test --locked --test integration -- --ignored --exact conformance::upstream_conformance --nocapture \
  || status=$?
[ -f "$dir/summary.txt" ] || die "the conformance run ended without a summary (cargo test exit $status); see $dir/e2e.log"
echo
cat "$dir/summary.txt"
if grep -q UNEXPLAINED "$dir/summary.txt"; then
  log "some failures are not explained; read $dir/e2e.log"
  exit 1
fi
exit "$status"
