//! `tidemark-powerfs`: mount a power-loss filesystem, or make one lose power.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Parser, Subcommand};
use tidemark_powerfs::control::{self, Reply, Request};
use tidemark_powerfs::Fault;

#[derive(Parser)]
#[command(
    version,
    about = "A FUSE filesystem that keeps writes in memory until fsync"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount BACKING at MOUNTPOINT and serve it until unmounted (runs in the foreground).
    Mount {
        /// The directory holding the durable state.
        #[arg(long)]
        backing: PathBuf,
        /// Where to mount.
        #[arg(long)]
        mountpoint: PathBuf,
        /// The control socket to create.
        #[arg(long)]
        control: PathBuf,
    },
    /// Make everything behind CONTROL durable, as a clean shutdown does, and unmount it.
    Unmount {
        /// The mount's control socket.
        #[arg(long)]
        control: PathBuf,
    },
    /// Make the filesystem behind CONTROL lose power; prints what was dropped as JSON.
    LosePower {
        /// The mount's control socket.
        #[arg(long)]
        control: PathBuf,
        /// Chooses where the last unsynced writes tear.
        #[arg(long)]
        seed: u64,
    },
    /// Make the disk behind CONTROL fail: `--fault fail-fsync` (every fsync fails with EIO,
    /// dropping what it would have made durable, as Linux's do), `--fault full` (every write
    /// that would grow a file fails with ENOSPC) or `--fault nearly-full` (4 KiB of room left:
    /// the write that fills it is cut short, later growth fails with ENOSPC); without --fault it
    /// works again. Prints the disk's state as JSON.
    Disk {
        /// The mount's control socket.
        #[arg(long)]
        control: PathBuf,
        /// The fault: fail-fsync, full or nearly-full.
        #[arg(long, value_parser = ["fail-fsync", "full", "nearly-full"])]
        fault: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Mount {
            backing,
            mountpoint,
            control,
        } => tidemark_powerfs::mount(&backing, &mountpoint, &control),
        Command::Unmount { control } => match control::call(&control, &Request::Unmount)? {
            Reply::Unmounted => Ok(()),
            Reply::Error(e) => bail!("{}: {e}", control.display()),
            _ => bail!("{}: unexpected reply", control.display()),
        },
        Command::LosePower { control, seed } => {
            match control::call(&control, &Request::LosePower { seed })? {
                Reply::PowerLost(report) => {
                    println!("{}", serde_json::to_string(&report)?);
                    Ok(())
                }
                Reply::Error(e) => bail!("{}: {e}", control.display()),
                _ => bail!("{}: unexpected reply", control.display()),
            }
        }
        Command::Disk { control, fault } => {
            let fault = match fault.as_deref() {
                Some("fail-fsync") => Some(Fault::FailFsync),
                Some("nearly-full") => Some(Fault::NearlyFull),
                Some(_) => Some(Fault::Full),
                None => None,
            };
            match control::call(&control, &Request::Disk { fault })? {
                Reply::Disk(fault) => {
                    println!("{}", serde_json::to_string(&fault)?);
                    Ok(())
                }
                Reply::Error(e) => bail!("{}: {e}", control.display()),
                _ => bail!("{}: unexpected reply", control.display()),
            }
        }
    }
}
