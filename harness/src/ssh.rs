//! Nodes over SSH (VMs, Vagrant boxes, hosts, or an sshd inside a namespace), on libssh2 through
//! the `ssh2` crate. One authenticated session per node; commands run one at a time on it, each
//! in its own channel through `sh -c`. Files move with SCP. A session that broke (a restarted
//! sshd, a dropped link) is replaced when a channel cannot be opened on it — the one moment a
//! retry cannot run anything twice. A command's standard error is read after its standard
//! output, so one that writes more than the SSH window (about 2 MiB) to stderr before it finishes
//! its stdout must redirect it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use ssh2::{CheckResult, KnownHostFileKind, Session};

use crate::dial::Dialer;
use crate::remote::{escape, Output, Remote, RemoteError};

/// What to do with the server's host key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KnownHosts {
    /// The key must be in this known_hosts file.
    Strict(PathBuf),
    /// A host not in the file is added to it; a changed key is refused.
    AcceptNew(PathBuf),
    /// Any key is accepted (throw-away test nodes only).
    Ignore,
}

/// How to reach and log in to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshConfig {
    /// Remote user.
    pub user: String,
    /// Server address and port.
    pub addr: SocketAddr,
    /// Private key file; `None` to use only the agent.
    pub key_file: Option<PathBuf>,
    /// Whether to try the SSH agent (`SSH_AUTH_SOCK`) before the key file.
    pub use_agent: bool,
    /// Host key policy.
    pub known_hosts: KnownHosts,
    /// Connect, handshake and per-operation timeout.
    pub timeout: Duration,
}

/// A node driven over SSH.
pub struct Ssh {
    config: SshConfig,
    dialer: Arc<dyn Dialer>,
    session: Mutex<Session>,
}

/// Connects, checks the host key and authenticates.
fn open_session(config: &SshConfig, dialer: &dyn Dialer) -> Result<Session, RemoteError> {
    let fail = |reason: String| RemoteError::Transport {
        node: format!("ssh {}@{}", config.user, config.addr),
        cmd: "connect".into(),
        reason,
    };
    let tcp = dialer
        .connect(config.addr, config.timeout)
        .map_err(|e| fail(format!("tcp: {e}")))?;
    let mut session = Session::new().map_err(|e| fail(e.to_string()))?;
    session.set_tcp_stream(tcp);
    session.set_timeout(config.timeout.as_millis() as u32);
    session
        .handshake()
        .map_err(|e| fail(format!("handshake: {e}")))?;
    check_host_key(&session, config).map_err(fail)?;
    let mut tried = Vec::new();
    if config.use_agent {
        match session.userauth_agent(&config.user) {
            Ok(()) => {}
            Err(e) => tried.push(format!("agent: {e}")),
        }
    }
    if !session.authenticated() {
        if let Some(key) = &config.key_file {
            if let Err(e) = session.userauth_pubkey_file(&config.user, None, key, None) {
                tried.push(format!("key {}: {e}", key.display()));
            }
        }
    }
    if !session.authenticated() {
        return Err(fail(format!(
            "authentication failed ({})",
            if tried.is_empty() {
                "no agent or key configured".to_string()
            } else {
                tried.join("; ")
            }
        )));
    }
    Ok(session)
}

impl Ssh {
    /// Connects through `dialer`, checks the host key and authenticates.
    pub fn connect(config: SshConfig, dialer: Arc<dyn Dialer>) -> Result<Self, RemoteError> {
        let session = open_session(&config, dialer.as_ref())?;
        Ok(Ssh {
            config,
            dialer,
            session: Mutex::new(session),
        })
    }

    /// Opens something on the session with `open`; if that fails, replaces the session once and
    /// tries again. Nothing has run on the node when `open` fails, so the retry is safe.
    fn reopen<T>(
        &self,
        session: &mut Session,
        what: &str,
        open: impl Fn(&Session) -> Result<T, ssh2::Error>,
    ) -> Result<T, RemoteError> {
        match open(session) {
            Ok(t) => Ok(t),
            Err(first) => {
                *session = open_session(&self.config, self.dialer.as_ref())
                    .map_err(|e| self.err(what, format!("{first}; reconnecting failed: {e}")))?;
                open(session).map_err(|e| self.err(what, e))
            }
        }
    }

    fn err(&self, cmd: &str, e: impl std::fmt::Display) -> RemoteError {
        RemoteError::Transport {
            node: self.describe(),
            cmd: cmd.to_string(),
            reason: e.to_string(),
        }
    }

    fn transfer_err(&self, path: &Path, e: impl std::fmt::Display) -> RemoteError {
        RemoteError::Transfer {
            node: self.describe(),
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    }
}

fn check_host_key(session: &Session, config: &SshConfig) -> Result<(), String> {
    let (file, add_new) = match &config.known_hosts {
        KnownHosts::Ignore => return Ok(()),
        KnownHosts::Strict(f) => (f, false),
        KnownHosts::AcceptNew(f) => (f, true),
    };
    let (key, key_type) = session.host_key().ok_or("server sent no host key")?;
    let mut known = session.known_hosts().map_err(|e| e.to_string())?;
    if file.exists() {
        known
            .read_file(file, KnownHostFileKind::OpenSSH)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
    }
    let host = config.addr.ip().to_string();
    match known.check_port(&host, config.addr.port(), key) {
        CheckResult::Match => Ok(()),
        CheckResult::Mismatch => Err(format!(
            "host key for {} does not match {} (possible man-in-the-middle)",
            config.addr,
            file.display()
        )),
        CheckResult::NotFound if add_new => {
            let name = if config.addr.port() == 22 {
                host
            } else {
                format!("[{host}]:{}", config.addr.port())
            };
            known
                .add(&name, key, "added by tidemark", key_type.into())
                .map_err(|e| e.to_string())?;
            known
                .write_file(file, KnownHostFileKind::OpenSSH)
                .map_err(|e| format!("writing {}: {e}", file.display()))
        }
        CheckResult::NotFound => Err(format!("host {} is not in {}", config.addr, file.display())),
        CheckResult::Failure => Err("checking the host key failed".into()),
    }
}

impl Remote for Ssh {
    fn describe(&self) -> String {
        format!("ssh {}@{}", self.config.user, self.config.addr)
    }

    fn exec(&self, cmd: &str) -> Result<Output, RemoteError> {
        let mut session = self.session.lock().map_err(|e| self.err(cmd, e))?;
        let mut ch = self.reopen(&mut session, cmd, |s| s.channel_session())?;
        // The server hands the line to the user's shell; wrapping it in `sh -c` makes the syntax
        // the same whatever that shell is.
        ch.exec(&format!("sh -c {}", escape(cmd)))
            .map_err(|e| self.err(cmd, e))?;
        let mut stdout = String::new();
        let mut stderr = String::new();
        ch.read_to_string(&mut stdout)
            .map_err(|e| self.err(cmd, e))?;
        ch.stderr()
            .read_to_string(&mut stderr)
            .map_err(|e| self.err(cmd, e))?;
        ch.wait_close().map_err(|e| self.err(cmd, e))?;
        let exit = ch.exit_status().map_err(|e| self.err(cmd, e))?;
        Ok(Output {
            exit,
            stdout,
            stderr,
        })
    }

    fn upload(&self, local: &Path, remote: &Path) -> Result<(), RemoteError> {
        let data = std::fs::read(local).map_err(|e| self.transfer_err(local, e))?;
        let mode = std::fs::metadata(local)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .unwrap_or(0o644);
        let mut session = self
            .session
            .lock()
            .map_err(|e| self.transfer_err(remote, e))?;
        let what = format!("scp to {}", remote.display());
        let mut ch = self.reopen(&mut session, &what, |s| {
            s.scp_send(remote, mode as i32, data.len() as u64, None)
        })?;
        ch.write_all(&data)
            .map_err(|e| self.transfer_err(remote, e))?;
        ch.send_eof().map_err(|e| self.transfer_err(remote, e))?;
        ch.wait_eof().map_err(|e| self.transfer_err(remote, e))?;
        ch.close().map_err(|e| self.transfer_err(remote, e))?;
        ch.wait_close().map_err(|e| self.transfer_err(remote, e))
    }

    fn download(&self, remote: &Path, local: &Path) -> Result<(), RemoteError> {
        let mut session = self
            .session
            .lock()
            .map_err(|e| self.transfer_err(remote, e))?;
        let what = format!("scp from {}", remote.display());
        let (mut ch, stat) = self.reopen(&mut session, &what, |s| s.scp_recv(remote))?;
        let mut data = Vec::with_capacity(stat.size() as usize);
        ch.read_to_end(&mut data)
            .map_err(|e| self.transfer_err(remote, e))?;
        ch.send_eof().map_err(|e| self.transfer_err(remote, e))?;
        ch.wait_eof().map_err(|e| self.transfer_err(remote, e))?;
        ch.close().map_err(|e| self.transfer_err(remote, e))?;
        ch.wait_close().map_err(|e| self.transfer_err(remote, e))?;
        std::fs::write(local, &data).map_err(|e| self.transfer_err(local, e))?;
        std::fs::set_permissions(
            local,
            std::os::unix::fs::PermissionsExt::from_mode(stat.mode() as u32 & 0o777),
        )
        .map_err(|e| self.transfer_err(local, e))
    }
}
