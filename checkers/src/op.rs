//! The lines of `history.jsonl`, as data. These types are shared with the harness, which writes
//! histories with them, so the serialized field names are exactly those of `docs/history-format.md`.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// Who performed an operation: a client process (an integer) or the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    /// A logical client process. A process that completes with `info` never invokes again.
    Client(u64),
    /// The fault injector.
    Nemesis,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Client(p) => write!(f, "{p}"),
            Process::Nemesis => f.write_str("nemesis"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Process::Client(p) => s.serialize_u64(*p),
            Process::Nemesis => s.serialize_str("nemesis"),
        }
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ProcessVisitor;
        impl Visitor<'_> for ProcessVisitor {
            type Value = Process;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer or \"nemesis\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Process, E> {
                Ok(Process::Client(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Process, E> {
                u64::try_from(v)
                    .map(Process::Client)
                    .map_err(|_| E::custom(format!("process {v} is negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Process, E> {
                if v == "nemesis" {
                    Ok(Process::Nemesis)
                } else {
                    Err(E::custom(format!(
                        "process {v:?} is neither an integer nor \"nemesis\""
                    )))
                }
            }
        }
        d.deserialize_any(ProcessVisitor)
    }
}

/// The type of a history line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The operation was started.
    Invoke,
    /// It took effect.
    Ok,
    /// It certainly did not take effect.
    Fail,
    /// Unknown whether it took effect.
    Info,
}

/// One line of `history.jsonl` after the header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// 0, 1, 2, ... in file order.
    pub index: u64,
    /// Nanoseconds since the test started.
    pub time: u64,
    /// Who performed it.
    pub process: Process,
    /// Invoke or a completion type.
    #[serde(rename = "type")]
    pub kind: OpType,
    /// The operation, e.g. `send`.
    pub f: String,
    /// Argument on invoke, result on completion.
    #[serde(default)]
    pub value: Value,
    /// Where a client op was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The cluster of that node (the mirror workload names it on every op).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Why a `fail` or `info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Op {
    /// A line at `time` with index 0 (the history writer numbers lines) and no node, cluster or
    /// error.
    pub fn new(
        time: u64,
        process: Process,
        kind: OpType,
        f: impl Into<String>,
        value: Value,
    ) -> Self {
        Op {
            index: 0,
            time,
            process,
            kind,
            f: f.into(),
            value,
            node: None,
            cluster: None,
            error: None,
        }
    }
}

/// The value of a queue `send`: the invocation names topic, partition and values; an `ok`
/// completion adds the offset of the first value when the broker said it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendValue {
    /// The topic written.
    pub topic: String,
    /// The partition written.
    pub partition: i64,
    /// Values, unique within the test; the first lands at `offset`, the next at `offset + 1`.
    pub values: Vec<i64>,
    /// Offset of the first value, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
}

/// The value of a queue `poll`: where it read from and, on completion, what it read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollValue {
    /// The topic read.
    pub topic: String,
    /// The partition read.
    pub partition: i64,
    /// The offset the poll fetched from.
    pub from: i64,
    /// The records returned, in the order returned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<Record>,
    /// The partition's high watermark as the fetch response reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_watermark: Option<i64>,
    /// The current leader epoch the fetch carried and the broker accepted, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_epoch: Option<i64>,
    /// Tiered topics: the leader's local log start (ListOffsets -4, EARLIEST_LOCAL) asked of the
    /// same broker just before the fetch. A local log start only moves up, so records below it
    /// came from the remote store (unless leadership moved in between).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_log_start: Option<i64>,
    /// Invocation: carry a leader epoch below the latest the client knows, as a client whose
    /// metadata refresh was lost does. Completion: it did (`leader_epoch` is that epoch), so a
    /// broker that fences stale epochs (KIP-320) refuses it unless it still leads in that epoch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale_epoch: bool,
}

/// A data record as `[offset, value, leader_epoch]`. Polls may omit the epoch (`[offset, value]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    /// Its offset in the partition.
    pub offset: i64,
    /// The integer value the workload wrote.
    pub value: i64,
    /// The leader epoch of its batch, when known.
    pub epoch: Option<i64>,
}

impl Record {
    /// A record with a known epoch.
    pub fn new(offset: i64, value: i64, epoch: i64) -> Self {
        Record {
            offset,
            value,
            epoch: Some(epoch),
        }
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.epoch {
            Some(e) => (self.offset, self.value, e).serialize(s),
            None => (self.offset, self.value).serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct RecordVisitor;
        impl<'de> Visitor<'de> for RecordVisitor {
            type Value = Record;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a record [offset, value, leader_epoch]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Record, A::Error> {
                let offset = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let value = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                let epoch = seq.next_element()?;
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(4, &self));
                }
                Ok(Record {
                    offset,
                    value,
                    epoch,
                })
            }
        }
        d.deserialize_seq(RecordVisitor)
    }
}

/// One epoch-cache entry of a replica as `[epoch, start_offset]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "(i64, i64)", into = "(i64, i64)")]
pub struct EpochEntry {
    /// The leader epoch.
    pub epoch: i64,
    /// The first offset written in it.
    pub start_offset: i64,
}

impl From<(i64, i64)> for EpochEntry {
    fn from((epoch, start_offset): (i64, i64)) -> Self {
        EpochEntry {
            epoch,
            start_offset,
        }
    }
}

impl From<EpochEntry> for (i64, i64) {
    fn from(e: EpochEntry) -> Self {
        (e.epoch, e.start_offset)
    }
}

/// One line of `replicas.jsonl`: the final state of one replica of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaState {
    /// The cluster the node belongs to.
    #[serde(default)]
    pub cluster: String,
    /// The node holding the replica.
    pub node: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i64,
    /// `"leader"` or `"follower"`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The first offset the replica still holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_start_offset: Option<i64>,
    /// The replica's high watermark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_watermark: Option<i64>,
    /// The offset after its last record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_end_offset: Option<i64>,
    /// The leader-epoch cache.
    #[serde(default)]
    pub epochs: Vec<EpochEntry>,
    /// The data records (control records omitted).
    #[serde(default)]
    pub records: Vec<Record>,
    /// Why the replica's state could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With tiered storage, the partition as the remote store holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiered: Option<TieredSide>,
    /// Where the replica's local log began when it last rebuilt it from the remote store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_bootstrap: Option<RemoteBootstrap>,
    /// The idempotent producers the replica knows, as its broker would rebuild them on start
    /// (absent where the broker does not report them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<Vec<ProducerState>>,
    /// The leader epochs this replica was elected in uncleanly, as its broker recorded them
    /// (absent where the broker does not report them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unclean_elections: Vec<UncleanElection>,
}

/// An unclean election of one replica as its broker recorded it (a forced one, or KIP-966's
/// last known leader): the epoch it began leading in, and its log end then, above which records
/// acknowledged before may be gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UncleanElection {
    /// The leader epoch it was elected in.
    pub leader_epoch: i64,
    /// Its log end offset when elected.
    pub log_end_offset: i64,
}

/// One idempotent producer's state in a replica as
/// `[producer_id, epoch, last_sequence, last_offset]`: its epoch, and its last batch's last
/// sequence and offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "(i64, i64, i64, i64)", into = "(i64, i64, i64, i64)")]
pub struct ProducerState {
    /// The producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub epoch: i64,
    /// The last sequence of its last batch.
    pub last_sequence: i64,
    /// The offset of its last batch's last record.
    pub last_offset: i64,
}

impl From<(i64, i64, i64, i64)> for ProducerState {
    fn from((producer_id, epoch, last_sequence, last_offset): (i64, i64, i64, i64)) -> Self {
        ProducerState {
            producer_id,
            epoch,
            last_sequence,
            last_offset,
        }
    }
}

impl From<ProducerState> for (i64, i64, i64, i64) {
    fn from(p: ProducerState) -> Self {
        (p.producer_id, p.epoch, p.last_sequence, p.last_offset)
    }
}

/// A replica's last start from the remote store (KIP-405's empty follower, or KIP-1023's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteBootstrap {
    /// The offset its local log began at.
    pub local_log_start_offset: i64,
    /// The leader epoch it followed in.
    pub leader_epoch: i32,
}

/// A replica's partition in tiered storage's remote store (`dump-log --remote-dir`): the offsets
/// below its local log start are read from the remote segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieredSide {
    /// The partition's log start, below the local one when older offsets are remote.
    #[serde(default)]
    pub log_start_offset: Option<i64>,
    /// The replica's local log start (the replica's own `log_start_offset`).
    #[serde(default)]
    pub local_log_start_offset: Option<i64>,
    /// Every segment the remote store's metadata lists for the partition, oldest first.
    #[serde(default)]
    pub remote_segments: Vec<RemoteSegment>,
}

/// One segment in the remote store's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegment {
    /// The upload's id.
    pub id: String,
    /// Its first offset.
    pub start_offset: i64,
    /// Its last offset (inclusive).
    pub end_offset: i64,
    /// `COPY_SEGMENT_STARTED`, `COPY_SEGMENT_FINISHED`, `DELETE_SEGMENT_STARTED` or
    /// `DELETE_SEGMENT_FINISHED`.
    pub state: String,
    /// The epochs its batches were written in, with where each starts in it.
    #[serde(default)]
    pub segment_leader_epochs: Vec<EpochEntry>,
    /// The broker that uploaded it.
    #[serde(default)]
    pub broker_id: Option<i64>,
    /// A finished segment's data records.
    #[serde(default)]
    pub records: Vec<Record>,
    /// Why a finished segment's records could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RemoteSegment {
    /// Whether readers are served from it.
    pub fn finished(&self) -> bool {
        self.state == "COPY_SEGMENT_FINISHED"
    }
}

/// Kafka partitions are non-negative 32-bit integers; anything else cannot be real.
pub fn check_partition(partition: i64) -> Result<(), String> {
    if (0..=i64::from(i32::MAX)).contains(&partition) {
        Ok(())
    } else {
        Err(format!(
            "partition {partition} is not a Kafka partition (0 to {})",
            i32::MAX
        ))
    }
}

impl ReplicaState {
    /// Whether the state can be real: offsets are never negative, a log starts at or before its
    /// end, and its high watermark is at or below its end (`log_start_offset <= log_end_offset`,
    /// `high_watermark <= log_end_offset`).
    pub fn check_values(&self) -> Result<(), String> {
        check_partition(self.partition)?;
        let fields = [
            ("log_start_offset", self.log_start_offset),
            ("high_watermark", self.high_watermark),
            ("log_end_offset", self.log_end_offset),
        ];
        for (name, value) in fields {
            if let Some(v) = value.filter(|v| *v < 0) {
                return Err(format!("{name} {v} is negative"));
            }
        }
        if let Some(end) = self.log_end_offset {
            for (name, value) in [fields[0], fields[1]] {
                if let Some(v) = value.filter(|v| *v > end) {
                    return Err(format!("{name} {v} is above log_end_offset {end}"));
                }
            }
        }
        match self.records.iter().find(|r| r.offset < 0) {
            Some(r) => Err(format!("record offset {} is negative", r.offset)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn op_lines_use_the_spec_field_names() {
        let op = Op {
            index: 3,
            time: 17,
            process: Process::Client(4),
            kind: OpType::Ok,
            f: "send".into(),
            value: json!({"topic": "t", "partition": 0, "values": [1], "offset": 9}),
            node: Some("n1".into()),
            cluster: Some("a".into()),
            error: None,
        };
        let line = serde_json::to_value(&op).unwrap();
        assert_eq!(
            line,
            json!({"index": 3, "time": 17, "process": 4, "type": "ok", "f": "send",
                   "value": {"topic": "t", "partition": 0, "values": [1], "offset": 9},
                   "node": "n1", "cluster": "a"})
        );
        assert_eq!(serde_json::from_value::<Op>(line).unwrap(), op);
    }

    #[test]
    fn process_is_an_integer_or_nemesis() {
        assert_eq!(
            serde_json::to_value(Process::Nemesis).unwrap(),
            json!("nemesis")
        );
        assert_eq!(
            serde_json::from_str::<Process>("7").unwrap(),
            Process::Client(7)
        );
        assert!(serde_json::from_str::<Process>("\"x\"").is_err());
        assert!(serde_json::from_str::<Process>("-1").is_err());
    }

    #[test]
    fn records_are_arrays_with_an_optional_epoch() {
        let r: Record = serde_json::from_str("[40, 15, 3]").unwrap();
        assert_eq!(r, Record::new(40, 15, 3));
        let r: Record = serde_json::from_str("[40, 15]").unwrap();
        assert_eq!(r.epoch, None);
        assert_eq!(serde_json::to_string(&r).unwrap(), "[40,15]");
        assert!(serde_json::from_str::<Record>("[40]").is_err());
        assert!(serde_json::from_str::<Record>("[1, 2, 3, 4]").is_err());
    }

    #[test]
    fn queue_values_match_the_spec_examples() {
        let send = json!({"topic": "t", "partition": 0, "values": [17, 18], "offset": 42});
        let v: SendValue = serde_json::from_value(send.clone()).unwrap();
        assert_eq!((v.values.clone(), v.offset), (vec![17, 18], Some(42)));
        assert_eq!(serde_json::to_value(&v).unwrap(), send);
        let poll = json!({"topic": "t", "partition": 0, "from": 40,
                          "records": [[40, 15, 3], [41, 16, 3]], "high_watermark": 43,
                          "leader_epoch": 3});
        let v: PollValue = serde_json::from_value(poll.clone()).unwrap();
        assert_eq!(v.records[1], Record::new(41, 16, 3));
        assert_eq!(serde_json::to_value(&v).unwrap(), poll);
        let invoke: PollValue =
            serde_json::from_value(json!({"topic": "t", "partition": 0, "from": 40})).unwrap();
        assert!(invoke.records.is_empty() && invoke.high_watermark.is_none());
    }

    #[test]
    fn replica_lines_round_trip() {
        let line = json!({"cluster": "a", "node": "n1", "topic": "t", "partition": 0,
            "role": "leader", "log_start_offset": 0, "high_watermark": 2, "log_end_offset": 2,
            "epochs": [[0, 0], [3, 1]], "records": [[0, 15, 0], [1, 16, 3]]});
        let r: ReplicaState = serde_json::from_value(line.clone()).unwrap();
        assert_eq!(r.epochs[1], EpochEntry::from((3, 1)));
        assert_eq!(serde_json::to_value(&r).unwrap(), line);
    }
}
