#!/usr/bin/env bash
# Builds `promtool` (github.com/prometheus/prometheus/cmd/promtool) from its published Go
# module, once per version, into the same cache as hack/kube-assets.sh. The monitoring test
# (tests/integration/monitoring.rs) checks deploy/monitoring's alerting rules and runs their
# unit tests with it, and syntax-checks every query of the dashboards. Prints the directory.
#
#   hack/promtool-assets.sh        # build what is missing, print the assets dir on stdout
#
# Environment: CAPN_ASSETS_CACHE (cache root), PROMETHEUS_VERSION (the Go module's version,
# default below). Progress goes to stderr; only the assets directory goes to stdout.
#
# Its own `go build`, not one with hack/helm-assets.sh's helm and actionlint: minimal version
# selection resolves the three without a conflict, but promtool's requirements raise about
# fifty of helm's dependencies (k8s.io/client-go v0.37.0 → v0.37.1, grpc, OpenTelemetry,
# golang.org/x, go-openapi, …; measured with prometheus v0.316.0 and helm v3.22.0), so the
# chart test would run a helm built against versions its release never was. promtool's own
# set is unchanged by helm's. A separate module keeps each tool on its released dependencies;
# the cost is compiling their common packages (client-go, grpc, …) once for each.
#
# Measured 2026-12-07 on 2 cores shared with a Kubernetes build (load average 9): cold, with an
# empty GOCACHE, 11 min 58 s (650 CPU-seconds, module downloads included: about 6 minutes on
# 2 idle cores); warm, 8 s.
set -euo pipefail

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
CACHE="${CAPN_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
dir="$CACHE/promtool-$PROMETHEUS_VERSION"

log() { printf '[promtool-assets %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
command -v go >/dev/null || { log "ERROR: go is not installed; it is needed to build promtool for the tests"; exit 1; }

if [ -x "$dir/promtool" ]; then
  log "cached: promtool of github.com/prometheus/prometheus $PROMETHEUS_VERSION"
  echo "$dir"; exit 0
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
log "resolving github.com/prometheus/prometheus@$PROMETHEUS_VERSION"
(cd "$work" && go mod init capn.local/promtool-assets >/dev/null 2>&1 \
  && go get "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" >&2) \
  || { log "ERROR: could not download github.com/prometheus/prometheus $PROMETHEUS_VERSION from the Go module proxy"; exit 1; }
# Prometheus' release (promu) stamps the version of its VERSION file (3.16.0 for the module
# v0.316.0) into prometheus/common's version package; so does this build.
release="$(cat "$(cd "$work" && go list -m -f '{{.Dir}}' github.com/prometheus/prometheus)/VERSION")"
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Branch=$PROMETHEUS_VERSION"
mkdir -p "$dir" && rm -rf "$dir/.build" && mkdir "$dir/.build"
log "building promtool $release ($PROMETHEUS_VERSION; a cold build takes about 6 minutes on 2 idle cores, seconds with a warm Go build cache)"
(cd "$work" && CGO_ENABLED=0 GOFLAGS="$GOFLAGS -mod=mod" go build -trimpath -tags netgo -ldflags "$ldflags" -o "$dir/.build/" \
  github.com/prometheus/prometheus/cmd/promtool >&2) \
  || { log "ERROR: go build of promtool $PROMETHEUS_VERSION failed (output above)"; exit 1; }
mv "$dir/.build/promtool" "$dir/promtool" && rmdir "$dir/.build"
log "promtool ready in $dir ($("$dir/promtool" --version 2>&1 | head -1))"
echo "$dir"
