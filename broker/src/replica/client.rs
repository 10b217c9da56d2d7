//! A minimal Kafka client over one TCP connection: one request at a time, every call bounded by
//! a timeout. Followers use it to fetch from leaders and the admin command to reach a broker.

use std::time::Duration;

use bytes::BytesMut;
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
        req.encode(&mut buf, version)?;
        let exchange = async {
            self.framed.send(buf.freeze()).await?;
            let frame = self
                .framed
                .next()
                .await
                .ok_or_else(|| anyhow::anyhow!("connection closed"))??;
            let mut frame = frame.freeze();
            let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))?;
            if header.correlation_id != correlation {
                anyhow::bail!(
                    "correlation id {} does not match {correlation}",
                    header.correlation_id
                );
            }
            R::Response::decode(&mut frame, version)
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| anyhow::anyhow!("{key:?} timed out after {timeout:?}"))?
    }
}
