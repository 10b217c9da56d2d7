//! Files replaced whole. A checkpoint, a snapshot or a state file is written under a temporary
//! name beside it, fsynced, renamed over the old one, and the directory fsynced: a crash or a
//! power loss leaves the old contents or the new, never a torn or empty file (Kafka writes its
//! checkpoints so). Directory fsyncs are here too: a file created, renamed or removed survives a
//! power loss only once its directory is synced.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Makes a directory's entries durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Replaces `path` with `bytes`, durably and whole.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary(path);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => sync_dir(Path::new(".")),
    }
}

/// `path` with `.tmp` added to its name.
fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("partition.state");
        replace_file(&path, b"old").unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["partition.state"]);
        assert_eq!(
            temporary(Path::new("/d/0.snapshot")),
            Path::new("/d/0.snapshot.tmp")
        );
    }
}
