#!/usr/bin/env bash
# Builds Cluster API's core controller manager and clusterctl from the published
# sigs.k8s.io/cluster-api Go module, once per version, into the same cache as
# hack/kube-assets.sh, and links Cluster API's own CRDs next to them. Prints the directory.
#
#   hack/capi-assets.sh            # build what is missing, print the assets dir on stdout
#
# Environment: CAPN_ASSETS_CACHE (cache root), CAPI_VERSION (default below).
# Progress goes to stderr; only the assets directory goes to stdout.
set -euo pipefail

CAPI_VERSION="${CAPI_VERSION:-v1.14.2}"
CACHE="${CAPN_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
dir="$CACHE/cluster-api-$CAPI_VERSION"

log() { printf '[capi-assets %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
command -v go >/dev/null || { log "ERROR: go is not installed; it is needed to build Cluster API for the tests"; exit 1; }

if [ -x "$dir/cluster-api-manager" ] && [ -x "$dir/clusterctl" ] && [ -d "$dir/crds" ]; then
  log "cached: cluster-api $CAPI_VERSION"
  echo "$dir"; exit 0
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
src="$(cd "$work" && go mod download -json "sigs.k8s.io/cluster-api@$CAPI_VERSION" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')"
[ -d "$src" ] || { log "ERROR: could not download sigs.k8s.io/cluster-api@$CAPI_VERSION"; exit 1; }
# Build inside a writable copy of the module. Its go.mod replaces the separate api module
# with ./api, which the published zip of the root module does not contain: point the
# replacement at the published api module of the same version instead.
cp -r "$src" "$work/cluster-api" && chmod -R u+w "$work/cluster-api"
(cd "$work/cluster-api" && go mod edit -replace "sigs.k8s.io/cluster-api/api=sigs.k8s.io/cluster-api/api@$CAPI_VERSION" \
  && GOFLAGS=-mod=mod go mod download sigs.k8s.io/cluster-api/api >&2)
export GOFLAGS="$GOFLAGS -mod=mod"
mkdir -p "$dir"
ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI_VERSION -X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitMinor=${CAPI_VERSION#v1.}"
for target in "core:cluster-api-manager" "cmd/clusterctl:clusterctl"; do
  pkg="${target%%:*}"; bin="${target##*:}"
  if [ -x "$dir/$bin" ]; then log "cached: $bin"; continue; fi
  log "building $bin $CAPI_VERSION (a cold build of both binaries takes about 5 minutes on 2 cores)"
  (cd "$work/cluster-api" && go build -trimpath -ldflags "$ldflags" -o "$dir/$bin.tmp" "./$pkg" >&2)
  mv "$dir/$bin.tmp" "$dir/$bin"
  log "built $dir/$bin"
done
rm -rf "$dir/crds" && mkdir -p "$dir/crds"
cp "$src"/core/config/crd/bases/*.yaml "$dir/crds/"
log "Cluster API assets ready in $dir"
echo "$dir"
