//! What the throughput benchmarks share: produce frames of 1 KiB records to `bench`-0 and a
//! pipelined sender that keeps a fixed number of them in flight, so every benchmark loads the
//! broker the same way.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::common;

/// Bytes per record value.
pub const RECORD: usize = 1024;
/// Records per batch (one batch per request).
pub const PER_BATCH: usize = 32;
/// Requests outstanding on the connection.
pub const IN_FLIGHT: usize = 16;

/// `PER_BATCH` records of `RECORD` bytes, the values a batch is made of.
pub fn record_values() -> Vec<Vec<u8>> {
    vec![vec![b'x'; RECORD]; PER_BATCH]
}

/// A Produce v9 frame (correlation id 1) carrying `batch` to `bench`-0, and where the batch lies
/// in it (start, length).
pub fn produce_frame(acks: i16, batch: &[u8]) -> (Vec<u8>, usize, usize) {
    let req = ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("bench")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(batch.to_vec().into()))])]);
    let frame = common::frame(ApiKey::Produce, 9, 1, &req);
    let at = frame
        .windows(batch.len())
        .position(|w| w == batch)
        .expect("the frame holds the batch");
    (frame, at, batch.len())
}

/// Sends `frame` `n` times to `addr` with `IN_FLIGHT` outstanding and returns the elapsed time;
/// `before_send(batch, i)` may rewrite the batch of the `i`-th request before it goes.
pub fn drive(
    addr: &str,
    n: usize,
    (mut frame, batch_at, batch_len): (Vec<u8>, usize, usize),
    mut before_send: impl FnMut(&mut [u8], usize),
) -> Duration {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut writer = BufWriter::new(s);
    let start = Instant::now();
    let (mut sent, mut received) = (0, 0);
    while received < n {
        while sent < n && sent - received < IN_FLIGHT {
            before_send(&mut frame[batch_at..batch_at + batch_len], sent);
            writer.write_all(&frame).unwrap();
            sent += 1;
        }
        writer.flush().unwrap();
        let mut len = [0u8; 4];
        reader.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        reader.read_exact(&mut body).unwrap();
        received += 1;
    }
    start.elapsed()
}
