//! Koordinator `Device` objects (`scheduling.koordinator.sh/v1alpha1`, cluster-scoped, one
//! per node, named after it): the GPU inventory of Koordinator nodes — minors, UUIDs,
//! memory, health — that the pods' `device-allocated` records refer to.
//!
//! They are watched only where the CRD is served: the operator looks for it at start (and
//! then waits for the first list before it plans), and every minute after until it
//! appears. Without it, Koordinator nodes are read from allocatable
//! `koordinator.sh/gpu-core` and the `nvidia.com/gpu.memory` label, as before.
use kube::Client;
use kube::ResourceExt;
use kube::api::GroupVersionKind;
use serde_json::{Value, json};

use crate::optional::OptionalKind;

/// API group of the `Device` CRD.
pub const GROUP: &str = "scheduling.koordinator.sh";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// Its kind.
pub const KIND: &str = "Device";
/// Its resource (plural).
pub const PLURAL: &str = "devices";

/// The watched `Device` objects (an empty store where the CRD is not served).
#[derive(Clone)]
pub struct Devices {
    kind: OptionalKind,
}

impl Devices {
    /// Looks for the CRD and starts watching it when it is served, now or later; `changed`
    /// is called on every change of a `Device` object.
    pub async fn start(client: Client, changed: impl Fn() + Send + Sync + 'static) -> Self {
        let kind = OptionalKind::start(
            client,
            GroupVersionKind::gvk(GROUP, VERSION, KIND),
            PLURAL,
            "Koordinator nodes are read from allocatable and labels",
            changed,
        )
        .await;
        Devices { kind }
    }

    /// None watched (tests, tools).
    pub fn unwatched() -> Self {
        Devices {
            kind: OptionalKind::unwatched(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL),
        }
    }

    /// Returns once the first list is in, when the CRD was served at start; at once when
    /// it was not (nothing to wait for).
    pub async fn wait_until_ready(&self) {
        self.kind.wait_until_ready().await;
    }

    /// The objects as the snapshot loader reads them: kind, name and spec.
    pub fn objects(&self) -> Vec<Value> {
        self.kind
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
