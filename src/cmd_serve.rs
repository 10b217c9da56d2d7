//! `tidemark serve`: the results browser over a store (runs newest first, filters, reports,
//! files, tar.gz downloads). It binds to loopback unless told otherwise, since it serves every
//! file of every run to whoever can reach it, and answers only requests whose Host header names
//! it (so a web page cannot reach the store through DNS rebinding); see
//! `tidemark_report::serve::Limits` for its timeouts and bounds.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Arguments of `tidemark serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The store to browse.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
    /// Address to listen on; anything but loopback exposes the store to the network. Requests
    /// must name it (or localhost) in their Host header.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,
}

/// Runs the subcommand (until interrupted) and returns the process exit code.
pub fn run(args: Args) -> u8 {
    if !args.store.is_dir() {
        eprintln!(
            "tidemark serve: {}: no such store directory",
            args.store.display()
        );
        return crate::EXIT_BAD_INPUT;
    }
    if !args.bind.ip().is_loopback() {
        eprintln!(
            "tidemark serve: warning: listening on {}, not loopback: anyone who can reach it can read every run",
            args.bind
        );
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tidemark serve: cannot start the runtime: {e}");
            return crate::EXIT_HARNESS_FAILED;
        }
    };
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.bind).await?;
        println!(
            "serving {} at http://{}/",
            args.store.display(),
            listener.local_addr()?
        );
        tidemark_report::serve::serve(listener, &args.store).await
    });
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tidemark serve: {e:#}");
            crate::EXIT_HARNESS_FAILED
        }
    }
}
