//! The quorum's durable raft log: the vote, the log entries and the committed and purged log ids,
//! kept under the metadata directory so that a controller keeps its promises across restarts
//! (kill -9 included). Raft forbids forgetting a vote or an acknowledged entry, so every write is
//! fsynced before openraft is told it happened.
//!
//! Entries live in memory (the metadata log is small) and in `log.jsonl`, one JSON entry a line,
//! appended in place. Truncation and purging rewrite the file atomically (temp file, fsync,
//! rename); a torn last line left by a crash during an append is dropped on load, since that
//! append was never acknowledged.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, LogState, OptionalSend, RaftLogReader, StorageError,
    Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::TypeConfig;

const VOTE_FILE: &str = "vote.json";
const COMMITTED_FILE: &str = "committed.json";
const PURGED_FILE: &str = "purged.json";
const LOG_FILE: &str = "log.jsonl";

type Log = BTreeMap<u64, Entry<TypeConfig>>;

/// The log storage openraft drives; see the module docs for the layout.
pub(super) struct LogStore {
    dir: PathBuf,
    vote: Option<Vote<u64>>,
    committed: Option<LogId<u64>>,
    purged: Option<LogId<u64>>,
    log: Arc<Mutex<Log>>,
    /// Append handle to `log.jsonl`; replaced after every rewrite.
    file: Arc<File>,
}

/// A reader sharing the in-memory entries, for openraft's replication tasks.
pub(super) struct LogReader {
    log: Arc<Mutex<Log>>,
}

impl LogStore {
    /// Loads the store under `dir`, creating the directory when it is new.
    pub(super) fn open(dir: &Path) -> io::Result<LogStore> {
        fs::create_dir_all(dir)?;
        let vote = read_json::<Vote<u64>>(dir, VOTE_FILE)?;
        let committed = read_json::<Option<LogId<u64>>>(dir, COMMITTED_FILE)?.flatten();
        let purged = read_json::<Option<LogId<u64>>>(dir, PURGED_FILE)?.flatten();
        let log = load_log(&dir.join(LOG_FILE), purged)?;
        tracing::debug!(
            dir = %dir.display(),
            entries = log.len(),
            ?vote,
            ?committed,
            ?purged,
            "loaded metadata quorum log"
        );
        Ok(LogStore {
            dir: dir.to_path_buf(),
            vote,
            committed,
            purged,
            log: Arc::new(Mutex::new(log)),
            file: Arc::new(open_append(&dir.join(LOG_FILE))?),
        })
    }

    /// Replaces `log.jsonl` with the entries now in memory.
    async fn rewrite(&mut self) -> Result<(), StorageError<u64>> {
        let bytes = encode_lines(lock(&self.log).values()).map_err(logs_err(ErrorVerb::Write))?;
        let dir = self.dir.clone();
        let file = blocking(move || {
            write_atomic(&dir, LOG_FILE, &bytes)?;
            open_append(&dir.join(LOG_FILE))
        })
        .await;
        let file = crate::durable::written_or_halt(file, "rewriting the metadata quorum's log");
        self.file = Arc::new(file);
        Ok(())
    }

    async fn save_small<T: Serialize>(
        &self,
        name: &'static str,
        value: &T,
    ) -> Result<(), io::Error> {
        let bytes = serde_json::to_vec(value)?;
        let dir = self.dir.clone();
        let written = blocking(move || write_atomic(&dir, name, &bytes)).await;
        crate::durable::written_or_halt(written, &format!("writing the metadata quorum's {name}"));
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        Ok(read_range(&self.log, range))
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        Ok(read_range(&self.log, range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let last = lock(&self.log).values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: self.purged,
            last_log_id: last.or(self.purged),
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            log: self.log.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        self.save_small(VOTE_FILE, vote)
            .await
            .map_err(|e| StorageError::from_io_error(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        self.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        if committed == self.committed {
            return Ok(());
        }
        self.save_small(COMMITTED_FILE, &committed)
            .await
            .map_err(|e| StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Write, e))?;
        self.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(self.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut bytes = Vec::new();
        {
            let mut log = lock(&self.log);
            for entry in entries {
                encode_line(&mut bytes, &entry).map_err(logs_err(ErrorVerb::Write))?;
                log.insert(entry.log_id.index, entry);
            }
        }
        let file = self.file.clone();
        let path = self.dir.join(LOG_FILE);
        let flushed = blocking(move || {
            (&*file).write_all(&bytes)?;
            crate::durable::sync_or_halt(&file, &path, true);
            Ok(())
        })
        .await;
        crate::durable::written_or_halt(flushed, "appending to the metadata quorum's log");
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        lock(&self.log).split_off(&log_id.index);
        self.rewrite().await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        // The purged id goes first: entries at or below it that a crash leaves in the file are
        // skipped on load, while a lost purged id would leave a hole at the start of the log.
        self.save_small(PURGED_FILE, &Some(log_id))
            .await
            .map_err(logs_err(ErrorVerb::Delete))?;
        self.purged = Some(log_id);
        {
            let mut log = lock(&self.log);
            let kept = log.split_off(&(log_id.index + 1));
            *log = kept;
        }
        self.rewrite().await
    }
}

fn logs_err(verb: ErrorVerb) -> impl Fn(io::Error) -> StorageError<u64> {
    move |e| StorageError::from_io_error(ErrorSubject::Logs, verb, e)
}

/// The entries are plain data, so a panic elsewhere cannot leave them half-changed.
fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read_range(log: &Mutex<Log>, range: impl RangeBounds<u64>) -> Vec<Entry<TypeConfig>> {
    lock(log).range(range).map(|(_, e)| e.clone()).collect()
}

fn encode_line(out: &mut Vec<u8>, entry: &Entry<TypeConfig>) -> io::Result<()> {
    serde_json::to_writer(&mut *out, entry)?;
    out.push(b'\n');
    Ok(())
}

fn encode_lines<'a>(entries: impl Iterator<Item = &'a Entry<TypeConfig>>) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    for entry in entries {
        encode_line(&mut out, entry)?;
    }
    Ok(out)
}

/// Reads `log.jsonl`, dropping (and cutting off the file at) a torn last line and skipping
/// entries already purged.
fn load_log(path: &Path, purged: Option<LogId<u64>>) -> io::Result<Log> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Log::new()),
        Err(e) => return Err(e),
    };
    let mut log = Log::new();
    let mut good_len = 0;
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let Some(end) = rest.iter().position(|b| *b == b'\n') else {
            break;
        };
        let entry: Entry<TypeConfig> = match serde_json::from_slice(&rest[..end]) {
            Ok(e) => e,
            Err(_) if end + 1 == rest.len() => break,
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: entry at byte {good_len}: {e}", path.display()),
                ))
            }
        };
        good_len += end + 1;
        rest = &rest[end + 1..];
        if purged.is_some_and(|p| entry.log_id.index <= p.index) {
            continue;
        }
        let expected = match log.keys().next_back() {
            Some(last) => Some(last + 1),
            None => purged.map(|p| p.index + 1),
        };
        if expected.is_some_and(|x| x != entry.log_id.index) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: entry {} follows {:?}: the log has a hole",
                    path.display(),
                    entry.log_id.index,
                    expected.map(|x| x - 1)
                ),
            ));
        }
        log.insert(entry.log_id.index, entry);
    }
    if good_len < bytes.len() {
        tracing::warn!(
            path = %path.display(),
            dropped = bytes.len() - good_len,
            "dropping a torn entry at the end of the metadata log"
        );
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(good_len as u64)?;
        crate::durable::sync_or_halt(&file, path, false);
    }
    Ok(log)
}

fn open_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    if let Some(dir) = path.parent() {
        crate::durable::sync_dir(dir)?;
    }
    Ok(file)
}

/// Reads a small JSON file, `None` when it does not exist yet.
pub(super) fn read_json<T: DeserializeOwned>(dir: &Path, name: &str) -> io::Result<Option<T>> {
    let path = dir.join(name);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces `dir/name` with `bytes` so that a crash leaves either the old or the new contents.
pub(super) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    crate::durable::replace_file(&dir.join(name), bytes)
}

/// Runs file I/O off the async worker threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(io::Error::other)?
}
