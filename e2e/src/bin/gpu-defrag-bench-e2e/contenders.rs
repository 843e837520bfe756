//! The contenders: the real descheduler (one pass) and gpu-defrag (Enforce), each run
//! on a fresh cluster and measured.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpu_defrag_e2e::{
    TestCluster,
    fixtures::wait_for,
    operator::{create_policy, open_window_this_minute, policy_status},
    process::{Component, free_port, group_alive},
    repo_root,
};
use serde_json::{Value, json};

use crate::NS;
use crate::args::Args;
use crate::cluster::build_cluster;
use crate::layout::Layout;
use crate::measure::{State, Watch, measure};

const POLICY: &str = "bench";

/// `e2e/cluster/build-descheduler.sh`: the cached descheduler binary (built once).
pub(crate) fn build_descheduler() -> Result<PathBuf> {
    let script = repo_root().join("e2e/cluster/build-descheduler.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(PathBuf::from(path))
}

#[derive(Debug, Clone)]
pub(crate) enum Contender {
    Descheduler(u32),
    GpuDefrag,
}

impl Contender {
    pub(crate) fn name(&self) -> String {
        match self {
            Self::Descheduler(t) => format!("descheduler HighNodeUtilization gpu<{t}%"),
            Self::GpuDefrag => "gpu-defrag Enforce".to_string(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) before: State,
    pub(crate) after: State,
    pub(crate) evictions: usize,
    pub(crate) back_on_source: usize,
    pub(crate) not_running: usize,
    pub(crate) wall: f64,
    pub(crate) note: String,
    pub(crate) command: String,
    pub(crate) config: String,
}

impl Row {
    /// 8-GPU nodes free now or running a formerly pending 8-GPU pod, less those free at the
    /// start.
    pub(crate) fn given_back(&self) -> i64 {
        (self.after.free8 + self.after.pending8_running) as i64
            - (self.before.free8 + self.before.pending8_running) as i64
    }

    pub(crate) fn line(&self) -> String {
        format!(
            "  {}: fragment rate {:.3} -> {:.3}, free 8-GPU nodes {} -> {}, pending running {}/{}, evictions {}, back on source {}, replacements not running {}, {:.1}s; {}",
            self.name,
            self.before.frag_rate,
            self.after.frag_rate,
            self.before.free8,
            self.after.free8,
            self.after.pending_running,
            self.after.pending_total,
            self.evictions,
            self.back_on_source,
            self.not_running,
            self.wall,
            self.note
        )
    }
}

pub(crate) fn descheduler_policy(threshold: u32, budget: u32, namespaces: &[&str]) -> String {
    let ns = if namespaces.is_empty() {
        String::new()
    } else {
        format!(
            "\n      evictableNamespaces:\n        exclude: [{}]",
            namespaces.join(", ")
        )
    };
    format!(
        "apiVersion: descheduler/v1alpha2
kind: DeschedulerPolicy
maxNoOfPodsToEvictTotal: {budget}
profiles:
- name: gpu-binpack
  pluginConfig:
  - name: DefaultEvictor
    args: {{}}
  - name: HighNodeUtilization
    args:
      thresholds:
        nvidia.com/gpu: {threshold}{ns}
  plugins:
    balance:
      enabled: [HighNodeUtilization]
"
    )
}

/// Runs the descheduler once (no `--descheduling-interval`: one pass, then it exits) as the
/// cluster admin; returns its command line, the log's notable lines and the log path.
pub(crate) async fn run_descheduler(
    cluster: &TestCluster,
    bin: &Path,
    policy: &str,
    tag: &str,
) -> Result<(String, Vec<String>, PathBuf)> {
    let dir = cluster.work_dir().join(format!("descheduler-{tag}"));
    fs::create_dir_all(&dir)?;
    let policy_path = dir.join("policy.yaml");
    fs::write(&policy_path, policy)?;
    let log = cluster.logs_dir().join(format!("descheduler-{tag}.log"));
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--policy-config-file={}", policy_path.display()),
        "--secure-port=0".into(),
        "--v=3".into(),
    ];
    let command =
        "descheduler --kubeconfig=$KUBECONFIG --policy-config-file=policy.yaml --secure-port=0 --v=3"
            .to_string();
    let mut c = Component::spawn("descheduler", bin, &args, &[], &log)?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = c.exited() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            c.stop(Duration::from_secs(2));
            bail!(
                "the descheduler did not finish within 300s; see {}",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = fs::read_to_string(&log).unwrap_or_default();
    let notable: Vec<String> = text
        .lines()
        .filter(|l| {
            [
                "Criteria for a node",
                "Number of underutilized",
                "nothing to do",
                "No node is underutilized",
                "Total capacity to be moved",
                "Evicting pods from node",
                "\"Evicted pod\"",
                "Number of evictions",
                "limit",
                "reached",
                "Error",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .filter(|l| !l.contains("Unable to write event"))
        .map(|l| {
            // Drop klog's header (level, date, time, pid, file:line]).
            l.split_once("] ").map(|(_, r)| r).unwrap_or(l).to_string()
        })
        .collect();
    if !status.contains("exit status: 0") {
        bail!(
            "the descheduler exited with {status}; see {}:\n{}",
            log.display(),
            gpu_defrag_e2e::process::log_tail(&log, 20)
        );
    }
    Ok((command, notable, log))
}

pub(crate) fn report_policy_yaml(ns: &str) -> String {
    // Fixed shapes (no fromPending), so the fragment rate means the same before and after.
    format!(
        "apiVersion: gpu-defrag.io/v1alpha1
kind: DefragPolicy
metadata: {{name: report}}
spec:
  mode: DryRun
  namespaces: {{include: [{ns}]}}
  target:
    shapes:
    - {{gpus: 8, weight: 1}}
    - {{gpus: 4, weight: 1}}
    - {{gpus: 1, weight: 1}}
"
    )
}

fn gpu_defrag_spec(budget: u32, ns: &str) -> Value {
    json!({
        "mode": "Enforce",
        "namespaces": {"include": [ns]},
        "target": {
            "shapes": [{"gpus": 8, "weight": 1}, {"gpus": 4, "weight": 1}, {"gpus": 1, "weight": 1}],
            "fromPending": true,
        },
        "windows": [open_window_this_minute()],
        "limits": {
            "maxEvictionsPerRun": budget,
            "maxEvictionsPerNode": 8,
            "maxEvictionsPerNamespace": budget,
            "maxInFlight": 4,
        },
        "safety": {"minPodAge": "0s", "minNodeAge": "0s", "rescheduleTimeout": "2m"},
    })
}

/// Starts `gpu-defrag run` as `make demo` does (the cluster admin's kubeconfig, no leader
/// election, only the policy labelled `e2e-test=bench`), applies the Enforce policy with a
/// window open now, and waits for the run's result. The process dies with the returned
/// [`Component`].
pub(crate) async fn run_gpu_defrag(
    cluster: &TestCluster,
    bin: &Path,
    spec: Value,
) -> Result<(Value, Component)> {
    let log = cluster.logs_dir().join("gpu-defrag.log");
    let args: Vec<String> = vec![
        "run".into(),
        "--leader-elect=false".into(),
        format!("--metrics-addr=127.0.0.1:{}", free_port()?),
        "--policy-selector=e2e-test=bench".into(),
    ];
    let envs: [(&str, &Path); 2] = [
        ("KUBECONFIG", cluster.kubeconfig_path()),
        ("RUST_LOG", Path::new("info")),
    ];
    let op = Component::spawn("gpu-defrag", bin, &args, &envs, &log)?;
    let pgid = op.pgid;
    let client = cluster.client()?;
    create_policy(&client, POLICY, "bench", spec).await?;
    let run = wait_for(
        "gpu-defrag's run to finish",
        Duration::from_secs(600),
        || async {
            if !group_alive(pgid) {
                bail!("gpu-defrag exited; see {}", log.display());
            }
            let st = policy_status(&client, POLICY).await?;
            Ok(st
                .pointer("/lastRuns/0/result")
                .and_then(Value::as_str)
                .is_some()
                .then(|| st["lastRuns"][0].clone()))
        },
    )
    .await?;
    Ok((run, op))
}

pub(crate) async fn run_contender(
    args: &Args,
    layout: &Layout,
    c: &Contender,
    descheduler: &Path,
    gpu_defrag: &Path,
) -> Result<Row> {
    let cluster = build_cluster(args, layout).await?;
    let report_policy = cluster.work_dir().join("report-policy.yaml");
    fs::write(&report_policy, report_policy_yaml(NS))?;
    let before = measure(&cluster, gpu_defrag, &report_policy, NS).await?;
    let client = cluster.client()?;
    let watch = Watch::start(&client, NS).await?;
    let t0 = Instant::now();
    let (note, command, config, op) = match c {
        Contender::Descheduler(t) => {
            let policy = descheduler_policy(*t, args.budget, &[]);
            let (command, notable, _log) =
                run_descheduler(&cluster, descheduler, &policy, &format!("t{t}")).await?;
            let summary: Vec<String> = notable
                .iter()
                .filter(|l| {
                    l.contains("Number of evictions")
                        || l.contains("nothing to do")
                        || l.contains("Number of underutilized")
                        || l.contains("limit")
                        || l.contains("reached")
                })
                .take(6)
                .cloned()
                .collect();
            (summary.join(" / "), command, policy, None)
        }
        Contender::GpuDefrag => {
            let spec = gpu_defrag_spec(args.budget, NS);
            let (run, op) = run_gpu_defrag(&cluster, gpu_defrag, spec.clone()).await?;
            let note = format!(
                "run {} (\"{}\"): planned {}, evicted {}, blocked {}, bounced {}, failed {}",
                run["result"].as_str().unwrap_or("?"),
                run["message"].as_str().unwrap_or(""),
                run["planned"],
                run["evicted"],
                run["blocked"],
                run["bounced"],
                run["failed"]
            );
            let config = serde_norway::to_string(&json!({
                "apiVersion": "gpu-defrag.io/v1alpha1", "kind": "DefragPolicy",
                "metadata": {"name": POLICY}, "spec": spec,
            }))?;
            (
                note,
                "gpu-defrag run --leader-elect=false --policy-selector=e2e-test=bench (KUBECONFIG: the cluster admin's)".to_string(),
                config,
                Some(op),
            )
        }
    };
    let last = watch
        .settled(
            Instant::now(),
            Duration::from_secs(6),
            Duration::from_secs(300),
        )
        .await;
    let wall = last.saturating_duration_since(t0).as_secs_f64();
    let after = measure(&cluster, gpu_defrag, &report_policy, NS).await?;
    let mut evictions = 0;
    let mut back = 0;
    let mut not_running = 0;
    let now_by_app: BTreeMap<&str, (&str, bool)> = after
        .pods
        .values()
        .map(|(a, n, r)| (a.as_str(), (n.as_str(), *r)))
        .collect();
    for (uid, (app, node, _)) in &before.pods {
        if after.pods.contains_key(uid) {
            continue;
        }
        evictions += 1;
        match now_by_app.get(app.as_str()) {
            Some((n, true)) if n == node => back += 1,
            Some((_, true)) => {}
            _ => not_running += 1,
        }
    }
    drop(op);
    cluster.stop();
    Ok(Row {
        name: c.name(),
        before,
        after,
        evictions,
        back_on_source: back,
        not_running,
        wall,
        note,
        command,
        config,
    })
}
