//! DeleteRecords (Kafka's `AdminClient.deleteRecords`): the leader moves each partition's log
//! start offset, then, as Kafka's `DelayedDeleteRecords` does, answers once the low watermark
//! (the smallest log start of the leader and its ISR followers, learnt from their fetches) has
//! reached it, or the request's timeout ran out (REQUEST_TIMED_OUT).

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use crate::broker::Broker;
use crate::errors;

pub async fn delete_records(
    broker: &Arc<Broker>,
    req: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    let mut resp = DeleteRecordsResponse::default();
    for topic in req.topics {
        let name = topic.name.0.to_string();
        let mut tr = DeleteRecordsTopicResult::default().with_name(topic.name.clone());
        for p in topic.partitions {
            let result = match broker.partition(&name, p.partition_index) {
                None => Err(broker.not_hosted_error(&name, p.partition_index)),
                Some(part) => match part.delete_records(p.offset) {
                    Ok(target) => Ok((part, target)),
                    Err(code) => Err(code),
                },
            };
            let pr =
                DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            tr.partitions.push(match result {
                Err(code) => pr.with_low_watermark(-1).with_error_code(code),
                Ok((part, target)) => {
                    // Followers learn the new start from the leader's fetch answers and report
                    // theirs in their next fetch; every report wakes this wait.
                    let mut data = broker.watch_data();
                    loop {
                        match part.low_watermark() {
                            None => {
                                break pr
                                    .with_low_watermark(-1)
                                    .with_error_code(errors::NOT_LEADER_OR_FOLLOWER)
                            }
                            Some(low) if low >= target => break pr.with_low_watermark(low),
                            Some(low) => {
                                let tick = Duration::from_millis(100);
                                let now = tokio::time::Instant::now();
                                if now >= deadline {
                                    break pr
                                        .with_low_watermark(low)
                                        .with_error_code(errors::REQUEST_TIMED_OUT);
                                }
                                let _ =
                                    tokio::time::timeout(tick.min(deadline - now), data.changed())
                                        .await;
                            }
                        }
                    }
                }
            });
        }
        resp.topics.push(tr);
    }
    resp
}
