//! The high watermarks polls saw, for the hw-regression check: within one leader epoch a
//! partition's high watermark never goes down, so a poll must not see a lower one than a poll
//! served under the same epoch that completed before it was invoked. Kept as rising steps
//! ([`RisingSteps`], which the acknowledged offsets of `acks.rs` use too), pruned to what open
//! invocations can still ask about, so their memory follows the ops in flight, not the length
//! of the history.

use rustc_hash::FxHashMap;

/// The highest high watermark the polls completed so far saw, as steps `(op, high watermark)`
/// appended each time it rises: the highest seen before any point of the history is one binary
/// search away, and the steps are at most as many as the distinct high watermarks. The newest
/// step is kept inline and only older ones on the heap: most leader epochs see one step, and a
/// heap block for each of thousands of epochs cost more memory than the values they check.
#[derive(Debug)]
struct HwSteps {
    /// Steps before `last`, oldest first.
    older: Vec<(u64, i64)>,
    last: (u64, i64),
}

impl HwSteps {
    fn new(op: u64, hw: i64) -> Self {
        HwSteps {
            older: Vec::new(),
            last: (op, hw),
        }
    }

    /// The highest high watermark completed before op `index`, and the poll that saw it.
    fn before(&self, index: u64) -> Option<(u64, i64)> {
        if self.last.0 < index {
            return Some(self.last);
        }
        let n = self.older.partition_point(|s| s.0 < index);
        n.checked_sub(1).map(|i| self.older[i])
    }

    /// Records a poll's high watermark; true when it added a step.
    fn record(&mut self, op: u64, hw: i64) -> bool {
        let rises = hw > self.last.1;
        if rises {
            self.older.push(std::mem::replace(&mut self.last, (op, hw)));
        }
        rises
    }

    /// Drops the steps no `before(index)` with `index >= floor` needs: all but the last one
    /// before `floor`. Returns how many remain.
    fn forget_before(&mut self, floor: u64) -> usize {
        if self.last.0 < floor {
            self.older = Vec::new();
        } else {
            let n = self.older.partition_point(|s| s.0 < floor);
            if n > 1 {
                self.older.drain(..n - 1);
            }
            if self.older.is_empty() {
                self.older = Vec::new();
            }
        }
        self.older.len() + 1
    }
}

/// A value and the op that completed with it.
pub(super) type Seen = Option<(u64, i64)>;

/// Fewest steps kept before [`RisingSteps`] prunes at all.
const MIN_STEPS_KEPT: usize = 1024;

/// The highest value completed so far under each key, as [`HwSteps`]. A question is asked
/// only for an op invoked after some point (an open invocation), so the steps older than every
/// open invocation are dead but for the last one; they are pruned whenever the steps have
/// doubled since the last pruning, which keeps memory in proportion to the ops in flight rather
/// than to the history.
#[derive(Debug)]
pub(super) struct RisingSteps<K> {
    by_key: FxHashMap<K, HwSteps>,
    steps: usize,
    prune_at: usize,
}

impl<K> Default for RisingSteps<K> {
    fn default() -> Self {
        RisingSteps {
            by_key: FxHashMap::default(),
            steps: 0,
            prune_at: MIN_STEPS_KEPT,
        }
    }
}

impl<K: std::hash::Hash + Eq> RisingSteps<K> {
    /// The highest value under `key` completed before op `invoked`, and the op that reached it.
    pub(super) fn before(&self, key: &K, invoked: u64) -> Seen {
        self.by_key.get(key).and_then(|s| s.before(invoked))
    }

    /// Records `value`, completed at `op`, under `key`. `open_since` yields the lowest
    /// invocation still open (a later question's `invoked` is at least that), asked for only
    /// when pruning is due.
    pub(super) fn record(
        &mut self,
        key: K,
        op: u64,
        value: i64,
        open_since: impl FnOnce() -> Option<u64>,
    ) {
        let added = match self.by_key.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut o) => o.get_mut().record(op, value),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(HwSteps::new(op, value));
                true
            }
        };
        self.steps += usize::from(added);
        if self.steps >= self.prune_at {
            // Invocations after this completion come later than every step recorded so far.
            let floor = open_since().unwrap_or(op + 1);
            self.steps = self
                .by_key
                .values_mut()
                .map(|s| s.forget_before(floor))
                .sum();
            self.prune_at = (2 * self.steps).max(MIN_STEPS_KEPT);
        }
    }
}

/// The high watermarks polls saw, per partition and per partition and leader epoch.
#[derive(Debug, Default)]
pub(super) struct SeenHws {
    /// Per partition, under any leader epoch.
    any_epoch: RisingSteps<u32>,
    /// Per partition and the leader epoch the polls were served under.
    by_epoch: RisingSteps<(u32, i64)>,
}

impl SeenHws {
    /// The highest high watermarks completed before op `invoked` on partition `pk`: under any
    /// epoch, and under `epoch`.
    pub(super) fn before(&self, pk: u32, epoch: Option<i64>, invoked: u64) -> (Seen, Seen) {
        let any = self.any_epoch.before(&pk, invoked);
        let same = epoch.and_then(|e| self.by_epoch.before(&(pk, e), invoked));
        (any, same)
    }

    /// Records what a poll completed at `op` saw. `open_since` yields the lowest invocation
    /// still open, asked for only when pruning is due.
    pub(super) fn record(
        &mut self,
        pk: u32,
        epoch: Option<i64>,
        op: u64,
        hw: i64,
        open_since: impl Fn() -> Option<u64>,
    ) {
        self.any_epoch.record(pk, op, hw, &open_since);
        if let Some(e) = epoch {
            self.by_epoch.record((pk, e), op, hw, &open_since);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_every_answer_an_open_invocation_can_ask_for() {
        let mut hws = SeenHws::default();
        // `answer[i]`: the highest high watermark completed before op `i`, and the first op
        // that reached it, computed without steps.
        let mut answer: Vec<Option<(u64, i64)>> = vec![None, None];
        let window = 50;
        for op in 1..20_000u64 {
            // Rising with dips, so not every poll adds a step.
            let hw = (op / 3) as i64 + (op % 7) as i64;
            let oldest_open = op.saturating_sub(window);
            hws.record(0, Some(1), op, hw, || Some(oldest_open));
            let last = answer[op as usize];
            answer.push(match last {
                Some((_, best)) if best >= hw => last,
                _ => Some((op, hw)),
            });
            for q in [oldest_open, (oldest_open + op) / 2, op + 1] {
                let want = answer[q as usize];
                assert_eq!(
                    hws.before(0, Some(1), q),
                    (want, want),
                    "op {op}, asked at {q}"
                );
            }
        }
        assert!(
            hws.any_epoch.steps + hws.by_epoch.steps <= 4 * MIN_STEPS_KEPT,
            "{} steps kept for a window of {window} ops",
            hws.any_epoch.steps + hws.by_epoch.steps
        );
    }

    #[test]
    fn a_long_open_invocation_keeps_its_steps() {
        let mut hws = SeenHws::default();
        for op in 1..10_000u64 {
            hws.record(3, None, op, op as i64, || Some(5));
        }
        // The poll invoked at op 5 still sees what completed before it, and nothing later.
        assert_eq!(hws.before(3, None, 5).0, Some((4, 4)));
        assert_eq!(hws.before(3, Some(1), 5), (Some((4, 4)), None));
        assert_eq!(hws.before(3, None, 10_000).0, Some((9_999, 9_999)));
    }
}
