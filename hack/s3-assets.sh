#!/usr/bin/env bash
# Builds the S3-compatible server the backup tests upload to — `s3s-fs` (the s3s project's
# file-system backed S3 server, published on crates.io with a `binary` feature) — once per
# version, into the same cache as hack/kube-assets.sh, and prints the binary's path.
#
#   hack/s3-assets.sh            # build if missing, print the path of s3s-fs on stdout
#
# Environment: CAPN_ASSETS_CACHE (cache root), S3S_FS_VERSION (default below).
# Why s3s-fs: a real S3 protocol implementation (SigV4, multipart upload, HEAD, list,
# delete), small enough to build from source in about 2 minutes, and a registry package.
# 0.14.1 is the newest release whose rust-version (1.92) the project's toolchain meets.
# Progress goes to stderr; only the binary's path goes to stdout.
set -euo pipefail

S3S_FS_VERSION="${S3S_FS_VERSION:-0.14.1}"
CACHE="${CAPN_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capn/assets}"
dir="$CACHE/s3s-fs-v$S3S_FS_VERSION"

log() { printf '[s3-assets %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
command -v cargo >/dev/null || { log "ERROR: cargo is not installed; it is needed to build s3s-fs"; exit 1; }

if [ -x "$dir/bin/s3s-fs" ]; then
  log "cached: s3s-fs $S3S_FS_VERSION"
else
  log "building s3s-fs $S3S_FS_VERSION (a cold build takes a few minutes on 2 cores)"
  # A target dir of its own, so the project's build cache is not disturbed; removed after.
  work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
  CARGO_TARGET_DIR="$work" cargo install --locked --quiet "s3s-fs@$S3S_FS_VERSION" \
    --features binary --root "$dir.tmp" >&2
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  log "built $dir/bin/s3s-fs"
fi
echo "$dir/bin/s3s-fs"
