//! One op as the queue analysis reads it, whichever way it arrived: as an [`Op`] built by the
//! harness, or straight from a line of `history.jsonl`. A line is parsed once, into typed,
//! borrowed fields: the op's value stays raw text until the analysis asks for the part it needs
//! (a send's values, a poll's records), which is much cheaper than building a JSON tree per line.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::op::{check_partition, Op, OpType, Process, Record};

/// A history line with only the fields' types checked, the value left raw.
#[derive(Debug, Deserialize)]
pub(crate) struct LineOp<'a> {
    pub index: u64,
    pub time: u64,
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: OpType,
    #[serde(borrow)]
    pub f: Cow<'a, str>,
    #[serde(borrow, default)]
    pub value: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub node: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub cluster: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub error: Option<Cow<'a, str>>,
}

/// An op's value, parsed on demand.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body<'a> {
    Json(&'a Value),
    Raw(Option<&'a RawValue>),
}

impl<'a> Body<'a> {
    /// The value as `T`, or `None` when it is absent or null; `what` names it in errors.
    pub fn parse<T: Deserialize<'a>>(self, what: &str) -> Result<Option<T>, String> {
        let parsed = match self {
            Body::Json(Value::Null) | Body::Raw(None) => return Ok(None),
            Body::Json(v) => T::deserialize(v),
            Body::Raw(Some(raw)) if raw.get() == "null" => return Ok(None),
            Body::Raw(Some(raw)) => serde_json::from_str(raw.get()),
        };
        parsed.map(Some).map_err(|e| {
            // Positions would be within the value, not the line: leave them out.
            let e = e.to_string();
            let message = e.rsplit_once(" at line ").map_or(e.as_str(), |(m, _)| m);
            format!("malformed {what} value: {message}")
        })
    }

    /// The value as a JSON tree (for the rare ops that need more than a typed part).
    pub fn json(self) -> Value {
        match self {
            Body::Json(v) => v.clone(),
            Body::Raw(raw) => raw
                .and_then(|r| serde_json::from_str(r.get()).ok())
                .unwrap_or(Value::Null),
        }
    }
}

/// One op, borrowed from an [`Op`] or a [`LineOp`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event<'a> {
    pub index: u64,
    /// Nanoseconds since the test began.
    pub time: u64,
    pub process: Process,
    pub kind: OpType,
    pub f: &'a str,
    /// The node a client op was sent to, when it got that far.
    pub node: Option<&'a str>,
    pub cluster: Option<&'a str>,
    pub value: Body<'a>,
    /// The op recorded an error: it fell short of what it was asked.
    pub failed: bool,
}

impl<'a> From<&'a Op> for Event<'a> {
    fn from(op: &'a Op) -> Self {
        Event {
            index: op.index,
            time: op.time,
            process: op.process,
            kind: op.kind,
            f: &op.f,
            node: op.node.as_deref(),
            cluster: op.cluster.as_deref(),
            value: Body::Json(&op.value),
            failed: op.error.is_some(),
        }
    }
}

impl<'a> From<&'a LineOp<'a>> for Event<'a> {
    fn from(op: &'a LineOp<'a>) -> Self {
        Event {
            index: op.index,
            time: op.time,
            process: op.process,
            kind: op.kind,
            f: &op.f,
            node: op.node.as_deref(),
            cluster: op.cluster.as_deref(),
            value: Body::Raw(op.value),
            failed: op.error.is_some(),
        }
    }
}

/// The parts of a `send` value the analysis reads; each is checked where it is required.
#[derive(Debug, Deserialize)]
pub(crate) struct SendBody<'a> {
    #[serde(borrow, default)]
    pub topic: Option<Cow<'a, str>>,
    #[serde(default)]
    pub partition: Option<i64>,
    #[serde(default)]
    pub values: Option<Vec<i64>>,
    #[serde(default)]
    pub offset: Option<i64>,
}

/// The parts of a `power-loss` info the verdict policy reads.
#[derive(Debug, Deserialize)]
pub(crate) struct PowerLossBody {
    /// The nodes that lost power at once.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Whether they were every node of their cluster.
    #[serde(default)]
    pub cluster_wide: bool,
}

/// The parts of a `last-stand` info the checkers read: the verdict policy each follower's power
/// loss, `reach` when the leader stood alone, `stands` whom the controller could elect next.
#[derive(Debug, Deserialize)]
pub(crate) struct StandBody {
    #[serde(default)]
    pub topic: Option<String>,
    #[serde(default)]
    pub partition: Option<i64>,
    #[serde(default)]
    pub killed: Option<String>,
    #[serde(default)]
    pub isr_at_start: Option<Vec<String>>,
    #[serde(default)]
    pub left: Vec<Departure>,
    #[serde(default)]
    pub ports: Option<Vec<u16>>,
    #[serde(default)]
    pub alone_from_ms: Option<u64>,
    #[serde(default)]
    pub alone_ms: Option<u64>,
    #[serde(default)]
    pub elapsed_ms: Option<u64>,
    /// Absent: not waited for; `null`: none within the wait.
    #[serde(default, deserialize_with = "present")]
    pub elected: Option<Option<String>>,
}

/// A field that is there, `null` or not.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// One follower's departure in a `last-stand`.
#[derive(Debug, Deserialize)]
pub(crate) struct Departure {
    pub node: String,
    pub how: Leaving,
    /// The partition's ISR as read once it had gone.
    #[serde(default)]
    pub isr: Option<Vec<String>>,
}

/// How a follower left; a way not known here is taken for none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Leaving {
    Stop,
    Crash,
    PowerLoss,
    Cut,
    #[serde(other)]
    Other,
}

impl Leaving {
    /// Its process was stopped (cleanly, by a crash or by a power loss).
    pub fn stopped(self) -> bool {
        matches!(self, Leaving::Stop | Leaving::Crash | Leaving::PowerLoss)
    }

    /// It comes back from a clean shutdown, or never went down: still an eligible leader
    /// replica (KIP-966).
    pub fn clean(self) -> bool {
        matches!(self, Leaving::Stop | Leaving::Cut)
    }
}

impl StandBody {
    /// The followers that lost power.
    pub fn powered_off(&self) -> Vec<String> {
        self.left
            .iter()
            .filter(|d| d.how == Leaving::PowerLoss)
            .map(|d| d.node.clone())
            .collect()
    }
}

/// The part of a `corrupt-file` info the verdict policy reads: each damaged segment.
#[derive(Debug, Deserialize)]
pub(crate) struct CorruptBody {
    #[serde(default)]
    pub files: Vec<DamagedFile>,
}

/// One damaged segment: its node, and its path in the data directory
/// (`<topic>-<partition>/<base offset>.log`).
#[derive(Debug, Deserialize)]
pub(crate) struct DamagedFile {
    pub node: String,
    pub file: String,
}

impl DamagedFile {
    /// The topic and partition of the replica the segment belongs to, from its directory.
    pub fn replica(&self) -> Option<(String, i64)> {
        let (dir, _) = self.file.split_once('/')?;
        let (topic, index) = dir.rsplit_once('-')?;
        Some((topic.to_owned(), index.parse().ok()?))
    }
}

/// The part of a `disk-heal` info the verdict policy reads.
#[derive(Debug, Deserialize)]
pub(crate) struct RebootBody {
    /// The nodes rebooted on what their disks held, without what failed fsyncs dropped.
    #[serde(default)]
    pub rebooted: Vec<String>,
    /// Whether they were every node of their cluster.
    #[serde(default)]
    pub cluster_wide: bool,
}

/// The part of a `wipe` info the verdict policy reads.
#[derive(Debug, Deserialize)]
pub(crate) struct WipeBody {
    /// What was deleted, by node: the nodes that lost their log directory (a wipe that fell
    /// short may name nodes it deleted nothing of).
    #[serde(default)]
    pub deleted: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

/// The parts of a `poll` value the analysis reads.
#[derive(Debug, Deserialize)]
pub(crate) struct PollBody<'a> {
    #[serde(borrow, default)]
    pub topic: Option<Cow<'a, str>>,
    #[serde(default)]
    pub partition: Option<i64>,
    #[serde(default)]
    pub from: Option<i64>,
    #[serde(default)]
    pub records: Option<Vec<Record>>,
    #[serde(default)]
    pub high_watermark: Option<i64>,
    #[serde(default)]
    pub leader_epoch: Option<i64>,
}

/// The topic and partition an op names, both required.
pub(crate) fn topic_partition(
    topic: Option<Cow<'_, str>>,
    partition: Option<i64>,
) -> Result<(Cow<'_, str>, i64), String> {
    let topic = topic.ok_or("value has no topic")?;
    let partition = partition.ok_or("value has no partition")?;
    check_partition(partition)?;
    Ok((topic, partition))
}

/// Offsets a poll names cannot be negative: where it read from, and every record it returned.
pub(crate) fn check_poll_offsets(body: &PollBody<'_>) -> Result<(), String> {
    if let Some(from) = body.from.filter(|f| *f < 0) {
        return Err(format!("poll from {from} is negative"));
    }
    let records = body.records.as_deref().unwrap_or_default();
    match records.iter().find(|r| r.offset < 0) {
        Some(r) => Err(format!("poll record offset {} is negative", r.offset)),
        None => Ok(()),
    }
}
