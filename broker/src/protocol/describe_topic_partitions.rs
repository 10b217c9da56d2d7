//! DescribeTopicPartitions (API 75, KIP-966): Metadata's partition view plus what Metadata cannot
//! carry, each partition's eligible leader replicas and last known ELR, in pages of at most
//! `response_partition_limit` partitions with a cursor to the next one, as Kafka's admin client
//! (`describeTopics`) reads it. Pure over the metadata image.

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::errors;
use crate::metadata::{MetadataImage, TopicRegistration};

/// The most partitions one response holds (Kafka's `max.request.partition.size.limit`).
pub const PARTITION_LIMIT: usize = 2000;

/// Kafka's "authorized operations not asked for".
const OPERATIONS_NOT_ASKED: i32 = i32::MIN;

/// Answers from `image`; `leaders_known` is false while this broker's image may be stale (it then
/// names no leaders, as Metadata does).
pub fn describe_topic_partitions(
    image: &MetadataImage,
    leaders_known: bool,
    req: &DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let mut names: Vec<String> = if req.topics.is_empty() {
        image.topics.keys().cloned().collect()
    } else {
        req.topics.iter().map(|t| t.name.0.to_string()).collect()
    };
    names.sort();
    names.dedup();
    let mut resp = DescribeTopicPartitionsResponse::default();
    let cursor = req.cursor.as_ref().map(|c| {
        (
            c.topic_name.0.to_string(),
            c.partition_index.max(0) as usize,
        )
    });
    if let Some((topic, _)) = &cursor {
        if !req.topics.is_empty() && !names.contains(topic) {
            // Kafka refuses a cursor on a topic the request does not name.
            resp.topics = names
                .into_iter()
                .map(|n| unknown(n, ResponseError::InvalidRequest.code()))
                .collect();
            return resp;
        }
    }
    let limit = match usize::try_from(req.response_partition_limit) {
        Ok(n) if n > 0 => n.min(PARTITION_LIMIT),
        _ => PARTITION_LIMIT,
    };
    let mut room = limit;
    for name in names {
        let first = match &cursor {
            Some((topic, _)) if name < *topic => continue,
            Some((topic, index)) if name == *topic => *index,
            _ => 0,
        };
        let Some(t) = image.topics.get(&name) else {
            resp.topics
                .push(unknown(name, errors::UNKNOWN_TOPIC_OR_PARTITION));
            continue;
        };
        if room == 0 {
            resp.next_cursor = Some(next(&name, first));
            break;
        }
        let last = t.partitions.len().min(first + room);
        resp.topics
            .push(describe(image, t, first..last, leaders_known));
        room -= last.saturating_sub(first);
        if last < t.partitions.len() {
            resp.next_cursor = Some(next(&name, last));
            break;
        }
    }
    resp
}

fn next(topic: &str, partition: usize) -> Cursor {
    Cursor::default()
        .with_topic_name(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partition_index(partition as i32)
}

fn unknown(name: String, error_code: i16) -> DescribeTopicPartitionsResponseTopic {
    DescribeTopicPartitionsResponseTopic::default()
        .with_error_code(error_code)
        .with_name(Some(TopicName(StrBytes::from_string(name))))
        .with_topic_authorized_operations(OPERATIONS_NOT_ASKED)
}

fn describe(
    image: &MetadataImage,
    t: &TopicRegistration,
    partitions: std::ops::Range<usize>,
    leaders_known: bool,
) -> DescribeTopicPartitionsResponseTopic {
    let ids = |v: &[i32]| v.iter().map(|r| BrokerId(*r)).collect::<Vec<_>>();
    DescribeTopicPartitionsResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(t.name.clone()))))
        .with_topic_id(t.id)
        .with_is_internal(t.name == crate::group::OFFSETS_TOPIC)
        .with_topic_authorized_operations(OPERATIONS_NOT_ASKED)
        .with_partitions(
            partitions
                .filter_map(|i| Some((i, t.partitions.get(i)?)))
                .map(|(i, p)| {
                    let (leader, epoch) = if leaders_known {
                        (p.leader, p.leader_epoch)
                    } else {
                        (-1, -1)
                    };
                    DescribeTopicPartitionsResponsePartition::default()
                        .with_error_code(if leader < 0 {
                            ResponseError::LeaderNotAvailable.code()
                        } else {
                            errors::NONE
                        })
                        .with_partition_index(i as i32)
                        .with_leader_id(BrokerId(leader))
                        .with_leader_epoch(epoch)
                        .with_replica_nodes(ids(&p.replicas))
                        .with_isr_nodes(ids(&p.isr))
                        .with_offline_replicas(ids(&image.offline_replicas(p)))
                        .with_eligible_leader_replicas(Some(ids(&p.elr)))
                        // Our controller keeps KIP-966's last known leader, the one replica
                        // balanced recovery elects once the ISR and ELR are empty.
                        .with_last_known_elr(Some(ids(&p
                            .last_known_leader
                            .into_iter()
                            .collect::<Vec<_>>())))
                })
                .collect(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::PartitionRegistration;
    use kafka_protocol::messages::describe_topic_partitions_request::{
        Cursor as RequestCursor, TopicRequest,
    };

    fn partition(
        leader: i32,
        isr: &[i32],
        elr: &[i32],
        last: Option<i32>,
    ) -> PartitionRegistration {
        PartitionRegistration {
            replicas: vec![1, 2, 3],
            isr: isr.to_vec(),
            leader,
            leader_epoch: 4,
            partition_epoch: 9,
            leader_recovery_state: Default::default(),
            elr: elr.to_vec(),
            last_known_leader: last,
        }
    }

    fn image() -> MetadataImage {
        let mut image = MetadataImage::default();
        for (name, n) in [("b", 3), ("a", 2)] {
            image.topics.insert(
                name.to_string(),
                TopicRegistration {
                    name: name.to_string(),
                    id: uuid::Uuid::from_u128(n as u128),
                    partitions: (0..n)
                        .map(|_| partition(1, &[1, 2, 3], &[], None))
                        .collect(),
                    configs: Default::default(),
                    mirror: None,
                },
            );
        }
        image
    }

    fn request(
        topics: &[&str],
        limit: i32,
        cursor: Option<(&str, i32)>,
    ) -> DescribeTopicPartitionsRequest {
        DescribeTopicPartitionsRequest::default()
            .with_topics(
                topics
                    .iter()
                    .map(|t| {
                        TopicRequest::default()
                            .with_name(TopicName(StrBytes::from_string(t.to_string())))
                    })
                    .collect(),
            )
            .with_response_partition_limit(limit)
            .with_cursor(cursor.map(|(t, p)| {
                RequestCursor::default()
                    .with_topic_name(TopicName(StrBytes::from_string(t.to_string())))
                    .with_partition_index(p)
            }))
    }

    /// A page as (topic, partition indices) of each topic answered, and the next cursor.
    type Page = (Vec<(String, Vec<i32>)>, Option<(String, i32)>);

    fn pages(resp: &DescribeTopicPartitionsResponse) -> Page {
        (
            resp.topics
                .iter()
                .map(|t| {
                    (
                        t.name.as_ref().unwrap().0.to_string(),
                        t.partitions.iter().map(|p| p.partition_index).collect(),
                    )
                })
                .collect(),
            resp.next_cursor
                .as_ref()
                .map(|c| (c.topic_name.0.to_string(), c.partition_index)),
        )
    }

    #[test]
    fn every_topic_in_name_order_in_pages_with_a_cursor_to_the_next_partition() {
        let img = image();
        let all = describe_topic_partitions(&img, true, &request(&[], 2000, None));
        assert_eq!(
            pages(&all),
            (
                vec![("a".into(), vec![0, 1]), ("b".into(), vec![0, 1, 2])],
                None
            )
        );
        let first = describe_topic_partitions(&img, true, &request(&[], 3, None));
        assert_eq!(
            pages(&first),
            (
                vec![("a".into(), vec![0, 1]), ("b".into(), vec![0])],
                Some(("b".into(), 1))
            )
        );
        let rest = describe_topic_partitions(&img, true, &request(&[], 3, Some(("b", 1))));
        assert_eq!(pages(&rest), (vec![("b".into(), vec![1, 2])], None));
        // A page that ends with a topic points at the next one.
        let exact = describe_topic_partitions(&img, true, &request(&[], 2, None));
        assert_eq!(
            pages(&exact),
            (vec![("a".into(), vec![0, 1])], Some(("b".into(), 0)))
        );
    }

    #[test]
    fn eligible_and_last_known_replicas_are_answered_and_unknown_topics_named() {
        let mut img = image();
        img.topics.get_mut("b").unwrap().partitions[1] = partition(-1, &[], &[2, 3], None);
        img.topics.get_mut("b").unwrap().partitions[2] = partition(-1, &[], &[], Some(1));
        let resp = describe_topic_partitions(&img, true, &request(&["zz", "b"], 0, None));
        let b = &resp.topics[0];
        assert_eq!(b.topic_id, uuid::Uuid::from_u128(3));
        let elr: Vec<_> = b
            .partitions
            .iter()
            .map(|p| {
                (
                    p.error_code,
                    p.eligible_leader_replicas.clone().unwrap(),
                    p.last_known_elr.clone().unwrap(),
                )
            })
            .collect();
        let not_available = ResponseError::LeaderNotAvailable.code();
        assert_eq!(
            elr,
            vec![
                (0, vec![], vec![]),
                (not_available, vec![BrokerId(2), BrokerId(3)], vec![]),
                (not_available, vec![], vec![BrokerId(1)]),
            ]
        );
        assert_eq!(resp.topics[1].name.as_ref().unwrap().0.as_str(), "zz");
        assert_eq!(
            resp.topics[1].error_code,
            errors::UNKNOWN_TOPIC_OR_PARTITION
        );
    }

    #[test]
    fn replicas_on_fenced_or_unregistered_brokers_are_offline() {
        let mut img = image();
        for (id, fenced) in [(1, false), (2, true)] {
            img.brokers.insert(
                id,
                crate::metadata::BrokerEndpoint {
                    id,
                    host: "127.0.0.1".into(),
                    port: 9092,
                    incarnation: 1,
                    fenced,
                    shutting_down: false,
                    directory_id: None,
                },
            );
        }
        let resp = describe_topic_partitions(&img, true, &request(&["a"], 0, None));
        for p in &resp.topics[0].partitions {
            assert_eq!(p.offline_replicas, [BrokerId(2), BrokerId(3)]);
        }
    }

    #[test]
    fn a_cursor_on_a_topic_not_asked_for_is_refused() {
        let resp = describe_topic_partitions(&image(), true, &request(&["a"], 10, Some(("b", 0))));
        assert_eq!(resp.topics.len(), 1);
        assert_eq!(
            resp.topics[0].error_code,
            ResponseError::InvalidRequest.code()
        );
    }

    #[test]
    fn a_broker_still_catching_up_names_no_leaders() {
        let resp = describe_topic_partitions(&image(), false, &request(&["a"], 10, None));
        assert!(resp.topics[0]
            .partitions
            .iter()
            .all(|p| p.leader_id.0 == -1 && p.leader_epoch == -1));
    }
}
