//! Producer ids for InitProducerId. A broker takes blocks of ids from the controller
//! (`AllocateProducerIds`, through the quorum's log) and hands them out one by one, so ids are
//! unique across the cluster and across restarts without asking the controller for each.

use std::ops::Range;
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::controller::{ControllerCommand, ControllerReply, MetadataQuorum};
use crate::errors;
use crate::errors::ApiError;

/// The ids this broker still holds.
#[derive(Debug, Default)]
pub struct ProducerIdAllocator {
    block: Mutex<Range<i64>>,
}

impl ProducerIdAllocator {
    /// The next unused producer id; takes a new block from the controller when this one is
    /// used up. Fails when the controller cannot be reached.
    pub async fn next(
        &self,
        quorum: &Arc<dyn MetadataQuorum>,
        broker_id: i32,
    ) -> Result<i64, ApiError> {
        let mut block = self.block.lock().await;
        if block.is_empty() {
            let reply = quorum
                .submit(ControllerCommand::AllocateProducerIds { broker_id })
                .await
                .map_err(|e| {
                    ApiError::new(
                        errors::COORDINATOR_NOT_AVAILABLE,
                        format!("cannot take producer ids from the controller: {e}"),
                    )
                })?;
            *block = match reply {
                ControllerReply::ProducerIds { first, count } => first..first + count,
                ControllerReply::Error { code, message } => {
                    return Err(ApiError::new(code, message))
                }
                other => {
                    return Err(ApiError::new(
                        errors::UNKNOWN_SERVER_ERROR,
                        format!("unexpected controller reply {other:?}"),
                    ))
                }
            };
        }
        let id = block.start;
        block.start += 1;
        Ok(id)
    }
}
