//! The gpu-defrag operator in e2e tests: built once per test binary, run as a user bound to
//! exactly the project's ClusterRole (config/rbac/role.yaml), one process per test, each
//! reconciling only its own DefragPolicies (`--policy-selector e2e-test=<test>`).
//!
//! ```text
//! Pool::create ──> kwok nodes labelled and tainted e2e-pool=<test> (other tests stay off)
//! fragment     ──> 1-GPU Deployments fill the pool, some removed: each node partly used
//! Operator     ──> target/debug/gpu-defrag run, KUBECONFIG = the RBAC-bound user
//! PodWatch     ──> every 200 ms: pods of the namespace (uid, node, gone) and the fences
//! ```
//!
//! Isolation: every test has its own namespace, node pool and policy; its pods select and
//! tolerate only its pool, its policy covers only that pool and namespace.

mod binary;
mod credentials;
mod metrics;
mod policy;
mod pool;
mod process;
mod watch;
mod workloads;

pub use binary::operator_binary;
pub use credentials::{
    apply_landing_admission, bind_lease_role, client_from, install_landing, landing_configmap,
    operator_kubeconfig,
};
pub use metrics::metric_sum;
pub use policy::{
    condition, condition_parts, create_policy, delete_policy, float_at, int_at,
    open_window_every_minute, open_window_this_minute, patch_policy, policies, policy_resource,
    policy_status, str_at, strings_at, wait_status,
};
pub use pool::{Pool, fences, is_fence_key};
pub use process::Operator;
pub use watch::{PodWatch, Seen, SeenPod};
pub use workloads::{
    allow_one_disruption, fragment, fragment_without_pdbs, pod_app, pod_gpus, pod_node, pod_uids,
    ready_replicas, wait_deployments_ready, with_role,
};

/// The user the operator runs as; bound to the `gpu-defrag` ClusterRole only.
pub const OPERATOR_USER: &str = "gpu-defrag-e2e-operator";
/// Label on each test's DefragPolicies; its operator selects on it.
pub const POLICY_LABEL: &str = "e2e-test";
/// Label and taint key of a test's node pool.
pub const POOL_LABEL: &str = "e2e-pool";
/// Domain of the fences the executor puts on nodes it empties: one taint key per policy,
/// `draining.gpu-defrag.io/<policy>`, with the policy name as value.
pub const DRAINING_TAINT_DOMAIN: &str = "draining.gpu-defrag.io";
/// The namespace of the landing-control ConfigMaps (the one config/landing's binding reads).
pub const LANDING_NAMESPACE: &str = "gpu-defrag-system";
/// The landing gate and the label of the pods it holds.
pub const LANDING_GATE: &str = "gpu-defrag.io/landing";
/// Label of the filler Deployments made by [`fragment`].
pub const ROLE_LABEL: &str = "e2e-role";
