//! Pure core of gpu-defrag: no kube client, no async. Pure functions over a snapshot:
//! the cluster model, GPU allocation adapters, the fragmentation metric, the scheduler
//! emulation and (later) the planner and maintenance windows.
#![forbid(unsafe_code)]

mod adapters;
pub mod compact;
pub mod dra;
pub mod fence;
pub mod formats;
pub mod frag;
pub mod ingest;
pub mod landing;
pub mod model;
pub mod plan;
pub mod policy;
pub mod recheck;
pub mod run;
pub mod sched;
pub mod snapshot;
pub mod windows;
pub mod workload;
