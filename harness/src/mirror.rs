//! The cluster-mirroring admin requests of KIP-1279 (create a mirror, start and stop mirroring
//! topics, describe) as the harness sends them: from the client side, which no grudge cuts, so
//! failovers and failbacks still reach a cluster whose nodes are partitioned from each other.
//!
//! The KIP's API keys are provisional; tidemark-broker serves them at `mirror.api.key.base`
//! (default 94) with a JSON body in the Kafka frame (`broker/src/mirror/wire.rs`), the same
//! requests `tidemark-broker admin mirror ...` sends. Only the shapes the harness uses are here.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::client::ClientContext;
use crate::kafka::{Connection, KafkaError};

/// How long one node gets to answer a describe of every node.
const DESCRIBE_ASK: std::time::Duration = std::time::Duration::from_secs(2);

/// The API key of CreateClusterMirror; the others follow it (`broker/src/mirror/wire.rs`).
pub const API_KEY_BASE: i16 = 94;

/// A mirror admin request, in the broker's JSON shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MirrorRequest {
    /// Create mirror `mirror` on the destination, of the cluster at `source_bootstrap`
    /// (`host:port` list, comma separated).
    Create {
        /// Mirror name.
        mirror: String,
        /// The source cluster's addresses.
        source_bootstrap: String,
    },
    /// Start mirroring `topics` (creating them, or failing back).
    Start {
        /// Mirror name.
        mirror: String,
        /// Topic names.
        topics: Vec<String>,
    },
    /// Stop mirroring `topics` (failover): answered once they are writable.
    Stop {
        /// Mirror name.
        mirror: String,
        /// Topic names.
        topics: Vec<String>,
    },
    /// Every mirror and partition state the answering broker knows, and with `lookup` the
    /// LMLEs it keeps for another cluster (what that cluster's failback looks up).
    Describe {
        /// Only this mirror, or all.
        mirror: Option<String>,
        /// The LMLE lookup.
        lookup: Option<LmleLookup>,
    },
}

/// Which LMLEs to look up: those kept for cluster `cluster_id`'s topic `topic_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LmleLookup {
    /// The `cluster.id` of the cluster the LMLEs were recorded for (the old source).
    pub cluster_id: String,
    /// The topic's id, as describe shows it.
    pub topic_id: String,
    /// Partition indices.
    pub partitions: Vec<i32>,
}

impl MirrorRequest {
    /// The request's API key.
    fn api_key(&self) -> i16 {
        API_KEY_BASE
            + match self {
                MirrorRequest::Create { .. } => 0,
                MirrorRequest::Start { .. } => 1,
                MirrorRequest::Stop { .. } => 2,
                MirrorRequest::Describe { .. } => 5,
            }
    }
}

/// The broker's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MirrorResponse {
    /// Request-level error code.
    pub error_code: i16,
    /// Why, when it failed.
    #[serde(default)]
    pub error_message: Option<String>,
    /// The answering cluster's `cluster.id`.
    #[serde(default)]
    pub cluster_id: String,
    /// Per-topic outcomes of start and stop.
    #[serde(default)]
    pub topics: Vec<TopicOutcome>,
    /// Describe's mirrors.
    #[serde(default)]
    pub mirrors: Vec<MirrorView>,
    /// A lookup's LMLEs as (partition, LMLE), -1 where none is kept.
    #[serde(default)]
    pub lmle: Vec<(i32, i32)>,
}

/// One topic's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TopicOutcome {
    /// Topic.
    pub topic: String,
    /// Its error code.
    pub error_code: i16,
    /// Why, when it failed.
    #[serde(default)]
    pub error_message: Option<String>,
}

/// One mirror as describe shows it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MirrorView {
    /// Mirror name.
    pub name: String,
    /// Its topics.
    pub topics: Vec<MirrorTopicView>,
}

/// One mirror topic.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MirrorTopicView {
    /// Topic name.
    pub name: String,
    /// Topic id (the source's).
    pub topic_id: String,
    /// Its partitions.
    pub partitions: Vec<MirrorPartition>,
}

/// One partition of a mirror topic, as describe shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorPartition {
    /// Partition index.
    pub partition: i32,
    /// `PREPARING`, `MIRRORING`, `STOPPED`, ...
    pub state: String,
    /// The source's log end offset (-1 when unknown).
    pub source_offset: i64,
    /// The local log end offset (-1 when the answering broker does not host the partition).
    pub destination_offset: i64,
    /// How far the destination is behind.
    pub lag: i64,
    /// The Last Mirrored Leader Epoch, -1 when unknown.
    pub lmle: i32,
    /// The last error, when there was one.
    #[serde(default)]
    pub last_error: Option<String>,
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
    pub fn partitions(&self, mirror: &str, topic: &str) -> Vec<MirrorPartition> {
        self.mirrors
            .iter()
            .filter(|m| m.name == mirror)
            .flat_map(|m| m.topics.iter())
            .filter(|t| t.name == topic)
            .flat_map(|t| t.partitions.iter().cloned())
            .collect()
    }
}

/// Frames `req` as the broker reads it: an unsigned varint of the JSON length plus one, the
/// JSON, and an empty tagged-field section.
pub fn encode(req: &MirrorRequest) -> Bytes {
    let json = serde_json::to_vec(req).expect("mirror requests serialize");
    let mut out = BytesMut::new();
    put_uvarint(&mut out, json.len() as u64 + 1);
    out.put_slice(&json);
    put_uvarint(&mut out, 0);
    out.freeze()
}

/// Reads a response body framed as [`encode`] frames requests.
pub fn decode(mut body: Bytes) -> anyhow::Result<MirrorResponse> {
    let len = get_uvarint(&mut body)?;
    anyhow::ensure!(len > 0, "mirror response body is null");
    let len = (len - 1) as usize;
    anyhow::ensure!(
        body.remaining() >= len,
        "mirror response says {len} bytes, {} remain",
        body.remaining()
    );
    let json = body.split_to(len);
    serde_json::from_slice(&json).map_err(|e| anyhow::anyhow!("mirror response: {e}"))
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
        anyhow::ensure!(buf.has_remaining(), "varint cut short");
        let b = buf.get_u8();
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    anyhow::bail!("varint longer than 64 bits")
}

/// Sends `req` to one node of `cx` after another until one answers (a killed or paused node
/// does not); the answer may still carry an error code.
pub async fn call_any(cx: &ClientContext, req: &MirrorRequest) -> anyhow::Result<MirrorResponse> {
    let mut last = String::from("the cluster has no nodes");
    for node in &cx.nodes {
        match call(cx, node.addr, req).await {
            Ok(r) => return Ok(r),
            Err(e) => last = format!("{}: {e:#}", node.name),
        }
    }
    anyhow::bail!("no node of cluster {} answered: {last}", cx.cluster)
}

/// Sends `req` to the node at `addr`.
pub async fn call(
    cx: &ClientContext,
    addr: std::net::SocketAddr,
    req: &MirrorRequest,
) -> anyhow::Result<MirrorResponse> {
    let mut conn = Connection::connect(cx.dialer.clone(), addr, cx.timeout).await?;
    let body = conn
        .raw(req.api_key(), 0, &encode(req))
        .await
        .map_err(|e: KafkaError| anyhow::anyhow!(e))?;
    decode(body)
}

/// The LMLEs `cx` keeps for the cluster at `requester` (its `cluster.id` asked of it) for
/// `topic` of mirror `mirror`, by partition: what `requester` would look up to fail back.
pub async fn kept_lmles(
    cx: &ClientContext,
    requester: &ClientContext,
    mirror: &str,
    topic: &str,
) -> anyhow::Result<Vec<(i32, i32)>> {
    let all = MirrorRequest::Describe {
        mirror: None,
        lookup: None,
    };
    let cluster_id = call_any(requester, &all).await?.cluster_id;
    let described = describe(cx, mirror).await?;
    let t = described
        .mirrors
        .iter()
        .filter(|m| m.name == mirror)
        .flat_map(|m| m.topics.iter())
        .find(|t| t.name == topic)
        .ok_or_else(|| anyhow::anyhow!("mirror {mirror} on {} has no topic {topic}", cx.cluster))?;
    let lookup = MirrorRequest::Describe {
        mirror: None,
        lookup: Some(LmleLookup {
            cluster_id,
            topic_id: t.topic_id.clone(),
            partitions: t.partitions.iter().map(|p| p.partition).collect(),
        }),
    };
    let r = call_any(cx, &lookup).await?;
    r.check(&format!("LMLE lookup on {}", cx.cluster))?;
    Ok(r.lmle)
}

/// Every partition of `mirror` on `cx`, each from the broker that leads it (only the leader
/// knows its offsets and lag): asks every node and keeps, per partition, an answer with a local
/// log end offset.
pub async fn describe(cx: &ClientContext, mirror: &str) -> anyhow::Result<MirrorResponse> {
    let req = MirrorRequest::Describe {
        mirror: Some(mirror.to_string()),
        lookup: None,
    };
    // A paused node never answers: it gets less time than the request timeout, so one does
    // not slow every describe of a failback waiting for its partitions.
    let ask = |n: &crate::client::NodeAddr| {
        tokio::time::timeout(DESCRIBE_ASK.min(cx.timeout), call(cx, n.addr, &req))
    };
    let answers = futures::future::join_all(cx.nodes.iter().map(ask)).await;
    let mut answers = answers
        .into_iter()
        .filter_map(|a| a.ok().and_then(Result::ok));
    let Some(mut merged) = answers.next() else {
        return call_any(cx, &req).await;
    };
    for other in answers {
        for m in &mut merged.mirrors {
            let Some(om) = other.mirrors.iter().find(|x| x.name == m.name) else {
                continue;
            };
            for t in &mut m.topics {
                let Some(ot) = om.topics.iter().find(|x| x.name == t.name) else {
                    continue;
                };
                for p in &mut t.partitions {
                    if let Some(op) = ot
                        .partitions
                        .iter()
                        .find(|x| x.partition == p.partition && x.destination_offset >= 0)
                    {
                        *p = op.clone();
                    }
                }
            }
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_framed_json_in_the_brokers_shape() {
        let req = MirrorRequest::Stop {
            mirror: "a-to-b".into(),
            topics: vec!["t0".into()],
        };
        assert_eq!(req.api_key(), 96);
        let mut framed = encode(&req);
        let len = get_uvarint(&mut framed).unwrap() as usize - 1;
        let json: serde_json::Value = serde_json::from_slice(&framed[..len]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"stop": {"mirror": "a-to-b", "topics": ["t0"]}})
        );
        assert_eq!(&framed[len..], &[0]);
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
                "source_cluster_id": "a", "topics": [{"name": "t0", "topic_id": "00000000-0000-0000-0000-000000000000",
                "partitions": [{"partition": 0, "leader": 1, "state": "MIRRORING",
                    "source_offset": 9, "destination_offset": 7, "lag": 2, "lmle": -1,
                    "retry_attempt": 0, "last_error": null, "waiting_for": null}]}]}],
            "lmle": [[0, 3]]});
        let body = serde_json::to_vec(&json).unwrap();
        let mut framed = BytesMut::new();
        put_uvarint(&mut framed, body.len() as u64 + 1);
        framed.put_slice(&body);
        put_uvarint(&mut framed, 0);
        let r = decode(framed.freeze()).unwrap();
        let e = r.check("stop").unwrap_err().to_string();
        assert!(e.contains("topic t1: error 3 no topic"), "{e}");
        let p = r.partitions("a-to-b", "t0");
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].state.as_str(), p[0].lag), ("MIRRORING", 2));
        assert_eq!(
            r.mirrors[0].topics[0].topic_id,
            "00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(r.lmle, vec![(0, 3)]);
        assert!(decode(Bytes::from_static(&[0])).is_err());
        assert!(decode(Bytes::from_static(&[9, b'{'])).is_err());
    }
}
