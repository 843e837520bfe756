#!/usr/bin/env bash
# Builds the local control plane from the pinned Go modules in this directory:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes),
# etcd (go.etcd.io/etcd/server/v3) and kwok (sigs.k8s.io/kwok), plus kwok's stage files.
#
# Binaries are cached outside the repository, keyed by the versions below:
#   ${GPU_DEFRAG_CACHE:-$HOME/.cache/gpu-defrag}/cluster-<key>/bin
# A second run with the binaries present does nothing. Prints the bin dir on stdout.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${GPU_DEFRAG_CACHE:-$HOME/.cache/gpu-defrag}"
key="k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-kwok-${KWOK_VERSION}"
out="$cache_root/cluster-$key"
bin="$out/bin"

want=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok)
is_complete() {
  local b
  for b in "${want[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
  [[ -f "$out/stages.yaml" ]]
}
if is_complete; then
  echo "$bin"
  exit 0
fi

# One build at a time (e.g. `make cluster-up` while tests start): wait for the other.
mkdir -p "$out"
if command -v flock >/dev/null; then
  exec 9>"$out/.build.lock"
  flock 9
  if is_complete; then
    echo "$bin"
    exit 0
  fi
fi

command -v go >/dev/null || { echo "build.sh: Go is required (go 1.26+)" >&2; exit 1; }
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "[cluster build] $*" >&2; }
start=$(date +%s)

# Parallelism: the Go toolchain already uses every core for one build.
if [[ ! -x "$bin/etcd" ]]; then
  log "building etcd $ETCD_VERSION"
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
fi
if [[ ! -x "$bin/kwok" ]]; then
  log "building kwok $KWOK_VERSION"
  (cd "$here/kwok" && go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok)
fi
k8s_missing=0
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do [[ -x "$bin/$b" ]] || k8s_missing=1; done
if [[ $k8s_missing == 1 ]]; then
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION (slow on a cold cache)"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  ldf="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  (cd "$here/k8s" && go build -trimpath -ldflags "$ldf" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
fi

# kwok ships no built-in stages: concatenate the "fast" ones from its module.
kwok_dir="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
{
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$kwok_dir/kustomize/stage/$f"
  done
} > "$out/stages.yaml.tmp"
mv "$out/stages.yaml.tmp" "$out/stages.yaml"
log "done in $(( $(date +%s) - start ))s: $bin"
echo "$bin"
