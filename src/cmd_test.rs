//! `tidemark test`.

/// Arguments of `tidemark test`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the subcommand and returns the process exit code.
pub fn run(_args: Args) -> u8 {
    eprintln!("tidemark test: not built yet");
    crate::EXIT_HARNESS_FAILED
}
