#!/usr/bin/env bash
# The first command (docs/getting-started.md "Try it"): on a fresh machine, builds what is missing, then starts
# a local super cluster, runs capn, applies examples/nestedcontrolplane.yaml, boots it for
# real, lists the nested control plane's namespaces through the kubeconfig capn generated, runs
# a Deployment of the tenant on the super cluster's node through capn's syncer (and reads a
# pod's log through the tenant, as `kubectl logs` does), and tells you
# how to use it with kubectl. Ctrl-C stops it and removes everything it started.
#
#   hack/demo.sh
#
# Needs: cargo, go (only to build the Kubernetes binaries the first time, ~14 min on 2 cores),
# iproute2 (`ip`), iptables (the node's kube-proxy), busybox, netcat-openbsd and
# bind9-dnsutils (its images' tools), and root (it uses sudo when not run as
# root): the nested control plane's pods run in network and mount namespaces of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s (%(%H:%M:%S)T)\n' "$*" -1 >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

command -v cargo >/dev/null || die "cargo is not installed (https://rustup.rs)"
command -v ip >/dev/null || die "ip (iproute2) is not installed: the demo gives each pod a network namespace with it"
command -v iptables-restore >/dev/null || die "iptables is not installed: the demo node's kube-proxy routes ClusterIPs with it (apt-get install iptables)"
command -v busybox >/dev/null || die "busybox is not installed: the demo node runs the BusyBox images with it (apt-get install busybox)"
command -v nc.openbsd >/dev/null || die "netcat-openbsd is not installed: the demo node gives it to the agnhost image (apt-get install netcat-openbsd)"
command -v dig >/dev/null || die "dig is not installed: the demo node gives it to the agnhost image (apt-get install bind9-dnsutils)"
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "the demo needs root (network and mount namespaces), and sudo is not installed"
fi

step "1/2 Kubernetes binaries: etcd, kube-apiserver, kube-controller-manager, and the node's kube-scheduler, kube-proxy and agnhost (cached by version; a cold build takes about 14 minutes on 2 cores: kube-apiserver ~9, kube-controller-manager ~3, etcd ~2)"
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  KUBEBUILDER_ASSETS="$(hack/kube-assets.sh)"
fi
for b in etcd kube-apiserver kube-controller-manager; do
  [ -x "$KUBEBUILDER_ASSETS/$b" ] || die "$KUBEBUILDER_ASSETS/$b is missing (run hack/kube-assets.sh)"
done
# The super cluster's node runs kube-scheduler, kube-proxy and agnhost of the same release.
release_dir="$(dirname "$(readlink -f "$KUBEBUILDER_ASSETS/kube-apiserver")")"
for b in kube-scheduler kube-proxy agnhost; do
  [ -x "$release_dir/$b" ] || die "$release_dir/$b is missing (run hack/kube-assets.sh)"
done
# Its exec and port-forward (hack/test-kubelet): built in seconds when missing.
hack/kube-assets.sh test-kubelet >/dev/null || die "capn-test-kubelet could not be built (hack/kube-assets.sh test-kubelet)"
echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS" >&2
# The runner takes each image's release from kube-assets.sh's cache; name it, so that sudo
# (another HOME) finds the same one.
CAPN_ASSETS_CACHE="${CAPN_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets}"

step "2/2 Building the demo (cargo build --bin capn --example demo; a cold build takes about 10 minutes on 2 cores)"
cargo build --locked --bin capn --example demo
demo="${CARGO_TARGET_DIR:-target}/debug/examples/demo"
[ -x "$demo" ] || die "cargo built no $demo"

step "Running the demo (Ctrl-C stops it and cleans up)"
if [ "$(id -u)" -eq 0 ]; then
  exec env KUBEBUILDER_ASSETS="$KUBEBUILDER_ASSETS" CAPN_ASSETS_CACHE="$CAPN_ASSETS_CACHE" "$demo"
else
  echo "The demo needs root for namespaces; running it with sudo." >&2
  exec sudo env KUBEBUILDER_ASSETS="$KUBEBUILDER_ASSETS" CAPN_ASSETS_CACHE="$CAPN_ASSETS_CACHE" "$demo"
fi
