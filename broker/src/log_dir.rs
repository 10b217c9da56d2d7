//! Exclusive ownership of the log directory. Two broker processes on one `log.dirs` would each
//! recover, append to and lead from the same segments; as in Kafka, the first takes an exclusive
//! `flock` on `<log.dirs>/.lock` for its lifetime and any other refuses to start.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Name of the lock file inside the log directory, as Kafka names it.
pub const LOCK_FILE: &str = ".lock";

/// Why the log directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "log directory {dir} is in use by another broker process (it holds the lock on {lock})"
    )]
    InUse { dir: PathBuf, lock: PathBuf },
    #[error("cannot lock log directory {dir}: {reason}")]
    Other { dir: PathBuf, reason: String },
}

/// The held lock; dropping it (or the process ending, even by SIGKILL) releases it.
#[derive(Debug)]
pub struct LogDirLock {
    _lock: Flock<File>,
}

impl LogDirLock {
    /// Creates `dir` if needed and locks it, failing at once if another process holds it.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let other = |reason: String| LockError::Other {
            dir: dir.to_path_buf(),
            reason,
        };
        std::fs::create_dir_all(dir).map_err(|e| other(format!("cannot create it: {e}")))?;
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| other(format!("cannot open {}: {e}", path.display())))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(LogDirLock { _lock: lock }),
            Err((_, Errno::EWOULDBLOCK)) => Err(LockError::InUse {
                dir: dir.to_path_buf(),
                lock: path,
            }),
            Err((_, e)) => Err(other(format!("flock {}: {e}", path.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_a_dir_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = LogDirLock::acquire(&data).unwrap();
        let err = LogDirLock::acquire(&data).unwrap_err();
        assert!(matches!(err, LockError::InUse { .. }), "{err}");
        assert!(
            err.to_string().contains(&data.display().to_string()),
            "{err}"
        );
        drop(first);
        LogDirLock::acquire(&data).unwrap();
    }
}
