//! The durable log of one partition replica: segments of v2 record batches named by base offset,
//! their offset indexes, the leader-epoch cache, and recovery after a crash. It knows nothing of
//! leaders or replication; the partition layer decides what to append and where to truncate.

pub mod batch;
pub mod epoch_cache;
pub mod index;
pub mod producer_state;
pub mod segment;

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::path::{Path, PathBuf};

use batch::BatchHeader;
use epoch_cache::LeaderEpochCache;
use producer_state::{Admission, ProducerError, ProducerStates};
use segment::{RolledSegment, Segment};

// Kafka flushes the directory on segment roll and log creation too.
pub(crate) use crate::durable::sync_dir;

/// Marker written on clean shutdown; its absence at start means a crash, so every segment is
/// CRC-scanned instead of only the newest.
pub const CLEAN_SHUTDOWN_FILE: &str = ".clean-shutdown";

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("invalid records: {0}")]
    InvalidRecords(#[from] batch::BatchError),
    #[error("offset {offset} is out of range [{start}, {end}]")]
    OutOfRange { offset: i64, start: i64, end: i64 },
    #[error("{0}")]
    Invalid(String),
    #[error("record batch of {size} bytes exceeds the maximum of {max} (max.message.bytes)")]
    TooLarge { size: usize, max: u64 },
    #[error("{0}")]
    Producer(#[from] ProducerError),
}

impl LogError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        LogError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// `r`, with a failed write to the log directory turned into a halt (see
/// [`crate::durable::halt`]): Kafka takes a log directory that fails a write offline, and with
/// its only one gone the broker stops. Going on left changes half made (a batch in its segment
/// whose epoch checkpoint or producer snapshot was refused, answered to its producer as failed
/// and replicated all the same), and a broker that cannot write serves on as a replica that
/// never catches up.
fn written<T>(r: Result<T, LogError>) -> Result<T, LogError> {
    match r {
        Err(LogError::Io { path, source }) => {
            crate::durable::halt(&format!("writing {}", path.display()), &source)
        }
        r => r,
    }
}

/// Per-log settings the partition passes down.
#[derive(Clone, Copy, Debug)]
pub struct LogSettings {
    pub segment_bytes: u64,
    /// fsync once this many messages are unflushed (1: before every acknowledgement).
    pub flush_interval_messages: u64,
    /// Largest batch a leader appends, in bytes; replicated batches are not checked (Kafka's
    /// followers take what the leader took).
    pub max_batch_bytes: u64,
}

/// The result of an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendInfo {
    pub first_offset: i64,
    pub last_offset: i64,
    /// The batches were a producer's retry of batches already in the log, at these offsets;
    /// nothing was appended.
    pub duplicate: bool,
}

/// Bytes read for a fetch.
#[derive(Debug, Default)]
pub struct ReadResult {
    pub records: Vec<u8>,
}

/// What retention needs to know of one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSummary {
    pub base_offset: i64,
    /// Offset after the segment's last batch.
    pub next_offset: i64,
    pub size: u64,
    /// The largest batch max timestamp in it, -1 when empty.
    pub max_timestamp: i64,
}

/// One replica's log.
#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    settings: LogSettings,
    segments: BTreeMap<i64, Segment>,
    /// The first offset a reader may ask for; at or after the first segment's base (DeleteRecords
    /// and a leader's moved start put it inside a segment).
    log_start_offset: i64,
    epochs: LeaderEpochCache,
    producers: ProducerStates,
    unflushed_messages: u64,
    /// fsyncs of rolled segments still running on their own threads. As in Kafka, a roll hands
    /// the old segment's flush to the background: done inline it held every append (and the
    /// partition) for as long as the disk took to write up to a whole segment of page cache.
    /// `flush` waits for them, so whatever a flush promised durable is, and so does `close`,
    /// so the clean-shutdown marker still means every segment is on disk.
    rolled_flushes: Vec<std::thread::JoinHandle<()>>,
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir`, recovering after a crash. Returns the log and a
    /// description of anything recovery had to cut.
    pub fn open(dir: &Path, settings: LogSettings) -> Result<(Self, Vec<String>), LogError> {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(|e| LogError::io(dir, e))?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent).map_err(|e| LogError::io(parent, e))?;
            }
        }
        let clean_marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean = clean_marker.exists();
        if clean {
            std::fs::remove_file(&clean_marker).map_err(|e| LogError::io(&clean_marker, e))?;
        }
        let mut bases = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
            let entry = entry.map_err(|e| LogError::io(dir, e))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(stem) = name.strip_suffix(".log") {
                if let Ok(base) = stem.parse::<i64>() {
                    bases.push(base);
                }
            }
        }
        bases.sort_unstable();
        let mut notes = Vec::new();
        let mut segments = BTreeMap::new();
        let mut expected_next: Option<i64> = None;
        let mut cut = false;
        let count = bases.len();
        for (i, base) in bases.into_iter().enumerate() {
            // After a cut, an overlap or a gap, later segments cannot be trusted to follow on:
            // a crash can tear a rolled segment at a batch boundary (no cut to see) while the
            // next one kept what was written after it, leaving offsets no segment holds.
            let gap = expected_next.filter(|&n| base > n);
            if cut || gap.is_some() || expected_next.is_some_and(|n| base < n) {
                let stale = Segment::open(dir, base, false)?.0;
                notes.push(match gap.filter(|_| !cut) {
                    Some(n) => format!(
                        "removed segment {} and any after it: it starts at {base}, but the one before ends at {n}",
                        stale.path().display()
                    ),
                    None => format!(
                        "removed segment {} after a recovery cut",
                        stale.path().display()
                    ),
                });
                stale.delete()?;
                cut = true;
                continue;
            }
            let verify = !clean || i + 1 == count;
            let (seg, seg_cut) = Segment::open(dir, base, verify)?;
            if let Some(c) = seg_cut {
                notes.push(c);
                cut = true;
            }
            expected_next = Some(seg.next_offset());
            segments.insert(base, seg);
        }
        if segments.is_empty() {
            segments.insert(0, Segment::create(dir, 0)?);
        }
        let (epochs, unusable) = match LeaderEpochCache::open(dir) {
            Ok(epochs) => (epochs, None),
            Err(LogError::Corrupt { path, reason }) => {
                (LeaderEpochCache::unwritten(dir), Some((path, reason)))
            }
            Err(e) => return Err(e),
        };
        let log_start_offset = *segments.keys().next().expect("inserted above");
        let mut log = PartitionLog {
            dir: dir.to_path_buf(),
            settings,
            segments,
            log_start_offset,
            epochs,
            producers: ProducerStates::default(),
            unflushed_messages: 0,
            rolled_flushes: Vec::new(),
        };
        if let Some((path, reason)) = unusable {
            // The batches carry their partition leader epochs: the cache can be derived again.
            let headers = log.batch_headers()?;
            log.epochs = LeaderEpochCache::rebuild(
                dir,
                headers
                    .iter()
                    .map(|(_, _, h)| (h.leader_epoch, h.base_offset)),
            )?;
            notes.push(format!(
                "{} is unusable ({reason}); rebuilt it from the batches' partition leader epochs: {:?}",
                path.display(),
                log.epochs
                    .entries()
                    .iter()
                    .map(|e| (e.epoch, e.start_offset))
                    .collect::<Vec<_>>()
            ));
        }
        let leo = log.log_end_offset();
        log.epochs.truncate_from_end(leo)?;
        log.rebuild_producer_states(&mut notes)?;
        Ok((log, notes))
    }

    /// Rebuilds the producer states for the log as it is: from the newest snapshot at or below
    /// the log end, replaying the batches after it (all of them without a snapshot).
    fn rebuild_producer_states(&mut self, notes: &mut Vec<String>) -> Result<(), LogError> {
        let leo = self.log_end_offset();
        producer_state::remove_snapshots_above(&self.dir, leo)?;
        let (mut states, from) =
            producer_state::load_snapshot(&self.dir, leo, self.log_start_offset(), notes)?;
        for seg in self.segments.values() {
            if seg.next_offset() <= from {
                continue;
            }
            let mut pos = 0;
            while pos < seg.size() {
                let h = seg.header_at(pos)?;
                if h.base_offset >= from {
                    states.update(&h);
                }
                pos += h.size as u64;
            }
        }
        self.producers = states;
        Ok(())
    }

    /// The idempotent producers' state in this replica.
    pub fn producer_states(&self) -> &ProducerStates {
        &self.producers
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn set_settings(&mut self, settings: LogSettings) {
        self.settings = settings;
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }

    fn first_segment_base(&self) -> i64 {
        *self
            .segments
            .keys()
            .next()
            .expect("a log always has a segment")
    }

    /// Every segment, oldest first; the last one is the active segment.
    pub fn segments(&self) -> Vec<SegmentSummary> {
        self.segments
            .values()
            .map(|s| SegmentSummary {
                base_offset: s.base_offset,
                next_offset: s.next_offset(),
                size: s.size(),
                max_timestamp: s.max_timestamp(),
            })
            .collect()
    }

    /// Moves the log start forward to `offset` (at most the log end) and deletes the segments
    /// wholly below it; a smaller `offset` changes nothing. Returns whether the start moved.
    pub fn increment_log_start_offset(&mut self, offset: i64) -> Result<bool, LogError> {
        let end = self.log_end_offset();
        if offset > end {
            return Err(LogError::OutOfRange {
                offset,
                start: self.log_start_offset,
                end,
            });
        }
        if offset <= self.log_start_offset {
            return Ok(false);
        }
        self.log_start_offset = offset;
        written(self.epochs.truncate_from_start(offset))?;
        let below: Vec<i64> = self
            .segments
            .iter()
            .zip(self.segments.keys().skip(1))
            .filter(|(_, next_base)| **next_base <= offset)
            .map(|((base, _), _)| *base)
            .collect();
        written(self.delete_segments(&below))?;
        Ok(true)
    }

    /// Deletes the `count` oldest segments, never the active one, and moves the log start to the
    /// first offset left. Returns the new log start.
    pub fn delete_oldest_segments(&mut self, count: usize) -> Result<i64, LogError> {
        let start = self.delete_uploaded_segments(count)?;
        written(self.epochs.truncate_from_start(start))?;
        Ok(start)
    }

    /// Tiered storage's local retention: deletes the `count` oldest segments (never the active
    /// one), which are already uploaded, and moves the local log start to the first offset left.
    /// Unlike [`Self::delete_oldest_segments`] the epoch cache keeps its entries for the deleted
    /// offsets: they are still the partition's, served from the remote store. Returns the new
    /// local log start.
    pub fn delete_uploaded_segments(&mut self, count: usize) -> Result<i64, LogError> {
        let doomed: Vec<i64> = self
            .segments
            .keys()
            .take(count.min(self.segments.len() - 1))
            .copied()
            .collect();
        written(self.delete_segments(&doomed))?;
        self.log_start_offset = self.log_start_offset.max(self.first_segment_base());
        Ok(self.log_start_offset)
    }

    /// The file of the segment starting at `base_offset`, if the log has it.
    pub fn segment_file(&self, base_offset: i64) -> Option<PathBuf> {
        self.segments
            .get(&base_offset)
            .map(|s| s.path().to_path_buf())
    }

    /// The producer state as of `offset` (covering every batch below it, `offset` at most the log
    /// end): the newest snapshot at or below it plus the batches after the snapshot.
    pub fn producer_state_at(&self, offset: i64) -> Result<ProducerStates, LogError> {
        let (mut states, from) = producer_state::load_snapshot(
            &self.dir,
            offset,
            self.log_start_offset,
            &mut Vec::new(),
        )?;
        for seg in self.segments.values() {
            if seg.next_offset() <= from || seg.base_offset >= offset {
                continue;
            }
            let mut pos = 0;
            while pos < seg.size() {
                let h = seg.header_at(pos)?;
                if h.base_offset >= from && h.base_offset < offset {
                    states.update(&h);
                }
                pos += h.size as u64;
            }
        }
        Ok(states)
    }

    /// The newest producer-id reset barrier that opens a leader epoch and names
    /// `source_cluster_id`, as (offset, epoch): a failover writes its barrier as the first batch
    /// of the epoch it bumped to, so only epoch starts need reading.
    pub fn failover_barrier(
        &self,
        source_cluster_id: &str,
    ) -> Result<Option<(i64, i32)>, LogError> {
        for e in self.epochs.entries().iter().rev() {
            if e.start_offset < self.log_start_offset() || e.start_offset >= self.log_end_offset() {
                continue;
            }
            let first = self.read(e.start_offset, i64::MAX, 1)?.records;
            if batch::pid_reset_source(&first).as_deref() == Some(source_cluster_id) {
                return Ok(Some((e.start_offset, e.epoch)));
            }
        }
        Ok(None)
    }

    /// Removes segments (never the active one) and makes the removal durable.
    fn delete_segments(&mut self, bases: &[i64]) -> Result<(), LogError> {
        if bases.is_empty() {
            return Ok(());
        }
        let active = self.active().base_offset;
        for base in bases.iter().filter(|b| **b != active) {
            if let Some(seg) = self.segments.remove(base) {
                seg.delete()?;
            }
        }
        producer_state::remove_snapshots_below(&self.dir, self.first_segment_base())?;
        sync_dir(&self.dir).map_err(|e| LogError::io(&self.dir, e))
    }

    pub fn log_end_offset(&self) -> i64 {
        self.active().next_offset()
    }

    pub fn epochs(&self) -> &LeaderEpochCache {
        &self.epochs
    }

    /// The latest epoch in the cache, or -1.
    pub fn latest_epoch(&self) -> i32 {
        self.epochs.latest().map_or(-1, |e| e.epoch)
    }

    /// Kafka's `endOffsetForEpoch`.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> (i32, i64) {
        self.epochs.end_offset_for(epoch, self.log_end_offset())
    }

    /// Records the start of a new leader epoch at the log end (a new leader does this at once).
    pub fn assign_epoch_start(&mut self, epoch: i32) -> Result<(), LogError> {
        let leo = self.log_end_offset();
        written(self.epochs.assign(epoch, leo))
    }

    fn active(&self) -> &Segment {
        self.segments
            .values()
            .next_back()
            .expect("a log always has a segment")
    }

    /// Appends client batches as leader: offsets are assigned from the log end and each batch is
    /// stamped with `leader_epoch`. Every batch's CRC is checked first; nothing is written unless
    /// all are valid.
    pub fn append_as_leader(
        &mut self,
        records: &[u8],
        leader_epoch: i32,
    ) -> Result<AppendInfo, LogError> {
        let batches = batch::split_batches(records)?;
        if batches.is_empty() {
            return Err(LogError::Invalid("no record batch in request".into()));
        }
        if let Some((_, h)) = batches
            .iter()
            .find(|(_, h)| h.size as u64 > self.settings.max_batch_bytes)
        {
            return Err(LogError::TooLarge {
                size: h.size,
                max: self.settings.max_batch_bytes,
            });
        }
        let headers: Vec<BatchHeader> = batches.iter().map(|(_, h)| *h).collect();
        if let Admission::Duplicate {
            first_offset,
            last_offset,
        } = self.producers.admit(&headers)?
        {
            return Ok(AppendInfo {
                first_offset,
                last_offset,
                duplicate: true,
            });
        }
        let mut next = self.log_end_offset();
        let first = next;
        let mut stamped = Vec::with_capacity(batches.len());
        let mut prefixes = Vec::with_capacity(batches.len());
        for (at, h) in &batches {
            prefixes.push(batch::stamped_prefix(&records[*at..], next, leader_epoch));
            stamped.push((
                *at,
                BatchHeader {
                    base_offset: next,
                    leader_epoch,
                    ..*h
                },
            ));
            next += h.last_offset_delta as i64 + 1;
        }
        // Each batch goes out as its stamped prefix and the rest as received: no copy of the
        // produced records is made to stamp them.
        let parts: Vec<IoSlice> = batches
            .iter()
            .zip(&prefixes)
            .flat_map(|((at, h), prefix)| {
                [
                    IoSlice::new(prefix),
                    IoSlice::new(&records[at + batch::STAMPED_PREFIX..at + h.size]),
                ]
            })
            .collect();
        written(self.append_stamped(&parts, &stamped))?;
        Ok(AppendInfo {
            first_offset: first,
            last_offset: next - 1,
            duplicate: false,
        })
    }

    /// Appends batches exactly as another replica holds them (a follower or a mirror): offsets
    /// and epochs are kept, and must continue from the log end.
    pub fn append_as_follower(&mut self, records: &[u8]) -> Result<Option<AppendInfo>, LogError> {
        let batches = batch::split_batches(records)?;
        let Some((_, first)) = batches.first() else {
            return Ok(None);
        };
        let leo = self.log_end_offset();
        if first.base_offset != leo {
            return Err(LogError::Invalid(format!(
                "replicated batch starts at {} but the log ends at {leo}",
                first.base_offset
            )));
        }
        let mut expect = leo;
        for (_, h) in &batches {
            if h.base_offset != expect {
                return Err(LogError::Invalid(format!(
                    "replicated batch at {} expected {expect}",
                    h.base_offset
                )));
            }
            expect = h.next_offset();
        }
        written(self.append_stamped(&[IoSlice::new(records)], &batches))?;
        Ok(Some(AppendInfo {
            first_offset: leo,
            last_offset: expect - 1,
            duplicate: false,
        }))
    }

    fn append_stamped(
        &mut self,
        parts: &[IoSlice],
        batches: &[(usize, BatchHeader)],
    ) -> Result<(), LogError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let active_size = self.active().size();
        if active_size > 0 && active_size + len as u64 > self.settings.segment_bytes {
            let base = self.log_end_offset();
            self.reap_rolled_flushes(false);
            let rolled = self.active().rolled()?;
            self.rolled_flushes
                .push(std::thread::spawn(move || RolledSegment::flush(rolled)));
            producer_state::write_snapshot(&self.dir, base, &self.producers)?;
            self.segments
                .insert(base, Segment::create(&self.dir, base)?);
        }
        let segment = self
            .segments
            .values_mut()
            .next_back()
            .expect("a log always has a segment");
        segment.append(parts, batches)?;
        let mut messages = 0u64;
        for (_, h) in batches {
            self.producers.update(h);
            // Epoch changes are checkpointed before the append is acknowledged.
            if self
                .epochs
                .latest()
                .is_none_or(|e| e.epoch != h.leader_epoch)
                && h.leader_epoch >= 0
            {
                self.epochs.assign(h.leader_epoch, h.base_offset)?;
            }
            messages += h.last_offset_delta as u64 + 1;
        }
        self.unflushed_messages += messages;
        if self.unflushed_messages >= self.settings.flush_interval_messages {
            self.flush();
        }
        Ok(())
    }

    /// fsyncs the active segment, after the rolled segments' background flushes have finished.
    pub fn flush(&mut self) {
        self.reap_rolled_flushes(true);
        self.active().flush();
        self.unflushed_messages = 0;
    }

    /// Collects the rolled segments' flushes that have finished, or all of them with `wait` (a
    /// failed one has halted the process).
    fn reap_rolled_flushes(&mut self, wait: bool) {
        for flush in std::mem::take(&mut self.rolled_flushes) {
            if !wait && !flush.is_finished() {
                self.rolled_flushes.push(flush);
                continue;
            }
            flush.join().expect("a segment flush does not panic");
        }
    }

    /// Reads whole batches starting with the one that holds `offset`, stopping before
    /// `max_offset` (exclusive; the high watermark for consumers) and after `max_bytes`, but always
    /// returning at least one batch when one is available. Each segment's part is read with one
    /// read call and then cut at the last whole batch that qualifies: a read per batch made a
    /// large fetch (a mirror's, a follower's catching up) cost two calls per batch.
    pub fn read(
        &self,
        offset: i64,
        max_offset: i64,
        max_bytes: usize,
    ) -> Result<ReadResult, LogError> {
        let (start, end) = (self.log_start_offset(), self.log_end_offset());
        if offset < start || offset > end {
            return Err(LogError::OutOfRange { offset, start, end });
        }
        let mut out = Vec::new();
        for seg in self
            .segments
            .range(..=offset)
            .next_back()
            .into_iter()
            .map(|(_, s)| s)
            .chain(self.segments.range(offset + 1..).map(|(_, s)| s))
        {
            let Some((pos, h)) = seg.find(offset)? else {
                continue;
            };
            let budget = if out.is_empty() {
                max_bytes.max(h.size)
            } else {
                max_bytes.saturating_sub(out.len())
            };
            if h.last_offset() >= max_offset || h.size > budget {
                break;
            }
            let want = ((seg.size() - pos) as usize).min(budget);
            let at = out.len();
            seg.read_into(pos, want, &mut out)?;
            let kept =
                whole_batches_below(&out[at..], max_offset).map_err(|e| LogError::Corrupt {
                    path: seg.path().to_path_buf(),
                    reason: format!("at position {pos}: {e}"),
                })?;
            out.truncate(at + kept);
            if kept < want || pos + (want as u64) < seg.size() {
                break;
            }
        }
        Ok(ReadResult { records: out })
    }

    /// Removes every batch at or after `offset` and the epochs that started there.
    pub fn truncate_to(&mut self, offset: i64) -> Result<(), LogError> {
        written(self.truncate_log_to(offset))
    }

    fn truncate_log_to(&mut self, offset: i64) -> Result<(), LogError> {
        if offset >= self.log_end_offset() {
            // Epochs that start at the log end hold no records yet; they go too, or a follower
            // asking its leader about them would get the same answer forever.
            return self.epochs.truncate_from_end(offset);
        }
        // Below the local log start nothing of ours is left to keep; at it, the log empties but
        // the epochs below stay (Kafka's `truncateTo`): with tiered storage they are the epochs
        // of the offsets in the remote store.
        if offset < self.log_start_offset() {
            return self.truncate_fully_and_start_at(offset.max(0));
        }
        let doomed: Vec<i64> = self.segments.range(offset..).map(|(b, _)| *b).collect();
        let first = self.first_segment_base();
        for base in doomed {
            if base == first {
                continue;
            }
            let seg = self.segments.remove(&base).expect("listed above");
            seg.delete()?;
        }
        let seg = self
            .segments
            .values_mut()
            .next_back()
            .expect("a log always has a segment");
        seg.truncate_to(offset)?;
        seg.flush();
        // What is left is durable, as it was when rolls flushed inline.
        self.reap_rolled_flushes(true);
        let leo = self.log_end_offset();
        self.epochs.truncate_from_end(leo)?;
        self.rebuild_producer_states(&mut Vec::new())
    }

    /// Deletes everything and starts empty at `offset`.
    pub fn truncate_fully_and_start_at(&mut self, offset: i64) -> Result<(), LogError> {
        written(self.empty_and_start_at(offset))
    }

    fn empty_and_start_at(&mut self, offset: i64) -> Result<(), LogError> {
        for (_, seg) in std::mem::take(&mut self.segments) {
            seg.delete()?;
        }
        self.segments
            .insert(offset, Segment::create(&self.dir, offset)?);
        producer_state::remove_snapshots_above(&self.dir, i64::MIN)?;
        self.producers = ProducerStates::default();
        self.log_start_offset = offset;
        self.epochs.clear()
    }

    /// A follower's start from the remote store: deletes everything and starts empty at
    /// `offset` with the leader's epoch cache up to there and the producer state as of there
    /// (both from the remote segment ending before `offset`).
    pub fn start_after_remote(
        &mut self,
        offset: i64,
        epochs: &[epoch_cache::EpochEntry],
        producers: ProducerStates,
    ) -> Result<(), LogError> {
        self.truncate_fully_and_start_at(offset)?;
        for e in epochs.iter().filter(|e| e.start_offset < offset) {
            written(self.epochs.assign(e.epoch, e.start_offset))?;
        }
        written(producer_state::write_snapshot(
            &self.dir, offset, &producers,
        ))?;
        self.producers = producers;
        Ok(())
    }

    /// Every batch header in the log, in order (for dumps and tests).
    pub fn batch_headers(&self) -> Result<Vec<(u64, i64, BatchHeader)>, LogError> {
        let mut out = Vec::new();
        for seg in self.segments.values() {
            let mut pos = 0;
            while pos < seg.size() {
                let h = seg.header_at(pos)?;
                out.push((pos, seg.base_offset, h));
                pos += h.size as u64;
            }
        }
        Ok(out)
    }

    /// Reads the raw bytes of every batch (for dumps).
    pub fn read_all(&self) -> Result<Vec<u8>, LogError> {
        let mut out = Vec::new();
        for seg in self.segments.values() {
            out.extend_from_slice(&seg.read(0, seg.size() as usize)?);
        }
        Ok(out)
    }

    /// Flushes and marks the log cleanly closed.
    pub fn close(mut self) -> Result<(), LogError> {
        self.flush();
        producer_state::write_snapshot(&self.dir, self.log_end_offset(), &self.producers)?;
        let marker = self.dir.join(CLEAN_SHUTDOWN_FILE);
        std::fs::write(&marker, b"").map_err(|e| LogError::io(&marker, e))
    }
}

/// Builds record batches for tests (unit tests here and the property tests).
pub mod testing {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    /// One v2 batch holding `values`, with base offset 0 and epoch -1 (the producer's view),
    /// stamped with the current time as a producer would (so retention does not expire it).
    pub fn batch(values: &[&[u8]]) -> Vec<u8> {
        idempotent_batch(values, -1, -1, -1)
    }

    /// One v2 batch of an idempotent producer: `values` at sequences `base_sequence`, … (a
    /// producer id of -1 makes a plain batch).
    pub fn idempotent_batch(
        values: &[&[u8]],
        producer_id: i64,
        producer_epoch: i16,
        base_sequence: i32,
    ) -> Vec<u8> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id,
                producer_epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                // The encoder starts a new batch unless offset − sequence is constant.
                sequence: if producer_id < 0 {
                    i as i32 - 1
                } else {
                    base_sequence + i as i32
                },
                timestamp: now_ms + i as i64,
                key: None,
                value: Some(Bytes::copy_from_slice(v)),
                headers: IndexMap::new(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let opts = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &opts).expect("encode batch");
        buf.to_vec()
    }

    /// The offset after the last batch in raw batch bytes (0 for none).
    pub fn next_offset(mut bytes: &[u8]) -> i64 {
        let mut next = 0;
        while !bytes.is_empty() {
            let h = super::batch::parse_header(bytes).expect("valid header");
            next = h.next_offset();
            bytes = &bytes[h.size..];
        }
        next
    }

    /// The values of the data records in raw batch bytes, with their offsets and epochs;
    /// control batches are skipped, as consumers skip them.
    pub fn values(mut bytes: &[u8]) -> Vec<(i64, Vec<u8>, i32)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let h = super::batch::parse_header(bytes).expect("valid header");
            if h.is_control {
                bytes = &bytes[h.size..];
                continue;
            }
            let mut b = Bytes::copy_from_slice(&bytes[..h.size]);
            let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut b).expect("decode");
            for r in set.records {
                out.push((
                    r.offset,
                    r.value.map(|v| v.to_vec()).unwrap_or_default(),
                    h.leader_epoch,
                ));
            }
            bytes = &bytes[h.size..];
        }
        out
    }
}

/// The length of the leading whole batches of `buf` whose last offsets are below `max_offset`.
fn whole_batches_below(buf: &[u8], max_offset: i64) -> Result<usize, batch::BatchError> {
    let mut kept = 0;
    while buf.len() - kept >= batch::HEADER_LEN {
        let h = batch::parse_header(&buf[kept..])?;
        if h.size > buf.len() - kept || h.last_offset() >= max_offset {
            break;
        }
        kept += h.size;
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::testing::{batch, values};
    use super::*;

    fn settings() -> LogSettings {
        LogSettings {
            segment_bytes: 1024,
            flush_interval_messages: u64::MAX,
            max_batch_bytes: u64::MAX,
        }
    }

    fn append_n(log: &mut PartitionLog, n: usize, epoch: i32) {
        for i in 0..n {
            let v = format!("v{i}");
            log.append_as_leader(&batch(&[v.as_bytes(), b"x"]), epoch)
                .unwrap();
        }
    }

    /// Found by a tiered run of the correct broker: a follower whose local retention had
    /// deleted every segment below 366 truncated to 366 (its new leader's epoch start) and lost
    /// the epochs of the offsets below, which the remote store still serves.
    #[test]
    fn truncating_to_the_local_log_start_keeps_the_epochs_below_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        append_n(&mut log, 40, 0);
        append_n(&mut log, 20, 1);
        assert!(log.segments().len() > 2);
        let local_start = log.delete_uploaded_segments(2).unwrap();
        assert!(local_start > 0);
        log.truncate_to(local_start).unwrap();
        assert_eq!(log.log_start_offset(), local_start);
        assert_eq!(log.log_end_offset(), local_start);
        let epochs: Vec<(i32, i64)> = log
            .epochs()
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect();
        assert_eq!(epochs, [(0, 0)]);
        log.append_as_leader(&batch(&[b"y"]), 2).unwrap();
        assert_eq!(log.log_end_offset(), local_start + 1);
    }

    #[test]
    fn a_failover_barrier_ends_the_producers_before_it_and_opens_its_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        log.append_as_leader(&testing::idempotent_batch(&[b"1"], 7, 0, 0), 1)
            .unwrap();
        assert!(log.producer_states().get(7).is_some());
        assert_eq!(log.failover_barrier("a").unwrap(), None);
        let barrier = batch::mirror_pid_reset_batch("a", 0);
        assert_eq!(log.append_as_leader(&barrier, 2).unwrap().first_offset, 1);
        assert!(log.producer_states().is_empty());
        log.append_as_leader(&testing::idempotent_batch(&[b"2"], 8, 0, 0), 2)
            .unwrap();
        assert_eq!(log.failover_barrier("a").unwrap(), Some((1, 2)));
        assert_eq!(log.failover_barrier("b").unwrap(), None);
        // Loaded from the segments alone, the state starts at the barrier too.
        drop(log);
        let (log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert!(log.producer_states().get(7).is_none());
        assert!(log.producer_states().get(8).is_some());
    }

    #[test]
    fn append_read_assigns_offsets_and_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        let a = log.append_as_leader(&batch(&[b"a", b"b"]), 3).unwrap();
        assert_eq!(
            a,
            AppendInfo {
                first_offset: 0,
                last_offset: 1,
                duplicate: false,
            }
        );
        let b = log.append_as_leader(&batch(&[b"c"]), 5).unwrap();
        assert_eq!(b.first_offset, 2);
        assert_eq!(log.log_end_offset(), 3);
        let read = log.read(0, i64::MAX, 1 << 20).unwrap();
        assert_eq!(
            values(&read.records),
            vec![
                (0, b"a".to_vec(), 3),
                (1, b"b".to_vec(), 3),
                (2, b"c".to_vec(), 5)
            ]
        );
        // Reading from the middle of a batch returns the whole batch; the max offset cuts.
        assert_eq!(values(&log.read(1, i64::MAX, 1).unwrap().records).len(), 2);
        assert!(log.read(0, 2, 1 << 20).unwrap().records.len() < read.records.len());
        assert!(matches!(
            log.read(4, i64::MAX, 10),
            Err(LogError::OutOfRange { .. })
        ));
        assert_eq!(log.epochs().entries().len(), 2);
        assert_eq!(log.end_offset_for_epoch(3), (3, 2));
    }

    #[test]
    fn rolls_segments_and_reads_across_them() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        append_n(&mut log, 40, 0);
        assert!(log.segments.len() > 2, "segments: {}", log.segments.len());
        let all = values(&log.read(0, i64::MAX, usize::MAX).unwrap().records);
        assert_eq!(all.len(), 80);
        assert!(all.iter().enumerate().all(|(i, (o, _, _))| *o == i as i64));
        let from_middle = values(&log.read(51, i64::MAX, usize::MAX).unwrap().records);
        assert_eq!(from_middle.first().unwrap().0, 50);
        log.close().unwrap();
        let (log, notes) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(log.log_end_offset(), 80);
    }

    /// A read is the run of whole batches from the one holding `offset`, across segments,
    /// each below `max_offset`, within `max_bytes` except for the first: checked against that
    /// rule batch by batch for every start, bound and size.
    #[test]
    fn reads_are_the_whole_batches_the_bounds_allow() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        // Batches of one to three records, so sizes and offsets vary.
        for i in 0..30 {
            let vs: Vec<Vec<u8>> = (0..=i % 3)
                .map(|j| format!("v{i}-{j}").into_bytes())
                .collect();
            let vs: Vec<&[u8]> = vs.iter().map(Vec::as_slice).collect();
            log.append_as_leader(&batch(&vs), 1).unwrap();
        }
        assert!(log.segments.len() > 2, "segments: {}", log.segments.len());
        let all = log.read(0, i64::MAX, usize::MAX).unwrap().records;
        let batches: Vec<(usize, BatchHeader)> = batch::split_batches(&all).unwrap();
        let leo = log.log_end_offset();
        for offset in 0..=leo {
            for max_offset in [offset, offset + 1, offset + 4, leo - 1, leo] {
                for max_bytes in [1, 60, 200, 700, 5000] {
                    let mut want = Vec::new();
                    for (at, h) in batches.iter().filter(|(_, h)| h.last_offset() >= offset) {
                        if h.last_offset() >= max_offset
                            || (!want.is_empty() && want.len() + h.size > max_bytes)
                        {
                            break;
                        }
                        want.extend_from_slice(&all[*at..at + h.size]);
                    }
                    let got = log.read(offset, max_offset, max_bytes).unwrap().records;
                    assert!(
                        got == want,
                        "offset {offset}, max_offset {max_offset}, max_bytes {max_bytes}: {} bytes, not {}",
                        got.len(),
                        want.len()
                    );
                }
            }
        }
    }

    #[test]
    fn log_start_moves_forward_deleting_whole_segments_only() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        append_n(&mut log, 20, 1);
        append_n(&mut log, 20, 2);
        let segs = log.segments();
        assert!(segs.len() > 3, "{segs:?}");
        let inside = segs[2].base_offset + 1;
        assert!(log.increment_log_start_offset(inside).unwrap());
        assert_eq!(log.log_start_offset(), inside);
        assert_eq!(log.segments()[0].base_offset, segs[2].base_offset);
        assert!(
            !log.increment_log_start_offset(3).unwrap(),
            "never backwards"
        );
        assert!(matches!(
            log.read(inside - 1, i64::MAX, 1),
            Err(LogError::OutOfRange { .. })
        ));
        // A read at the start returns the whole batch holding it.
        let first = values(&log.read(inside, i64::MAX, 1).unwrap().records);
        assert_eq!(first[0].0, inside - 1);
        assert!(log.increment_log_start_offset(81).is_err());
        // Retention: the active segment always stays.
        let n = log.segments().len();
        let start = log.delete_oldest_segments(n + 5).unwrap();
        assert_eq!(log.segments().len(), 1);
        assert_eq!(start, log.segments()[0].base_offset);
        assert_eq!(log.epochs().entries()[0].start_offset, start);
        assert_eq!(log.log_end_offset(), 80);
        log.close().unwrap();
        let (log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert_eq!(log.log_start_offset(), start);
    }

    #[test]
    fn truncate_removes_tail_and_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        append_n(&mut log, 20, 1);
        append_n(&mut log, 20, 2);
        log.truncate_to(30).unwrap();
        assert_eq!(log.log_end_offset(), 30);
        assert_eq!(log.latest_epoch(), 1);
        // Truncating inside a batch removes the whole batch.
        log.truncate_to(7).unwrap();
        assert_eq!(log.log_end_offset(), 6);
        let after = log.append_as_leader(&batch(&[b"z"]), 4).unwrap();
        assert_eq!(after.first_offset, 6);
        log.truncate_to(0).unwrap();
        assert_eq!(log.log_end_offset(), 0);
        assert!(log.epochs().entries().is_empty());
    }

    /// A crash that tore a rolled segment exactly at a batch boundary leaves no cut to see, and
    /// the next segment starts past where it now ends: those offsets are gone from every file,
    /// so the segments after the gap go too (found by the log's property test).
    #[test]
    fn recovery_removes_segments_after_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        while log.segments.len() < 2 {
            log.append_as_leader(&batch(&[b"0123456789"]), 0).unwrap();
        }
        log.append_as_leader(&batch(&[b"next"]), 0).unwrap();
        let headers = log.batch_headers().unwrap();
        let first = *log.segments.keys().next().unwrap();
        let (pos, _, last) = headers
            .iter()
            .rfind(|(_, base, _)| *base == first)
            .copied()
            .unwrap();
        let torn = log.segments[&first].path().to_path_buf();
        drop(log);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&torn)
            .unwrap()
            .set_len(pos)
            .unwrap();
        let (log, notes) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert_eq!(log.log_end_offset(), last.base_offset, "{notes:?}");
        assert_eq!(log.segments.len(), 1);
        assert!(
            notes
                .iter()
                .any(|n| n.contains("but the one before ends at")),
            "{notes:?}"
        );
        let read = values(&log.read(0, i64::MAX, usize::MAX).unwrap().records);
        assert!(read.iter().enumerate().all(|(i, (o, _, _))| *o == i as i64));
        assert_eq!(read.len() as i64, last.base_offset);
    }

    #[test]
    fn recovery_cuts_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        log.append_as_leader(&batch(&[b"a"]), 0).unwrap();
        log.append_as_leader(&batch(&[b"b"]), 0).unwrap();
        let seg_path = log.active().path().to_path_buf();
        drop(log);
        let len = std::fs::metadata(&seg_path).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&seg_path)
            .unwrap();
        f.set_len(len - 3).unwrap();
        let (log, notes) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert_eq!(log.log_end_offset(), 1);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(
            values(&log.read(0, i64::MAX, usize::MAX).unwrap().records).len(),
            1
        );
    }

    #[test]
    fn recovery_cuts_corrupt_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        log.append_as_leader(&batch(&[b"a"]), 0).unwrap();
        log.append_as_leader(&batch(&[b"bbbbbbbb"]), 0).unwrap();
        log.append_as_leader(&batch(&[b"c"]), 0).unwrap();
        let seg_path = log.active().path().to_path_buf();
        drop(log);
        let mut bytes = std::fs::read(&seg_path).unwrap();
        let first = batch::parse_header(&bytes).unwrap().size;
        bytes[first + 70] ^= 0xff;
        std::fs::write(&seg_path, &bytes).unwrap();
        let (log, notes) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert_eq!(
            log.log_end_offset(),
            1,
            "everything from the corrupt batch on is cut"
        );
        assert!(notes[0].contains("CRC"), "{notes:?}");
    }

    #[test]
    fn garbage_epoch_checkpoint_is_rebuilt_from_the_batches() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        append_n(&mut log, 3, 0);
        append_n(&mut log, 2, 4);
        let want = log.epochs().entries().to_vec();
        log.close().unwrap();
        let checkpoint = dir.path().join(epoch_cache::CHECKPOINT_FILE);
        std::fs::write(&checkpoint, "0\n2\nseven 0\n").unwrap();
        let (log, notes) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert_eq!(log.epochs().entries(), want);
        assert_eq!(log.log_end_offset(), 10);
        assert!(
            notes.len() == 1
                && notes[0].contains("bad epoch `seven`")
                && notes[0].contains("rebuilt"),
            "{notes:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&checkpoint).unwrap(),
            "0\n2\n0 0\n4 6\n"
        );
    }

    #[test]
    fn recovery_cuts_a_batch_whose_record_count_lies() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        log.append_as_leader(&batch(&[b"a"]), 0).unwrap();
        log.append_as_leader(&batch(&[b"b", b"c"]), 0).unwrap();
        log.append_as_leader(&batch(&[b"d"]), 0).unwrap();
        let seg_path = log.active().path().to_path_buf();
        drop(log);
        let bytes = std::fs::read(&seg_path).unwrap();
        let first = batch::parse_header(&bytes).unwrap().size;
        let second = batch::parse_header(&bytes[first..]).unwrap().size;
        let mut lying = bytes[..first].to_vec();
        lying.extend(batch::tests::with_count(
            bytes[first..first + second].to_vec(),
            3,
        ));
        lying.extend(&bytes[first + second..]);
        std::fs::write(&seg_path, &lying).unwrap();
        let (log, notes) = PartitionLog::open(dir.path(), settings()).unwrap();
        assert_eq!(log.log_end_offset(), 1, "cut at the lying batch: {notes:?}");
        assert!(notes[0].contains("declares 3 records"), "{notes:?}");
    }

    #[test]
    fn rejects_corrupt_client_batch_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), settings()).unwrap();
        let mut good = batch(&[b"a"]);
        good.extend(batch(&[b"b"]));
        let n = good.len();
        good[n - 2] ^= 1;
        assert!(matches!(
            log.append_as_leader(&good, 0),
            Err(LogError::InvalidRecords(batch::BatchError::Crc { .. }))
        ));
        assert_eq!(log.log_end_offset(), 0);
        assert!(log.append_as_leader(&good[..20], 0).is_err());
    }

    #[test]
    fn follower_append_keeps_offsets_and_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let (mut leader, _) = PartitionLog::open(&dir.path().join("l"), settings()).unwrap();
        leader.append_as_leader(&batch(&[b"a", b"b"]), 2).unwrap();
        leader.append_as_leader(&batch(&[b"c"]), 7).unwrap();
        let bytes = leader.read(0, i64::MAX, usize::MAX).unwrap().records;
        let (mut follower, _) = PartitionLog::open(&dir.path().join("f"), settings()).unwrap();
        follower.append_as_follower(&bytes).unwrap();
        assert_eq!(follower.epochs().entries(), leader.epochs().entries());
        assert_eq!(follower.read_all().unwrap(), bytes);
        assert!(
            follower.append_as_follower(&bytes).is_err(),
            "must continue from the log end"
        );
    }

    #[test]
    fn followers_build_the_leaders_producer_state_and_truncation_rebuilds_it() {
        use testing::idempotent_batch;
        let dir = tempfile::tempdir().unwrap();
        let small = LogSettings {
            segment_bytes: 300,
            ..settings()
        };
        let (mut leader, _) = PartitionLog::open(&dir.path().join("l"), small).unwrap();
        for seq in 0..10 {
            leader
                .append_as_leader(&idempotent_batch(&[b"v"], 7, 0, seq), 1)
                .unwrap();
        }
        assert!(
            producer_state::snapshot_offsets(leader.dir())
                .unwrap()
                .len()
                > 1,
            "segment rolls take snapshots"
        );
        let bytes = leader.read(0, i64::MAX, usize::MAX).unwrap().records;
        let (mut follower, _) = PartitionLog::open(&dir.path().join("f"), small).unwrap();
        follower.append_as_follower(&bytes).unwrap();
        assert_eq!(follower.producer_states(), leader.producer_states());
        assert_eq!(follower.producer_states().get(7).unwrap().batches.len(), 5);

        // Cut below the newest snapshots: the state is what the first six batches leave.
        follower.truncate_to(6).unwrap();
        let (mut replay, _) = PartitionLog::open(&dir.path().join("r"), small).unwrap();
        for seq in 0..6 {
            replay
                .append_as_leader(&idempotent_batch(&[b"v"], 7, 0, seq), 1)
                .unwrap();
        }
        assert_eq!(follower.producer_states(), replay.producer_states());
        // The truncated batch 6 is new again, not a duplicate.
        let again = follower
            .append_as_leader(&idempotent_batch(&[b"v"], 7, 0, 6), 2)
            .unwrap();
        assert_eq!((again.first_offset, again.duplicate), (6, false));

        // Reopened after a crash (no clean-shutdown marker), the state is rebuilt the same.
        let expected = follower.producer_states().clone();
        drop(follower);
        let (reopened, _) = PartitionLog::open(&dir.path().join("f"), small).unwrap();
        assert_eq!(reopened.producer_states(), &expected);
    }

    /// Found by the harness (a correct tiered run, `producer-state-divergence`): the state
    /// uploaded with a segment came from the batches left locally once the snapshot at the
    /// segment's end had been pruned, so a producer idle since a segment local retention had
    /// deleted was missing from it, and from every follower that started from it.
    #[test]
    fn the_state_as_of_a_segments_end_keeps_a_producer_idle_since_deleted_segments() {
        use testing::idempotent_batch;
        let dir = tempfile::tempdir().unwrap();
        let small = LogSettings {
            segment_bytes: 300,
            ..settings()
        };
        let (mut log, _) = PartitionLog::open(dir.path(), small).unwrap();
        log.append_as_leader(&idempotent_batch(&[b"v"], 7, 0, 0), 1)
            .unwrap();
        for seq in 0..40 {
            log.append_as_leader(&idempotent_batch(&[b"v"], 8, 0, seq), 1)
                .unwrap();
        }
        let bases: Vec<i64> = log.segments.keys().copied().collect();
        assert!(bases.len() >= 8, "{bases:?}");
        // Local retention takes the first two segments, producer 7's among them; the state as
        // of the end of the next one, to be uploaded with it many rolls later, still knows
        // producer 7.
        log.delete_uploaded_segments(2).unwrap();
        let at = bases[3];
        let state = log.producer_state_at(at).unwrap();
        assert!(state.get(7).is_some(), "producer 7 lost as of {at}");
        assert_eq!(
            state.get(8).unwrap().batches.back().map(|b| b.last_seq),
            Some((at - 2) as i32)
        );
        assert!(producer_state::snapshot_offsets(log.dir())
            .unwrap()
            .iter()
            .all(|s| *s >= log.log_start_offset()));
    }
}
