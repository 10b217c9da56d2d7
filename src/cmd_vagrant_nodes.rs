//! `tidemark vagrant-nodes`: writes the nodes file of `--runtime hosts` for Vagrant boxes (such
//! as vagrant/Vagrantfile's) from `vagrant ssh-config`, read from a file or stdin or by running
//! vagrant, and says how to log in to them.

use std::io::Read as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;

/// Arguments of `tidemark vagrant-nodes`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    cd vagrant && vagrant up && tidemark vagrant-nodes --output nodes.txt\n  \
    vagrant ssh-config | tidemark vagrant-nodes --ssh-config - --output nodes.txt")]
pub struct Args {
    /// `vagrant ssh-config` output to read (`-` for stdin); default: run `vagrant ssh-config`
    /// in --vagrant-dir.
    #[arg(long, value_name = "PATH")]
    ssh_config: Option<PathBuf>,
    /// Where the Vagrantfile is, when vagrant is run.
    #[arg(long, default_value = ".", value_name = "DIR")]
    vagrant_dir: PathBuf,
    /// The nodes file to write (default: stdout).
    #[arg(long, value_name = "PATH")]
    output: Option<PathBuf>,
}

/// One box of `vagrant ssh-config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VagrantHost {
    /// The machine's name (`Host`).
    pub name: String,
    /// Where SSH reaches it (`HostName`, `Port`).
    pub addr: SocketAddr,
    /// Its login's private key (`IdentityFile`), if given.
    pub identity: Option<PathBuf>,
}

/// Reads `vagrant ssh-config` output (`source` names it in errors): one `Host` block per box
/// with its `HostName` (an IP address) and optional `Port` and `IdentityFile`. A box reached
/// through a port forwarded on this machine (a loopback `HostName`) is refused: brokers need
/// addresses the boxes reach each other at.
pub fn parse_ssh_config(text: &str, source: &str) -> Result<Vec<VagrantHost>, String> {
    struct Block {
        name: String,
        line: usize,
        host: Option<(IpAddr, usize)>,
        port: u16,
        identity: Option<PathBuf>,
    }
    let mut blocks: Vec<Block> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let at = |msg: String| format!("{source}:{n}: {msg}");
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once(|c: char| c.is_whitespace() || c == '=')
            .map(|(k, v)| {
                (
                    k,
                    v.trim_start_matches(|c: char| c.is_whitespace() || c == '='),
                )
            })
            .ok_or_else(|| at(format!("{line:?} has no value")))?;
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        if key.eq_ignore_ascii_case("Host") {
            if value.is_empty() || value.contains(char::is_whitespace) {
                return Err(at(format!("Host {value:?} is not one machine name")));
            }
            blocks.push(Block {
                name: value.to_string(),
                line: n,
                host: None,
                port: 22,
                identity: None,
            });
            continue;
        }
        let Some(block) = blocks.last_mut() else {
            return Err(at(format!("{key} before the first Host line")));
        };
        if key.eq_ignore_ascii_case("HostName") {
            let ip: IpAddr = value.parse().map_err(|_| {
                at(format!(
                    "HostName {value:?} is not an IP address (brokers need addresses)"
                ))
            })?;
            if ip.is_loopback() {
                return Err(at(format!(
                    "HostName {ip} is a port forwarded on this machine, not an address the \
                     boxes reach each other at; give each box a private_network address and set \
                     its ssh.host to it (vagrant/Vagrantfile does)"
                )));
            }
            block.host = Some((ip, n));
        } else if key.eq_ignore_ascii_case("Port") {
            block.port = value
                .parse()
                .map_err(|_| at(format!("Port {value:?} is not a port number")))?;
        } else if key.eq_ignore_ascii_case("IdentityFile") {
            block.identity = Some(PathBuf::from(value));
        }
    }
    if blocks.is_empty() {
        return Err(format!(
            "{source}: no Host lines: is this `vagrant ssh-config` output?"
        ));
    }
    let mut hosts: Vec<VagrantHost> = Vec::new();
    for b in blocks {
        let Some((ip, line)) = b.host else {
            return Err(format!(
                "{source}:{}: Host {} has no HostName",
                b.line, b.name
            ));
        };
        let addr = SocketAddr::new(ip, b.port);
        if let Some(other) = hosts.iter().find(|h| h.addr == addr) {
            return Err(format!(
                "{source}:{line}: Host {} has the address {addr} of Host {} too",
                b.name, other.name
            ));
        }
        hosts.push(VagrantHost {
            name: b.name,
            addr,
            identity: b.identity,
        });
    }
    Ok(hosts)
}

/// The nodes file for `hosts`, one address a line with the box's name as a comment.
pub fn nodes_file(hosts: &[VagrantHost]) -> String {
    let mut out =
        String::from("# Written by `tidemark vagrant-nodes` from `vagrant ssh-config`.\n");
    for h in hosts {
        out.push_str(&format!("{}  # {}\n", h.addr, h.name));
    }
    out
}

/// How to log in: one key for every box, or the agent holding each box's key.
pub fn login_hint(hosts: &[VagrantHost], nodes_file: &str) -> String {
    let mut keys: Vec<&PathBuf> = hosts.iter().filter_map(|h| h.identity.as_ref()).collect();
    keys.sort();
    keys.dedup();
    let base = format!("tidemark test --runtime hosts --nodes-file {nodes_file} --ssh-user root");
    match keys.as_slice() {
        [] => format!("{base} --ssh-agent"),
        [one] => format!("{base} --ssh-key {}", one.display()),
        many => format!(
            "ssh-add {} && {base} --ssh-agent",
            many.iter()
                .map(|k| k.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let (text, source) = match &args.ssh_config {
        Some(p) if p.as_os_str() == "-" => {
            let mut text = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut text) {
                eprintln!("tidemark vagrant-nodes: reading stdin: {e}");
                return crate::EXIT_BAD_INPUT;
            }
            (text, "stdin".to_string())
        }
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => (t, p.display().to_string()),
            Err(e) => {
                eprintln!("tidemark vagrant-nodes: reading {}: {e}", p.display());
                return crate::EXIT_BAD_INPUT;
            }
        },
        None => {
            let out = Command::new("vagrant")
                .arg("ssh-config")
                .current_dir(&args.vagrant_dir)
                .output();
            match out {
                Ok(o) if o.status.success() => (
                    String::from_utf8_lossy(&o.stdout).into_owned(),
                    "vagrant ssh-config".to_string(),
                ),
                Ok(o) => {
                    eprintln!(
                        "tidemark vagrant-nodes: `vagrant ssh-config` in {} failed: {}",
                        args.vagrant_dir.display(),
                        String::from_utf8_lossy(&o.stderr).trim()
                    );
                    return crate::EXIT_HARNESS_FAILED;
                }
                Err(e) => {
                    eprintln!(
                        "tidemark vagrant-nodes: running vagrant: {e} (or pass --ssh-config FILE)"
                    );
                    return crate::EXIT_HARNESS_FAILED;
                }
            }
        }
    };
    let hosts = match parse_ssh_config(&text, &source) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("tidemark vagrant-nodes: {e}");
            return crate::EXIT_BAD_INPUT;
        }
    };
    let file = nodes_file(&hosts);
    let name = match &args.output {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &file) {
                eprintln!("tidemark vagrant-nodes: writing {}: {e}", path.display());
                return crate::EXIT_HARNESS_FAILED;
            }
            path.display().to_string()
        }
        None => {
            print!("{file}");
            "NODES_FILE".to_string()
        }
    };
    eprintln!("run the test with:\n  {}", login_hint(&hosts, &name));
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_BOXES: &str = "Host n1
  HostName 192.168.56.11
  User vagrant
  Port 22
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  PasswordAuthentication no
  IdentityFile /home/me/tidemark/vagrant/.vagrant/machines/n1/virtualbox/private_key
  IdentitiesOnly yes
  LogLevel FATAL

Host n2
  HostName 192.168.56.12
  User vagrant
  Port 2200
  IdentityFile \"/home/me/my boxes/n2/private_key\"
  IdentitiesOnly yes
";

    #[test]
    fn boxes_become_a_nodes_file_with_their_keys() {
        let hosts = parse_ssh_config(TWO_BOXES, "cfg").unwrap();
        assert_eq!(
            hosts,
            vec![
                VagrantHost {
                    name: "n1".into(),
                    addr: "192.168.56.11:22".parse().unwrap(),
                    identity: Some(
                        "/home/me/tidemark/vagrant/.vagrant/machines/n1/virtualbox/private_key"
                            .into()
                    ),
                },
                VagrantHost {
                    name: "n2".into(),
                    addr: "192.168.56.12:2200".parse().unwrap(),
                    identity: Some("/home/me/my boxes/n2/private_key".into()),
                },
            ]
        );
        let file = nodes_file(&hosts);
        assert!(
            file.ends_with("192.168.56.11:22  # n1\n192.168.56.12:2200  # n2\n"),
            "{file}"
        );
        let hint = login_hint(&hosts, "nodes.txt");
        assert!(
            hint.starts_with("ssh-add /home/me/my boxes/n2/private_key "),
            "{hint}"
        );
        assert!(
            hint.ends_with("--nodes-file nodes.txt --ssh-user root --ssh-agent"),
            "{hint}"
        );
        let one = login_hint(&hosts[..1], "f");
        assert!(
            one.ends_with(
                "--ssh-key /home/me/tidemark/vagrant/.vagrant/machines/n1/virtualbox/private_key"
            ),
            "{one}"
        );
    }

    #[test]
    fn the_nodes_file_it_writes_is_one_the_hosts_runtime_reads() {
        let hosts = parse_ssh_config(TWO_BOXES, "cfg").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nodes.txt");
        std::fs::write(&path, nodes_file(&hosts)).unwrap();
        let read = tidemark_harness::hosts::read_nodes_file(&path).unwrap();
        assert_eq!(
            read.hosts(),
            hosts.iter().map(|h| h.addr).collect::<Vec<_>>()
        );
    }

    #[test]
    fn errors_name_the_line() {
        let bad = |text: &str, want: &str| {
            let err = parse_ssh_config(text, "cfg").unwrap_err();
            assert!(
                err.starts_with(want),
                "{err:?} does not start with {want:?}"
            );
        };
        bad(
            "Host n1\n  HostName 127.0.0.1\n  Port 2222\n",
            "cfg:2: HostName 127.0.0.1 is a port forwarded on this machine",
        );
        bad(
            "Host n1\n  HostName box.example\n",
            "cfg:2: HostName \"box.example\" is not an IP",
        );
        bad(
            "Host n1\n  HostName 10.0.0.1\n  Port ssh\n",
            "cfg:3: Port \"ssh\" is not a port",
        );
        bad(
            "  HostName 10.0.0.1\n",
            "cfg:1: HostName before the first Host line",
        );
        bad(
            "Host n1\n  User vagrant\nHost n2\n  HostName 10.0.0.2\n",
            "cfg:1: Host n1 has no HostName",
        );
        bad(
            "Host n1\n  HostName 10.0.0.1\nHost n2\n  HostName 10.0.0.1\n",
            "cfg:4: Host n2 has the address 10.0.0.1:22 of Host n1 too",
        );
        bad("", "cfg: no Host lines");
        bad("Host\n", "cfg:1: \"Host\" has no value");
    }
}
