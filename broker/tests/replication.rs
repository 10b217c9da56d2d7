//! Replication on real broker processes: a 3-node cluster keeps every acknowledged record while
//! its leader is killed again and again, replicas converge, and a full restart keeps topics,
//! epochs and data.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::client::{create_topic, produce, read_all};
use common::Cluster;

const T: Duration = Duration::from_secs(30);

/// Replica records below the smallest high watermark must be identical on every node.
fn assert_replicas_agree(c: &Cluster, topic: &str) {
    let dumps: Vec<serde_json::Value> = (1..=c.nodes.len() as i32)
        .flat_map(|id| c.dump(id))
        .filter(|r| r["topic"] == topic)
        .collect();
    assert_eq!(
        dumps.len(),
        c.nodes.len(),
        "one replica per node: {dumps:?}"
    );
    let min_hw = dumps
        .iter()
        .map(|r| r["high_watermark"].as_i64().unwrap())
        .min()
        .unwrap();
    let below = |r: &serde_json::Value| -> Vec<serde_json::Value> {
        r["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x[0].as_i64().unwrap() < min_hw)
            .cloned()
            .collect()
    };
    let first = below(&dumps[0]);
    for d in &dumps[1..] {
        assert_eq!(below(d), first, "replicas diverge below HW {min_hw}");
    }
}

fn leader_of(c: &Cluster, topic: &str) -> Option<i32> {
    c.partition_state(topic, 0)
        .map(|(l, _, _)| l)
        .filter(|l| *l > 0)
}

#[test]
fn killing_the_leader_repeatedly_loses_no_acknowledged_record() {
    let mut c = Cluster::start(3, "", &[]);
    assert_eq!(
        create_topic(&c.addr(1), "kl", 1, 3, &[("min.insync.replicas", "2")]),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("kl", 0)
            .is_some_and(|(_, _, isr)| isr.len() == 3)
    });

    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let addrs: Vec<String> = (1..=3).map(|i| c.addr(i)).collect();
    let producer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut next = 0i64;
            let mut target = 0usize;
            while !stop.load(Ordering::SeqCst) {
                match produce(
                    &addrs[target % 3],
                    "kl",
                    0,
                    &[next],
                    -1,
                    Duration::from_secs(3),
                ) {
                    Ok(_) => acked.lock().unwrap().push(next),
                    Err(_) => {
                        target += 1;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                next += 1;
            }
        })
    };
    for round in 0..4 {
        std::thread::sleep(Duration::from_millis(1500));
        let leader = leader_of(&c, "kl").expect("a leader");
        c.node(leader).kill9();
        c.wait_for("a new leader", T, |c| {
            leader_of(c, "kl").is_some_and(|l| l != leader)
        });
        let before = acked.lock().unwrap().len();
        c.node(leader).restart();
        c.wait_for("writes continue", T, |_| {
            acked.lock().unwrap().len() > before
        });
        eprintln!(
            "round {round}: killed {leader}, {} acknowledged so far",
            acked.lock().unwrap().len()
        );
    }
    stop.store(true, Ordering::SeqCst);
    producer.join().unwrap();
    c.wait_for("ISR of 3 again", T, |c| {
        c.partition_state("kl", 0)
            .is_some_and(|(_, _, isr)| isr.len() == 3)
    });
    let leader = leader_of(&c, "kl").unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 20,
        "too few writes acknowledged: {}",
        acked.len()
    );
    c.wait_for("every acknowledged record readable", T, |c| {
        read_all(&c.addr(leader), "kl", 0).is_ok_and(|(recs, _)| {
            let have: BTreeSet<i64> = recs.iter().map(|r| r.1).collect();
            acked.iter().all(|v| have.contains(v))
        })
    });
    let (recs, hw) = read_all(&c.addr(leader), "kl", 0).unwrap();
    let have: BTreeSet<i64> = recs.iter().map(|r| r.1).collect();
    let lost: Vec<i64> = acked
        .iter()
        .filter(|v| !have.contains(v))
        .copied()
        .collect();
    assert!(lost.is_empty(), "acknowledged records lost: {lost:?}");
    let epochs: Vec<i32> = recs.iter().map(|r| r.2).collect();
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1]),
        "epochs go backwards"
    );
    c.wait_for("followers caught up", T, |c| {
        (1..=3).all(|id| {
            c.dump(id)
                .iter()
                .any(|r| r["topic"] == "kl" && r["log_end_offset"].as_i64() >= Some(hw))
        })
    });
    std::thread::sleep(Duration::from_millis(1200));
    assert_replicas_agree(&c, "kl");
}

#[test]
fn restarting_the_whole_cluster_keeps_topics_epochs_and_data() {
    let mut c = Cluster::start(3, "", &[]);
    assert_eq!(create_topic(&c.addr(1), "keep", 2, 3, &[]), 0);
    c.wait_for("leaders", T, |c| leader_of(c, "keep").is_some());
    let leader = leader_of(&c, "keep").unwrap();
    for i in 0..50 {
        produce(&c.addr(leader), "keep", 0, &[i], -1, Duration::from_secs(5)).unwrap();
    }
    let (before, _) = read_all(&c.addr(leader), "keep", 0).unwrap();
    let (_, epoch_before, _) = c.partition_state("keep", 0).unwrap();
    for id in 1..=3 {
        c.node(id).terminate();
    }
    for id in 1..=3 {
        c.node(id).restart();
    }
    c.wait_for("leader after restart", T, |c| {
        leader_of(c, "keep").is_some()
    });
    let d = c.describe(Some("keep")).unwrap();
    assert_eq!(d["partitions"].as_array().unwrap().len(), 2, "{d}");
    let (_, epoch_after, _) = c.partition_state("keep", 0).unwrap();
    assert!(
        epoch_after >= epoch_before,
        "leader epoch went back: {epoch_before} -> {epoch_after}"
    );
    let leader = leader_of(&c, "keep").unwrap();
    c.wait_for("data readable", T, |c| {
        read_all(&c.addr(leader), "keep", 0).is_ok_and(|(r, _)| r.len() == 50)
    });
    let (after, _) = read_all(&c.addr(leader), "keep", 0).unwrap();
    let vals = |r: &[(i64, i64, i32)]| r.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>();
    assert_eq!(vals(&after), vals(&before));
}
