//! `tidemark teardown`: removes what killed runs left behind — their network namespaces (with
//! the bridges, veths and iptables rules inside them), the broker processes running in those
//! namespaces, and their work directories. Runs whose harness is still alive are left alone.

use tidemark_harness::leftovers;

/// Arguments of `tidemark teardown`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only list what would be removed.
    #[arg(long)]
    dry_run: bool,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let work_root = std::env::temp_dir().join("tidemark");
    let found = match leftovers::find(&work_root) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tidemark teardown: {e:#}");
            return crate::EXIT_HARNESS_FAILED;
        }
    };
    if found.is_empty() {
        println!("nothing to tear down");
        return 0;
    }
    if !args.dry_run && !leftovers::is_root() {
        eprintln!("tidemark teardown: removing network namespaces needs root");
        return crate::EXIT_HARNESS_FAILED;
    }
    let mut failed = false;
    for l in &found {
        if args.dry_run {
            println!("would remove {l}");
            continue;
        }
        match leftovers::remove(&l.namespaces, l.work_dir.as_deref()) {
            Ok(()) => println!("removed {l}"),
            Err(e) => {
                failed = true;
                eprintln!("tidemark teardown: {l}: {e:#}");
            }
        }
    }
    if failed {
        crate::EXIT_HARNESS_FAILED
    } else {
        0
    }
}
