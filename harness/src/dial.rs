//! Opening TCP connections from the harness to nodes. On the netns runtime the nodes are not
//! reachable from the harness's own namespace (which is never given an interface), so sockets are
//! created from a thread that has entered a dedicated client namespace; a socket keeps the
//! namespace it was created in, so the rest of the harness can use it from any thread.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use nix::sched::{setns, CloneFlags};

/// Opens TCP connections to nodes.
///
/// Contract: [`connect`](Dialer::connect) blocks for at most `timeout` and returns a connected,
/// blocking stream with `TCP_NODELAY` set, or the error. It never retries.
pub trait Dialer: Send + Sync {
    /// Connects to `addr`.
    fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream>;
}

/// Connects from the harness's own network namespace (SSH hosts, loopback).
#[derive(Debug, Clone, Default)]
pub struct Direct;

impl Dialer for Direct {
    fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}

/// Connects from inside a named network namespace.
#[derive(Debug, Clone)]
pub struct FromNetns {
    path: PathBuf,
}

impl FromNetns {
    /// Connections will originate in the namespace `name` (from `ip netns add`).
    pub fn new(name: &str) -> Self {
        FromNetns {
            path: PathBuf::from("/run/netns").join(name),
        }
    }
}

impl Dialer for FromNetns {
    fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let path = self.path.clone();
        // setns changes only the calling thread, so a short-lived thread enters the namespace
        // and the harness's own threads stay where they are.
        std::thread::Builder::new()
            .name("tdm-dial".into())
            .spawn(move || {
                let ns = File::open(&path)?;
                setns(&ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                Direct.connect(addr, timeout)
            })?
            .join()
            .map_err(|_| io::Error::other("dialer thread panicked"))?
    }
}

/// Connects asynchronously through a [`Dialer`], returning a tokio stream.
pub async fn connect_async(
    dialer: std::sync::Arc<dyn Dialer>,
    addr: SocketAddr,
    timeout: Duration,
) -> io::Result<tokio::net::TcpStream> {
    let std_stream = tokio::task::spawn_blocking(move || dialer.connect(addr, timeout))
        .await
        .map_err(|e| io::Error::other(e.to_string()))??;
    std_stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(std_stream)
}
