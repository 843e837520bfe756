#!/usr/bin/env bash
# Builds sigs.k8s.io/descheduler from the pinned Go module in e2e/cluster/descheduler/ (for
# `make bench-e2e`: the real descheduler side by side with gpu-defrag). Cached outside the
# repository, keyed by the version:
#   ${GPU_DEFRAG_CACHE:-$HOME/.cache/gpu-defrag}/descheduler-<version>/bin/descheduler
# A second run with the binary present does nothing. Prints the binary's path on stdout.
set -euo pipefail

DESCHEDULER_VERSION=v0.36.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${GPU_DEFRAG_CACHE:-$HOME/.cache/gpu-defrag}"
out="$cache_root/descheduler-$DESCHEDULER_VERSION"
bin="$out/bin/descheduler"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$out/bin"
if command -v flock >/dev/null; then
  exec 9>"$out/.build.lock"
  flock 9
  if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
  fi
fi

command -v go >/dev/null || { echo "build-descheduler.sh: Go is required (go 1.26+)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$(date +%s)
echo "[descheduler build] building sigs.k8s.io/descheduler $DESCHEDULER_VERSION (slow on a cold cache)" >&2
ldf="-s -w -X sigs.k8s.io/descheduler/pkg/version.version=$DESCHEDULER_VERSION"
(cd "$here/descheduler" && go build -trimpath -ldflags "$ldf" -o "$bin.tmp" sigs.k8s.io/descheduler/cmd/descheduler)
mv "$bin.tmp" "$bin"
echo "[descheduler build] done in $(( $(date +%s) - start ))s: $bin" >&2
echo "$bin"
