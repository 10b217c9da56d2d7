//! Waiting that gives way to shutdown: the broker's background loops (fencing, followers,
//! mirrors) back off between rounds but must stop at once when their task is cancelled.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Sleeps for `d` unless `cancel` fires first; true when it did.
pub async fn sleep_or_cancel(cancel: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}
