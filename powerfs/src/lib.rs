//! tidemark-powerfs: a FUSE filesystem that behaves like a disk behind a volatile page cache, so
//! the power-loss nemesis can drop what a real power cut would.
//!
//! Semantics (like LazyFS, which Jepsen uses for the same purpose):
//! - Writes, truncates, creates, renames and unlinks are visible at once but volatile.
//! - `fsync`/`fdatasync` of a file makes its content durable (not its name).
//! - `fsync` of a directory makes its entries durable: creates, renames and unlinks in it. A new
//!   file survives a power loss only when its directory was fsynced after it was created.
//! - A power loss ([`State::lose_power`], asked for on the control socket) drops everything not
//!   durable, except that the last unsynced write of each durably linked file survives torn: its
//!   first `k` bytes, `k` chosen below its length by a seed the caller gives and records.
//! - A clean unmount makes everything durable, as a clean shutdown flushes the page cache.
//! - A failing disk (asked for on the control socket, until healed) fails every fsync with EIO.
//!   As Linux does after a failed write-back, a failed fsync of a file drops what it would have
//!   made durable without telling reads: the cache keeps showing it, while the disk keeps what it
//!   had there (zeros past its old end) through every later fsync and the clean unmount, unless
//!   the bytes are written again. A program that goes on after a failed fsync and trusts the next
//!   one has a hole in what it believes durable (PostgreSQL's "fsyncgate", 2018).
//! - A full disk (asked for likewise) refuses every write or truncate that would grow a file with
//!   ENOSPC; overwrites in place, shrinking, fsyncs and new names go on working. A nearly full one
//!   has a little room left (what shrinks or is removed frees room again): the write that fills
//!   it is cut short at the last byte that fits, as a real disk's is, and growth past it fails.
//!
//! The backing directory holds exactly the durable state, as plain files and directories: it is
//! read in at mount and changed only at fsync and at power loss, so remounting it after a power
//! loss is the reboot. Content is held in memory too; this is for test-sized data directories.
//! Regular files and directories only (no symlinks, hard links or special files); the backing
//! directory is not itself fsynced, since the power losses this simulates are of the mount, not of
//! the machine.
//!
//! - [`state`]: the volatile tree and its durable shadow (pure apart from the backing writes).
//! - [`fs`]: the FUSE request handlers over it.
//! - [`control`]: the control socket.
//! - [`mount()`] puts them together; the `tidemark-powerfs` binary wraps it and the client.

pub mod control;
pub mod fs;
pub mod state;

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use fuser::{Config, MountOption, SessionACL};

pub use state::{DiskState, Fault, PowerLoss, State, Torn};

/// Mounts `backing` at `mountpoint`, serving the control socket at `control`, and returns when
/// the filesystem is unmounted (by `fusermount3 -u`). After a power loss or an `unmount` asked
/// on the control socket the process unmounts and exits by itself: a copy of the mount in
/// another mount namespace (every `ip netns exec` started after the mount holds one) would keep
/// the session open, and only closing the FUSE device ends it there. The mount goes away by
/// itself if this process dies.
pub fn mount(backing: &Path, mountpoint: &Path, control: &Path) -> anyhow::Result<()> {
    let state = State::load(backing)
        .with_context(|| format!("reading the backing directory {}", backing.display()))?;
    let state = Arc::new(Mutex::new(state));
    let _ = std::fs::remove_file(control);
    let listener = UnixListener::bind(control)
        .with_context(|| format!("binding the control socket {}", control.display()))?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("tidemark-powerfs".into()),
        MountOption::AutoUnmount,
    ];
    config.acl = SessionACL::All;
    let session = fuser::Session::new(fs::PowerFs::new(state.clone()), mountpoint, &config)
        .with_context(|| format!("mounting {}", mountpoint.display()))?;
    // With auto_unmount, fuser leaves unmounting to fusermount3 when the session ends, so the
    // end after a power loss or an unmount request is a lazy unmount, then the exit that closes
    // the device (nothing is left to write back: the state is dead, or durable).
    let target = mountpoint.to_path_buf();
    let socket = control.to_path_buf();
    std::thread::spawn(move || {
        control::serve(listener, state, move || {
            let status = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&target)
                .status();
            if !status.as_ref().is_ok_and(|s| s.success()) {
                eprintln!(
                    "tidemark-powerfs: fusermount3 -u -z {} failed: {status:?}",
                    target.display()
                );
            }
            let _ = std::fs::remove_file(&socket);
            std::process::exit(0);
        })
    });
    session
        .run()
        .with_context(|| format!("serving {}", mountpoint.display()))?;
    let _ = std::fs::remove_file(control);
    Ok(())
}
