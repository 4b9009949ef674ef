#!/usr/bin/env bash
# Builds (or finds cached) the control-plane binaries of every Kubernetes release of the
# `stable` channel, each with the etcd it runs by default: the releases the boot tests run
# (tests/integration/boot.rs RELEASES) through the runner, which takes each image's release
# from the cache of hack/kube-assets.sh. One hack/kube-assets.sh call per pair; it builds only
# what the cache lacks, and only the control plane (KUBE_NODE_BINARIES=0: the test kit's node runs
# the super cluster's release alone, which hack/kube-assets.sh builds in full).
#
#   hack/release-assets.sh          # build what is missing, with progress on stderr
#   hack/release-assets.sh --list   # print "<kubernetes> <etcd>" per release, build nothing
#
# The pairs come from channels/stable/channel.yaml: `components.apiserver.versions`, and for
# each its minor's `compatibility[].etcd`. The boot test
# `the_release_script_lists_every_boot_tested_release` checks this reading against the
# channel as capn loads it.
# Environment: as hack/kube-assets.sh (CAPN_ASSETS_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."

channel=channels/stable/channel.yaml
pairs="$(awk '
  /^[a-z]/ { section = $1 }
  section == "components:" && /^  [a-z-]+:/ { component = $1 }
  section == "components:" && component == "apiserver:" && /^    versions:/ {
    line = $0; gsub(/[^0-9.,]/, "", line); n = split(line, versions, ",")
  }
  section == "compatibility:" && /kubernetes:/ { minor = $0; gsub(/[^0-9.]/, "", minor) }
  section == "compatibility:" && /^    etcd:/ { v = $0; gsub(/[^0-9.]/, "", v); etcd[minor] = v }
  END {
    for (i = 1; i <= n; i++) {
      split(versions[i], part, ".")
      m = part[1] "." part[2]
      if (!(m in etcd)) { printf "no compatibility entry for Kubernetes %s\n", m > "/dev/stderr"; exit 1 }
      print versions[i], etcd[m]
    }
  }' "$channel")"
[ -n "$pairs" ] || { echo "ERROR: found no Kubernetes release in $channel" >&2; exit 1; }

if [ "${1:-}" = "--list" ]; then
  echo "$pairs"
  exit 0
fi

total="$(wc -l <<<"$pairs")"
i=0
while read -r kube etcd; do
  i=$((i + 1))
  printf '[release-assets %(%H:%M:%S)T] %d/%d: Kubernetes v%s with etcd v%s\n' -1 "$i" "$total" "$kube" "$etcd" >&2
  KUBE_NODE_BINARIES=0 KUBE_VERSION="v$kube" ETCD_VERSION="v$etcd" hack/kube-assets.sh >/dev/null
done <<<"$pairs"
printf '[release-assets %(%H:%M:%S)T] every release of the stable channel is built\n' -1 >&2
