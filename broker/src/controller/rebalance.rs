//! Automatic preferred-leader rebalance (`auto.leader.rebalance.enable`): every
//! `leader.imbalance.check.interval.seconds` the active controller elects the preferred replica
//! (the first of the assignment) of every partition it does not lead while it could: in the ISR,
//! registered, not fenced, not shutting down. As in KRaft's `maybeBalancePartitionLeaders`,
//! every imbalanced partition is balanced (ZooKeeper mode's per-broker percentage is not used).
//! After a rolling restart this brings leadership back where the assignment put it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{ControllerCommand, Election, MetadataQuorum};
use crate::metadata::MetadataImage;
use crate::pause::sleep_or_cancel;

/// The partitions whose preferred replica could lead but does not. Pure.
pub fn imbalanced_partitions(image: &MetadataImage) -> Vec<(String, i32)> {
    let eligible = |id: i32| {
        image
            .brokers
            .get(&id)
            .is_some_and(|b| !b.fenced && !b.shutting_down)
    };
    image
        .topics
        .values()
        .flat_map(|t| {
            t.partitions
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    p.replicas.first().is_some_and(|preferred| {
                        p.leader != *preferred && p.isr.contains(preferred) && eligible(*preferred)
                    })
                })
                .map(|(i, _)| (t.name.clone(), i as i32))
        })
        .collect()
}

/// On the active controller, every `interval`: preferred elections for the imbalanced
/// partitions.
pub async fn run(quorum: Arc<dyn MetadataQuorum>, interval: Duration, shutdown: CancellationToken) {
    loop {
        if sleep_or_cancel(&shutdown, interval).await {
            return;
        }
        if !quorum.is_active() {
            continue;
        }
        let image = quorum.image().borrow().clone();
        let imbalanced = imbalanced_partitions(&image);
        if imbalanced.is_empty() {
            continue;
        }
        info!(partitions = ?imbalanced, "leader imbalance: electing preferred replicas");
        let cmd = ControllerCommand::ElectLeaders {
            election: Election::Preferred,
            partitions: Some(imbalanced),
        };
        if let Err(e) = quorum.submit(cmd).await {
            debug!("preferred elections not committed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{BrokerEndpoint, PartitionRegistration, TopicRegistration};

    fn broker(id: i32, fenced: bool, shutting_down: bool) -> (i32, BrokerEndpoint) {
        let b = BrokerEndpoint {
            id,
            host: "h".into(),
            port: 1,
            incarnation: 1,
            fenced,
            shutting_down,
            directory_id: None,
        };
        (id, b)
    }

    fn part(replicas: &[i32], leader: i32, isr: &[i32]) -> PartitionRegistration {
        PartitionRegistration {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            leader,
            leader_epoch: 1,
            partition_epoch: 1,
            leader_recovery_state: Default::default(),
            elr: Vec::new(),
            last_known_leader: None,
        }
    }

    #[test]
    fn only_partitions_whose_preferred_replica_could_lead() {
        let mut image = MetadataImage {
            brokers: [
                broker(1, false, false),
                broker(2, false, false),
                broker(3, true, false),
                broker(4, false, true),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let partitions = vec![
            part(&[1, 2], 1, &[1, 2]), // balanced
            part(&[1, 2], 2, &[1, 2]), // imbalanced
            part(&[1, 2], 2, &[2]),    // preferred out of the ISR
            part(&[3, 2], 2, &[2, 3]), // preferred fenced
            part(&[4, 2], 2, &[2, 4]), // preferred shutting down
            part(&[2, 1], -1, &[2]),   // leaderless, preferred in the ISR
        ];
        image.topics.insert(
            "t".into(),
            TopicRegistration {
                name: "t".into(),
                id: uuid::Uuid::nil(),
                partitions,
                configs: Default::default(),
                mirror: None,
            },
        );
        assert_eq!(
            imbalanced_partitions(&image),
            vec![("t".to_string(), 1), ("t".to_string(), 5)]
        );
    }
}
