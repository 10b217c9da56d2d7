//! Produce throughput of one broker on loopback: 1 KiB records, acks=1, next to a loopback
//! baseline measured in the same run (the same frames sent to a sink that only reads a frame and
//! answers a tiny ack), so the figure is a ratio that survives a noisy machine.
//!
//! `cargo bench -p tidemark-broker --bench produce_throughput`

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, ProduceRequest, TopicName};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::protocol::StrBytes;

const RECORD: usize = 1024;
const PER_BATCH: usize = 32;
const IN_FLIGHT: usize = 16;
const TOTAL_BYTES: usize = 512 << 20;

fn produce_frame(corr: i32) -> Vec<u8> {
    let value = vec![b'x'; RECORD];
    let values: Vec<&[u8]> = (0..PER_BATCH).map(|_| value.as_slice()).collect();
    let batch = tidemark_broker::log::testing::batch(&values);
    let req = ProduceRequest::default().with_acks(1).with_timeout_ms(30_000).with_topic_data(vec![
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("bench")))
            .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch.into()))]),
    ]);
    common::frame(ApiKey::Produce, 9, corr, &req)
}

/// Sends `n` produce frames with `IN_FLIGHT` outstanding and returns the elapsed time.
fn drive(addr: &str, n: usize) -> Duration {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut writer = BufWriter::new(s);
    let frame = produce_frame(1);
    let start = Instant::now();
    let mut sent = 0;
    let mut received = 0;
    while received < n {
        while sent < n && sent - received < IN_FLIGHT {
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

/// A sink that reads whole frames and answers each with an 8-byte frame.
fn spawn_sink() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let s = s.unwrap();
            s.set_nodelay(true).unwrap();
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                let mut len = [0u8; 4];
                let mut body = Vec::new();
                while r.read_exact(&mut len).is_ok() {
                    body.resize(u32::from_be_bytes(len) as usize, 0);
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    if w.write_all(&[0, 0, 0, 4, body[4], body[5], body[6], body[7]]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn main() {
    let b = common::BrokerProc::start(&[]);
    let mut s = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    let create = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_static_str("bench")))
        .with_num_partitions(1)
        .with_replication_factor(1)]);
    s.write_all(&common::frame(ApiKey::CreateTopics, 5, 1, &create)).unwrap();
    common::read_frame(&mut s).unwrap();

    let frame_bytes = produce_frame(1).len();
    let n = TOTAL_BYTES / (RECORD * PER_BATCH);
    let payload = (n * PER_BATCH * RECORD) as f64;
    drive(&b.bootstrap(), n / 10);
    let sink = spawn_sink();
    drive(&sink, n / 10);

    let base = drive(&sink, n);
    let broker = drive(&b.bootstrap(), n);
    let rate = |d: Duration| ((n * PER_BATCH) as f64 / d.as_secs_f64(), payload / d.as_secs_f64() / 1e6);
    let (br, bm) = rate(broker);
    let (lr, lm) = rate(base);
    println!("produce, 1 KiB records, acks=1, {PER_BATCH} records/request, {IN_FLIGHT} in flight, {} MiB, frame {frame_bytes} B", TOTAL_BYTES >> 20);
    println!("  loopback baseline : {lr:>10.0} records/s  {lm:>8.1} MB/s");
    println!("  tidemark-broker   : {br:>10.0} records/s  {bm:>8.1} MB/s");
    println!("  ratio broker/baseline: {:.2}", bm / lm);
}
