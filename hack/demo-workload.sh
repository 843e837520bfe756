#!/usr/bin/env bash
# Creates a fragmented GPU workload on the local cluster: 64 one-GPU Deployments packed
# onto 8 nodes by the bin-packing scheduler, then every other one removed, so each node
# keeps 4 busy and 4 idle GPUs; finally an 8-GPU training job that fits nowhere.
# Each inference Deployment is a single replica with a PodDisruptionBudget
# `maxUnavailable: 1`: its owner says a disruption is fine (gpu-defrag never moves a
# workload's last Ready replica without that).
# Usage: hack/demo-workload.sh <namespace> [count]
set -euo pipefail
ns="${1:-demo}"
count="${2:-64}"
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
{
  for i in $(seq -w 0 $((count - 1))); do
    cat <<YAML
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer-$i, namespace: $ns, labels: {app: infer-$i, demo: fragmented}}
spec:
  replicas: 1
  selector: {matchLabels: {app: infer-$i}}
  template:
    metadata: {labels: {app: infer-$i, demo: fragmented}}
    spec:
      schedulerName: gpu-binpack
      containers:
      - name: main
        image: registry.invalid/infer:1
        resources:
          requests: {cpu: "1", memory: 4Gi, nvidia.com/gpu: "1"}
          limits: {nvidia.com/gpu: "1"}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: infer-$i, namespace: $ns, labels: {demo: fragmented}}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: infer-$i}}
YAML
  done
} | kubectl apply -f - >/dev/null
kubectl -n "$ns" wait --for=condition=Available deployment -l demo=fragmented --timeout=180s >/dev/null
# Remove every other Deployment: each node keeps half its GPUs busy.
for i in $(seq -w 1 2 $((count - 1))); do echo "deployment/infer-$i pdb/infer-$i"; done | xargs kubectl -n "$ns" delete --wait=false >/dev/null
# The budgets of the kept Deployments allow one disruption each once the disruption
# controller has seen their pods.
kubectl -n "$ns" wait pdb -l demo=fragmented --for=jsonpath='{.status.disruptionsAllowed}'=1 --timeout=120s >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: train-8gpu, namespace: $ns, labels: {app: train-8gpu}}
spec:
  replicas: 1
  selector: {matchLabels: {app: train-8gpu}}
  template:
    metadata: {labels: {app: train-8gpu}}
    spec:
      schedulerName: gpu-binpack
      containers:
      - name: main
        image: registry.invalid/train:1
        resources:
          requests: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "8"}
          limits: {nvidia.com/gpu: "8"}
YAML
