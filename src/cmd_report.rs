//! `tidemark report`: renders (or renders again) `report.html` for a recorded run, e.g. after
//! re-checking it or upgrading tidemark. Exits 0 when written, 254 when the directory is not a
//! run, 255 when rendering or writing failed.

use std::path::PathBuf;

/// Arguments of `tidemark report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A run directory (store/<test>/<time>, or a `latest` link to one).
    pub dir: PathBuf,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    if !args.dir.join("history.jsonl").is_file() {
        eprintln!(
            "tidemark report: {}: no history.jsonl: not a run directory",
            args.dir.display()
        );
        return crate::EXIT_BAD_INPUT;
    }
    match tidemark_report::write_report(&args.dir) {
        Ok(path) => {
            println!("{}", path.display());
            0
        }
        Err(e) => {
            eprintln!("tidemark report: {e:#}");
            crate::EXIT_HARNESS_FAILED
        }
    }
}
