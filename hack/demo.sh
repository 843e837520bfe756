#!/usr/bin/env bash
# make demo: a fragmented GPU cluster, a DefragPolicy, the operator, before/after.
# Builds what it needs (release binaries; the control plane from Go modules, cached in
# ~/.cache/gpu-defrag), starts the local cluster in .cluster/ (8 KWOK nodes × 8 GPUs),
# and leaves it running at the end (make cluster-down stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v jq >/dev/null || { echo "make demo needs jq (Debian: apt-get install jq)" >&2; exit 1; }
root=$PWD
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Building gpu-defrag (release) and the local control plane (cached after the first time)"
cargo build --release -q -p gpu-defrag-operator -p gpu-defrag-e2e
e2e/cluster/build.sh >/dev/null

step "Starting the local cluster (.cluster/)"
target/release/gpu-defrag-cluster up --dir "$root/.cluster" --nodes 8 --gpus 8 >/dev/null
export KUBECONFIG="$root/.cluster/kubeconfig" PATH="$root/.cluster/bin:$PATH"
kubectl get nodes -o custom-columns=NODE:.metadata.name,GPUS:.status.allocatable.nvidia\\.com/gpu,MODEL:.metadata.labels.nvidia\\.com/gpu\\.product

ns=demo
if kubectl get ns "$ns" >/dev/null 2>&1; then
  step "Removing the previous demo run"
  # No operator runs now: the policy's finalizer would keep it; its fences go by hand.
  kubectl taint nodes --all draining.gpu-defrag.io/demo- >/dev/null 2>&1 || true
  kubectl patch defragpolicy demo --type merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  kubectl delete defragpolicy demo --ignore-not-found >/dev/null
  kubectl delete ns "$ns" --wait=true --timeout=120s >/dev/null
fi

step "Creating a fragmented GPU workload: 64 one-GPU inference pods packed, half removed, and an 8-GPU training job"
hack/demo-workload.sh "$ns" 64
sleep 3
kubectl -n "$ns" get pods -l app=train-8gpu -o wide

step "Fragmentation report (gpu-defrag report, read-only)"
target/release/gpu-defrag report --policy config/samples/demo.yaml

step "Starting the operator (gpu-defrag run)"
log="$root/.cluster/logs/gpu-defrag-demo.log"
target/release/gpu-defrag run --leader-elect=false --metrics-addr 127.0.0.1:0 >"$log" 2>&1 &
op=$!
trap 'kill $op 2>/dev/null || true' EXIT

step "Applying a DryRun DefragPolicy (config/samples/demo.yaml)"
kubectl apply -f config/samples/demo.yaml
kubectl wait dfp/demo --for=jsonpath='{.status.plan.totalMoves}' --timeout=60s >/dev/null || true
kubectl get dfp demo
echo
echo "planned moves (first 8 of $(kubectl get dfp demo -o jsonpath='{.status.plan.totalMoves}')), checked server-side with dryRun=All:"
kubectl get dfp demo -o jsonpath='{range .status.plan.moves[*]}{"  "}{.pod}{"  "}{.fromNode}{" -> "}{.toNode}{"   ("}{.reason}{")\n"}{end}' | sed -n '1,8p'
kubectl get dfp demo -o jsonpath='  dry-run check: allowed={.status.plan.dryRunCheck.allowed} blocked={.status.plan.dryRunCheck.blocked}{"\n"}'
before_free=$(kubectl get dfp demo -o jsonpath='{.status.fragmentation.fullyFreeNodes}')
before_rate=$(kubectl get dfp demo -o jsonpath='{.status.fragmentation.fragmentRate}')

step "Switching to Enforce with a maintenance window open now"
start=$(date +%s)
kubectl patch dfp demo --type merge -p '{"spec":{"mode":"Enforce","windows":[{"schedule":"* * * * *","duration":"1h","timeZone":"UTC"}]}}'
# (not kubectl wait: an array index out of range is an error to it, not "not yet")
result=""
for _ in $(seq 240); do
  result=$(kubectl get dfp demo -o jsonpath='{.status.lastRuns[0].result}' 2>/dev/null || true)
  [ -n "$result" ] && break
  sleep 1
done
kubectl -n "$ns" wait pod -l app=train-8gpu --for=jsonpath='{.status.phase}'=Running --timeout=60s >/dev/null || true
elapsed=$(( $(date +%s) - start ))

step "Result"
kubectl get dfp demo
kubectl get dfp demo -o jsonpath='{.status.lastRuns[0].message}{"\n"}'
echo
target/release/gpu-defrag report --policy config/samples/demo.yaml | sed -n '1,3p;9,20p'
after_json=$(target/release/gpu-defrag report --policy config/samples/demo.yaml -o json)
after_free=$(jq -r .fullyFreeNodes <<<"$after_json")
after_rate=$(jq -r '.fragmentRate * 1000 | round / 1000' <<<"$after_json")
train_node=$(kubectl -n "$ns" get pods -l app=train-8gpu -o jsonpath='{.items[0].spec.nodeName}')
kubectl -n "$ns" get pods -l app=train-8gpu -o wide
ready=$(kubectl -n "$ns" get deploy -l demo=fragmented -o jsonpath='{range .items[*]}{.status.readyReplicas}{"\n"}{end}' | grep -c '^1$' || true)
total=$(kubectl -n "$ns" get deploy -l demo=fragmented --no-headers | wc -l)
echo
freed=$after_free
[ -n "$train_node" ] && freed=$((after_free + 1))
echo "fragment rate ${before_rate} -> ${after_rate}; whole 8-GPU nodes given back: ${before_free} -> ${freed}"
echo "  (${after_free} still free, 1 now runs the 8-GPU training job on ${train_node:-<none>})"
echo "run result: ${result:-none}; inference Deployments Ready: ${ready}/${total}; window open -> 8-GPU job Running: ${elapsed}s"
echo "operator log: $log    stop the cluster: make cluster-down"
