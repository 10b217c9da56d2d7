//! Nodes over SSH (VMs, Vagrant boxes, hosts, or an sshd inside a namespace), on libssh2 through
//! the `ssh2` crate. One authenticated session per node; commands run one at a time on it, each
//! in its own channel through `sh -c`. Files move with SCP; downloads stream to disk and stop at
//! a bound. Host keys are checked against a known_hosts file that tidemark owns (the CLI never
//! points it at `~/.ssh/known_hosts`): new keys are appended under a lock and the file replaced
//! whole. A session that broke (a restarted sshd, a dropped link) is replaced when a channel
//! cannot be opened on it — the one moment a retry cannot run anything twice. A command's standard error is read after its standard
//! output, so one that writes more than the SSH window (about 2 MiB) to stderr before it finishes
//! its stdout must redirect it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
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
    download_limit: u64,
}

/// The largest file [`Ssh`] downloads by default: far above any broker log or segment a run
/// copies back, far below what would fill the harness's disk.
pub const DOWNLOAD_LIMIT: u64 = 4 << 30;

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
            download_limit: DOWNLOAD_LIMIT,
        })
    }

    /// Downloads of files larger than `bytes` fail (naming the file and the bound) instead.
    pub fn with_download_limit(mut self, bytes: u64) -> Self {
        self.download_limit = bytes;
        self
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
    // The file is only ever replaced whole, so readers need no lock; writers take one so two
    // runs adding hosts at once both keep their lines.
    let _lock = if add_new { Some(lock(file)?) } else { None };
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("reading {}: {e}", file.display())),
    };
    let mut known = session.known_hosts().map_err(|e| e.to_string())?;
    for (i, line) in text.lines().enumerate() {
        known
            .read_str(line, KnownHostFileKind::OpenSSH)
            .map_err(|e| format!("{}:{}: unreadable line: {e}", file.display(), i + 1))?;
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
            let added = known
                .hosts()
                .map_err(|e| e.to_string())?
                .into_iter()
                .rev()
                .find(|h| h.name() == Some(name.as_str()))
                .ok_or("the added host key is missing")?;
            let line = known
                .write_string(&added, KnownHostFileKind::OpenSSH)
                .map_err(|e| e.to_string())?;
            // What was there stays byte for byte (comments included); the new line is appended.
            let mut out = text;
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(line.trim_end());
            out.push('\n');
            replace(file, out.as_bytes())
        }
        CheckResult::NotFound => Err(format!("host {} is not in {}", config.addr, file.display())),
        CheckResult::Failure => Err("checking the host key failed".into()),
    }
}

/// Takes the lock of the known_hosts file `file` (an flock on `<file>.lock`, which is never
/// replaced), creating its directory if need be; held until the returned file is dropped.
fn lock(file: &Path) -> Result<Flock<std::fs::File>, String> {
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let mut name = file.as_os_str().to_owned();
    name.push(".lock");
    let path = PathBuf::from(name);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    Flock::lock(f, FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {}: {e}", path.display()))
}

/// Replaces `file` with `data` atomically: written to a temporary file beside it, then renamed.
fn replace(file: &Path, data: &[u8]) -> Result<(), String> {
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(data).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, file));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("writing {}: {e}", file.display())
    })
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
        let too_big = || {
            self.transfer_err(
                remote,
                format!(
                    "larger than the download bound of {} bytes",
                    self.download_limit
                ),
            )
        };
        if stat.size() > self.download_limit {
            return Err(too_big());
        }
        let mut out = std::fs::File::create(local).map_err(|e| self.transfer_err(local, e))?;
        // The file is streamed, and never more than the bound is taken whatever size the
        // remote announced.
        let copied = std::io::copy(&mut (&mut ch).take(self.download_limit + 1), &mut out)
            .map_err(|e| self.transfer_err(remote, e));
        let copied = match copied {
            Ok(n) if n > self.download_limit => Err(too_big()),
            other => other,
        };
        if let Err(e) = copied {
            drop(out);
            let _ = std::fs::remove_file(local);
            return Err(e);
        }
        ch.send_eof().map_err(|e| self.transfer_err(remote, e))?;
        ch.wait_eof().map_err(|e| self.transfer_err(remote, e))?;
        ch.close().map_err(|e| self.transfer_err(remote, e))?;
        ch.wait_close().map_err(|e| self.transfer_err(remote, e))?;
        std::fs::set_permissions(
            local,
            std::os::unix::fs::PermissionsExt::from_mode(stat.mode() as u32 & 0o777),
        )
        .map_err(|e| self.transfer_err(local, e))
    }
}
