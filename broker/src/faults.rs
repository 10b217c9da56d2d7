//! The catalogue of injectable bugs. Each is a known-bad behaviour that real brokers have shipped;
//! turning one on (`--inject-bug NAME`) proves that tidemark's nemeses and checkers catch it. All
//! are off unless named, and the broker logs loudly at start when any is on.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// One injectable bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// KAFKA-1211: a follower truncates to its high watermark instead of by leader epoch when it
    /// (re)starts following. Breaks I3 (committed durability): an acknowledged record the
    /// follower held above its stale high watermark is cut, and if that follower is then elected,
    /// the record is gone. Checkers report `lost-write` (and `divergence` while logs differ).
    HwTruncation,
    /// The leader answers acks=all as soon as its own append is done, before the ISR has the
    /// record. Breaks I3: killing the leader loses acknowledged records. Checkers report
    /// `lost-write`.
    AckBeforeReplication,
    /// No leader-epoch fencing: produce and fetch requests with a stale current leader epoch are
    /// served (KIP-320 undone). Breaks I5: a zombie leader keeps acknowledging writes, and
    /// stale followers replicate from it. Checkers report `lost-write`, `divergence` or
    /// `inconsistent-offsets`.
    AcceptStaleEpoch,
    /// The high watermark advances while the ISR is below min.insync.replicas (KIP-966's strict
    /// rule undone). Breaks I4: records count as committed on fewer replicas than promised, so
    /// losing that replica loses them. Checkers report `lost-write`.
    NoStrictMinIsr,
}

impl Bug {
    pub const ALL: [Bug; 4] = [
        Bug::HwTruncation,
        Bug::AckBeforeReplication,
        Bug::AcceptStaleEpoch,
        Bug::NoStrictMinIsr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::HwTruncation => "hw-truncation",
            Bug::AckBeforeReplication => "ack-before-replication",
            Bug::AcceptStaleEpoch => "accept-stale-epoch",
            Bug::NoStrictMinIsr => "no-strict-min-isr",
        }
    }
}

impl fmt::Display for Bug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Bug {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Bug::ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            let names: Vec<_> = Bug::ALL.iter().map(|b| b.name()).collect();
            format!("unknown bug `{s}`; known bugs: {}", names.join(", "))
        })
    }
}

/// The set of bugs this broker was started with.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    on: BTreeSet<Bug>,
}

impl Faults {
    pub fn new(bugs: impl IntoIterator<Item = Bug>) -> Self {
        Faults {
            on: bugs.into_iter().collect(),
        }
    }

    pub fn has(&self, bug: Bug) -> bool {
        self.on.contains(&bug)
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.on.iter().map(|b| b.name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Bug::ALL {
            assert_eq!(b.name().parse::<Bug>().unwrap(), b);
        }
        let err = "nope".parse::<Bug>().unwrap_err();
        assert!(err.contains("hw-truncation"), "{err}");
    }
}
