//! vagrant/provision.sh, which Vagrant cannot run here, run in a container from the node image's
//! debootstrap base with a package removed: it installs what is missing from the Debian archive,
//! lets the vagrant user's key log in as root, starts sshd, and over that SSH login iptables,
//! nft and faketime work; run again, it changes nothing. About 15 s (an `apt-get update`).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_harness::dial::Direct;
use tidemark_harness::image;
use tidemark_harness::remote::{self, Remote as _};
use tidemark_harness::ssh::{KnownHosts, Ssh, SshConfig};

use crate::support::docker::{docker, docker_turn};
use crate::support::engine::require_root;
use crate::support::sshd::keygen;

/// Removes the container whatever the test's outcome.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn exec(name: &str, script: &str) -> std::process::Output {
    Command::new("docker")
        .args(["exec", name, "sh", "-c", script])
        .output()
        .unwrap()
}

#[test]
fn the_provisioning_script_makes_a_debian_root_a_node() {
    require_root("the_provisioning_script_makes_a_debian_root_a_node");
    let _turn = docker_turn();
    let base = format!(
        "{}:{}",
        image::BASE_REPOSITORY,
        &image::base_hash(&image::default_mirror())[..16]
    );
    let name = format!("tdm-provision-{}", std::process::id());
    docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "--cap-add",
        "NET_ADMIN",
        &base,
        "sleep",
        "infinity",
    ]);
    let container = Container(name.clone());
    let work = tempfile::tempdir().unwrap();
    let key = work.path().join("vagrant_key");
    keygen(&key);
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let made = exec(
        &name,
        &format!(
            "useradd -m vagrant && install -d -m 700 -o vagrant /home/vagrant/.ssh && \
             printf '%s\\n' '{}' > /home/vagrant/.ssh/authorized_keys && \
             dpkg --purge faketime libfaketime && ! command -v faketime",
            public.trim()
        ),
    );
    assert!(made.status.success(), "{made:?}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vagrant/provision.sh");
    docker(&[
        "cp",
        script.to_str().unwrap(),
        &format!("{name}:/tmp/provision.sh"),
    ]);
    let packages = image::node_packages().join(" ");
    let provision = format!("sh /tmp/provision.sh {packages}");
    let first = exec(&name, &provision);
    assert!(
        first.status.success(),
        "{}{}",
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&first.stderr)
    );

    let ip = docker(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &name,
    ]);
    let config = SshConfig {
        user: "root".into(),
        addr: std::net::SocketAddr::new(ip.parse().unwrap(), 22),
        key_file: Some(key),
        use_agent: false,
        known_hosts: KnownHosts::Ignore,
        timeout: Duration::from_secs(10),
    };
    let started = Instant::now();
    let ssh = loop {
        match Ssh::connect(config.clone(), Arc::new(Direct)) {
            Ok(s) => break s,
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("ssh: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let checks = remote::run(
        &ssh,
        "iptables -w -N TDMPROBE && iptables -w -A TDMPROBE -j RETURN && iptables -w -F TDMPROBE \
         && iptables -w -X TDMPROBE && nft add table inet tdmprobe && nft delete table inet tdmprobe \
         && echo $(( $(faketime -f +1d date +%s) - $(date +%s) ))",
    )
    .unwrap();
    let skew: i64 = checks.trim().parse().unwrap_or_else(|_| panic!("{checks}"));
    assert!(
        (86_399..=86_401).contains(&skew),
        "faketime moved the clock {skew} s"
    );
    assert_eq!(ssh.exec("id -u").unwrap().stdout.trim(), "0");

    let again = exec(&name, &provision);
    assert!(again.status.success(), "{again:?}");
    assert!(
        !String::from_utf8_lossy(&again.stdout).contains("Get:"),
        "the second run downloaded packages"
    );
    drop(container);
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &format!("name={name}")]),
        ""
    );
}
