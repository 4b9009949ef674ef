#!/usr/bin/env bash
# Builds the real control-plane binaries the tests run (kube-apiserver,
# kube-controller-manager, etcd) from the published Go modules, once per version, into a
# cache outside the repository, and prints the directory to use as KUBEBUILDER_ASSETS.
# With them come the binaries of the test kit's node (testkit/src/runner/node.rs): kube-scheduler, kube-proxy,
# agnhost (the e2e test image's binary, whose `pause` subcommand stands in for the pause
# image), sample-apiserver (the e2e aggregator spec's image), capn-test-kubelet
# (hack/test-kubelet: the node's exec and port-forward), and kubectl (the recipes test,
# tests/integration/recipes.rs, runs docs/operations/recipes.md with it: CI machines have no
# kubectl of their own).
#
#   hack/kube-assets.sh            # build what is missing, print the assets dir on stdout
#   hack/kube-assets.sh e2e        # build the upstream e2e.test of KUBE_VERSION (for
#                                  # hack/conformance.sh) if missing, print its path
#   hack/kube-assets.sh test-kubelet  # build the test node's capn-test-kubelet if missing
#                                  # (any release), print its path
#   hack/kube-assets.sh test-kms-plugin  # build capn-test-kms-plugin (hack/test-kms-plugin,
#                                  # the booted KMS test's KMS v2 plugin) if missing, print
#                                  # its path
#
# Environment:
#   CAPN_ASSETS_CACHE   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets)
#   KUBE_VERSION        Kubernetes release to build (default below)
#   ETCD_VERSION        etcd release to build (default below)
#   KUBE_NODE_BINARIES  1 (default): also build kube-scheduler, kube-proxy, agnhost,
#                       sample-apiserver and kubectl; 0: only the
#                       control plane (hack/release-assets.sh: the boot tests' other releases
#                       need no node)
#
# Why this shape: k8s.io/kubernetes replaces its staging modules (k8s.io/api, ...) with
# local paths and requires them at v0.0.0, so it cannot be `go install`ed directly. We
# generate a throw-away module that requires it and pins every staging module to the
# matching v0.<minor>.<patch>, read from k8s.io/kubernetes' own go.mod. etcd is built in a
# separate module so its dependency versions never fight Kubernetes'.
# Progress goes to stderr; only the assets directory goes to stdout.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.8}"  # kubeadm constants for Kubernetes 1.36 (cmd/kubeadm/app/constants): 3.6.8
CACHE="${CAPN_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[kube-assets %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
command -v go >/dev/null || { log "ERROR: go is not installed; it is needed to build the test binaries"; exit 1; }

kube_dir="$CACHE/kubernetes-$KUBE_VERSION"
etcd_dir="$CACHE/etcd-$ETCD_VERSION"
assets="$CACHE/assets-kubernetes-$KUBE_VERSION-etcd-$ETCD_VERSION"

# Writes into $1 a throw-away module that requires k8s.io/kubernetes@$KUBE_VERSION, pins its
# staging modules, and imports the packages $2.. (so that `go mod tidy` resolves them).
kube_module() {
  local work="$1"; shift
  log "resolving k8s.io/kubernetes@$KUBE_VERSION staging modules"
  local gomod
  gomod="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  [ -f "$gomod" ] || { log "ERROR: could not download k8s.io/kubernetes@$KUBE_VERSION"; exit 1; }
  local staging_version="v0.${KUBE_VERSION#v1.}"
  {
    echo "module capn.local/kube-assets"
    echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')"
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    grep -E '^\s*k8s.io/[a-z0-9-]+ => ./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$work/go.mod"
  printf 'package tools\nimport (\n' > "$work/tools.go"
  for p in "$@"; do printf '\t_ "%s"\n' "$p" >> "$work/tools.go"; done
  printf ')\n' >> "$work/tools.go"
  sed -i 's/^package tools/\/\/go:build tools\n\npackage tools/' "$work/tools.go"
  (cd "$work" && go mod tidy -e >&2)
}

# The -X flags that make a binary report $KUBE_VERSION (`--version`, /version, build_info).
kube_ldflags() {
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "$ldflags"
}

# The package of each binary of k8s.io/kubernetes this script builds.
kube_package() {
  case "$1" in
    agnhost) echo "k8s.io/kubernetes/test/images/agnhost" ;;
    sample-apiserver) echo "k8s.io/sample-apiserver" ;;
    *) echo "k8s.io/kubernetes/cmd/$1" ;;
  esac
}

# Builds the binaries $@ of k8s.io/kubernetes in ONE `go build` invocation (the packages
# they share are compiled once, and the go tool overlaps the rest on every core).
build_kube() {
  local bins=("$@") work b
  work="$(mktemp -d)"; trap 'rm -rf "$work"' RETURN
  local packages=()
  for b in "${bins[@]}"; do packages+=("$(kube_package "$b")"); done
  kube_module "$work" "${packages[@]}"
  local ldflags
  ldflags="$(kube_ldflags)"
  mkdir -p "$kube_dir"
  # Cold build times measured on 2 cores: kube-apiserver ~9 minutes, then
  # kube-controller-manager ~3 (it reuses most of the apiserver's compiled packages); etcd ~2.
  # kube-scheduler and agnhost together, with kube-apiserver's and kube-controller-manager's
  # packages already in the Go build cache: ~10 s more (measured 9 s on 2 cores, 2026-12; they
  # share almost every package with those two). All four cold in this one invocation (empty
  # GOCACHE, modules downloaded): 318 s, against 256-475 s for the two alone on the same,
  # shared machine: the difference is lost in the machine's load.
  log "building ${bins[*]} $KUBE_VERSION in one go build (cold on 2 cores: about 9 minutes for kube-apiserver, 3 more for kube-controller-manager, seconds more for kube-scheduler, kube-proxy, agnhost, sample-apiserver and kubectl)"
  local out="$kube_dir/.build.tmp"
  rm -rf "$out"; mkdir -p "$out"
  # With several packages, -o names a directory, and each binary takes its package's last
  # path element as its name (kube-apiserver, ..., agnhost).
  (cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$out/" "${packages[@]}" >&2)
  for b in "${bins[@]}"; do
    mv "$out/$b" "$kube_dir/$b"
    log "built $kube_dir/$b"
  done
  rm -rf "$out"
}

# The upstream end-to-end suite of $KUBE_VERSION (`go test -c k8s.io/kubernetes/test/e2e`),
# for hack/conformance.sh. Its test files import packages whose requirements `go mod tidy`
# of a dependency's non-test package does not record, hence -mod=mod.
build_e2e() {
  local work
  work="$(mktemp -d)"; trap 'rm -rf "$work"' RETURN
  kube_module "$work" k8s.io/kubernetes/test/e2e
  local ldflags
  ldflags="$(kube_ldflags)"
  mkdir -p "$kube_dir"
  log "building e2e.test $KUBE_VERSION (go test -c k8s.io/kubernetes/test/e2e; a cold build takes tens of minutes on 2 cores)"
  (cd "$work" && go test -c -mod=mod -trimpath -ldflags "$ldflags" -o "$kube_dir/e2e.test.tmp" k8s.io/kubernetes/test/e2e >&2)
  mv "$kube_dir/e2e.test.tmp" "$kube_dir/e2e.test"
  log "built $kube_dir/e2e.test"
}

build_etcd() {
  local bins=("$@") work b
  work="$(mktemp -d)"; trap 'rm -rf "$work"' RETURN
  # etcd (the server) and etcdutl (offline snapshot restore, used by the restore init
  # container) are separate Go modules released together under the same version.
  (cd "$work" && go mod init capn.local/etcd-assets >/dev/null 2>&1)
  mkdir -p "$etcd_dir"
  for b in "${bins[@]}"; do
    local module="go.etcd.io/etcd/server/v3"
    [ "$b" = etcdutl ] && module="go.etcd.io/etcd/etcdutl/v3"
    log "building $b $ETCD_VERSION (a cold build takes about 2 minutes on 2 cores)"
    (cd "$work" \
      && printf 'package main\nimport _ "%s"\n' "$module" > tools.go \
      && go get "$module@$ETCD_VERSION" >&2 \
      && rm tools.go \
      && go build -trimpath -ldflags "-s -w" -o "$etcd_dir/$b.tmp" "$module" >&2)
    mv "$etcd_dir/$b.tmp" "$etcd_dir/$b"
    log "built $etcd_dir/$b"
  done
}

# The Go test fixtures in this repository, each built from hack/test-<name> into
# $CACHE/test-<name>-<hash of its sources>/capn-test-<name> (the tests compute the same
# name); prints its path. `kubelet`: the streaming half of the test node's kubelet API
# (exec and port-forward with the kubelet's own k8s.io/cri-streaming; found by
# testkit/src/runner/node/kubelet.rs). `kms-plugin`: the KMS v2 plugin of the booted KMS
# test (k8s.io/kms's gRPC server, AES-GCM with a key made at start; found by
# tests/integration/boot_kms.rs). Each builds in seconds with the Go build cache the
# Kubernetes build leaves (the KMS plugin: 42 s with an empty one on 2 busy cores,
# measured 2026-12-07).
build_fixture() {
  local name="$1" src dir
  src="$(cd "$(dirname "$0")/test-$name" && pwd)"
  dir="$CACHE/test-$name-$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)"
  if [ -x "$dir/capn-test-$name" ]; then
    log "cached: capn-test-$name"
  else
    log "building capn-test-$name (seconds once Kubernetes is built)"
    mkdir -p "$dir"
    (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$dir/capn-test-$name.tmp" . >&2)
    mv "$dir/capn-test-$name.tmp" "$dir/capn-test-$name"
    log "built $dir/capn-test-$name"
  fi
  echo "$dir/capn-test-$name"
}

if [ "${1:-}" = test-kubelet ] || [ "${1:-}" = test-kms-plugin ]; then
  build_fixture "${1#test-}"
  exit 0
fi

if [ "${1:-}" = e2e ]; then
  if [ -x "$kube_dir/e2e.test" ]; then log "cached: e2e.test $KUBE_VERSION"; else build_e2e; fi
  echo "$kube_dir/e2e.test"
  exit 0
fi

kube_bins=(kube-apiserver kube-controller-manager)
[ "${KUBE_NODE_BINARIES:-1}" = 0 ] || kube_bins+=(kube-scheduler kube-proxy agnhost sample-apiserver kubectl)
missing=()
for b in "${kube_bins[@]}"; do
  [ -x "$kube_dir/$b" ] || missing+=("$b")
done
if [ ${#missing[@]} -gt 0 ]; then build_kube "${missing[@]}"; else log "cached: kubernetes $KUBE_VERSION"; fi
missing=()
for b in etcd etcdutl; do
  [ -x "$etcd_dir/$b" ] || missing+=("$b")
done
if [ ${#missing[@]} -gt 0 ]; then build_etcd "${missing[@]}"; else log "cached: etcd $ETCD_VERSION"; fi

# The streaming half of the test node's kubelet API (hack/test-kubelet: exec and
# port-forward with the kubelet's own k8s.io/cri-streaming), cached under the hash of its
# sources (testkit/src/runner/node/kubelet.rs computes the same name).
[ "${KUBE_NODE_BINARIES:-1}" = 0 ] || build_fixture kubelet >/dev/null
# The booted KMS test's plugin, likewise.
[ "${KUBE_NODE_BINARIES:-1}" = 0 ] || build_fixture kms-plugin >/dev/null

mkdir -p "$assets"
ln -sf "$kube_dir/kube-apiserver" "$kube_dir/kube-controller-manager" "$etcd_dir/etcd" "$etcd_dir/etcdutl" "$assets/"
log "assets ready in $assets"
echo "$assets"
