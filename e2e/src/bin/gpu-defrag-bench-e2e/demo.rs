//! `make demo`'s workload: the descheduler, then gpu-defrag, on the demo cluster.
use std::{
    fmt::Write as _,
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpu_defrag_e2e::{
    ClusterOptions, TestCluster, fixtures::wait_for, operator::open_window_this_minute, repo_root,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use serde_json::{Value, json};

use crate::contenders::{descheduler_policy, run_descheduler, run_gpu_defrag};
use crate::measure::{State, Watch, measure};

pub(crate) struct Demo {
    before: State,
    desched_after: State,
    desched_evictions: usize,
    desched_lines: Vec<String>,
    desched_policy: String,
    gd_after: State,
    gd_run: Value,
    gd_evictions: usize,
}

pub(crate) async fn run_demo(descheduler: &Path, gpu_defrag: &Path) -> Result<Demo> {
    let cluster = TestCluster::start(ClusterOptions::default()).await?;
    let script = repo_root().join("hack/demo-workload.sh");
    let path = format!(
        "{}:{}",
        cluster.bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let st = Command::new("bash")
        .arg(&script)
        .args(["demo", "64"])
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("PATH", path)
        .status()
        .context("running hack/demo-workload.sh")?;
    if !st.success() {
        bail!("hack/demo-workload.sh failed ({st})");
    }
    let client = cluster.client()?;
    wait_for(
        "the 8-GPU training pod to be unschedulable",
        Duration::from_secs(60),
        || async {
            let pods = Api::<Pod>::namespaced(client.clone(), "demo")
                .list(&ListParams::default().labels("app=train-8gpu"))
                .await?
                .items;
            Ok(pods
                .iter()
                .any(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.reason.as_deref() == Some("Unschedulable"))
                        })
                })
                .then_some(()))
        },
    )
    .await?;
    let report_policy = repo_root().join("config/samples/demo.yaml");
    let mark_train = |mut s: State| {
        // The demo's training pod is its pending multi-GPU pod.
        let train: Vec<String> = s
            .pods
            .iter()
            .filter(|(_, (a, _, _))| a == "train-8gpu")
            .map(|(u, _)| u.clone())
            .collect();
        for u in train {
            if let Some((_, _, r)) = s.pods.remove(&u) {
                s.pending_total += 1;
                s.pending_running += usize::from(r);
            }
        }
        s
    };
    let before = mark_train(measure(&cluster, gpu_defrag, &report_policy, "demo").await?);
    let desched_policy = descheduler_policy(60, 20, &[]);
    let watch = Watch::start(&client, "demo").await?;
    let (_, lines, _) = run_descheduler(&cluster, descheduler, &desched_policy, "demo").await?;
    watch
        .settled(
            Instant::now(),
            Duration::from_secs(4),
            Duration::from_secs(120),
        )
        .await;
    let desched_after = mark_train(measure(&cluster, gpu_defrag, &report_policy, "demo").await?);
    let desched_evictions = before
        .pods
        .keys()
        .filter(|u| !desched_after.pods.contains_key(*u))
        .count();
    // gpu-defrag on the same cluster, with make demo's policy switched to Enforce.
    let text = fs::read_to_string(&report_policy)?;
    let policy: Value = serde_norway::from_str(&text)?;
    let mut spec = policy["spec"].clone();
    spec["mode"] = json!("Enforce");
    spec["windows"] = json!([open_window_this_minute()]);
    let watch = Watch::start(&client, "demo").await?;
    let (run, op) = run_gpu_defrag(&cluster, gpu_defrag, spec).await?;
    watch
        .settled(
            Instant::now(),
            Duration::from_secs(4),
            Duration::from_secs(180),
        )
        .await;
    let gd_after = mark_train(measure(&cluster, gpu_defrag, &report_policy, "demo").await?);
    let gd_evictions = desched_after
        .pods
        .keys()
        .filter(|u| !gd_after.pods.contains_key(*u))
        .count();
    drop(op);
    cluster.stop();
    Ok(Demo {
        before,
        desched_after,
        desched_evictions,
        desched_lines: lines,
        desched_policy,
        gd_after,
        gd_run: run,
        gd_evictions,
    })
}

impl Demo {
    pub(crate) fn summary(&self) -> String {
        format!(
            "make demo's workload (8 nodes × 8 GPUs, every node half used, one pending 8-GPU pod):\n  start: fragment rate {:.3}, free 8-GPU nodes {}\n  descheduler HighNodeUtilization gpu<60%: evictions {}, fragment rate {:.3}, free 8-GPU nodes {}, 8-GPU pod running {}/{}\n    log: {}\n  gpu-defrag Enforce (config/samples/demo.yaml): evictions {}, fragment rate {:.3}, free 8-GPU nodes {} (+{} running the 8-GPU pod), run {}",
            self.before.frag_rate,
            self.before.free8,
            self.desched_evictions,
            self.desched_after.frag_rate,
            self.desched_after.free8,
            self.desched_after.pending_running,
            self.desched_after.pending_total,
            self.desched_lines
                .iter()
                .filter(|l| l.contains("nothing to do") || l.contains("Number of"))
                .cloned()
                .collect::<Vec<_>>()
                .join(" / "),
            self.gd_evictions,
            self.gd_after.frag_rate,
            self.gd_after.free8,
            self.gd_after.pending_running,
            self.gd_run["result"].as_str().unwrap_or("?"),
        )
    }

    pub(crate) fn section(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n## `make demo`'s workload: the descheduler finds nothing to do\n\n\
             The workload of `make demo` (`hack/demo-workload.sh demo 64`): 8 KWOK nodes × 8 GPUs, \
             64 one-GPU Deployments packed by the bin-packing scheduler, every other one removed \
             (each node 4 of 8 GPUs used, each kept Deployment with a PDB `maxUnavailable: 1`), \
             and one 8-GPU training pod that fits nowhere. First the real descheduler with this \
             policy, once (`descheduler --kubeconfig=$KUBECONFIG --policy-config-file=policy.yaml --secure-port=0 --v=3`):\n\n```yaml\n{}```\n",
            self.desched_policy
        );
        let _ = writeln!(
            s,
            "Its log (klog headers dropped; lines about utilization and evictions):\n\n```text"
        );
        for l in self.desched_lines.iter().take(20) {
            let _ = writeln!(s, "{l}");
        }
        let _ = writeln!(s, "```\n");
        let _ = writeln!(
            s,
            "| | evictions | fragment rate | free 8-GPU nodes | 8-GPU pod Running |\n|---|---:|---:|---:|---:|"
        );
        let _ = writeln!(
            s,
            "| start | – | {:.3} | {} | {}/{} |",
            self.before.frag_rate,
            self.before.free8,
            self.before.pending_running,
            self.before.pending_total
        );
        let _ = writeln!(
            s,
            "| descheduler HighNodeUtilization gpu<60% | {} | {:.3} | {} | {}/{} |",
            self.desched_evictions,
            self.desched_after.frag_rate,
            self.desched_after.free8,
            self.desched_after.pending_running,
            self.desched_after.pending_total
        );
        let _ = writeln!(
            s,
            "| then gpu-defrag Enforce (`config/samples/demo.yaml`, window open) | {} | {:.3} | {} | {}/{} |",
            self.gd_evictions,
            self.gd_after.frag_rate,
            self.gd_after.free8,
            self.gd_after.pending_running,
            self.gd_after.pending_total
        );
        let _ = writeln!(
            s,
            "\nEvery node is 50% used, below the 60% threshold, so every node is \"underutilized\" \
             and HighNodeUtilization has no node to pack onto. gpu-defrag's run: {} (planned {}, \
             evicted {}). Free 8-GPU nodes after gpu-defrag do not count the node the 8-GPU pod \
             now runs on. Fragment rate by `gpu-defrag report --policy config/samples/demo.yaml -o json`.",
            self.gd_run["result"].as_str().unwrap_or("?"),
            self.gd_run["planned"],
            self.gd_run["evicted"]
        );
        s
    }
}
