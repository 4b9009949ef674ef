#!/usr/bin/env bash
# The test command (README "Two commands"; docs/developer/testing.md): builds or reuses the
# real control-plane binaries (Kubernetes, etcd: the super cluster's, and every release of
# the stable channel) and
# Cluster API's manager and clusterctl, then runs every test — unit,
# golden and behaviour tests against a real kube-apiserver.
# Extra arguments go to `cargo test` (e.g. `hack/test.sh standalone` runs matching tests).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  KUBEBUILDER_ASSETS="$(hack/kube-assets.sh)"
  export KUBEBUILDER_ASSETS
fi
# Every release of the stable channel, which the boot tests run through the runner (from
# kube-assets.sh's cache, by version); builds only what is missing.
hack/release-assets.sh
for b in etcd kube-apiserver kube-controller-manager; do
  [ -x "$KUBEBUILDER_ASSETS/$b" ] || { echo "ERROR: $KUBEBUILDER_ASSETS/$b is missing (run hack/kube-assets.sh)" >&2; exit 1; }
done
# The test kit's node (tests/integration/node.rs) runs kube-scheduler, kube-proxy and agnhost of the
# super cluster's release, which hack/kube-assets.sh builds next to its kube-apiserver;
# its kube-proxy programs iptables (Debian's iptables package).
command -v iptables-restore >/dev/null || { echo "ERROR: iptables-restore is missing: the test node's kube-proxy needs it (apt-get install iptables)" >&2; exit 1; }
command -v busybox >/dev/null || { echo "ERROR: busybox is missing: the test node runs the BusyBox images with it (apt-get install busybox)" >&2; exit 1; }
command -v nc.openbsd >/dev/null || { echo "ERROR: netcat-openbsd is missing: the test node gives it to the agnhost image (apt-get install netcat-openbsd)" >&2; exit 1; }
command -v dig >/dev/null || { echo "ERROR: dig is missing: the test node gives it to the agnhost image (apt-get install bind9-dnsutils)" >&2; exit 1; }
command -v curl >/dev/null || { echo "ERROR: curl is missing: the test node gives it to the agnhost image (apt-get install curl)" >&2; exit 1; }
release_dir="$(dirname "$(readlink -f "$KUBEBUILDER_ASSETS/kube-apiserver")")"
# kubectl too: the recipes test (tests/integration/recipes.rs) runs docs/operations/recipes.md with it.
for b in kube-scheduler kube-proxy agnhost kubectl; do
  [ -x "$release_dir/$b" ] || { echo "ERROR: $release_dir/$b is missing (run hack/kube-assets.sh with the KUBE_VERSION of $KUBEBUILDER_ASSETS)" >&2; exit 1; }
done
# Its exec and port-forward (hack/test-kubelet): built in seconds when its sources changed.
hack/kube-assets.sh test-kubelet >/dev/null
# The booted KMS test's KMS v2 plugin (hack/test-kms-plugin), likewise.
hack/kube-assets.sh test-kms-plugin >/dev/null
if [ -z "${CAPI_ASSETS:-}" ]; then
  CAPI_ASSETS="$(hack/capi-assets.sh)"
  export CAPI_ASSETS
fi
# helm and actionlint, for the chart and release workflow test (tests/integration/helm.rs).
if [ -z "${HELM_ASSETS:-}" ]; then
  HELM_ASSETS="$(hack/helm-assets.sh)"
  export HELM_ASSETS
fi
# promtool, for the alerting rules and dashboards test (tests/integration/monitoring.rs).
if [ -z "${PROMTOOL_ASSETS:-}" ]; then
  PROMTOOL_ASSETS="$(hack/promtool-assets.sh)"
  export PROMTOOL_ASSETS
fi
# The S3-compatible server the backup tests upload to (s3s-fs, built from crates.io).
if [ -z "${S3_SERVER:-}" ]; then
  S3_SERVER="$(hack/s3-assets.sh)"
  export S3_SERVER
fi
echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS CAPI_ASSETS=$CAPI_ASSETS HELM_ASSETS=$HELM_ASSETS PROMTOOL_ASSETS=$PROMTOOL_ASSETS S3_SERVER=$S3_SERVER" >&2
# The booted tests spend most of their time waiting (for renewals, rolls, rotations), so run
# more of them at once than there are cores: three (at four, with the 126 tests of session 17,
# two booted tests starved past their generous deadlines in one run on two cores).
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-3}"
exec cargo test --locked "$@"
