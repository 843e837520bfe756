#!/usr/bin/env bash
# make bench-e2e: the real descheduler (sigs.k8s.io/descheduler, HighNodeUtilization on
# nvidia.com/gpu at a few thresholds) and gpu-defrag (Enforce), same eviction budget, each
# on a fresh local control plane with the same trace-sampled fragmented start state; then
# the descheduler on `make demo`'s workload. Prints the table and writes
# docs/benchmarks-e2e.md. Not part of `make test` (about 15 minutes on 2 cores once the
# control plane and the descheduler are built and cached in ~/.cache/gpu-defrag).
#   TRACE=DIR (default ../shared/data/alibaba-gpu-v2023/csv)   SEEDS=1,2,3   BUDGET=16
#   THRESHOLDS=20,40,60,80   SCHEDULER_NAME=gpu-binpack (the GPU pods' scheduler)
#   BENCH_E2E_ARGS="..." (more flags of gpu-defrag-bench-e2e; see its --help)
set -euo pipefail
cd "$(dirname "$0")/.."

TRACE=${TRACE:-../shared/data/alibaba-gpu-v2023/csv}
SEEDS=${SEEDS:-1,2,3}
BUDGET=${BUDGET:-16}
THRESHOLDS=${THRESHOLDS:-20,40,60,80}
SCHEDULER_NAME=${SCHEDULER_NAME:-gpu-binpack}
OUT=${OUT:-docs/benchmarks-e2e.md}

echo "building the control plane and the descheduler from Go modules (cached after the first time)…" >&2
e2e/cluster/build.sh >/dev/null
descheduler=$(e2e/cluster/build-descheduler.sh)
echo "building gpu-defrag and the bench driver…" >&2
# Two builds, as the e2e harness builds gpu-defrag alone (one feature set, one artifact).
cargo build -q -p gpu-defrag-operator --bin gpu-defrag
cargo build -q -p gpu-defrag-e2e --bin gpu-defrag-bench-e2e
target_dir=${CARGO_TARGET_DIR:-target}
# shellcheck disable=SC2086 # BENCH_E2E_ARGS is a list of flags
"$target_dir/debug/gpu-defrag-bench-e2e" \
  --trace "$TRACE" --seeds "$SEEDS" --budget "$BUDGET" --thresholds "$THRESHOLDS" \
  --scheduler-name "$SCHEDULER_NAME" --descheduler "$descheduler" --doc "$OUT" ${BENCH_E2E_ARGS:-}
