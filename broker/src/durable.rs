//! Files replaced whole. A checkpoint, a snapshot or a state file is written under a temporary
//! name beside it, fsynced, renamed over the old one, and the directory fsynced: a crash or a
//! power loss leaves the old contents or the new, never a torn or empty file (Kafka writes its
//! checkpoints so). Directory fsyncs are here too: a file created, renamed or removed survives a
//! power loss only once its directory is synced.
//!
//! Every fsync of the log directory goes through [`sync_or_halt`]: a failed one stops the broker.
//! So does one of a file [`replace_file`] writes elsewhere (the local remote store's segment
//! metadata), though an unreachable store fails before any fsync, as an outage. A write the log
//! directory refuses (a full disk) halts the broker too, through [`written_or_halt`] here and the
//! log's own wrapper: Kafka takes a log directory that fails any write offline, and a broker
//! whose only one is offline stops.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// fsyncs `file` at `path` (its data alone with `data_only`), or halts the process if that fails.
///
/// After a failed fsync the page cache may hold writes the disk never got, and Linux reports the
/// failure once: the next fsync succeeds without them. Nothing written before it can be taken as
/// durable again, and going on would acknowledge records above a hole in the log, which a later
/// power loss shows (the harness's failing disk did: acknowledged writes lost under per-message
/// flush). So the broker stops, as Kafka halts a broker whose log directory failed and PostgreSQL
/// panics on a failed fsync, and a restart recovers from what the disk holds.
pub fn sync_or_halt(file: &std::fs::File, path: &Path, data_only: bool) {
    let synced = if data_only {
        file.sync_data()
    } else {
        file.sync_all()
    };
    if let Err(e) = synced {
        halt(&format!("fsync of {}", path.display()), &e);
    }
}

/// Stops the process because `what` failed on the log directory with `e`: the broker halts, as
/// Kafka's does when its log directory fails, rather than serve on with state it could not
/// write (see [`sync_or_halt`]; the metadata quorum's files, [`written_or_halt`]).
pub fn halt(what: &str, e: &std::io::Error) -> ! {
    tracing::error!("{what} failed, halting: {e}");
    eprintln!("tidemark-broker: {what} failed: {e}; halting");
    std::process::exit(1)
}

/// `r`'s value, or a halt when writing `what` failed. The metadata quorum's files go through it:
/// openraft stops for good on a storage error, which left a broker serving clients and mirrors
/// with metadata it no longer received (the harness's full disk showed it: a mirror leader of
/// an old epoch, behind its followers, that the other cluster then truncated to).
pub fn written_or_halt<T>(r: std::io::Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => halt(what, &e),
    }
}

/// [`replace_file`], halting when the log directory refuses it ([`written_or_halt`]): for the
/// broker's own checkpoints and state files, which kept in memory but not on disk a restart
/// would forget.
pub fn replace_or_halt(path: &Path, bytes: &[u8]) {
    written_or_halt(
        replace_file(path, bytes),
        &format!("writing {}", path.display()),
    )
}

/// Makes a directory's entries durable (halting if the fsync fails, see [`sync_or_halt`]).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    sync_or_halt(&std::fs::File::open(dir)?, dir, false);
    Ok(())
}

/// Replaces `path` with `bytes`, durably and whole.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary(path);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        sync_or_halt(&f, &tmp, false);
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
