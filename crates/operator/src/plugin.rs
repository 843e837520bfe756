//! `kubectl gpu-defrag`: the same binary, installed (or linked) as `kubectl-gpu_defrag`
//! somewhere on `PATH`, is found by kubectl as a plugin. Invoked under that name it
//! presents itself as `kubectl gpu-defrag` and offers the read-only commands (`report`,
//! `plan`, `status`); the operator's own commands stay available but hidden.
use std::ffi::OsString;
use std::path::Path;

use clap::{CommandFactory, FromArgMatches};

/// File name kubectl looks for on `PATH` to run `kubectl gpu-defrag`.
pub const PLUGIN_FILE: &str = "kubectl-gpu_defrag";
/// How the plugin is invoked.
pub const PLUGIN_NAME: &str = "kubectl gpu-defrag";
/// Commands of the binary that are not part of the plugin.
const HIDDEN_IN_PLUGIN: &[&str] = &["run", "crd"];

/// Whether `argv0` names the plugin (`kubectl-gpu_defrag`, with or without a directory
/// or an `.exe` suffix).
pub fn is_plugin(argv0: Option<&OsString>) -> bool {
    argv0
        .and_then(|a| Path::new(a).file_name())
        .and_then(|f| f.to_str())
        .is_some_and(|f| f.strip_suffix(".exe").unwrap_or(f) == PLUGIN_FILE)
}

/// The command line for `T`, as the plugin when `plugin` is set.
pub fn command<T: CommandFactory>(plugin: bool) -> clap::Command {
    let cmd = T::command();
    if !plugin {
        return cmd;
    }
    let mut cmd = cmd
        .name(PLUGIN_NAME)
        .bin_name(PLUGIN_NAME)
        .display_name(PLUGIN_NAME)
        .about(
            "GPU defragmentation for Kubernetes, as a kubectl plugin: measure fragmentation, \
             preview the migration plan and read DefragPolicy status in the cluster of the \
             current kubeconfig context. Read-only: it never evicts or changes anything.",
        );
    for name in HIDDEN_IN_PLUGIN {
        cmd = cmd.mut_subcommand(*name, |s| s.hide(true));
    }
    cmd
}

/// Parses the process arguments into `T`, as the plugin when invoked under its name.
pub fn parse<T: CommandFactory + FromArgMatches>() -> T {
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut cmd = command::<T>(is_plugin(args.first()));
    let matches = cmd.clone().get_matches_from(args);
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_plugin_name() {
        for (argv0, want) in [
            ("kubectl-gpu_defrag", true),
            ("/usr/local/bin/kubectl-gpu_defrag", true),
            ("kubectl-gpu_defrag.exe", true),
            ("gpu-defrag", false),
            ("/home/u/.local/bin/gpu-defrag", false),
            ("kubectl-gpu-defrag", false),
        ] {
            assert_eq!(is_plugin(Some(&OsString::from(argv0))), want, "{argv0}");
        }
        assert!(!is_plugin(None));
    }

    #[test]
    fn plugin_help_presents_itself_as_kubectl_gpu_defrag() {
        let mut cmd = command::<crate::cli::Cli>(true);
        cmd.build();
        let help = cmd.render_help().to_string();
        assert!(help.contains("Usage: kubectl gpu-defrag"), "{help}");
        for sub in ["report", "plan", "status"] {
            assert!(help.contains(sub), "{sub} missing from\n{help}");
        }
        assert!(!help.contains("\n  run "), "{help}");
        assert!(!help.contains("\n  crd "), "{help}");
        let mut status = cmd
            .find_subcommand_mut("status")
            .expect("status subcommand")
            .clone();
        let help = status.render_help().to_string();
        assert!(help.contains("Usage: kubectl gpu-defrag status"), "{help}");
    }

    #[test]
    fn binary_help_is_unchanged() {
        let mut cmd = command::<crate::cli::Cli>(false);
        let help = cmd.render_help().to_string();
        assert!(help.contains("\n  run "), "{help}");
        assert!(!help.contains("kubectl gpu-defrag"), "{help}");
    }
}
