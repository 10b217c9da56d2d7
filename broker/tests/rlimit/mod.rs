//! Lowering a resource limit of a running broker, as `ulimit` would have before it started.

use std::process::Command;

/// Address space a broker may use: several times what it needs to serve, far below what a
/// hostile element count asks for (2^31 elements of a struct: tens of gigabytes).
pub const ADDRESS_SPACE: &str = "--as=1073741824";

/// Applies `resource` (a `prlimit` option such as `--nofile=256`) to process `pid`.
pub fn limit(pid: u32, resource: &str) {
    let out = Command::new("prlimit")
        .args(["--pid", &pid.to_string(), resource])
        .output()
        .expect("prlimit (util-linux) must be installed");
    assert!(
        out.status.success(),
        "prlimit {resource}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
