//! `tidemark teardown`: removes what killed runs left behind, found by the records runs keep in
//! one fixed place (never by `TMPDIR`): network namespaces with the bridges, veths, iptables rules
//! and broker processes inside them, and work directories on this machine; and, logging in over
//! SSH as the run did, the brokers, firewall chain and table and run directory on each host of a
//! `--runtime hosts` run; and the containers and network Docker holds with a `--runtime docker`
//! run's label. Runs whose owner is alive are left alone. Namespaces no record owns are
//! removed only with `--force`; so are run directories found on the hosts of `--nodes-file` that
//! no record here knows (another machine may be running them).

use std::collections::BTreeSet;

use tidemark_harness::docker;
use tidemark_harness::hosts::{self, read_nodes_file};
use tidemark_harness::leftovers::{self, Leftover, Resources, RunState};

use crate::hosts_args::HostsArgs;

/// Arguments of `tidemark teardown`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    tidemark teardown --dry-run\n  \
    tidemark teardown\n  \
    tidemark teardown --nodes-file vms.txt --ssh-key ~/.ssh/id_ed25519\n  \
    tidemark teardown --force --run 1a2b3c4d")]
pub struct Args {
    /// Only list what would be removed.
    #[arg(long)]
    dry_run: bool,
    /// Also remove what no record owns: namespaces named like a run's, and with --nodes-file run
    /// directories on the hosts that no run recorded here made.
    #[arg(long)]
    force: bool,
    /// Only this run (its id, as in `tdm-<run>-n1` or test.json's runtime.run).
    #[arg(long, value_name = "ID")]
    run: Option<String>,
    /// Also look for leftovers on the hosts of this nodes file, with the SSH options below.
    #[command(flatten)]
    hosts: Box<HostsArgs>,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    match teardown(&args) {
        Ok(true) => 0,
        Ok(false) => crate::EXIT_HARNESS_FAILED,
        Err(Problem::Usage(msg)) => {
            eprintln!("tidemark teardown: {msg}");
            crate::EXIT_BAD_INPUT
        }
        Err(Problem::Harness(msg)) => {
            eprintln!("tidemark teardown: {msg}");
            crate::EXIT_HARNESS_FAILED
        }
    }
}

enum Problem {
    Usage(String),
    Harness(String),
}

/// What to remove: a run from this machine's records, or one only seen on a host.
enum Target {
    Recorded(Leftover),
    OnHost {
        run: String,
        host: tidemark_harness::ssh::SshConfig,
    },
}

/// Tears down; `Ok(false)` when something could not be removed.
fn teardown(args: &Args) -> Result<bool, Problem> {
    let fail = |e: anyhow::Error| Problem::Harness(format!("{e:#}"));
    let state_dir = leftovers::state_dir().map_err(fail)?;
    let labelled = docker::labelled_runs().map_err(fail)?;
    let mut found = leftovers::find(&state_dir, labelled).map_err(fail)?;
    if let Some(run) = &args.run {
        found.retain(|l| &l.run == run);
    }
    let (known, unknown): (Vec<Leftover>, Vec<Leftover>) =
        found.into_iter().partition(Leftover::owner_known);
    let mut targets: Vec<Target> = known.into_iter().map(Target::Recorded).collect();
    let mut left_alone: Vec<String> = Vec::new();
    let mut listed_all = true;
    for l in unknown {
        if args.force {
            targets.push(Target::Recorded(l));
        } else {
            left_alone.push(l.to_string());
        }
    }
    if let Some(file) = &args.hosts.nodes_file {
        let addrs = read_nodes_file(file)
            .map_err(|e| Problem::Usage(format!("{e:#}")))?
            .hosts();
        let login = args.hosts.login(file).map_err(Problem::Usage)?;
        let recorded: BTreeSet<String> = recorded_runs(&state_dir);
        for addr in addrs {
            let host = login.config(addr);
            let runs = match hosts::runs_on(&host) {
                Ok(r) => r,
                Err(e) => {
                    // The other hosts and the recorded runs are still cleaned.
                    eprintln!("tidemark teardown: listing runs on {addr}: {e:#}");
                    listed_all = false;
                    continue;
                }
            };
            for run in runs {
                // Recorded runs are handled (or, when alive, protected) by their record.
                if recorded.contains(&run) || args.run.as_ref().is_some_and(|r| r != &run) {
                    continue;
                }
                if args.force {
                    targets.push(Target::OnHost {
                        run,
                        host: host.clone(),
                    });
                } else {
                    left_alone.push(format!("run {run}: {} on host {addr}", run_dir(&run)));
                }
            }
        }
    }
    for l in &left_alone {
        eprintln!(
            "tidemark teardown: left alone, no record of its owner (--force removes it): {l}"
        );
    }
    if targets.is_empty() {
        println!("nothing to tear down");
        return Ok(listed_all);
    }
    let mut ok = listed_all;
    for t in targets {
        let what = describe(&t);
        if args.dry_run {
            println!("would remove {what}");
            continue;
        }
        match remove(t, &state_dir) {
            Ok(()) => println!("removed {what}"),
            Err(e) => {
                ok = false;
                eprintln!("tidemark teardown: {what}: {e:#}");
            }
        }
    }
    Ok(ok)
}

fn run_dir(run: &str) -> String {
    hosts::run_dir(run).display().to_string()
}

fn describe(t: &Target) -> String {
    match t {
        Target::Recorded(l) => l.to_string(),
        Target::OnHost { run, host } => {
            format!("run {run}: {} on host {}", run_dir(run), host.addr)
        }
    }
}

/// Every run with a record, alive or not.
fn recorded_runs(state_dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(state_dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_suffix(".json").map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Removes one target; the record goes last, so a failed removal can be retried.
fn remove(t: Target, state_dir: &std::path::Path) -> anyhow::Result<()> {
    match t {
        Target::OnHost { run, host } => hosts::clean(&[host], &hosts::run_dir(&run)),
        Target::Recorded(l) => {
            if !l.namespaces.is_empty() && !leftovers::is_root() {
                anyhow::bail!("removing network namespaces needs root");
            }
            let on_hosts = match l.state.as_ref().map(|s| &s.resources) {
                Some(Resources::Hosts { hosts, run_dir }) => hosts::clean(hosts, run_dir),
                _ => Ok(()),
            };
            let is_docker = l.containers
                || matches!(
                    l.state.as_ref().map(|s| &s.resources),
                    Some(Resources::Docker { .. })
                );
            let in_docker = if is_docker {
                docker::clean(&l.run)
            } else {
                Ok(())
            };
            let here = leftovers::remove(&l.namespaces, l.work_dir());
            on_hosts.and(in_docker).and(here)?;
            match &l.record {
                Some(path) if l.state.is_none() => std::fs::remove_file(path)
                    .map_err(|e| anyhow::anyhow!("removing {}: {e}", path.display())),
                _ => RunState::remove(state_dir, &l.run),
            }
        }
    }
}
