//! Test namespaces: [`TestCluster::namespace`] and its guard [`TestNamespace`], deleted on
//! drop, or kept and dumped when the test fails.
use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, api::PostParams};
use serde_json::json;

use super::{TEST_NAMESPACE_LABEL, TestCluster, unique_suffix};

impl TestCluster {
    /// Creates a fresh namespace `<prefix>-<random>` labelled `e2e.gpu-defrag.io/test`.
    /// Dropping the guard deletes it; if the thread is panicking (a failing test) it keeps
    /// the namespace and the work dir and prints the pods and where the logs are.
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace> {
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let prefix = prefix.trim_matches('-');
        let prefix = if prefix.is_empty() { "test" } else { prefix };
        let name = format!("{prefix}-{}", unique_suffix());
        let api: Api<Namespace> = Api::all(self.client()?);
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {TEST_NAMESPACE_LABEL: "true"}}
        }))
        .context("building a Namespace")?;
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(TestNamespace {
            name,
            kubectl: self.kubectl_path(),
            kubeconfig: self.kubeconfig.clone(),
            work_dir: self.work_dir.clone(),
            describe: self.describe(),
        })
    }
}

/// A namespace for one test; see [`TestCluster::namespace`].
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    work_dir: PathBuf,
    describe: String,
}

impl TestNamespace {
    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn kubectl(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .ok()?;
        Some(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Prints the namespace's pods, PDBs and events and the nodes (for a failing test).
    pub fn dump(&self) {
        let ns = self.name.as_str();
        eprintln!("--- state of namespace {ns} ---");
        for args in [
            &[
                "get",
                "pods,deployments,replicasets,pdb",
                "-o",
                "wide",
                "-n",
                ns,
            ][..],
            &["get", "events", "--sort-by=.lastTimestamp", "-n", ns][..],
            &["get", "nodes", "-o", "wide"][..],
        ] {
            if let Some(out) = self.kubectl(args) {
                eprintln!("$ kubectl {}\n{out}", args.join(" "));
            }
        }
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = fs::write(self.work_dir.join("keep"), "");
            self.dump();
            eprintln!(
                "test failed in namespace {}; {} (kept)",
                self.name, self.describe
            );
        } else {
            let _ = self.kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
        }
    }
}
