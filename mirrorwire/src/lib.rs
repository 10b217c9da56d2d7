//! The mirror admin APIs on the Kafka wire (KIP-1279's admin APIs): their API keys and the typed
//! JSON bodies of their requests and responses. The broker that serves them and the harness that
//! sends them both use these shapes, so the two cannot drift apart, and the harness needs no part
//! of the broker to drive a cluster's mirroring.
//!
//! Each API has its own API key, at the KIP's distances from a configurable base
//! (`mirror.api.key.base`, default 94 as in the prototype) because the KIP's numbers are
//! provisional. Frames carry the ordinary Kafka request header (v2) and response header (v1);
//! the body is one compact-bytes field holding the typed request or response as JSON, followed
//! by an empty tagged-field section.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Where the mirror APIs sit in the key space unless `mirror.api.key.base` moves them.
pub const DEFAULT_API_KEY_BASE: i16 = 94;

/// The state of one partition of a mirror topic (KIP-1279's semantic states).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MirrorState {
    /// LMLE lookup, truncation and waiting for the replicas to truncate (LOG_TRUNCATION).
    Preparing,
    /// A mirrored batch carries an epoch above the local leader epoch: bump first.
    EpochFencing,
    Mirroring,
    /// The source's unclean election truncated this leader while mirroring, and
    /// `mirror.support.unclean.leader.election` is on: wait for every replica to follow.
    UleRecovery,
    Pausing,
    Paused,
    /// Failover in progress: persist the LMLE, bump the epoch.
    Stopping,
    /// Writable: the partition no longer mirrors.
    Stopped,
    Failed,
}

impl MirrorState {
    pub const ALL: [MirrorState; 9] = [
        MirrorState::Preparing,
        MirrorState::EpochFencing,
        MirrorState::Mirroring,
        MirrorState::UleRecovery,
        MirrorState::Pausing,
        MirrorState::Paused,
        MirrorState::Stopping,
        MirrorState::Stopped,
        MirrorState::Failed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MirrorState::Preparing => "PREPARING",
            MirrorState::EpochFencing => "EPOCH_FENCING",
            MirrorState::Mirroring => "MIRRORING",
            MirrorState::UleRecovery => "ULE_RECOVERY",
            MirrorState::Pausing => "PAUSING",
            MirrorState::Paused => "PAUSED",
            MirrorState::Stopping => "STOPPING",
            MirrorState::Stopped => "STOPPED",
            MirrorState::Failed => "FAILED",
        }
    }
}

/// The mirror APIs, by their KIP names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorApi {
    CreateClusterMirror,
    StartMirrorTopics,
    StopMirrorTopics,
    ListClusterMirrors,
    DescribeClusterMirrors,
    PauseMirrorTopics,
    ResumeMirrorTopics,
    DeleteClusterMirror,
    RecoverMirrorTopics,
}

impl MirrorApi {
    pub const ALL: [MirrorApi; 9] = [
        MirrorApi::CreateClusterMirror,
        MirrorApi::StartMirrorTopics,
        MirrorApi::StopMirrorTopics,
        MirrorApi::ListClusterMirrors,
        MirrorApi::DescribeClusterMirrors,
        MirrorApi::PauseMirrorTopics,
        MirrorApi::ResumeMirrorTopics,
        MirrorApi::DeleteClusterMirror,
        MirrorApi::RecoverMirrorTopics,
    ];

    /// Distance from the base: the prototype's keys 94, 95, 96, 98, 99, 102, 103, 104, and
    /// 106 for RecoverMirrorTopics (the second prototype's).
    fn offset(self) -> i16 {
        match self {
            MirrorApi::CreateClusterMirror => 0,
            MirrorApi::StartMirrorTopics => 1,
            MirrorApi::StopMirrorTopics => 2,
            MirrorApi::ListClusterMirrors => 4,
            MirrorApi::DescribeClusterMirrors => 5,
            MirrorApi::PauseMirrorTopics => 8,
            MirrorApi::ResumeMirrorTopics => 9,
            MirrorApi::DeleteClusterMirror => 10,
            MirrorApi::RecoverMirrorTopics => 12,
        }
    }

    pub fn key(self, base: i16) -> i16 {
        base + self.offset()
    }

    pub fn from_key(base: i16, key: i16) -> Option<MirrorApi> {
        MirrorApi::ALL.into_iter().find(|a| a.key(base) == key)
    }
}

/// The first mirror API key that would collide with a Kafka API the protocol crate knows.
pub fn clashing_key(base: i16) -> Option<i16> {
    MirrorApi::ALL
        .into_iter()
        .map(|a| a.key(base))
        .find(|k| ApiKey::try_from(*k).is_ok())
}

/// A mirror admin request; its variant must match the API key it is sent with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MirrorRequest {
    Create {
        mirror: String,
        source_bootstrap: String,
        /// The mirror's own configs (KIP-1279's CreateClusterMirror `Config`), such as
        /// `mirror.groups.include`; absent ones keep their defaults.
        #[serde(default)]
        configs: BTreeMap<String, String>,
    },
    Start {
        mirror: String,
        topics: Vec<String>,
    },
    Stop {
        mirror: String,
        topics: Vec<String>,
    },
    List,
    /// `mirror: None` describes every mirror. `lookup` asks for LMLEs this cluster holds for
    /// the requesting cluster (failback, KIP-1279's LMLE lookup).
    Describe {
        mirror: Option<String>,
        lookup: Option<LmleLookup>,
    },
    Pause {
        mirror: String,
        topics: Vec<String>,
    },
    Resume {
        mirror: String,
        topics: Vec<String>,
    },
    Delete {
        mirror: String,
    },
    /// Retries FAILED partitions that no longer retry on their own (retries exhausted, or a
    /// failure counted as permanent) once the operator has mended the cause.
    Recover {
        mirror: String,
        topics: Vec<String>,
    },
}

impl MirrorRequest {
    pub fn api(&self) -> MirrorApi {
        match self {
            MirrorRequest::Create { .. } => MirrorApi::CreateClusterMirror,
            MirrorRequest::Start { .. } => MirrorApi::StartMirrorTopics,
            MirrorRequest::Stop { .. } => MirrorApi::StopMirrorTopics,
            MirrorRequest::List => MirrorApi::ListClusterMirrors,
            MirrorRequest::Describe { .. } => MirrorApi::DescribeClusterMirrors,
            MirrorRequest::Pause { .. } => MirrorApi::PauseMirrorTopics,
            MirrorRequest::Resume { .. } => MirrorApi::ResumeMirrorTopics,
            MirrorRequest::Delete { .. } => MirrorApi::DeleteClusterMirror,
            MirrorRequest::Recover { .. } => MirrorApi::RecoverMirrorTopics,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LmleLookup {
    /// The cluster asking: only mirrors whose source it was count.
    pub cluster_id: String,
    pub topic_id: Uuid,
    pub partitions: Vec<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorResponse {
    pub error_code: i16,
    pub error_message: Option<String>,
    /// The answering cluster's id.
    pub cluster_id: String,
    #[serde(default)]
    pub topics: Vec<TopicResult>,
    #[serde(default)]
    pub mirrors: Vec<MirrorDescription>,
    /// (partition, LMLE) for a lookup; -1 when unknown.
    #[serde(default)]
    pub lmle: Vec<(i32, i32)>,
}

impl MirrorResponse {
    /// Ok when the request and every topic succeeded, else what failed.
    pub fn check(&self, what: &str) -> anyhow::Result<()> {
        if self.error_code != 0 {
            anyhow::bail!(
                "{what}: error {} {}",
                self.error_code,
                self.error_message.as_deref().unwrap_or("")
            );
        }
        if let Some(t) = self.topics.iter().find(|t| t.error_code != 0) {
            anyhow::bail!(
                "{what}: topic {}: error {} {}",
                t.topic,
                t.error_code,
                t.error_message.as_deref().unwrap_or("")
            );
        }
        Ok(())
    }

    /// The partitions of `mirror`'s topic `topic`.
    pub fn partitions(&self, mirror: &str, topic: &str) -> Vec<PartitionDescription> {
        self.mirrors
            .iter()
            .filter(|m| m.name == mirror)
            .flat_map(|m| m.topics.iter())
            .filter(|t| t.name == topic)
            .flat_map(|t| t.partitions.iter().cloned())
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicResult {
    pub topic: String,
    pub error_code: i16,
    pub error_message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorDescription {
    pub name: String,
    pub source_bootstrap: String,
    pub source_cluster_id: String,
    pub topics: Vec<TopicDescription>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDescription {
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: Vec<PartitionDescription>,
}

/// One partition as its destination leader sees it; offsets are -1 where the answering broker
/// does not lead the partition (describers ask every broker and keep, per partition, the answer from
/// the newest metadata: [`MirrorResponse::merge_describe`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionDescription {
    pub partition: i32,
    pub leader: i32,
    /// The leader epoch of the metadata the answer comes from (-1 from a broker that does not
    /// say): of two brokers that both claim to lead, the one that has seen the later epoch is
    /// right, the other has not caught up (it was paused, or cut off).
    #[serde(default = "unknown_epoch")]
    pub leader_epoch: i32,
    pub state: MirrorState,
    /// The source high watermark at the last mirror fetch.
    pub source_offset: i64,
    /// The destination log end offset.
    pub destination_offset: i64,
    pub lag: i64,
    /// The LMLE the last truncation used (-1: none known or not yet looked up).
    pub lmle: i32,
    pub retry_attempt: i32,
    pub last_error: Option<String>,
    /// What a PREPARING partition waits for (e.g. replicas to join the ISR).
    pub waiting_for: Option<String>,
    /// A STOPPED partition's producer-id reset barrier, written by its failover: every record
    /// after it was written here, every one below it mirrored if the mirror was in step when
    /// stopped (a FAILED one may still hold records its source no longer has, which its next
    /// fetch's diverging epoch would have cut).
    #[serde(default)]
    pub barrier_offset: Option<i64>,
}

fn unknown_epoch() -> i32 {
    -1
}

impl MirrorResponse {
    /// Takes in another broker's answer to the same describe: each partition is described by the
    /// answer from the newest metadata (the highest leader epoch), the leader's own (which alone
    /// has offsets) where the epochs are equal.
    pub fn merge_describe(&mut self, other: &MirrorResponse) {
        let rank = |p: &PartitionDescription| (p.leader_epoch, p.destination_offset >= 0);
        for m in &mut self.mirrors {
            let Some(om) = other.mirrors.iter().find(|x| x.name == m.name) else {
                continue;
            };
            for t in &mut m.topics {
                let Some(ot) = om.topics.iter().find(|x| x.name == t.name) else {
                    continue;
                };
                for p in &mut t.partitions {
                    if let Some(op) = ot.partitions.iter().find(|x| x.partition == p.partition) {
                        if rank(op) > rank(p) {
                            *p = op.clone();
                        }
                    }
                }
            }
        }
    }
}

/// Encodes a JSON body as compact bytes plus an empty tagged-field section.
pub fn encode_body<T: Serialize>(value: &T, out: &mut BytesMut) -> anyhow::Result<()> {
    let json = serde_json::to_vec(value)?;
    put_uvarint(out, json.len() as u64 + 1);
    out.put_slice(&json);
    put_uvarint(out, 0);
    Ok(())
}

/// Decodes what [`encode_body`] wrote, naming what was wrong.
pub fn decode_body<T: for<'de> Deserialize<'de>>(buf: &mut Bytes) -> anyhow::Result<T> {
    let len = get_uvarint(buf)?;
    if len == 0 {
        anyhow::bail!("mirror body is null");
    }
    let len = (len - 1) as usize;
    if buf.remaining() < len {
        anyhow::bail!(
            "mirror body says {len} bytes but {} remain",
            buf.remaining()
        );
    }
    let json = buf.split_to(len);
    let value = serde_json::from_slice(&json).map_err(|e| anyhow::anyhow!("mirror body: {e}"))?;
    let tags = get_uvarint(buf)?;
    if tags != 0 {
        anyhow::bail!("mirror body has {tags} tagged fields; none are defined");
    }
    Ok(value)
}

fn put_uvarint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn get_uvarint(buf: &mut Bytes) -> anyhow::Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        if !buf.has_remaining() {
            anyhow::bail!("truncated varint in mirror body");
        }
        let b = buf.get_u8();
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    anyhow::bail!("varint in mirror body is too long")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_base_and_avoid_kafka_apis() {
        assert_eq!(MirrorApi::StopMirrorTopics.key(94), 96);
        assert_eq!(MirrorApi::DeleteClusterMirror.key(94), 104);
        assert_eq!(MirrorApi::RecoverMirrorTopics.key(94), 106);
        assert_eq!(
            MirrorApi::from_key(94, 99),
            Some(MirrorApi::DescribeClusterMirrors)
        );
        assert_eq!(MirrorApi::from_key(94, 97), None);
        assert_eq!(clashing_key(94), None);
        assert_eq!(clashing_key(0), Some(0));
    }

    #[test]
    fn bodies_round_trip_and_bad_ones_are_named() {
        let req = MirrorRequest::Stop {
            mirror: "a-to-b".into(),
            topics: vec!["t".into()],
        };
        let mut out = BytesMut::new();
        encode_body(&req, &mut out).unwrap();
        let mut bytes = out.freeze();
        let back: MirrorRequest = decode_body(&mut bytes).unwrap();
        assert_eq!(back, req);
        assert!(bytes.is_empty());
        let mut short = Bytes::from_static(&[10, b'{']);
        let err = decode_body::<MirrorRequest>(&mut short).unwrap_err();
        assert!(err.to_string().contains("9 bytes"), "{err}");
        let mut bad = BytesMut::new();
        encode_body(&serde_json::json!({"nope": 1}), &mut bad).unwrap();
        let err = decode_body::<MirrorRequest>(&mut bad.freeze()).unwrap_err();
        assert!(err.to_string().contains("mirror body"), "{err}");
    }

    /// Found by a mirror run of the correct broker: a node resumed from a pause answered a
    /// describe as the partition's leader, MIRRORING, from metadata older than the failover
    /// that had stopped the mirror; its answer came last and was kept.
    #[test]
    fn a_merged_describe_keeps_the_newest_metadata_and_the_leader_offsets() {
        let answer = |leader: i32, epoch: i32, state: MirrorState, offset: i64| MirrorResponse {
            cluster_id: "a".into(),
            mirrors: vec![MirrorDescription {
                name: "b-to-a".into(),
                source_bootstrap: "b:9092".into(),
                source_cluster_id: "b".into(),
                topics: vec![TopicDescription {
                    name: "t0".into(),
                    topic_id: Uuid::nil(),
                    partitions: vec![PartitionDescription {
                        partition: 0,
                        leader,
                        leader_epoch: epoch,
                        state,
                        source_offset: -1,
                        destination_offset: offset,
                        lag: -1,
                        lmle: -1,
                        retry_attempt: 0,
                        last_error: None,
                        waiting_for: None,
                        barrier_offset: None,
                    }],
                }],
            }],
            ..MirrorResponse::default()
        };
        let merged = |answers: &[MirrorResponse]| {
            let mut m = answers[0].clone();
            for a in &answers[1..] {
                m.merge_describe(a);
            }
            m.mirrors[0].topics[0].partitions[0].clone()
        };
        let leader = answer(1, 44, MirrorState::Stopped, 1447);
        let follower = answer(1, 44, MirrorState::Stopped, -1);
        let stale = answer(3, 43, MirrorState::Mirroring, 1448);
        for order in [
            [leader.clone(), follower.clone(), stale.clone()],
            [stale.clone(), follower.clone(), leader.clone()],
            [follower.clone(), stale.clone(), leader.clone()],
        ] {
            let p = merged(&order);
            assert_eq!(
                (p.leader, p.state, p.destination_offset),
                (1, MirrorState::Stopped, 1447)
            );
        }
        // Without the leader's answer the newest view still wins, offsets unknown.
        let p = merged(&[stale, follower]);
        assert_eq!((p.state, p.destination_offset), (MirrorState::Stopped, -1));
    }

    #[test]
    fn requests_are_json_in_the_kips_shape() {
        let stop = MirrorRequest::Stop {
            mirror: "a-to-b".into(),
            topics: vec!["t0".into()],
        };
        assert_eq!(stop.api().key(DEFAULT_API_KEY_BASE), 96);
        assert_eq!(
            serde_json::to_value(&stop).unwrap(),
            serde_json::json!({"stop": {"mirror": "a-to-b", "topics": ["t0"]}})
        );
        let describe = MirrorRequest::Describe {
            mirror: None,
            lookup: None,
        };
        assert_eq!(
            serde_json::to_value(&describe).unwrap(),
            serde_json::json!({"describe": {"mirror": null, "lookup": null}})
        );
    }

    #[test]
    fn responses_decode_and_name_what_failed() {
        let json = serde_json::json!({"error_code": 0, "error_message": null, "cluster_id": "b",
            "topics": [{"topic": "t0", "error_code": 0, "error_message": null},
                       {"topic": "t1", "error_code": 3, "error_message": "no topic"}],
            "mirrors": [{"name": "a-to-b", "source_bootstrap": "x:9092",
                "source_cluster_id": "a", "topics": [{"name": "t0",
                "topic_id": "00000000-0000-0000-0000-000000000000",
                "partitions": [{"partition": 0, "leader": 1, "state": "MIRRORING",
                    "source_offset": 9, "destination_offset": 7, "lag": 2, "lmle": -1,
                    "retry_attempt": 0, "last_error": null, "waiting_for": null}]}]}],
            "lmle": [[0, 3]]});
        let mut framed = BytesMut::new();
        encode_body(&json, &mut framed).unwrap();
        let r: MirrorResponse = decode_body(&mut framed.freeze()).unwrap();
        let e = r.check("stop").unwrap_err().to_string();
        assert!(e.contains("topic t1: error 3 no topic"), "{e}");
        let p = r.partitions("a-to-b", "t0");
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].state, p[0].lag), (MirrorState::Mirroring, 2));
        assert_eq!(r.mirrors[0].topics[0].topic_id, Uuid::nil());
        assert_eq!(r.lmle, vec![(0, 3)]);
        assert!(decode_body::<MirrorResponse>(&mut Bytes::from_static(&[0])).is_err());
        assert!(decode_body::<MirrorResponse>(&mut Bytes::from_static(&[9, b'{'])).is_err());
    }
}
