//! Human output: the report summary and a terminal heatmap (a row per node, a cell
//! per GPU shaded by use). Large clusters are condensed: nodes with the same picture
//! are grouped, and at most `max_rows` rows are printed.
use std::fmt::Write;

use chrono::{DateTime, Utc};
use gpu_defrag_api::v1alpha1::{Condition, DefragPolicyStatus, RunRecord};
use gpu_defrag_core::frag::{NodeReport, Report};
use kube::api::DynamicObject;

/// Shade for a GPU's used milli: free, sliver, partly, mostly, full.
fn cell(used: u32) -> char {
    match used {
        0 => '·',
        1..=250 => '░',
        251..=600 => '▒',
        601..=999 => '▓',
        _ => '█',
    }
}

/// Shade of a GPU carved into MIG partitions (DRA partitionable devices), by its used
/// milli: a quarter, a half, three quarters, full.
fn mig_cell(used: u32) -> char {
    match used {
        0..=250 => '◔',
        251..=600 => '◑',
        601..=999 => '◕',
        _ => '●',
    }
}

fn pct(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

fn gpus(milli: u64) -> String {
    format!("{:.2}", milli as f64 / 1000.0)
}

/// The summary block.
pub fn summary(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Fragment rate      {}  ({} of {} idle GPUs unusable by the target shapes)",
        pct(r.fragment_rate),
        gpus(r.fragment_milli),
        gpus(r.idle_milli)
    );
    let _ = writeln!(
        s,
        "Nodes counted      {}   GPUs {}",
        r.nodes_counted, r.gpus
    );
    let _ = writeln!(
        s,
        "Fully free         {} GPUs, {} whole nodes (largest free block on one node: {} GPUs)",
        r.fully_free_gpus, r.fully_free_nodes, r.largest_free_gpus_on_a_node
    );
    let _ = writeln!(
        s,
        "Stranded           {} GPUs idle on partly used GPUs",
        gpus(r.stranded_milli)
    );
    let _ = writeln!(s, "Pending, no fit    {} GPU pods", r.pending_unplaceable);
    if r.unknown_pods > 0 {
        let reasons: Vec<String> = r
            .unknown_by_reason
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            s,
            "Unknown pods       {} (never moved; their nodes are never drained): {}",
            r.unknown_pods,
            reasons.join(", ")
        );
    } else {
        let _ = writeln!(s, "Unknown pods       0");
    }
    let shapes: Vec<String> = r
        .target_shapes
        .iter()
        .map(|t| {
            let g = if t.milli_per_gpu == 1000 {
                format!("{}×GPU", t.gpus)
            } else {
                format!("{}×{}m", t.gpus, t.milli_per_gpu)
            };
            format!("{g} ({:.0}%)", t.weight * 100.0)
        })
        .collect();
    let _ = writeln!(s, "Target shapes      {}", shapes.join(", "));
    for m in &r.mig {
        let _ = writeln!(
            s,
            "MIG                {} {}: {}/{} free",
            m.node, m.profile, m.free, m.capacity
        );
    }
    s
}

fn row_picture(n: &NodeReport) -> String {
    n.used
        .iter()
        .enumerate()
        .map(|(i, u)| {
            if n.devices.get(i).is_some_and(|d| !d.partitions.is_empty()) {
                mig_cell(*u)
            } else {
                cell(*u)
            }
        })
        .collect()
}

/// The heatmap: nodes sorted by fragment (worst first), identical pictures condensed.
pub fn heatmap(r: &Report, max_rows: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "GPU use per node (· free  ░ ≤25%  ▒ ≤60%  ▓ <100%  █ full)"
    );
    if r.nodes
        .iter()
        .any(|n| n.devices.iter().any(|d| !d.partitions.is_empty()))
    {
        let _ = writeln!(
            s,
            "  ◔ ◑ ◕ ● a GPU carved into MIG partitions (DRA), by share used"
        );
    }
    let mut nodes: Vec<&NodeReport> = r.nodes.iter().collect();
    nodes.sort_by(|a, b| {
        b.fragment_milli
            .cmp(&a.fragment_milli)
            .then(a.name.cmp(&b.name))
    });
    // Condense: consecutive nodes with the same picture and fragment become one row.
    let mut rows: Vec<(String, String, u64, usize)> = Vec::new();
    for n in nodes {
        let pic = row_picture(n);
        match rows.last_mut() {
            Some(last)
                if last.1 == pic && last.2 == n.fragment_milli && r.nodes.len() > max_rows =>
            {
                last.3 += 1
            }
            _ => rows.push((n.name.clone(), pic, n.fragment_milli, 1)),
        }
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(4).min(40);
    let total = rows.len();
    for (name, pic, frag, count) in rows.iter().take(max_rows) {
        let label = if *count > 1 {
            format!("{name} +{}", count - 1)
        } else {
            name.clone()
        };
        let _ = writeln!(s, "{label:<width$}  {pic:<8}  fragment {}", gpus(*frag));
    }
    if total > max_rows {
        let _ = writeln!(
            s,
            "… {} more rows (use -o json for every node)",
            total - max_rows
        );
    }
    s
}

/// The plan as a table: before, moves, after.
pub fn plan(before: &Report, after: &Report, p: &gpu_defrag_core::plan::Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "BEFORE");
    s.push_str(&summary(before));
    let _ = writeln!(
        s,
        "\nPLAN: {} evictions in {} batches",
        p.moves.len(),
        p.batches.len()
    );
    for (i, b) in p.batches.iter().enumerate() {
        let unit = match &b.gpu {
            Some(g) => format!("{:?} {} {}", b.kind, b.node, g),
            None => format!("{:?} {}", b.kind, b.node),
        };
        let _ = writeln!(
            s,
            "  batch {i:>3}  {unit:<40} {} moves, fragment after {}",
            b.moves,
            pct(b.after.fragment_rate)
        );
        for m in p.moves.iter().filter(|m| m.batch == i) {
            let to = if m.to_devices.is_empty() {
                m.to_node.clone()
            } else {
                format!("{} {}", m.to_node, m.to_devices.join(","))
            };
            let _ = writeln!(s, "             {} → {to}", m.pod);
        }
    }
    if !p.skipped.is_empty() {
        let skipped: Vec<String> = p.skipped.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  not movable: {}", skipped.join(", "));
        // A few pods per code; `-o json` lists every one (docs/user-guide.md says what
        // each code means and what makes it go away).
        for code in p.skipped.keys() {
            let pods: Vec<&str> = p
                .skipped_pods
                .iter()
                .filter(|sp| sp.code == code)
                .map(|sp| sp.pod.as_str())
                .collect();
            if pods.is_empty() {
                continue;
            }
            let more = if pods.len() > 5 {
                format!(" … {} more", pods.len() - 5)
            } else {
                String::new()
            };
            let shown: Vec<&str> = pods.into_iter().take(5).collect();
            let _ = writeln!(s, "    {code}: {}{more}", shown.join(", "));
        }
    }
    for note in &p.unchecked {
        let _ = writeln!(s, "  not checked: {note}");
    }
    if !p.settling_nodes.is_empty() {
        let _ = writeln!(
            s,
            "  receive no pod yet: {}",
            settling_text(&p.settling_nodes, 5)
        );
    }
    let _ = writeln!(s, "\nAFTER (expected)");
    s.push_str(&summary(after));
    s
}

/// The first `n` nodes that receive no planned pod yet, each with why, and how many more.
pub fn settling_text(nodes: &[gpu_defrag_core::plan::SettlingNode], n: usize) -> String {
    let shown: Vec<String> = nodes
        .iter()
        .take(n)
        .map(|x| format!("{} ({})", x.node, x.why))
        .collect();
    let more = nodes.len().saturating_sub(n);
    if more > 0 {
        format!("{} … {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

// ---------------------------------------------------------------- policy status

/// What `status` shows of one DefragPolicy.
#[derive(Debug, Clone, Default)]
pub struct PolicyView {
    /// Name.
    pub name: String,
    /// `spec.mode` as written (`DryRun` when absent).
    pub mode: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The status (defaults when the operator has not written one yet).
    pub status: DefragPolicyStatus,
}

/// The output of `status`: for one named policy (`one`) its details or its raw status
/// (`json`); for all, one row per policy or an object of raw statuses by name.
pub fn status(objs: &[DynamicObject], one: bool, json: bool) -> serde_json::Result<String> {
    let raw = |o: &DynamicObject| {
        o.data
            .get("status")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({}))
    };
    if json {
        let v = if one {
            objs.first().map(raw).unwrap_or_default()
        } else {
            let all: serde_json::Map<String, serde_json::Value> = objs
                .iter()
                .map(|o| (o.metadata.name.clone().unwrap_or_default(), raw(o)))
                .collect();
            serde_json::Value::Object(all)
        };
        return Ok(format!("{}\n", serde_json::to_string_pretty(&v)?));
    }
    let views: Vec<PolicyView> = objs
        .iter()
        .map(|o| PolicyView {
            name: o.metadata.name.clone().unwrap_or_default(),
            mode: o
                .data
                .pointer("/spec/mode")
                .and_then(|m| m.as_str())
                .unwrap_or("DryRun")
                .to_string(),
            generation: o.metadata.generation,
            // A status this version cannot read shows as empty; -o json has it raw.
            status: serde_json::from_value(raw(o)).unwrap_or_default(),
        })
        .collect();
    let now = Utc::now();
    Ok(match views.first() {
        Some(v) if one => status_detail(v, now),
        _ if views.is_empty() => "No DefragPolicies found.\n".to_string(),
        _ => status_table(&views, now),
    })
}

/// Lines of cells as a left-aligned table, two spaces between columns.
pub fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut width = vec![0; n];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut s = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 < r.len() {
                let pad = width[i] - c.chars().count();
                let _ = write!(line, "{c}{}  ", " ".repeat(pad));
            } else {
                line.push_str(c);
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
    s
}

fn parse_ts(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A span as `2d3h`, `7h32m`, `4m10s`, `12s`.
fn span(d: chrono::TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    let (days, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{sec}s")
    } else {
        format!("{sec}s")
    }
}

/// `3m10s ago` / `in 7h32m` for an RFC 3339 time, empty when unreadable.
fn relative(ts: &str, now: DateTime<Utc>) -> String {
    match parse_ts(ts) {
        Some(t) if t <= now => format!("{} ago", span(now - t)),
        Some(t) => format!("in {}", span(t - now)),
        None => String::new(),
    }
}

fn with_relative(ts: &str, now: DateTime<Utc>) -> String {
    let r = relative(ts, now);
    if r.is_empty() {
        ts.to_string()
    } else {
        format!("{ts} ({r})")
    }
}

/// The conditions at a glance: the types that are True (`Ready`, `InWindow`, `Executing`,
/// `Degraded`, `Conflict`), `NotReady(<reason>)` when Ready is False, `Outdated` when
/// the status was computed for an older generation of the spec.
pub fn conditions_summary(p: &PolicyView) -> String {
    let conds = &p.status.conditions;
    if conds.is_empty() {
        return "-".into();
    }
    let mut parts = Vec::new();
    for c in conds {
        match (c.type_.as_str(), c.status.as_str()) {
            ("Ready", "False") => parts.push(format!("NotReady({})", c.reason)),
            (t, "True") => parts.push(t.to_string()),
            (t, "Unknown") => parts.push(format!("{t}?")),
            _ => {}
        }
    }
    if let (Some(seen), Some(g)) = (p.status.observed_generation, p.generation)
        && seen < g
    {
        parts.push("Outdated".into());
    }
    parts.join(",")
}

fn run_brief(r: &RunRecord) -> String {
    let mut s = format!("{} {}/{}", r.result, r.evicted, r.planned);
    let mut extra = Vec::new();
    for (n, what) in [
        (r.blocked, "blocked"),
        (r.bounced, "bounced"),
        (r.failed, "failed"),
    ] {
        if n > 0 {
            extra.push(format!("{n} {what}"));
        }
    }
    if !extra.is_empty() {
        let _ = write!(s, " ({})", extra.join(", "));
    }
    s
}

fn window_brief(st: &DefragPolicyStatus, now: DateTime<Utc>) -> String {
    match &st.next_window {
        None => "-".into(),
        Some(w) if w.open => match parse_ts(&w.end) {
            Some(end) if end > now => format!("open, {} left", span(end - now)),
            _ => "open".into(),
        },
        Some(w) => {
            let r = relative(&w.start, now);
            if r.is_empty() { w.start.clone() } else { r }
        }
    }
}

/// One row per policy.
pub fn status_table(policies: &[PolicyView], now: DateTime<Utc>) -> String {
    let mut rows = vec![
        [
            "NAME",
            "MODE",
            "FRAGMENT",
            "PLANNED",
            "NEXT-WINDOW",
            "ACTIVE-RUN",
            "LAST-RUN",
            "SKIPPED",
            "CONDITIONS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in policies {
        let st = &p.status;
        rows.push(vec![
            p.name.clone(),
            p.mode.clone(),
            st.fragmentation
                .as_ref()
                .map(|f| format!("{:.3}", f.fragment_rate))
                .unwrap_or_else(|| "-".into()),
            st.plan
                .as_ref()
                .map(|pl| pl.total_moves.to_string())
                .unwrap_or_else(|| "-".into()),
            window_brief(st, now),
            st.active_run
                .as_ref()
                .map(run_brief)
                .unwrap_or_else(|| "-".into()),
            st.last_runs
                .first()
                .map(run_brief)
                .unwrap_or_else(|| "-".into()),
            st.skipped.values().sum::<i64>().to_string(),
            conditions_summary(p),
        ]);
    }
    columns(&rows)
}

/// Moves listed by [`status_detail`] at most (`-o json` has every recorded one).
const DETAIL_MOVES: usize = 10;

/// Everything the status of one policy says, for people.
pub fn status_detail(p: &PolicyView, now: DateTime<Utc>) -> String {
    let st = &p.status;
    let mut s = status_table(std::slice::from_ref(p), now);
    let _ = writeln!(s);
    write_fragmentation(&mut s, st, now);
    write_plan(&mut s, st, now);
    write_window(&mut s, st, now);
    write_runs(&mut s, st, now);
    write_conditions(&mut s, st, now);
    write_skipped(&mut s, st);
    write_idle(&mut s, st, now);
    s
}

/// Writes the fragmentation lines of a policy's status.
fn write_fragmentation(s: &mut String, st: &DefragPolicyStatus, now: DateTime<Utc>) {
    match &st.fragmentation {
        Some(f) => {
            let _ = writeln!(
                s,
                "Fragmentation  rate {:.3}: {} of {} idle GPUs unusable by the target shapes",
                f.fragment_rate,
                gpus(f.fragment_milli.max(0) as u64),
                gpus(f.idle_milli.max(0) as u64)
            );
            let _ = writeln!(
                s,
                "               {} nodes, {} GPUs; fully free: {} GPUs, {} whole nodes; stranded {} GPUs",
                f.nodes,
                f.gpus,
                f.fully_free_gpus,
                f.fully_free_nodes,
                gpus(f.stranded_milli.max(0) as u64)
            );
            let _ = writeln!(
                s,
                "               unknown pods {}; pending GPU pods that fit nowhere {}",
                f.unknown_pods, f.pending_unplaceable
            );
            let _ = writeln!(
                s,
                "               measured {}",
                with_relative(&f.observed_at, now)
            );
        }
        None => {
            let _ = writeln!(s, "Fragmentation  not measured yet");
        }
    }
}

/// Writes the plan lines of a policy's status: its totals, the dry-run check and the first moves.
fn write_plan(s: &mut String, st: &DefragPolicyStatus, now: DateTime<Utc>) {
    match &st.plan {
        Some(pl) => {
            let _ = writeln!(
                s,
                "Plan           {} evictions in {} batches; expected fragment rate {:.3}, {} GPUs fully free",
                pl.total_moves, pl.batches, pl.expected_fragment_rate, pl.expected_fully_free_gpus
            );
            if let Some(c) = &pl.dry_run_check {
                let _ = writeln!(
                    s,
                    "               server-side dry run of the first evictions: {} allowed, {} blocked, {} failed",
                    c.allowed, c.blocked, c.failed
                );
                for b in &c.blocked_pods {
                    let _ = writeln!(s, "                 refused: {b}");
                }
            }
            for m in pl.moves.iter().take(DETAIL_MOVES) {
                let dev = |d: &[String]| {
                    if d.is_empty() {
                        String::new()
                    } else {
                        format!(" [{}]", d.join(","))
                    }
                };
                let _ = writeln!(
                    s,
                    "               batch {:>3}  {}  {}{} → {}{}",
                    m.batch,
                    m.pod,
                    m.from_node,
                    dev(&m.from_devices),
                    m.to_node,
                    dev(&m.to_devices)
                );
            }
            let listed = pl.moves.len().min(DETAIL_MOVES) as i64;
            if pl.total_moves > listed {
                let _ = writeln!(
                    s,
                    "               … {} more (status lists the first {}; -o json prints them)",
                    pl.total_moves - listed,
                    pl.moves.len()
                );
            }
            let _ = writeln!(
                s,
                "               computed {}",
                with_relative(&pl.computed_at, now)
            );
        }
        None => {
            let _ = writeln!(s, "Plan           none yet");
        }
    }
}

/// Writes the window line of a policy's status.
fn write_window(s: &mut String, st: &DefragPolicyStatus, now: DateTime<Utc>) {
    match &st.next_window {
        Some(w) => {
            let _ = writeln!(
                s,
                "Window         {} {} → {} ({})",
                if w.open { "open" } else { "next" },
                w.start,
                w.end,
                window_brief(st, now)
            );
        }
        None => {
            let _ = writeln!(
                s,
                "Window         none (no spec.windows: no defragmentation run)"
            );
        }
    }
}

/// A table of run records, indented, with times relative to `now`.
fn runs_table(runs: &[&RunRecord], now: DateTime<Utc>) -> String {
    let mut rows = vec![
        [
            "ID", "RESULT", "STARTED", "FINISHED", "PLANNED", "EVICTED", "BLOCKED", "BOUNCED",
            "FAILED", "FRAGMENT", "MESSAGE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in runs {
        rows.push(vec![
            r.id.clone(),
            r.result.clone(),
            relative(&r.started_at, now),
            r.finished_at
                .as_deref()
                .map(|f| relative(f, now))
                .unwrap_or_else(|| "-".into()),
            r.planned.to_string(),
            r.evicted.to_string(),
            r.blocked.to_string(),
            r.bounced.to_string(),
            r.failed.to_string(),
            match r.fragment_rate_after {
                Some(a) => format!("{:.3}→{a:.3}", r.fragment_rate_before),
                None => format!("{:.3}→", r.fragment_rate_before),
            },
            r.message.clone(),
        ]);
    }
    indent(&columns(&rows), "  ")
}

/// Writes the active run and the last runs of a policy's status.
fn write_runs(s: &mut String, st: &DefragPolicyStatus, now: DateTime<Utc>) {
    match &st.active_run {
        Some(r) => {
            let _ = writeln!(s, "Active run     ends by {}", r.window_end);
            s.push_str(&runs_table(&[r], now));
        }
        None => {
            let _ = writeln!(s, "Active run     none");
        }
    }
    if st.last_runs.is_empty() {
        let _ = writeln!(s, "Last runs      none");
    } else {
        let _ = writeln!(s, "Last runs (newest first)");
        s.push_str(&runs_table(&st.last_runs.iter().collect::<Vec<_>>(), now));
    }
}

/// Writes the conditions of a policy's status.
fn write_conditions(s: &mut String, st: &DefragPolicyStatus, now: DateTime<Utc>) {
    if st.conditions.is_empty() {
        let _ = writeln!(
            s,
            "Conditions     none yet (the operator has not reconciled it)"
        );
    } else {
        let _ = writeln!(s, "Conditions");
        s.push_str(&indent(&conditions_table(&st.conditions, now), "  "));
    }
}

/// Writes the skipped-pod counts of a policy's status.
fn write_skipped(s: &mut String, st: &DefragPolicyStatus) {
    if st.skipped.is_empty() {
        let _ = writeln!(s, "Skipped pods   none");
    } else {
        let list: Vec<String> = st.skipped.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            s,
            "Skipped pods   {} (not movable, by reason)",
            list.join(", ")
        );
    }
}

/// Writes the idle allocated GPUs of a policy's status.
fn write_idle(s: &mut String, st: &DefragPolicyStatus, now: DateTime<Utc>) {
    if let Some(i) = &st.idle_allocated {
        let _ = writeln!(
            s,
            "Idle GPUs      {} GPUs ({} milli) allocated to {} idle pods: activity under {} for {}; \
             {} of {} GPU pods measured, {}",
            i.gpus,
            i.milli,
            i.pods,
            i.threshold,
            i.lookback,
            i.measured_pods,
            i.gpu_pods,
            with_relative(&i.observed_at, now)
        );
        for p in &i.idle_pods {
            let _ = writeln!(
                s,
                "  {}  {}  {} GPUs, peak {}",
                p.pod, p.node, p.gpus, p.peak_activity
            );
        }
        if (i.idle_pods.len() as i64) < i.pods {
            let _ = writeln!(s, "  … {} more", i.pods - i.idle_pods.len() as i64);
        }
    }
}

fn conditions_table(conds: &[Condition], now: DateTime<Utc>) -> String {
    let mut rows = vec![
        ["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"]
            .map(String::from)
            .to_vec(),
    ];
    for c in conds {
        rows.push(vec![
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            relative(&c.last_transition_time, now),
            c.message.clone(),
        ]);
    }
    columns(&rows)
}

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DRA: the CLI's snapshot reader takes ResourceSlices, ResourceClaims and
    /// DeviceClasses; a GPU carved into MIG partitions has its own shade.
    #[test]
    fn dra_snapshots_report_devices_and_mig_partitions() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../core/tests/fixtures");
        let read = |f: &str| {
            let objs =
                crate::input::read_snapshot(std::path::Path::new(&format!("{dir}/{f}"))).unwrap();
            let c = gpu_defrag_core::ingest::build_cluster(&objs, None);
            gpu_defrag_core::frag::report(&c, &gpu_defrag_core::policy::Policy::default())
        };
        let r = read("dra-whole.yaml");
        assert_eq!(r.gpus, 32);
        let s = summary(&r);
        assert!(s.contains("Nodes counted      4   GPUs 32"), "{s}");
        let r = read("dra-mig.yaml");
        let s = summary(&r);
        assert!(
            s.contains("MIG                mig-0 1g.10gb: 2/4 free"),
            "{s}"
        );
        let h = heatmap(&r, 10);
        assert!(h.contains("mig-0  ◕█"), "{h}");
        assert!(h.contains("MIG partitions"), "{h}");
    }

    #[test]
    fn shades_cover_the_range() {
        assert_eq!(cell(0), '·');
        assert_eq!(cell(1000), '█');
        assert_eq!(cell(500), '▒');
    }

    fn view() -> PolicyView {
        let status: DefragPolicyStatus = serde_json::from_value(serde_json::json!({
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "ok",
                 "lastTransitionTime": "2026-12-02T10:00:00Z"},
                {"type": "InWindow", "status": "False", "reason": "WindowClosed", "message": "",
                 "lastTransitionTime": "2026-12-02T10:00:00Z"},
                {"type": "Degraded", "status": "True", "reason": "PlanPartlyBlocked",
                 "message": "1 refused", "lastTransitionTime": "2026-12-02T10:00:00Z"}
            ],
            "observedGeneration": 2,
            "fragmentation": {"fragmentRate": 0.5, "fragmentMilli": 16000, "idleMilli": 32000,
                "gpus": 32, "fullyFreeGpus": 8, "fullyFreeNodes": 0, "strandedMilli": 0,
                "unknownPods": 0, "pendingUnplaceable": 1, "nodes": 4,
                "observedAt": "2026-12-02T11:59:50Z"},
            "plan": {"totalMoves": 3, "batches": 1, "expectedFragmentRate": 0.0,
                "expectedFullyFreeGpus": 16, "computedAt": "2026-12-02T11:59:50Z",
                "moves": [{"pod": "ns/a", "fromNode": "n1", "toNode": "n2", "batch": 0,
                           "reason": "drain node n1"}]},
            "nextWindow": {"start": "2026-12-02T14:00:00+00:00", "end": "2026-12-02T17:00:00+00:00"},
            "lastRuns": [{"id": "r1", "startedAt": "2026-12-01T14:00:00Z", "result": "Partial",
                "planned": 10, "evicted": 8, "blocked": 2, "bounced": 0, "failed": 0,
                "fragmentRateBefore": 0.4, "fragmentRateAfter": 0.1,
                "finishedAt": "2026-12-01T14:05:00Z"}],
            "skipped": {"too-young": 5, "job-pod": 2}
        }))
        .unwrap();
        PolicyView {
            name: "nightly".into(),
            mode: "Enforce".into(),
            generation: Some(3),
            status,
        }
    }

    #[test]
    fn status_table_row() {
        let now = parse_ts("2026-12-02T12:00:00Z").unwrap();
        let t = status_table(&[view()], now);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME     MODE     FRAGMENT"), "{t}");
        for want in [
            "nightly",
            "Enforce",
            "0.500",
            "in 2h0m",
            "Partial 8/10 (2 blocked)",
            " 7 ",
            "Ready,Degraded,Outdated",
        ] {
            assert!(lines[1].contains(want), "{want:?} in {t}");
        }
    }

    #[test]
    fn status_detail_sections() {
        let now = parse_ts("2026-12-02T12:00:00Z").unwrap();
        let d = status_detail(&view(), now);
        for want in [
            "rate 0.500: 16.00 of 32.00 idle GPUs",
            "measured 2026-12-02T11:59:50Z (10s ago)",
            "3 evictions in 1 batches",
            "ns/a  n1 → n2",
            "… 2 more",
            "next 2026-12-02T14:00:00+00:00 → 2026-12-02T17:00:00+00:00 (in 2h0m)",
            "Active run     none",
            "0.400→0.100",
            "PlanPartlyBlocked",
            "job-pod=2, too-young=5",
        ] {
            assert!(d.contains(want), "{want:?} in\n{d}");
        }
    }

    #[test]
    fn status_detail_shows_idle_gpus_when_measured() {
        let now = parse_ts("2026-12-02T12:00:00Z").unwrap();
        let mut v = view();
        assert!(!status_detail(&v, now).contains("Idle GPUs"));
        v.status.idle_allocated = serde_json::from_value(serde_json::json!({
            "pods": 3, "gpus": 2, "milli": 2500, "gpuPods": 9, "measuredPods": 8,
            "threshold": 0.3, "lookback": "4h", "observedAt": "2026-12-02T11:59:00Z",
            "idlePods": [{"pod": "ml/a", "node": "n1", "gpus": 1, "milli": 1000,
                          "peakActivity": 0.05}]
        }))
        .unwrap();
        let d = status_detail(&v, now);
        for want in [
            "Idle GPUs      2 GPUs (2500 milli) allocated to 3 idle pods: activity under 0.3 for 4h; 8 of 9 GPU pods measured",
            "  ml/a  n1  1 GPUs, peak 0.05",
            "  … 2 more",
        ] {
            assert!(d.contains(want), "{want:?} in\n{d}");
        }
    }

    #[test]
    fn status_json_is_the_raw_status() {
        let obj = |name: &str, status: serde_json::Value| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "gpu-defrag.io/v1alpha1", "kind": "DefragPolicy",
                "metadata": {"name": name, "generation": 1},
                "spec": {"mode": "Enforce"},
                "status": status,
            }))
            .unwrap()
        };
        let raw = serde_json::json!({"skipped": {"x-future-field": 1}, "unknownField": true});
        let objs = [obj("a", raw.clone()), obj("b", serde_json::json!({}))];
        let one: serde_json::Value =
            serde_json::from_str(&status(&objs[..1], true, true).unwrap()).unwrap();
        assert_eq!(one, raw);
        let all: serde_json::Value =
            serde_json::from_str(&status(&objs, false, true).unwrap()).unwrap();
        assert_eq!(all, serde_json::json!({"a": raw, "b": {}}));
        let table = status(&objs, false, false).unwrap();
        assert_eq!(table.lines().count(), 3, "{table}");
        assert!(table.contains("Enforce"), "{table}");
        assert_eq!(
            status(&[], false, false).unwrap(),
            "No DefragPolicies found.\n"
        );
    }

    #[test]
    fn empty_status_is_plain() {
        let p = PolicyView {
            name: "new".into(),
            mode: "DryRun".into(),
            ..Default::default()
        };
        let now = Utc::now();
        let table = status_table(std::slice::from_ref(&p), now);
        let cells: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(cells, ["new", "DryRun", "-", "-", "-", "-", "-", "0", "-"]);
        assert!(status_detail(&p, now).contains("none yet (the operator has not reconciled it)"));
    }
}
