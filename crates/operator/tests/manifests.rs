//! The install manifests in `config/`: every YAML parses; the RBAC is least privilege (no
//! pod or node delete); kustomizations point at files that exist; the CRD copy is fresh; the
//! Deployment and the sample policies are what the operator expects.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
}

/// Every non-empty YAML document of a file.
fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| {
            Value::deserialize(d)
                .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// All documents of the directories that hold Kubernetes objects or kustomizations.
fn objects() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    for dir in [
        "crd",
        "default",
        "landing",
        "manager",
        "rbac",
        "samples",
        "scheduler",
    ] {
        yaml_files(&repo().join("config").join(dir), &mut files);
    }
    let mut out = Vec::new();
    for f in files {
        for d in docs(&f) {
            out.push((f.clone(), d));
        }
    }
    out
}

fn find<'a>(objs: &'a [(PathBuf, Value)], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"] == kind && v["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in config/"))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

const NAMESPACE: &str = "gpu-defrag-system";
const SERVICE_ACCOUNT: &str = "gpu-defrag";

#[test]
fn every_yaml_under_config_parses() {
    let mut files = Vec::new();
    yaml_files(&repo().join("config"), &mut files);
    assert!(files.len() >= 12, "{files:?}");
    for f in &files {
        docs(f);
    }
    for (path, v) in objects() {
        assert!(
            v["apiVersion"].is_string() && v["kind"].is_string(),
            "{}: a document without apiVersion/kind",
            path.display()
        );
    }
}

/// `(apiGroup, resource)` → verbs, one entry per group × resource of a rule list.
fn grants(rules: &Value) -> BTreeSet<(String, String, Vec<String>)> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().unwrap() {
        assert!(
            rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
            "{rule}"
        );
        let mut verbs = strs(&rule["verbs"]);
        verbs.sort();
        for g in strs(&rule["apiGroups"]) {
            for r in strs(&rule["resources"]) {
                assert!(
                    out.insert((g.clone(), r.clone(), verbs.clone())),
                    "{g}/{r} granted twice"
                );
            }
        }
    }
    out
}

fn grant(g: &str, r: &str, verbs: &[&str]) -> (String, String, Vec<String>) {
    let mut verbs: Vec<String> = verbs.iter().map(|v| v.to_string()).collect();
    verbs.sort();
    (g.into(), r.into(), verbs)
}

#[test]
fn cluster_role_is_least_privilege() {
    let objs = objects();
    let role = find(&objs, "ClusterRole", "gpu-defrag");
    let want: BTreeSet<_> = [
        grant("", "pods", &["get", "list", "watch"]),
        grant("", "pods/eviction", &["create"]),
        // Landing control: the gate removed, the planned node nominated.
        grant("", "pods", &["patch"]),
        grant("", "pods/status", &["patch"]),
        grant("", "nodes", &["get", "list", "watch", "patch"]),
        grant("policy", "poddisruptionbudgets", &["get", "list", "watch"]),
        grant("events.k8s.io", "events", &["create", "patch"]),
        grant("", "events", &["create", "patch"]),
        // patch: the finalizer that takes a deleted policy's fences back.
        grant(
            "gpu-defrag.io",
            "defragpolicies",
            &["get", "list", "patch", "watch"],
        ),
        grant("gpu-defrag.io", "defragpolicies/finalizers", &["update"]),
        grant(
            "gpu-defrag.io",
            "defragpolicies/status",
            &["get", "patch", "update"],
        ),
        grant(
            "scheduling.koordinator.sh",
            "devices",
            &["get", "list", "watch"],
        ),
        grant("apps", "replicasets", &["get", "list", "watch"]),
        grant("apps", "statefulsets", &["get", "list", "watch"]),
        grant("batch", "jobs", &["get", "list", "watch"]),
        grant("", "namespaces", &["get", "list", "watch"]),
        grant(
            "scheduling.volcano.sh",
            "podgroups",
            &["get", "list", "watch"],
        ),
        grant("scheduling.run.ai", "podgroups", &["get", "list", "watch"]),
        grant("scheduling.k8s.io", "podgroups", &["get", "list", "watch"]),
        grant(
            "resource.k8s.io",
            "resourceslices",
            &["get", "list", "watch"],
        ),
        grant(
            "resource.k8s.io",
            "resourceclaims",
            &["get", "list", "watch"],
        ),
        grant(
            "resource.k8s.io",
            "deviceclasses",
            &["get", "list", "watch"],
        ),
        // The run's own device fences (delete: only the rules it labelled, see below).
        grant(
            "resource.k8s.io",
            "devicetaintrules",
            &["create", "delete", "get", "list", "watch"],
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(grants(&role["rules"]), want);

    // Nowhere in config/: wildcards, escalation verbs, delete (but of DeviceTaintRules,
    // the run's device fences).
    for (path, v) in &objs {
        if !matches!(v["kind"].as_str(), Some("ClusterRole" | "Role")) {
            continue;
        }
        for rule in v["rules"].as_array().unwrap() {
            let fences_only = strs(&rule["resources"]) == ["devicetaintrules"]
                && strs(&rule["apiGroups"]) == ["resource.k8s.io"];
            for field in ["verbs", "resources", "apiGroups"] {
                for s in strs(&rule[field]) {
                    if fences_only && field == "verbs" && s == "delete" {
                        continue;
                    }
                    assert!(
                        !matches!(
                            s.as_str(),
                            "*" | "delete"
                                | "deletecollection"
                                | "escalate"
                                | "bind"
                                | "impersonate"
                        ),
                        "{}: {s:?} in {rule}",
                        path.display()
                    );
                }
            }
        }
    }
}

#[test]
fn viewer_role_only_reads() {
    let objs = objects();
    let role = find(&objs, "ClusterRole", "gpu-defrag-viewer");
    let want: BTreeSet<_> = [
        grant("", "nodes", &["get", "list"]),
        grant("", "pods", &["get", "list"]),
        grant("policy", "poddisruptionbudgets", &["get", "list"]),
        grant("gpu-defrag.io", "defragpolicies", &["get", "list"]),
        grant("scheduling.koordinator.sh", "devices", &["get", "list"]),
        grant("apps", "replicasets", &["get", "list"]),
        grant("apps", "statefulsets", &["get", "list"]),
        grant("batch", "jobs", &["get", "list"]),
        grant("", "namespaces", &["get", "list"]),
        grant("scheduling.volcano.sh", "podgroups", &["get", "list"]),
        grant("scheduling.run.ai", "podgroups", &["get", "list"]),
        grant("scheduling.k8s.io", "podgroups", &["get", "list"]),
        grant("resource.k8s.io", "resourceslices", &["get", "list"]),
        grant("resource.k8s.io", "resourceclaims", &["get", "list"]),
        grant("resource.k8s.io", "deviceclasses", &["get", "list"]),
        grant("resource.k8s.io", "devicetaintrules", &["get", "list"]),
    ]
    .into_iter()
    .collect();
    assert_eq!(grants(&role["rules"]), want);
    let rbac = &docs(&repo().join("config/rbac/kustomization.yaml"))[0];
    assert!(strs(&rbac["resources"]).contains(&"viewer_role.yaml".to_string()));
}

#[test]
fn leases_only_in_the_operator_namespace() {
    let objs = objects();
    let role = find(&objs, "Role", "gpu-defrag-leader-election");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    let want: BTreeSet<_> = [
        grant(
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
        ),
        // Landing control's ConfigMap, in the operator's namespace only.
        grant("", "configmaps", &["get", "create", "patch"]),
    ]
    .into_iter()
    .collect();
    assert_eq!(grants(&role["rules"]), want);
    for (_, v) in &objs {
        if v["kind"] == "ClusterRole" {
            assert!(
                !v.to_string().contains("leases"),
                "leases in a ClusterRole: {v}"
            );
        }
    }
}

/// The landing gate is added by the API server's own admission policy, failing open, and
/// only for workloads listed in the operator's ConfigMaps in its own namespace.
#[test]
fn the_landing_admission_policy_fails_open_and_reads_only_the_operator_configmaps() {
    let objs = objects();
    let map = find(&objs, "MutatingAdmissionPolicy", "gpu-defrag-landing");
    assert_eq!(map["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(map["spec"]["failurePolicy"], "Ignore");
    assert_eq!(map["spec"]["reinvocationPolicy"], "Never");
    assert_eq!(map["spec"]["paramKind"]["kind"], "ConfigMap");
    let rules = &map["spec"]["matchConstraints"]["resourceRules"];
    assert_eq!(strs(&rules[0]["operations"]), ["CREATE"]);
    assert_eq!(strs(&rules[0]["resources"]), ["pods"]);
    let text = map["spec"].to_string();
    assert!(text.contains("in params.data"), "{text}");
    assert!(text.contains("gpu-defrag.io/landing"), "{text}");
    let binding = find(
        &objs,
        "MutatingAdmissionPolicyBinding",
        "gpu-defrag-landing",
    );
    assert_eq!(binding["spec"]["policyName"], "gpu-defrag-landing");
    let p = &binding["spec"]["paramRef"];
    assert_eq!(p["namespace"], NAMESPACE);
    assert_eq!(p["parameterNotFoundAction"], "Allow");
    assert_eq!(
        p["selector"]["matchLabels"][gpu_defrag_operator::landing::PARAMS_LABEL],
        "true"
    );
    let default = &docs(&repo().join("config/default/kustomization.yaml"))[0];
    assert!(strs(&default["resources"]).contains(&"../landing".to_string()));
}

#[test]
fn bindings_tie_the_roles_to_the_service_account() {
    let objs = objects();
    let sa = find(&objs, "ServiceAccount", SERVICE_ACCOUNT);
    assert_eq!(sa["metadata"]["namespace"], NAMESPACE);
    for (kind, name, role_kind) in [
        ("ClusterRoleBinding", "gpu-defrag", "ClusterRole"),
        ("RoleBinding", "gpu-defrag-leader-election", "Role"),
    ] {
        let b = find(&objs, kind, name);
        assert_eq!(b["roleRef"]["kind"], role_kind, "{name}");
        let role = b["roleRef"]["name"].as_str().unwrap();
        find(&objs, role_kind, role);
        let subjects = b["subjects"].as_array().unwrap();
        assert_eq!(subjects.len(), 1, "{name}");
        assert_eq!(subjects[0]["kind"], "ServiceAccount");
        assert_eq!(subjects[0]["name"], SERVICE_ACCOUNT);
        assert_eq!(subjects[0]["namespace"], NAMESPACE);
        if kind == "RoleBinding" {
            assert_eq!(b["metadata"]["namespace"], NAMESPACE);
        }
    }
}

#[test]
fn deployment_runs_two_hardened_leader_elected_replicas() {
    let objs = objects();
    let d = find(&objs, "Deployment", "gpu-defrag");
    assert_eq!(d["metadata"]["namespace"], NAMESPACE);
    assert_eq!(d["spec"]["replicas"], 2);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], SERVICE_ACCOUNT);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(
        c["image"],
        format!(
            "ghcr.io/gpu-defrag/gpu-defrag:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(
        strs(&c["args"]),
        ["run", "--leader-elect", "--metrics-addr", "0.0.0.0:8080"]
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    let port = c["ports"][0]["name"].clone();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], port, "{probe}");
    }
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    // The Lease namespace and identity come from the downward API.
    let env: BTreeSet<String> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["valueFrom"]["fieldRef"].is_object())
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        env.contains("POD_NAME") && env.contains("POD_NAMESPACE"),
        "{env:?}"
    );
}

#[test]
fn kustomizations_list_existing_resources() {
    let mut files = Vec::new();
    yaml_files(&repo().join("config"), &mut files);
    let kustomizations: Vec<_> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "kustomization.yaml"))
        .collect();
    assert!(kustomizations.len() >= 5, "{kustomizations:?}");
    for k in kustomizations {
        let dir = k.parent().unwrap();
        let doc = &docs(k)[0];
        for r in strs(&doc["resources"]) {
            let p = dir.join(&r);
            // Kustomize loads nothing outside the kustomization's own tree.
            assert!(
                !r.starts_with("../..") && !r.starts_with('/'),
                "{}: {r}",
                k.display()
            );
            if p.is_dir() {
                assert!(
                    p.join("kustomization.yaml").is_file(),
                    "{}: {r} has no kustomization",
                    k.display()
                );
            } else {
                assert!(p.is_file(), "{}: {r} does not exist", k.display());
            }
        }
    }
    let default = &docs(&repo().join("config/default/kustomization.yaml"))[0];
    assert_eq!(default["namespace"], NAMESPACE);
    assert_eq!(
        strs(&default["resources"]),
        ["../crd", "../rbac", "../manager", "../landing"]
    );
}

#[test]
fn crd_copy_for_kustomize_is_fresh() {
    let generated = std::fs::read_to_string(repo().join("crds/defragpolicy.yaml")).unwrap();
    let copy = std::fs::read_to_string(repo().join("config/crd/defragpolicy.yaml")).unwrap();
    assert!(
        generated == copy,
        "config/crd/defragpolicy.yaml is stale: cp crds/defragpolicy.yaml config/crd/"
    );
}

/// Keys of `value` that the CRD's structural schema does not know (the API server would
/// silently drop them).
fn unknown_fields(value: &Value, schema: &Value, at: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let props = schema.get("properties");
            let extra = schema.get("additionalProperties");
            for (k, v) in map {
                let sub = match (props.and_then(|p| p.get(k)), extra) {
                    (Some(s), _) => s,
                    (None, Some(s)) if s.is_object() => s,
                    (None, _) if schema.get("x-kubernetes-preserve-unknown-fields").is_some() => {
                        continue;
                    }
                    _ => {
                        out.push(format!("{at}.{k}"));
                        continue;
                    }
                };
                unknown_fields(v, sub, &format!("{at}.{k}"), out);
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    unknown_fields(v, s, &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

#[test]
fn samples_match_the_crd_schema() {
    let crd = &docs(&repo().join("crds/defragpolicy.yaml"))[0];
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let objs = objects();
    let samples: Vec<_> = objs
        .iter()
        .filter(|(p, v)| {
            p.starts_with(repo().join("config/samples")) && v["kind"] == "DefragPolicy"
        })
        .collect();
    assert!(samples.len() >= 2);
    for (path, v) in samples {
        assert_eq!(v["apiVersion"], "gpu-defrag.io/v1alpha1");
        let mut unknown = Vec::new();
        unknown_fields(&v["spec"], schema, "spec", &mut unknown);
        assert!(
            unknown.is_empty(),
            "{}: unknown fields {unknown:?}",
            path.display()
        );
        let policy: gpu_defrag_api::v1alpha1::DefragPolicy =
            serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(policy.metadata.name.is_some());
    }
    let nightly = find(&objs, "DefragPolicy", "enforce-nightly");
    assert_eq!(nightly["spec"]["mode"], "Enforce");
    let w = &nightly["spec"]["windows"][0];
    assert_eq!(w["schedule"], "0 2 * * *");
    assert_eq!(w["duration"], "3h");
    assert_eq!(w["timeZone"], "Asia/Shanghai");
}

fn deployment_pod_template() -> Value {
    let objs = objects();
    find(&objs, "Deployment", "gpu-defrag")["spec"]["template"].clone()
}

/// Every `key: value` of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let sel = selector.as_object().unwrap();
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The `restricted` Pod Security Standard (the namespace enforces it): what the API server
/// would refuse, checked on the Deployment's pod template.
#[test]
fn pod_template_meets_the_restricted_pod_security_standard() {
    let objs = objects();
    let ns = find(&objs, "Namespace", NAMESPACE);
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let pod = &deployment_pod_template()["spec"];
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[host].is_null() || pod[host] == false, "{host}");
    }
    for v in pod["volumes"].as_array().into_iter().flatten() {
        assert!(v["hostPath"].is_null(), "hostPath volume {v}");
    }
    let psc = &pod["securityContext"];
    assert_ne!(psc["runAsUser"], 0);
    let mut containers: Vec<&Value> = pod["containers"].as_array().unwrap().iter().collect();
    containers.extend(pod["initContainers"].as_array().into_iter().flatten());
    for c in containers {
        let name = c["name"].as_str().unwrap();
        let sc = &c["securityContext"];
        // Set on the container, or inherited from the pod.
        let either = |k: &str| {
            if sc[k].is_null() {
                psc[k].clone()
            } else {
                sc[k].clone()
            }
        };
        assert_eq!(either("runAsNonRoot"), true, "{name}: runAsNonRoot");
        assert_ne!(either("runAsUser"), 0, "{name}: runAsUser");
        assert_eq!(
            either("seccompProfile")["type"],
            "RuntimeDefault",
            "{name}: seccompProfile"
        );
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert!(
            sc["privileged"].is_null() || sc["privileged"] == false,
            "{name}"
        );
        assert!(strs(&sc["capabilities"]["drop"]).contains(&"ALL".to_string()));
        for add in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            assert_eq!(add, "NET_BIND_SERVICE", "{name}: capability {add}");
        }
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        for p in c["ports"].as_array().into_iter().flatten() {
            assert!(p["hostPort"].is_null(), "{name}: hostPort");
        }
    }
}

/// The Deployment names a release tag (never `:latest`), the kustomization's `images:` entry
/// is the one `kustomize edit set image` changes, and the Containerfile builds an image that
/// runs as the pod's user.
#[test]
fn image_is_a_release_tag_set_by_the_kustomization() {
    let pod = deployment_pod_template();
    let image = pod["spec"]["containers"][0]["image"].as_str().unwrap();
    let (name, tag) = image.rsplit_once(':').unwrap();
    assert!(!tag.contains('/'), "{image}: no tag");
    assert_ne!(tag, "latest");
    assert_eq!(tag, env!("CARGO_PKG_VERSION"), "{image}");
    let k = &docs(&repo().join("config/manager/kustomization.yaml"))[0];
    let images = k["images"].as_array().unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["name"], name);
    assert_eq!(images[0]["newTag"], tag);

    let cf = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    let lines: Vec<&str> = cf.lines().map(str::trim).collect();
    assert!(
        cf.contains("cargo build --release -p gpu-defrag-operator --locked"),
        "Containerfile"
    );
    let user = pod["spec"]["securityContext"]["runAsUser"]
        .as_i64()
        .unwrap();
    let group = pod["spec"]["securityContext"]["runAsGroup"]
        .as_i64()
        .unwrap();
    assert!(lines.contains(&format!("USER {user}:{group}").as_str()));
    assert!(lines.contains(&r#"ENTRYPOINT ["/gpu-defrag"]"#));
    // hack/image.sh BASE=debian-local reuses the runtime stage by these two lines.
    assert!(lines.iter().any(|l| l.starts_with("# --- runtime")));
    assert!(lines.contains(&"COPY --from=builder /out/gpu-defrag /gpu-defrag"));
    // The build context leaves the local build output out.
    for ignore in [".containerignore", ".dockerignore"] {
        let text = std::fs::read_to_string(repo().join(ignore)).unwrap();
        assert!(text.lines().any(|l| l == "target/"), "{ignore}");
    }
}

/// The Service, ServiceMonitor and PodMonitor of config/prometheus reach the operator's pods
/// on the port the operator listens on.
#[test]
fn metrics_service_and_monitors_select_the_operator_pods() {
    let template = deployment_pod_template();
    let pod_labels = &template["metadata"]["labels"];
    let c = &template["spec"]["containers"][0];
    let port = &c["ports"][0];
    let port_name = port["name"].as_str().unwrap();
    // The operator binds --metrics-addr on every interface, on the container port.
    let args = strs(&c["args"]);
    let addr = &args[args.iter().position(|a| a == "--metrics-addr").unwrap() + 1];
    assert_eq!(*addr, format!("0.0.0.0:{}", port["containerPort"]));

    let dir = repo().join("config/prometheus");
    let svc = &docs(&dir.join("service.yaml"))[0];
    assert_eq!(svc["kind"], "Service");
    assert_eq!(svc["metadata"]["namespace"], NAMESPACE);
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert!(selects(&svc["spec"]["selector"], pod_labels));
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["name"], "metrics");
    assert_eq!(ports[0]["targetPort"], port_name);

    let sm = &docs(&dir.join("servicemonitor.yaml"))[0];
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["kind"], "ServiceMonitor");
    assert_eq!(sm["metadata"]["namespace"], NAMESPACE);
    assert!(selects(
        &sm["spec"]["selector"]["matchLabels"],
        &svc["metadata"]["labels"]
    ));
    assert_eq!(
        strs(&sm["spec"]["namespaceSelector"]["matchNames"]),
        [NAMESPACE]
    );
    let ep = &sm["spec"]["endpoints"].as_array().unwrap()[0];
    assert_eq!(ep["port"], ports[0]["name"]);
    assert_eq!(ep["path"], "/metrics");

    let pm = &docs(&dir.join("podmonitor/podmonitor.yaml"))[0];
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["kind"], "PodMonitor");
    assert_eq!(pm["metadata"]["namespace"], NAMESPACE);
    assert!(selects(&pm["spec"]["selector"]["matchLabels"], pod_labels));
    assert_eq!(
        strs(&pm["spec"]["namespaceSelector"]["matchNames"]),
        [NAMESPACE]
    );
    let ep = &pm["spec"]["podMetricsEndpoints"].as_array().unwrap()[0];
    assert_eq!(ep["port"], port_name);
    assert_eq!(ep["path"], "/metrics");

    // One scrape path at a time: the ServiceMonitor's kustomization, or the PodMonitor's.
    let k = &docs(&dir.join("kustomization.yaml"))[0];
    assert_eq!(
        strs(&k["resources"]),
        ["prometheusrule.yaml", "service.yaml", "servicemonitor.yaml"]
    );
    let k = &docs(&dir.join("podmonitor/kustomization.yaml"))[0];
    assert_eq!(strs(&k["resources"]), ["podmonitor.yaml"]);
}

/// The gpu-binpack scheduler of config/scheduler: one profile, named as the policies'
/// default `safety.binpackSchedulers`, scoring MostAllocated on GPUs, with a Lease of its
/// own (never the default scheduler's kube-system/kube-scheduler), and a Deployment that
/// mounts this very file.
#[test]
fn gpu_binpack_scheduler_is_its_own_scheduler() {
    let cfg = &docs(&repo().join("config/scheduler/gpu-binpack.yaml"))[0];
    assert_eq!(cfg["kind"], "KubeSchedulerConfiguration");
    let profiles = cfg["profiles"].as_array().unwrap();
    assert_eq!(
        profiles.len(),
        1,
        "one profile: only pods that opt in are affected"
    );
    assert_eq!(
        profiles[0]["schedulerName"],
        gpu_defrag_api::v1alpha1::BINPACK_SCHEDULER
    );
    let fit = profiles[0]["pluginConfig"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "NodeResourcesFit")
        .unwrap();
    assert_eq!(fit["args"]["scoringStrategy"]["type"], "MostAllocated");
    assert!(
        strs(
            &fit["args"]["scoringStrategy"]["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["name"].clone())
                .collect::<Value>()
        )
        .contains(&"nvidia.com/gpu".to_string())
    );
    let le = &cfg["leaderElection"];
    assert_eq!(le["leaderElect"], true);
    assert_eq!(le["resourceName"], "gpu-binpack");
    assert_eq!(le["resourceNamespace"], NAMESPACE);
    let k = &docs(&repo().join("config/scheduler/kustomization.yaml"))[0];
    let gen_ = &k["configMapGenerator"][0];
    assert_eq!(gen_["files"][0], "config.yaml=gpu-binpack.yaml");
    let objs = objects();
    let d = find(&objs, "Deployment", "gpu-binpack");
    let spec = &d["spec"]["template"]["spec"];
    assert_eq!(spec["volumes"][0]["configMap"]["name"], gen_["name"]);
    let cmd = strs(&spec["containers"][0]["command"]);
    assert!(
        cmd.contains(&format!(
            "--config={}/config.yaml",
            spec["containers"][0]["volumeMounts"][0]["mountPath"]
                .as_str()
                .unwrap()
        )),
        "{cmd:?}"
    );
    // The scheduler's own pods are placed by the default scheduler.
    assert!(spec["schedulerName"].is_null());
}
