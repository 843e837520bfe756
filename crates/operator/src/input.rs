//! Reading the inputs of the CLI: snapshot files, policy files, the live cluster.
use std::path::{Path, PathBuf};

use anyhow::Context;
use gpu_defrag_api::v1alpha1::{DefragPolicy, DefragPolicySpec};
use gpu_defrag_core::ingest::Objects;
use gpu_defrag_core::policy::Policy;
use gpu_defrag_core::workload::{
    ControllerKind, ControllerObject, KAI_GROUP_API, Listed, SCHEDULING_GROUP_API,
    SCHEDULING_GROUP_VERSION, VOLCANO_GROUP_API,
};
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// An input problem the user must fix (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

/// Reads a snapshot file.
pub fn read_snapshot(path: &Path) -> Result<Objects, InputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    gpu_defrag_core::snapshot::parse(&text)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))
}

/// Which cluster the CLI reads: the current context of the kubeconfig (`$KUBECONFIG`,
/// else `~/.kube/config`, else the in-cluster service account) unless told otherwise.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig file to use instead of `$KUBECONFIG` / `~/.kube/config`.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// The client configuration these arguments select.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let opts = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        Ok(match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kc = Kubeconfig::read_from(path)
                    .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kc, &opts).await?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&opts).await?,
            (None, None) => kube::Config::infer().await?,
        })
    }
}

/// Reads a policy file: a DefragPolicy object, its spec alone, or `spec:` alone. The spec
/// is checked as the API server (the CRD's schema and rules) and the operator (windows,
/// shapes, limits) would check it: a policy either would refuse is an error here too.
pub fn read_policy(path: &Path) -> Result<(String, Policy), InputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let value: serde_json::Value = serde_norway::from_str(&text)
        .map_err(|e| InputError(format!("{}: not YAML: {e}", path.display())))?;
    let whole = ["apiVersion", "kind", "metadata"]
        .iter()
        .any(|k| value.get(k).is_some());
    let name = value
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or("policy")
        .to_string();
    let spec_value = match value.get("spec") {
        Some(spec) if whole || value.as_object().is_some_and(|o| o.len() == 1) => spec.clone(),
        _ => value,
    };
    check_spec(&spec_value).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let spec: DefragPolicySpec = serde_path_to_error::deserialize(spec_value).map_err(|e| {
        InputError(format!(
            "{}: field spec.{}: {}",
            path.display(),
            e.path(),
            e.inner()
        ))
    })?;
    let policy = validate(&spec).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    Ok((name, policy))
}

/// What the operator refuses in a spec (beyond the schema): an unusable policy or window.
pub fn validate(spec: &DefragPolicySpec) -> Result<Policy, String> {
    let policy = Policy::from_spec(spec).map_err(|e| e.to_string())?;
    gpu_defrag_core::windows::Windows::parse(&spec.windows).map_err(|e| e.to_string())?;
    Ok(policy)
}

/// Checks a spec (JSON) as the API server would: the CRD's schema (types, unknown fields,
/// ranges, lengths, patterns, enums) and its validation rules.
pub fn check_spec(spec: &serde_json::Value) -> Result<(), String> {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(DefragPolicy::crd()).map_err(|e| e.to_string())?;
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut errors = Vec::new();
    check_value(spec, schema, "spec", &mut errors);
    // The rules (x-kubernetes-validations) of the schema, as the operator knows them.
    if spec.get("mode").and_then(|m| m.as_str()) == Some("Enforce")
        && spec
            .get("windows")
            .and_then(|w| w.as_array())
            .is_none_or(|w| w.is_empty())
        && spec
            .pointer("/demand/outsideWindows")
            .and_then(|o| o.as_bool())
            != Some(true)
    {
        errors.push(
            "spec: mode Enforce needs at least one maintenance window in spec.windows, or demand.outsideWindows: true (demand runs only)".into(),
        );
    }
    for (i, w) in spec
        .get("windows")
        .and_then(|w| w.as_array())
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(s) = w.get("schedule").and_then(|s| s.as_str())
            && s.split(' ').filter(|f| !f.is_empty()).count() != 5
        {
            errors.push(format!(
                "spec.windows[{i}].schedule: schedule must be a cron expression with 5 fields"
            ));
        }
    }
    match errors.is_empty() {
        true => Ok(()),
        false => Err(errors.join("; ")),
    }
}

/// One value against its OpenAPI v3 schema (the keywords the CRD uses).
fn check_value(v: &serde_json::Value, s: &serde_json::Value, path: &str, errors: &mut Vec<String>) {
    use serde_json::Value;
    if v.is_null() {
        if s.get("nullable") != Some(&Value::Bool(true)) {
            errors.push(format!("{path}: must not be null"));
        }
        return;
    }
    if s.get("x-kubernetes-int-or-string").is_some()
        || s.get("x-kubernetes-preserve-unknown-fields").is_some()
    {
        return;
    }
    let ty = s.get("type").and_then(Value::as_str);
    match (ty, v) {
        (Some("object"), Value::Object(o)) => {
            let props = s.get("properties").and_then(Value::as_object);
            let extra = s.get("additionalProperties");
            for (k, x) in o {
                match (props.and_then(|p| p.get(k)), extra) {
                    (Some(ps), _) => check_value(x, ps, &format!("{path}.{k}"), errors),
                    (None, Some(a)) if a.is_object() => {
                        check_value(x, a, &format!("{path}.{k}"), errors)
                    }
                    (None, Some(Value::Bool(true))) => {}
                    (None, _) if props.is_some() => {
                        errors.push(format!("{path}.{k}: unknown field"))
                    }
                    _ => {}
                }
            }
            for r in s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(r) = r.as_str()
                    && !o.contains_key(r)
                {
                    errors.push(format!("{path}.{r}: required"));
                }
            }
        }
        (Some("array"), Value::Array(a)) => {
            let n = a.len() as u64;
            if let Some(m) = s.get("maxItems").and_then(Value::as_u64)
                && n > m
            {
                errors.push(format!("{path}: at most {m} items, got {n}"));
            }
            if let Some(m) = s.get("minItems").and_then(Value::as_u64)
                && n < m
            {
                errors.push(format!("{path}: at least {m} items, got {n}"));
            }
            if let Some(items) = s.get("items") {
                for (i, x) in a.iter().enumerate() {
                    check_value(x, items, &format!("{path}[{i}]"), errors);
                }
            }
        }
        (Some("string"), Value::String(x)) => {
            let n = x.chars().count() as u64;
            if let Some(m) = s.get("maxLength").and_then(Value::as_u64)
                && n > m
            {
                errors.push(format!("{path}: at most {m} characters, got {n}"));
            }
            if let Some(m) = s.get("minLength").and_then(Value::as_u64)
                && n < m
            {
                errors.push(format!("{path}: at least {m} characters, got {n}"));
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str)
                && regex::Regex::new(p).is_ok_and(|re| !re.is_match(x))
            {
                errors.push(format!("{path}: {x:?} does not match {p}"));
            }
            if let Some(e) = s.get("enum").and_then(Value::as_array)
                && !e.iter().any(|c| c == v)
            {
                let allowed: Vec<String> = e.iter().map(|c| c.to_string()).collect();
                errors.push(format!(
                    "{path}: {x:?} is not one of {}",
                    allowed.join(", ")
                ));
            }
        }
        (Some("integer" | "number"), Value::Number(x)) => {
            let f = x.as_f64().unwrap_or(f64::NAN);
            if ty == Some("integer") && !(x.is_i64() || x.is_u64()) {
                errors.push(format!("{path}: must be an integer, got {x}"));
            }
            if let Some(m) = s.get("minimum").and_then(Value::as_f64)
                && f < m
            {
                errors.push(format!("{path}: must be at least {m}, got {x}"));
            }
            if let Some(m) = s.get("maximum").and_then(Value::as_f64)
                && f > m
            {
                errors.push(format!("{path}: must be at most {m}, got {x}"));
            }
        }
        (Some("boolean"), Value::Bool(_)) => {}
        (Some(t), _) => errors.push(format!("{path}: must be of type {t}")),
        (None, _) => {}
    }
}

/// Reads DefragPolicy `name` from the cluster and checks its spec as the operator does.
pub async fn read_cluster_policy(
    client: kube::Client,
    name: &str,
) -> anyhow::Result<(String, Policy)> {
    let p = Api::<DefragPolicy>::all(client)
        .get(name)
        .await
        .map_err(|e| not_found(e, name))?;
    let policy = validate(&p.spec).map_err(|e| InputError(format!("DefragPolicy {name}: {e}")))?;
    Ok((name.to_string(), policy))
}

/// DefragPolicy objects as the API server returns them (spec and status untouched):
/// `name`, or all of them sorted by name.
pub async fn read_policy_objects(
    client: kube::Client,
    name: Option<&str>,
) -> anyhow::Result<Vec<DynamicObject>> {
    let api = Api::<DynamicObject>::all_with(client, &ApiResource::erase::<DefragPolicy>(&()));
    let mut items = match name {
        Some(n) => vec![api.get(n).await.map_err(|e| not_found(e, n))?],
        None => api
            .list(&ListParams::default())
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => anyhow::Error::new(InputError(
                    "the DefragPolicy CRD (defragpolicies.gpu-defrag.io) is not installed in this cluster"
                        .into(),
                )),
                e => anyhow::Error::new(e).context("listing DefragPolicies"),
            })?
            .items,
    };
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(items)
}

/// The metadata of every `K` in the cluster (`what` names it in errors).
async fn list_meta<K>(
    client: &kube::Client,
    what: &str,
) -> anyhow::Result<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(Api::<K>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .with_context(|| format!("listing {what}"))?
        .items
        .into_iter()
        .map(|o| o.metadata)
        .collect())
}

/// Every `K` in the cluster; none when the API is not served or not allowed.
async fn list_optional<K>(client: &kube::Client) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// A 404 on DefragPolicy `name` is the user's to fix (exit code 2).
fn not_found(e: kube::Error, name: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 404 => anyhow::Error::new(InputError(format!(
            "DefragPolicy {name:?} not found ({}); `kubectl get dfp` lists them",
            s.message
        ))),
        e => anyhow::Error::new(e).context(format!("reading DefragPolicy {name}")),
    }
}

/// Reads nodes, pods, PDBs (and Koordinator Devices when that CRD exists, Volcano, KAI and
/// Kubernetes PodGroups, DRA ResourceSlices, ResourceClaims and DeviceClasses where
/// served) from the cluster of the current kubeconfig context. Read-only.
pub async fn read_live(client: kube::Client) -> anyhow::Result<Objects> {
    let lp = ListParams::default();
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .context("listing nodes")?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .context("listing pods")?
        .items;
    let pdbs = Api::<PodDisruptionBudget>::all(client.clone())
        .list(&lp)
        .await
        .context("listing poddisruptionbudgets")?
        .items;
    let ar = ApiResource {
        group: "scheduling.koordinator.sh".into(),
        version: "v1alpha1".into(),
        api_version: "scheduling.koordinator.sh/v1alpha1".into(),
        kind: "Device".into(),
        plural: "devices".into(),
    };
    let devices = match Api::<DynamicObject>::all_with(client.clone(), &ar)
        .list(&lp)
        .await
    {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|d| serde_json::to_value(d).ok())
            .collect(),
        // Not a Koordinator cluster (404) or not allowed: Device objects are optional.
        Err(_) => Vec::new(),
    };
    let rs = list_meta::<ReplicaSet>(&client, "replicasets").await?;
    let ss = list_meta::<StatefulSet>(&client, "statefulsets").await?;
    let jobs = list_meta::<Job>(&client, "jobs").await?;
    let namespaces = list_meta::<Namespace>(&client, "namespaces").await?;
    let mut controllers = Vec::new();
    let object = |kind| move |metadata| ControllerObject { kind, metadata };
    controllers.extend(rs.into_iter().map(object(ControllerKind::ReplicaSet)));
    controllers.extend(ss.into_iter().map(object(ControllerKind::StatefulSet)));
    controllers.extend(jobs.into_iter().map(object(ControllerKind::Job)));
    // Volcano, KAI and Kubernetes PodGroups (the last served only with the GenericWorkload
    // feature gate), where served: a pod naming a group that cannot be read is never moved
    // (gang-unknown).
    let mut pod_groups = Vec::new();
    let mut groups_listed = [false; 3];
    for (i, (group, version)) in [
        (VOLCANO_GROUP_API, "v1beta1"),
        (KAI_GROUP_API, "v2alpha2"),
        (SCHEDULING_GROUP_API, SCHEDULING_GROUP_VERSION),
    ]
    .into_iter()
    .enumerate()
    {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, "PodGroup"),
            "podgroups",
        );
        if let Ok(list) = Api::<DynamicObject>::all_with(client.clone(), &ar)
            .list(&lp)
            .await
        {
            groups_listed[i] = true;
            pod_groups.extend(
                list.items
                    .into_iter()
                    .filter_map(|g| serde_json::to_value(g).ok()),
            );
        }
    }
    // DRA objects (resource.k8s.io/v1), where served and allowed: optional like Devices.
    let resource_slices = list_optional::<ResourceSlice>(&client).await;
    let resource_claims = list_optional::<ResourceClaim>(&client).await;
    let device_classes = list_optional::<DeviceClass>(&client).await;
    // DeviceTaintRules (1.37): listed, runs could fence single DRA devices.
    let device_taint_rules = Api::<DeviceTaintRule>::all(client.clone())
        .list(&lp)
        .await
        .map(|l| l.items);
    let rules_listed = device_taint_rules.is_ok();
    Ok(Objects {
        nodes,
        pods,
        pdbs,
        devices,
        controllers,
        namespaces,
        pod_groups,
        resource_slices,
        resource_claims,
        device_classes,
        device_taint_rules: device_taint_rules.unwrap_or_default(),
        listed: Listed {
            device_taint_rules: rules_listed,
            replica_sets: true,
            stateful_sets: true,
            jobs: true,
            namespaces: true,
            volcano_pod_groups: groups_listed[0],
            kai_pod_groups: groups_listed[1],
            scheduling_pod_groups: groups_listed[2],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read_policy` of `text` written to a temporary file.
    fn read(text: &str) -> Result<(String, Policy), String> {
        let dir = std::env::temp_dir().join(format!(
            "gpu-defrag-input-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.yaml");
        std::fs::write(&path, text).unwrap();
        let r = read_policy(&path).map_err(|e| e.0);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn a_policy_file_may_be_the_object_its_spec_or_spec_alone() {
        let object = "apiVersion: gpu-defrag.io/v1alpha1\nkind: DefragPolicy\nmetadata: {name: nightly}\nspec:\n  limits: {maxInFlight: 2}\n";
        let (name, p) = read(object).unwrap();
        assert_eq!((name.as_str(), p.max_in_flight), ("nightly", 2));
        let spec_key = "spec:\n  limits: {maxInFlight: 3}\n";
        assert_eq!(read(spec_key).unwrap().1.max_in_flight, 3);
        let bare = "limits: {maxInFlight: 4}\n";
        assert_eq!(read(bare).unwrap().1.max_in_flight, 4);
    }

    #[test]
    fn what_the_api_server_or_the_operator_would_refuse_is_refused() {
        for (text, says) in [
            ("mode: Enforce\n", "needs at least one maintenance window"),
            (
                "mode: Enforce\ndemand: {outsideWindows: false}\n",
                "needs at least one maintenance window",
            ),
            (
                "mode: Enforce\nwindows: [{schedule: '0 2 * * *', duration: 3h, timeZone: Mars/Olympus}]\n",
                "Mars/Olympus",
            ),
            (
                "windows: [{schedule: '0 0 2 * * *', duration: 3h}]\n",
                "cron expression with 5 fields",
            ),
            (
                "windows: [{schedule: '0 2 * * *', duration: 3 hours}]\n",
                "does not match",
            ),
            (
                "limits: {maxInFlight: 1000}\n",
                "spec.limits.maxInFlight: must be at most 100",
            ),
            (
                "mode: Sometimes\n",
                "spec.mode: \"Sometimes\" is not one of",
            ),
            ("limts: {maxInFlight: 1}\n", "spec.limts: unknown field"),
            ("trigger: {minFragmentRate: 2}\n", "minFragmentRate"),
        ] {
            let e = read(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
        assert!(
            read(
                "mode: Enforce\nwindows: [{schedule: '0 2 * * *', duration: 3h, timeZone: UTC}]\n"
            )
            .is_ok()
        );
        // Demand runs only: Enforce with no window.
        assert!(read("mode: Enforce\ndemand: {outsideWindows: true}\n").is_ok());
    }
}
