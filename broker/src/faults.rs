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
    /// Consumers are served records up to the leader's log end instead of its high watermark
    /// (Kafka's fetch isolation for consumers, `FetchHighWatermark`, undone; KIP-101 states the
    /// rule: "consumers can only read up to the high watermark"). Breaks I4: a consumer reads a
    /// record that a leader change then truncates and replaces. Checkers report
    /// `inconsistent-offsets` (and `aborted-read` when the replaced record's send failed).
    ReadPastHighWatermark,
    /// A follower joins the ISR on its first fetch, caught up or not (Kafka's `maybeExpandIsr`
    /// rule, restated by KIP-966, that a replica joins only once its log end reaches the high
    /// watermark and the leader's epoch start offset, undone). Breaks I3: the controller may
    /// elect the lagging replica cleanly, and the committed records it lacks are gone. Checkers
    /// report `lost-write`.
    IsrJoinBeforeCaughtUp,
    /// The leader counts records it sends a follower as already in the follower's log and
    /// advances the high watermark on that, instead of waiting for the follower's next fetch
    /// offset to report them (the replication protocol's rule, KIP-101: the high watermark is
    /// the smallest log end offset the ISR has reported). Breaks I3: a fetch response lost with
    /// the follower cut off or killed leaves acknowledged records on the leader alone. Checkers
    /// report `lost-write`.
    HwFromSentRecords,
    /// An acks=all produce waiting for the ISR is answered success when its leader loses
    /// leadership, instead of NOT_LEADER_OR_FOLLOWER (Kafka's `DelayedProduce` completes with an
    /// error once the partition is led elsewhere). Breaks I3: the new leader never had the record
    /// and truncates it from the old one. Checkers report `lost-write`.
    AckOnLeadershipLoss,
    /// A mirror partition starts mirroring without the LMLE truncation (KIP-1279's LMLE truncation). Breaks
    /// M3/M4: records this cluster wrote under epochs the other cluster now owns stay
    /// (`lmle-truncation`), the divergence check cannot see them, and after failback the two
    /// logs differ (`mirror-divergence`).
    SkipLmleTruncation,
    /// Failover makes the topic writable without bumping the leader epoch above the LMLE
    /// (KIP-1279's epoch bump). Breaks M5: local writes carry an epoch the other cluster also wrote, so
    /// failback keeps records of both under one epoch (`divergence`).
    NoEpochBumpOnFailover,
    /// The LMLE truncation (and ULE_RECOVERY) waits for the ISR only, ignoring
    /// `mirror.support.unclean.leader.election=true` (KIP-1279). Breaks M3: a replica out of
    /// the ISR keeps records beyond the LMLE once the partition mirrors (`lmle-truncation`, seen
    /// in a failback's lagging replica), and M4 under a later unclean election, which it can
    /// win (`mirror-divergence`).
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
    /// A follower starting from the remote store takes the segment's epoch cache but not its
    /// producer snapshot (KAFKA-14467: the downloaded snapshot could be cleaned up right after
    /// download). Breaks T1: the follower holds no state for producers whose batches are all
    /// remote, so once it leads, a producer's retry of its last batch is not recognised as a
    /// duplicate.
    TieredBootstrapDropsProducerState,
    /// Followers read `follower.fetch.last.tiered.offset.enable` once, as the broker was started
    /// with, and miss the cluster-wide dynamic value that KIP-1023 makes it (the flag exists so
    /// an operator can turn the new start on and back off on a running cluster). Breaks T2 when
    /// turned off at run time (an empty follower still skips to the earliest pending upload) and
    /// T1 when turned on (it still starts at the leader's local log start).
    TieredFlagNotDynamic,
}

impl Bug {
    pub const ALL: [Bug; 15] = [
        Bug::HwTruncation,
        Bug::AckBeforeReplication,
        Bug::AcceptStaleEpoch,
        Bug::NoStrictMinIsr,
        Bug::ReadPastHighWatermark,
        Bug::IsrJoinBeforeCaughtUp,
        Bug::HwFromSentRecords,
        Bug::AckOnLeadershipLoss,
        Bug::SkipLmleTruncation,
        Bug::NoEpochBumpOnFailover,
        Bug::IsrOnlyLmleTruncation,
        Bug::LocalEpochInMirrorCache,
        Bug::TieredBootstrapOffByOne,
        Bug::TieredBootstrapDropsProducerState,
        Bug::TieredFlagNotDynamic,
    ];

    /// Whether the bug lives in cluster mirroring (so only a two-cluster test can show it).
    pub fn mirrors(self) -> bool {
        matches!(
            self,
            Bug::SkipLmleTruncation
                | Bug::NoEpochBumpOnFailover
                | Bug::IsrOnlyLmleTruncation
                | Bug::LocalEpochInMirrorCache
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Bug::HwTruncation => "hw-truncation",
            Bug::AckBeforeReplication => "ack-before-replication",
            Bug::AcceptStaleEpoch => "accept-stale-epoch",
            Bug::NoStrictMinIsr => "no-strict-min-isr",
            Bug::ReadPastHighWatermark => "read-past-high-watermark",
            Bug::IsrJoinBeforeCaughtUp => "isr-join-before-caught-up",
            Bug::HwFromSentRecords => "hw-from-sent-records",
            Bug::AckOnLeadershipLoss => "ack-on-leadership-loss",
            Bug::SkipLmleTruncation => "skip-lmle-truncation",
            Bug::NoEpochBumpOnFailover => "no-epoch-bump-on-failover",
            Bug::IsrOnlyLmleTruncation => "isr-only-lmle-truncation",
            Bug::LocalEpochInMirrorCache => "local-epoch-in-mirror-cache",
            Bug::TieredBootstrapOffByOne => "tiered-bootstrap-off-by-one",
            Bug::TieredBootstrapDropsProducerState => "tiered-bootstrap-drops-producer-state",
            Bug::TieredFlagNotDynamic => "tiered-flag-not-dynamic",
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
