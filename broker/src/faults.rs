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
    /// A mirror partition starts mirroring without the LMLE truncation (KIP-1279's LMLE truncation). Breaks
    /// M3/M4: records this cluster wrote under epochs the other cluster now owns stay, the
    /// divergence check cannot see them, and after failback the two logs differ (`divergence`).
    SkipLmleTruncation,
    /// Failover makes the topic writable without bumping the leader epoch above the LMLE
    /// (KIP-1279's epoch bump). Breaks M5: local writes carry an epoch the other cluster also wrote, so
    /// failback keeps records of both under one epoch (`divergence`).
    NoEpochBumpOnFailover,
    /// The LMLE truncation (and ULE_RECOVERY) waits for the ISR only, ignoring
    /// `mirror.support.unclean.leader.election=true` (KIP-1279). Breaks M3/M4 under a later
    /// unclean election: an out-of-ISR replica keeps records beyond the LMLE and can lead.
    IsrOnlyLmleTruncation,
    /// A mirror leader records its own leader epoch in its epoch cache (KIP-1279). Breaks
    /// M11: the cache holds an epoch no mirrored batch has, so divergence answers are wrong.
    LocalEpochInMirrorCache,
    /// A follower starting from the remote store resumes at the leader's local log start instead
    /// of after the remote segment its epoch cache and producer state came from (the review
    /// finding of KAFKA-13369). Breaks T1: the follower applies the batches between the two
    /// again on top of a producer state that already holds them, and its first fetch offset is
    /// not the one the protocol gives.
    TieredBootstrapOffByOne,
}

impl Bug {
    pub const ALL: [Bug; 9] = [
        Bug::HwTruncation,
        Bug::AckBeforeReplication,
        Bug::AcceptStaleEpoch,
        Bug::NoStrictMinIsr,
        Bug::SkipLmleTruncation,
        Bug::NoEpochBumpOnFailover,
        Bug::IsrOnlyLmleTruncation,
        Bug::LocalEpochInMirrorCache,
        Bug::TieredBootstrapOffByOne,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::HwTruncation => "hw-truncation",
            Bug::AckBeforeReplication => "ack-before-replication",
            Bug::AcceptStaleEpoch => "accept-stale-epoch",
            Bug::NoStrictMinIsr => "no-strict-min-isr",
            Bug::SkipLmleTruncation => "skip-lmle-truncation",
            Bug::NoEpochBumpOnFailover => "no-epoch-bump-on-failover",
            Bug::IsrOnlyLmleTruncation => "isr-only-lmle-truncation",
            Bug::LocalEpochInMirrorCache => "local-epoch-in-mirror-cache",
            Bug::TieredBootstrapOffByOne => "tiered-bootstrap-off-by-one",
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
