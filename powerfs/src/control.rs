//! The control socket: one JSON request a connection, one JSON reply. A unix socket (rather than
//! a signal) lets the caller learn what the power loss did, and a shell on a node can reach it
//! through this crate's binary (`tidemark-powerfs lose-power`, `disk`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::state::{DiskState, Fault, PowerLoss, State};

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Drop everything not durable (tearing last writes as `seed` says) and unmount.
    LosePower {
        /// Chooses the tears.
        seed: u64,
    },
    /// Make everything durable, as a clean shutdown flushes the page cache, and unmount.
    Unmount,
    /// Put a disk fault in force, or with `null` make the disk work again.
    Disk {
        /// The fault from now on.
        fault: Option<Fault>,
    },
}

/// The reply to a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reply {
    /// What the power loss did.
    PowerLost(PowerLoss),
    /// Everything was made durable; the filesystem unmounts.
    Unmounted,
    /// The disk as it now stands.
    Disk(DiskState),
    /// The request failed.
    Error(String),
}

/// Serves requests on `listener` until power is lost or an unmount is asked for; then calls
/// `end` (which unmounts).
pub fn serve(listener: UnixListener, state: Arc<Mutex<State>>, end: impl FnOnce()) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut line = String::new();
        if BufReader::new(&conn).read_line(&mut line).is_err() {
            continue;
        }
        let (reply, over) = match serde_json::from_str::<Request>(&line) {
            Ok(Request::LosePower { seed }) => {
                let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                match s.lose_power(seed) {
                    Ok(report) => (Reply::PowerLost(report), true),
                    Err(e) => (Reply::Error(format!("losing power: {e}")), false),
                }
            }
            Ok(Request::Unmount) => {
                let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                match s.sync_all() {
                    Ok(()) => (Reply::Unmounted, true),
                    Err(e) => (Reply::Error(format!("syncing: errno {e}")), false),
                }
            }
            Ok(Request::Disk { fault }) => {
                let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                (Reply::Disk(s.set_fault(fault)), false)
            }
            Err(e) => (Reply::Error(format!("bad request {line:?}: {e}")), false),
        };
        let text = serde_json::to_string(&reply).unwrap_or_default();
        let _ = writeln!(conn, "{text}");
        drop(conn);
        if over {
            end();
            return;
        }
    }
}

/// Sends `request` to the socket at `path` and returns the reply.
pub fn call(path: &Path, request: &Request) -> anyhow::Result<Reply> {
    let mut conn = UnixStream::connect(path)
        .with_context(|| format!("connecting to the control socket {}", path.display()))?;
    writeln!(conn, "{}", serde_json::to_string(request)?)?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .with_context(|| format!("reading the reply on {}", path.display()))?;
    serde_json::from_str(&line).with_context(|| format!("{}: bad reply {line:?}", path.display()))
}
