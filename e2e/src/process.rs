//! Component processes: each runs in its own process group, logs to a file, and is killed
//! by group (SIGTERM, then SIGKILL).
//!
//! A test binary keeps its stack in a `static`, which is never dropped. So that the stack
//! still dies with the binary, every stack has a *reaper*: a tiny `sh` in its own process
//! group that reads the component group ids from a pipe. The pipe's write end lives only in
//! the test process; when that process exits for any reason (even SIGKILL) the reaper reads
//! EOF and kills every group it was told about. An orderly [`Reaper::finish`] tells it the
//! groups are already gone.

use std::{
    fs::{self, File},
    io::Write,
    net::TcpListener,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// A free loopback TCP port (bound on 127.0.0.1:0, then released).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener
        .local_addr()
        .context("reading the bound port")?
        .port())
}

/// One running component.
#[derive(Debug)]
pub struct Component {
    /// Short name (`etcd`, `kube-apiserver`, …).
    pub name: String,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    child: Option<Child>,
    /// Process id, which is also its process group id.
    pub pgid: u32,
}

impl Component {
    /// Starts `bin args…` in a new process group, stdout/stderr appended to `log`.
    pub fn spawn(
        name: &str,
        bin: &Path,
        args: &[String],
        envs: &[(&str, &Path)],
        log: &Path,
    ) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone().context("cloning a log handle")?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", bin.display()))?;
        Ok(Self {
            name: name.to_string(),
            log: log.to_path_buf(),
            pgid: child.id(),
            child: Some(child),
        })
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// Fails with the log's tail if the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self.exited() {
            bail!(
                "{} exited ({status}); last log lines of {}:\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// Whether its log says the port was taken (worth a retry on other ports).
    pub fn port_clash(&self) -> bool {
        fs::read_to_string(&self.log)
            .map(|s| s.contains("address already in use"))
            .unwrap_or(false)
    }

    /// Forgets the child handle: the process keeps running after this process exits.
    pub fn detach(&mut self) {
        self.child = None;
    }

    /// SIGTERM to the group, up to `grace` to exit, then SIGKILL; reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            // The leader is gone; stray group members may remain.
            signal_group(self.pgid, "KILL");
            self.child = None;
            return;
        }
        signal_group(self.pgid, "TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(self.pgid, "KILL");
        let _ = child.wait();
        self.child = None;
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Sends `SIG<sig>` to process group `pgid` through `kill(1)` (no `unsafe`, no libc).
pub fn signal_group(pgid: u32, sig: &str) -> bool {
    if pgid <= 1 {
        return false;
    }
    Command::new("kill")
        .args([format!("-{sig}"), "--".to_string(), format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether any process of group `pgid` is alive (zombies aside).
pub fn group_alive(pgid: u32) -> bool {
    let Ok(entries) = fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid pgrp …; comm may contain spaces, so split after ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string()
    })
}

/// Kills process group `pgid` (TERM, up to `grace`, then KILL) when it is not a child of
/// this process (e.g. the detached `cluster-up` stack).
pub fn kill_group(pgid: u32, grace: Duration) {
    if !group_alive(pgid) {
        return;
    }
    signal_group(pgid, "TERM");
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && group_alive(pgid) {
        std::thread::sleep(Duration::from_millis(100));
    }
    if group_alive(pgid) {
        signal_group(pgid, "KILL");
    }
}

/// The last `n` lines of a log file.
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(text) = fs::read_to_string(path) else {
        return String::from("(no log)");
    };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The reaper script. Lines on stdin: a number adds a process group, `-<number>` removes
/// one (stopped already); `done` means the
/// groups were stopped in order. On EOF without `done` it kills every group. Then it removes
/// the work dir, or only its etcd data if the dir holds a `keep` file.
const REAPER: &str = r#"
trap '' INT TERM HUP PIPE
dir="$1"; groups=""; done=0
while IFS= read -r line; do
  case "$line" in
    done) done=1 ;;
    -*) g=${line#-}; kept=""
        for x in $groups; do [ "$x" = "$g" ] || kept="$kept $x"; done
        groups="$kept" ;;
    *[!0-9]*|'') ;;
    *) groups="$groups $line" ;;
  esac
done
if [ "$done" = 0 ]; then
  for g in $groups; do kill -TERM "-$g" 2>/dev/null; done
  i=0
  while [ $i -lt 50 ]; do
    alive=0
    for g in $groups; do kill -0 "-$g" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1; i=$((i+1))
  done
  for g in $groups; do kill -KILL "-$g" 2>/dev/null; done
fi
if [ -n "$dir" ]; then
  if [ -e "$dir/keep" ]; then rm -rf "$dir/etcd"; else rm -rf "$dir"; fi
fi
"#;

/// Kills a stack's process groups when the owning process exits; see the module docs.
#[derive(Debug)]
pub struct Reaper {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Reaper {
    /// Starts a reaper that, once it is done, removes `dir` unless `dir/keep` exists.
    pub fn start(dir: &Path) -> Result<Self> {
        let mut child = Command::new("sh")
            .args(["-c", REAPER, "gpu-defrag-reaper"])
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("starting the reaper (sh)")?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    /// Registers a process group to kill if this process dies.
    pub fn watch(&mut self, pgid: u32) -> Result<()> {
        let stdin = self.stdin.as_mut().context("the reaper is finished")?;
        writeln!(stdin, "{pgid}").context("writing to the reaper")?;
        stdin.flush().context("writing to the reaper")
    }

    /// Unregisters a process group that was stopped already.
    pub fn unwatch(&mut self, pgid: u32) -> Result<()> {
        let stdin = self.stdin.as_mut().context("the reaper is finished")?;
        writeln!(stdin, "-{pgid}").context("writing to the reaper")?;
        stdin.flush().context("writing to the reaper")
    }

    /// The groups were stopped in order: let the reaper only clean up the dir, and wait.
    pub fn finish(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "done");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.finish();
    }
}
