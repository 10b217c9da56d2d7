//! The deterministic replication scenarios of KIP-101, KIP-279 and KIP-320 (docs/ARCHITECTURE.md), scripted against real broker
//! processes. Each runs on the correct broker and must hold; where an injectable bug targets a
//! scenario, the same script runs with the bug on and must catch it.
//!
//! Clusters have five nodes (all controller voters) and place the scenario's partition on nodes
//! 1–3 (or 1–2), so killing data nodes never costs the controller quorum its majority.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::client::{create_topic_assigned, long_poll, produce, read_all};
use common::Cluster;
use tidemark_broker::errors;

const T: Duration = Duration::from_secs(30);

/// The leader as node 5 sees it: scenarios never stop or pause nodes 4 and 5, so their view is
/// neither missing nor stale.
fn leader(c: &Cluster, topic: &str) -> i32 {
    c.partition_state_at(5, topic, 0).map_or(-1, |(l, _, _)| l)
}

fn values(c: &Cluster, node: i32, topic: &str) -> Vec<i64> {
    read_all(&c.addr(node), topic, 0)
        .map(|(r, _)| r.iter().map(|x| x.1).collect())
        .unwrap_or_default()
}

/// Records below the high watermark of a replica, from its data dir.
fn replica_records(c: &Cluster, node: i32, topic: &str) -> Vec<serde_json::Value> {
    c.dump(node)
        .into_iter()
        .find(|r| r["topic"] == topic)
        .map(|r| r["records"].as_array().unwrap().clone())
        .unwrap_or_default()
}

fn start(extra_props: &str, bug: Option<&str>) -> Cluster {
    let args: Vec<&str> = bug.map(|b| vec!["--inject-bug", b]).unwrap_or_default();
    Cluster::start(5, extra_props, &args)
}

/// R-MINISR: with min.insync.replicas=2, a write after the ISR fell to the leader alone is
/// refused before it is appended, and a write caught by the shrink gets
/// NOT_ENOUGH_REPLICAS_AFTER_APPEND without the high watermark ever covering it.
fn r_minisr(bug: Option<&str>) -> Result<(), String> {
    let mut c = start("", bug);
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            "m",
            1,
            3,
            &[&[1, 2, 3]],
            &[("min.insync.replicas", "2")]
        ),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("m", 0).is_some_and(|s| s.2.len() == 3)
    });
    for i in 0..5 {
        produce(&c.addr(1), "m", 0, &[i], -1, Duration::from_secs(5))
            .map_err(|e| format!("setup write failed: {e}"))?;
    }
    c.node(3).kill9();
    c.wait_for("ISR [1, 2]", T, |c| {
        c.partition_state("m", 0).is_some_and(|s| s.2 == vec![1, 2])
    });
    c.node(2).pause();
    // The shrink waits out the replica lag time (3 s) and, when node 2 led the metadata quorum,
    // the election of another controller: room for both on a loaded machine.
    let after_append = produce(&c.addr(1), "m", 0, &[100], -1, Duration::from_secs(15));
    let (_, hw) = read_all(&c.addr(1), "m", 0).map_err(|e| format!("read failed: {e}"))?;
    let refused = produce(&c.addr(1), "m", 0, &[101], -1, Duration::from_secs(3));
    let leo = c.dump(1).into_iter().find(|r| r["topic"] == "m").unwrap()["log_end_offset"]
        .as_i64()
        .unwrap();
    c.node(2).resume();
    if after_append != Err(20) {
        return Err(format!("write during the ISR shrink: expected NOT_ENOUGH_REPLICAS_AFTER_APPEND (20), got {after_append:?}"));
    }
    if hw != 5 {
        return Err(format!(
            "high watermark moved to {hw} while the ISR was below min.insync.replicas"
        ));
    }
    if refused != Err(19) {
        return Err(format!(
            "write with ISR [1]: expected NOT_ENOUGH_REPLICAS (19), got {refused:?}"
        ));
    }
    if leo != 6 {
        return Err(format!(
            "log end {leo}: the refused write must not be appended (expected 6)"
        ));
    }
    c.wait_for("ISR regrows", T, |c| {
        c.partition_state("m", 0).is_some_and(|s| s.2.len() == 2)
    });
    Ok(())
}

#[test]
fn r_minisr_correct_broker() {
    r_minisr(None).unwrap();
}

#[test]
fn r_minisr_catches_no_strict_min_isr() {
    let err = r_minisr(Some("no-strict-min-isr")).expect_err("the bug must break R-MINISR");
    assert!(
        err.contains("NOT_ENOUGH_REPLICAS_AFTER_APPEND") || err.contains("high watermark"),
        "{err}"
    );
}

/// R-ACK: an acks=all write is acknowledged only once the ISR has it, so losing the leader right
/// after the acknowledgement loses nothing. `Ok` says whether the write was acknowledged.
fn r_ack(bug: Option<&str>) -> Result<bool, String> {
    let mut c = start("", bug);
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            "a",
            1,
            3,
            &[&[1, 2, 3]],
            &[("min.insync.replicas", "2")]
        ),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("a", 0).is_some_and(|s| s.2.len() == 3)
    });
    produce(&c.addr(1), "a", 0, &[1], -1, Duration::from_secs(5))
        .map_err(|e| format!("setup: {e}"))?;
    c.node(2).pause();
    c.node(3).pause();
    // Well before the controller fences the stopped followers (2 s), which would leave no
    // clean leader to elect.
    let acked = produce(&c.addr(1), "a", 0, &[2], -1, Duration::from_millis(700)).is_ok();
    c.node(1).kill9();
    c.node(2).resume();
    c.node(3).resume();
    c.wait_for("a new leader", T, |c| [2, 3].contains(&leader(c, "a")));
    let l = leader(&c, "a");
    let have = values(&c, l, "a");
    if acked && !have.contains(&2) {
        return Err(format!(
            "acknowledged value 2 lost: new leader {l} holds {have:?}"
        ));
    }
    Ok(acked)
}

#[test]
fn r_ack_correct_broker() {
    r_ack(None).unwrap();
}

/// A try can show nothing: on a loaded machine (every scenario's cluster at once on two cores)
/// even the bug's early acknowledgement can come after the 700 ms the write may take, and a
/// follower's fetch already waiting at the leader when it was stopped carries the write to it
/// once it resumes. The scenario runs again then, up to three times.
#[test]
fn r_ack_catches_ack_before_replication() {
    let mut tries = Vec::new();
    for _ in 0..3 {
        match r_ack(Some("ack-before-replication")) {
            Err(err) => {
                assert!(err.contains("lost"), "{err}");
                return;
            }
            Ok(acked) => tries.push(acked),
        }
    }
    panic!("the bug lost no acknowledged write in three tries (acknowledged: {tries:?})");
}

/// once a new leader is elected, requests carrying the old leader epoch are fenced
/// (FENCED_LEADER_EPOCH), and a paused-then-resumed old leader (a zombie) gets no acks=all write
/// acknowledged.
fn r_320(bug: Option<&str>) -> Result<(), String> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut c = start("", bug);
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            "z",
            1,
            3,
            &[&[1, 2, 3]],
            &[("min.insync.replicas", "2")]
        ),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("z", 0).is_some_and(|s| s.2.len() == 3)
    });
    produce(&c.addr(1), "z", 0, &[1, 2, 3], -1, Duration::from_secs(5))
        .map_err(|e| format!("setup: {e}"))?;
    let (_, old_epoch, _) = c.partition_state("z", 0).unwrap();
    c.node(1).pause();
    c.wait_for("a new leader", T, |c| [2, 3].contains(&leader(c, "z")));
    let zombie_write = {
        c.node(1).resume();
        produce(&c.addr(1), "z", 0, &[99], -1, Duration::from_secs(2))
    };
    c.wait_for("a known leader", T, |c| leader(c, "z") > 0);
    let l = leader(&c, "z");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stale_fetch = rt.block_on(async {
        let mut conn = tidemark_broker::replica::client::KafkaConnection::connect(
            &c.addr(l),
            Duration::from_secs(5),
            "t",
        )
        .await
        .unwrap();
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("z")))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(old_epoch)
                    .with_partition_max_bytes(1 << 20)])]);
        conn.call(11, &req).await.unwrap().responses[0].partitions[0].error_code
    });
    if stale_fetch != 74 {
        return Err(format!("fetch with the old leader epoch {old_epoch} got error {stale_fetch}, expected FENCED_LEADER_EPOCH (74)"));
    }
    if zombie_write.is_ok() {
        c.wait_for("replicas settle", T, |c| {
            c.partition_state("z", 0).is_some_and(|s| s.2.len() == 3)
        });
        if !values(&c, leader(&c, "z"), "z").contains(&99) {
            return Err("the zombie leader acknowledged a write that is gone".into());
        }
    }
    Ok(())
}

#[test]
fn r_320_correct_broker() {
    r_320(None).unwrap();
}

#[test]
fn r_320_catches_accept_stale_epoch() {
    let err = r_320(Some("accept-stale-epoch")).expect_err("the bug must serve a stale epoch");
    assert!(err.contains("FENCED_LEADER_EPOCH"), "{err}");
}

/// R-101a (KAFKA-1211, in its leader-change form): followers learn the high watermark one fetch
/// late, so a follower that truncates to its high watermark when it starts following a new
/// leader drops acknowledged records; if it is then elected, they are gone. Truncating by
/// leader epoch keeps them.
fn r_101a(bug: Option<&str>) -> Result<(), String> {
    let mut c = start("broker.session.timeout.ms=4000\n", bug);
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            "k",
            1,
            3,
            &[&[1, 2, 3]],
            &[("min.insync.replicas", "2")]
        ),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("k", 0).is_some_and(|s| s.2.len() == 3)
    });
    let mut acked = Vec::new();
    for i in 0..10 {
        produce(&c.addr(1), "k", 0, &[i], -1, Duration::from_secs(5))
            .map_err(|e| format!("setup: {e}"))?;
        acked.push(i);
    }
    // The followers now hold value 9 but have not yet heard that the high watermark covers it.
    c.node(1).kill9();
    // Pause node 2 late enough that the controller fences node 1 (electing node 2) well before
    // it fences node 2 (electing node 3), so node 3 follows node 2 in between.
    std::thread::sleep(Duration::from_millis(2500));
    c.node(2).pause();
    let deadline = Instant::now() + T;
    while leader(&c, "k") != 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    c.node(2).resume();
    if leader(&c, "k") != 3 {
        return Err(format!(
            "node 3 was not elected (leader {})",
            leader(&c, "k")
        ));
    }
    // The new leader alone is under min.insync.replicas: its high watermark moves only once
    // node 2 has caught up and rejoined the ISR.
    c.wait_for("ISR regrows", T, |c| {
        c.partition_state_at(5, "k", 0)
            .is_some_and(|s| s.2.len() >= 2)
    });
    // Read whichever node leads now: on a loaded machine the controller may move leadership on
    // from node 3 once node 2 is back, and a node that no longer leads answers no records. What
    // node 3 dropped as leader node 2 then truncated too, so the bug is seen either way.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut have: BTreeSet<i64> = BTreeSet::new();
    while Instant::now() < deadline {
        let now = leader(&c, "k");
        if now > 0 {
            have = values(&c, now, "k").into_iter().collect();
            if acked.iter().all(|v| have.contains(v)) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let lost: Vec<i64> = acked
        .iter()
        .filter(|v| !have.contains(v))
        .copied()
        .collect();
    if !lost.is_empty() {
        return Err(format!(
            "acknowledged values lost after the leader changes: {lost:?}"
        ));
    }
    Ok(())
}

#[test]
fn r_101a_correct_broker() {
    r_101a(None).unwrap();
}

#[test]
fn r_101a_catches_hw_truncation() {
    let err = r_101a(Some("hw-truncation"))
        .expect_err("truncating to the HW must lose acknowledged values");
    assert!(err.contains("lost"), "{err}");
}

/// R-101b (KIP-101 scenario 2): both replicas crash; the one that leads next lost its unflushed
/// tail and writes a different record at the same offset in a new epoch; the other comes back
/// with the old record and must truncate by epoch and converge, not keep its divergent record.
#[test]
fn r_101b_replicas_converge_after_multiple_hard_failures() {
    let mut c = start("", None);
    assert_eq!(
        create_topic_assigned(&c.addr(1), "d", 1, 2, &[&[1, 2]], &[]),
        0
    );
    c.wait_for("ISR of 2", T, |c| {
        c.partition_state("d", 0).is_some_and(|s| s.2.len() == 2)
    });
    produce(&c.addr(1), "d", 0, &[1], -1, Duration::from_secs(5)).unwrap();
    produce(&c.addr(1), "d", 0, &[2], -1, Duration::from_secs(5)).unwrap();
    c.node(1).kill9();
    c.wait_for("node 2 leads", T, |c| leader(c, "d") == 2);
    c.node(2).kill9();
    // Power loss on node 2: its copy of value 2 was never flushed.
    let dir = c.nodes[1].data_dir().join("d-0");
    let settings = tidemark_broker::log::LogSettings {
        segment_bytes: 1 << 30,
        flush_interval_messages: u64::MAX,
        max_batch_bytes: u64::MAX,
    };
    let (mut log, _) = tidemark_broker::log::PartitionLog::open(&dir, settings).unwrap();
    log.truncate_to(1).unwrap();
    drop(log);
    c.node(2).restart();
    c.wait_for("node 2 leads a new epoch", T, |c| {
        leader(c, "d") == 2 && c.partition_state("d", 0).is_some_and(|s| s.1 >= 2)
    });
    c.wait_for("node 2 accepts writes", T, |c| {
        produce(&c.addr(2), "d", 0, &[3], 1, Duration::from_secs(2)).is_ok()
    });
    c.node(1).restart();
    c.wait_for("ISR of 2 again", T, |c| {
        c.partition_state("d", 0).is_some_and(|s| s.2.len() == 2)
    });
    c.wait_for("logs converge", T, |c| {
        replica_records(c, 1, "d") == replica_records(c, 2, "d")
    });
    let recs = replica_records(&c, 2, "d");
    assert_eq!(recs[0][1], 1);
    assert_eq!(
        recs[1][1], 3,
        "offset 1 holds the new leader's record: {recs:?}"
    );
}

/// R-279 (KIP-279): three fast leader changes with unclean election on. The returning replica's
/// latest epoch is unknown to the leader, which answers with the end of the largest epoch below
/// it; the replica truncates there and converges instead of keeping a divergent record.
#[test]
fn r_279_logs_converge_after_fast_unclean_failovers() {
    let mut c = start("", None);
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            "f",
            1,
            2,
            &[&[1, 2]],
            &[("unclean.leader.election.enable", "true")]
        ),
        0
    );
    c.wait_for("ISR of 2", T, |c| {
        c.partition_state("f", 0).is_some_and(|s| s.2.len() == 2)
    });
    produce(&c.addr(1), "f", 0, &[1], -1, Duration::from_secs(5)).unwrap();
    // m2 only on node 1: node 2 is down while it is written.
    c.node(2).kill9();
    produce(&c.addr(1), "f", 0, &[2], 1, Duration::from_secs(5)).unwrap();
    c.node(1).kill9();
    c.node(2).restart();
    c.wait_for("node 2 leads", T, |c| leader(c, "f") == 2);
    c.wait_for("m3 written on node 2", T, |c| {
        produce(&c.addr(2), "f", 0, &[3], 1, Duration::from_secs(2)).is_ok()
    });
    c.node(2).kill9();
    c.node(1).restart();
    c.wait_for("node 1 leads again", T, |c| leader(c, "f") == 1);
    c.wait_for("m4 written on node 1", T, |c| {
        produce(&c.addr(1), "f", 0, &[4], 1, Duration::from_secs(2)).is_ok()
    });
    c.node(2).restart();
    c.wait_for("logs converge", T, |c| {
        let (a, b) = (replica_records(c, 1, "f"), replica_records(c, 2, "f"));
        a.len() == 3 && a == b
    });
    let recs: Vec<i64> = replica_records(&c, 1, "f")
        .iter()
        .map(|r| r[1].as_i64().unwrap())
        .collect();
    assert_eq!(recs, vec![1, 2, 4]);
}

/// R-ULE: the leader alone in the ISR takes writes and dies; ElectLeaders UNCLEAN makes a
/// lagging replica leader with ISR = {itself}; exactly the unreplicated writes are lost, and the
/// old leader truncates them when it returns.
#[test]
fn r_ule_unclean_election_loses_exactly_the_unreplicated_writes() {
    let mut c = start("", None);
    assert_eq!(
        create_topic_assigned(&c.addr(1), "u", 1, 3, &[&[1, 2, 3]], &[]),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("u", 0).is_some_and(|s| s.2.len() == 3)
    });
    for i in 0..5 {
        produce(&c.addr(1), "u", 0, &[i], -1, Duration::from_secs(5)).unwrap();
    }
    c.node(2).kill9();
    c.node(3).kill9();
    c.wait_for("ISR [1]", T, |c| {
        c.partition_state("u", 0).is_some_and(|s| s.2 == vec![1])
    });
    for i in 5..10 {
        produce(&c.addr(1), "u", 0, &[i], -1, Duration::from_secs(5)).unwrap();
    }
    c.node(1).kill9();
    c.node(2).restart();
    c.node(3).restart();
    c.wait_for("leaderless", T, |c| leader(c, "u") == -1);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        leader(&c, "u"),
        -1,
        "no clean leader exists and unclean election is off"
    );
    c.elect_unclean(2, "u", 0);
    c.wait_for("the election reaches node 5", T, |c| {
        [2, 3].contains(&leader(c, "u"))
    });
    let (l, _, isr) = c.partition_state_at(5, "u", 0).unwrap();
    assert!([2, 3].contains(&l), "an out-of-ISR replica leads: {l}");
    assert!(
        isr == vec![l as i64] || isr.len() == 2,
        "ISR restarts from the new leader: {isr:?}"
    );
    c.wait_for("new leader serves", T, |c| values(c, l, "u").len() == 5);
    assert_eq!(
        values(&c, l, "u"),
        (0..5).collect::<Vec<_>>(),
        "exactly the five unreplicated writes are lost"
    );
    c.node(1).restart();
    c.wait_for("all three converge", T, |c| {
        let a = replica_records(c, 1, "u");
        a.len() == 5 && (2..=3).all(|n| replica_records(c, n, "u") == a)
    });
}

/// A topic `topic` on nodes 1–3 (leader 1) with min.insync.replicas=2 and its ISR full.
fn three_replicas(c: &Cluster, topic: &str) {
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            topic,
            1,
            3,
            &[&[1, 2, 3]],
            &[("min.insync.replicas", "2")]
        ),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state(topic, 0).is_some_and(|s| s.2.len() == 3)
    });
}

/// R-HWREAD: a consumer reads only below the high watermark (I4), so a record the ISR does not
/// have yet, which a leader change could take back, is never served to it.
fn r_hwread(bug: Option<&str>) -> Result<(), String> {
    let mut c = start("", bug);
    three_replicas(&c, "h");
    produce(&c.addr(1), "h", 0, &[1], -1, Duration::from_secs(5))
        .map_err(|e| format!("setup: {e}"))?;
    c.node(2).pause();
    c.node(3).pause();
    // Appended on the leader alone: the followers cannot fetch it. acks=1 answers once it is
    // appended, so the read below surely finds it there (a short acks=all wait could end on a
    // loaded machine before the request was even sent).
    let appended = produce(&c.addr(1), "h", 0, &[2], 1, Duration::from_secs(5));
    if let Err(e) = appended {
        c.node(2).resume();
        c.node(3).resume();
        return Err(format!("setup: the leader did not append alone: {e}"));
    }
    let read = read_all(&c.addr(1), "h", 0);
    c.node(2).resume();
    c.node(3).resume();
    let (records, hw) = read.map_err(|e| format!("read failed: {e}"))?;
    if let Some((offset, value, _)) = records.iter().find(|r| r.0 >= hw) {
        return Err(format!(
            "a consumer read value {value} at offset {offset}, at or above the high watermark {hw}"
        ));
    }
    Ok(())
}

#[test]
fn r_hwread_correct_broker() {
    r_hwread(None).unwrap();
}

#[test]
fn r_hwread_catches_read_past_high_watermark() {
    let err = r_hwread(Some("read-past-high-watermark")).expect_err("the bug must serve it");
    assert!(err.contains("above the high watermark"), "{err}");
}

/// R-ISRJOIN: a restarted follower rejoins the ISR only once its log reaches the high watermark
/// (Kafka's ISR expansion rule): were it in the ISR while lagging, a clean election could
/// make it leader without committed records. The follower fetches one batch at a time
/// (`replica.fetch.max.bytes=1`), so catching up on the backlog takes many fetches.
fn r_isrjoin(bug: Option<&str>) -> Result<(), String> {
    const BACKLOG: i64 = 2000;
    let mut c = start("replica.fetch.max.bytes=1\n", bug);
    three_replicas(&c, "j");
    c.node(3).kill9();
    c.wait_for("ISR [1, 2]", T, |c| {
        c.partition_state("j", 0).is_some_and(|s| s.2 == vec![1, 2])
    });
    let mut producer = common::client::Producer::new(&c.addr(1));
    for v in 0..BACKLOG {
        producer
            .send("j", 0, v, 1)
            .map_err(|e| format!("backlog write {v}: {e}"))?;
    }
    c.wait_for("the backlog committed", T, |c| {
        read_all(&c.addr(1), "j", 0).is_ok_and(|(_, hw)| hw == BACKLOG)
    });
    c.node(3).restart();
    let deadline = Instant::now() + T;
    loop {
        if c.partition_state_at(5, "j", 0)
            .is_some_and(|s| s.2.contains(&3))
        {
            break;
        }
        if Instant::now() > deadline {
            return Err("node 3 never rejoined the ISR".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // The log only grows from here: if it is short now, it was short when node 3 joined.
    let leo = c.dump(3).into_iter().find(|r| r["topic"] == "j").unwrap()["log_end_offset"]
        .as_i64()
        .unwrap();
    if leo < BACKLOG {
        return Err(format!(
            "node 3 joined the ISR with log end {leo}, below the high watermark {BACKLOG}"
        ));
    }
    Ok(())
}

#[test]
fn r_isrjoin_correct_broker() {
    r_isrjoin(None).unwrap();
}

#[test]
fn r_isrjoin_catches_isr_join_before_caught_up() {
    let err = r_isrjoin(Some("isr-join-before-caught-up")).expect_err("the bug must let it in");
    assert!(err.contains("below the high watermark"), "{err}");
}

/// R-SENT: the leader's high watermark moves on the offsets followers report in their next
/// fetches, not on what it sent them: a write whose only follower is frozen, with the leader's
/// answer to its fetch unread in its socket, is not acknowledged (I3 needs the ISR to hold it).
fn r_sent(bug: Option<&str>) -> Result<(), String> {
    let mut c = start("", bug);
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            "s",
            1,
            2,
            &[&[1, 2]],
            &[("min.insync.replicas", "2")]
        ),
        0
    );
    c.wait_for("ISR of 2", T, |c| {
        c.partition_state("s", 0).is_some_and(|s| s.2.len() == 2)
    });
    produce(&c.addr(1), "s", 0, &[1], -1, Duration::from_secs(5))
        .map_err(|e| format!("setup: {e}"))?;
    // Let the follower park a long-polling fetch at the leader, then freeze it: the leader
    // answers that fetch with the next write, and the answer sits unread in its socket.
    std::thread::sleep(Duration::from_millis(100));
    c.node(2).pause();
    let acked = produce(&c.addr(1), "s", 0, &[2], -1, Duration::from_millis(1500)).is_ok();
    let follower: Vec<i64> = replica_records(&c, 2, "s")
        .iter()
        .filter_map(|r| r[1].as_i64())
        .collect();
    c.node(2).resume();
    if acked && !follower.contains(&2) {
        return Err(format!(
            "value 2 acknowledged while follower 2, in the ISR, held only {follower:?}"
        ));
    }
    Ok(())
}

#[test]
fn r_sent_correct_broker() {
    r_sent(None).unwrap();
}

/// A try can show nothing on a loaded machine, as R-ACK's can (the write's 1.5 s can pass
/// before the bug acknowledges it): the scenario runs again then, up to three times.
#[test]
fn r_sent_catches_hw_from_sent_records() {
    for _ in 0..3 {
        if let Err(err) = r_sent(Some("hw-from-sent-records")) {
            assert!(err.contains("acknowledged"), "{err}");
            return;
        }
    }
    panic!("the bug acknowledged no write its frozen follower lacked, in three tries");
}

/// R-LEADLOSS: an acks=all write still waiting for the ISR when its leader hands leadership
/// over (a controlled shutdown) is answered NOT_LEADER_OR_FOLLOWER, never success: no follower
/// holds it, so the new leader may not have it (I3).
///
/// The handover must come before the paused followers are fenced or leave the ISR (then
/// leadership cannot move and nothing is acknowledged), so their session and lag times outlast
/// the broker's whole controlled shutdown, and the shutdown starts once the write is in the
/// leader's log, not after a guessed delay.
fn r_leadloss(bug: Option<&str>) -> Result<(), String> {
    let mut c = start(
        "broker.session.timeout.ms=12000\nreplica.lag.time.max.ms=12000\n",
        bug,
    );
    three_replicas(&c, "l");
    produce(&c.addr(1), "l", 0, &[1], -1, Duration::from_secs(5))
        .map_err(|e| format!("setup: {e}"))?;
    c.node(2).pause();
    c.node(3).pause();
    let addr = c.addr(1);
    let write =
        std::thread::spawn(move || produce(&addr, "l", 0, &[2], -1, Duration::from_secs(10)));
    c.wait_for("value 2 in the leader's log", T, |c| {
        replica_records(c, 1, "l").iter().any(|r| r[1] == 2)
    });
    // SIGTERM: node 1 moves its leadership to a follower (both still registered) and keeps
    // serving until it leads nothing.
    let pid = c.node(1).pid().expect("node 1 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let answer = write.join().unwrap();
    let held: Vec<bool> = [2, 3]
        .iter()
        .map(|n| replica_records(&c, *n, "l").iter().any(|r| r[1] == 2))
        .collect();
    c.node(2).resume();
    c.node(3).resume();
    c.node(1).wait_exit(T);
    match answer {
        Ok(_) if held == [false, false] => Err(
            "value 2 acknowledged after leadership moved, while neither follower held it".into(),
        ),
        // The shutting-down broker answers what it decided before it closes the connection.
        Err(code) if code != errors::NOT_LEADER_OR_FOLLOWER => Err(format!(
            "value 2 answered {code}, not NOT_LEADER_OR_FOLLOWER"
        )),
        _ => Ok(()),
    }
}

#[test]
fn r_leadloss_correct_broker() {
    r_leadloss(None).unwrap();
}

#[test]
fn r_leadloss_catches_ack_on_leadership_loss() {
    let err = r_leadloss(Some("ack-on-leadership-loss")).expect_err("the bug must ack it");
    assert!(err.contains("acknowledged"), "{err}");
}

/// A consumer long-polling a replica that stops leading is answered at once, as Kafka completes
/// its delayed fetches on a role change: not left waiting out its wait until the stopping broker
/// closes the connection. Here the replica is its partition's only one, so a controlled shutdown
/// leaves the partition without a leader and no follower's fetching wakes the poll instead.
#[test]
fn a_long_poll_on_a_leader_that_stops_leading_is_answered_not_leader() {
    let mut c = start(common::FAST_FAILOVER, None);
    assert_eq!(
        create_topic_assigned(&c.addr(1), "q", 1, 1, &[&[1]], &[]),
        0
    );
    c.wait_for("q led by node 1", T, |c| {
        c.partition_state("q", 0).is_some_and(|s| s.0 == 1)
    });
    let end = produce(&c.addr(1), "q", 0, &[1], -1, Duration::from_secs(5)).unwrap() + 1;
    let addr = c.addr(1);
    let poll = std::thread::spawn(move || long_poll(&addr, "q", 0, end, Duration::from_secs(20)));
    // The poll reaches the broker long before this (a connection and one request).
    std::thread::sleep(Duration::from_secs(1));
    c.node(1).terminate();
    assert_eq!(poll.join().unwrap(), errors::NOT_LEADER_OR_FOLLOWER);
}

/// R-DIR (KIP-858): a replica back with another log directory holds none of the records it
/// had, so it must not lead on the strength of an ISR or last-leader standing its old directory
/// earned. With min.insync.replicas=1 the ISR shrinks to the leader alone (no eligible leader
/// replicas), which then loses its directory: it used to be elected again with an empty log, and
/// the others would have truncated everything to follow it.
#[test]
fn r_dir_a_leader_back_without_its_log_directory_does_not_lead() {
    let mut c = start(
        "broker.session.timeout.ms=2000\nbroker.heartbeat.interval.ms=200\n",
        None,
    );
    assert_eq!(
        create_topic_assigned(
            &c.addr(1),
            "w",
            1,
            3,
            &[&[1, 2, 3]],
            &[("min.insync.replicas", "1")]
        ),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("w", 0).is_some_and(|s| s.2.len() == 3)
    });
    for v in 0..5 {
        produce(&c.addr(1), "w", 0, &[v], -1, Duration::from_secs(5)).unwrap();
    }
    c.node(2).kill9();
    c.node(3).kill9();
    c.wait_for("node 1 alone in the ISR", T, |c| {
        c.partition_state_at(5, "w", 0)
            .is_some_and(|(l, _, isr)| l == 1 && isr == [1])
    });
    for v in 5..10 {
        produce(&c.addr(1), "w", 0, &[v], -1, Duration::from_secs(5)).unwrap();
    }
    // Node 1 loses its log directory (the metadata quorum's log aside, as a wipe keeps it).
    c.node(1).kill9();
    let data = c.node(1).data_dir();
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "__cluster_metadata") {
            continue;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
    c.node(2).restart();
    c.node(3).restart();
    c.node(1).restart();
    c.wait_for("node 1 registered again", T, |c| {
        c.nodes[0]
            .log()
            .matches("registered with the controller")
            .count()
            >= 2
    });
    // Give an election every chance to happen.
    std::thread::sleep(Duration::from_secs(3));
    let (leader, _, isr) = c.partition_state_at(5, "w", 0).unwrap();
    assert_ne!(leader, 1, "node 1 leads with an empty log (isr {isr:?})");
    assert!(
        !isr.contains(&1),
        "node 1 is in the ISR with an empty log: {isr:?}"
    );
    // The replicas that kept their logs did not truncate to an empty leader.
    let kept: Vec<i64> = c.dumped_records(2, "w").iter().map(|r| r.1).collect();
    assert_eq!(kept, (0..5).collect::<Vec<_>>());
}
