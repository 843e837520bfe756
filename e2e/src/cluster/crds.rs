//! The CustomResourceDefinitions: server-side applied from a dir of YAML files, then
//! waited on until Established.
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde::Deserialize;

use super::{FIELD_MANAGER, TestCluster};

impl TestCluster {
    /// Server-side applies every CustomResourceDefinition in the `*.yaml` files of `dir`
    /// and waits until each is Established. Empty files are skipped. Returns CRD names.
    pub async fn apply_crds(&self, dir: &Path) -> Result<Vec<String>> {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        let api: Api<CustomResourceDefinition> = Api::all(self.client()?);
        let mut names = Vec::new();
        for file in files {
            let text =
                fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            for doc in serde_norway::Deserializer::from_str(&text) {
                let value = serde_json::Value::deserialize(doc)
                    .with_context(|| format!("parsing {}", file.display()))?;
                if value.is_null() {
                    continue;
                }
                let crd: CustomResourceDefinition =
                    serde_json::from_value(value).with_context(|| {
                        format!("{} holds something other than a CRD", file.display())
                    })?;
                let name = crd
                    .metadata
                    .name
                    .clone()
                    .ok_or_else(|| anyhow!("a CRD in {} has no name", file.display()))?;
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&crd),
                )
                .await
                .with_context(|| format!("applying CRD {name}"))?;
                names.push(name);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for name in &names {
            loop {
                let crd = api
                    .get(name)
                    .await
                    .with_context(|| format!("reading CRD {name}"))?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("CRD {name} not Established within 30s");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(names)
    }
}
