//! What a run needs installed on this machine, checked before it touches anything. Each part of
//! a test (runtime, net, database, fault kinds) names the programs and files it will use and the
//! Debian package that brings each, so a missing one is reported up front with the package to
//! install, instead of as a half-built cluster and a shell error in the middle of a run.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::remote::{escape, Remote};

/// One program or file a part of the test uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// What must exist.
    pub need: Need,
    /// The Debian package that provides it.
    pub package: &'static str,
    /// Who needs it, for the message ("the netns runtime", "clock faults").
    pub needed_by: String,
}

/// A program looked up on the PATH, or a file at a fixed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// A command found on the PATH.
    Program(&'static str),
    /// A file that must exist.
    File(PathBuf),
    /// A character device that must exist (`/dev/fuse`).
    Device(PathBuf),
}

impl Requirement {
    /// `program` from `package`, needed by `needed_by`.
    pub fn program(program: &'static str, package: &'static str, needed_by: &str) -> Self {
        Requirement {
            need: Need::Program(program),
            package,
            needed_by: needed_by.to_string(),
        }
    }

    /// The file `path` from `package`, needed by `needed_by`.
    pub fn file(path: &Path, package: &'static str, needed_by: &str) -> Self {
        Requirement {
            need: Need::File(path.to_path_buf()),
            package,
            needed_by: needed_by.to_string(),
        }
    }

    /// The character device `path` from `package`, needed by `needed_by`.
    pub fn device(path: &Path, package: &'static str, needed_by: &str) -> Self {
        Requirement {
            need: Need::Device(path.to_path_buf()),
            package,
            needed_by: needed_by.to_string(),
        }
    }

    /// Whether this machine has it, looking programs up in `path` (a PATH value).
    pub fn is_met_with(&self, path: Option<&std::ffi::OsStr>) -> bool {
        match &self.need {
            Need::Program(name) => path.is_some_and(|p| {
                std::env::split_paths(p).any(|dir| is_executable(&dir.join(name)))
            }),
            Need::File(file) => file.is_file(),
            Need::Device(dev) => {
                use std::os::unix::fs::FileTypeExt as _;
                dev.metadata().is_ok_and(|m| m.file_type().is_char_device())
            }
        }
    }

    /// Whether this machine has it, with this process's PATH.
    pub fn is_met(&self) -> bool {
        self.is_met_with(std::env::var_os("PATH").as_deref())
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.need {
            Need::Program(name) => write!(f, "the `{name}` command")?,
            Need::File(path) | Need::Device(path) => write!(f, "{}", path.display())?,
        }
        write!(
            f,
            " (Debian package {}), needed by {}",
            self.package, self.needed_by
        )
    }
}

/// The requirements this machine does not meet, one per missing program or file (the first
/// part that needs it names it).
pub fn unmet(requirements: &[Requirement]) -> Vec<&Requirement> {
    let mut seen = Vec::new();
    requirements
        .iter()
        .filter(|r| !r.is_met())
        .filter(|r| {
            let new = !seen.contains(&&r.need);
            seen.push(&r.need);
            new
        })
        .collect()
}

/// A message naming every unmet requirement and one command that installs them all, or `None`.
pub fn report(requirements: &[Requirement]) -> Option<String> {
    let missing = unmet(requirements);
    if missing.is_empty() {
        return None;
    }
    let mut packages: Vec<&str> = missing.iter().map(|r| r.package).collect();
    packages.dedup();
    let lines: Vec<String> = missing.iter().map(|r| format!("  {r}")).collect();
    Some(format!(
        "this machine lacks what the test needs:\n{}\ninstall with: apt-get install {} \
         (or run scripts/setup-host from the tidemark checkout)",
        lines.join("\n"),
        packages.join(" ")
    ))
}

/// The shell line that prints each requirement's index when the node lacks it: programs looked
/// up with `command -v` (login shells on SSH hosts may have a shorter PATH, so the sbin
/// directories are added), files with `test -f`.
fn probe_script(requirements: &[Requirement]) -> String {
    let mut script = String::from("PATH=\"$PATH:/usr/sbin:/sbin\"; ");
    for (i, r) in requirements.iter().enumerate() {
        let test = match &r.need {
            Need::Program(name) => format!("command -v {} >/dev/null", escape(name)),
            Need::File(path) => format!("test -f {}", escape(&path.display().to_string())),
            Need::Device(path) => format!("test -c {}", escape(&path.display().to_string())),
        };
        script.push_str(&format!("{test} || echo {i}; "));
    }
    script.push_str("true");
    script
}

/// Checks the requirements on a node over its [`Remote`], for runtimes whose nodes are other
/// machines. Returns the message [`report`] would give, naming the node.
pub fn check_on(remote: &dyn Remote, requirements: &[Requirement]) -> anyhow::Result<()> {
    let out = crate::remote::run(remote, &probe_script(requirements))?;
    let missing: Vec<Requirement> = out
        .lines()
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .filter_map(|i| requirements.get(i).cloned())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut packages: Vec<&str> = missing.iter().map(|r| r.package).collect();
    packages.dedup();
    let lines: Vec<String> = missing.iter().map(|r| format!("  {r}")).collect();
    anyhow::bail!(
        "{} lacks what the test needs:\n{}\ninstall there with: apt-get install {}",
        remote.describe(),
        lines.join("\n"),
        packages.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_found_only_on_the_path_given() {
        let sh = Requirement::program("sh", "dash", "tests");
        assert!(sh.is_met_with(Some(std::ffi::OsStr::new("/usr/bin:/bin"))));
        assert!(!sh.is_met_with(Some(std::ffi::OsStr::new("/nonexistent"))));
        assert!(!sh.is_met_with(None));
    }

    #[test]
    fn a_missing_file_is_reported_with_its_package_and_who_needs_it() {
        let reqs = vec![
            Requirement::program("sh", "dash", "the shell"),
            Requirement::file(
                Path::new("/nonexistent/libfaketime.so.1"),
                "faketime",
                "clock faults",
            ),
            Requirement::program("tidemark-no-such-program", "tdm-pkg", "the netns runtime"),
            Requirement::program("tidemark-no-such-program", "tdm-pkg", "loss faults"),
        ];
        let msg = report(&reqs).expect("two requirements are unmet");
        assert_eq!(
            msg,
            "this machine lacks what the test needs:\n  \
             /nonexistent/libfaketime.so.1 (Debian package faketime), needed by clock faults\n  \
             the `tidemark-no-such-program` command (Debian package tdm-pkg), needed by the netns \
             runtime\ninstall with: apt-get install faketime tdm-pkg (or run scripts/setup-host \
             from the tidemark checkout)"
        );
        assert_eq!(report(&reqs[..1]), None);
    }

    #[test]
    fn a_node_is_probed_through_its_remote() {
        let node = crate::remote::Local::host();
        let reqs = vec![
            Requirement::program("sh", "dash", "the shell"),
            Requirement::program("tidemark-no-such-program", "tdm-pkg", "loss faults"),
            Requirement::file(Path::new("/nonexistent/lib.so"), "faketime", "clock faults"),
        ];
        check_on(&node, &reqs[..1]).expect("sh is everywhere");
        let err = format!("{:#}", check_on(&node, &reqs).unwrap_err());
        assert!(
            err.ends_with(
                "lacks what the test needs:\n  \
                 the `tidemark-no-such-program` command (Debian package tdm-pkg), needed by loss \
                 faults\n  /nonexistent/lib.so (Debian package faketime), needed by clock \
                 faults\ninstall there with: apt-get install tdm-pkg faketime"
            ),
            "{err}"
        );
    }
}
