//! Incremental fetch sessions (KIP-227) on a real broker: a session opened by a full fetch, later
//! fetches of it answering only the partitions with something new (nothing at all for idle ones),
//! forgotten partitions left out, and the session errors. And the followers' side: one fetcher
//! per leader broker for all its partitions, whose idle partitions cost nothing on the wire.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use common::client::{create_topic, produce};
use common::Cluster;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tidemark_broker::replica::client::KafkaConnection;

const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
const INVALID_FETCH_SESSION_EPOCH: i16 = 71;

fn topic() -> TopicName {
    TopicName(StrBytes::from_static_str("t"))
}

/// A consumer's fetch of `t` in session `(id, epoch)`, naming `partitions` at their offsets and
/// forgetting `forgotten`.
fn request(id: i32, epoch: i32, partitions: &[(i32, i64)], forgotten: &[i32]) -> FetchRequest {
    let mut req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_session_id(id)
        .with_session_epoch(epoch);
    if !partitions.is_empty() {
        req.topics = vec![FetchTopic::default().with_topic(topic()).with_partitions(
            partitions
                .iter()
                .map(|&(p, offset)| {
                    FetchPartition::default()
                        .with_partition(p)
                        .with_fetch_offset(offset)
                        .with_partition_max_bytes(1 << 20)
                })
                .collect(),
        )];
    }
    if !forgotten.is_empty() {
        req.forgotten_topics_data = vec![ForgottenTopic::default()
            .with_topic(topic())
            .with_partitions(forgotten.to_vec())];
    }
    req
}

/// The partitions a response answered, with their high watermark and whether records came.
fn answered(resp: &FetchResponse) -> Vec<(i32, i64, bool)> {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            let records = p.records.as_ref().is_some_and(|r| !r.is_empty());
            (p.partition_index, p.high_watermark, records)
        })
        .collect()
}

#[test]
fn a_session_answers_only_partitions_with_something_new() {
    let c = Cluster::start(1, "", &[]);
    let addr = c.addr(1);
    assert_eq!(create_topic(&addr, "t", 3, 1, &[]), 0);
    c.wait_for("t led", Duration::from_secs(20), |c| {
        (0..3).all(|p| c.partition_state("t", p).is_some_and(|(l, _, _)| l == 1))
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut conn = rt
        .block_on(KafkaConnection::connect(
            &addr,
            Duration::from_secs(5),
            "test",
        ))
        .unwrap();
    let mut fetch =
        |req: FetchRequest| -> FetchResponse { rt.block_on(conn.call(12, &req)).unwrap() };
    let all = [(0, 0), (1, 0), (2, 0)];
    let open: FetchResponse = fetch(request(0, 0, &all, &[]));
    assert_eq!(open.error_code, 0);
    let id = open.session_id;
    assert!(id > 0, "a full fetch with epoch 0 opens a session");
    assert_eq!(answered(&open).len(), 3);

    // Idle partitions cost nothing.
    let idle: FetchResponse = fetch(request(id, 1, &[], &[]));
    assert_eq!((idle.error_code, idle.session_id), (0, id));
    assert_eq!(answered(&idle), []);

    produce(&addr, "t", 1, &[7, 8], -1, Duration::from_secs(5)).unwrap();
    let news: FetchResponse = fetch(request(id, 2, &[], &[]));
    assert_eq!(answered(&news), [(1, 2, true)]);
    // The client moves partition 1 on: nothing new again.
    let moved: FetchResponse = fetch(request(id, 3, &[(1, 2)], &[]));
    assert_eq!(answered(&moved), []);

    // A repeated epoch, and a session that does not exist.
    let stale: FetchResponse = fetch(request(id, 3, &[], &[]));
    assert_eq!(stale.error_code, INVALID_FETCH_SESSION_EPOCH);
    let unknown: FetchResponse = fetch(request(id + 100, 1, &[], &[]));
    assert_eq!(unknown.error_code, FETCH_SESSION_ID_NOT_FOUND);

    // A forgotten partition is no longer answered, whatever it gets.
    let forget: FetchResponse = fetch(request(id, 4, &[], &[1]));
    assert_eq!(forget.error_code, 0);
    produce(&addr, "t", 1, &[9], -1, Duration::from_secs(5)).unwrap();
    produce(&addr, "t", 2, &[10], -1, Duration::from_secs(5)).unwrap();
    let after: FetchResponse = fetch(request(id, 5, &[], &[]));
    assert_eq!(answered(&after), [(2, 1, true)]);

    // Closed by a sessionless full fetch: the session is gone.
    let close: FetchResponse = fetch(request(id, -1, &[(0, 0)], &[]));
    assert_eq!((close.error_code, close.session_id), (0, 0));
    assert_eq!(answered(&close).len(), 1);
    let gone: FetchResponse = fetch(request(id, 6, &[], &[]));
    assert_eq!(gone.error_code, FETCH_SESSION_ID_NOT_FOUND);
}

/// Bytes sent and received so far on each established TCP connection whose local port is
/// `port`, keyed by the peer's address (`ss`'s TCP info, read on the broker's side).
fn traffic_at(port: u16) -> BTreeMap<String, u64> {
    let out = Command::new("ss")
        .args([
            "-tinH",
            "state",
            "established",
            "sport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("ss (iproute2) runs");
    assert!(out.status.success(), "ss failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut conns = BTreeMap::new();
    let mut peer = None;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            peer = line.split_whitespace().last().map(str::to_string);
            continue;
        }
        let count = |field: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(field))
                .map_or(0, |v| v.parse().unwrap())
        };
        if let Some(p) = peer.take() {
            conns.insert(p, count("bytes_sent:") + count("bytes_received:"));
        }
    }
    conns
}

#[test]
fn followers_fetch_all_partitions_of_a_leader_on_one_connection_and_idle_ones_cost_nothing() {
    const PARTITIONS: i32 = 40;
    let c = Cluster::start(3, "", &[]);
    let addr = c.addr(1);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let replicas: Vec<&[i32]> = vec![&[1, 2, 3]; PARTITIONS as usize];
    assert_eq!(
        common::client::create_topic_assigned(&addr, "t", 0, 0, &replicas, &[]),
        0
    );
    c.wait_for(
        "every partition led by 1 with all three in sync",
        Duration::from_secs(30),
        |c| {
            (0..PARTITIONS).all(|p| {
                c.partition_state("t", p)
                    .is_some_and(|(l, _, isr)| l == 1 && isr.len() == 3)
            })
        },
    );
    // acks=all: each record is acknowledged once both followers have fetched it.
    for p in 0..PARTITIONS {
        assert_eq!(
            produce(&addr, "t", p, &[p as i64], -1, Duration::from_secs(10)),
            Ok(0),
            "partition {p}"
        );
    }
    std::thread::sleep(Duration::from_secs(1));

    let before = traffic_at(port);
    assert!(
        before.len() <= 4,
        "two followers of {PARTITIONS} partitions should hold one connection each to their \
         leader, found {}: {before:?}",
        before.len()
    );
    std::thread::sleep(Duration::from_secs(3));
    let after = traffic_at(port);
    let idle: u64 = after
        .iter()
        .filter_map(|(peer, bytes)| Some(bytes - before.get(peer)?))
        .sum();
    // Without a session each follower's request would name all 40 partitions and each answer
    // carry all 40, four times a second: by the field sizes, over 100 KB in these 3 s (an
    // estimate, not measured). With one, an idle round trip is its headers alone (1.8 KB measured
    // for both followers).
    assert!(
        idle < 20_000,
        "{idle} bytes in 3 s of idle replication of {PARTITIONS} partitions: {before:?} -> {after:?}"
    );
    for p in [0, PARTITIONS - 1] {
        assert_eq!(
            c.partition_state("t", p).map(|(_, _, isr)| isr.len()),
            Some(3),
            "partition {p} stays in sync while idle"
        );
    }
}
