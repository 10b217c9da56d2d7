//! Hostile input on the client listener: random and mutated frames, oversized lengths and
//! counts, unknown APIs and versions. The broker, under an address-space limit, must stay up and
//! keep serving a well-behaved client.

mod common;
mod rlimit;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::{api_versions_roundtrip, frame, read_frame, BrokerProc};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::TopicName;
use kafka_protocol::messages::{ApiKey, MetadataRequest, ProduceRequest};
use kafka_protocol::protocol::StrBytes;
use rand::{RngExt, SeedableRng};

fn valid_frames() -> Vec<Vec<u8>> {
    let batch = tidemark_broker::log::testing::batch(&[b"1", b"2"]);
    let produce = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(1000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("fuzz")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(batch.into()))])]);
    vec![
        frame(
            ApiKey::ApiVersions,
            3,
            1,
            &kafka_protocol::messages::ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("t"))
                .with_client_software_version(StrBytes::from_static_str("1")),
        ),
        frame(
            ApiKey::Metadata,
            9,
            2,
            &MetadataRequest::default().with_topics(None),
        ),
        frame(ApiKey::Produce, 8, 3, &produce),
    ]
}

#[test]
fn random_and_mutated_frames_do_not_hurt_the_broker() {
    let mut b = BrokerProc::start(&[]);
    rlimit::limit(b.pid().unwrap(), rlimit::ADDRESS_SPACE);
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(7);
    let valid = valid_frames();
    for round in 0..4000 {
        let mut bytes = match round % 4 {
            0 => {
                let n = rng.random_range(0..200);
                (0..n).map(|_| rng.random::<u8>()).collect::<Vec<u8>>()
            }
            1 => {
                let mut f = valid[rng.random_range(0..valid.len())].clone();
                for _ in 0..rng.random_range(1..6) {
                    let i = rng.random_range(4..f.len());
                    f[i] = rng.random();
                }
                if rng.random_bool(0.5) {
                    // A count (or length) claiming far more than the frame holds.
                    let i = rng.random_range(4..f.len() - 4);
                    f[i..i + 4].copy_from_slice(&i32::MAX.to_be_bytes());
                }
                f
            }
            2 => {
                // A plausible length prefix with a body that is cut short or padded.
                let mut f = valid[rng.random_range(0..valid.len())].clone();
                let cut = rng.random_range(4..f.len());
                f.truncate(cut);
                f
            }
            _ => {
                // Unknown API keys, unsupported versions, absurd lengths.
                let mut f = valid[rng.random_range(0..valid.len())].clone();
                match rng.random_range(0..3) {
                    0 => f[4..6].copy_from_slice(&rng.random_range(70i16..i16::MAX).to_be_bytes()),
                    1 => f[6..8].copy_from_slice(&rng.random_range(20i16..i16::MAX).to_be_bytes()),
                    _ => f[0..4].copy_from_slice(&rng.random::<u32>().to_be_bytes()),
                }
                f
            }
        };
        if rng.random_bool(0.1) {
            bytes.extend_from_slice(&valid[0]);
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", b.port)) {
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let _ = s.write_all(&bytes);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let _ = read_frame(&mut s);
        }
        if round % 100 == 0 {
            let mut s = TcpStream::connect(("127.0.0.1", b.port)).unwrap_or_else(|e| {
                panic!(
                    "broker no longer accepts ({e}) after round {round}\n{}",
                    b.log()
                )
            });
            api_versions_roundtrip(&mut s).expect("a well-behaved client is still served");
        }
    }
    assert!(b.is_running(), "broker died\n{}", b.log());
    let mut s = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    api_versions_roundtrip(&mut s).unwrap();
    // The well-formed produce still works and its data is readable by kcat.
    s.write_all(&valid[2]).unwrap();
    let resp = read_frame(&mut s).unwrap();
    assert_eq!(&resp[..4], &3i32.to_be_bytes());
    assert!(!b.log().contains("panicked"), "{}", b.log());
}

#[test]
fn unsupported_api_versions_version_gets_error_and_list() {
    let b = BrokerProc::start(&[]);
    let mut s = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut f = frame(
        ApiKey::ApiVersions,
        3,
        9,
        &kafka_protocol::messages::ApiVersionsRequest::default(),
    );
    f[6..8].copy_from_slice(&99i16.to_be_bytes());
    s.write_all(&f).unwrap();
    let body = read_frame(&mut s).unwrap();
    assert_eq!(&body[..4], &9i32.to_be_bytes());
    assert_eq!(
        i16::from_be_bytes([body[4], body[5]]),
        35,
        "UNSUPPORTED_VERSION"
    );
}
