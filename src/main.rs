//! The `tidemark` command line: a thin layer that parses arguments and hands each subcommand to
//! the crate that does the work. Exit codes follow Jepsen: 0 valid, 1 invalid, 2 unknown,
//! 254 bad input or usage, 255 the harness itself failed.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd_bench;
mod cmd_bench_start;
mod cmd_check;
mod cmd_image;
mod cmd_nightly;
mod cmd_replay;
mod cmd_report;
mod cmd_serve;
mod cmd_shrink;
mod cmd_teardown;
mod cmd_test;
mod cmd_vagrant_nodes;
mod evidence;
mod hosts_args;
mod nightly;
mod rerun;

/// Exit code for bad input or usage.
pub const EXIT_BAD_INPUT: u8 = 254;
/// Exit code when the harness itself failed.
pub const EXIT_HARNESS_FAILED: u8 = 255;

#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Jepsen-style tests for Kafka-protocol brokers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a test: deploy brokers to fresh nodes, drive a workload under faults, check, report.
    Test(Box<cmd_test::Args>),
    /// Check a recorded run (a run directory or a history.jsonl) and write results.json.
    Check(cmd_check::Args),
    /// Remove what killed runs left behind, here and on SSH hosts: namespaces, rules, processes.
    Teardown(cmd_teardown::Args),
    /// Run a recorded test again on fresh clusters (same seed, broker build, faults at their
    /// recorded times on the nodes they hit) and say whether its anomalies come back.
    Replay(cmd_replay::Args),
    /// Find the smallest run that still shows an invalid run's anomaly: fewer and shorter
    /// faults, a shorter time limit, less load; writes it as a run of its own.
    Shrink(cmd_shrink::Args),
    /// Render report.html for a run directory.
    Report(cmd_report::Args),
    /// Browse the store's runs, reports and files over HTTP (loopback by default).
    Serve(cmd_serve::Args),
    /// Measure detection: every injectable one-cluster bug over several seeds, and the correct
    /// broker, under the default faults; prints caught runs, time to first anomaly, false alarms.
    BenchDetection(cmd_bench::Args),
    /// Measure a 3-node cluster of the docker runtime from `docker run` to its first
    /// acknowledged write (the image made by `tidemark image build`).
    BenchDockerStart(cmd_bench_start::Args),
    /// Run a matrix of tests (workloads × nemesis sets × seeds × injected bugs × runtimes) one
    /// after another within a budget; write an index page, JUnit XML and the trend across nights.
    Nightly(cmd_nightly::Args),
    /// Make the node image of `--runtime docker` and docker/compose.yaml locally, no registry.
    Image(cmd_image::Args),
    /// Write the nodes file of `--runtime hosts` for Vagrant boxes from `vagrant ssh-config`.
    VagrantNodes(cmd_vagrant_nodes::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(EXIT_BAD_INPUT),
            };
        }
    };
    let code = match cli.command {
        Command::Test(args) => cmd_test::run(*args),
        Command::Check(args) => cmd_check::run(args),
        Command::Teardown(args) => cmd_teardown::run(args),
        Command::Replay(args) => cmd_replay::run(args),
        Command::Shrink(args) => cmd_shrink::run(args),
        Command::Report(args) => cmd_report::run(args),
        Command::Serve(args) => cmd_serve::run(args),
        Command::BenchDetection(args) => cmd_bench::run(args),
        Command::BenchDockerStart(args) => cmd_bench_start::run(args),
        Command::Nightly(args) => cmd_nightly::run(args),
        Command::Image(args) => cmd_image::run(args),
        Command::VagrantNodes(args) => cmd_vagrant_nodes::run(args),
    };
    ExitCode::from(code)
}
