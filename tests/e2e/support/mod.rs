//! Helpers shared by the end-to-end tests.

pub mod docker;
pub mod engine;
pub mod nemesis;
pub mod sshd;

/// Copies a program for a test to run, in a `cp` process: a file this multi-threaded test
/// process held open for writing could be inherited by a child another test forks at that
/// moment, and running the copy would then fail with "Text file busy".
pub fn copy_executable(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg("--preserve=mode")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success(), "cp {} {}", from.display(), to.display());
}
