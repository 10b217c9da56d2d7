//! `eligible-passed-over`: Kafka's eligible leader replicas test (KIP-966), judged from a
//! `last-stand`'s own record. Its followers left one by one, each recorded with the ISR as read
//! once it had gone. The controller keeps as eligible leader replicas those removed from the ISR
//! while it was below `min.insync.replicas` (cleared whenever the ISR is back at the minimum),
//! less any back from an unclean shutdown (a crash, a power loss): with the strict min ISR rule
//! the high watermark cannot have passed their log ends. So when the leader dies one of them
//! must lead, and Kafka's test asserts it. A last stand that recorded the next leader
//! (`elected`; not waited for when none was eligible) names one outside them, or none within its
//! wait while one was back: the controller passed an eligible replica over. Electing another is
//! an unclean election that loses what it lacks; electing none leaves the partition offline with
//! a replica that may lead at hand.
//!
//! Judged only where the broker keeps eligible leader replicas (`eligible.leader.replicas.version`
//! 1, which tidemark's broker has by default) and `min.insync.replicas` is known. The ISR as read
//! errs towards eligibility: a replica dropped together with the one that left, in one read,
//! counts as eligible with it.

use serde_json::{json, Value};

use super::event::StandBody;
use crate::results::{Anomalies, AnomalyKind};

const ELR_KEY: &str = "eligible.leader.replicas.version";

/// The last stands of a history.
#[derive(Debug, Default)]
pub(super) struct Stands {
    found: Vec<(u64, String, StandBody)>,
}

impl Stands {
    /// A `last-stand` completion at op `index` in `cluster`.
    pub fn observe(&mut self, index: u64, cluster: &str, body: StandBody) {
        self.found.push((index, cluster.to_owned(), body));
    }

    /// One `eligible-passed-over` entry per last stand whose next leader was none or another
    /// than its eligible replicas, when `test`'s broker keeps them; `min_insync` gives each
    /// topic's setting.
    pub fn check(
        &self,
        test: &Value,
        min_insync: impl Fn(&str) -> Option<u64>,
        anomalies: &mut Anomalies,
    ) {
        if !keeps_eligible_replicas(test) {
            return;
        }
        for (index, cluster, stand) in &self.found {
            let (Some(topic), Some(partition), Some(elected)) =
                (&stand.topic, stand.partition, &stand.elected)
            else {
                continue;
            };
            let Some(eligible) = min_insync(topic).and_then(|min| eligible(stand, min)) else {
                continue;
            };
            if eligible.is_empty() || elected.as_ref().is_some_and(|e| eligible.contains(e)) {
                continue;
            }
            anomalies.push(
                AnomalyKind::EligiblePassedOver,
                json!({"cluster": cluster, "topic": topic, "partition": partition,
                       "op_index": index, "killed": stand.killed, "eligible": eligible,
                       "elected": elected}),
            );
        }
    }
}

/// The replicas eligible to lead once the stand's leader was dead and its followers back, as
/// KIP-966 keeps them with `min` in-sync replicas required; `None` when the record cannot tell.
fn eligible(stand: &StandBody, min: u64) -> Option<Vec<String>> {
    let mut isr = stand.isr_at_start.clone()?;
    let mut elr: Vec<String> = Vec::new();
    for d in &stand.left {
        let after = d.isr.clone()?;
        if after.len() as u64 >= min {
            elr.clear();
        } else {
            for r in isr.iter().filter(|r| !after.contains(r)) {
                if !elr.contains(r) {
                    elr.push(r.clone());
                }
            }
        }
        isr = after;
    }
    let unclean = |r: &String| stand.left.iter().any(|d| &d.node == r && !d.how.clean());
    elr.retain(|r| Some(r) != stand.killed.as_ref() && !unclean(r));
    elr.sort();
    Some(elr)
}

/// Whether the test's broker keeps eligible leader replicas: its `broker_config` says so, or
/// names no setting and the broker is tidemark's, which keeps them by default.
fn keeps_eligible_replicas(test: &Value) -> bool {
    let level = test.get("broker_config").and_then(|c| c.get(ELR_KEY));
    match level {
        Some(Value::String(s)) => s.trim() == "1",
        Some(Value::Number(n)) => n.as_u64() == Some(1),
        Some(_) => false,
        None => test.pointer("/broker/name").and_then(Value::as_str) == Some("tidemark-broker"),
    }
}
