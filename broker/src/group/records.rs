//! The records the coordinator keeps in `__consumer_offsets`: one per committed offset, keyed
//! by (group, topic, partition), and one per group holding its generation, protocol and
//! members with their assignments. Keys and values are JSON (bytes in base64), not Kafka's
//! binary schemas: only this broker reads them. The log is the truth; the coordinator's
//! memory is rebuilt from it, the last record of a key winning, a null value deleting it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use serde::{Deserialize, Serialize};

use super::state::{CommittedOffset, Group, GroupState, Member};

/// The key of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group {
        group: String,
    },
}

/// A committed offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

/// A group as of its last completed rebalance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupValue {
    pub protocol_type: Option<String>,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: Vec<MemberValue>,
}

/// A member with the metadata of the chosen protocol and its assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberValue {
    pub id: String,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: u64,
    pub rebalance_timeout_ms: u64,
    pub metadata: String,
    pub assignment: String,
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(s: &str, what: &str) -> anyhow::Result<Bytes> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map(Bytes::from)
        .map_err(|e| anyhow::anyhow!("{what} is not base64: {e}"))
}

impl GroupValue {
    /// The group as stored after a rebalance completed.
    pub fn of(group: &Group) -> Self {
        let protocol = group.protocol.clone().unwrap_or_default();
        GroupValue {
            protocol_type: group.protocol_type.clone(),
            generation: group.generation,
            protocol: group.protocol.clone(),
            leader: group.leader.clone(),
            members: group
                .members
                .values()
                .map(|m| MemberValue {
                    id: m.id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: m.session_timeout.as_millis() as u64,
                    rebalance_timeout_ms: m.rebalance_timeout.as_millis() as u64,
                    metadata: b64(&m.metadata_for(&protocol)),
                    assignment: b64(&m.assignment),
                })
                .collect(),
        }
    }
}

/// A record to append: its key and value (`None` deletes the key).
pub type Entry = (RecordKey, Option<Vec<u8>>);

pub fn offset_entry(group: &str, topic: &str, partition: i32, o: &CommittedOffset) -> Entry {
    let value = OffsetValue {
        offset: o.offset,
        leader_epoch: o.leader_epoch,
        metadata: o.metadata.clone(),
        commit_timestamp: o.commit_timestamp,
    };
    (
        RecordKey::Offset {
            group: group.to_string(),
            topic: topic.to_string(),
            partition,
        },
        Some(serde_json::to_vec(&value).expect("plain data serializes")),
    )
}

pub fn group_entry(group: &Group) -> Entry {
    (
        RecordKey::Group {
            group: group.id.clone(),
        },
        Some(serde_json::to_vec(&GroupValue::of(group)).expect("plain data serializes")),
    )
}

/// One uncompressed v2 batch holding `entries`, so a commit of many partitions is appended
/// (and survives or not) as a whole.
pub fn encode_batch(entries: &[Entry], timestamp_ms: i64) -> anyhow::Result<Bytes> {
    let records: Vec<Record> = entries
        .iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder starts a new batch unless offset − sequence is constant; the base
            // sequence stays -1 (no producer id).
            sequence: i as i32 - 1,
            timestamp: timestamp_ms,
            key: Some(Bytes::from(
                serde_json::to_vec(key).expect("plain data serializes"),
            )),
            value: value.as_ref().map(|v| Bytes::copy_from_slice(v)),
            headers: IndexMap::new(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let opts = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, records.iter(), &opts)?;
    Ok(buf.freeze())
}

/// Groups rebuilt from a partition's records, applied in log order.
#[derive(Debug, Default)]
pub struct Loader {
    offsets: BTreeMap<String, BTreeMap<(String, i32), CommittedOffset>>,
    groups: BTreeMap<String, Option<GroupValue>>,
    /// The offset after the last record applied.
    pub next_offset: i64,
}

impl Loader {
    /// Applies the batches in `bytes` (as read from the log), skipping records before
    /// `next_offset`. Errors name the offset of the record that could not be read.
    pub fn apply(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let buf = Bytes::copy_from_slice(bytes);
        for (at, header) in crate::log::batch::split_batches(&buf)? {
            let mut one = buf.slice(at..at + header.size);
            let set = RecordBatchDecoder::decode(&mut one)
                .map_err(|e| anyhow::anyhow!("batch at byte {at}: {e}"))?;
            for r in set.records {
                if r.offset < self.next_offset {
                    continue;
                }
                self.next_offset = r.offset + 1;
                if r.control {
                    continue;
                }
                let Some(key) = r.key else { continue };
                let key: RecordKey = serde_json::from_slice(&key)
                    .map_err(|e| anyhow::anyhow!("record at offset {}: bad key: {e}", r.offset))?;
                let bad = |e: serde_json::Error| {
                    anyhow::anyhow!("record at offset {}: bad value: {e}", r.offset)
                };
                match key {
                    RecordKey::Offset {
                        group,
                        topic,
                        partition,
                    } => {
                        let offsets = self.offsets.entry(group).or_default();
                        match r.value {
                            None => {
                                offsets.remove(&(topic, partition));
                            }
                            Some(v) => {
                                let v: OffsetValue = serde_json::from_slice(&v).map_err(bad)?;
                                offsets.insert(
                                    (topic, partition),
                                    CommittedOffset {
                                        offset: v.offset,
                                        leader_epoch: v.leader_epoch,
                                        metadata: v.metadata,
                                        commit_timestamp: v.commit_timestamp,
                                        log_offset: r.offset,
                                    },
                                );
                            }
                        }
                    }
                    RecordKey::Group { group } => {
                        let v = match r.value {
                            None => None,
                            Some(v) => Some(serde_json::from_slice(&v).map_err(bad)?),
                        };
                        self.groups.insert(group, v);
                    }
                }
            }
        }
        Ok(())
    }

    /// The groups as loaded: members restored with a fresh session from `now`, the group
    /// Stable when it has members (they keep heartbeating to the new coordinator), else Empty.
    pub fn finish(self, now: Instant) -> anyhow::Result<BTreeMap<String, Group>> {
        let mut out: BTreeMap<String, Group> = BTreeMap::new();
        for (id, value) in self.groups {
            let Some(v) = value else { continue };
            let mut g = Group::new(&id);
            g.generation = v.generation;
            g.protocol_type = v.protocol_type;
            g.protocol = v.protocol.clone();
            g.leader = v.leader;
            let protocol = v.protocol.unwrap_or_default();
            for m in v.members {
                let metadata = unb64(&m.metadata, "member metadata")?;
                let assignment = unb64(&m.assignment, "member assignment")?;
                g.members.insert(
                    m.id.clone(),
                    Member::restored(
                        m.id,
                        m.client_id,
                        m.client_host,
                        (
                            Duration::from_millis(m.session_timeout_ms),
                            Duration::from_millis(m.rebalance_timeout_ms),
                        ),
                        vec![(protocol.clone(), metadata)],
                        assignment,
                        now,
                    ),
                );
            }
            g.state = if g.members.is_empty() {
                GroupState::Empty
            } else {
                GroupState::Stable
            };
            out.insert(id, g);
        }
        for (id, offsets) in self.offsets {
            if offsets.is_empty() {
                continue;
            }
            out.entry(id.clone())
                .or_insert_with(|| Group::new(&id))
                .offsets = offsets;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loader_replays_commits_and_groups_with_the_last_record_winning() {
        let mut g = Group::new("g");
        g.generation = 3;
        g.protocol_type = Some("consumer".into());
        g.protocol = Some("range".into());
        let o = |offset| CommittedOffset {
            offset,
            leader_epoch: 1,
            metadata: String::new(),
            commit_timestamp: 5,
            log_offset: -1,
        };
        let first = encode_batch(&[offset_entry("g", "t", 0, &o(10)), group_entry(&g)], 5).unwrap();
        let second = encode_batch(
            &[
                offset_entry("g", "t", 0, &o(20)),
                (
                    RecordKey::Offset {
                        group: "g".into(),
                        topic: "t".into(),
                        partition: 1,
                    },
                    None,
                ),
            ],
            6,
        )
        .unwrap();
        assert_eq!(
            crate::log::batch::split_batches(&first).unwrap().len(),
            1,
            "a commit of several records is one batch"
        );
        let mut loader = Loader::default();
        loader.apply(&first).unwrap();
        // Offsets of the second batch continue the first's, as the log assigns them.
        let mut log = first.to_vec();
        let mut second = second.to_vec();
        second[..8].copy_from_slice(&2i64.to_be_bytes());
        log.extend_from_slice(&second);
        loader.apply(&log).unwrap();
        assert_eq!(loader.next_offset, 4);
        let groups = loader.finish(Instant::now()).unwrap();
        let g = &groups["g"];
        assert_eq!(g.generation, 3);
        assert_eq!(g.state, GroupState::Empty);
        assert_eq!(g.offsets.len(), 1);
        assert_eq!(g.offsets[&("t".to_string(), 0)].offset, 20);
    }

    #[test]
    fn a_record_that_is_not_ours_is_an_error_naming_its_offset() {
        let batch = encode_batch(
            &[(RecordKey::Group { group: "g".into() }, Some(b"{".to_vec()))],
            1,
        )
        .unwrap();
        let err = Loader::default().apply(&batch).unwrap_err().to_string();
        assert!(
            err.contains("offset 0") && err.contains("bad value"),
            "{err}"
        );
    }
}
