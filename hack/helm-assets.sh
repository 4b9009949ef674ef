#!/usr/bin/env bash
# Builds `helm` (helm.sh/helm/v3) and `actionlint` (github.com/rhysd/actionlint) from their
# published Go modules, once per version pair, into the same cache as hack/kube-assets.sh.
# The chart test (tests/integration/helm.rs) lints and renders charts/capn with this helm and
# checks .github/workflows/release.yml with this actionlint. Prints the directory.
#
#   hack/helm-assets.sh            # build what is missing, print the assets dir on stdout
#
# Environment: CAPN_ASSETS_CACHE (cache root), HELM_VERSION, ACTIONLINT_VERSION (defaults below).
# Progress goes to stderr; only the assets directory goes to stdout.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
ACTIONLINT_VERSION="${ACTIONLINT_VERSION:-v1.7.12}"
CACHE="${CAPN_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# Both versions name the directory: a new actionlint is a new cache entry too.
dir="$CACHE/helm-$HELM_VERSION-actionlint-$ACTIONLINT_VERSION"

log() { printf '[helm-assets %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
command -v go >/dev/null || { log "ERROR: go is not installed; it is needed to build helm and actionlint for the tests"; exit 1; }

if [ -x "$dir/helm" ] && [ -x "$dir/actionlint" ]; then
  log "cached: helm $HELM_VERSION, actionlint $ACTIONLINT_VERSION"
  echo "$dir"; exit 0
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
# One throwaway module requiring both tools: one `go build` compiles their shared
# dependencies once (minimal version selection picks one version of each for both).
log "resolving helm.sh/helm/v3@$HELM_VERSION and github.com/rhysd/actionlint@$ACTIONLINT_VERSION"
(cd "$work" && go mod init capn.local/helm-assets >/dev/null 2>&1 \
  && go get "helm.sh/helm/v3@$HELM_VERSION" "github.com/rhysd/actionlint@$ACTIONLINT_VERSION" >&2) \
  || { log "ERROR: could not download helm $HELM_VERSION or actionlint $ACTIONLINT_VERSION from the Go module proxy"; exit 1; }
# helm's Makefile stamps its version and the Kubernetes version its lint and template
# assume (the client-go it is built with, 0.x → 1.x); actionlint's release stamps its own.
k8s="$(cd "$work" && go list -m -f '{{.Version}}' k8s.io/client-go)"
k8s_minor="$(echo "$k8s" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags="$ldflags -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$k8s_minor"
done
ldflags="$ldflags -X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION"
mkdir -p "$dir" && rm -rf "$dir/.build" && mkdir "$dir/.build"
log "building helm $HELM_VERSION and actionlint $ACTIONLINT_VERSION (a cold build takes about 2 minutes on 2 cores, seconds with a warm Go build cache)"
(cd "$work" && CGO_ENABLED=0 GOFLAGS="$GOFLAGS -mod=mod" go build -trimpath -ldflags "$ldflags" -o "$dir/.build/" \
  helm.sh/helm/v3/cmd/helm github.com/rhysd/actionlint/cmd/actionlint >&2)
mv "$dir/.build/helm" "$dir/helm" && mv "$dir/.build/actionlint" "$dir/actionlint" && rmdir "$dir/.build"
log "helm and actionlint ready in $dir ($("$dir/helm" version --short 2>/dev/null), actionlint $("$dir/actionlint" -version 2>/dev/null | head -1))"
echo "$dir"
