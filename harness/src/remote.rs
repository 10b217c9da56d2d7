//! Running commands on nodes. Every node-side action of the engine (starting the broker,
//! applying iptables rules, dumping replicas) goes through [`Remote`], so the same code drives a
//! network namespace on this machine and a VM over SSH.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use thiserror::Error;

/// What a command printed and how it exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit status; -1 when killed by a signal or unknown.
    pub exit: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// A failure to run something on a node.
#[derive(Debug, Error)]
pub enum RemoteError {
    /// The command could not be started or the connection failed.
    #[error("{node}: could not run `{cmd}`: {reason}")]
    Transport {
        /// The node.
        node: String,
        /// The command.
        cmd: String,
        /// Why.
        reason: String,
    },
    /// The command ran and exited non-zero.
    #[error("{node}: `{cmd}` exited {exit}: {stderr}")]
    NonZero {
        /// The node.
        node: String,
        /// The command.
        cmd: String,
        /// Its exit status.
        exit: i32,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// A file transfer failed.
    #[error("{node}: transfer of {path} failed: {reason}")]
    Transfer {
        /// The node.
        node: String,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Runs commands on one node and moves files to and from it.
///
/// Contract:
/// - [`exec`](Remote::exec) runs `cmd` with `sh -c` on the node, as the remote user, in the
///   remote user's home or the node's root, waits for it and returns its output whatever its exit
///   status. It fails only when the command could not be run at all. The caller escapes arguments
///   with [`escape`] or [`command_line`]; the remote adds no quoting of its own.
/// - A command that starts a daemon must redirect its standard streams, or `exec` waits for it.
/// - [`upload`](Remote::upload) and [`download`](Remote::download) copy one regular file and keep
///   its permission bits; the destination's directory must exist. A download may refuse a file
///   above a bound ([`crate::ssh::DOWNLOAD_LIMIT`] over SSH) with an error naming the file and
///   the bound, leaving no partial copy.
/// - Implementations are safe to share between threads; calls may be serialised internally.
pub trait Remote: Send + Sync {
    /// A short description for logs and errors, e.g. `netns tdm-1a2b-n1` or `ssh root@10.0.0.1`.
    fn describe(&self) -> String;

    /// Runs a shell command line and returns its output.
    fn exec(&self, cmd: &str) -> Result<Output, RemoteError>;

    /// Runs a shell command line where mounts it makes are seen by every later command on the
    /// node. That is [`exec`](Remote::exec) except for a node in a network namespace on this
    /// machine: `ip netns exec` gives each command a mount namespace of its own, so a mount made
    /// there would be seen by nothing else; this runs outside it (mounts need no network).
    fn exec_in_host_mounts(&self, cmd: &str) -> Result<Output, RemoteError> {
        self.exec(cmd)
    }

    /// Copies a local file to `remote` on the node.
    fn upload(&self, local: &Path, remote: &Path) -> Result<(), RemoteError>;

    /// Copies the node's file `remote` to `local`.
    fn download(&self, remote: &Path, local: &Path) -> Result<(), RemoteError>;
}

/// [`run`], through [`Remote::exec_in_host_mounts`].
pub fn run_in_host_mounts(remote: &dyn Remote, cmd: &str) -> Result<String, RemoteError> {
    checked(remote, cmd, remote.exec_in_host_mounts(cmd)?)
}

/// Runs `cmd` and returns its trimmed stdout, or a [`RemoteError::NonZero`].
pub fn run(remote: &dyn Remote, cmd: &str) -> Result<String, RemoteError> {
    checked(remote, cmd, remote.exec(cmd)?)
}

fn checked(remote: &dyn Remote, cmd: &str, out: Output) -> Result<String, RemoteError> {
    if out.exit != 0 {
        return Err(RemoteError::NonZero {
            node: remote.describe(),
            cmd: cmd.to_string(),
            exit: out.exit,
            stderr: out.stderr.trim().to_string(),
        });
    }
    Ok(out.stdout.trim_end_matches('\n').to_string())
}

/// Quotes one argument for a POSIX shell. Words made only of characters the shell treats
/// literally are left alone so logged commands stay readable.
pub fn escape(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c));
    if plain {
        return arg.to_string();
    }
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('\'');
    for c in arg.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// Joins arguments into one escaped command line.
pub fn command_line<S: AsRef<str>>(args: &[S]) -> String {
    let mut line = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        let _ = write!(line, "{}", escape(a.as_ref()));
    }
    line
}

/// A node on this machine, optionally inside a network namespace: commands run through
/// `ip netns exec`, files are copied on the shared file system.
#[derive(Debug, Clone)]
pub struct Local {
    netns: Option<String>,
}

impl Local {
    /// Commands run in the harness's own namespace.
    pub fn host() -> Self {
        Local { netns: None }
    }

    /// Commands run inside the named network namespace.
    pub fn in_netns(name: impl Into<String>) -> Self {
        Local {
            netns: Some(name.into()),
        }
    }

    fn command(&self, cmd: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "sh", "-c", cmd]);
                c
            }
            None => {
                let mut c = Command::new("sh");
                c.args(["-c", cmd]);
                c
            }
        }
    }

    /// Copies in a `cp` process, never through a file this process opens for writing: a
    /// thread that forks while such a file is open hands the write descriptor to its child
    /// until that child execs, and starting the copied binary meanwhile fails with "Text file
    /// busy" (ETXTBSY).
    fn copy(&self, from: &Path, to: &Path) -> Result<(), RemoteError> {
        let failed = |reason: String| RemoteError::Transfer {
            node: self.describe(),
            path: format!("{} -> {}", from.display(), to.display()),
            reason,
        };
        let out = Command::new("cp")
            .arg("--preserve=mode")
            .arg("--")
            .arg(from)
            .arg(to)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(e.to_string()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(failed(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ))
        }
    }
}

impl Remote for Local {
    fn describe(&self) -> String {
        match &self.netns {
            Some(ns) => format!("netns {ns}"),
            None => "localhost".to_string(),
        }
    }

    fn exec(&self, cmd: &str) -> Result<Output, RemoteError> {
        self.exec_command(self.command(cmd), cmd)
    }

    fn exec_in_host_mounts(&self, cmd: &str) -> Result<Output, RemoteError> {
        let mut c = Command::new("sh");
        c.args(["-c", cmd]);
        self.exec_command(c, cmd)
    }

    fn upload(&self, local: &Path, remote: &Path) -> Result<(), RemoteError> {
        self.copy(local, remote)
    }

    fn download(&self, remote: &Path, local: &Path) -> Result<(), RemoteError> {
        self.copy(remote, local)
    }
}

impl Local {
    fn exec_command(&self, mut command: Command, cmd: &str) -> Result<Output, RemoteError> {
        let out = command
            .stdin(Stdio::null())
            .output()
            .map_err(|e| RemoteError::Transport {
                node: self.describe(),
                cmd: cmd.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Output {
            exit: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_are_left_alone() {
        assert_eq!(escape("ls"), "ls");
        assert_eq!(escape("/a/b-c_d.e"), "/a/b-c_d.e");
        assert_eq!(escape("--override=node.id=1"), "--override=node.id=1");
        assert_eq!(escape("10.211.0.1:9092,x@y"), "10.211.0.1:9092,x@y");
    }

    #[test]
    fn everything_else_is_single_quoted() {
        assert_eq!(escape(""), "''");
        assert_eq!(escape("a b"), "'a b'");
        assert_eq!(escape("$(rm -rf /)"), "'$(rm -rf /)'");
        assert_eq!(escape("it's"), "'it'\\''s'");
        assert_eq!(escape("a;b|c&d>e"), "'a;b|c&d>e'");
        assert_eq!(escape("*"), "'*'");
    }

    #[test]
    fn escaped_arguments_survive_a_real_shell() {
        let nasty = [
            "plain",
            "",
            "two words",
            "it's",
            "$HOME `id` $(id)",
            "a\nb",
            "\\ \" '",
        ];
        let line = format!("printf '%s\\0' {}", command_line(&nasty));
        let out = run(&Local::host(), &line).unwrap();
        let got: Vec<&str> = out.split('\0').collect();
        assert_eq!(&got[..nasty.len()], &nasty[..]);
    }

    #[test]
    fn nonzero_exit_is_an_error_with_stderr() {
        let err = run(&Local::host(), "echo oops >&2; exit 3").unwrap_err();
        match err {
            RemoteError::NonZero { exit, stderr, .. } => {
                assert_eq!(exit, 3);
                assert_eq!(stderr, "oops");
            }
            other => panic!("unexpected {other}"),
        }
    }
}
