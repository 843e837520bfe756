//! [`PodWatch`]: samples a namespace's pods and a pool's fences every 200 ms, recording
//! which pods went away and any pod bound to a node while it was fenced.
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::ListParams};

use crate::fixtures::{pod_ready, pods};

use super::{POOL_LABEL, Pool, fences, pod_app, pod_node};

/// One pod seen by a [`PodWatch`].
#[derive(Debug, Clone)]
pub struct SeenPod {
    /// Name.
    pub name: String,
    /// `app` label.
    pub app: String,
    /// Node it was bound to (first seen bound).
    pub node: Option<String>,
    /// First sample that listed it.
    pub first_seen: Instant,
    /// First sample that no longer listed it.
    pub gone_at: Option<Instant>,
    /// Listed by the first sample.
    pub initial: bool,
}

/// What a [`PodWatch`] saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Pods by uid.
    pub pods: BTreeMap<String, SeenPod>,
    /// A pod that was not there at the start seen bound to a node carrying the fence.
    pub violations: BTreeMap<String, String>,
    /// Pool nodes ever seen fenced by the policy.
    pub fenced: BTreeSet<String>,
    /// Pool nodes fenced in the previous sample.
    pub fenced_before: BTreeSet<String>,
    /// Samples taken.
    pub samples: usize,
    /// The fewest Ready pods seen at once per `app` label (from the first sample that
    /// listed the app on; a sample without any of its pods counts 0).
    pub ready_low: BTreeMap<String, usize>,
}

impl Seen {
    /// Pods that were there at the start and disappeared, by node they ran on.
    pub fn initial_gone(&self) -> Vec<&SeenPod> {
        self.pods
            .values()
            .filter(|p| p.initial && p.gone_at.is_some())
            .collect()
    }

    /// Every pod that disappeared (initial or not).
    pub fn gone(&self) -> Vec<&SeenPod> {
        self.pods.values().filter(|p| p.gone_at.is_some()).collect()
    }
}

/// Samples the pods of a namespace and the fences of a pool every 200 ms until dropped.
/// Pods are listed before nodes in each sample, so a pod seen bound to a node that the
/// same sample shows fenced was bound while the fence was there.
#[derive(Debug)]
pub struct PodWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    /// Takes a first sample (the initial pods), then keeps sampling in the background.
    pub async fn start(client: &Client, ns: &str, pool: &Pool, policy: &str) -> Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (client, ns, pool_name, policy) = (
            client.clone(),
            ns.to_string(),
            pool.name.clone(),
            policy.to_string(),
        );
        sample(&client, &ns, &pool_name, &policy, &seen, true).await?;
        let s2 = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = sample(&client, &ns, &pool_name, &policy, &s2, false).await;
            }
        });
        Ok(Self { seen, task })
    }

    /// What was seen so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn sample(
    client: &Client,
    ns: &str,
    pool: &str,
    policy: &str,
    seen: &Mutex<Seen>,
    initial: bool,
) -> Result<()> {
    let listed = pods(client, ns, "").await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
        .await?;
    let now = Instant::now();
    let fenced: BTreeSet<String> = nodes
        .items
        .iter()
        .filter(|n| fences(n).any(|v| v == policy))
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let mut s = seen.lock().map_err(|_| anyhow!("lock"))?;
    s.samples += 1;
    s.fenced.extend(fenced.iter().cloned());
    let mut alive = BTreeSet::new();
    for p in &listed {
        let Some(uid) = p.metadata.uid.clone() else {
            continue;
        };
        alive.insert(uid.clone());
        let node = pod_node(p).map(str::to_string);
        let entry = s.pods.entry(uid.clone()).or_insert_with(|| SeenPod {
            name: p.metadata.name.clone().unwrap_or_default(),
            app: pod_app(p).to_string(),
            node: None,
            first_seen: now,
            gone_at: None,
            initial,
        });
        // Bound since the previous sample (unbound or not listed then).
        let newly_bound = entry.node.is_none() && node.is_some();
        if entry.node.is_none() {
            entry.node = node.clone();
        }
        let is_new = !entry.initial;
        let name = entry.name.clone();
        // Bound between two samples that both show the fence: bound while it was there (a
        // pod bound just before the fence appeared is not a violation).
        if is_new
            && newly_bound
            && let Some(n) = node.filter(|n| fenced.contains(n) && s.fenced_before.contains(n))
        {
            s.violations
                .entry(uid)
                .or_insert_with(|| format!("{ns}/{name} bound to {n} while it was fenced"));
        }
    }
    for (uid, p) in s.pods.iter_mut() {
        if p.gone_at.is_none() && !alive.contains(uid) {
            p.gone_at = Some(now);
        }
    }
    let mut ready: BTreeMap<String, usize> = BTreeMap::new();
    for p in &listed {
        *ready.entry(pod_app(p).to_string()).or_default() += usize::from(pod_ready(p));
    }
    for (app, low) in s.ready_low.iter_mut() {
        *low = (*low).min(ready.get(app).copied().unwrap_or(0));
    }
    for (app, n) in ready {
        s.ready_low.entry(app).or_insert(n);
    }
    s.fenced_before = fenced;
    Ok(())
}
