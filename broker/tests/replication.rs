//! Replication on real broker processes: a 3-node cluster keeps every acknowledged record while
//! its leader is killed again and again, replicas converge, a full restart keeps topics, epochs
//! and data, a restarted leader does not lead from its own saved state, and dedicated controllers
//! keep electing and fencing while brokers and a controller fail.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::client::{create_topic, create_topic_assigned, produce, read_all, Producer};
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
        .map(|r| {
            r["high_watermark"]
                .as_i64()
                .unwrap_or_else(|| panic!("no high watermark checkpointed: {r}"))
        })
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
    // Registrations after the restart may still move leadership: ask for the leader each time.
    let read = std::cell::RefCell::new(None);
    c.wait_for("data readable", T, |c| {
        let recs = leader_of(c, "keep").and_then(|l| read_all(&c.addr(l), "keep", 0).ok());
        let done = recs.as_ref().is_some_and(|(r, _)| r.len() == 50);
        if done {
            *read.borrow_mut() = recs.map(|(r, _)| r);
        }
        done
    });
    let after = read.into_inner().expect("read above");
    let vals = |r: &[(i64, i64, i32)]| r.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>();
    assert_eq!(vals(&after), vals(&before));
}

/// Writes acks=1 to `addr` from before the broker there starts until `stop`, as fast as it
/// answers. Returns the acknowledged `(value, offset)` pairs and how many produces were answered.
fn produce_from_start(
    addr: String,
    topic: &'static str,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(Vec<(i64, i64)>, usize)> {
    std::thread::spawn(move || {
        let mut p = Producer::new(&addr);
        let (mut acked, mut answered) = (Vec::new(), 0);
        let mut value = 1_000_000;
        while !stop.load(Ordering::SeqCst) {
            match p.send(topic, 0, value, 1) {
                Ok(offset) => {
                    acked.push((value, offset));
                    answered += 1;
                }
                // Not listening yet: try again shortly.
                Err(-100) => std::thread::sleep(Duration::from_millis(2)),
                Err(_) => answered += 1,
            }
            value += 1;
        }
        (acked, answered)
    })
}

/// Writes `value` acks=all to `addr`, which leads the partition or is about to: its replica
/// opens just after the metadata naming it arrives, and until then it answers
/// NOT_LEADER_OR_FOLLOWER. Returns the offset.
fn produce_to_leader(addr: &str, topic: &str, value: i64) -> i64 {
    let deadline = std::time::Instant::now() + T;
    loop {
        match produce(addr, topic, 0, &[value], -1, T) {
            Ok(offset) => return offset,
            Err(6) if std::time::Instant::now() < deadline => {}
            Err(e) => panic!("write of {value} to {addr} failed: error {e}"),
        }
    }
}

/// Flips a byte inside batch `n` of the first segment of a partition directory, so recovery
/// after a crash cuts the log there.
fn corrupt_batch(dir: &Path, n: usize) {
    let path = dir.join("00000000000000000000.log");
    let mut bytes = std::fs::read(&path).unwrap();
    let mut pos = 0;
    for _ in 0..n {
        pos += tidemark_broker::log::batch::parse_header(&bytes[pos..])
            .unwrap()
            .size;
    }
    bytes[pos + 70] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
}

/// Node 1 leads a 3-replica partition holding 40 records and is killed with SIGKILL; `damage`
/// runs on its partition directory; with `await_failover` another node is elected first. Node 1
/// then restarts while an acks=1 producer writes to it from its first moment. It must not lead
/// from its saved state: every write acknowledged anywhere survives, the replicas agree, and the
/// partition ends in a newer leader epoch.
fn restarted_leader_does_not_lead_from_saved_state(
    extra: &[&str],
    await_failover: bool,
    damage: impl FnOnce(&Path),
) {
    let mut c = Cluster::start(3, "", extra);
    assert_eq!(
        create_topic_assigned(&c.addr(1), "s", 1, 3, &[&[1, 2, 3]], &[]),
        0
    );
    c.wait_for("ISR of 3", T, |c| {
        c.partition_state("s", 0)
            .is_some_and(|(l, _, isr)| l == 1 && isr.len() == 3)
    });
    let mut acked: Vec<(i64, i64)> = (0..40)
        .map(|v| (v, produce_to_leader(&c.addr(1), "s", v)))
        .collect();
    c.node(1).kill9();
    damage(&c.nodes[0].data_dir().join("s-0"));
    if await_failover {
        c.wait_for("node 2 or 3 leads in epoch 1", T, |c| {
            c.partition_state_at(2, "s", 0)
                .is_some_and(|(l, e, _)| [2, 3].contains(&l) && e >= 1)
        });
    }
    let log_before = c.node(1).log().len();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = produce_from_start(c.addr(1), "s", stop.clone());
    c.node(1).launch();
    c.wait_for("node 1 knows the new leader", T, |c| {
        c.partition_state_at(1, "s", 0)
            .is_some_and(|(l, e, _)| [2, 3].contains(&l) && e >= 1)
    });
    let (leader, epoch, _) = c.partition_state_at(1, "s", 0).unwrap();
    for v in 40..50 {
        acked.push((v, produce_to_leader(&c.addr(leader), "s", v)));
    }
    stop.store(true, Ordering::SeqCst);
    let (on_restarted, answered) = writer.join().unwrap();
    assert!(answered > 0, "the restarted broker answered no produce");
    acked.extend(on_restarted);
    c.wait_for("ISR of 3 again", T, |c| {
        c.partition_state("s", 0)
            .is_some_and(|(_, _, isr)| isr.len() == 3)
    });
    let (recs, hw) = read_all(&c.addr(leader), "s", 0).unwrap();
    let at: BTreeMap<i64, i64> = recs.iter().map(|r| (r.0, r.1)).collect();
    let lost: Vec<&(i64, i64)> = acked.iter().filter(|(v, o)| at.get(o) != Some(v)).collect();
    assert!(
        lost.is_empty(),
        "acknowledged (value, offset) pairs lost: {lost:?}"
    );
    c.wait_for("followers caught up", T, |c| {
        (1..=3).all(|id| {
            c.dump(id).iter().any(|r| {
                // The high watermark is checkpointed every 500 ms: a dump before the
                // first checkpoint leaves it out.
                r["topic"] == "s"
                    && r["log_end_offset"].as_i64() >= Some(hw)
                    && r["high_watermark"].as_i64().is_some()
            })
        })
    });
    assert_replicas_agree(&c, "s");
    assert!(epoch >= 1, "the partition stayed in epoch {epoch}");
    let after_restart = c.node(1).log()[log_before..].to_string();
    let stale: Vec<&str> = after_restart
        .lines()
        .filter(|l| l.contains("became leader"))
        .collect();
    assert!(
        stale.is_empty(),
        "the restarted broker led from its saved state: {stale:?}"
    );
}

#[test]
fn restarted_leader_is_fenced_until_it_has_caught_up_with_the_controller() {
    restarted_leader_does_not_lead_from_saved_state(&[], true, |_| {});
}

#[test]
fn leader_restarted_within_the_session_with_a_cut_log_does_not_keep_its_epoch() {
    restarted_leader_does_not_lead_from_saved_state(
        &["--override", "broker.session.timeout.ms=60000"],
        false,
        |dir| corrupt_batch(dir, 25),
    );
}

/// Five brokers with `min.insync.replicas=2` and `t` on replicas 1 and 2, led by 1, holding
/// values 0 to `n` - 1 acknowledged by both.
fn two_replicas_acknowledged(n: i64) -> Cluster {
    let c = Cluster::start(5, "min.insync.replicas=2\n", &[]);
    assert_eq!(
        create_topic_assigned(&c.addr(1), "t", 1, 2, &[&[1, 2]], &[]),
        0
    );
    c.wait_for("1 leading with 2 in the ISR", T, |c| {
        c.partition_state_at(3, "t", 0)
            .is_some_and(|(l, _, isr)| l == 1 && isr == [1, 2])
    });
    for v in 0..n {
        assert_eq!(produce(&c.addr(1), "t", 0, &[v], -1, T), Ok(v));
    }
    c
}

/// KIP-966's eligible leader replicas on five real brokers (the quorum survives two of them):
/// `t` has replicas 1 and 2 and `min.insync.replicas=2`. 2 is paused until the ISR drops it,
/// below the minimum, so it stays eligible and writes are refused; then the leader 1 is
/// killed and the ISR empties. Once 2 resumes it leads from the ELR with every acknowledged
/// record; 1, back from its crash, is no longer eligible and follows.
#[test]
fn an_eligible_replica_leads_once_the_isr_is_empty_with_every_acknowledged_record() {
    let mut c = two_replicas_acknowledged(10);
    let state = |c: &Cluster| c.partition_state_at(3, "t", 0);
    c.node(2).pause();
    c.wait_for("the ISR down to 1", T, |c| {
        state(c).is_some_and(|(l, _, isr)| l == 1 && isr == [1])
    });
    // Below the minimum: refused (NOT_ENOUGH_REPLICAS), so 2 misses nothing acknowledged.
    assert_eq!(
        produce(&c.addr(1), "t", 0, &[10], -1, Duration::from_secs(5)),
        Err(19)
    );
    // DescribeTopicPartitions (KIP-966) shows 2 eligible, as admin clients read it.
    let eligible = |c: &Cluster| {
        let d = c.describe_at(3, Some("t"))?;
        let p = &d["partitions"][0];
        Some((p["elr"].clone(), p["last_known_elr"].clone()))
    };
    assert_eq!(
        eligible(&c),
        Some((serde_json::json!([2]), serde_json::json!([])))
    );
    c.node(1).kill9();
    c.wait_for("no leader once 1 is fenced", T, |c| {
        state(c).is_some_and(|(l, _, isr)| l == -1 && isr.is_empty())
    });
    let while_leaderless = eligible(&c).unwrap();
    assert!(
        while_leaderless
            .0
            .as_array()
            .is_some_and(|elr| elr.contains(&serde_json::json!(2))),
        "{while_leaderless:?}"
    );
    c.node(2).resume();
    c.wait_for("2 leading from the ELR", T, |c| {
        state(c).is_some_and(|(l, _, isr)| l == 2 && isr == [2])
    });
    // Its log holds every acknowledged record; alone in the ISR, below the minimum, its high
    // watermark cannot move to cover the last ones yet.
    assert_eq!(
        c.dumped_records(2, "t"),
        (0..10).map(|v| (v, v)).collect::<Vec<_>>()
    );
    // 1 comes back from a crash: it follows, and once in the ISR writes are taken again.
    c.node(1).restart();
    c.wait_for("1 back in the ISR under 2", T, |c| {
        state(c).is_some_and(|(l, _, isr)| l == 2 && isr.len() == 2)
    });
    assert_eq!(produce(&c.addr(2), "t", 0, &[10], -1, T), Ok(10));
    let (records, _) = read_all(&c.addr(2), "t", 0).unwrap();
    assert_eq!(
        records.iter().map(|(o, v, _)| (*o, *v)).collect::<Vec<_>>(),
        (0..11).map(|v| (v, v)).collect::<Vec<_>>()
    );
}

/// KIP-966's last known leader on five real brokers: `t` has replicas 1 and 2 and
/// `min.insync.replicas=2`. 2 is killed until the ISR drops it, then 1; 1's log is cut near
/// offset 20 (a corrupted batch), and both come back from crashes, so neither is eligible any
/// more. The controller elects 1, the last leader, as Kafka's Balanced recovery does, and counts
/// it unclean: 1 records the election with its log end then (which a harness needs to judge the
/// acknowledged records that went with the cut), and 2 follows it down to that end.
#[test]
fn the_last_known_leader_back_with_a_cut_log_records_its_unclean_election() {
    let mut c = two_replicas_acknowledged(30);
    let state = |c: &Cluster| c.partition_state_at(3, "t", 0);
    c.node(2).kill9();
    c.wait_for("the ISR down to 1", T, |c| {
        state(c).is_some_and(|(l, _, isr)| l == 1 && isr == [1])
    });
    c.node(1).kill9();
    c.wait_for("no leader once 1 is fenced", T, |c| {
        state(c).is_some_and(|(l, _, isr)| l == -1 && isr.is_empty())
    });
    let (_, epoch, _) = state(&c).unwrap();
    corrupt_batch(&c.nodes[0].data_dir().join("t-0"), 20);
    c.node(2).restart();
    c.node(1).restart();
    c.wait_for("1 leading again", T, |c| {
        state(c).is_some_and(|(l, e, _)| l == 1 && e > epoch)
    });
    let (_, elected_in, _) = state(&c).unwrap();
    let row = |c: &Cluster, id: i32| c.dump(id).into_iter().find(|r| r["topic"] == "t").unwrap();
    // Recovery cut the log at the damaged batch; nothing was written since.
    let cut = row(&c, 1)["log_end_offset"].as_i64().unwrap();
    assert!((20..30).contains(&cut), "{}", row(&c, 1));
    assert_eq!(
        row(&c, 1)["unclean_elections"],
        serde_json::json!([{"leader_epoch": elected_in, "log_end_offset": cut}]),
        "{}",
        row(&c, 1)
    );
    c.wait_for("2 cut to 1's log", T, |c| {
        row(c, 2)["log_end_offset"].as_i64() == Some(cut)
    });
    assert!(row(&c, 2).get("unclean_elections").is_none());
}

#[test]
fn dedicated_controllers_elect_and_fence_while_brokers_and_a_controller_fail() {
    // Nodes 1-3 are controller voters only, 4-6 brokers only (KRaft's production layout).
    let mut c = Cluster::start_dedicated(3, 3, "");
    let d = c.describe(None).unwrap();
    let brokers: BTreeSet<i64> = d["brokers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        brokers,
        BTreeSet::from([4, 5, 6]),
        "controllers serve no clients: {d}"
    );
    assert!(
        brokers.contains(&d["controller"].as_i64().unwrap()),
        "clients are sent to a broker for controller requests: {d}"
    );
    assert_eq!(
        create_topic(&c.addr(4), "dc", 1, 3, &[("min.insync.replicas", "2")]),
        0
    );
    let isr_of = |c: &Cluster, n: usize| {
        c.partition_state("dc", 0)
            .is_some_and(|(l, _, isr)| l > 0 && isr.len() == n)
    };
    c.wait_for("ISR of 3", T, |c| isr_of(c, 3));
    let mut acked = Vec::new();
    let mut write = |c: &Cluster, v: i64| {
        let leader = leader_of(c, "dc").expect("a leader");
        let r = produce(&c.addr(leader), "dc", 0, &[v], -1, Duration::from_secs(5));
        if r.is_ok() {
            acked.push(v);
        }
        r
    };
    for v in 0..20 {
        write(&c, v).expect("acks=all with every node up");
    }

    // DescribeQuorum, asked of a broker, names the active controller among the voters and the
    // brokers as observers.
    let ids = |v: &serde_json::Value| -> BTreeSet<i64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_i64().unwrap())
            .collect()
    };
    c.wait_for("every broker observing", T, |c| {
        c.describe_quorum()
            .is_some_and(|q| ids(&q["observers"]) == BTreeSet::from([4, 5, 6]))
    });
    let quorum = c.describe_quorum().unwrap();
    assert_eq!(
        ids(&quorum["voters"]),
        BTreeSet::from([1, 2, 3]),
        "{quorum}"
    );
    assert!(quorum["high_watermark"].as_i64() > Some(0), "{quorum}");
    let active = quorum["leader"].as_i64().unwrap() as i32;
    let epoch = quorum["epoch"].as_i64().unwrap();
    assert!((1..=3).contains(&active), "{quorum}");

    // The active controller and then the partition leader die: the two controllers left elect
    // a controller and a new leader among the brokers.
    c.node(active).kill9();
    c.wait_for("another active controller", T, |c| {
        c.describe_quorum().is_some_and(|q| {
            q["leader"].as_i64().is_some_and(|l| l != active as i64)
                && q["epoch"].as_i64() > Some(epoch)
        })
    });
    let first = leader_of(&c, "dc").unwrap();
    c.node(first).kill9();
    c.wait_for("a new leader without the first controller", T, |c| {
        leader_of(c, "dc").is_some_and(|l| l != first) && isr_of(c, 2)
    });
    for v in 20..40 {
        write(&c, v).expect("acks=all with two brokers in sync");
    }

    // Two brokers down: the controllers still have their majority, so the survivor is fenced
    // off from nobody and leads alone, refusing acks=all below min.insync.replicas.
    let second = leader_of(&c, "dc").unwrap();
    let survivor = (4..=6).find(|b| *b != first && *b != second).unwrap();
    c.node(second).kill9();
    c.wait_for("the last broker leads alone", T, |c| {
        c.partition_state("dc", 0)
            .is_some_and(|(l, _, isr)| l == survivor && isr == [survivor as i64])
    });
    assert_eq!(
        write(&c, 40),
        Err(19),
        "NOT_ENOUGH_REPLICAS below min.insync.replicas"
    );

    // Everything comes back; broker-only nodes find the active controller again from nothing.
    c.node(active).restart();
    c.node(first).restart();
    c.node(second).restart();
    c.wait_for("ISR of 3 again", T, |c| isr_of(c, 3));
    for v in 41..50 {
        write(&c, v).expect("acks=all after the restarts");
    }
    let leader = leader_of(&c, "dc").unwrap();
    let (recs, _) = read_all(&c.addr(leader), "dc", 0).unwrap();
    let have: BTreeSet<i64> = recs.iter().map(|r| r.1).collect();
    let lost: Vec<&i64> = acked.iter().filter(|v| !have.contains(v)).collect();
    assert!(lost.is_empty(), "acknowledged records lost: {lost:?}");
    assert_eq!(acked.len(), 49);
}
