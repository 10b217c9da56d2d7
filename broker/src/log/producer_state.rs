//! The idempotent producer's state in one replica (Kafka's `ProducerStateManager`): for every
//! producer id seen in the log, its epoch and the sequences and offsets of its last five batches.
//! A leader checks each producer batch against it before appending (a retried batch is found
//! and answered with its original offsets instead of being written twice; a gap in the
//! sequences or an older epoch is refused); every replica, leader or follower, updates it from
//! the batches it appends, so followers hold the same state as their leader. It is derived from
//! the log alone: snapshots (`<20-digit offset>.snapshot`, taken at segment rolls and on clean
//! shutdown) save rescanning the batches before their offset, and one is kept for every segment
//! until the segment goes (as Kafka keeps them): tiered storage uploads the state as of a
//! segment's end with it, long after the roll, when local retention may already have deleted
//! the batches an idle producer last wrote.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::batch::BatchHeader;
use super::segment::file_name;
use super::LogError;

/// Batches remembered per producer: a producer has at most five requests in flight, so a retry
/// is always of one of its last five batches.
pub const CACHED_BATCHES: usize = 5;

const SNAPSHOT_EXT: &str = "snapshot";

/// Where one producer batch was appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMetadata {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// One producer's state in this replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerEntry {
    pub producer_id: i64,
    pub epoch: i16,
    /// Oldest first, at most [`CACHED_BATCHES`].
    pub batches: VecDeque<BatchMetadata>,
}

impl ProducerEntry {
    fn last_seq(&self) -> Option<i32> {
        self.batches.back().map(|b| b.last_seq)
    }
}

/// Why a leader refuses a producer batch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    #[error("{0}")]
    OutOfOrderSequence(String),
    #[error("{0}")]
    InvalidProducerEpoch(String),
    #[error("{0}")]
    Transactional(String),
}

/// What a leader should do with the batches of one produce request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Append them.
    Append,
    /// A retry of a batch already in the log at these offsets: answer with them, append nothing.
    Duplicate { first_offset: i64, last_offset: i64 },
}

/// Kafka's `inSequence`: `next` follows `last`, wrapping after `i32::MAX`.
fn in_sequence(last: i32, next: i32) -> bool {
    i64::from(next) == i64::from(last) + 1 || (next == 0 && last == i32::MAX)
}

/// The snapshot file's content.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    /// The state covers every batch below this offset.
    offset: i64,
    producers: Vec<ProducerEntry>,
}

/// Every producer's state in one replica.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerStates {
    producers: BTreeMap<i64, ProducerEntry>,
}

impl ProducerStates {
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Every producer's state, by producer id.
    pub fn iter(&self) -> impl Iterator<Item = &ProducerEntry> {
        self.producers.values()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// A leader's checks of a request's batches, in order (Kafka's
    /// `analyzeAndValidateProducerState` for a client append). Pure.
    pub fn admit(&self, batches: &[BatchHeader]) -> Result<Admission, ProducerError> {
        // Batches of one request may chain sequences of the same producer.
        let mut seen: BTreeMap<i64, (i16, Option<i32>)> = BTreeMap::new();
        for h in batches {
            if h.is_transactional {
                return Err(ProducerError::Transactional(
                    "transactional batches are not supported by this broker".into(),
                ));
            }
            if h.producer_id < 0 {
                continue;
            }
            let entry = self.producers.get(&h.producer_id);
            if let Some(dup) = entry.filter(|e| e.epoch == h.producer_epoch).and_then(|e| {
                e.batches
                    .iter()
                    .find(|b| b.first_seq == h.base_sequence && b.last_seq == h.last_sequence())
            }) {
                return Ok(Admission::Duplicate {
                    first_offset: dup.first_offset,
                    last_offset: dup.last_offset,
                });
            }
            let current = seen
                .get(&h.producer_id)
                .copied()
                .or_else(|| entry.map(|e| (e.epoch, e.last_seq())));
            let Some((epoch, last_seq)) = current else {
                // A producer this replica has no state for (new, or its batches are gone):
                // any sequence starts it, as in Kafka.
                seen.insert(h.producer_id, (h.producer_epoch, Some(h.last_sequence())));
                continue;
            };
            if h.producer_epoch < epoch {
                return Err(ProducerError::InvalidProducerEpoch(format!(
                    "producer {} epoch {} is older than the current epoch {epoch}",
                    h.producer_id, h.producer_epoch
                )));
            }
            if h.producer_epoch != epoch {
                if h.base_sequence != 0 {
                    return Err(ProducerError::OutOfOrderSequence(format!(
                        "producer {}: a new epoch {} must start at sequence 0, not {}",
                        h.producer_id, h.producer_epoch, h.base_sequence
                    )));
                }
            } else {
                let last = last_seq.unwrap_or(-1);
                if !in_sequence(last, h.base_sequence) {
                    return Err(ProducerError::OutOfOrderSequence(format!(
                        "producer {} epoch {}: sequence {} does not follow {last}",
                        h.producer_id, h.producer_epoch, h.base_sequence
                    )));
                }
            }
            seen.insert(h.producer_id, (h.producer_epoch, Some(h.last_sequence())));
        }
        Ok(Admission::Append)
    }

    /// Records an appended batch (with its final offsets), on leaders and followers alike: a
    /// new epoch starts the producer's batch cache afresh. Pure.
    pub fn update(&mut self, h: &BatchHeader) {
        if h.is_pid_reset {
            // KIP-1279's barrier: the producers before it belong to the cluster mirrored from.
            self.producers.clear();
            return;
        }
        if h.producer_id < 0 || h.is_control {
            return;
        }
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
                batches: VecDeque::new(),
            });
        if entry.epoch != h.producer_epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        entry.batches.push_back(BatchMetadata {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            first_offset: h.base_offset,
            last_offset: h.last_offset(),
        });
        while entry.batches.len() > CACHED_BATCHES {
            entry.batches.pop_front();
        }
    }
}

fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(file_name(offset, SNAPSHOT_EXT))
}

/// The offsets of the snapshots in `dir`, ascending.
pub fn snapshot_offsets(dir: &Path) -> Result<Vec<i64>, LogError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
        let entry = entry.map_err(|e| LogError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(offset) = name
            .strip_suffix(&format!(".{SNAPSHOT_EXT}"))
            .and_then(|stem| stem.parse::<i64>().ok())
        {
            out.push(offset);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The snapshot file's bytes for the state as of `offset` (tiered storage uploads them with the
/// segment ending there).
pub fn encode_snapshot(offset: i64, states: &ProducerStates) -> Result<Vec<u8>, LogError> {
    let snapshot = Snapshot {
        offset,
        producers: states.producers.values().cloned().collect(),
    };
    serde_json::to_vec(&snapshot).map_err(|e| LogError::Invalid(e.to_string()))
}

/// Parses a snapshot file's bytes: the offset it covers up to and the state.
pub fn decode_snapshot(bytes: &[u8]) -> Result<(i64, ProducerStates), String> {
    let snap: Snapshot = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let producers = snap
        .producers
        .into_iter()
        .map(|p| (p.producer_id, p))
        .collect();
    Ok((snap.offset, ProducerStates { producers }))
}

/// Writes the state as of `offset` (it covers every batch below it), durably.
pub fn write_snapshot(dir: &Path, offset: i64, states: &ProducerStates) -> Result<(), LogError> {
    let path = snapshot_path(dir, offset);
    let bytes = encode_snapshot(offset, states)?;
    crate::durable::replace_file(&path, &bytes).map_err(|e| LogError::io(&path, e))
}

/// Removes the snapshots below `offset` (the log's first segment starts there: they describe
/// batches it no longer holds).
pub fn remove_snapshots_below(dir: &Path, offset: i64) -> Result<(), LogError> {
    for s in snapshot_offsets(dir)? {
        if s < offset {
            remove_snapshot(dir, s)?;
        }
    }
    Ok(())
}

fn remove_snapshot(dir: &Path, offset: i64) -> Result<(), LogError> {
    let path = snapshot_path(dir, offset);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(LogError::io(&path, e)),
        _ => Ok(()),
    }
}

/// Reads the snapshot taken at `offset` and changes nothing (for `dump-log`, which may read the
/// directory of a running broker): the state, or why it cannot be used.
pub fn read_snapshot(dir: &Path, offset: i64) -> Result<ProducerStates, String> {
    let path = snapshot_path(dir, offset);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    match decode_snapshot(&bytes) {
        Ok((claimed, states)) if claimed == offset => Ok(states),
        Ok((claimed, _)) => Err(format!("{} claims offset {claimed}", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Removes the snapshots above `offset` (the log was cut there, so they describe batches it no
/// longer holds).
pub fn remove_snapshots_above(dir: &Path, offset: i64) -> Result<(), LogError> {
    for s in snapshot_offsets(dir)? {
        if s > offset {
            remove_snapshot(dir, s)?;
        }
    }
    Ok(())
}

/// Loads the newest readable snapshot at or below `offset`: the state and the offset from which
/// the batches must be replayed. An unreadable snapshot is removed and reported in `notes`;
/// without any, the state starts empty and replay starts at `log_start`.
pub fn load_snapshot(
    dir: &Path,
    offset: i64,
    log_start: i64,
    notes: &mut Vec<String>,
) -> Result<(ProducerStates, i64), LogError> {
    for s in snapshot_offsets(dir)?.into_iter().rev() {
        if s > offset || s < log_start {
            continue;
        }
        let path = snapshot_path(dir, s);
        let parsed = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Snapshot>(&b).map_err(|e| e.to_string()));
        match parsed {
            Ok(snap) if snap.offset == s => {
                let producers = snap
                    .producers
                    .into_iter()
                    .map(|p| (p.producer_id, p))
                    .collect();
                return Ok((ProducerStates { producers }, s));
            }
            Ok(snap) => notes.push(format!(
                "{} claims offset {}: removed, producer state rebuilt from the batches",
                path.display(),
                snap.offset
            )),
            Err(e) => notes.push(format!(
                "{} is unusable ({e}): removed, producer state rebuilt from the batches",
                path.display()
            )),
        }
        remove_snapshot(dir, s)?;
    }
    Ok((ProducerStates::default(), log_start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, seq: i32, records: i32, offset: i64) -> BatchHeader {
        BatchHeader {
            base_offset: offset,
            size: 100,
            leader_epoch: 0,
            last_offset_delta: records - 1,
            record_count: records,
            max_timestamp: 0,
            is_control: false,
            is_pid_reset: false,
            is_transactional: false,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
        }
    }

    fn states(batches: &[BatchHeader]) -> ProducerStates {
        let mut s = ProducerStates::default();
        for b in batches {
            s.update(b);
        }
        s
    }

    #[test]
    fn in_order_batches_are_admitted_and_chain_within_a_request() {
        let s = states(&[batch(7, 0, 0, 3, 0)]);
        assert_eq!(s.admit(&[batch(7, 0, 3, 2, -1)]), Ok(Admission::Append));
        assert_eq!(
            s.admit(&[batch(7, 0, 3, 2, -1), batch(7, 0, 5, 1, -1)]),
            Ok(Admission::Append)
        );
        // A producer the replica never saw may start anywhere.
        assert_eq!(s.admit(&[batch(8, 0, 42, 1, -1)]), Ok(Admission::Append));
        // Non-idempotent batches are not checked.
        assert_eq!(s.admit(&[batch(-1, -1, -1, 1, -1)]), Ok(Admission::Append));
    }

    #[test]
    fn a_retried_batch_is_answered_with_its_original_offsets() {
        let s = states(&[batch(7, 0, 0, 3, 10), batch(7, 0, 3, 2, 20)]);
        assert_eq!(
            s.admit(&[batch(7, 0, 0, 3, -1)]),
            Ok(Admission::Duplicate {
                first_offset: 10,
                last_offset: 12
            })
        );
        assert_eq!(
            s.admit(&[batch(7, 0, 3, 2, -1)]),
            Ok(Admission::Duplicate {
                first_offset: 20,
                last_offset: 21
            })
        );
    }

    #[test]
    fn only_the_last_five_batches_are_remembered() {
        let s = states(
            &(0..6)
                .map(|i| batch(7, 0, i, 1, i as i64))
                .collect::<Vec<_>>(),
        );
        assert_eq!(s.get(7).unwrap().batches.len(), CACHED_BATCHES);
        assert!(matches!(
            s.admit(&[batch(7, 0, 0, 1, -1)]),
            Err(ProducerError::OutOfOrderSequence(_))
        ));
        assert!(matches!(
            s.admit(&[batch(7, 0, 1, 1, -1)]),
            Ok(Admission::Duplicate { .. })
        ));
    }

    #[test]
    fn a_gap_or_an_overlap_is_out_of_order() {
        let s = states(&[batch(7, 0, 0, 3, 0)]);
        for seq in [4, 2, 1] {
            assert!(
                matches!(
                    s.admit(&[batch(7, 0, seq, 1, -1)]),
                    Err(ProducerError::OutOfOrderSequence(_))
                ),
                "sequence {seq}"
            );
        }
        assert!(matches!(
            s.admit(&[batch(7, 0, 3, 1, -1), batch(7, 0, 5, 1, -1)]),
            Err(ProducerError::OutOfOrderSequence(_))
        ));
    }

    #[test]
    fn epochs_fence_older_producers_and_a_new_epoch_starts_at_zero() {
        let s = states(&[batch(7, 2, 0, 3, 0)]);
        assert!(matches!(
            s.admit(&[batch(7, 1, 3, 1, -1)]),
            Err(ProducerError::InvalidProducerEpoch(_))
        ));
        assert!(matches!(
            s.admit(&[batch(7, 3, 5, 1, -1)]),
            Err(ProducerError::OutOfOrderSequence(_))
        ));
        assert_eq!(s.admit(&[batch(7, 3, 0, 1, -1)]), Ok(Admission::Append));
        let bumped = states(&[batch(7, 2, 0, 3, 0), batch(7, 3, 0, 1, 3)]);
        assert_eq!(bumped.get(7).unwrap().batches.len(), 1);
    }

    #[test]
    fn sequences_wrap_after_the_largest_int() {
        let s = states(&[batch(7, 0, i32::MAX - 1, 2, 0)]);
        assert_eq!(s.get(7).unwrap().last_seq(), Some(i32::MAX));
        assert_eq!(s.admit(&[batch(7, 0, 0, 1, -1)]), Ok(Admission::Append));
    }

    #[test]
    fn transactional_batches_are_refused() {
        let mut b = batch(7, 0, 0, 1, -1);
        b.is_transactional = true;
        assert!(matches!(
            ProducerStates::default().admit(&[b]),
            Err(ProducerError::Transactional(_))
        ));
    }

    #[test]
    fn snapshots_round_trip_and_go_only_with_their_segments() {
        let dir = tempfile::tempdir().unwrap();
        let s = states(&[batch(7, 0, 0, 3, 0), batch(9, 1, 4, 1, 3)]);
        for offset in [4, 10, 20, 30] {
            write_snapshot(dir.path(), offset, &s).unwrap();
        }
        assert_eq!(snapshot_offsets(dir.path()).unwrap(), vec![4, 10, 20, 30]);
        remove_snapshots_below(dir.path(), 10).unwrap();
        assert_eq!(snapshot_offsets(dir.path()).unwrap(), vec![10, 20, 30]);
        let mut notes = Vec::new();
        let (loaded, from) = load_snapshot(dir.path(), 25, 0, &mut notes).unwrap();
        assert_eq!((loaded, from), (s.clone(), 20));
        remove_snapshots_above(dir.path(), 15).unwrap();
        assert_eq!(snapshot_offsets(dir.path()).unwrap(), vec![10]);
        std::fs::write(snapshot_path(dir.path(), 10), b"{torn").unwrap();
        let (loaded, from) = load_snapshot(dir.path(), 25, 0, &mut notes).unwrap();
        assert_eq!((loaded, from), (ProducerStates::default(), 0));
        assert!(notes[0].contains("unusable"), "{notes:?}");
        assert!(snapshot_offsets(dir.path()).unwrap().is_empty());
    }
}
