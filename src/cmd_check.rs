//! `tidemark check`.

/// Arguments of `tidemark check`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the subcommand and returns the process exit code.
pub fn run(_args: Args) -> u8 {
    eprintln!("tidemark check: not built yet");
    crate::EXIT_HARNESS_FAILED
}
