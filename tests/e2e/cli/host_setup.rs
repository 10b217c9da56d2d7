//! The newcomer's path: `scripts/setup-host` (run by both README commands) and the
//! prerequisites `tidemark test` checks before it touches anything.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn checkout() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn tidemark_test(args: &[&str], path: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("test")
        .args(args)
        .env("PATH", path)
        .output()
        .expect("run tidemark test")
}

#[test]
fn setup_host_is_quiet_when_everything_is_installed() {
    // The README's test command ran it just before `cargo test`, so nothing is missing now.
    let out = Command::new(checkout().join("scripts/setup-host"))
        .output()
        .expect("run scripts/setup-host");
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn setup_host_names_what_it_cannot_install_without_root() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = dir.path().join("setup-host");
    crate::support::copy_executable(&checkout().join("scripts/setup-host"), &script);
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let list = dir.path().join("packages.txt");
    std::fs::write(
        &list,
        "# test list\ncoreutils\ntidemark-no-such-package   # never installed\n",
    )
    .unwrap();
    std::fs::set_permissions(&list, std::fs::Permissions::from_mode(0o644)).unwrap();

    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&script)
        .arg("--packages")
        .arg(&list)
        .output()
        .expect("run setup-host as nobody (setpriv, util-linux)");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(
        err.contains("missing packages: tidemark-no-such-package\n"),
        "{err}"
    );
    assert!(err.contains("run as root"), "{err}");
}

#[test]
fn setup_host_refuses_an_unreadable_package_list() {
    let out = Command::new(checkout().join("scripts/setup-host"))
        .args(["--packages", "/nonexistent/packages.txt"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/packages.txt"));
}

/// A directory holding only the programs named, linked from the real PATH.
fn path_with(programs: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for p in programs {
        let real = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(p))
            .find(|f| f.is_file())
            .unwrap_or_else(|| panic!("{p} is not installed"));
        std::os::unix::fs::symlink(real, dir.path().join(p)).unwrap();
    }
    dir
}

#[test]
fn tidemark_test_names_missing_commands_and_their_packages_before_touching_anything() {
    let bin = path_with(&["setsid", "nohup"]);
    let out = tidemark_test(
        &["--nemesis", "partition,loss", "--time-limit", "1"],
        &format!("{}", bin.path().display()),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(254), "stderr: {err}");
    assert!(
        err.contains("the `nft` command (Debian package nftables), needed by loss faults"),
        "{err}"
    );
}

#[test]
fn tidemark_test_names_the_runtime_commands_it_lacks() {
    let store = tempfile::tempdir().unwrap();
    let bin = path_with(&["setsid", "nohup", "nft"]);
    let out = tidemark_test(
        &[
            "--nemesis",
            "partition",
            "--time-limit",
            "1",
            "--store",
            &store.path().display().to_string(),
        ],
        &format!("{}", bin.path().display()),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "stderr: {err}");
    assert!(
        err.contains("the `ip` command (Debian package iproute2), needed by the netns runtime"),
        "{err}"
    );
    assert!(
        err.contains(
            "the `iptables` command (Debian package iptables), needed by network partitions"
        ),
        "{err}"
    );
    assert!(err.contains("apt-get install iproute2 iptables"), "{err}");
    assert_eq!(
        std::fs::read_dir(store.path()).unwrap().count(),
        0,
        "nothing is written before the check"
    );
}

#[test]
fn tidemark_test_names_a_missing_libfaketime_once_and_plainly() {
    let out = tidemark_test(
        &[
            "--nemesis",
            "clock",
            "--faketime-library",
            "/nonexistent/libfaketime.so.1",
            "--time-limit",
            "1",
        ],
        &std::env::var("PATH").unwrap(),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(254), "stderr: {err}");
    assert!(
        err.contains(
            "/nonexistent/libfaketime.so.1 (Debian package faketime), needed by clock faults (or \
             point --faketime-library at libfaketime)"
        ),
        "{err}"
    );
    assert!(
        err.lines().all(|l| !l.trim_start().contains("  ")),
        "no runs of spaces inside a line: {err:?}"
    );
}

/// The one-line commands of the README's `sh` blocks.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(checkout().join("README.md")).unwrap();
    let mut commands = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh => commands.push(l.to_string()),
            _ => {}
        }
    }
    commands
}

/// CI proves what a newcomer copies: `.ci/run` runs the README's test command verbatim and
/// nothing else, and both of the README's commands set the host up first.
#[test]
fn ci_runs_the_readmes_test_command_verbatim() {
    let set_up: Vec<String> = readme_commands()
        .into_iter()
        .filter(|c| c.starts_with("scripts/setup-host && "))
        .collect();
    let [main_job, test_command] = set_up.as_slice() else {
        panic!("two README commands start with scripts/setup-host: {set_up:?}");
    };
    assert!(
        main_job.ends_with("target/release/tidemark test"),
        "{main_job}"
    );
    assert!(test_command.contains("&& cargo test "), "{test_command}");
    let ci = std::fs::read_to_string(checkout().join(".ci/run")).unwrap();
    let ci_commands: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| !l.starts_with("set ") && !l.starts_with("cd "))
        .collect();
    assert_eq!(ci_commands, [test_command.as_str()], ".ci/run:\n{ci}");
}

#[test]
fn setup_host_names_what_to_install_on_a_machine_without_apt() {
    let bin = path_with(&["bash", "sed", "dirname", "id", "cmp"]);
    let list = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(list.path(), "coreutils\n").unwrap();
    let out = Command::new(checkout().join("scripts/setup-host"))
        .arg("--packages")
        .arg(list.path())
        .env("PATH", bin.path())
        .output()
        .expect("run scripts/setup-host");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(
        err.contains("this is not a Debian or Ubuntu machine"),
        "{err}"
    );
    assert!(err.contains("by hand: coreutils\n"), "{err}");
}
