//! A real local Kubernetes control plane for gpu-defrag's end-to-end tests and demo.
//!
//! ```text
//! e2e/cluster/build.sh ──> ~/.cache/gpu-defrag/cluster-<versions>/bin/{etcd, kube-apiserver,
//!                          kube-controller-manager, kube-scheduler, kubectl, kwok}
//!
//! TestCluster::start ──> etcd ─> kube-apiserver ─> CRDs ─> KCM + schedulers + kwok ─> GPU nodes
//!                        (free loopback ports, own PKI, logs in <work dir>/logs)
//! ```
//!
//! Tests take the binary's shared stack with [`shared`] and a namespace each with
//! [`TestCluster::namespace`]:
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! let cluster = gpu_defrag_e2e::shared().await?;
//! let ns = cluster.namespace("binpack").await?;
//! let client = cluster.client()?;
//! # let _ = (ns, client); Ok(()) }
//! ```
//!
//! Every component runs in its own process group and is killed by group on
//! [`TestCluster::stop`], on drop, and — for the `static` shared stack — by a reaper process
//! when the test binary exits.
//!
//! Modules, bottom-up (each imports only modules above it in this list, never one that
//! imports it back): `process`, `pki`, `fixtures` (building blocks: workloads, polling) →
//! `cluster` (the control plane) → `shared` (one stack per test binary), `operator` (the
//! operator as a process), `inpod` (a process run as its pod would: in-cluster
//! configuration only) → `fakedra` (a fake DRA GPU driver's objects), `case` (a test case:
//! namespace, policy, operator).
#![forbid(unsafe_code)]

pub mod case;
pub mod cluster;
pub mod fakedra;
pub mod fixtures;
pub mod inpod;
pub mod operator;
pub mod pki;
pub mod process;
pub mod shared;

pub use cluster::{
    ClusterOptions, DEFAULT_GPU_MODEL, GPU_PRODUCT_LABEL, GPU_RESOURCE, GpuNodes,
    KWOK_NODE_ANNOTATION, TestCluster, TestNamespace, bin_dir, node_usable, repo_root,
};
pub use shared::shared;
