//! A log's and a broker's life cycle against real broker processes: retention deleting old
//! segments, DeleteRecords moving the log start on every replica, consumers from a deleted
//! offset moved to the new start (kcat and a Kafka-protocol client).

mod common;

use std::time::Duration;

use common::{client, kcat, BrokerProc, Cluster};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    BrokerId, DeleteRecordsRequest, FetchRequest, ListOffsetsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tidemark_broker::replica::client::KafkaConnection;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_string()))
}

async fn connect(addr: &str) -> KafkaConnection {
    KafkaConnection::connect(addr, Duration::from_secs(15), "test")
        .await
        .unwrap()
}

/// ListOffsets earliest (-2) or latest (-1) of partition 0 as a consumer asks it.
fn list_offset(addr: &str, topic: &str, timestamp: i64) -> i64 {
    try_list_offset(addr, topic, timestamp)
        .unwrap_or_else(|code| panic!("ListOffsets {timestamp}: error {code}"))
}

fn try_list_offset(addr: &str, topic: &str, timestamp: i64) -> Result<i64, i16> {
    rt().block_on(async {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(name(topic))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(timestamp)])]);
        let resp = connect(addr).await.call(7, &req).await.unwrap();
        let p = &resp.topics[0].partitions[0];
        if p.error_code == 0 {
            Ok(p.offset)
        } else {
            Err(p.error_code)
        }
    })
}

/// A consumer's fetch of partition 0 at `offset`: (error code, log start offset).
fn fetch_at(addr: &str, topic: &str, offset: i64) -> (i16, i64) {
    rt().block_on(async {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(offset)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(1 << 20)])]);
        let resp = connect(addr).await.call(11, &req).await.unwrap();
        let p = &resp.responses[0].partitions[0];
        (p.error_code, p.log_start_offset)
    })
}

/// DeleteRecords before `offset` in partition 0: (error code, low watermark).
fn delete_records(addr: &str, topic: &str, offset: i64) -> (i16, i64) {
    rt().block_on(async {
        let req = DeleteRecordsRequest::default()
            .with_timeout_ms(15_000)
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(name(topic))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(offset)])]);
        let resp = connect(addr).await.call(2, &req).await.unwrap();
        let p = &resp.topics[0].partitions[0];
        (p.error_code, p.low_watermark)
    })
}

/// kcat consuming partition 0 from offset 0 with `auto.offset.reset=earliest`, to the end:
/// the offsets it printed.
fn kcat_offsets_from_zero(addr: &str, topic: &str) -> Vec<i64> {
    let out = kcat(
        &[
            "-b",
            addr,
            "-C",
            "-t",
            topic,
            "-p",
            "0",
            "-o",
            "0",
            "-X",
            "auto.offset.reset=earliest",
            "-e",
            "-q",
            "-f",
            "%o\n",
        ],
        b"",
    );
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// The segment files of a replica directory: (base offset, size), oldest first.
fn segments(dir: &std::path::Path) -> Vec<(i64, u64)> {
    let mut out: Vec<(i64, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let base = e
                .file_name()
                .to_string_lossy()
                .strip_suffix(".log")?
                .parse()
                .ok()?;
            Some((base, e.metadata().ok()?.len()))
        })
        .collect();
    out.sort_unstable();
    out
}

fn wait_until(what: &str, within: Duration, log: impl Fn() -> String, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}\n{}", log());
}

#[test]
fn size_retention_deletes_old_segments_and_consumers_from_the_old_start_get_the_new_one() {
    let mut b = BrokerProc::start(&["--override", "log.retention.check.interval.ms=200"]);
    let addr = b.bootstrap();
    assert_eq!(
        client::create_topic(
            &addr,
            "shrinking",
            1,
            1,
            &[
                ("segment.bytes", "4096"),
                ("retention.bytes", "12000"),
                ("retention.ms", "-1")
            ]
        ),
        0
    );
    // 40 batches of 20 records of ~40 bytes: ~800 bytes a batch, five batches a segment.
    for i in 0..40 {
        let values: Vec<i64> = (0..20).map(|j| 1_000_000_000_000 + i * 20 + j).collect();
        client::produce(&addr, "shrinking", 0, &values, -1, Duration::from_secs(10)).unwrap();
    }
    let part_dir = b.data_dir().join("shrinking-0");
    // Retention ran to its fixed point: deleting the oldest segment left would go below
    // retention.bytes, and what is left is at least retention.bytes.
    wait_until(
        "retention to delete what it may",
        Duration::from_secs(30),
        || b.log(),
        || {
            let sizes: Vec<u64> = segments(&part_dir).iter().map(|s| s.1).collect();
            let total: u64 = sizes.iter().sum();
            total >= 12_000 && total - sizes[0] < 12_000 && sizes.len() > 1
        },
    );
    let start = list_offset(&addr, "shrinking", -2);
    let end = list_offset(&addr, "shrinking", -1);
    assert_eq!(end, 800, "retention never touches the end");
    assert_eq!(
        start,
        segments(&part_dir)[0].0,
        "the start is the first segment left"
    );
    assert!(start > 0);
    assert!(
        b.log().contains("retention deleted segments"),
        "{}",
        b.log()
    );

    // A consumer at the old start is told the offset is gone and where the log starts now.
    assert_eq!(fetch_at(&addr, "shrinking", 0), (1, start));
    assert_eq!(fetch_at(&addr, "shrinking", start).0, 0);
    // kcat from offset 0 resets to the earliest offset and reads from the new start to the end.
    let offsets = kcat_offsets_from_zero(&addr, "shrinking");
    assert_eq!(offsets.first(), Some(&start));
    assert_eq!(offsets, (start..800).collect::<Vec<_>>());

    // The new start survives a restart (segments are gone; nothing to rebuild from).
    b.terminate();
    b.restart();
    // The restarted broker answers NOT_LEADER_OR_FOLLOWER until it has acted on its metadata.
    wait_until(
        "the restarted broker to answer ListOffsets",
        Duration::from_secs(15),
        || b.log(),
        || try_list_offset(&addr, "shrinking", -2).is_ok(),
    );
    assert_eq!(list_offset(&addr, "shrinking", -2), start);
}

#[test]
fn time_retention_deletes_segments_whose_newest_record_expired() {
    let b = BrokerProc::start(&[
        "--override",
        "log.retention.check.interval.ms=200",
        "--override",
        "log.segment.bytes=4096",
    ]);
    let addr = b.bootstrap();
    assert_eq!(
        client::create_topic(&addr, "aging", 1, 1, &[("retention.ms", "1500")]),
        0
    );
    for i in 0..20 {
        let values: Vec<i64> = (0..20).map(|j| 1_000_000_000_000 + i * 20 + j).collect();
        client::produce(&addr, "aging", 0, &values, 1, Duration::from_secs(10)).unwrap();
    }
    // Every closed segment expires; the active one stays however old it is.
    wait_until(
        "time retention to leave the active segment only",
        Duration::from_secs(30),
        || b.log(),
        || segments(&b.data_dir().join("aging-0")).len() == 1,
    );
    let start = list_offset(&addr, "aging", -2);
    assert!(start > 0 && start < 400, "start {start}");
    let (records, hw) = {
        let mut from = start;
        let mut all = Vec::new();
        loop {
            let out = rt().block_on(async {
                let req = FetchRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_max_bytes(1 << 20)
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(name("aging"))
                        .with_partitions(vec![FetchPartition::default()
                            .with_partition(0)
                            .with_fetch_offset(from)
                            .with_partition_max_bytes(1 << 20)])]);
                connect(&addr).await.call(11, &req).await.unwrap()
            });
            let p = &out.responses[0].partitions[0];
            assert_eq!(p.error_code, 0);
            let bytes = p.records.clone().unwrap_or_default();
            if bytes.is_empty() {
                break (all, p.high_watermark);
            }
            for (o, _, _) in tidemark_broker::log::testing::values(&bytes) {
                all.push(o);
                from = o + 1;
            }
        }
    };
    assert_eq!(hw, 400);
    assert_eq!(records, (start..400).collect::<Vec<_>>());
}

#[test]
fn delete_records_moves_the_log_start_on_every_replica_and_survives_a_crash() {
    let mut c = Cluster::start(3, "", &[]);
    let addr = c.addr(1);
    assert_eq!(
        client::create_topic_assigned(&addr, "trimmed", 1, 3, &[&[1, 2, 3]], &[]),
        0
    );
    c.wait_for(
        "node 1 leads with a full ISR",
        Duration::from_secs(30),
        |c| {
            c.partition_state("trimmed", 0)
                .is_some_and(|(l, _, isr)| l == 1 && isr.len() == 3)
        },
    );
    for i in 0..100 {
        client::produce(&addr, "trimmed", 0, &[i], -1, Duration::from_secs(10)).unwrap();
    }
    // Past the high watermark is refused and changes nothing.
    assert_eq!(delete_records(&addr, "trimmed", 101), (1, -1));
    // The answer comes once every ISR replica has moved its start (the low watermark).
    assert_eq!(delete_records(&addr, "trimmed", 37), (0, 37));
    assert_eq!(list_offset(&addr, "trimmed", -2), 37);
    assert_eq!(fetch_at(&addr, "trimmed", 36), (1, 37));
    assert_eq!(kcat_offsets_from_zero(&addr, "trimmed")[0], 37);
    // Asking for less than the start changes nothing; -1 means the high watermark.
    assert_eq!(delete_records(&addr, "trimmed", 10), (0, 37));
    c.wait_for(
        "every replica checkpointed start 37",
        Duration::from_secs(30),
        |c| {
            (1..=3).all(|id| {
                c.dump(id)
                    .iter()
                    .any(|r| r["topic"] == "trimmed" && r["log_start_offset"] == 37)
            })
        },
    );
    for id in 1..=3 {
        let r = c
            .dump(id)
            .into_iter()
            .find(|r| r["topic"] == "trimmed")
            .unwrap();
        let first = &r["records"].as_array().unwrap()[0];
        assert_eq!(
            first[0], 37,
            "node {id}: records below the start are not dumped"
        );
    }
    // kill -9 of every node: the checkpointed start comes back with each.
    for id in 1..=3 {
        c.node(id).kill9();
    }
    for id in 1..=3 {
        c.node(id).restart();
    }
    c.wait_for("the partition led again", Duration::from_secs(60), |c| {
        c.partition_state("trimmed", 0)
            .is_some_and(|(l, _, _)| l > 0 && try_list_offset(&c.addr(l), "trimmed", -2).is_ok())
    });
    let leader = c.partition_state("trimmed", 0).unwrap().0;
    assert_eq!(list_offset(&c.addr(leader), "trimmed", -2), 37);
    assert_eq!(delete_records(&c.addr(leader), "trimmed", -1), (0, 100));
    assert_eq!(list_offset(&c.addr(leader), "trimmed", -2), 100);
}

/// Acknowledgement times of one partition's acks=all producer.
type Acks = Vec<std::time::Instant>;

/// Produces acks=all batches to partition `partition` of `topic` until `stop`, finding the
/// leader through Metadata from any of `addrs` after every failure; returns when each
/// acknowledgement came.
async fn produce_until(
    addrs: Vec<String>,
    topic: &str,
    partition: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Acks {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::ProduceRequest;
    let mut acks = Vec::new();
    let mut conn: Option<KafkaConnection> = None;
    let mut value = 0i64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let Some(c) = conn.as_mut() else {
            for addr in &addrs {
                let Ok(d) = tidemark_broker::admin::describe(addr, Some(topic)).await else {
                    continue;
                };
                let leader = d["partitions"]
                    .as_array()
                    .and_then(|ps| ps.iter().find(|p| p["partition"] == partition))
                    .and_then(|p| p["leader"].as_i64())
                    .unwrap_or(-1);
                if leader > 0 {
                    let to = &addrs[leader as usize - 1];
                    conn = KafkaConnection::connect(to, Duration::from_secs(2), "load")
                        .await
                        .ok();
                    break;
                }
            }
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        };
        value += 1;
        let v = value.to_string();
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(5_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(name(topic))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(
                        tidemark_broker::log::testing::batch(&[v.as_bytes()]).into(),
                    ))])]);
        match c.call_with_timeout(9, &req, Duration::from_secs(6)).await {
            Ok(resp) if resp.responses[0].partition_responses[0].error_code == 0 => {
                acks.push(std::time::Instant::now())
            }
            _ => {
                conn = None;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    acks
}

/// The longest time without an acknowledgement that overlaps `[from, to]`.
fn longest_gap(
    acks: &[std::time::Instant],
    from: std::time::Instant,
    to: std::time::Instant,
) -> Duration {
    let mut times: Vec<std::time::Instant> = acks.to_vec();
    times.push(to);
    times.sort_unstable();
    let mut prev = acks
        .iter()
        .filter(|t| **t <= from)
        .max()
        .copied()
        .unwrap_or(from);
    let mut longest = Duration::ZERO;
    for t in times.into_iter().filter(|t| *t > from && *t <= to) {
        longest = longest.max(t - prev);
        prev = t;
    }
    longest
}

#[test]
fn rolling_sigterm_restart_under_acks_all_load_keeps_acknowledging() {
    let mut c = Cluster::start(3, "min.insync.replicas=2\n", &[]);
    let addrs: Vec<String> = (1..=3).map(|id| c.addr(id)).collect();
    let assignments: [&[i32]; 3] = [&[1, 2, 3], &[2, 3, 1], &[3, 1, 2]];
    assert_eq!(
        client::create_topic_assigned(&addrs[0], "rolling", 3, 3, &assignments, &[]),
        0
    );
    let full_isr = |c: &Cluster| {
        (0..3).all(|p| {
            c.partition_state("rolling", p)
                .is_some_and(|(l, _, isr)| l > 0 && isr.len() == 3)
        })
    };
    c.wait_for(
        "every partition led with a full ISR",
        Duration::from_secs(30),
        full_isr,
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (addrs, stop) = (addrs.clone(), stop.clone());
        std::thread::spawn(move || {
            rt().block_on(async {
                let tasks: Vec<_> = (0..3)
                    .map(|p| {
                        let (addrs, stop) = (addrs.clone(), stop.clone());
                        tokio::spawn(async move { produce_until(addrs, "rolling", p, stop).await })
                    })
                    .collect();
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.unwrap());
                }
                out
            })
        })
    };
    // Load flows before the first restart.
    std::thread::sleep(Duration::from_secs(2));
    let mut windows = Vec::new();
    for id in 1..=3 {
        let from = std::time::Instant::now();
        c.node(id).terminate();
        let stopped = from.elapsed();
        c.node(id).restart();
        c.wait_for(
            "the restarted broker back in every ISR",
            Duration::from_secs(60),
            full_isr,
        );
        std::thread::sleep(Duration::from_millis(500));
        windows.push((id, from, std::time::Instant::now(), stopped));
        assert!(
            c.node(id)
                .log()
                .contains("controlled shutdown: leaderships moved off this broker"),
            "node {id} did not shut down under control\n{}",
            c.node(id).log()
        );
    }
    // Side by side, a crash: kill -9 of partition 0's leader is noticed only by the session
    // timeout (2 s here), and its partitions wait for it.
    let crashed = c.partition_state("rolling", 0).unwrap().0;
    let crash_from = std::time::Instant::now();
    c.node(crashed).kill9();
    c.wait_for("partition 0 led elsewhere", Duration::from_secs(30), |c| {
        c.partition_state("rolling", 0)
            .is_some_and(|(l, _, _)| l > 0 && l != crashed)
    });
    std::thread::sleep(Duration::from_secs(1));
    let crash_to = std::time::Instant::now();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let acks = load.join().unwrap();
    let crash_gap = longest_gap(&acks[0], crash_from, crash_to);
    eprintln!("kill -9 of broker {crashed}: longest gap without an acknowledgement on partition 0 {crash_gap:?}");
    assert!(
        crash_gap > Duration::from_millis(1500),
        "a crash cannot hand leadership over: {crash_gap:?}"
    );
    for (id, from, to, stopped) in windows {
        let gaps: Vec<Duration> = acks.iter().map(|a| longest_gap(a, from, to)).collect();
        let worst = gaps.iter().max().copied().unwrap();
        eprintln!(
            "broker {id}: SIGTERM to exit {stopped:?}; longest gap without an acknowledgement per partition {gaps:?}"
        );
        // Without controlled shutdown this is the session timeout and more (8-11 s).
        assert!(
            worst < Duration::from_secs(2),
            "broker {id}: a partition went {worst:?} without an acknowledgement"
        );
    }
    assert!(
        acks.iter().all(|a| a.len() > 100),
        "too little load: {:?}",
        acks.iter().map(Vec::len).collect::<Vec<_>>()
    );
}

#[test]
fn leadership_returns_to_the_preferred_replica_and_metadata_names_the_active_controller() {
    let mut c = Cluster::start(3, "leader.imbalance.check.interval.seconds=1\n", &[]);
    let addrs: Vec<String> = (1..=3).map(|id| c.addr(id)).collect();
    let assignments: [&[i32]; 3] = [&[1, 2, 3], &[2, 3, 1], &[3, 1, 2]];
    assert_eq!(
        client::create_topic_assigned(&addrs[0], "preferred", 3, 3, &assignments, &[]),
        0
    );
    let preferred_lead = |c: &Cluster| {
        (0..3).all(|p| {
            c.partition_state("preferred", p)
                .is_some_and(|(l, _, isr)| l == p + 1 && isr.len() == 3)
        })
    };
    c.wait_for(
        "preferred leaders, full ISRs",
        Duration::from_secs(30),
        preferred_lead,
    );
    c.node(1).terminate();
    c.wait_for(
        "partition 0 led by another replica",
        Duration::from_secs(30),
        |c| {
            c.partition_state("preferred", 0)
                .is_some_and(|(l, _, _)| l == 2 || l == 3)
        },
    );
    c.node(1).restart();
    c.wait_for(
        "leadership back on the preferred replicas",
        Duration::from_secs(60),
        preferred_lead,
    );
    assert!(
        c.nodes
            .iter()
            .any(|n| n.log().contains("electing preferred replicas")),
        "no preferred election logged"
    );

    // Every node names the same active controller; once it stops, another one.
    let controller_at = |c: &Cluster, id: i32| {
        c.describe_at(id, None)
            .and_then(|d| d["controller"].as_i64())
            .unwrap_or(-1) as i32
    };
    c.wait_for(
        "every node names one controller",
        Duration::from_secs(30),
        |c| {
            let seen: Vec<i32> = (1..=3).map(|id| controller_at(c, id)).collect();
            seen[0] > 0 && seen.iter().all(|s| *s == seen[0])
        },
    );
    let active = controller_at(&c, 1);
    c.node(active).terminate();
    let others: Vec<i32> = (1..=3).filter(|id| *id != active).collect();
    c.wait_for(
        "the others name the new active controller",
        Duration::from_secs(30),
        |c| {
            let seen: Vec<i32> = others.iter().map(|id| controller_at(c, *id)).collect();
            others.contains(&seen[0]) && seen.iter().all(|s| *s == seen[0])
        },
    );
}
