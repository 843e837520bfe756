//! Dynamic Resource Allocation objects (`resource.k8s.io/v1`): ResourceSlices (the devices
//! drivers publish), ResourceClaims (their allocations) and DeviceClasses, watched where
//! the API server serves them (Kubernetes 1.34 and later), and DeviceTaintRules (1.37):
//! administrators' device taints, and the fences runs put on single DRA devices. The core
//! reads GPUs and their allocations from them ([`gpu_defrag_core::dra`]); on a cluster
//! without DRA the stores stay empty.
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::Client;

use crate::optional::OptionalTyped;

const WITHOUT: &str = "GPUs published only through DRA are not seen";
const WITHOUT_RULES: &str = "single DRA devices are not fenced (DRA nodes are drained whole) and administrators' DeviceTaintRules are not seen";

/// The watched DRA objects.
#[derive(Clone)]
pub struct DraObjects {
    slices: OptionalTyped<ResourceSlice>,
    claims: OptionalTyped<ResourceClaim>,
    classes: OptionalTyped<DeviceClass>,
    rules: OptionalTyped<DeviceTaintRule>,
}

/// The DRA objects at one instant.
#[derive(Default)]
pub struct DraSnapshot {
    /// ResourceSlices.
    pub slices: Vec<Arc<ResourceSlice>>,
    /// ResourceClaims.
    pub claims: Vec<Arc<ResourceClaim>>,
    /// DeviceClasses.
    pub classes: Vec<Arc<DeviceClass>>,
    /// DeviceTaintRules.
    pub rules: Vec<Arc<DeviceTaintRule>>,
    /// DeviceTaintRules are served and listed: a run can fence a single DRA device.
    pub rules_listed: bool,
}

impl DraObjects {
    /// Starts the four watches (each once its kind is served); `changed` is called on
    /// every change.
    pub async fn start(client: Client, changed: impl Fn() + Clone + Send + Sync + 'static) -> Self {
        let slices =
            OptionalTyped::start(client.clone(), "resourceslices", WITHOUT, changed.clone()).await;
        let claims =
            OptionalTyped::start(client.clone(), "resourceclaims", WITHOUT, changed.clone()).await;
        let classes =
            OptionalTyped::start(client.clone(), "deviceclasses", WITHOUT, changed.clone()).await;
        let rules = OptionalTyped::start(client, "devicetaintrules", WITHOUT_RULES, changed).await;
        DraObjects {
            slices,
            claims,
            classes,
            rules,
        }
    }

    /// None watched (tests, tools).
    pub fn unwatched() -> Self {
        DraObjects {
            slices: OptionalTyped::unwatched(),
            claims: OptionalTyped::unwatched(),
            classes: OptionalTyped::unwatched(),
            rules: OptionalTyped::unwatched(),
        }
    }

    /// Returns once every kind served at start holds its first list.
    pub async fn wait_until_ready(&self) {
        tokio::join!(
            self.slices.wait_until_ready(),
            self.claims.wait_until_ready(),
            self.classes.wait_until_ready(),
            self.rules.wait_until_ready()
        );
    }

    /// The DeviceTaintRules now.
    pub fn rules(&self) -> Vec<Arc<DeviceTaintRule>> {
        self.rules.state()
    }

    /// The objects now.
    pub fn snapshot(&self) -> DraSnapshot {
        DraSnapshot {
            slices: self.slices.state(),
            claims: self.claims.state(),
            classes: self.classes.state(),
            rules: self.rules.state(),
            rules_listed: self.rules.listed(),
        }
    }
}
