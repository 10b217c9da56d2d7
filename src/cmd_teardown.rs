//! `tidemark teardown`.

/// Arguments of `tidemark teardown`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the subcommand and returns the process exit code.
pub fn run(_args: Args) -> u8 {
    eprintln!("tidemark teardown: not built yet");
    crate::EXIT_HARNESS_FAILED
}
