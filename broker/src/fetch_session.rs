//! Incremental fetch sessions (KIP-227). A client that fetches many partitions opens a session
//! with one full fetch; the broker keeps the partitions it asked for, and each later request of
//! the session names only the partitions whose fetch position changed (and those it forgets),
//! while the response carries only the partitions with something new: records, another high
//! watermark or log start, an error. A caught-up client with many idle partitions then sends
//! and receives almost nothing.
//!
//! A request's `(session_id, session_epoch)`: `(0, -1)` is a full fetch without a session, as
//! every client before KIP-227 (and librdkafka) sends; `(0, 0)` a full fetch that opens one;
//! `(id, 0)` closes `id` and opens another; `(id, -1)` closes `id` and fetches without one;
//! `(id, n > 0)` is the session's next incremental fetch, `n` one more than the last. The cache
//! keeps at most [`SESSION_SLOTS`] sessions (Kafka's `max.incremental.fetch.session.cache.slots`
//! default) and lets the least recently used go for a new one.
//!
//! Pure: the fetch handler asks it what to fetch and what to answer.

use std::collections::{BTreeMap, HashMap};

use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::errors;

/// How many sessions a broker keeps.
pub const SESSION_SLOTS: usize = 1000;

/// A partition of a fetch, as the request names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionKey {
    pub topic: StrBytes,
    pub topic_id: Uuid,
    pub partition: i32,
}

/// What a fetch asks of a partition: kept by the broker's sessions, and by a follower's
/// (`replica::session`) to tell which partitions changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub fetch_offset: i64,
    pub current_leader_epoch: i32,
    pub last_fetched_epoch: i32,
    pub log_start_offset: i64,
    pub partition_max_bytes: i32,
}

/// What a response told the client of a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Told {
    pub high_watermark: i64,
    pub log_start_offset: i64,
}

/// One partition's answer, as far as the session needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub told: Told,
    pub has_records: bool,
    pub error_code: i16,
    pub diverging: bool,
}

/// What a request's session fields ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionRequest {
    /// A full fetch without a session, closing `close` first.
    Sessionless { close: Option<i32> },
    /// A full fetch opening a session, closing `close` first.
    Open { close: Option<i32> },
    /// The next fetch of session `id`, numbered `epoch`.
    Incremental { id: i32, epoch: i32 },
}

impl SessionRequest {
    /// Reads a request's `session_id` and `session_epoch`; an impossible pair is
    /// INVALID_FETCH_SESSION_EPOCH, as in Kafka.
    pub fn of(session_id: i32, epoch: i32) -> Result<Self, i16> {
        let close = (session_id != 0).then_some(session_id);
        match epoch {
            -1 => Ok(SessionRequest::Sessionless { close }),
            0 => Ok(SessionRequest::Open { close }),
            n if n > 0 && session_id != 0 => Ok(SessionRequest::Incremental {
                id: session_id,
                epoch: n,
            }),
            _ => Err(errors::INVALID_FETCH_SESSION_EPOCH),
        }
    }
}

struct Session {
    /// The epoch the next request must carry.
    next_epoch: i32,
    partitions: BTreeMap<PartitionKey, (Wanted, Option<Told>)>,
    last_used: u64,
}

/// The broker's fetch sessions.
pub struct FetchSessions {
    slots: usize,
    sessions: HashMap<i32, Session>,
    last_id: i32,
    clock: u64,
}

impl Default for FetchSessions {
    fn default() -> Self {
        FetchSessions::new(SESSION_SLOTS)
    }
}

/// Kafka's `nextEpoch`: after `i32::MAX` comes 1 (0 and -1 mean open and close).
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl FetchSessions {
    /// A cache of at most `slots` sessions (0: never opens one).
    pub fn new(slots: usize) -> Self {
        FetchSessions {
            slots,
            sessions: HashMap::new(),
            last_id: 0,
            clock: 0,
        }
    }

    /// Forgets session `id`, if it exists.
    pub fn close(&mut self, id: i32) {
        self.sessions.remove(&id);
    }

    /// Opens a session holding `partitions` with what the full fetch's response told of each;
    /// returns its id, or 0 when it keeps no sessions.
    pub fn open(&mut self, partitions: Vec<(PartitionKey, Wanted, Told)>) -> i32 {
        if self.slots == 0 {
            return 0;
        }
        if self.sessions.len() >= self.slots {
            if let Some(oldest) = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(id, _)| *id)
            {
                self.sessions.remove(&oldest);
            }
        }
        let id = loop {
            self.last_id = if self.last_id == i32::MAX {
                1
            } else {
                self.last_id + 1
            };
            if !self.sessions.contains_key(&self.last_id) {
                break self.last_id;
            }
        };
        self.clock += 1;
        let partitions = partitions
            .into_iter()
            .map(|(k, w, t)| (k, (w, Some(t))))
            .collect();
        self.sessions.insert(
            id,
            Session {
                next_epoch: 1,
                partitions,
                last_used: self.clock,
            },
        );
        id
    }

    /// Starts the incremental fetch `epoch` of session `id`: the request's partitions replace or
    /// join the session's, `forgotten` ones leave it. Returns every partition of the session
    /// with what to fetch, or FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH (the
    /// session is then left as it was).
    pub fn begin(
        &mut self,
        id: i32,
        epoch: i32,
        requested: Vec<(PartitionKey, Wanted)>,
        forgotten: &[PartitionKey],
    ) -> Result<Vec<(PartitionKey, Wanted)>, i16> {
        self.clock += 1;
        let clock = self.clock;
        let s = self
            .sessions
            .get_mut(&id)
            .ok_or(errors::FETCH_SESSION_ID_NOT_FOUND)?;
        if epoch != s.next_epoch {
            return Err(errors::INVALID_FETCH_SESSION_EPOCH);
        }
        s.next_epoch = next_epoch(epoch);
        s.last_used = clock;
        for k in forgotten {
            s.partitions.remove(k);
        }
        for (k, w) in requested {
            let told = s.partitions.get(&k).and_then(|(_, t)| *t);
            s.partitions.insert(k, (w, told));
        }
        Ok(s.partitions
            .iter()
            .map(|(k, (w, _))| (k.clone(), *w))
            .collect())
    }

    /// Ends an incremental fetch of session `id`: whether each answered partition goes into the
    /// response (records, an error, a diverging epoch, or a high watermark or log start the
    /// client has not been told), remembering what it is told.
    pub fn finish(&mut self, id: i32, answers: &[(PartitionKey, Answer)]) -> Vec<bool> {
        let Some(s) = self.sessions.get_mut(&id) else {
            return vec![true; answers.len()];
        };
        answers
            .iter()
            .map(|(k, a)| {
                let Some((_, told)) = s.partitions.get_mut(k) else {
                    return true;
                };
                let news = a.has_records
                    || a.error_code != errors::NONE
                    || a.diverging
                    || *told != Some(a.told);
                if news {
                    *told = Some(a.told);
                }
                news
            })
            .collect()
    }

    /// How many sessions are open.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: i32) -> PartitionKey {
        PartitionKey {
            topic: StrBytes::from_static_str("t"),
            topic_id: Uuid::nil(),
            partition: p,
        }
    }

    fn wanted(offset: i64) -> Wanted {
        Wanted {
            fetch_offset: offset,
            current_leader_epoch: 0,
            last_fetched_epoch: -1,
            log_start_offset: 0,
            partition_max_bytes: 1 << 20,
        }
    }

    fn told(hw: i64) -> Told {
        Told {
            high_watermark: hw,
            log_start_offset: 0,
        }
    }

    fn quiet(hw: i64) -> Answer {
        Answer {
            told: told(hw),
            has_records: false,
            error_code: errors::NONE,
            diverging: false,
        }
    }

    #[test]
    fn session_fields_are_read_as_kafka_reads_them() {
        use SessionRequest::*;
        assert_eq!(SessionRequest::of(0, -1), Ok(Sessionless { close: None }));
        assert_eq!(SessionRequest::of(0, 0), Ok(Open { close: None }));
        assert_eq!(SessionRequest::of(7, 0), Ok(Open { close: Some(7) }));
        assert_eq!(
            SessionRequest::of(7, -1),
            Ok(Sessionless { close: Some(7) })
        );
        assert_eq!(
            SessionRequest::of(7, 3),
            Ok(Incremental { id: 7, epoch: 3 })
        );
        assert_eq!(
            SessionRequest::of(0, 3),
            Err(errors::INVALID_FETCH_SESSION_EPOCH)
        );
        assert_eq!(
            SessionRequest::of(7, -2),
            Err(errors::INVALID_FETCH_SESSION_EPOCH)
        );
        assert_eq!(next_epoch(i32::MAX), 1);
    }

    #[test]
    fn an_incremental_fetch_answers_only_what_changed_and_keeps_forgotten_partitions_out() {
        let mut s = FetchSessions::new(10);
        let id = s.open(vec![
            (key(0), wanted(5), told(5)),
            (key(1), wanted(9), told(9)),
        ]);
        assert!(id > 0);
        // Nothing new: both fetched, neither answered.
        let want = s.begin(id, 1, Vec::new(), &[]).unwrap();
        assert_eq!(want, vec![(key(0), wanted(5)), (key(1), wanted(9))]);
        assert_eq!(
            s.finish(id, &[(key(0), quiet(5)), (key(1), quiet(9))]),
            [false, false]
        );
        // Partition 1 got records and a new high watermark; the client moves partition 1 on.
        let mut moved = quiet(12);
        moved.has_records = true;
        s.begin(id, 2, Vec::new(), &[]).unwrap();
        assert_eq!(
            s.finish(id, &[(key(0), quiet(5)), (key(1), moved)]),
            [false, true]
        );
        let want = s.begin(id, 3, vec![(key(1), wanted(12))], &[]).unwrap();
        assert_eq!(want[1], (key(1), wanted(12)));
        assert_eq!(
            s.finish(id, &[(key(0), quiet(5)), (key(1), quiet(12))]),
            [false, false]
        );
        // A new partition is answered once; a forgotten one is no longer fetched.
        let want = s
            .begin(id, 4, vec![(key(2), wanted(0))], &[key(0)])
            .unwrap();
        assert_eq!(
            want.iter().map(|(k, _)| k.partition).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(
            s.finish(id, &[(key(1), quiet(12)), (key(2), quiet(3))]),
            [false, true]
        );
        // An error is always answered.
        let mut failed = quiet(12);
        failed.error_code = errors::NOT_LEADER_OR_FOLLOWER;
        s.begin(id, 5, Vec::new(), &[]).unwrap();
        assert_eq!(
            s.finish(id, &[(key(1), failed), (key(2), quiet(3))]),
            [true, false]
        );
    }

    #[test]
    fn a_wrong_epoch_or_an_unknown_session_is_refused_and_changes_nothing() {
        let mut s = FetchSessions::new(10);
        let id = s.open(vec![(key(0), wanted(5), told(5))]);
        assert_eq!(
            s.begin(id, 2, vec![(key(1), wanted(0))], &[]),
            Err(errors::INVALID_FETCH_SESSION_EPOCH)
        );
        assert_eq!(
            s.begin(id + 1, 1, Vec::new(), &[]),
            Err(errors::FETCH_SESSION_ID_NOT_FOUND)
        );
        assert_eq!(s.begin(id, 1, Vec::new(), &[]).unwrap().len(), 1);
        // The same epoch twice: the second is refused.
        assert_eq!(
            s.begin(id, 1, Vec::new(), &[]),
            Err(errors::INVALID_FETCH_SESSION_EPOCH)
        );
        s.close(id);
        assert!(s.is_empty());
    }

    #[test]
    fn a_full_cache_lets_the_least_recently_used_session_go() {
        let mut s = FetchSessions::new(2);
        let a = s.open(vec![(key(0), wanted(0), told(0))]);
        let b = s.open(vec![(key(0), wanted(0), told(0))]);
        s.begin(a, 1, Vec::new(), &[]).unwrap();
        let c = s.open(vec![(key(0), wanted(0), told(0))]);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.begin(b, 1, Vec::new(), &[]),
            Err(errors::FETCH_SESSION_ID_NOT_FOUND)
        );
        assert!(s.begin(a, 2, Vec::new(), &[]).is_ok() && s.begin(c, 1, Vec::new(), &[]).is_ok());
        assert_eq!(FetchSessions::new(0).open(Vec::new()), 0);
    }
}
