//! Koordinator `Device` objects (`scheduling.koordinator.sh/v1alpha1`, cluster-scoped, one
//! per node, named after it): the GPU inventory of Koordinator nodes — minors, UUIDs,
//! memory, health — that the pods' `device-allocated` records refer to.
//!
//! They are watched only where the CRD is served: the operator looks for it at start (and
//! then waits for the first list before it plans), and every minute after until it
//! appears. Without it, Koordinator nodes are read from allocatable
//! `koordinator.sh/gpu-core` and the `nvidia.com/gpu.memory` label, as before.
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, info};

/// API group of the `Device` CRD.
pub const GROUP: &str = "scheduling.koordinator.sh";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// Its kind.
pub const KIND: &str = "Device";
/// Its resource (plural).
pub const PLURAL: &str = "devices";
/// How often the operator looks again for a CRD that is not served.
const RECHECK: Duration = Duration::from_secs(60);

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The watched `Device` objects (an empty store where the CRD is not served).
#[derive(Clone)]
pub struct Devices {
    store: Store<DynamicObject>,
    /// Whether the CRD was served when the operator started (readiness waits for it).
    served_at_start: bool,
}

impl Devices {
    /// Looks for the CRD and starts watching it when it is served, now or later; `changed`
    /// is called on every change of a `Device` object.
    pub async fn start(client: Client, changed: impl Fn() + Send + Sync + 'static) -> Self {
        let ar = resource();
        let writer: Writer<DynamicObject> = Writer::new(ar.clone());
        let store = writer.as_reader();
        let served_at_start = served(&client).await;
        tokio::spawn(async move {
            if !served_at_start {
                info!(
                    "Koordinator Device objects ({PLURAL}.{GROUP}) not served: Koordinator nodes are read from allocatable and labels; looking again every {}s",
                    RECHECK.as_secs()
                );
                while !served(&client).await {
                    tokio::time::sleep(RECHECK).await;
                }
            }
            info!("watching Koordinator Device objects ({PLURAL}.{GROUP})");
            let api = Api::<DynamicObject>::all_with(client, &ar);
            let mut stream = watcher(api, watcher::Config::default().any_semantic())
                .modify(|d: &mut DynamicObject| d.metadata.managed_fields = None)
                .default_backoff()
                .reflect(writer)
                .touched_objects()
                .boxed();
            while stream.next().await.is_some() {
                changed();
            }
        });
        Devices {
            store,
            served_at_start,
        }
    }

    /// Returns once the first list is in, when the CRD was served at start; at once when
    /// it was not (nothing to wait for).
    pub async fn wait_until_ready(&self) {
        if self.served_at_start {
            let _ = self.store.wait_until_ready().await;
        }
    }

    /// The objects as the snapshot loader reads them: kind, name and spec.
    pub fn objects(&self) -> Vec<Value> {
        self.store
            .state()
            .iter()
            .map(|d| as_snapshot_object(d.name_any(), d.data.get("spec")))
            .collect()
    }
}

/// A `Device` object as the snapshot loader reads it.
fn as_snapshot_object(name: String, spec: Option<&Value>) -> Value {
    json!({"kind": KIND, "metadata": {"name": name}, "spec": spec.cloned().unwrap_or(Value::Null)})
}

/// Whether the API server serves the `Device` kind (any error: not now).
async fn served(client: &Client) -> bool {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(_) => true,
        Err(e) => {
            debug!(error = %e, "Koordinator Device kind not found");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_defrag_core::formats::parse_koord_device_object;

    #[test]
    fn a_watched_device_reads_as_the_snapshot_loader_expects() {
        let spec = json!({"devices": [
            {"type": "gpu", "minor": 0, "id": "GPU-a", "health": true,
             "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "16Gi"}},
            {"type": "rdma", "minor": 0},
        ]});
        let (name, devs) =
            parse_koord_device_object(&as_snapshot_object("node-1".into(), Some(&spec))).unwrap();
        assert_eq!(name, "node-1");
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].uuid.as_deref(), Some("GPU-a"));
        assert_eq!(devs[0].memory_bytes, Some(16 << 30));
        // No spec: a node without GPUs (its pods' records then name unknown devices).
        let (_, devs) = parse_koord_device_object(&as_snapshot_object("n".into(), None)).unwrap();
        assert!(devs.is_empty());
    }
}
