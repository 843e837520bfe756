//! One stack per test binary.
//!
//! [`shared`] starts a [`TestCluster`] with the default options on first use; every test
//! of the binary gets the same one and works in its own namespace. The cluster lives in a
//! `static`, which Rust never drops: its reaper kills the components when the test binary
//! exits (see [`crate::process`]), and removes the work dir unless a test failed.

use anyhow::{Result, anyhow};
use tokio::sync::OnceCell;

use crate::cluster::{ClusterOptions, TestCluster};

static SHARED: OnceCell<std::result::Result<TestCluster, String>> = OnceCell::const_new();

/// The stack of this test binary, started on first use. A failed start is reported to
/// every caller without retrying. Prints where the logs are; the test harness shows that
/// line only for failing tests.
pub async fn shared() -> Result<&'static TestCluster> {
    let started = SHARED
        .get_or_init(|| async {
            TestCluster::start(ClusterOptions::default())
                .await
                .map_err(|e| format!("{e:#}"))
        })
        .await;
    match started {
        Ok(cluster) => {
            eprintln!(
                "{} (started in {:.1}s)",
                cluster.describe(),
                cluster.started_in().as_secs_f64()
            );
            Ok(cluster)
        }
        Err(e) => Err(anyhow!("the shared e2e cluster did not start: {e}")),
    }
}
