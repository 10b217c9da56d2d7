//! InitProducerId for idempotent producers: a fresh producer id (unique in the cluster) at epoch
//! 0, as Kafka answers a producer without a transactional id. Transactions are not built: a
//! request with a transactional id is refused at once with a message saying so, so a
//! transactional client fails fast instead of retrying.

use std::sync::Arc;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use tracing::{debug, warn};

use crate::broker::Broker;
use crate::errors;

pub async fn init_producer_id(
    broker: &Arc<Broker>,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if let Some(id) = req.transactional_id.as_ref().filter(|t| !t.0.is_empty()) {
        warn!(
            transactional_id = %id.0.as_str(),
            "InitProducerId refused: transactions are not supported by this broker"
        );
        return resp.with_error_code(errors::INVALID_REQUEST);
    }
    match broker
        .producer_ids
        .next(broker.quorum(), broker.config.node_id)
        .await
    {
        Ok(id) => {
            debug!(producer_id = id, "producer id allocated");
            resp.producer_id = ProducerId(id);
            resp.producer_epoch = 0;
        }
        Err(e) => {
            warn!("InitProducerId failed: {}", e.message);
            resp.error_code = e.code;
        }
    }
    resp
}
