//! A leader's append of produced records and the acks=all wait for its ISR, apart from the
//! broker: the produce API and the group coordinator (which appends to `__consumer_offsets`)
//! both append through here, so neither needs the other's view of the broker.

use std::sync::Arc;
use std::time::Duration;

use crate::errors;
use crate::partition::{AckCheck, Partition};

/// One partition's answer to a produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceResult {
    pub error: i16,
    pub base_offset: i64,
    pub log_start_offset: i64,
    pub message: Option<String>,
}

impl ProduceResult {
    /// A refused or failed produce.
    pub fn failed(error: i16, message: String) -> Self {
        ProduceResult {
            error,
            base_offset: -1,
            log_start_offset: -1,
            message: Some(message),
        }
    }
}

/// Injected bugs of the acks=all path (see `faults.rs`); the default is the correct broker.
#[derive(Clone, Copy, Debug, Default)]
pub struct AckBugs {
    /// `ack-before-replication`: acks=all is answered as soon as the leader has appended.
    pub ack_before_replication: bool,
    /// `ack-on-leadership-loss`: a wait cut short by a leadership change answers success.
    pub ack_on_leadership_loss: bool,
}

/// An acks=all append waiting for the ISR.
pub struct PendingAck {
    partition: Arc<Partition>,
    /// The high watermark that acknowledges the append.
    required: i64,
    /// The leader epoch it was appended in; a change means the append may be truncated.
    epoch: i32,
    ok: ProduceResult,
    /// Whether a leadership change answers success (the injected `ack-on-leadership-loss`).
    ack_on_leadership_loss: bool,
}

/// Appends records to `p` as its leader. For acks=all the result is the pending
/// acknowledgement to pass to [`await_ack`]; otherwise the final answer. The caller wakes the
/// data watchers.
pub fn append(
    p: Arc<Partition>,
    records: &[u8],
    acks: i16,
    bugs: AckBugs,
) -> Result<PendingAck, ProduceResult> {
    let appended = p
        .append_records_to_leader(records, acks)
        .map_err(|(code, msg)| ProduceResult::failed(code, msg))?;
    let ok = ProduceResult {
        error: errors::NONE,
        base_offset: appended.info.first_offset,
        log_start_offset: appended.log_start_offset,
        message: None,
    };
    if acks != -1 || bugs.ack_before_replication {
        return Err(ok);
    }
    Ok(PendingAck {
        partition: p,
        required: appended.info.last_offset + 1,
        epoch: appended.leader_epoch,
        ok,
        ack_on_leadership_loss: bugs.ack_on_leadership_loss,
    })
}

/// Waits until the ISR has an acks=all append (the high watermark passes it), leadership is
/// lost, or `timeout` runs out.
pub async fn await_ack(pending: PendingAck, timeout: Duration) -> ProduceResult {
    let PendingAck {
        partition: p,
        required,
        epoch,
        ok,
        ack_on_leadership_loss,
    } = pending;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut rx = p.watch_high_watermark();
    loop {
        match p.check_enough_replicas_reach_offset(required, epoch) {
            AckCheck::Reached => return ok,
            // The injected bug answers success for a write the new leader may never have had.
            AckCheck::LeadershipChanged if ack_on_leadership_loss => return ok,
            AckCheck::LeadershipChanged => {
                return ProduceResult::failed(
                    errors::NOT_LEADER_OR_FOLLOWER,
                    "leadership changed while waiting for the ISR".into(),
                )
            }
            AckCheck::Waiting => {}
        }
        // Leadership changes do not move the high watermark, so poll as well as wait.
        let tick = (deadline - tokio::time::Instant::now()).min(Duration::from_millis(100));
        if tick.is_zero() {
            break;
        }
        let _ = tokio::time::timeout(tick, rx.changed()).await;
    }
    if p.isr_below_min() {
        ProduceResult::failed(
            errors::NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            "ISR shrank below min.insync.replicas".into(),
        )
    } else {
        ProduceResult::failed(
            errors::REQUEST_TIMED_OUT,
            format!("ISR did not reach offset {required} in time"),
        )
    }
}
