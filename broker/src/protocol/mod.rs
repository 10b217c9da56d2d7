//! The Kafka wire: framing, request-header decoding, version negotiation and dispatch. Requests
//! on one connection are answered in the order they came, as Kafka does, while their waits
//! (acks=all, long polls) overlap; a frame that cannot be decoded closes only its own connection.

mod chunks;
mod delete_records;
mod describe_quorum;
mod describe_topic_partitions;
mod groups;
mod handlers;
mod init_producer_id;
pub mod versions;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::broker::Broker;
use crate::mirror::wire::{encode_body, MirrorApi};
use chunks::{Response, ResponseChunks};
use versions::supported_range;
pub use versions::{body_version, listed_apis, LISTED_ONLY, SUPPORTED_APIS};

/// Largest request frame accepted (Kafka's `socket.request.max.bytes` default).
pub const MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

/// How long connections may go on answering the requests they already read once `shutdown` is
/// cancelled: an acks=all write the controlled shutdown answered NOT_LEADER_OR_FOLLOWER reaches
/// its client as that answer, not as a closed connection, while a long poll or a client that
/// stopped reading cannot hold the broker open.
pub const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Accepts client connections until `shutdown` is cancelled, then lets them answer what they
/// already read for up to [`SHUTDOWN_DRAIN`] and closes them.
pub async fn serve(listener: TcpListener, broker: Arc<Broker>, shutdown: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let broker = broker.clone();
                    let shutdown = shutdown.clone();
                    connections.spawn(async move {
                        debug!(%peer, "connection opened");
                        match connection(stream, broker, shutdown).await {
                            Ok(()) => debug!(%peer, "connection closed"),
                            Err(e) => warn!(%peer, "connection closed: {e:#}"),
                        }
                    });
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        debug!(
            open = connections.len(),
            "closing connections still answering"
        );
    }
    connections.shutdown().await;
}

/// Requests one connection may have in progress at once.
const MAX_IN_FLIGHT: usize = 64;

/// Serves one connection. Requests are started in arrival order and each runs until its first
/// wait before the next is read, so appends keep the order of the requests; waits (acks=all,
/// long-polling fetches) overlap, and responses go out in request order as the protocol requires.
async fn connection(
    stream: TcpStream,
    broker: Arc<Broker>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let codec = LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec();
    let (input, mut output) = stream.into_split();
    let mut framed = FramedRead::new(input, codec);
    let mut in_flight = FuturesOrdered::new();
    let mut reading = true;
    // While reading, the shutdown branch is enabled; once not, requests are in flight (or the
    // loop ends): `select!` never runs out of branches. A shutdown stops the reading only, so
    // answers already under way still go out.
    while reading || !in_flight.is_empty() {
        tokio::select! {
            biased;
            _ = shutdown.cancelled(), if reading => reading = false,
            done = in_flight.next(), if !in_flight.is_empty() => {
                let out: Option<Response> = done.expect("the set is not empty")?;
                if let Some(out) = out {
                    // The length and the response's chunks go out in one vectored write, not
                    // copied into a frame buffer first: a fetch's response can be megabytes.
                    output.write_all_buf(&mut out.framed()?).await?;
                }
            }
            frame = framed.next(), if reading && in_flight.len() < MAX_IN_FLIGHT => match frame {
                Some(frame) => in_flight.push_back(respond(&broker, frame?.freeze())),
                None => reading = false,
            },
        }
    }
    Ok(())
}

/// Decodes one request and builds its encoded response; `None` for acks=0 produce, which gets no
/// response. An error closes the connection.
pub async fn respond(broker: &Arc<Broker>, mut frame: Bytes) -> anyhow::Result<Option<Response>> {
    if frame.len() < 8 {
        anyhow::bail!(
            "frame of {} bytes is too short for a request header",
            frame.len()
        );
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    if let Some(api) = MirrorApi::from_key(broker.config.mirror_api_key_base, raw_key) {
        if version != 0 {
            anyhow::bail!("mirror API {api:?} (key {raw_key}) version {version} is not supported (supported 0..=0)");
        }
        let header = RequestHeader::decode(&mut frame, 2)
            .map_err(|e| anyhow::anyhow!("bad request header: {e}"))?;
        let body = crate::mirror::service::handle_frame(&broker.mirrors, api, &mut frame).await;
        let mut out = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(header.correlation_id)
            .encode(&mut out, 1)?;
        encode_body(&body, &mut out)?;
        return Ok(Some(out.freeze().into()));
    }
    let api_key =
        ApiKey::try_from(raw_key).map_err(|_| anyhow::anyhow!("unknown API key {raw_key}"))?;
    let crate_range = api_key.valid_versions();
    if api_key == ApiKey::ApiVersions && !(0..=3).contains(&version) {
        // KIP-511: answer an unknown ApiVersions version in v0 with our list and UNSUPPORTED_VERSION.
        let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let body = handlers::api_versions(crate::errors::UNSUPPORTED_VERSION);
        return encode_response(api_key, 0, correlation_id, &ResponseKind::ApiVersions(body))
            .map(Some);
    }
    if let Some((_, _, _, why)) = LISTED_ONLY
        .iter()
        .find(|(k, lo, hi, _)| *k == api_key && (*lo..=*hi).contains(&version))
    {
        anyhow::bail!("API {api_key:?} version {version} is not served: {why}");
    }
    let Some((lo, hi)) = supported_range(api_key) else {
        anyhow::bail!("API {api_key:?} (key {raw_key}) is not supported by this broker");
    };
    let body = body_version(api_key, version);
    if version < lo || version > hi || body < crate_range.min || body > crate_range.max {
        anyhow::bail!("API {api_key:?} version {version} is not supported (supported {lo}..={hi})");
    }
    let header = RequestHeader::decode(&mut frame, api_key.request_header_version(body))
        .map_err(|e| anyhow::anyhow!("bad request header: {e}"))?;
    // The decoder reserves room for every array from the count the client claims.
    tidemark_wirebound::check_request(raw_key, body, &frame)?;
    let request = RequestKind::decode(api_key, &mut frame, body)
        .map_err(|e| anyhow::anyhow!("bad {api_key:?} v{version} body: {e}"))?;
    let request = match groups::handle(broker, &header, request, version).await {
        Ok(response) => {
            return encode_response(api_key, body, header.correlation_id, &response).map(Some)
        }
        Err(request) => request,
    };
    let Some(response) = handlers::handle(broker, request, version).await else {
        return Ok(None);
    };
    encode_response(api_key, body, header.correlation_id, &response).map(Some)
}

fn encode_response(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> anyhow::Result<Response> {
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let header_version = api_key.response_header_version(version);
    if let ResponseKind::Fetch(fetch) = body {
        let records = fetch
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .filter_map(|p| p.records.clone())
            .collect();
        let mut out = ResponseChunks::new(records);
        header.encode(&mut out, header_version)?;
        fetch.encode(&mut out, version)?;
        return Ok(out.finish());
    }
    let mut out = BytesMut::new();
    header.encode(&mut out, header_version)?;
    body.encode(&mut out, version)?;
    Ok(out.freeze().into())
}

/// Binds the client listener and serves until `shutdown`.
pub async fn run_listener(broker: Arc<Broker>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = broker
        .config
        .client_listener()
        .ok_or_else(|| anyhow::anyhow!("no client listener configured"))?
        .clone();
    let addr = listener
        .socket_addr()
        .map_err(|e| anyhow::anyhow!("listener {}: {e}", listener.name))?;
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} ({}): {e}", listener.name))?;
    info!(%addr, name = %listener.name, "listening");
    serve(tcp, broker, shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_request_has_a_layout_to_bound_its_counts() {
        for (key, lo, hi) in SUPPORTED_APIS {
            let layout = tidemark_wirebound::request_layout(*key as i16)
                .unwrap_or_else(|| panic!("no request layout for {key:?}"));
            // A body is checked in the version it is read in (ListOffsets v11 as v10).
            assert!(
                layout.min <= *lo && body_version(*key, *hi) <= layout.max,
                "{key:?} {lo}..={hi} is beyond the layout's {}..={}",
                layout.min,
                layout.max
            );
        }
    }
}
