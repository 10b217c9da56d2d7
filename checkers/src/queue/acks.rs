//! The ack-above-high-watermark check. A leader acknowledges an acks=all send only once its
//! high watermark has passed the records (the ISR holds them), and within one leader epoch a
//! leader's high watermark never goes back (I4). So when a node acknowledged a record written
//! in leader epoch `e`, and later served a poll under `e`, that poll must report a high
//! watermark above the record's offset: the node led in `e` at both times, its epochs only
//! rise, and the record existed when it was acknowledged, so the acknowledgement too came
//! under `e`. One that reports it at or below proves that the leader acknowledged what its ISR
//! did not yet hold, whether or not a later failure loses it.
//!
//! The same node on both sides matters: an idempotent producer's retry may be acknowledged by
//! the next leader, which found the batch already replicated, while the old leader, cut off
//! from the controllers, still serves polls under the epoch it wrote the batch in.
//!
//! While the ops stream past, the highest offset each node acknowledged so far is kept per
//! partition as rising steps (pruned to what open invocations can still ask about, as the high
//! watermarks are), and a poll that reports a high watermark at or below the highest offset
//! its node acknowledged before it was invoked is kept as a suspect: few for a broker that
//! keeps the rule. Whether that acknowledged record was written in the poll's epoch is decided
//! at the end, from the final log.

use rustc_hash::FxHashMap;

use super::hws::RisingSteps;

/// A poll that reported a high watermark at or below an offset its node acknowledged before
/// the poll was invoked.
#[derive(Debug, Clone, Copy)]
pub(super) struct Suspect {
    pub pk: u32,
    /// The leader epoch the poll was served under.
    pub epoch: i64,
    pub poll: u64,
    pub process: u64,
    pub high_watermark: i64,
    /// The send that acknowledged the highest offset before the poll, and that offset.
    pub send: u64,
    pub acked: i64,
}

/// Acknowledged offsets per partition and node, and the polls that may contradict them.
#[derive(Debug, Default)]
pub(super) struct AckedOffsets {
    nodes: FxHashMap<String, u32>,
    /// Per partition and acknowledging node: the highest offset acknowledged by the sends
    /// completed so far, and the send that reached it.
    acked: RisingSteps<(u32, u32)>,
    suspects: Vec<Suspect>,
}

impl AckedOffsets {
    fn node_id(&mut self, node: &str) -> u32 {
        if let Some(&id) = self.nodes.get(node) {
            return id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.insert(node.to_owned(), id);
        id
    }

    /// A send on partition `pk` completed `ok` at op `op` from `node`, its last record at
    /// `last_offset`. `open_since` yields the lowest invocation still open.
    pub fn acknowledged(
        &mut self,
        pk: u32,
        node: &str,
        op: u64,
        last_offset: i64,
        open_since: impl FnOnce() -> Option<u64>,
    ) {
        let key = (pk, self.node_id(node));
        self.acked.record(key, op, last_offset, open_since);
    }

    /// An `ok` poll of `pk` served by `node` under leader epoch `epoch`, invoked at `invoked`
    /// and completed at `poll`, reported `high_watermark`.
    pub fn polled(
        &mut self,
        (pk, node, epoch): (u32, &str, i64),
        (poll, process, invoked): (u64, u64, u64),
        high_watermark: i64,
    ) {
        let Some(&n) = self.nodes.get(node) else {
            return;
        };
        let Some((send, acked)) = self.acked.before(&(pk, n), invoked) else {
            return;
        };
        if acked >= high_watermark {
            self.suspects.push(Suspect {
                pk,
                epoch,
                poll,
                process,
                high_watermark,
                send,
                acked,
            });
        }
    }

    /// The suspects, in history order.
    pub fn suspects(&self) -> &[Suspect] {
        &self.suspects
    }
}
