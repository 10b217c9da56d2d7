//! The high watermarks polls saw, for the hw-regression check: within one leader epoch a
//! partition's high watermark never goes down, so a poll must not see a lower one than a poll
//! served under the same epoch that completed before it was invoked. Kept as rising steps,
//! pruned to what open invocations can still ask about, so their memory follows the polls in flight, not the length of the history.

use rustc_hash::FxHashMap;

/// The highest high watermark the polls completed so far saw, as steps `(op, high watermark)`
/// appended each time it rises: the highest seen before any point of the history is one binary
/// search away, and the steps are at most as many as the distinct high watermarks. The newest
/// step is kept inline and only older ones on the heap: most leader epochs see one step, and a
/// heap block for each of thousands of epochs cost more memory than the values they check.
#[derive(Debug)]
pub(super) struct HwSteps {
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
    pub(super) fn before(&self, index: u64) -> Option<(u64, i64)> {
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
    pub(super) fn forget_before(&mut self, floor: u64) -> usize {
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

/// Records a poll's high watermark in the steps under `key`; true when it added a step.
pub(super) fn record_in<K: std::hash::Hash + Eq>(
    steps: &mut FxHashMap<K, HwSteps>,
    key: K,
    op: u64,
    hw: i64,
) -> bool {
    match steps.entry(key) {
        std::collections::hash_map::Entry::Occupied(mut o) => o.get_mut().record(op, hw),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(HwSteps::new(op, hw));
            true
        }
    }
}

/// A high watermark and the op of the poll that saw it.
type Seen = Option<(u64, i64)>;

/// Fewest steps kept before [`SeenHws`] prunes at all.
pub(super) const MIN_HW_STEPS_KEPT: usize = 1024;

/// The high watermarks polls saw, per partition and per partition and leader epoch. A poll is
/// compared only with polls that completed before it was invoked, so the steps older than
/// every open invocation are dead but for the last one; they are pruned whenever the steps
/// have doubled since the last pruning, which keeps memory in proportion to the polls in
/// flight rather than to the history.
#[derive(Debug)]
pub(super) struct SeenHws {
    /// Per partition, under any leader epoch.
    any_epoch: FxHashMap<u32, HwSteps>,
    /// Per partition and the leader epoch the polls were served under.
    by_epoch: FxHashMap<(u32, i64), HwSteps>,
    steps: usize,
    prune_at: usize,
}

impl Default for SeenHws {
    fn default() -> Self {
        SeenHws {
            any_epoch: FxHashMap::default(),
            by_epoch: FxHashMap::default(),
            steps: 0,
            prune_at: MIN_HW_STEPS_KEPT,
        }
    }
}

impl SeenHws {
    /// The highest high watermarks completed before op `invoked` on partition `pk`: under any
    /// epoch, and under `epoch`.
    pub(super) fn before(&self, pk: u32, epoch: Option<i64>, invoked: u64) -> (Seen, Seen) {
        let any = self.any_epoch.get(&pk).and_then(|s| s.before(invoked));
        let same = epoch
            .and_then(|e| self.by_epoch.get(&(pk, e)))
            .and_then(|s| s.before(invoked));
        (any, same)
    }

    /// Records what a poll completed at `op` saw. `open_since` yields the lowest invocation
    /// still open (a later completion's `invoked` is at least that), asked for only when
    /// pruning is due.
    pub(super) fn record(
        &mut self,
        pk: u32,
        epoch: Option<i64>,
        op: u64,
        hw: i64,
        open_since: impl FnOnce() -> Option<u64>,
    ) {
        self.steps += usize::from(record_in(&mut self.any_epoch, pk, op, hw));
        if let Some(e) = epoch {
            self.steps += usize::from(record_in(&mut self.by_epoch, (pk, e), op, hw));
        }
        if self.steps >= self.prune_at {
            // Invocations after this completion come later than every step recorded so far.
            let floor = open_since().unwrap_or(op + 1);
            self.steps = self
                .any_epoch
                .values_mut()
                .chain(self.by_epoch.values_mut())
                .map(|s| s.forget_before(floor))
                .sum();
            self.prune_at = (2 * self.steps).max(MIN_HW_STEPS_KEPT);
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
            hws.steps <= 2 * MIN_HW_STEPS_KEPT,
            "{} steps kept for a window of {window} ops",
            hws.steps
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
