//! The kubectl plugin on the real local control plane: the built `gpu-defrag` binary,
//! linked as `kubectl-gpu_defrag` into a directory put first on `PATH`, run through the
//! cluster's own kubectl (`kubectl gpu-defrag status|report|plan`) as a user bound only to
//! config/rbac/viewer_role.yaml (read-only), with `KUBECONFIG` pointing at that user.
//!
//! The operator (run as in `e2e/tests/operator.rs`) fills the status of a DryRun policy
//! over a fragmented pool first and is then stopped, so the status no longer changes
//! while the plugin's output is compared with it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use anyhow::{Context, Result, anyhow};
use gpu_defrag_e2e::{
    TestCluster,
    case::Case,
    fixtures::wait_for,
    operator::{
        Operator, condition_parts, create_policy, delete_policy, float_at, fragment, int_at,
        operator_binary, pod_uids, policy_status, wait_status,
    },
    repo_root,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
/// The user the plugin runs as; bound to the `gpu-defrag-viewer` ClusterRole only.
const VIEWER: &str = "gpu-defrag-e2e-viewer";

/// Applies config/rbac/viewer_role.yaml, binds it to [`VIEWER`] and returns that user's
/// kubeconfig once the API server lets it list DefragPolicies.
async fn viewer_kubeconfig(cluster: &TestCluster) -> Result<PathBuf> {
    let admin = cluster.client()?;
    let path = repo_root().join("config/rbac/viewer_role.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let role: ClusterRole = serde_norway::from_str(&text)
        .with_context(|| format!("{} is not a ClusterRole", path.display()))?;
    let name = role
        .metadata
        .name
        .clone()
        .ok_or_else(|| anyhow!("the ClusterRole has no name"))?;
    let pp = PatchParams::apply("gpu-defrag-e2e").force();
    Api::<ClusterRole>::all(admin.clone())
        .patch(&name, &pp, &Patch::Apply(&role))
        .await
        .context("applying the viewer ClusterRole")?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": VIEWER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": VIEWER}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin)
        .patch(VIEWER, &pp, &Patch::Apply(&binding))
        .await
        .context("binding the viewer ClusterRole")?;
    let kubeconfig = cluster.user_kubeconfig(VIEWER, &[])?;
    let user = cluster.user_client(VIEWER, &[])?;
    wait_for(
        "RBAC to let the viewer list policies",
        Duration::from_secs(30),
        || async {
            gpu_defrag_e2e::operator::policies(&user)
                .list(&ListParams::default().limit(1))
                .await?;
            Ok(Some(()))
        },
    )
    .await?;
    Ok(kubeconfig)
}

/// `kubectl` of the cluster with `dir` first on `PATH` and `KUBECONFIG=kubeconfig`.
struct Kubectl {
    kubectl: PathBuf,
    path: std::ffi::OsString,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn new(cluster: &TestCluster, plugin_dir: &Path, kubeconfig: PathBuf) -> Result<Self> {
        let mut dirs = vec![plugin_dir.to_path_buf()];
        if let Some(p) = std::env::var_os("PATH") {
            dirs.extend(std::env::split_paths(&p));
        }
        Ok(Self {
            kubectl: cluster.kubectl_path(),
            path: std::env::join_paths(dirs)?,
            kubeconfig,
        })
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.kubectl)
            .args(args)
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"))
    }

    /// Runs `kubectl args…`; panics with its output unless it succeeds. Returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\n{stdout}\n{stderr}",
            args.join(" "),
            out.status
        );
        stdout
    }

    fn json(&self, args: &[&str]) -> Value {
        let text = self.ok(args);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("kubectl {}: not JSON ({e}):\n{text}", args.join(" ")))
    }
}

/// `kubectl gpu-defrag status|report|plan`, through kubectl, as a read-only user:
/// the status table and JSON equal what the operator wrote; report and plan read the
/// live cluster with the in-cluster policy, agree with the operator, and change nothing.
#[tokio::test]
async fn kubectl_gpu_defrag_shows_status_report_and_plan() {
    let c = Case::new("plugin", 2, 4).await;
    let (cluster, client, name, pool) =
        (c.cluster, c.client.clone(), c.name().to_string(), &c.pool);
    // Two 4-GPU nodes, two 1-GPU pods on each: a 4-GPU pod fits nowhere.
    fragment(&client, &name, pool, &[2, 2]).await.unwrap();
    c.dry_run_policy(
        json!([{"gpus": 4}]),
        json!({"maxEvictionsPerRun": 10, "maxEvictionsPerNode": 4, "maxEvictionsPerNamespace": 10}),
    )
    .await;
    // A second policy the operator refuses: an unknown time zone (Ready=False, an event).
    let bad = format!("{name}-bad");
    create_policy(
        &client,
        &bad,
        &name,
        json!({
            "mode": "DryRun",
            "nodeSelector": pool.selector(),
            "windows": [{"schedule": "0 2 * * *", "duration": "1h", "timeZone": "Mars/Olympus_Mons"}],
        }),
    )
    .await
    .unwrap();
    let mut op = Operator::start(cluster, &name, &[]).await.unwrap();
    wait_status(&client, &name, "a checked dry-run plan", T, |s| {
        int_at(s, "/plan/totalMoves").unwrap_or(0) > 0
            && int_at(s, "/plan/dryRunCheck/allowed").unwrap_or(0) > 0
    })
    .await
    .unwrap();
    wait_status(&client, &bad, "the invalid policy refused", T, |s| {
        condition_parts(s, "Ready").is_some_and(|c| c.0 == "False")
    })
    .await
    .unwrap();
    op.ensure_running().unwrap();
    op.kill();
    let status = policy_status(&client, &name).await.unwrap();
    let rate = float_at(&status, "/fragmentation/fragmentRate").unwrap();
    let planned = int_at(&status, "/plan/totalMoves").unwrap();
    assert!(rate > 0.0, "{status:#}");
    let before = pod_uids(&client, &name).await.unwrap();

    // The plugin: the same binary under the plugin's name, first on PATH.
    let bin = operator_binary().await.unwrap();
    let dir = cluster.work_dir().join(format!("plugin-bin-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("kubectl-gpu_defrag");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&bin, &link).unwrap();
    let kubectl = Kubectl::new(cluster, &dir, viewer_kubeconfig(cluster).await.unwrap()).unwrap();

    let listed = kubectl.run(&["plugin", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&link.display().to_string()),
        "kubectl plugin list does not show {}:\n{listed}",
        link.display()
    );
    let help = kubectl.ok(&["gpu-defrag", "--help"]);
    assert!(help.contains("Usage: kubectl gpu-defrag"), "{help}");
    for sub in ["report", "plan", "status"] {
        assert!(help.contains(sub), "{sub} missing:\n{help}");
    }

    // status NAME: the row and the details.
    let table = kubectl.ok(&["gpu-defrag", "status", &name]);
    eprintln!("$ kubectl gpu-defrag status {name}\n{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no row for {name}:\n{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], "DryRun", "{table}");
    assert_eq!(cells[2], format!("{rate:.3}"), "{table}");
    assert_eq!(cells[3], planned.to_string(), "{table}");
    assert!(row.contains("Ready"), "{table}");
    for want in [
        format!("rate {rate:.3}:"),
        format!("Plan           {planned} evictions"),
        "server-side dry run of the first evictions".to_string(),
        "Window         none".to_string(),
        "Conditions".to_string(),
        "Reconciled".to_string(),
    ] {
        assert!(table.contains(&want), "{want:?} missing:\n{table}");
    }
    // status: one row per policy (this binary's cluster holds only this one).
    let all = kubectl.ok(&["gpu-defrag", "status"]);
    eprintln!("$ kubectl gpu-defrag status\n{all}");
    assert!(all.starts_with("NAME"), "{all}");
    assert!(
        all.lines().any(|l| l.starts_with(&format!("{name} "))),
        "{all}"
    );
    let bad_row = all
        .lines()
        .find(|l| l.starts_with(&format!("{bad} ")))
        .unwrap_or_else(|| panic!("no row for {bad}:\n{all}"));
    assert!(bad_row.contains("NotReady(InvalidWindow)"), "{all}");
    // The refusal is an event on the policy, in `default` (the policy is cluster-scoped),
    // which `kubectl describe` lists (as the admin: the viewer role does not read events).
    let describe = cluster
        .kubectl()
        .args(["describe", "dfp", &bad])
        .output()
        .unwrap();
    let describe = String::from_utf8_lossy(&describe.stdout);
    assert!(describe.contains("InvalidWindow"), "{describe}");
    let events = cluster
        .kubectl()
        .args([
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("involvedObject.kind=DefragPolicy,involvedObject.name={bad}"),
        ])
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("InvalidWindow"), "{events}");
    // -o json: the raw status, for one policy and for all.
    assert_eq!(
        kubectl.json(&["gpu-defrag", "status", &name, "-o", "json"]),
        status
    );
    let all = kubectl.json(&["gpu-defrag", "status", "-o", "json"]);
    assert_eq!(all[&name], status);
    assert_eq!(all[&bad], policy_status(&client, &bad).await.unwrap());
    // An unknown policy is the user's mistake: exit code 2 and a message.
    let missing = kubectl.run(&["gpu-defrag", "status", "no-such-policy"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("not found"),
        "{missing:?}"
    );

    // report POLICY: the live cluster measured with the policy's scope and shapes.
    let report = kubectl.json(&["gpu-defrag", "report", &name, "-o", "json"]);
    assert_eq!(report["nodesCounted"], json!(2), "{report:#}");
    let live_rate = report["fragmentRate"].as_f64().unwrap();
    assert!((live_rate - rate).abs() < 1e-3, "{live_rate} vs {rate}");
    let table = kubectl.ok(&["gpu-defrag", "report", &name]);
    eprintln!("$ kubectl gpu-defrag report {name}\n{table}");
    assert!(table.contains("GPU use per node"), "{table}");

    // plan POLICY: the operator's plan, computed again from the live cluster; nothing moves.
    let plan = kubectl.json(&["gpu-defrag", "plan", &name, "-o", "json"]);
    assert_eq!(plan["evictions"], json!(planned), "{plan:#}");
    let moves: Vec<&str> = plan["moves"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pod"].as_str())
        .collect();
    let status_moves: Vec<&str> = status["plan"]["moves"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pod"].as_str())
        .collect();
    assert_eq!(moves, status_moves);
    let table = kubectl.ok(&["gpu-defrag", "plan", &name]);
    eprintln!("$ kubectl gpu-defrag plan {name}\n{table}");
    assert!(
        table.contains(&format!("PLAN: {planned} evictions")),
        "{table}"
    );
    // Give an eviction, had there been one, time to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        pod_uids(&client, &name).await.unwrap(),
        before,
        "a pod changed while the plugin ran"
    );
    assert!(pool.fenced(&client).await.unwrap().is_empty());

    // plan --for runs the operator's own served-pod checks: a pending 4-GPU pod that fits
    // nowhere, under a policy without demand runs, is not served, and no move is shown.
    c.pending_pod("wait-4gpu", 4).await;
    let key = format!("{name}/wait-4gpu");
    let preview = kubectl.ok(&["gpu-defrag", "plan", &name, "--for", &key]);
    eprintln!("$ kubectl gpu-defrag plan {name} --for {key}\n{preview}");
    assert!(
        preview.contains("would not be served: demand runs are off in this policy"),
        "{preview}"
    );
    let preview = kubectl.json(&["gpu-defrag", "plan", &name, "--for", &key, "-o", "json"]);
    assert_eq!(preview["outcome"], json!("NotServed"), "{preview:#}");
    assert_eq!(preview["evictions"], json!(0), "{preview:#}");

    delete_policy(&client, &name).await.unwrap();
    delete_policy(&client, &bad).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
