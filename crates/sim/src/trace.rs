//! Loader for the Alibaba GPU cluster trace (2023, "openb" CSV files).
//!
//! Nodes come from `openb_node_list_gpu_node.csv` (`sn,cpu_milli,memory_mib,gpu,model`),
//! pods from `openb_pod_list_<workload>.csv` (`name,cpu_milli,memory_mib,num_gpu,
//! gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time`).
//! The files have no quoted fields (no field contains a comma), so a plain split on `,`
//! is exact; a line with a quote is refused rather than misread. Columns are found by
//! header name, so column order does not matter. The trace is read in place, never
//! copied into the repository.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Default trace directory, relative to the repository root.
pub const DEFAULT_TRACE_DIR: &str = "../shared/data/alibaba-gpu-v2023/csv";
/// Node list file name.
pub const NODE_FILE: &str = "openb_node_list_gpu_node.csv";

/// One GPU node of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceNode {
    /// Serial name (`openb-node-0227`).
    pub name: String,
    /// Allocatable CPU, milli.
    pub cpu_milli: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// GPUs.
    pub gpus: u32,
    /// GPU model (`V100M32`, `G2`, …).
    pub model: String,
}

/// One GPU task of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePod {
    /// Name (`openb-pod-0017`).
    pub name: String,
    /// CPU request, milli.
    pub cpu_milli: u64,
    /// Memory request, MiB.
    pub memory_mib: u64,
    /// GPUs (1..=8).
    pub num_gpu: u32,
    /// Milli per GPU (< 1000 only for shares, `num_gpu == 1`).
    pub gpu_milli: u32,
    /// Allowed GPU models (empty: any).
    pub models: Vec<String>,
}

/// What a load read.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// GPU nodes (nodes with `gpu == 0` are skipped), sorted by name.
    pub nodes: Vec<TraceNode>,
    /// GPU pods, in file order.
    pub pods: Vec<TracePod>,
    /// CPU-only pods skipped (`num_gpu == 0`).
    pub cpu_only_skipped: usize,
}

/// The trace directory: `explicit` if given (relative to the current directory), else
/// the default relative to the current directory, then relative to the workspace of
/// the running executable (`target/<profile>/gpu-defrag-sim` → workspace root).
pub fn resolve_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    let mut candidates = vec![PathBuf::from(DEFAULT_TRACE_DIR)];
    if let Ok(exe) = std::env::current_exe() {
        // target/release/gpu-defrag-sim → ../../ is the workspace root.
        for anc in exe.ancestors().skip(1).take(4) {
            candidates.push(anc.join(DEFAULT_TRACE_DIR));
        }
    }
    candidates
        .iter()
        .find(|c| c.join(NODE_FILE).is_file())
        .cloned()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_TRACE_DIR))
}

struct Table {
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    fn col(&self, name: &str, file: &str) -> Result<usize> {
        self.header
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("{file}: no column {name:?} in header"))
    }
}

fn read_table(text: &str, file: &str) -> Result<Table> {
    let mut lines = text.lines().enumerate();
    let Some((_, head)) = lines.next() else {
        bail!("{file}: empty file");
    };
    let header: Vec<String> = head
        .trim_start_matches('\u{feff}')
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let mut rows = Vec::new();
    for (i, line) in lines {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if line.contains('"') {
            bail!(
                "{file}:{}: quoted fields are not supported by this loader",
                i + 1
            );
        }
        let f: Vec<String> = line.split(',').map(|s| s.trim().to_string()).collect();
        if f.len() != header.len() {
            bail!(
                "{file}:{}: {} fields, header has {}",
                i + 1,
                f.len(),
                header.len()
            );
        }
        rows.push((i + 1, f));
    }
    Ok(Table { header, rows })
}

fn num<T: std::str::FromStr>(v: &str, file: &str, line: usize, col: &str) -> Result<T> {
    // Some exports write integers as floats ("1000.0").
    if let Ok(x) = v.parse::<T>() {
        return Ok(x);
    }
    if let Ok(f) = v.parse::<f64>()
        && f.fract() == 0.0
        && f >= 0.0
        && let Ok(x) = format!("{}", f as u64).parse::<T>()
    {
        return Ok(x);
    }
    bail!("{file}:{line}: {col} = {v:?} is not a non-negative integer")
}

/// Parses a node list.
pub fn parse_nodes(text: &str, file: &str) -> Result<Vec<TraceNode>> {
    let t = read_table(text, file)?;
    let (sn, cpu, mem, gpu, model) = (
        t.col("sn", file)?,
        t.col("cpu_milli", file)?,
        t.col("memory_mib", file)?,
        t.col("gpu", file)?,
        t.col("model", file)?,
    );
    let mut out = Vec::new();
    for (line, f) in &t.rows {
        let gpus: u32 = num(&f[gpu], file, *line, "gpu")?;
        if gpus == 0 {
            continue;
        }
        out.push(TraceNode {
            name: f[sn].clone(),
            cpu_milli: num(&f[cpu], file, *line, "cpu_milli")?,
            memory_mib: num(&f[mem], file, *line, "memory_mib")?,
            gpus,
            model: f[model].clone(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = out.windows(2).find(|w| w[0].name == w[1].name) {
        bail!("{file}: node {} listed twice", w[0].name);
    }
    Ok(out)
}

/// Parses a pod list; returns the GPU pods and the number of CPU-only pods skipped.
pub fn parse_pods(text: &str, file: &str) -> Result<(Vec<TracePod>, usize)> {
    let t = read_table(text, file)?;
    let (name, cpu, mem, ng, gm, spec) = (
        t.col("name", file)?,
        t.col("cpu_milli", file)?,
        t.col("memory_mib", file)?,
        t.col("num_gpu", file)?,
        t.col("gpu_milli", file)?,
        // The multigpu lists carry only the first five columns.
        t.header.iter().position(|h| h == "gpu_spec"),
    );
    let mut out = Vec::new();
    let mut skipped = 0;
    for (line, f) in &t.rows {
        let num_gpu: u32 = num(&f[ng], file, *line, "num_gpu")?;
        if num_gpu == 0 {
            skipped += 1;
            continue;
        }
        let mut gpu_milli: u32 = num(&f[gm], file, *line, "gpu_milli")?;
        if gpu_milli == 0 || num_gpu > 1 {
            // Multi-GPU tasks take whole GPUs (the trace always says 1000 for them).
            gpu_milli = 1000;
        }
        if gpu_milli > 1000 {
            bail!("{file}:{line}: gpu_milli {gpu_milli} > 1000");
        }
        let models = match spec.map(|c| f[c].as_str()).unwrap_or("") {
            "" | "nan" => Vec::new(),
            s => s.split('|').map(str::to_string).collect(),
        };
        out.push(TracePod {
            name: f[name].clone(),
            cpu_milli: num(&f[cpu], file, *line, "cpu_milli")?,
            memory_mib: num(&f[mem], file, *line, "memory_mib")?,
            num_gpu,
            gpu_milli,
            models,
        });
    }
    Ok((out, skipped))
}

/// Lifetimes in seconds (`deletion_time − creation_time`) of the GPU pods of a pod list,
/// in the order [`parse_pods`] returns them; `None` when the list has no such columns
/// (the multigpu lists carry only the first five).
pub fn parse_lifetimes(text: &str, file: &str) -> Result<Option<Vec<u64>>> {
    let t = read_table(text, file)?;
    let ng = t.col("num_gpu", file)?;
    let (Some(c), Some(d)) = (
        t.header.iter().position(|h| h == "creation_time"),
        t.header.iter().position(|h| h == "deletion_time"),
    ) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (line, f) in &t.rows {
        let num_gpu: u32 = num(&f[ng], file, *line, "num_gpu")?;
        if num_gpu == 0 {
            continue;
        }
        let created: u64 = num(&f[c], file, *line, "creation_time")?;
        let deleted: u64 = num(&f[d], file, *line, "deletion_time")?;
        out.push(deleted.saturating_sub(created));
    }
    Ok(Some(out))
}

/// [`parse_lifetimes`] of `openb_pod_list_<workload>.csv` in `dir`.
pub fn load_lifetimes(dir: &Path, workload: &str) -> Result<Option<Vec<u64>>> {
    let pf = dir.join(format!("openb_pod_list_{workload}.csv"));
    let text = std::fs::read_to_string(&pf).with_context(|| format!("reading {}", pf.display()))?;
    parse_lifetimes(&text, &pf.display().to_string())
}

/// Loads nodes and the pods of `workload` from `dir`.
pub fn load(dir: &Path, workload: &str) -> Result<Trace> {
    if workload.is_empty()
        || !workload
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        bail!("workload {workload:?}: expected a name like default, gpushare40, multigpu30");
    }
    let nf = dir.join(NODE_FILE);
    let pf = dir.join(format!("openb_pod_list_{workload}.csv"));
    let ntext = std::fs::read_to_string(&nf)
        .with_context(|| format!("reading {} (is --trace right?)", nf.display()))?;
    let ptext = std::fs::read_to_string(&pf)
        .with_context(|| format!("reading {} (unknown --workload?)", pf.display()))?;
    let nodes = parse_nodes(&ntext, &nf.display().to_string())?;
    let (pods, cpu_only_skipped) = parse_pods(&ptext, &pf.display().to_string())?;
    if nodes.is_empty() {
        bail!("{}: no GPU nodes", nf.display());
    }
    Ok(Trace {
        nodes,
        pods,
        cpu_only_skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
        node-b,96000,786432,8,V100M32\n\
        node-a,64000,262144,2,P100\n\
        node-c,32000,262144,0,nan\n";
    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
        pod-0,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\n\
        pod-1,4000,15258,1,220,nan,BE,Running,9679175,9973826,9679175\n\
        pod-2,16000,32768,1,1000,V100M16|V100M32,LS,Running,9967058,9968575,9967063\n\
        pod-3,2000,4096,0,0,,BE,Running,1,2,1\n";

    #[test]
    fn loads_a_tiny_fixture_from_disk() {
        let dir = std::env::temp_dir().join(format!("gpu-defrag-sim-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(NODE_FILE), NODES).unwrap();
        std::fs::write(dir.join("openb_pod_list_tiny.csv"), PODS).unwrap();
        let t = load(&dir, "tiny").unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(
            t.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["node-a", "node-b"],
            "GPU nodes only, sorted by name"
        );
        assert_eq!(t.nodes[1].gpus, 8);
        assert_eq!(t.nodes[1].model, "V100M32");
        assert_eq!(t.cpu_only_skipped, 1);
        assert_eq!(t.pods.len(), 3);
        assert_eq!(t.pods[0].num_gpu, 8);
        assert_eq!(t.pods[0].gpu_milli, 1000);
        assert_eq!(t.pods[1].gpu_milli, 220);
        assert!(t.pods[1].models.is_empty(), "nan means no model constraint");
        assert_eq!(t.pods[2].models, ["V100M16", "V100M32"]);
        assert_eq!(t.pods[2].memory_mib, 32768);
        // The multigpu lists have five columns only.
        let (p, _) = parse_pods(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1000,1024,2,1000\n",
            "m",
        )
        .unwrap();
        assert_eq!(p[0].num_gpu, 2);
        assert!(p[0].models.is_empty());
        let life = parse_lifetimes(PODS, "p").unwrap().unwrap();
        assert_eq!(
            life,
            [10769854 - 9437497, 9973826 - 9679175, 9968575 - 9967058]
        );
        assert_eq!(
            parse_lifetimes(
                "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,2,1000\n",
                "m"
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn refuses_bad_input() {
        assert!(
            parse_nodes("sn,cpu_milli\nx,1\n", "n").is_err(),
            "missing columns"
        );
        assert!(
            parse_nodes(&format!("{NODES}node-d,1,2,3\n"), "n").is_err(),
            "short row"
        );
        assert!(
            parse_pods(&PODS.replace("pod-1,", "\"pod,1\","), "p").is_err(),
            "quoted field"
        );
        assert!(parse_pods(&PODS.replace(",220,", ",1500,"), "p").is_err());
        assert!(load(Path::new("/nonexistent"), "default").is_err());
        assert!(load(Path::new("."), "../etc").is_err());
    }
}
