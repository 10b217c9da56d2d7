//! An OpenSSH server inside a node's network namespace, for the tests that drive nodes over
//! SSH exactly as on VMs.

use std::path::Path;
use std::process::Command;

use tidemark_harness::remote;
use tidemark_harness::runtime::Node;

/// Makes an ed25519 key pair at `path` and `path.pub`.
pub fn keygen(path: &Path) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ssh-keygen failed");
}

/// Starts sshd inside `node`'s namespace, listening on the node's address port 22, with its
/// files in `dir` and `client_pub` as the one authorized key.
pub fn start_sshd(node: &Node, dir: &Path, client_pub: &Path) {
    keygen(&dir.join("hostkey"));
    std::fs::copy(client_pub, dir.join("authorized_keys")).unwrap();
    let config = format!(
        "Port 22\nListenAddress {ip}\nHostKey {d}/hostkey\nPidFile {d}/sshd.pid\n\
         AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\n\
         StrictModes no\n",
        ip = node.ip,
        d = dir.display()
    );
    std::fs::write(dir.join("sshd_config"), config).unwrap();
    run_sshd(node, dir);
}

/// Launches sshd in `node`'s namespace with the configuration `start_sshd` wrote into `dir`.
pub fn run_sshd(node: &Node, dir: &Path) {
    // OpenSSH refuses to start without its privilege-separation directory.
    std::fs::create_dir_all("/run/sshd").unwrap();
    let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sshd is not installed (apt-get install openssh-server)");
    remote::run(
        node.remote.as_ref(),
        &remote::command_line(&[
            sshd,
            "-f",
            &dir.join("sshd_config").display().to_string(),
            "-E",
            &dir.join("sshd.log").display().to_string(),
        ]),
    )
    .unwrap();
}
