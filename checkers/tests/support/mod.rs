//! Builders for small histories and replica states, shared by the integration tests.

#![allow(dead_code)]

pub mod sim;

use serde_json::{json, Value};
use tidemark_checkers::{EpochEntry, Op, OpType, Process, Record, ReplicaState, Results};

/// A history under construction; ops get dense indices in the order they are added.
#[derive(Default)]
pub struct Hist {
    pub ops: Vec<Op>,
}

impl Hist {
    pub fn new() -> Self {
        Hist::default()
    }

    pub fn push(
        &mut self,
        process: Process,
        kind: OpType,
        f: &str,
        value: Value,
        cluster: Option<&str>,
    ) -> u64 {
        let index = self.ops.len() as u64;
        self.ops.push(Op {
            index,
            time: index * 1000,
            process,
            kind,
            f: f.into(),
            value,
            node: None,
            cluster: cluster.map(str::to_owned),
            error: None,
        });
        index
    }

    /// A send of `values` to t/0 completing with `outcome`; returns the completion's index.
    pub fn send(&mut self, p: u64, values: &[i64], outcome: OpType, offset: Option<i64>) -> u64 {
        self.send_on(None, p, values, outcome, offset)
    }

    pub fn send_on(
        &mut self,
        cluster: Option<&str>,
        p: u64,
        values: &[i64],
        outcome: OpType,
        offset: Option<i64>,
    ) -> u64 {
        self.send_invoke(cluster, p, values);
        self.send_done(cluster, p, values, outcome, offset)
    }

    /// The invocation of a send of `values` to t/0.
    pub fn send_invoke(&mut self, cluster: Option<&str>, p: u64, values: &[i64]) -> u64 {
        self.push(
            Process::Client(p),
            OpType::Invoke,
            "send",
            send_value(values),
            cluster,
        )
    }

    /// The completion of a send of `values` to t/0, at `offset` when given.
    pub fn send_done(
        &mut self,
        cluster: Option<&str>,
        p: u64,
        values: &[i64],
        outcome: OpType,
        offset: Option<i64>,
    ) -> u64 {
        let mut done = send_value(values);
        if let Some(o) = offset {
            done["offset"] = json!(o);
        }
        self.push(Process::Client(p), outcome, "send", done, cluster)
    }

    /// An ok poll of t/0 from `from` returning `records` as (offset, value, epoch).
    pub fn poll(&mut self, p: u64, from: i64, records: &[(i64, i64, i64)], hw: Option<i64>) -> u64 {
        self.poll_on(None, p, from, records, hw)
    }

    pub fn poll_on(
        &mut self,
        cluster: Option<&str>,
        p: u64,
        from: i64,
        records: &[(i64, i64, i64)],
        hw: Option<i64>,
    ) -> u64 {
        let inv = json!({"topic": "t", "partition": 0, "from": from});
        self.push(
            Process::Client(p),
            OpType::Invoke,
            "poll",
            inv.clone(),
            cluster,
        );
        let mut done = inv;
        done["records"] = json!(records
            .iter()
            .map(|&(o, v, e)| [o, v, e])
            .collect::<Vec<_>>());
        if let Some(hw) = hw {
            done["high_watermark"] = json!(hw);
        }
        self.push(Process::Client(p), OpType::Ok, "poll", done, cluster)
    }

    /// An ok poll of t/0 that read nothing, served under `leader_epoch`, seeing `hw`.
    pub fn poll_in_epoch(&mut self, p: u64, hw: i64, leader_epoch: i64) -> u64 {
        let inv = json!({"topic": "t", "partition": 0, "from": 0});
        self.push(
            Process::Client(p),
            OpType::Invoke,
            "poll",
            inv.clone(),
            None,
        );
        let mut done = inv;
        done["high_watermark"] = json!(hw);
        done["leader_epoch"] = json!(leader_epoch);
        self.push(Process::Client(p), OpType::Ok, "poll", done, None)
    }

    /// The invocation alone of a nemesis op (a heal, whose completion does not matter).
    pub fn nemesis_invoke(&mut self, f: &str, value: Value) -> u64 {
        self.push(Process::Nemesis, OpType::Invoke, f, value, None)
    }

    /// A nemesis fault: an invoke then an info with `value`.
    pub fn nemesis(&mut self, f: &str, value: Value) {
        self.push(Process::Nemesis, OpType::Invoke, f, json!({}), None);
        self.push(Process::Nemesis, OpType::Info, f, value, None);
    }
}

/// The value of a send of `values` to t/0, as its invocation records it.
fn send_value(values: &[i64]) -> Value {
    json!({"topic": "t", "partition": 0, "values": values})
}

/// A replica of t/0 holding `records` (offset, value, epoch), with an epoch cache derived from
/// them and its high watermark at `hw`.
pub fn replica(
    cluster: &str,
    node: &str,
    leader: bool,
    hw: i64,
    records: &[(i64, i64, i64)],
) -> ReplicaState {
    let mut epochs: Vec<EpochEntry> = Vec::new();
    for &(o, _, e) in records {
        if epochs.last().is_none_or(|l| l.epoch != e) {
            epochs.push(EpochEntry {
                epoch: e,
                start_offset: o,
            });
        }
    }
    ReplicaState {
        cluster: cluster.into(),
        node: node.into(),
        topic: "t".into(),
        partition: 0,
        role: Some(if leader { "leader" } else { "follower" }.into()),
        log_start_offset: Some(0),
        high_watermark: Some(hw),
        log_end_offset: Some(records.last().map_or(0, |r| r.0 + 1)),
        epochs,
        records: records
            .iter()
            .map(|&(o, v, e)| Record::new(o, v, e))
            .collect(),
        error: None,
        tiered: None,
        remote_bootstrap: None,
        producers: None,
        unclean_elections: Vec::new(),
    }
}

/// The whole history as `history.jsonl` text.
pub fn to_jsonl(test: &Value, ops: &[Op]) -> String {
    let mut out = serde_json::to_string(&json!({"tidemark_history": 1, "test": test})).unwrap();
    out.push('\n');
    for op in ops {
        out.push_str(&serde_json::to_string(op).unwrap());
        out.push('\n');
    }
    out
}

/// Replica states as `replicas.jsonl` text.
pub fn replicas_jsonl(replicas: &[ReplicaState]) -> String {
    replicas
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect()
}

/// Asserts that the test's guarantees forbid `kind` in `r`.
pub fn assert_forbids(r: &Results, kind: &str) {
    assert!(
        r.bad_anomaly_types.iter().any(|k| k == kind),
        "{kind} not forbidden: {}",
        r.summary(5)
    );
}

/// The entries of one anomaly type (empty when it was not found).
pub fn entries<'a>(r: &'a Results, kind: &str) -> &'a [Value] {
    r.anomalies.get(kind).map_or(&[], |e| &e[..])
}
