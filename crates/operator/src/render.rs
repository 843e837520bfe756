//! Human output: the report summary and a terminal heatmap (a row per node, a cell
//! per GPU shaded by use). Large clusters are condensed: nodes with the same picture
//! are grouped, and at most `max_rows` rows are printed.
use std::fmt::Write;

use gpu_defrag_core::frag::{NodeReport, Report};

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
    n.used.iter().map(|u| cell(*u)).collect()
}

/// The heatmap: nodes sorted by fragment (worst first), identical pictures condensed.
pub fn heatmap(r: &Report, max_rows: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "GPU use per node (· free  ░ ≤25%  ▒ ≤60%  ▓ <100%  █ full)"
    );
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
    }
    let _ = writeln!(s, "\nAFTER (expected)");
    s.push_str(&summary(after));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shades_cover_the_range() {
        assert_eq!(cell(0), '·');
        assert_eq!(cell(1000), '█');
        assert_eq!(cell(500), '▒');
    }
}
