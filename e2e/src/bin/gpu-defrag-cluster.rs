//! `gpu-defrag-cluster up|down|status`: a persistent local control plane for people
//! (`make cluster-up` / `make cluster-down`), built on the e2e harness.
//!
//! State lives in one dir (default `.cluster/` at the repository root):
//! `kubeconfig`, `bin/kubectl`, `logs/<component>.log`, `pids` (`<name> <process group>`
//! per line), plus the PKI and etcd data. `up` detaches the processes; `down` kills the
//! recorded process groups.
#![forbid(unsafe_code)]

use std::{
    fs,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use gpu_defrag_e2e::{
    ClusterOptions, GPU_PRODUCT_LABEL, GPU_RESOURCE, TestCluster, cluster::component_binary,
    process::kill_group, repo_root,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, Config, api::ListParams, config::KubeConfigOptions, config::Kubeconfig};

const USAGE: &str =
    "usage: gpu-defrag-cluster <up|down|status> [--dir DIR] [--nodes N] [--gpus N] [--model MODEL]

  up      start etcd, kube-apiserver, kube-controller-manager, kube-scheduler and gpu-binpack
          and kwok with N fake GPU nodes; harmless if the cluster already runs
  down    stop the processes recorded in DIR/pids
  status  show whether the cluster runs, and its nodes

  --dir DIR      state dir (default: <repo>/.cluster)
  --nodes N      number of kwok GPU nodes (default 8)
  --gpus N       nvidia.com/gpu per node (default 8)
  --model MODEL  nvidia.com/gpu.product label (default NVIDIA-A100-SXM4-80GB)";

struct Args {
    cmd: String,
    dir: PathBuf,
    nodes: usize,
    gpus: u32,
    model: String,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().unwrap_or_default();
    let defaults = ClusterOptions::default();
    let mut args = Args {
        cmd,
        dir: repo_root().join(".cluster"),
        nodes: defaults.nodes,
        gpus: defaults.gpus_per_node,
        model: defaults.gpu_model,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => args.dir = PathBuf::from(value()?),
            "--nodes" => args.nodes = value()?.parse().context("--nodes")?,
            "--gpus" => args.gpus = value()?.parse().context("--gpus")?,
            "--model" => args.model = value()?,
            other => bail!("unknown argument {other}"),
        }
    }
    if args.model.is_empty() {
        bail!("--model must not be empty");
    }
    Ok(args)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let result = match parse_args() {
        Ok(args) => match args.cmd.as_str() {
            "up" => up(&args).await,
            "down" => down(&args.dir),
            "status" => status(&args.dir).await.map(|_| ()),
            _ => Err(anyhow::anyhow!("{USAGE}")),
        },
        Err(e) => Err(e.context(USAGE)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu-defrag-cluster: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `(name, process group)` from `dir/pids`.
fn read_pids(dir: &Path) -> Vec<(String, u32)> {
    fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, pid) = l.split_once(' ')?;
            Some((name.to_string(), pid.trim().parse().ok()?))
        })
        .collect()
}

/// Whether process `pid` runs the binary of component `name` (guards against a reused pid).
fn is_ours(name: &str, pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|raw| {
            let argv0 = raw.split(|b| *b == 0).next()?.to_vec();
            Some(String::from_utf8_lossy(&argv0).ends_with(&format!("/{}", component_binary(name))))
        })
        .unwrap_or(false)
}

async fn client_from(dir: &Path) -> Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(dir.join("kubeconfig")).context("reading the kubeconfig")?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading the kubeconfig")?;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(10));
    Client::try_from(config).context("building a client")
}

async fn nodes(client: &Client) -> Result<Vec<Node>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?
        .items)
}

/// Prints the running cluster; `Ok(false)` if it does not run.
async fn status(dir: &Path) -> Result<bool> {
    let pids = read_pids(dir);
    if pids.is_empty() {
        println!("no local cluster recorded in {}", dir.display());
        return Ok(false);
    }
    let mut all_up = true;
    for (name, pid) in &pids {
        let up = is_ours(name, *pid);
        all_up &= up;
        println!(
            "{name:<24} pid {pid:<8} {}",
            if up { "running" } else { "NOT RUNNING" }
        );
    }
    if !all_up {
        println!("the cluster is partly down; run `make cluster-down` then `make cluster-up`");
        return Ok(false);
    }
    let client = client_from(dir).await?;
    let nodes = nodes(&client).await?;
    print_usage(dir, &nodes);
    Ok(true)
}

fn print_usage(dir: &Path, nodes: &[Node]) {
    println!("\nnodes ({}):", nodes.len());
    for n in nodes {
        let name = n.metadata.name.as_deref().unwrap_or("?");
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let gpus = n
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(GPU_RESOURCE))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "0".into());
        let model = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(GPU_PRODUCT_LABEL))
            .cloned()
            .unwrap_or_default();
        println!(
            "  {name:<16} {:<9} {GPU_RESOURCE}={gpus:<3} {model}",
            if ready { "Ready" } else { "NotReady" }
        );
    }
    println!(
        "\nuse it:\n  export KUBECONFIG={0}/kubeconfig\n  export PATH={0}/bin:$PATH\n  kubectl get nodes\n\nlogs: {0}/logs/   stop: make cluster-down",
        dir.display()
    );
}

async fn up(args: &Args) -> Result<()> {
    let dir = &args.dir;
    if !read_pids(dir).is_empty() {
        if status(dir).await.unwrap_or(false) {
            println!("\nthe local cluster already runs (nothing started)");
            return Ok(());
        }
        println!("cleaning up the previous, partly stopped cluster");
        down(dir)?;
    }
    // Fresh state: a new PKI, new ports, an empty etcd.
    if dir.exists() {
        for entry in fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
        {
            let path = entry.path();
            let res = if path.is_dir() && !path.is_symlink() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            res.with_context(|| format!("removing {}", path.display()))?;
        }
    }
    println!(
        "starting the local control plane in {} ({} nodes × {} GPUs, {})",
        dir.display(),
        args.nodes,
        args.gpus,
        args.model
    );
    let opts = ClusterOptions {
        work_dir: Some(dir.clone()),
        nodes: args.nodes,
        gpus_per_node: args.gpus,
        gpu_model: args.model.clone(),
        detached: true,
        ..ClusterOptions::default()
    };
    let cluster = TestCluster::start(opts).await?;
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    std::os::unix::fs::symlink(cluster.kubectl_path(), bin.join("kubectl"))
        .context("linking kubectl")?;
    // etcd → apiserver → … in start order; `down` stops them in reverse.
    let pids: String = cluster
        .components()
        .iter()
        .map(|(name, pgid, _)| format!("{name} {pgid}\n"))
        .collect();
    fs::write(dir.join("pids"), pids).context("writing the pid file")?;
    let client = cluster.client()?;
    let started_in = cluster.started_in();
    let _ = cluster.detach();
    println!("started in {:.1}s", started_in.as_secs_f64());
    let nodes = nodes(&client).await?;
    print_usage(dir, &nodes);
    Ok(())
}

fn down(dir: &Path) -> Result<()> {
    let pids = read_pids(dir);
    if pids.is_empty() {
        println!("no local cluster recorded in {}", dir.display());
        return Ok(());
    }
    for (name, pid) in pids.iter().rev() {
        if is_ours(name, *pid) {
            println!("stopping {name} (process group {pid})");
            kill_group(*pid, Duration::from_secs(10));
        }
    }
    fs::remove_file(dir.join("pids")).context("removing the pid file")?;
    let _ = fs::remove_dir_all(dir.join("etcd"));
    println!("stopped; logs remain in {}/logs", dir.display());
    Ok(())
}
