//! The leader-epoch cache (KIP-101): which leader epoch started at which offset. It decides how a
//! follower truncates after a leader change, so it is kept exact and persisted on every change in
//! Kafka's `leader-epoch-checkpoint` text format.

use std::path::{Path, PathBuf};

use super::LogError;

/// File name of the checkpoint inside a partition directory.
pub const CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";

/// One entry: `epoch` started at `start_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// The epoch cache of one replica, strictly increasing in epoch and start offset.
#[derive(Debug)]
pub struct LeaderEpochCache {
    path: PathBuf,
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    /// Loads the checkpoint in `dir`, or starts empty when there is none. A checkpoint that is
    /// not text, not in the format, or not strictly increasing is `LogError::Corrupt`.
    pub fn open(dir: &Path) -> Result<Self, LogError> {
        let path = dir.join(CHECKPOINT_FILE);
        let entries = match std::fs::read(&path) {
            Ok(bytes) => String::from_utf8(bytes)
                .map_err(|_| "not UTF-8 text".to_string())
                .and_then(|text| parse_checkpoint(&text))
                .map_err(|reason| LogError::Corrupt {
                    path: path.clone(),
                    reason,
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(LogError::io(&path, e)),
        };
        Ok(LeaderEpochCache { path, entries })
    }

    /// An empty cache for `dir` that has not touched the checkpoint file (yet).
    pub(crate) fn unwritten(dir: &Path) -> Self {
        LeaderEpochCache {
            path: dir.join(CHECKPOINT_FILE),
            entries: Vec::new(),
        }
    }

    /// Rebuilds the cache of `dir` from the `(partition leader epoch, base offset)` of every batch
    /// in log order, as Kafka does when the checkpoint is unusable, and persists it.
    pub fn rebuild(
        dir: &Path,
        batches: impl IntoIterator<Item = (i32, i64)>,
    ) -> Result<Self, LogError> {
        let mut cache = LeaderEpochCache::unwritten(dir);
        for (epoch, base_offset) in batches {
            if epoch >= 0 && cache.latest().is_none_or(|l| l.epoch != epoch) {
                cache
                    .entries
                    .retain(|e| e.epoch < epoch && e.start_offset < base_offset);
                cache.entries.push(EpochEntry {
                    epoch,
                    start_offset: base_offset,
                });
            }
        }
        cache.flush()?;
        Ok(cache)
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Records that `epoch` starts at `start_offset`, dropping entries this one supersedes.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> Result<(), LogError> {
        if epoch < 0 || start_offset < 0 {
            return Err(LogError::Invalid(format!(
                "epoch entry ({epoch}, {start_offset})"
            )));
        }
        if let Some(last) = self.latest() {
            if last.epoch == epoch && start_offset >= last.start_offset {
                return Ok(());
            }
        }
        let (kept, removed): (Vec<EpochEntry>, Vec<EpochEntry>) = self
            .entries
            .iter()
            .partition(|e| e.epoch < epoch && e.start_offset < start_offset);
        // A leader change with no records in between replaces the entry at the same offset;
        // anything else rewrites history a follower may truncate by, and Kafka warns of it.
        if removed.len() > 1
            || removed
                .first()
                .is_some_and(|e| e.start_offset != start_offset)
        {
            tracing::warn!(
                path = %self.path.display(), epoch, start_offset, ?removed,
                "non-monotonic update of the leader epoch cache"
            );
        }
        self.entries = kept;
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        self.flush()
    }

    /// Removes entries starting at or after `end_offset` (the log was truncated there).
    pub fn truncate_from_end(&mut self, end_offset: i64) -> Result<(), LogError> {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end_offset);
        if self.entries.len() != before {
            self.flush()?;
        }
        Ok(())
    }

    /// Kafka's `truncateFromStart`: the log now starts at `start_offset`, so entries wholly below
    /// it go and the latest of them is moved up to start there.
    pub fn truncate_from_start(&mut self, start_offset: i64) -> Result<(), LogError> {
        let below = self
            .entries
            .iter()
            .take_while(|e| e.start_offset <= start_offset)
            .count();
        if below == 0 || (below == 1 && self.entries[0].start_offset == start_offset) {
            return Ok(());
        }
        let kept = EpochEntry {
            start_offset,
            ..self.entries[below - 1]
        };
        self.entries.drain(..below);
        self.entries.insert(0, kept);
        self.flush()
    }

    /// Removes everything (the log was emptied).
    pub fn clear(&mut self) -> Result<(), LogError> {
        self.entries.clear();
        self.flush()
    }

    /// Kafka's `endOffsetFor`: the largest epoch ≤ `requested` and the offset where it ended
    /// (the start of the next epoch, or `log_end_offset` when it is the latest).
    pub fn end_offset_for(&self, requested: i32, log_end_offset: i64) -> (i32, i64) {
        if requested < 0 {
            return (-1, -1);
        }
        match self.latest() {
            Some(l) if l.epoch == requested => return (requested, log_end_offset),
            None => return (-1, -1),
            _ => {}
        }
        let Some(higher_idx) = self.entries.iter().position(|e| e.epoch > requested) else {
            return (-1, -1);
        };
        let higher = self.entries[higher_idx];
        if higher_idx == 0 {
            (requested, higher.start_offset)
        } else {
            (self.entries[higher_idx - 1].epoch, higher.start_offset)
        }
    }

    fn flush(&self) -> Result<(), LogError> {
        let text = render_checkpoint(&self.entries);
        crate::durable::replace_file(&self.path, text.as_bytes())
            .map_err(|e| LogError::io(&self.path, e))
    }
}

/// Kafka's checkpoint format of `entries`: version line, count line, then `epoch offset` lines.
pub fn render_checkpoint(entries: &[EpochEntry]) -> String {
    let mut text = format!("0\n{}\n", entries.len());
    for e in entries {
        text.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
    }
    text
}

/// Parses Kafka's checkpoint format: version line, count line, then `epoch offset` lines.
pub fn parse_checkpoint(text: &str) -> Result<Vec<EpochEntry>, String> {
    let mut lines = text.lines();
    let version = lines.next().ok_or("empty file")?.trim();
    if version != "0" {
        return Err(format!("unsupported checkpoint version `{version}`"));
    }
    let count: usize = lines
        .next()
        .ok_or("missing entry count")?
        .trim()
        .parse()
        .map_err(|_| "entry count is not a number".to_string())?;
    let mut entries = Vec::with_capacity(count);
    for (i, line) in lines.enumerate() {
        let mut parts = line.split_whitespace();
        let (Some(e), Some(o), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("line {}: expected `epoch offset`", i + 3));
        };
        let epoch = e
            .parse()
            .map_err(|_| format!("line {}: bad epoch `{e}`", i + 3))?;
        let start_offset = o
            .parse()
            .map_err(|_| format!("line {}: bad offset `{o}`", i + 3))?;
        entries.push(EpochEntry {
            epoch,
            start_offset,
        });
    }
    if entries.len() != count {
        return Err(format!("expected {count} entries, found {}", entries.len()));
    }
    for (i, pair) in entries.windows(2).enumerate() {
        if pair[1].epoch <= pair[0].epoch || pair[1].start_offset <= pair[0].start_offset {
            return Err(format!(
                "line {}: entry ({}, {}) does not follow ({}, {})",
                i + 4,
                pair[1].epoch,
                pair[1].start_offset,
                pair[0].epoch,
                pair[0].start_offset
            ));
        }
    }
    if let Some(e) = entries.iter().find(|e| e.epoch < 0 || e.start_offset < 0) {
        return Err(format!("negative entry ({}, {})", e.epoch, e.start_offset));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trip_in_kafka_format() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::open(dir.path()).unwrap();
        c.assign(0, 0).unwrap();
        c.assign(3, 12).unwrap();
        c.assign(3, 15).unwrap();
        let text = std::fs::read_to_string(dir.path().join(CHECKPOINT_FILE)).unwrap();
        assert_eq!(text, "0\n2\n0 0\n3 12\n");
        let c2 = LeaderEpochCache::open(dir.path()).unwrap();
        assert_eq!(c2.entries(), c.entries());
    }

    #[test]
    fn assign_keeps_monotonic() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::open(dir.path()).unwrap();
        c.assign(1, 0).unwrap();
        c.assign(2, 5).unwrap();
        c.assign(4, 10).unwrap();
        // A lower epoch at a higher offset supersedes the later entries, as in Kafka.
        c.assign(3, 7).unwrap();
        assert_eq!(
            c.entries(),
            &[
                EpochEntry {
                    epoch: 1,
                    start_offset: 0
                },
                EpochEntry {
                    epoch: 2,
                    start_offset: 5
                },
                EpochEntry {
                    epoch: 3,
                    start_offset: 7
                }
            ]
        );
        assert!(c.assign(-1, 0).is_err());
    }

    #[test]
    fn end_offset_for_follows_kafka() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::open(dir.path()).unwrap();
        assert_eq!(c.end_offset_for(0, 10), (-1, -1));
        c.assign(1, 0).unwrap();
        c.assign(3, 2).unwrap();
        // KIP-279: asking for epoch 2 returns the floor epoch 1 ending where 3 starts.
        assert_eq!(c.end_offset_for(2, 9), (1, 2));
        assert_eq!(c.end_offset_for(3, 9), (3, 9));
        assert_eq!(c.end_offset_for(0, 9), (0, 0));
        assert_eq!(c.end_offset_for(4, 9), (-1, -1));
        assert_eq!(c.end_offset_for(-1, 9), (-1, -1));
    }

    #[test]
    fn truncation_and_corrupt_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::open(dir.path()).unwrap();
        c.assign(1, 0).unwrap();
        c.assign(2, 5).unwrap();
        c.truncate_from_end(5).unwrap();
        assert_eq!(
            c.latest(),
            Some(EpochEntry {
                epoch: 1,
                start_offset: 0
            })
        );
        std::fs::write(dir.path().join(CHECKPOINT_FILE), "0\n2\n1 0\n").unwrap();
        assert!(LeaderEpochCache::open(dir.path()).is_err());
        assert!(parse_checkpoint("1\n0\n").is_err());
        assert!(parse_checkpoint("0\n1\n1 x\n").is_err());
        assert!(parse_checkpoint("0\n2\n3 10\n2 12\n").is_err());
        assert!(parse_checkpoint("0\n1\n-1 0\n").is_err());
        std::fs::write(dir.path().join(CHECKPOINT_FILE), [0xff, 0x00, 0x17]).unwrap();
        assert!(matches!(
            LeaderEpochCache::open(dir.path()),
            Err(LogError::Corrupt { .. })
        ));
    }

    #[test]
    fn rebuild_from_batch_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let batches = [(-1, 0), (0, 1), (0, 3), (2, 5), (2, 9), (5, 10)];
        let c = LeaderEpochCache::rebuild(dir.path(), batches).unwrap();
        let entry = |epoch, start_offset| EpochEntry {
            epoch,
            start_offset,
        };
        assert_eq!(c.entries(), &[entry(0, 1), entry(2, 5), entry(5, 10)]);
        assert_eq!(
            LeaderEpochCache::open(dir.path()).unwrap().entries(),
            c.entries()
        );
    }
}
