#![forbid(unsafe_code)]
//! The gpu-defrag operator and its CLI, as a library (`main.rs` only parses the command
//! line and starts things).
//!
//! Modules, bottom-up: a module imports only modules of a layer below its own, never one
//! that imports it back.
//!
//! 1. `objects`, `status`, `render`, `input`, `plugin`: pure helpers over Kubernetes
//!    objects, status, tables and files; then `demand` (pure: which waiting group a demand
//!    run serves, `status.demand`).
//! 2. `apiclient` (the client's rate limit, request counts, outages), then `metrics` (the
//!    Prometheus registry; reads the request counts), then `lease` (leader election),
//!    then `idle` (GPU activity from Prometheus), then `landing` (landing control: the
//!    replacements expected, held and nominated).
//! 3. `optional`, then `koord`, `owners` and `dra`: optional-kind and metadata watches.
//! 4. `context`: the shared state (`Ctx`), errors, events, status writes and `observe`.
//! 5. `executor`: the shell of a run (`gpu_defrag_core::run` decides; `evictor`, `fences`,
//!    `waits`, `outcome`).
//! 6. `controller`: watches and wiring, `reconcile`, `decide` (pure, with the demand arm).
//! 7. `http` (/metrics, /healthz, /readyz) and `cli` (the commands).
pub mod apiclient;
pub mod cli;
pub mod context;
pub mod controller;
pub mod demand;
pub mod dra;
pub mod executor;
pub mod http;
pub mod idle;
pub mod input;
pub mod koord;
pub mod landing;
pub mod lease;
pub mod metrics;
pub mod objects;
pub mod optional;
pub mod owners;
pub mod plugin;
pub mod render;
pub mod status;
