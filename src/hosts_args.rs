//! The SSH options of `--runtime hosts`, shared by `tidemark test` (to run on the hosts) and
//! `tidemark teardown --nodes-file` (to clean them), so both log in the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tidemark_harness::hosts::HostsLogin;
use tidemark_harness::ssh::KnownHosts;

/// How to reach the machines of a nodes file.
#[derive(clap::Args, Debug)]
pub struct HostsArgs {
    /// One host per line, `address[:port]` (for `--runtime hosts`).
    #[arg(long, value_name = "PATH")]
    pub nodes_file: Option<PathBuf>,
    /// SSH user on the hosts.
    #[arg(long, default_value = "root", value_name = "USER")]
    pub ssh_user: String,
    /// SSH private key for the hosts.
    #[arg(long, value_name = "PATH")]
    pub ssh_key: Option<PathBuf>,
    /// Try the SSH agent (SSH_AUTH_SOCK) for the hosts.
    #[arg(long)]
    pub ssh_agent: bool,
    /// Host keys: `accept-new` records unknown hosts in tidemark's own known_hosts file and
    /// refuses changed keys; `strict` accepts only keys already in it, for CI and nightly VM
    /// clusters whose provisioner exports the keys (e.g. `ssh-keyscan` or the cloud's host key
    /// output, written to --known-hosts); `off` accepts any key (throw-away test nodes only).
    #[arg(long, default_value = "accept-new", value_name = "POLICY")]
    pub host_key_checking: String,
    /// tidemark's known_hosts file (default: beside the nodes file, `<nodes-file>.known_hosts`;
    /// ~/.ssh/known_hosts is never written).
    #[arg(long, value_name = "PATH")]
    pub known_hosts: Option<PathBuf>,
}

impl HostsArgs {
    /// The login for the hosts of `nodes_file`, or a message naming the bad option.
    pub fn login(&self, nodes_file: &Path) -> Result<HostsLogin, String> {
        let file = match &self.known_hosts {
            Some(f) => f.clone(),
            None => {
                let mut name = nodes_file.as_os_str().to_owned();
                name.push(".known_hosts");
                PathBuf::from(name)
            }
        };
        // Absolute, so the run's record can log in again from any directory.
        let file = std::path::absolute(&file)
            .map_err(|e| format!("--known-hosts {}: {e}", file.display()))?;
        let known_hosts = match self.host_key_checking.as_str() {
            "strict" => KnownHosts::Strict(file),
            "accept-new" => KnownHosts::AcceptNew(file),
            "off" => KnownHosts::Ignore,
            other => {
                return Err(format!(
                    "--host-key-checking must be strict, accept-new or off, not {other:?}"
                ))
            }
        };
        let key_file = match &self.ssh_key {
            Some(k) => Some(
                std::path::absolute(k).map_err(|e| format!("--ssh-key {}: {e}", k.display()))?,
            ),
            None => None,
        };
        Ok(HostsLogin {
            user: self.ssh_user.clone(),
            key_file,
            use_agent: self.ssh_agent,
            known_hosts,
            timeout: Duration::from_secs(30),
        })
    }
}
