//! A follower's side of an incremental fetch session (KIP-227, Kafka's `FetchSessionHandler`):
//! what the next request of a fetcher must name. The first request of a session is a full fetch
//! that opens it; each later one names only the partitions whose fetch position changed since
//! the last, and those the fetcher no longer wants. So a follower of many idle partitions sends
//! a few bytes per request, and its leader answers only the partitions with something new.
//!
//! Pure: the fetcher tells it what it wants and what the leader answered.

use std::collections::BTreeMap;

use crate::errors;
pub use crate::fetch_session::Wanted;

/// A partition of the fetcher: topic name and index.
pub type PartitionKey = (String, i32);

/// The session fields and partitions of the next request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextFetch {
    pub session_id: i32,
    pub session_epoch: i32,
    /// The partitions to name, with what is asked of each.
    pub send: Vec<(PartitionKey, Wanted)>,
    /// Partitions the session holds that the fetcher no longer wants.
    pub forget: Vec<PartitionKey>,
}

/// One fetcher's session with its leader.
#[derive(Debug, Default)]
pub struct FollowerSession {
    /// The session's id; kept after a failure so that the next full fetch closes it.
    id: i32,
    /// The epoch of the next request: 0 is a full fetch that opens a session.
    epoch: i32,
    /// What the leader's session holds for each partition, as of the last answered request.
    held: BTreeMap<PartitionKey, Wanted>,
}

impl FollowerSession {
    /// The next request for `wanted`: every partition when the session is (re)opened, else the
    /// ones added or changed and the ones dropped.
    pub fn next_fetch(&self, wanted: &BTreeMap<PartitionKey, Wanted>) -> NextFetch {
        if self.epoch == 0 {
            return NextFetch {
                session_id: self.id,
                session_epoch: 0,
                send: wanted.iter().map(|(k, w)| (k.clone(), *w)).collect(),
                forget: Vec::new(),
            };
        }
        NextFetch {
            session_id: self.id,
            session_epoch: self.epoch,
            send: wanted
                .iter()
                .filter(|(k, w)| self.held.get(*k) != Some(*w))
                .map(|(k, w)| (k.clone(), *w))
                .collect(),
            forget: self
                .held
                .keys()
                .filter(|k| !wanted.contains_key(*k))
                .cloned()
                .collect(),
        }
    }

    /// The leader answered the request made for `wanted` without a top-level error, in session
    /// `session_id` (0: it keeps none, so the next request is a full fetch again).
    pub fn answered(&mut self, session_id: i32, wanted: BTreeMap<PartitionKey, Wanted>) {
        if session_id == 0 {
            *self = FollowerSession::default();
            return;
        }
        // A new session's next request is its first incremental one; after `i32::MAX` comes 1
        // (0 and -1 mean open and close).
        let fresh = self.epoch == 0 || self.id != session_id;
        self.epoch = if fresh || self.epoch == i32::MAX {
            1
        } else {
            self.epoch + 1
        };
        self.id = session_id;
        self.held = wanted;
    }

    /// The request failed with top-level `error_code`, or never got an answer (`None`: the
    /// connection failed or was given up): the next request is a full fetch, closing the
    /// session the leader may still hold unless it said it has none.
    pub fn failed(&mut self, error_code: Option<i16>) {
        if error_code == Some(errors::FETCH_SESSION_ID_NOT_FOUND) {
            self.id = 0;
        }
        self.epoch = 0;
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: i32) -> PartitionKey {
        ("t".to_string(), p)
    }

    fn at(offset: i64) -> Wanted {
        Wanted {
            fetch_offset: offset,
            current_leader_epoch: 3,
            last_fetched_epoch: 2,
            log_start_offset: 0,
            partition_max_bytes: 1 << 20,
        }
    }

    fn wanted(entries: &[(i32, i64)]) -> BTreeMap<PartitionKey, Wanted> {
        entries.iter().map(|(p, o)| (key(*p), at(*o))).collect()
    }

    #[test]
    fn the_first_fetch_opens_a_session_naming_every_partition() {
        let s = FollowerSession::default();
        let next = s.next_fetch(&wanted(&[(0, 5), (1, 7)]));
        assert_eq!((next.session_id, next.session_epoch), (0, 0));
        assert_eq!(next.send, vec![(key(0), at(5)), (key(1), at(7))]);
        assert!(next.forget.is_empty());
    }

    #[test]
    fn later_fetches_name_only_what_changed_and_what_was_dropped() {
        let mut s = FollowerSession::default();
        s.answered(42, wanted(&[(0, 5), (1, 7), (2, 9)]));
        let next = s.next_fetch(&wanted(&[(0, 5), (1, 8), (3, 0)]));
        assert_eq!((next.session_id, next.session_epoch), (42, 1));
        assert_eq!(next.send, vec![(key(1), at(8)), (key(3), at(0))]);
        assert_eq!(next.forget, vec![key(2)]);
        s.answered(42, wanted(&[(0, 5), (1, 8), (3, 0)]));
        let idle = s.next_fetch(&wanted(&[(0, 5), (1, 8), (3, 0)]));
        assert_eq!((idle.session_id, idle.session_epoch), (42, 2));
        assert!(idle.send.is_empty() && idle.forget.is_empty());
    }

    #[test]
    fn the_epoch_wraps_to_one() {
        let mut s = FollowerSession {
            id: 42,
            epoch: i32::MAX,
            held: BTreeMap::new(),
        };
        s.answered(42, wanted(&[(0, 1)]));
        assert_eq!(s.next_fetch(&wanted(&[(0, 1)])).session_epoch, 1);
    }

    #[test]
    fn a_failure_reopens_with_a_full_fetch_that_closes_the_old_session() {
        let mut s = FollowerSession::default();
        s.answered(42, wanted(&[(0, 5)]));
        s.failed(Some(errors::INVALID_FETCH_SESSION_EPOCH));
        let next = s.next_fetch(&wanted(&[(0, 5)]));
        assert_eq!((next.session_id, next.session_epoch), (42, 0));
        assert_eq!(next.send, vec![(key(0), at(5))]);
        s.answered(43, wanted(&[(0, 5)]));
        assert_eq!(s.next_fetch(&wanted(&[(0, 5)])).session_id, 43);
        s.failed(None);
        assert_eq!(s.next_fetch(&wanted(&[(0, 5)])).session_id, 43);
    }

    #[test]
    fn an_unknown_session_is_not_closed_and_a_leader_without_sessions_gets_full_fetches() {
        let mut s = FollowerSession::default();
        s.answered(42, wanted(&[(0, 5)]));
        s.failed(Some(errors::FETCH_SESSION_ID_NOT_FOUND));
        let next = s.next_fetch(&wanted(&[(0, 5)]));
        assert_eq!((next.session_id, next.session_epoch), (0, 0));
        s.answered(0, wanted(&[(0, 5)]));
        let again = s.next_fetch(&wanted(&[(0, 5)]));
        assert_eq!((again.session_id, again.session_epoch), (0, 0));
        assert_eq!(again.send.len(), 1);
    }
}
