//! The client side toward another cluster's brokers: connecting through a bootstrap list,
//! mirror admin requests in the broker's framing, and Metadata. Apart from the handlers and the
//! mirror tasks so both use it (and `admin mirror` too) without seeing the broker.

use bytes::BytesMut;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use std::time::Duration;

use super::wire::{decode_body, encode_body, MirrorRequest, MirrorResponse};
use crate::replica::client::KafkaConnection;

/// The timeout of every request to another cluster.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to the first reachable address of a comma-separated bootstrap list.
pub async fn connect_any(bootstrap: &str, client_id: &str) -> anyhow::Result<KafkaConnection> {
    let mut last = None;
    for addr in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        match KafkaConnection::connect(addr, RPC_TIMEOUT, client_id).await {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("empty bootstrap list `{bootstrap}`")))
}

/// Sends one mirror request over `conn` with the mirror APIs at `base`.
pub async fn call(
    conn: &mut KafkaConnection,
    base: i16,
    req: &MirrorRequest,
) -> anyhow::Result<MirrorResponse> {
    let mut body = BytesMut::new();
    encode_body(req, &mut body)?;
    let mut resp = conn.call_raw(req.api().key(base), 0, &body).await?;
    decode_body(&mut resp)
}

/// Metadata (v12) for one topic, or for none (brokers and cluster id only).
pub async fn metadata(
    conn: &mut KafkaConnection,
    topic: Option<&str>,
) -> anyhow::Result<MetadataResponse> {
    let topics = vec![topic.map(|t| {
        MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))
    })]
    .into_iter()
    .flatten()
    .collect();
    let req = MetadataRequest::default()
        .with_topics(Some(topics))
        .with_allow_auto_topic_creation(false);
    conn.call(12, &req).await
}
