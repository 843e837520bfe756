//! Measuring: the cluster's state before and after a contender, and when its pods settle.
use std::{
    collections::BTreeMap,
    path::Path,
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpu_defrag_e2e::{GPU_RESOURCE, TestCluster, fixtures::pod_ready};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, api::ListParams};
use serde_json::Value;

use crate::cluster::{app_of, role_of};

#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    pub(crate) frag_rate: f64,
    pub(crate) free8: usize,
    pub(crate) pending_running: usize,
    pub(crate) pending_total: usize,
    /// Pending 8-GPU pods now Running (each holds a whole 8-GPU node).
    pub(crate) pending8_running: usize,
    /// GPUs of the pods bound to nodes, and of the nodes.
    pub(crate) used_gpus: u32,
    pub(crate) total_gpus: u32,
    /// uid → (app, node, ready) of the workload pods.
    pub(crate) pods: BTreeMap<String, (String, String, bool)>,
}

/// The cluster now: `gpu-defrag report -o json` (live) and the pods.
pub(crate) async fn measure(
    cluster: &TestCluster,
    gpu_defrag: &Path,
    report_policy: &Path,
    ns: &str,
) -> Result<State> {
    let out = Command::new(gpu_defrag)
        .args(["report", "-o", "json", "--policy"])
        .arg(report_policy)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .output()
        .context("running gpu-defrag report")?;
    if !out.status.success() {
        bail!(
            "gpu-defrag report failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&out.stdout).context("report json")?;
    let client = cluster.client()?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods = Api::<Pod>::namespaced(client, ns)
        .list(&ListParams::default())
        .await?
        .items;
    let mut used: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &pods {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            *used.entry(n).or_default() += gpu_defrag_e2e::operator::pod_gpus(p);
        }
    }
    let free8 = nodes
        .iter()
        .filter(|n| {
            let cap = n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(GPU_RESOURCE))
                .map(|q| q.0.as_str())
                == Some("8");
            cap && used
                .get(n.metadata.name.as_deref().unwrap_or(""))
                .copied()
                .unwrap_or(0)
                == 0
        })
        .count();
    let total_gpus = nodes
        .iter()
        .filter_map(|n| {
            n.status
                .as_ref()?
                .allocatable
                .as_ref()?
                .get(GPU_RESOURCE)?
                .0
                .parse::<u32>()
                .ok()
        })
        .sum();
    let mut st = State {
        used_gpus: used.values().sum(),
        total_gpus,
        frag_rate: report["fragmentRate"].as_f64().unwrap_or(f64::NAN),
        free8,
        ..State::default()
    };
    for p in &pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        match role_of(p) {
            "pending" => {
                st.pending_total += 1;
                if pod_ready(p) {
                    st.pending_running += 1;
                    if gpu_defrag_e2e::operator::pod_gpus(p) == 8 {
                        st.pending8_running += 1;
                    }
                }
            }
            _ => {
                st.pods
                    .insert(uid, (app_of(p).to_string(), node, pod_ready(p)));
            }
        }
    }
    Ok(st)
}

/// The pods of `ns` as one string: names, nodes, readiness, deletion.
async fn fingerprint(api: &Api<Pod>) -> Result<String> {
    let pods = api.list(&ListParams::default()).await?.items;
    let mut fp: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{}@{}:{}:{}",
                p.metadata.name.as_deref().unwrap_or(""),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or("-"),
                pod_ready(p),
                p.metadata.deletion_timestamp.is_some()
            )
        })
        .collect();
    fp.sort();
    Ok(fp.join(","))
}

/// Watches the pods of a namespace every 250 ms from before a contender starts, recording
/// when they last changed (names, nodes, readiness, deletion).
pub(crate) struct Watch {
    last_change: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    pub(crate) async fn start(client: &Client, ns: &str) -> Result<Self> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let mut last = fingerprint(&api).await?;
        let last_change = Arc::new(Mutex::new(None));
        let lc = last_change.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if let Ok(fp) = fingerprint(&api).await
                    && fp != last
                {
                    last = fp;
                    if let Ok(mut l) = lc.lock() {
                        *l = Some(Instant::now());
                    }
                }
            }
        });
        Ok(Self { last_change, task })
    }

    fn last_change(&self) -> Option<Instant> {
        self.last_change.lock().ok().and_then(|l| *l)
    }

    /// Waits until the pods have not changed for `quiet` since the contender finished at
    /// `done` (at most `timeout`); returns when the last change (or the contender's end, if
    /// later) was.
    pub(crate) async fn settled(
        self,
        done: Instant,
        quiet: Duration,
        timeout: Duration,
    ) -> Instant {
        loop {
            let end = self.last_change().map_or(done, |c| c.max(done));
            if end.elapsed() >= quiet || done.elapsed() >= timeout {
                self.task.abort();
                return end;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
