//! A minimal Kafka client over one TCP connection: one request at a time, every call bounded by
//! a timeout. Followers use it to fetch from leaders and the admin command to reach a broker.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// Largest response frame accepted, as large as the broker accepts requests, so a full fetch fits.
const MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

pub struct KafkaConnection {
    framed: Framed<TcpStream, LengthDelimitedCodec>,
    next_correlation: i32,
    timeout: Duration,
    client_id: String,
}

impl KafkaConnection {
    pub async fn connect(addr: &str, timeout: Duration, client_id: &str) -> anyhow::Result<Self> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow::anyhow!("connect to {addr} timed out"))??;
        stream.set_nodelay(true)?;
        let codec = LengthDelimitedCodec::builder()
            .max_frame_length(MAX_FRAME_BYTES)
            .new_codec();
        Ok(KafkaConnection {
            framed: Framed::new(stream, codec),
            next_correlation: 1,
            timeout,
            client_id: client_id.to_string(),
        })
    }

    /// Sends `req` at `version` and waits for its response.
    pub async fn call<R>(&mut self, version: i16, req: &R) -> anyhow::Result<R::Response>
    where
        R: Request,
    {
        self.call_with_timeout(version, req, self.timeout).await
    }

    pub async fn call_with_timeout<R>(
        &mut self,
        version: i16,
        req: &R,
        timeout: Duration,
    ) -> anyhow::Result<R::Response>
    where
        R: Request,
    {
        let exchange = async {
            let correlation = self.write_request(version, req).await?;
            self.read_response::<R>(version, correlation).await
        };
        within::<R, _>(timeout, exchange).await
    }

    /// Sends `req` at `version` without waiting for the response, so the caller can work while
    /// the peer answers; returns the correlation id [`KafkaConnection::receive`] expects.
    /// Responses arrive in request order.
    pub async fn send<R>(&mut self, version: i16, req: &R) -> anyhow::Result<i32>
    where
        R: Request,
    {
        let timeout = self.timeout;
        within::<R, _>(timeout, self.write_request(version, req)).await
    }

    /// Waits up to this connection's timeout for the response to the request sent as
    /// `correlation` (the oldest one unanswered).
    pub async fn receive<R>(
        &mut self,
        version: i16,
        correlation: i32,
    ) -> anyhow::Result<R::Response>
    where
        R: Request,
    {
        let timeout = self.timeout;
        within::<R, _>(timeout, self.read_response::<R>(version, correlation)).await
    }

    async fn write_request<R>(&mut self, version: i16, req: &R) -> anyhow::Result<i32>
    where
        R: Request,
    {
        let key =
            ApiKey::try_from(R::KEY).map_err(|_| anyhow::anyhow!("unknown api key {}", R::KEY))?;
        let correlation = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())))
            .encode(&mut buf, key.request_header_version(version))?;
        req.encode(
            &mut buf,
            crate::protocol::versions::body_version(key, version),
        )?;
        self.framed.send(buf.freeze()).await?;
        Ok(correlation)
    }

    async fn read_response<R>(
        &mut self,
        version: i16,
        correlation: i32,
    ) -> anyhow::Result<R::Response>
    where
        R: Request,
    {
        let key =
            ApiKey::try_from(R::KEY).map_err(|_| anyhow::anyhow!("unknown api key {}", R::KEY))?;
        let frame = self
            .framed
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("connection closed"))??;
        let mut frame = frame.freeze();
        let version = crate::protocol::versions::body_version(key, version);
        let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))?;
        if header.correlation_id != correlation {
            anyhow::bail!(
                "correlation id {} does not match {correlation}",
                header.correlation_id
            );
        }
        // A peer's counts are checked before the decoder reserves room for them, as a
        // client's are; bodies of our own APIs with no Kafka layout carry no such counts.
        if tidemark_wirebound::response_layout(R::KEY).is_some() {
            tidemark_wirebound::check_response(R::KEY, version, &frame)?;
        }
        R::Response::decode(&mut frame, version)
    }

    /// Sends a request of an API the protocol crate does not know (the mirror APIs): request
    /// header v2, then `body`; returns the response body after its v1 header.
    pub async fn call_raw(&mut self, key: i16, version: i16, body: &[u8]) -> anyhow::Result<Bytes> {
        let correlation = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())))
            .encode(&mut buf, 2)?;
        buf.extend_from_slice(body);
        let timeout = self.timeout;
        let exchange = async {
            self.framed.send(buf.freeze()).await?;
            let frame = self
                .framed
                .next()
                .await
                .ok_or_else(|| anyhow::anyhow!("connection closed"))??;
            let mut frame = frame.freeze();
            let header = ResponseHeader::decode(&mut frame, 1)?;
            if header.correlation_id != correlation {
                anyhow::bail!(
                    "correlation id {} does not match {correlation}",
                    header.correlation_id
                );
            }
            Ok(frame)
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| anyhow::anyhow!("API key {key} timed out after {timeout:?}"))?
    }
}

/// Bounds one exchange of API `R` by `timeout`.
async fn within<R: Request, T>(
    timeout: Duration,
    exchange: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(timeout, exchange).await.map_err(|_| {
        let key = ApiKey::try_from(R::KEY)
            .map_or_else(|_| format!("API key {}", R::KEY), |k| format!("{k:?}"));
        anyhow::anyhow!("{key} timed out after {timeout:?}")
    })?
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::OffsetForLeaderEpochRequest;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A peer that answers one request with an OffsetForLeaderEpoch v3 response claiming
    /// 2^31-1 topics in a body of eight bytes.
    async fn hostile_peer() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let len = s.read_i32().await.unwrap();
            let mut req = vec![0; len as usize];
            s.read_exact(&mut req).await.unwrap();
            let correlation = &req[4..8];
            let mut body = correlation.to_vec();
            body.extend(0i32.to_be_bytes()); // throttle_time_ms
            body.extend(i32::MAX.to_be_bytes()); // topics: 2^31-1 of them, none sent
            s.write_i32(body.len() as i32).await.unwrap();
            s.write_all(&body).await.unwrap();
            let _ = s.read_u8().await;
        });
        addr
    }

    #[tokio::test]
    async fn a_peer_claiming_more_elements_than_its_frame_holds_is_an_error() {
        let addr = hostile_peer().await;
        let mut conn = KafkaConnection::connect(&addr, Duration::from_secs(5), "t")
            .await
            .unwrap();
        let err = conn
            .call(3, &OffsetForLeaderEpochRequest::default())
            .await
            .expect_err("the count cannot fit in the frame");
        let msg = format!("{err:#}");
        assert!(
            msg.contains("OffsetForLeaderEpoch v3 response") && msg.contains("topics"),
            "{msg}"
        );
    }
}
