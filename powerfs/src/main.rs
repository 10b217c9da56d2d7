//! `tidemark-powerfs`: mount a power-loss filesystem, or make one lose power.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Parser, Subcommand};
use tidemark_powerfs::control::{self, Reply, Request};

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
    /// Make every fsync of the filesystem behind CONTROL fail with EIO (dropping what it would
    /// have made durable, as Linux does), or with --heal work again; prints the fault's state as
    /// JSON.
    FailFsync {
        /// The mount's control socket.
        #[arg(long)]
        control: PathBuf,
        /// Make fsyncs work again.
        #[arg(long)]
        heal: bool,
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
        Command::FailFsync { control, heal } => {
            match control::call(&control, &Request::Disk { failing: !heal })? {
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
