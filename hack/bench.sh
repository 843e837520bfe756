#!/usr/bin/env bash
# make bench: planner quality on the Alibaba GPU trace against the baselines, planner
# speed at 10k nodes, report speed. Writes docs/benchmarks.md and prints it.
#   SEEDS=10 (seeds per workload)   TRACE=DIR (default ../shared/data/alibaba-gpu-v2023/csv)
#   EXACT_SEEDS=101..110 EXACT_WORKLOADS=default,gpushare40,multigpu30 EXACT_NODES=40
#   (the exact optimum on sub-clusters: builds gpu-defrag-sim with `--features exact`)
set -euo pipefail
cd "$(dirname "$0")/.."

SEEDS=${SEEDS:-10}
TRACE=${TRACE:-../shared/data/alibaba-gpu-v2023/csv}
WORKLOADS=default,gpushare40,gpushare80,multigpu30,multigpu50
OUT=docs/benchmarks.md
BIN=target/release/gpu-defrag-sim
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "building (release)…" >&2
# The exact optimum (section "The exact optimum on sub-clusters") needs the `exact`
# feature: HiGHS built from source (cmake, a C++ compiler, libclang).
bash hack/exact-deps.sh >&2
cargo build --release -q -p gpu-defrag-sim --features exact
cargo build --release -q -p gpu-defrag-operator --example reconcile_cost

command -v jq >/dev/null || { echo "make bench needs jq (Debian: apt-get install jq)" >&2; exit 1; }
num() { # num PATH FILE: a number of a JSON file (jq path, e.g. .planMillis); empty if absent
  jq -r "$1 // empty" "$2"
}
fmt() { # fmt DECIMALS VALUE: a rounded figure (empty stays empty)
  if [[ -z "$2" ]]; then return; fi
  awk -v v="$2" -v d="$1" 'BEGIN { printf "%.*f", d, v }'
}
check() { # check VALUE LIMIT → met / NOT met
  if [[ -z "$1" ]]; then echo "**not met** (no figure)"; return; fi
  awk -v v="$1" -v l="$2" 'BEGIN { print (v + 0 < l + 0) ? "met" : "**not met**" }'
}

WHOLE_NODE_WEIGHTS=0.02,0.05,0.07,0.1,0.15,0.2
MATRIX_CMD="gpu-defrag-sim matrix --trace $TRACE --workloads $WORKLOADS --seeds $SEEDS --load 0.9 --departures 0.3 --budget 0.05 --whole-node-weights $WHOLE_NODE_WEIGHTS"
if [[ -f "$TRACE/openb_node_list_gpu_node.csv" ]]; then
  echo "trace matrix: $WORKLOADS × $SEEDS seeds…" >&2
  "$BIN" matrix --trace "$TRACE" --workloads "$WORKLOADS" --seeds "$SEEDS" \
    --load 0.9 --departures 0.3 --budget 0.05 --whole-node-weights "$WHOLE_NODE_WEIGHTS" \
    --raw "$TMP/raw.jsonl" >"$TMP/matrix.md"
  HAVE_TRACE=1
else
  echo "trace not found at $TRACE: skipping the quality matrix (synthetic parts only)" >&2
  HAVE_TRACE=0
fi

# The exact optimum on sub-clusters (crates/sim/src/exact.rs): a MILP solved by HiGHS.
EXACT_SEEDS=${EXACT_SEEDS:-101..110}
EXACT_WORKLOADS=${EXACT_WORKLOADS:-default,gpushare40,multigpu30}
EXACT_NODES=${EXACT_NODES:-40}
EXACT_CMD="gpu-defrag-sim exact --trace $TRACE --workloads $EXACT_WORKLOADS --seeds $EXACT_SEEDS --nodes $EXACT_NODES --load 0.9 --departures 0.3 --budget 0.05 --min-budget 3 --time-limit 60 -o markdown"
if [[ $HAVE_TRACE == 1 ]]; then
  echo "exact optimum: $EXACT_WORKLOADS × seeds $EXACT_SEEDS, $EXACT_NODES nodes…" >&2
  EXACT_T0=$SECONDS
  "$BIN" exact --trace "$TRACE" --workloads "$EXACT_WORKLOADS" --seeds "$EXACT_SEEDS" \
    --nodes "$EXACT_NODES" --load 0.9 --departures 0.3 --budget 0.05 --min-budget 3 \
    --time-limit 60 -o markdown --json "$TMP/exact.json" >"$TMP/exact.md"
  EXACT_WALL=$((SECONDS - EXACT_T0))
fi

# Churn replay over days (crates/sim/src/replay.rs, crates/sim/src/replay/): every planner on the same arrivals.
REPLAY_SEEDS=${REPLAY_SEEDS:-11,12,13,14,15}
REPLAY_WORKLOADS=${REPLAY_WORKLOADS:-default,multigpu30}
REPLAY_PLOT=docs/replay.png
REPLAY_CMD="gpu-defrag-sim replay --trace $TRACE --workload $REPLAY_WORKLOADS --seed $REPLAY_SEEDS --days 14 --load 0.9 --window '0 2 * * *' --window-hours 3 --budget 0.05 -o markdown --plot $REPLAY_PLOT"
if [[ $HAVE_TRACE == 1 ]]; then
  echo "churn replay: $REPLAY_WORKLOADS × seeds $REPLAY_SEEDS, 14 days…" >&2
  REPLAY_T0=$SECONDS
  "$BIN" replay --trace "$TRACE" --workload "$REPLAY_WORKLOADS" --seed "$REPLAY_SEEDS" \
    --days 14 --load 0.9 --window "0 2 * * *" --window-hours 3 --budget 0.05 \
    -o markdown --json "$TMP/replay.json" --plot "$REPLAY_PLOT" >"$TMP/replay.md"
  REPLAY_WALL=$((SECONDS - REPLAY_T0))
  REPLAY_CPU=$(jq '[.results[].cpuSeconds] | add' "$TMP/replay.json")
  REPLAY_RUNS=$(jq '[.results[] | {workload, seed}] | unique | length' "$TMP/replay.json")
fi

# Demand runs measured over days (issue section 5): the rows it compares, at load 0.9 and
# 0.95, trace jobs only and with 30% of the load in long-running services, on `default`.
# Load 0.9 with trace jobs only is the run above (every planner); the other three
# configurations run the compared rows only (fgd-placement, FGD's descheduler and the
# oracle are the costly or the uncompared ones). Load 0.95 with services runs on 3 seeds
# (DEMAND_HEAVY_SEEDS): the cluster is over capacity at the daily peak there and the two
# polled rows cost about 6 min of CPU per seed each. DEMAND_SEEDS=11,12,13 for a shorter run.
DEMAND_SEEDS=${DEMAND_SEEDS:-$REPLAY_SEEDS}
DEMAND_HEAVY_SEEDS=${DEMAND_HEAVY_SEEDS:-11,12,13}
DEMAND_PLANNERS=none,high-node-utilization,kai-consolidation,gpu-defrag,gpu-defrag-demand,gpu-defrag-demand-only
DEMAND_CONFIGS="0.95:0 0.9:0.3 0.95:0.3"
DEMAND_CMD="gpu-defrag-sim replay --trace $TRACE --workload default --seed $DEMAND_SEEDS --days 14 --load LOAD --services SERVICES --window '0 2 * * *' --window-hours 3 --budget 0.05 --planners $DEMAND_PLANNERS -o markdown"
if [[ $HAVE_TRACE == 1 ]]; then
  DEMAND_T0=$SECONDS
  for cfg in $DEMAND_CONFIGS; do
    load=${cfg%:*} svc=${cfg#*:} seeds=$DEMAND_SEEDS
    if [[ $cfg == 0.95:0.3 ]]; then seeds=$DEMAND_HEAVY_SEEDS; fi
    echo "demand runs: load $load, services $svc × seeds $seeds, 14 days…" >&2
    "$BIN" replay --trace "$TRACE" --workload default --seed "$seeds" \
      --days 14 --load "$load" --services "$svc" --window "0 2 * * *" --window-hours 3 \
      --budget 0.05 --planners "$DEMAND_PLANNERS" \
      -o markdown --json "$TMP/demand-$load-$svc.json" >"$TMP/demand-$load-$svc.md"
  done
  DEMAND_WALL=$((SECONDS - DEMAND_T0))
  DEMAND_CPU=$(jq -s '[.[].results[].cpuSeconds] | add' "$TMP"/demand-*.json)
fi
# One verdict row of the issue's targets for a replay JSON: VERDICT JSON LOAD SERVICES ROW
# (ROW: gpu-defrag-demand or gpu-defrag-demand-only).
verdict() {
  jq -r --arg load "$2" --arg svc "$3" --arg row "$4" '
    def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
      else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def m(p; f): [.results[] | select(.workload == "default" and .planner == p) | f | select(. != null)] | median;
    def t: if . == null then "–" elif . < 60 then "\(. | round)s" elif . < 3600 then "\(. / 60 * 10 | round / 10)m"
      else "\(. / 3600 * 10 | round / 10)h" end;
    def ok(c): if c then "met" else "**not met**" end;
    (m($row; .waitSeconds.p95["8"])) as $d
    | ([("gpu-defrag", "high-node-utilization", "kai-consolidation", "none") as $p
        | {p: $p, w: m($p; .waitSeconds.p95["8"])}] | min_by(.w)) as $best
    | (m($row; .evictions) // 0 | round) as $de
    | (m($row; .demand.evictions) // 0 | round) as $dd
    | (m("kai-consolidation"; .evictions) // 0 | round) as $ke
    | m($row; .waitSeconds.p95["2-4"]) as $d24
    | m("none"; .waitSeconds.p95["2-4"]) as $n24
    | m($row; .waitSeconds.p50["8"]) as $d50
    | "| `\($row)` | \($load) | \(if ($svc | tonumber) == 0 then "trace jobs" else "services \($svc)" end) | \($d | t) against \($best.w | t) (\($best.p)): "
      + (if $best.w > 0 then "\($d / $best.w * 100 | round / 100)×, " else "" end) + ok($d <= 0.5 * $best.w)
      + " | \($de) (demand runs \($dd)) against \($ke): " + ok($de <= $ke)
      + " | \($d24 | t) against \($n24 | t): " + ok($d24 <= $n24)
      + " | \($d50 | t)" + (if ($load | tonumber) == 0.9 then ": " + ok($d50 < 900) else "" end) + " |"
  ' "$1"
}

echo "report-bench (10k nodes, 200k pods)…" >&2
# One repetition: the metric's pending-pod check is slow on this overloaded synthetic
# cluster (most of its 200k pods are pending); a time limit keeps make bench bounded.
if ! timeout "${REPORT_TIMEOUT:-600}" "$BIN" report-bench --nodes 10000 --gpus-per-node 8 --pods 200000 --reps 1 >"$TMP/report.json"; then
  echo '{ "error": "did not finish within the time limit" }' >"$TMP/report.json"
fi
echo "scale (planner on 10k nodes, 80k GPUs, 200k pods)…" >&2
"$BIN" scale --nodes 10000 --gpus-per-node 8 --pods 200000 -o json >"$TMP/scale.json"

# The operator's own reconcile on its caches (no API server), in a process of its own so
# that its peak RSS (VmHWM) is its alone.
echo "operator reconcile cost (10k nodes, 80k GPUs, 200k pods)…" >&2
RECONCILE_CMD="cargo run --release -p gpu-defrag-operator --example reconcile_cost -- --nodes 10000 --gpus-per-node 8 --pods 200000 --reps 5"
target/release/examples/reconcile_cost --nodes 10000 --gpus-per-node 8 --pods 200000 --reps 5 >"$TMP/reconcile.json"
DEMAND_COST_CMD="cargo run --release -p gpu-defrag-operator --example reconcile_cost -- --nodes 10000 --gpus-per-node 8 --pods 240000 --demand --pending-8gpu 4 --reps 3"
target/release/examples/reconcile_cost --nodes 10000 --gpus-per-node 8 --pods 240000 --demand --pending-8gpu 4 --reps 3 >"$TMP/reconcile-demand.json"
RECONCILE_CPU=$(num .reconcileCpuSeconds "$TMP/reconcile.json")
RECONCILE_WALL=$(num .reconcileWallSeconds "$TMP/reconcile.json")
RECONCILE_RSS=$(num .peakRssMiB "$TMP/reconcile.json")

LOAD_S=$(num .loadSeconds "$TMP/report.json")
PARSE_S=$(num .parseSeconds "$TMP/report.json")
NORM_S=$(num .normaliseSeconds "$TMP/report.json")
METRIC_S=$(num .metricSeconds "$TMP/report.json")
PLAN_MS=$(num .planMillis "$TMP/scale.json")
PLAN_CPU_MS=$(num .planCpuMillis "$TMP/scale.json")
LOAD_CPU_S=$(num .cpuSeconds.load "$TMP/report.json")
METRIC_CPU_S=$(num .cpuSeconds.metric "$TMP/report.json")

{
  cat <<EOF
# Benchmarks

Generated by \`make bench\` (hack/bench.sh) on $(date -u +%Y-%m-%d) — machine: $(nproc) cores
($(uname -m), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1 || echo unknown CPU)),
release build, one thread. Re-run with \`make bench\`; \`SEEDS=N make bench\` for fewer seeds.

## Planner quality on the Alibaba GPU trace (2023)

Command: \`$MATRIX_CMD\` (medians over seeds 1..$SEEDS; per-run JSON with
\`gpu-defrag-sim bench --workload W --seed S -o json\`).

How a scenario is built and measured (crates/sim):
- **Cluster**: the 1,213 GPU nodes of \`openb_node_list_gpu_node.csv\` (6,212 GPUs of 1, 2,
  4 and 8 per node, models P100/T4/V100/A10/G2/G3), device granularity (the trace shares
  single GPUs). CPU-only pods of the lists are skipped.
- **Fragmentation**: the workload's GPU pods arrive in a shuffled order (seeded) and a
  *spreading* scheduler places them (least allocated node on GPU after placement, ties at
  random; a random device that fits) until 90% of GPU capacity is requested; a list used
  up first is drawn again in a new shuffle (gpushare80 requests only 71% of capacity in
  one pass). Then 30% of the placed pods leave at random.
- **Budget**: 5% of the bound GPU pods, the same for every planner; gpu-defrag gets it as
  \`maxEvictionsPerRun\` with the per-node/namespace/workload limits lifted to it.
- **Target shapes**: derived from the pods (95% coverage), the same for every planner and
  for the metric. One more row, \`gpu-defrag-8gpu\`, is gpu-defrag given the policy a user
  who wants whole nodes for training jobs would write: the derived shapes plus an 8-GPU
  shape of weight 0.1 (the others scaled to 0.9). It is measured with the same metric as
  every other row (the derived shapes), so its drop is not flattered by its own shape.
  The table *Fragment drop against whole free 8-GPU nodes*, below the verdicts, repeats
  that row for other weights: the price of whole nodes in fragment drop.
- **Measurement**, the same for every planner: the chosen pods are evicted, then
  re-placed largest first by the bin-packing scheduler emulation (MostAllocated node on
  GPU, best-fit device); pods that fit nowhere stay pending (column *pending*).
  gpu-defrag's sources are fenced during re-placement (its fenced nodes and drained GPUs),
  as the operator does; the baselines have no fences (the descheduler relies on the
  scheduler). gpu-defrag's own forecast of the result is listed below the table.
- **Baselines**: \`high-node-utilization\` = descheduler HighNodeUtilization with
  \`nvidia.com/gpu: 50\` (nodes under 50% GPU requests are sources, least requested first,
  pods evicted while the non-source nodes' aggregate free GPU is above zero — no per-pod
  fit check); \`fgd-descheduler\` = repeatedly the most fragmented node (F_n(M)) that has a
  pod whose removal lowers F_n, evicting the pod that lowers it most.
- **Bound** (not a plan): fully free GPUs ≤ min(G − ⌈used/1000⌉, before + fractional
  knapsack of GPUs freed per eviction); free nodes likewise (nodes with fewest pods first
  within the budget; packing: smallest nodes first). Fragment rate: with single-GPU
  shapes the metric is a sum over GPUs of f(R) = Σ w·R·[R < q] (R the GPU's free milli);
  evicting a set T of pods from a GPU lowers it by at most f(R) − f(R + s_T) plus, for
  each pod wherever it lands, s·W(s) (W(s) the weight of the shapes larger than s). The
  LP relaxation of "one subset per GPU, at most B evictions in all" (greedy over each
  GPU's upper concave hull) bounds the drop any plan can reach; multi-GPU shapes add a
  per-node limit. It ignores whether the pods fit where they would have to go, so it is
  above what any plan reaches. See \`Bound\` in crates/sim/src/bench.rs.
- *drop (pp)*: fragment-rate drop in percentage points; *free 8-GPU nodes*: 8-GPU nodes
  with every GPU free.

EOF
  if [[ $HAVE_TRACE == 1 ]]; then
    cat "$TMP/matrix.md"
  else
    echo "_The trace was not found at \`$TRACE\`: the quality matrix was not run._"
  fi
  if [[ $HAVE_TRACE == 1 ]]; then
    cat <<EOF

## The exact optimum on sub-clusters

Command: \`$EXACT_CMD\` ($EXACT_WALL s wall clock in all; per-instance JSON with
\`-o json\`; needs the build with \`--features exact\`, which \`make bench\` makes).

How it is built and measured (crates/sim/src/exact.rs):
- **Sub-clusters**: $EXACT_NODES nodes drawn at random (seeded) from the trace's GPU node
  list (mixed sizes and models), fragmented the bench's way (spreading scheduler to 90%
  of GPU capacity, then 30% of the pods leave). Budget: 5% of the bound GPU pods, at
  least 3. Target shapes derived from the pods, as above. Seeds $EXACT_SEEDS (none of
  them used to tune anything; nothing in the planner was tuned for this table).
- **Optimum**: a MILP of "at most B evictions, and where each evicted pod lands (any
  node and devices it fits: GPU share, cpu, memory, GPU model), to minimise the fragment
  milli after", solved by HiGHS (time limit 60 s per instance, one thread). The metric
  is linearised exactly (each GPU's free milli on levels cut at the shapes' milli; per
  node, whether each multi-GPU shape fits); every evicted pod must land, so idle milli
  is unchanged and the rate is minimised too. The solver's plan is applied and measured
  with the bench's metric. It is the optimum when **the plan also chooses the
  landing**; the planners' rows are measured through the bin-packing scheduler
  emulation, which need not land pods where the optimum would, so the optimum is at or
  above what any planner realises. An instance the solver did not prove optimal within
  its time limit counts with its best plan found (column *solved to optimality*; row
  *solver's upper limit*: its dual bound as a share of that plan).
- *share of optimum*: a planner's rate drop over the optimum's, per instance; median,
  min and max over the seeds. *bound (bench)*: the bench's LP bound (which ignores fit)
  over the optimum. *pending (instances)*: instances where the planner left evicted pods
  pending (a pending pod raises idle milli, which can lower the rate: such a share can
  pass 100%). *optimum's evictions, scheduler's landing*: the optimum's eviction set
  re-placed by the bin-packing emulation like a planner's choice (no fences): what the
  best set of pods gives when the scheduler, not the plan, chooses where they land.

EOF
    cat "$TMP/exact.md"
  fi
  cat <<EOF

## Speed

Each phase runs on one thread. Two figures per phase: the wall clock, and the CPU time
of that thread (from \`/proc/thread-self/schedstat\`), which leaves out the time other
processes held the core — on a shared 2-core machine the wall clock swings with builds
and tests running beside it, the CPU time much less. Targets are checked against the CPU
time ("on one core"); on an idle machine the two agree.

How the figures were reached: the JSON loader reads a snapshot in one pass (each item
streamed into its type; only a file with an error is read again, to name the item and
field), whole-number quantities take a short path, and the binaries use the mimalloc
allocator (loading 200,000 pods is mostly small allocations). The planner searches
targets per node size (MostAllocated compares nodes of one size by free milli), rejects
nodes on cheap necessary conditions before the full fit check, keeps the cluster totals
as running sums, and leaves the drained node's index entry alone while it tries a unit.

| what | CPU (one thread) | wall | target | |
|---|---:|---:|---:|---|
| planner, 10,000 nodes / 80,000 GPUs / 200,000 pods (\`gpu-defrag-sim scale\`, median of 3) | $(fmt 0 "$PLAN_CPU_MS") ms | $(fmt 0 "$PLAN_MS") ms | < 1000 ms | $(check "$PLAN_CPU_MS" 1000) |
| report: parse snapshot | | $(fmt 2 "$PARSE_S") s | | |
| report: normalise | | $(fmt 2 "$NORM_S") s | | |
| report: load (parse + normalise) | $(fmt 2 "$LOAD_CPU_S") s | $(fmt 2 "$LOAD_S") s | < 5 s | $(check "$LOAD_CPU_S" 5) |
| report: metric | $(fmt 3 "$METRIC_CPU_S") s | $(fmt 3 "$METRIC_S") s | < 1 s | $(check "$METRIC_CPU_S" 1) |
| operator: one reconcile (model + report + plan + decision + status + metrics) on its caches, 10,000 nodes / 80,000 GPUs / 200,000 pods (median of 5) | $(fmt 2 "$RECONCILE_CPU") s | $(fmt 2 "$RECONCILE_WALL") s | < 2 s | $(check "$RECONCILE_CPU" 2) |
| operator: peak RSS of that process (caches + one reconcile; VmHWM) | | $(fmt 0 "$RECONCILE_RSS") MiB | < 1024 MiB | $(check "$RECONCILE_RSS" 1024) |

\`gpu-defrag-sim scale --nodes 10000 --gpus-per-node 8 --pods 200000 -o json\`:
\`\`\`json
$(cat "$TMP/scale.json")
\`\`\`
\`gpu-defrag-sim report-bench --nodes 10000 --gpus-per-node 8 --pods 200000 --reps 1\`:
\`\`\`json
$(cat "$TMP/report.json")
\`\`\`

**Operator cost at scale** (\`$RECONCILE_CMD\`, crates/operator/examples/reconcile_cost.rs):
the objects a running operator holds in its watch caches, generated in the process
(seeded) and put through the caches' own trimming and projection into kube-runtime
reflector stores:
10,000 Nodes (75% sharing GPUs through HAMi), 200,000 Pods of 4-replica Deployments
(95% GPU shares of 0.1–0.5 GPU, the rest 1–4 whole GPUs; placed at random where they
fit, so fragmented; Running and Ready), 50,000 ReplicaSets (metadata), 20 Namespaces,
5,000 PodDisruptionBudgets. One reconcile is what \`reconcile.rs\` computes from the
caches, without its API calls: \`decide::validate\`, the model of the stores' objects (as
\`Ctx::cluster\`), \`Observed::of\` (report and plan, as \`Ctx::observe\`), conflicts, run
decision, conditions, status, the status body, the policy's metrics. Peak RSS is the
process's \`VmHWM\`: it includes the generation and the caches themselves (what an
operator watching such a cluster holds), most of it:
\`\`\`json
$(cat "$TMP/reconcile.json")
\`\`\`
EOF
  cat <<'RECONCILENOTE'

What it took, and what is left (by hand): the first measurement was 18.6 s of CPU, 16 s
of it the planner matching every pod against every PDB (200,000 × 5,000 selector
checks, in `plan::movable` and again in the plan's loop); the PDBs are now indexed by
namespace and one `matchLabels` pair (`plan::PdbIndex`, the same PDBs in the same
order as the scan: unit-tested), which brought report + plan to about 1 s. The model
sorted its built pods by namespace and name (a watch cache gives them in hash order),
moving large structs; the object references are sorted instead (model 2.6 → 1.7 s).
Then (2.71 s / 2142 MiB → 2.40 s / 2007 MiB, same plan and fragment rate): the model
reads each container's requests and limits in place (`adapters::Requests` borrows
them; it copied every quantity into a map per container), parses a limit only where it
differs from its request, resolves owner chains without copying the owner references,
and sorts the pods' keys next to their references (no pod object touched while
sorting); the pod cache (then `trim_pod`) also drops limits equal to their request, images
and the other container fields nothing reads, volumes other than hostPath, emptyDir,
PersistentVolumeClaim and generic ephemeral ones, conditions other than Ready, pod
affinity, topology spread and DNS settings (a test checked the model was unchanged). Then (2.40 s / 2007 MiB → 2.06 s / 1906 MiB, the
same plan and fragment rate; five runs 1.98–2.08 s: the figure moves by ±5% with the
machine's state, so old and new builds were compared in alternating runs, where the
code before the last step measured 2.14 s and after it 2.01 s): a pod's node is found
through a name index (a hash look-up: a binary search compared the long common
prefixes of node names 14 times per pod; the model 1.31 → 1.15 s in alternating runs),
the replicas of a workload share one label map in the model (`LabelSets` in
ingest/pod.rs; a copy per pod was the model's largest allocation), a container's requests
and limits are merged in one pass (both maps are in name order; they were sorted per
container), each quantity is parsed once (CPU and memory with the validity check), the
kept annotations are found by walking the pod's few, the common scheduler names are not
copied per pod, and the HAMi pod record is split without temporary vectors or sets.
Tried and dropped: sharing owner and workload kinds (no measurable model time saved,
the planner measured slower), a division-free MostAllocated score (a profile blamed
the division; the planner measured slower with the branches), not returning freed
memory to the OS (`MIMALLOC_PURGE_DELAY=-1`: page faults per reconcile drop from about
4,700 to none, CPU time unchanged), an unstable sort of the pods' keys (slower than the
stable one here).
Then (same plan and fragment rate; measured on a slower day of the machine — the build
before measured 2.53–3.24 s that day against 2.06 s the day before — so old and new
builds were compared in alternating runs): the pod cache holds each pod's projection
(`compact::CompactPod` in core, `objects::CachedPod` in the reflector store: the
metadata, the controller reference, the scheduling fields already converted, the volume
kinds as flags, the DRA claims, phase, Ready, start time, and the requests read once —
merged per container, CPU and memory parsed — when the watch event arrives) instead of
trimmed `Pod` objects, and the model (snapshots included) is built from it; several
devices of one pod are merged by a sort in place, not a map per pod. In nine
alternating pairs the reconcile took **0.75–0.82× the CPU** of the build before
(2.53–3.24 → 1.98–2.52 s; the JSON above is from the last run) and peak RSS fell
**1906 → 876–902 MiB** (the caches after generation 1656 → 633 MiB). The projection
costs 0.18–0.32 s per 200,000 pods (`projectionSeconds`), paid once per watch event, not
per reconcile. The executor finds a planned pod in the cache by its key instead of
scanning it. Not returning freed memory (`MIMALLOC_PURGE_DELAY=-1`) measured 3–7% less
CPU here and was left off. Memory: **met**. CPU: **not met** on this machine today
(2.0–2.5 s; the ratio suggests about 1.6 s on the day the build before measured 2.06 s,
not verified): the model (1.1 s: per pod about ten strings and maps copied into the
model, the HAMi records parsed again on every reconcile, the (namespace, name) sort of
the cache's references) plus report + plan (1.0 s, `plan::State::eval` three quarters
of it). Sharing the strings between cache and model (`Arc<str>`) and keeping each pod's
resolved GPU record between reconciles are what is left. Peak memory by cluster size
(same command, `--nodes P/20 --pods P --reps 3`): 133 MiB at 20,000 pods, 249 MiB at
50,000, 477 MiB at 100,000 (docs/install.md sizes the Deployment from these).
RECONCILENOTE
  cat <<EOF

**Demand runs at scale** (\`$DEMAND_COST_CMD\`): the same generated cluster with 240,000
pods (the cluster over-full, many pending) and four pending 8-GPU pods that fit no node,
under a policy with \`demand: {minWait: 0s, outsideWindows: true}\`: the reconcile's
decision (\`decide::decide\`: the run decision and its demand arm — the waiting pods
found, then up to three demand searches) took
$(fmt 2 "$(num .phaseCpuSeconds.decide "$TMP/reconcile-demand.json")") s of CPU of a
$(fmt 2 "$(num .reconcileCpuSeconds "$TMP/reconcile-demand.json")") s reconcile
(waiting groups, evictions of the demand run started and its search steps:
\`$(jq -c .demand "$TMP/reconcile-demand.json")\`).
EOF

  cat <<'FINDINGS'

## Findings

Read with the figures above (they are regenerated; this section is not).
- **Fragment drop**: gpu-defrag's median fragment-rate drop is 1.01–1.12x the best
  baseline's (`fgd-descheduler`) on the five workloads, not the 1.5x the project set
  itself. The bound shows why: on `default` no eviction set of the budget can reach
  1.5x the baseline's drop (the bound's own drop is below that; on `gpushare40` too),
  and on the others 1.5x would need 80–96% of the bound, which ignores whether pods fit.
  gpu-defrag reaches 59–72% of it. Most of its batches drain single GPUs (one or two shares each) and small
  nodes: with single-GPU target shapes those give the most fragment milli per eviction.
  Units are ranked by the source's drop per eviction, plus a small bonus for emptying a
  whole node; ranking with the receivers' change as well (weights 0.1–1) measured lower
  on every workload (see `State::eval` and `WHOLE_NODE_BONUS` in
  crates/core/src/plan/state.rs for the sweeps).
- **Whole 8-GPU nodes**: the derived target shapes (95% coverage of the pods) contain no
  8-GPU shape on any workload of the matrix (8-GPU pods are a few percent of bound pods
  at most), so the metric values a free 8-GPU node no more than eight free GPUs anywhere.
  `high-node-utilization` frees 8-GPU nodes as a side effect of draining the least
  requested nodes whole, at the cost of the smallest drop. With the derived shapes alone
  gpu-defrag frees as many only on `gpushare80`. Told that whole nodes matter (an
  8-GPU shape of weight 0.1 in its policy, row `gpu-defrag-8gpu`), it frees more 8-GPU
  nodes than every baseline on every workload, and on three of the five still lowers the
  fragment rate more than `high-node-utilization` does (about as much on
  `gpushare40`, less on `gpushare80`). Freeing whole nodes and
  lowering the metric for single-GPU shapes pull against each other at a fixed budget;
  the policy's target shapes choose the balance. The trade-off table shows the curve.
  Each baseline sits at one end of it and, on every workload, some point of
  gpu-defrag's curve beats it on both counts: a 2% share of an 8-GPU shape beats
  `fgd-descheduler` (as much drop or more, more free 8-GPU nodes); a 2–10% share beats
  `high-node-utilization` (more drop, more free 8-GPU nodes). Beating the best of both
  at once (fgd's drop and HNU's nodes) happens only on `gpushare80`: where gpu-defrag
  frees as many 8-GPU nodes as HNU, its drop is 0.9–1.0x fgd's.
- **Forecast vs measurement**: the planner picks targets as the emulated scheduler does
  (highest MostAllocated ratio after placement, ties by node order, best-fit device), so
  its forecast of the rate after is within about 0.002 of the measured rate on four
  workloads and 0.005 on gpushare80 (it was
  1–2 points optimistic when targets were ordered by free milli alone); what remains
  comes from the re-placement order (all evicted pods, largest first) differing
  from the plan's unit-by-unit order.
- **Bound**: the free-GPU and free-node limits are tight enough to show the gap; the
  fragment-rate limit, per GPU since this version, is about 8 pp of drop at this budget
  (it was a per-node limit of about 18–26 pp before, which said little).
- **Exact optimum** (section *The exact optimum on sub-clusters*; written by hand from
  seeds 101–110): when the plan also chooses where every evicted pod lands, the optimum
  drops the fragment rate by 6.6–7.6 pp (medians, 40 nodes), and the bench's bound is
  only 6–9% above it (medians; 2–34% per instance): on these sub-clusters fit seldom
  binds, so the bound is nearly reachable. gpu-defrag reaches 56–72% of the optimum
  (medians), not the ≥ 95% set in issue 18; the best baseline, `fgd-descheduler`,
  58–65%. Why: the landing, not the choice of pods. The optimum's own eviction set,
  re-placed by the bin-packing scheduler emulation, reaches 59–69% — about gpu-defrag's
  share (less than it on `gpushare40` and `multigpu30`). The optimum lands each evicted
  pod where it fills a GPU's hole almost exactly: on `default` and `gpushare40`, seeds
  101–105, every one of the 78 GPUs that received a pod was left with at most 180 free
  milli (most with 30–60; `receiverFreeAfter` in the JSON), little for any shape to lose;
  a MostAllocated node with a best-fit device does that only by chance, and
  gpu-defrag's fences only keep pods off its sources. So 95% of this optimum needs control over where pods land (a scheduler
  scoring the metric, as FGD's placement does, or per-pod placement), not a better
  eviction set; that no eviction set reaches it through this scheduler is not proved
  here (the optimum's set is only one of them). On 60 nodes (same seeds, `--nodes 60`,
  307 s wall clock): gpu-defrag 62–73%, `fgd-descheduler` 60–67%, the optimum's
  evictions through the scheduler 60–70%, the bound 105–107% of the optimum; HiGHS
  8.3 s median per instance, 29 of 30 proved optimal (one at the 60 s limit, within
  8.4% of its dual bound). Nothing in crates/core was tuned for these figures.
FINDINGS
  if [[ $HAVE_TRACE == 1 ]]; then
    cat <<EOF

## Churn replay over days

Command: \`$REPLAY_CMD\` (medians over the seeds; per-run JSON with \`-o json\`).
Time: $REPLAY_RUNS runs (workload × seed) of 14 simulated days, all ten planners each:
$(fmt 0 "$REPLAY_CPU") s of CPU in all, $(awk -v c="$REPLAY_CPU" -v n="$REPLAY_RUNS" 'BEGIN { printf "%.0f", c / n }') s per run ($REPLAY_WALL s wall clock, which on a shared
machine counts other processes' turns too). Per planner and run:
$(jq -r '[.results[] | {planner, cpuSeconds}] | group_by(.planner) | map("\(.[0].planner) \([.[].cpuSeconds] | add / length | . * 10 | round / 10) s") | join(", ")' "$TMP/replay.json")
of CPU (one core; \`cpuSeconds\` in the JSON): 14 simulated days on the full trace
(1,213 nodes, about 800,000 arrivals); \`fgd-placement\` (FGD's scoring over every node
for each pod) and the two polled rows (\`kai-consolidation\`, \`gpu-defrag-demand\`: a
search of the core's demand planner per pod served) are most of it.
EOF
    cat <<'REPLAY'

How a replay runs (crates/sim/src/replay.rs and crates/sim/src/replay/):
- **Cluster**: the trace's 1,213 GPU nodes (6,212 GPUs, 1–8 per node, six models).
- **Arrivals**: pods drawn uniformly (seeded) from the workload's GPU pod list, Poisson
  at the rate that offers 90% of GPU capacity on average; each lifetime is drawn from
  the trace's own `deletion_time − creation_time` of pods of the same shape class
  (`share`, `1`, `2-4`, `8` GPUs), capped at 168 h (the multigpu lists have no times:
  they use `default`'s). At t = 0 the cluster holds the stationary population of that
  process (length-biased lifetimes, uniform residuals); day 1 is warm-up, not measured.
  Every planner sees the same arrivals.
- **Scheduler**: a queue in which a pod that does not fit waits without blocking others
  (FIFO among those that fit); placement by the bin-packing emulation (MostAllocated
  node on GPU, best-fit device). `fgd-placement`: FGD's scoring instead (the node and
  GPU whose fragmentation F_n(M) rises least, M the list's shapes covering 95% of its
  pods), no descheduler.
- **Windows**: `0 2 * * *` for 3 h; the descheduler runs once per window opening, at its
  start, with a budget of 5% of the running GPU pods. Evicted pods are replaced at once
  (same remaining lifetime, back in the queue); scheduling takes no time, so disruption
  is the replacement's time in the queue. `high-node-utilization` and
  `fgd-descheduler` evict their whole choice at once (the descheduler does), then the
  queue is served. gpu-defrag runs with the default policy and the budget as
  `maxEvictionsPerRun` (the per-namespace limit lifted to it, the trace having one
  namespace; `evictSingleReplicas`, each trace task being its own workload), and its
  run is the operator's own run over simulated time (the state machine
  `gpu_defrag_core::run::RunState` that the executor performs; the replay supplies what the
  executor would observe: a replacement is Ready once bound `--ready-seconds`, the plan's
  pod still on its node is its re-check verdict): its fences (drained nodes,
  single GPUs where the node can fence them) hold from the start of the run to its end,
  for every pod the scheduler places meanwhile; one eviction at a time
  (`maxInFlight: 1`), the next once the replacement is Ready, 30 s after it is bound
  (`--ready-seconds`); before each eviction the run stops when the window has ended,
  when a replacement has not been Ready for `rescheduleTimeout` (10 min: stalled), or
  when more GPU pods **created since the run started** (its replacements, arrivals
  during the run) are pending than `maxPendingGpuPods: 5` plus the replacements in
  flight — the queue that was there before does not count (`runsEnded` in the JSON).
  A planned pod that ended meanwhile is passed over. `gpu-defrag-unguarded` lifts
  `maxPendingGpuPods`; `gpu-defrag-8gpu` lifts it and adds an 8-GPU target shape of
  weight 0.1.
- **Polled rows** (every 30 s, crates/sim/src/replay/demand.rs), both through the core's
  demand planner (`plan_demand`: the fewest, then cheapest, evictions that make room for
  the pod on one node and re-place every evicted pod elsewhere, no victim of higher
  priority; every replay pod has priority 0). `gpu-defrag-demand` is the `gpu-defrag`
  row (its nightly run) plus demand runs at any time while no nightly run is in
  progress (`demand.outsideWindows: true`): the oldest pending GPU pod (up to 3 per
  poll, the first planned one runs) that has been unschedulable for at least
  `demand.minWait` (10 min) and fits no node is served with the nightly policy (its
  limits: 8 evictions per node, `minPodAge` 10 min, one unavailable replica per
  workload) and at most 16 evictions, lowered to what 64 demand evictions per hour
  (`maxEvictionsPerHour`, counted over demand runs) leave. Its pods are evicted
  (instant here) and the served pod is bound on the room at once, before the queue is
  served (the hold); the evicted pods are then re-placed by the scheduler.
  `gpu-defrag-demand-only` is the same demand runs with no nightly run (a policy in
  `Enforce` with no window and `demand.outsideWindows: true`).
  `kai-consolidation` (no windows) is a KAI-style consolidation: at every poll the
  pending GPU pods that fit no node, oldest first, up to 4, no minimum wait, each
  served by the same planner with no per-node, per-namespace, per-workload, per-run or
  hourly limit, `minPodAge` 0, no PDBs (the replay has none), at most 16 evictions that
  all re-fit elsewhere; no hold: the queue is served in its order after the evictions.
  After a search finds no room, pods of the same GPU shape are not offered again for
  2 min, and only the pods of nodes that can hold the room within the eviction limits
  (a lower bound counted from the node's pods) are given to the planner: bounds on the
  replay's CPU time.
- **Services** (`--services FRACTION`, 0 in the tables above): that share of the
  offered load is 40 long-running inference services (crates/sim/src/services.rs)
  beside the trace's jobs (which offer the rest): each one shape drawn from the list's
  shares and one-GPU pods that name no GPU model, its replica count following a daily
  curve (`round(mean · (1 + 0.2 cos(2π (h − 15 − φ)/24)))`, peak at 15:00 UTC, φ in
  ±1.5 h per service), set at every hour; scale-down deletes pending replicas first,
  then the newest running ones. Replicas are pods of one ReplicaSet per service (the
  planners move them as such); their waits count in the `share` and `1` classes.
- `oracle`: at each window start every running pod is placed again from scratch
  (largest first, best fit: the node left with least free GPU; for free), then the
  queue is served: what a good repacking at window time reaches with this scheduler
  (a reference, not a bound); a repacking that cannot place every running pod again
  is not used.
- **Measures** (days 2–14): time-averaged GPU allocation ratio; queueing delay (arrival
  → running) per class, pods still queued at the end counting with their wait so far
  (– : no pod of the class); pods queued at the end; evictions; mean disruption
  (eviction → replacement running).

**The run is the operator's.** Since the replay drives the operator's own run
(`gpu_defrag_core::run`) instead of a copy of its stop rules, and its demand rows take
`demand.minWait`, `maxEvictions`, `maxEvictionsPerHour` and the groups per look from the
core, its figures were compared with the replay before that change: `gpu-defrag-sim replay
--workload default,multigpu30 --seed 11,12` and `--workload default --seed 13 --services
0.3` (14 days, load 0.9, `--planners
none,gpu-defrag,gpu-defrag-unguarded,gpu-defrag-8gpu,gpu-defrag-demand,gpu-defrag-demand-only`):
every field of every row identical to the digit (CPU seconds aside). Three rules of the
operator the copy did not have: a run whose window ends with a replacement in flight keeps
its fences until that replacement is Ready (the copy lifted them at once); a replacement
bound but not yet Ready counts against `rescheduleTimeout` (the copy stopped counting at
binding); and a replacement stalls once it has waited *more* than `rescheduleTimeout` (the
copy stalled at exactly that). They change one row of a wider check: `gpu-defrag-sim replay
--workload default --seed 3 --days 2 --load 0.95 --services 0.3 --window '0 2 * * *'
--window '0 14 * * *' --window-hours 2 --budget 0.05 --planners gpu-defrag-unguarded` gives
349 evictions and 3 runs (2 succeeded, 1 window closed) where the copy gave 362 and 2 (1, 1),
pending at the end 1,857 where it gave 2,070 (a binary with only the run's change gives the
same as today's). The two replays part at the end of the first run, which the window's end
cuts in both (284 moves planned at 02:00 for a 2-hour window): the operator keeps its
fences until the replacement in flight is Ready, the copy lifted them at 04:00; every later
window plans on a different cluster. The operator's rules are the ones the product runs, so
the copy was the one that was wrong. The demand rows still evict at
once, where the operator paces them through the run: a gap of the replay still open.

![Allocation ratio and 8-GPU queue over 14 days, every planner](replay.png)

The picture (`--plot docs/replay.png`: the first workload and seed of the command,
`default` seed 11; allocation ratio averaged over 30 min, 8-GPU pods queued every
30 min; day 1 shaded, not measured) shows one run of each planner on the same arrivals.
REPLAY
    cat "$TMP/replay.md"
    cat <<'REPLAYFINDINGS'

Findings (written by hand from seeds 11–15; the table above is regenerated, this is not):
- **The guard counts what the run causes, and then it rarely stops one at load 0.9.**
  `maxPendingGpuPods` now counts GPU pods created since the run started (as the
  operator does); before, the replay counted the whole queue at the window's start and
  gpu-defrag skipped most windows (4–14 of 14), staying at `none`'s level. Now every
  run on `default` ends `succeeded` (14 of 14, all seeds), so gpu-defrag and
  `gpu-defrag-unguarded` are the same runs there; on `multigpu30`, where the 8-GPU class
  is over capacity, 0–3 runs of 14 per seed stop on the guard (arrivals of 8-GPU pods
  during the run that cannot start). Before (old guard, same seeds, evictions all at
  once, medians): `default`: gpu-defrag 901 evictions, p95 8-GPU wait 3.5 h, allocation
  0.9002 (now 1602, 3.1 h, 0.9014); `multigpu30`: 0 evictions, exactly `none` (now
  1207 evictions, p95 8-GPU wait 17.3 h against 18.4 h).
- **No planner clearly beats doing nothing at load 0.9.** Every descheduler moves the
  time-averaged allocation ratio by less than 0.3 pp against `none`; on `default`
  gpu-defrag's median p95 8-GPU wait is 3.1 h against 3.7 h (`none`) and 2.6 h
  (HighNodeUtilization); on `multigpu30` it is 17.3 h against 18.4 h for `none` and
  every other descheduler (oracle 14.5 h). 2-4-GPU pods almost never wait at this load.
- **Why**: (1) the trace's lifetimes are short (median about 10 minutes), so the cluster
  re-packs itself by churn within hours and a once-a-day window changes little for
  long; (2) on `multigpu30` the 8-GPU class is over capacity (pods still queued at the
  end, mostly 8-GPU): waits are set by the 8-GPU nodes being busy, not by fragments —
  even the oracle, a free best-fit repacking at each window, shortens the p95 8-GPU
  wait by about 4 h and raises allocation by 0.1 pp; (3) gpu-defrag's units (derived
  shapes: share and 1-GPU, 95% of pods) free single GPUs, not 8-GPU nodes.
- **At a higher load** (`--load 0.95`, `default`, seeds 11–13, measured once by hand
  with the new guard, not regenerated: `gpu-defrag-sim replay --workload default --seed
  11,12,13 --load 0.95 …`, 75 s of CPU for the 3 runs) the queue of 8-GPU pods is long
  and the descheduler matters more:

  | planner | alloc. ratio | evictions | pending at end | p95 wait 2-4 | p95 wait 8 | p99 wait 8 | p50 wait 8 |
  |---|---:|---:|---:|---:|---:|---:|---:|
  | none | 0.9480 | 0 | 77 | 4.4m | 13.0h | 19.3h | 6.2h |
  | high-node-utilization | 0.9523 | 319 | 18 | 23.5m | 8.5h | 15.0h | 58.4m |
  | fgd-descheduler | 0.9510 | 3534 | 8 | 12.7m | 11.0h | 18.1h | 2.8h |
  | gpu-defrag | 0.9531 | 916 | 2 | 23.4m | 8.2h | 15.6h | 57.9m |
  | gpu-defrag-unguarded | 0.9533 | 1084 | 2 | 19.0m | 8.7h | 16.9h | 47.1m |
  | gpu-defrag-8gpu | 0.9531 | 1077 | 2 | 23.5m | 8.0h | 15.2h | 52.5m |
  | fgd-placement | 0.9501 | 0 | 10 | 0s | 10.8h | 18.3h | 4.1h |
  | oracle | 0.9446 | 0 | 77 | 4.4m | 13.6h | 19.9h | 4.2h |

  With its default policy gpu-defrag now shortens the p95 8-GPU wait from 13.0 h to
  8.2 h (−37%; HighNodeUtilization −35%, fgd-descheduler −15%) at the highest
  allocation ratio of the descheduler rows (+0.5 pp on `none`) and 2 pods queued at the
  end (77 with none), with a quarter of fgd-descheduler's evictions but more than
  HighNodeUtilization's; 2-4-GPU pods wait longer at p95 (23 min against 4 min with no
  descheduler, as with HighNodeUtilization). Here the guard does act: 3–12 of 14 runs
  per seed stop on it, and the unguarded runs evict 18–80% more for no shorter p95
  wait. With the old guard (the whole queue counted) gpu-defrag ran on few windows
  (171 evictions, p95 8-GPU wait 13.6 h, at `none`'s level). Some runs end `stalled`
  (a replacement not placed within 10 min while the drained nodes are fenced). The
  oracle's greedy repacking cannot place every running pod again at this load on most
  windows (then it is not used), so it is no reference here.
- Replacements are never left waiting long: mean disruption is 0–6 s (evicted pods
  mostly fit elsewhere at once; scheduling takes no time in the replay).
REPLAYFINDINGS
    cat <<EOF

### Demand runs over days

Commands: the run above (load 0.9, trace jobs only, every planner, \`default\`) and
\`$DEMAND_CMD\` for (LOAD, SERVICES) in $DEMAND_CONFIGS (medians over seeds
$DEMAND_SEEDS, at load 0.95 with services seeds $DEMAND_HEAVY_SEEDS; none of these seeds was used
for tuning). Time: $(fmt 0 "$DEMAND_CPU") s of CPU
for the three ($DEMAND_WALL s wall clock); per planner and run:
$(jq -rs '[.[].results[] | {planner, cpuSeconds}] | group_by(.planner) | map("\(.[0].planner) \([.[].cpuSeconds] | add / length | . * 10 | round / 10) s") | join(", ")' "$TMP"/demand-*.json).

The issue's targets, per row, load and mix (medians over the seeds; "evictions" of
\`gpu-defrag-demand\` include its nightly runs, "demand runs" are the demand runs' own;
\`gpu-defrag-demand-only\` has no nightly run; "the best other row" is the best of
nightly \`gpu-defrag\`, HighNodeUtilization, \`kai-consolidation\` and \`none\`):

| row | load | mix | p95 wait 8-GPU against the best other row, ≤ 0.5× | evictions against kai-consolidation, ≤ | p95 wait 2-4 GPU against none, ≤ | p50 wait 8-GPU (< 15 min at 0.9) |
|---|---|---|---|---|---|---|
$(for row in gpu-defrag-demand gpu-defrag-demand-only; do
  verdict "$TMP/replay.json" 0.9 0 $row
  for cfg in $DEMAND_CONFIGS; do verdict "$TMP/demand-${cfg%:*}-${cfg#*:}.json" "${cfg%:*}" "${cfg#*:}" $row; done
done)

The rows of load 0.9, trace jobs only, are those of the first table above.
EOF
    for cfg in $DEMAND_CONFIGS; do cat "$TMP/demand-${cfg%:*}-${cfg#*:}.md"; done
    cat <<'DEMANDFINDINGS'

Findings (written by hand from seeds 11–15; the tables above are regenerated, this is not;
load 0.95 with services was not measured to the end when it was written):
- **Against the rows without consolidation, demand runs do what they are for.** The p95
  wait of 8-GPU pods falls from 13 h (`none`), 8.5 h (HighNodeUtilization) and 11.1 h
  (nightly `gpu-defrag`) to 1.3 h at load 0.95, and from 14.1 h, 7.5 h and 5.6 h to
  1.6 h with services at 0.9 (0.10–0.29× of each of them), at an allocation ratio
  0.1–0.4 pp above `none`'s (KAI's is at most 0.06 pp higher still), no pod left queued
  at the end, and a median 8-GPU wait of 0 s everywhere (the < 15 min target holds at
  0.9 in both mixes).
- **Against KAI-style consolidation the 0.5× target is not met**: 1.18× its p95 at 0.95
  (1.3 h against 1.1 h), 1.37× with services at 0.9 (1.6 h against 1.1 h). At 0.9 with
  trace jobs only both rows keep fewer than 5% of 8-GPU pods waiting at all, so both p95
  are 0 s and the target holds only trivially (p99: 10.4 min against 22 s). Why: in the
  replay an eviction costs no time, so consolidation that acts at once, for every pod,
  with no limit is nearly free; `gpu-defrag-demand` waits `minWait` (10 min: its p99 at
  0.9 is that wait) and keeps its safety limits — 8 evictions per node, `minPodAge`
  10 min, one unavailable replica per workload (a service with a pending replica gives
  none of its running ones), 64 demand evictions per hour (reached 107–133 polls on 3
  of 5 seeds with services) — so it turns down many rooms KAI takes (NoRoom searches
  outnumber planned rooms by up to 13× over a run with services; a pod with no room is
  searched again every 2 min). The p95 that remains is set by
  bursts of 8-GPU arrivals at the peak in which no row finds room for hours (no free
  capacity to re-place the victims).
- **Evictions: met by demand runs alone, not with the nightly run.** `gpu-defrag-demand`
  evicts 1.29× KAI's at 0.95, 1.51× with services at 0.9 and 7.7× at 0.9, because of its
  nightly run (1,500–3,000 of its evictions; its demand runs alone evict 0.49×, 0.48× and
  0.90× of KAI's). `gpu-defrag-demand-only` (no nightly run) meets the eviction target in
  all three: 983 against 1,813 (0.54×) at 0.95, 1,352 against 2,810 (0.48×) with
  services, 187 against 256 (0.73×) at 0.9. Its demand runs need about as many
  evictions as with the nightly run beside them (983 against 885, 1,352 against 1,361,
  187 against 230), so what the nightly run buys is the rest of the tail: without it
  the p95 8-GPU wait is 1.5 h instead of 1.3 h at 0.95 (1.30× KAI's), 1.8 h instead of
  1.6 h with services (1.61×) and 5 s instead of 0 s at 0.9 (p99 10.3 min either way;
  against KAI's 0 s that misses the 0.5× target there too), and 2–4-GPU pods wait
  longer at p95 (30.1 min instead of 25.5 min at 0.95, 41.6 min instead of 26 min with
  services). Both are policies a user can write; neither meets every target.
- **2–4-GPU pods**: no worse than with no descheduler at 0.9 (0 s; 26 min against 1.6 h
  with services) but **not met at 0.95 with trace jobs only**: 25.5 min against 4.4 min
  (5.8×; KAI 26.1 min, HighNodeUtilization 23.5 min, nightly gpu-defrag 16.6 min): every
  row that makes whole 8-GPU rooms at this load takes nodes a 2–4-GPU pod would
  otherwise have got, and the hold gives the room to the 8-GPU pod first (no row that
  serves 8-GPU pods at this load does better than 16.6 min; `gpu-defrag-demand-only`
  30.1 min).
- **Services**: 30% of the load as daily-scaled inference replicas makes 8-GPU waits
  much longer for every row without consolidation (`none`: p95 14.1 h at 0.9 against
  3.7 h with trace jobs only): the replicas are long-lived, so churn no longer re-packs
  the cluster. The polled rows evict services' replicas too (1,050–1,330 of their
  evictions).
- Tuning: none of the replay's rows was tuned; the services curve's amplitude (0.2, not
  the 0.3 first tried) was set on seed 1 so that the daily peak does not put load 0.9
  over capacity.
DEMANDFINDINGS
  fi
} >"$OUT"

cat "$OUT"
