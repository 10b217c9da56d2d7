//! The cluster-mirroring admin requests of KIP-1279 (create a mirror, start and stop mirroring
//! topics, describe) as the harness sends them: from the client side, which no grudge cuts, so
//! failovers and failbacks still reach a cluster whose nodes are partitioned from each other.
//!
//! The KIP's API keys are provisional; tidemark-broker serves them at `mirror.api.key.base`
//! (default 94) with a JSON body in the Kafka frame. The keys and bodies are the
//! `tidemark-mirrorwire` crate's, the same the broker serves and `tidemark-broker admin mirror
//! ...` sends; the harness takes nothing else of the broker.

use tidemark_mirrorwire::{decode_body, encode_body};
pub use tidemark_mirrorwire::{
    LmleLookup, MirrorRequest, MirrorResponse, MirrorState, PartitionDescription,
    DEFAULT_API_KEY_BASE,
};

use crate::client::ClientContext;
use crate::kafka::{Connection, KafkaError};

/// How long one node gets to answer a describe of every node.
const DESCRIBE_ASK: std::time::Duration = std::time::Duration::from_secs(2);

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

/// Sends a request that changes nothing (a describe, a lookup) to every node of `cx` at once and
/// takes the first answer: a killed or paused node costs one timeout, not one each, so a fault
/// op reading several topics of a cluster with two nodes paused does not hold the schedule up.
pub async fn ask_any(cx: &ClientContext, req: &MirrorRequest) -> anyhow::Result<MirrorResponse> {
    if cx.nodes.is_empty() {
        anyhow::bail!("cluster {} has no nodes", cx.cluster);
    }
    let asks = cx.nodes.iter().map(|node| {
        Box::pin(async move {
            tokio::time::timeout(cx.timeout, call(cx, node.addr, req))
                .await
                .map_err(|_| anyhow::anyhow!("timed out after {:?}", cx.timeout))
                .and_then(|r| r)
                .map_err(|e| format!("{}: {e:#}", node.name))
        })
    });
    match futures::future::select_ok(asks).await {
        Ok((answer, _)) => Ok(answer),
        Err(last) => anyhow::bail!("no node of cluster {} answered: {last}", cx.cluster),
    }
}

/// Sends `req` to the node at `addr`.
pub async fn call(
    cx: &ClientContext,
    addr: std::net::SocketAddr,
    req: &MirrorRequest,
) -> anyhow::Result<MirrorResponse> {
    let mut framed = bytes::BytesMut::new();
    encode_body(req, &mut framed)?;
    let mut conn = Connection::connect(cx.dialer.clone(), addr, cx.timeout).await?;
    let mut body = conn
        .raw(req.api().key(DEFAULT_API_KEY_BASE), 0, &framed.freeze())
        .await
        .map_err(|e: KafkaError| anyhow::anyhow!(e))?;
    decode_body(&mut body)
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
    let cluster_id = ask_any(requester, &all).await?.cluster_id;
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
            topic_id: t.topic_id,
            partitions: t.partitions.iter().map(|p| p.partition).collect(),
        }),
    };
    let r = ask_any(cx, &lookup).await?;
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
        return ask_any(cx, &req).await;
    };
    for other in answers {
        merged.merge_describe(&other);
    }
    Ok(merged)
}
