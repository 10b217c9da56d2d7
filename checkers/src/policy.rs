//! Which anomalies a test's guarantees forbid. Seeing an anomaly and judging it are separate:
//! every anomaly is reported, and this policy decides which of them make the run invalid.
//!
//! The policy, from the header's test map and from the history itself:
//!
//! - **An explicit list wins.** `"allowed_anomalies": ["lost-write", ...]` in the test map is the
//!   whole allowed set; nothing below applies.
//! - **Unclean leader election** is enabled when the test map says `"unclean_leader_election":
//!   true`, when `unclean.leader.election.enable` is true in `broker_config` or `topic_config`
//!   (flat, or one map per topic), when `"nemesis"` (a string or a list) names a fault kind
//!   containing `unclean`, and it is forced when the history holds an `unclean-election` op or a
//!   `config` op that turns `unclean.leader.election.enable` on. Then an out-of-sync replica may
//!   become leader and truncate acknowledged records, so `lost-write` is allowed, and so is
//!   `inconsistent-offsets` (the truncated offsets are written again with other values, so an old
//!   acknowledgement or poll disagrees with the final log).
//! - **Failover** (a `failover` op): mirroring is asynchronous, so acknowledged writes not yet
//!   mirrored when the source is abandoned are truncated on failback. `lost-write` and
//!   `inconsistent-offsets` are allowed for the same reason as above.
//! - **Mirroring with unclean elections**: with two or more clusters (or `"workload": "mirror"`),
//!   an unclean election, and `mirror.support.unclean.leader.election` not true in the test's
//!   static configuration, a non-ISR replica can keep records above the last mirrored epoch, so
//!   `mirror-divergence` and `epoch-ownership` are allowed. Turning the flag on mid-run (a
//!   `config` op) only protects records after the next truncation, so it does not count.
//! - **Cluster-wide power loss** (a `power-loss` op whose value says `"cluster_wide": true`: every
//!   node of a cluster lost what it had not fsynced, at once) with a flush policy other than
//!   per-message (`log.flush.interval.messages` in `broker_config` anything but 1, or unset, as in
//!   Kafka's default): an acknowledged record may be in no replica's durable log, so `lost-write`
//!   is allowed, and `inconsistent-offsets` (the lost offsets are written again with other
//!   values). So is `divergence`: replicas flush independently, so each comes back with a
//!   different durable prefix plus a torn tail, while the leader-epoch checkpoint is flushed on its
//!   own schedule and can name an epoch whose records were lost; epoch-based truncation then
//!   compares histories that no longer match the logs, which is KIP-101's "replica divergence
//!   after multiple hard failures" and which KIP-279 narrows but cannot close without flushing
//!   the log with every record. With per-message flush every acknowledged record was durable on
//!   every in-sync replica before the acknowledgement, so nothing is excused; a single node
//!   losing power excuses nothing either, since its peers kept what it lost.
//! - **Never allowed** unless listed explicitly: `divergence` (replicas of one cluster disagree
//!   below their high watermarks after convergence), and every other anomaly.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::results::AnomalyKind;

const UNCLEAN_KEY: &str = "unclean.leader.election.enable";
const MIRROR_UNCLEAN_KEY: &str = "mirror.support.unclean.leader.election";
const FLUSH_MESSAGES_KEY: &str = "log.flush.interval.messages";

/// The verdict policy read from a test map; see the module docs for the rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    explicit: Option<Vec<String>>,
    unclean_configured: bool,
    mirror_unclean_support: bool,
    mirror_workload: bool,
    flush_per_message: bool,
}

/// What the history itself says about the policy, gathered while it streams past.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryFacts {
    /// An `unclean-election` op, or a `config` op enabling unclean elections.
    pub forced_unclean: bool,
    /// A `failover` op.
    pub failover: bool,
    /// How many clusters the ops and replicas name.
    pub clusters: usize,
    /// A `power-loss` op that cut every node of a cluster at once.
    pub cluster_power_loss: bool,
}

impl Policy {
    /// Reads the policy from the `test` map of a history header.
    pub fn from_test(test: &Value) -> Self {
        let explicit = test
            .get("allowed_anomalies")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            });
        let nemesis_unclean = match test.get("nemesis") {
            Some(Value::String(s)) => s.contains("unclean"),
            Some(Value::Array(kinds)) => kinds
                .iter()
                .any(|k| k.as_str().is_some_and(|s| s.contains("unclean"))),
            _ => false,
        };
        Policy {
            explicit,
            unclean_configured: test.get("unclean_leader_election").is_some_and(truthy)
                || config_flag(test, UNCLEAN_KEY)
                || nemesis_unclean,
            mirror_unclean_support: config_flag(test, MIRROR_UNCLEAN_KEY),
            mirror_workload: test.get("workload").and_then(Value::as_str) == Some("mirror"),
            flush_per_message: test
                .get("broker_config")
                .and_then(|c| c.get(FLUSH_MESSAGES_KEY))
                .is_some_and(|v| match v {
                    Value::String(s) => s.trim() == "1",
                    Value::Number(n) => n.as_u64() == Some(1),
                    _ => false,
                }),
        }
    }

    /// The allowed anomaly types, each with why it is allowed.
    pub fn allowed(&self, facts: &HistoryFacts) -> BTreeMap<String, String> {
        let mut allowed = BTreeMap::new();
        if let Some(list) = &self.explicit {
            for a in list {
                allowed.insert(a.clone(), "listed in the test's allowed_anomalies".into());
            }
            return allowed;
        }
        let unclean = self.unclean_configured || facts.forced_unclean;
        let mut allow = |kind: AnomalyKind, why: &str| {
            allowed
                .entry(kind.name().to_owned())
                .or_insert_with(|| why.to_owned());
        };
        if unclean {
            let why = "unclean leader election may truncate acknowledged records";
            allow(AnomalyKind::LostWrite, why);
            allow(AnomalyKind::InconsistentOffsets, why);
        }
        if facts.failover {
            let why = "failover abandons acknowledged writes not yet mirrored";
            allow(AnomalyKind::LostWrite, why);
            allow(AnomalyKind::InconsistentOffsets, why);
        }
        if facts.cluster_power_loss && !self.flush_per_message {
            let why = "every replica lost power at once, and the flush policy is not per-message";
            allow(AnomalyKind::LostWrite, why);
            allow(AnomalyKind::InconsistentOffsets, why);
            allow(AnomalyKind::Divergence, why);
        }
        let mirroring = self.mirror_workload || facts.clusters > 1;
        if mirroring && unclean && !self.mirror_unclean_support {
            let why = "unclean election with mirror.support.unclean.leader.election off";
            allow(AnomalyKind::MirrorDivergence, why);
            allow(AnomalyKind::EpochOwnership, why);
        }
        allowed
    }
}

/// Whether a nemesis `config` op's `set` map turns unclean leader election on.
pub(crate) fn config_op_enables_unclean(value: &Value) -> bool {
    value
        .get("set")
        .and_then(|s| s.get(UNCLEAN_KEY))
        .is_some_and(truthy)
}

/// `key` is true in `broker_config` or `topic_config`, directly or in a per-topic map.
fn config_flag(test: &Value, key: &str) -> bool {
    ["broker_config", "topic_config"].iter().any(|section| {
        let Some(map) = test.get(section).and_then(Value::as_object) else {
            return false;
        };
        map.get(key).is_some_and(truthy)
            || map
                .values()
                .any(|per_topic| per_topic.get(key).is_some_and(truthy))
    })
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn allowed(test: Value, facts: HistoryFacts) -> Vec<String> {
        Policy::from_test(&test)
            .allowed(&facts)
            .into_keys()
            .collect()
    }

    #[test]
    fn nothing_is_allowed_by_default() {
        assert!(allowed(json!({}), HistoryFacts::default()).is_empty());
        assert!(allowed(
            json!({"nemesis": ["kill", "partition"]}),
            HistoryFacts::default()
        )
        .is_empty());
    }

    #[test]
    fn unclean_elections_allow_lost_writes() {
        let expect = vec!["inconsistent-offsets", "lost-write"];
        for test in [
            json!({"unclean_leader_election": true}),
            json!({"nemesis": "kill,unclean"}),
            json!({"nemesis": ["unclean-election"]}),
            json!({"broker_config": {"unclean.leader.election.enable": "true"}}),
            json!({"topic_config": {"t": {"unclean.leader.election.enable": true}}}),
        ] {
            assert_eq!(
                allowed(test.clone(), HistoryFacts::default()),
                expect,
                "{test}"
            );
        }
        let forced = HistoryFacts {
            forced_unclean: true,
            ..HistoryFacts::default()
        };
        assert_eq!(allowed(json!({}), forced), expect);
        assert!(allowed(
            json!({"broker_config": {"unclean.leader.election.enable": "false"}}),
            HistoryFacts::default()
        )
        .is_empty());
    }

    #[test]
    fn mirroring_without_support_allows_mirror_anomalies_under_unclean() {
        let facts = HistoryFacts {
            forced_unclean: true,
            clusters: 2,
            ..HistoryFacts::default()
        };
        let got = allowed(json!({}), facts.clone());
        assert!(got.contains(&"mirror-divergence".to_owned()));
        assert!(got.contains(&"epoch-ownership".to_owned()));
        assert!(!got.contains(&"divergence".to_owned()));
        let supported = allowed(
            json!({"topic_config": {"mirror.support.unclean.leader.election": "true"}}),
            facts,
        );
        assert!(!supported.contains(&"mirror-divergence".to_owned()));
    }

    #[test]
    fn a_cluster_wide_power_loss_excuses_lost_writes_and_divergence_unless_flushing_each_message() {
        let power = HistoryFacts {
            cluster_power_loss: true,
            ..HistoryFacts::default()
        };
        let excused = vec!["divergence", "inconsistent-offsets", "lost-write"];
        for config in [
            json!({}),
            json!({"broker_config": {"log.flush.interval.messages": "10000"}}),
            json!({"broker_config": {"log.flush.interval.messages": 2}}),
        ] {
            assert_eq!(allowed(config.clone(), power.clone()), excused, "{config}");
        }
        for config in [
            json!({"broker_config": {"log.flush.interval.messages": "1"}}),
            json!({"broker_config": {"log.flush.interval.messages": 1}}),
        ] {
            assert!(
                allowed(config.clone(), power.clone()).is_empty(),
                "{config}"
            );
        }
        // A power loss of some nodes only excuses nothing, whatever the flush policy.
        assert!(allowed(json!({}), HistoryFacts::default()).is_empty());
    }

    #[test]
    fn explicit_list_overrides() {
        let got = allowed(
            json!({"allowed_anomalies": ["duplicate"], "unclean_leader_election": true}),
            HistoryFacts::default(),
        );
        assert_eq!(got, vec!["duplicate"]);
    }

    #[test]
    fn config_ops_can_enable_unclean() {
        assert!(config_op_enables_unclean(
            &json!({"cluster": "a", "set": {"unclean.leader.election.enable": "true"}})
        ));
        assert!(!config_op_enables_unclean(
            &json!({"set": {"mirror.support.unclean.leader.election": "true"}})
        ));
    }
}
