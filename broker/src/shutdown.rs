//! Controlled shutdown (KRaft's `wantShutDown` heartbeat): on SIGTERM the broker asks the
//! controller to move its leaderships to other ISR members and take it out of the ISRs, and
//! closes only once its own metadata shows it leads nothing, so clients and acks=all writers
//! move on at once instead of waiting out the session timeout. A quorum that cannot commit (the
//! whole cluster stopping at once) must not hold a clean close for long: after
//! [`CONTROLLED_SHUTDOWN_LIMIT`] the broker closes anyway and fencing does the rest.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::broker::Broker;
use crate::controller::{ControllerCommand, ControllerReply};

/// How long a broker tries to hand its leaderships over before closing regardless.
pub const CONTROLLED_SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

const RETRY: Duration = Duration::from_millis(100);

/// Hands this broker's leaderships over and waits until its metadata shows none; returns
/// whether that happened within [`CONTROLLED_SHUTDOWN_LIMIT`].
pub async fn controlled_shutdown(broker: &Arc<Broker>) -> bool {
    if !broker.caught_up() {
        // Never registered in this process: it leads nothing the controller would move.
        return true;
    }
    let me = broker.config.node_id;
    let done = tokio::time::timeout(CONTROLLED_SHUTDOWN_LIMIT, async {
        let cmd = ControllerCommand::ControlledShutdown {
            id: me,
            incarnation: broker.incarnation,
        };
        loop {
            match broker.quorum().submit(cmd.clone()).await {
                Ok(ControllerReply::Done) => break,
                Ok(other) => warn!("controlled shutdown refused: {other:?}"),
                Err(e) => info!("controlled shutdown not committed yet: {e}"),
            }
            tokio::time::sleep(RETRY).await;
        }
        let mut applied = broker.watch_applied();
        let _ = applied
            .wait_for(|image| {
                image
                    .topics
                    .values()
                    .all(|t| t.partitions.iter().all(|p| p.leader != me))
            })
            .await;
    })
    .await;
    match done {
        Ok(()) => {
            info!("controlled shutdown: leaderships moved off this broker");
            true
        }
        Err(_) => {
            warn!("controlled shutdown did not complete within {CONTROLLED_SHUTDOWN_LIMIT:?}; closing anyway");
            false
        }
    }
}
