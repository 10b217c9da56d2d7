//! The tiered workload: the queue on topics with tiered storage on (KIP-405), set up so that data
//! really moves to the remote store within a short run. Segments are small (`segment.bytes`
//! 512: a few sends each, a few seconds at the default rate), the leader uploads every half
//! second, and local retention keeps uploaded segments for five seconds (a segment or two), so each leader's local log starts at an
//! uploaded segment below the earliest offset pending upload: a follower that starts from the remote store must choose
//! between the two (KIP-1023), and polls that seek back land on remote offsets. Brokers fetch
//! from the last tiered offset (`follower.fetch.last.tiered.offset.enable`). `tidemark test`
//! gives it idempotent producers by default: their state is what a follower rebuilds from the
//! remote store's producer snapshot.
//!
//! The nemesis kinds `wipe` and `remote-outage` are this workload's; the checkers add the remote
//! store to the final logs and judge the wipes' records (`tidemark_checkers::tiered`).

use std::collections::BTreeMap;

use tidemark_checkers::tiered::FETCH_LAST_TIERED_OFFSET_KEY;

use crate::queue::{Queue, QueueOptions};

/// The workload's name.
pub const NAME: &str = "tiered";

/// Topic configs of the workload's topics.
pub fn topic_configs() -> BTreeMap<String, String> {
    [
        ("remote.storage.enable", "true"),
        ("segment.bytes", "512"),
        ("local.retention.ms", "5000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Broker settings the workload needs (a test's own `--broker-config` wins).
pub fn broker_settings() -> [(&'static str, &'static str); 2] {
    [
        ("remote.log.manager.task.interval.ms", "500"),
        (FETCH_LAST_TIERED_OFFSET_KEY, "true"),
    ]
}

/// The queue `options` on tiered topics, seeking back more often so polls read remote offsets.
pub fn workload(options: QueueOptions) -> Queue {
    Queue::named(
        QueueOptions {
            topic_configs: topic_configs(),
            seek_back_probability: 0.25,
            ..options
        },
        NAME,
    )
}
