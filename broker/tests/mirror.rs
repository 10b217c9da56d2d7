//! Cluster mirroring (KIP-1279) on real broker processes: two clusters on loopback, each with its
//! own controller quorum, cluster id and ports. The scenarios are KIP-1279's, scripted so
//! every step is reached by polling a condition; each asserts the KIP's outcome on the final
//! logs and epoch caches of both clusters, offset by offset. Where an injectable bug targets a
//! scenario, the same script runs with the bug on and must fail.

mod common;

use std::time::Duration;

use common::client::{
    create_topic, create_topic_assigned, init_producer_id, produce, produce_idempotent, read_all,
};
use common::Cluster;
use serde_json::Value;
use tidemark_broker::mirror::rules::MirrorState;
use tidemark_broker::mirror::wire::{MirrorRequest, MirrorResponse, PartitionDescription};

/// Deadline of every wait. Generous: restarts, fencing and elections on a loaded 2-core machine
/// can take tens of seconds, and a wait ends as soon as its condition holds.
const T: Duration = Duration::from_secs(120);

/// The seed's scenarios number epochs by ones: B's failover epoch is the very epoch A's stale
/// replica wrote in, and a missing bump or a local epoch in the cache shows as two clusters
/// writing one epoch. Proactive bumps would move B's epochs out of those collisions (and hide
/// the bugs the scenarios catch), so these runs turn them off.
const SEED_EPOCHS: &str = "mirror.epoch.bump.threshold=0\n";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn cluster(id: &str, nodes: usize, props: &str, bug: Option<&str>) -> Cluster {
    let args: Vec<&str> = bug.map(|b| vec!["--inject-bug", b]).unwrap_or_default();
    Cluster::start(nodes, &format!("cluster.id={id}\n{props}"), &args)
}

/// Sends a mirror admin request to node `node` of `c`, as `admin mirror` does.
fn admin_at(c: &Cluster, node: i32, req: MirrorRequest) -> MirrorResponse {
    let (v, _) = rt()
        .block_on(tidemark_broker::admin::mirror(&c.addr(node), 94, req))
        .expect("mirror admin call");
    serde_json::from_value(v).unwrap()
}

fn admin(c: &Cluster, req: MirrorRequest) -> MirrorResponse {
    let node = c
        .nodes
        .iter()
        .position(|n| !n.is_stopped())
        .expect("a running node") as i32
        + 1;
    admin_at(c, node, req)
}

fn ok(what: &str, r: &MirrorResponse) -> Result<(), String> {
    if r.error_code != 0 {
        return Err(format!(
            "{what}: error {} {:?}",
            r.error_code, r.error_message
        ));
    }
    if let Some(t) = r.topics.iter().find(|t| t.error_code != 0) {
        return Err(format!(
            "{what}: topic {}: error {} {:?}",
            t.topic, t.error_code, t.error_message
        ));
    }
    Ok(())
}

fn create_mirror(dst: &Cluster, name: &str, src: &Cluster) -> Result<(), String> {
    let r = admin(
        dst,
        MirrorRequest::Create {
            mirror: name.into(),
            source_bootstrap: src.running().join(","),
            configs: Default::default(),
        },
    );
    ok(&format!("create mirror {name}"), &r)
}

fn topics_req(mirror: &str) -> (String, Vec<String>) {
    (mirror.to_string(), vec!["t".to_string()])
}

fn start(dst: &Cluster, mirror: &str) -> Result<(), String> {
    let (mirror, topics) = topics_req(mirror);
    ok(
        "start",
        &admin(dst, MirrorRequest::Start { mirror, topics }),
    )
}

fn stop(dst: &Cluster, mirror: &str) -> Result<(), String> {
    let (mirror, topics) = topics_req(mirror);
    ok("stop", &admin(dst, MirrorRequest::Stop { mirror, topics }))
}

/// Partition 0 of topic `t` as the cluster's describe reports it.
fn describe_t(c: &Cluster) -> Option<PartitionDescription> {
    let r = admin(
        c,
        MirrorRequest::Describe {
            mirror: None,
            lookup: None,
        },
    );
    r.mirrors
        .iter()
        .flat_map(|m| m.topics.iter())
        .filter(|t| t.name == "t")
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition == 0 && p.state != MirrorState::Stopped)
        .or_else(|| {
            r.mirrors
                .iter()
                .flat_map(|m| m.topics.iter())
                .filter(|t| t.name == "t")
                .flat_map(|t| t.partitions.iter())
                .find(|p| p.partition == 0)
        })
        .cloned()
}

/// Polls `cond` for up to `T`; a timeout is the scenario's failure, named by `what`.
fn poll(c: &Cluster, what: &str, cond: impl Fn(&Cluster) -> bool) -> Result<(), String> {
    let deadline = std::time::Instant::now() + T;
    while std::time::Instant::now() < deadline {
        if cond(c) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("timed out: {what}"))
}

fn wait_state(c: &Cluster, what: &str, state: MirrorState) {
    c.wait_for(what, T, |c| describe_t(c).is_some_and(|p| p.state == state));
}

/// Replica of `t`-0 on node `node`, from its data dir.
fn replica(c: &Cluster, node: i32) -> Value {
    c.dump(node)
        .into_iter()
        .find(|r| r["topic"] == "t" && r["partition"] == 0)
        .unwrap_or(Value::Null)
}

/// (records as (offset, value, epoch), epoch cache as (epoch, start)) of a replica.
type Log = (Vec<(i64, i64, i64)>, Vec<(i64, i64)>);

fn log_of(c: &Cluster, node: i32) -> Log {
    let r = replica(c, node);
    let records = r["records"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x[0].as_i64().unwrap(),
                        x[1].as_i64().unwrap_or(-1),
                        x[2].as_i64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let epochs = r["epochs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| (x[0].as_i64().unwrap(), x[1].as_i64().unwrap()))
                .collect()
        })
        .unwrap_or_default();
    (records, epochs)
}

fn leader_epoch(c: &Cluster, node: i32) -> i32 {
    c.partition_state_at(node, "t", 0).map_or(-1, |s| s.1)
}

/// Produces to `t`-0 on the cluster's leader, retrying while the topic is still read-only or
/// leaderless on its way to writable.
fn write(c: &Cluster, values: &[i64]) -> Result<i64, String> {
    let deadline = std::time::Instant::now() + T;
    loop {
        let leader = c.partition_state("t", 0).map_or(-1, |s| s.0);
        let r = if leader > 0 {
            produce(&c.addr(leader), "t", 0, values, -1, Duration::from_secs(5))
        } else {
            Err(-1)
        };
        match r {
            Ok(o) => return Ok(o),
            Err(e) if std::time::Instant::now() > deadline => {
                return Err(format!("write {values:?} kept failing: {e}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// How long two logs may take to agree once the mirror has caught up (an append and its epoch
/// checkpoint are two writes, so a single reading may fall between them).
const CONVERGE: Duration = Duration::from_secs(5);

/// Waits until node 1 of both clusters holds the same records and epoch cache.
fn same_logs(what: &str, a: &Cluster, b: &Cluster) -> Result<(), String> {
    same_logs_at(what, a, 1, b, 1)
}

fn same_logs_at(what: &str, a: &Cluster, na: i32, b: &Cluster, nb: i32) -> Result<(), String> {
    let deadline = std::time::Instant::now() + CONVERGE;
    loop {
        let (la, lb) = (log_of(a, na), log_of(b, nb));
        if la == lb {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{what}: logs differ\n  A: {la:?}\n  B: {lb:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Restarts node 1 (kill -9) and waits until it leads `t` again at a higher epoch.
fn restart_leader(c: &mut Cluster) {
    let before = leader_epoch(c, 1);
    c.node(1).kill9();
    c.node(1).restart();
    // The replica itself (not just the metadata) must lead at the new epoch.
    c.wait_for("a new leader epoch", T, |c| {
        c.partition_state_at(1, "t", 0)
            .is_some_and(|s| s.0 == 1 && s.1 > before)
            && replica(c, 1)["leader_epoch"].as_i64() == Some(leader_epoch(c, 1) as i64)
    });
}

/// The epoch of node 1's last record (its epoch cache is checkpointed just after the append,
/// so a reading may miss it there).
fn latest_log_epoch(c: &Cluster) -> i64 {
    log_of(c, 1).0.last().map_or(-1, |r| r.2)
}

/// S-LMLE-1, then S-LMLE-2 from its end, then S-LMLE-3 from that (KIP-1279's unclean-leader-election page), on
/// single-node clusters A and B.
fn s_lmle(bug: Option<&str>) -> Result<(), String> {
    let mut a = cluster("A", 1, SEED_EPOCHS, None);
    let mut b = cluster("B", 1, SEED_EPOCHS, bug);
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    write(&a, &[0])?;
    write(&a, &[1])?;

    // S-LMLE-1: B mirrors A; A knows no LMLE of B (-1), so B keeps nothing of its own.
    create_mirror(&b, "a-to-b", &a)?;
    start(&b, "a-to-b")?;
    b.wait_for("B mirrors r0, r1", T, |b| log_of(b, 1).0.len() == 2);
    let d = describe_t(&b).unwrap();
    if d.lmle != -1 {
        return Err(format!("first mirror: LMLE {} from A, expected -1", d.lmle));
    }
    // The operator's view through the command line: state, offsets, lag and LMLE.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark-broker"))
        .args([
            "admin",
            "mirror",
            "describe",
            "--bootstrap-server",
            &b.addr(1),
        ])
        .output()
        .unwrap();
    let v: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("describe output: {e}"))?;
    let p = &v["mirrors"][0]["topics"][0]["partitions"][0];
    if !out.status.success()
        || p["state"] != "MIRRORING"
        || p["destination_offset"] != 2
        || p["lmle"] != -1
    {
        return Err(format!("admin mirror describe: {v}"));
    }
    // M2: the mirror topic is read-only.
    match produce(&b.addr(1), "t", 0, &[99], -1, Duration::from_secs(5)) {
        Err(134) => {}
        other => {
            return Err(format!(
                "produce to B's mirror topic: {other:?}, expected READ_ONLY_TOPIC (134)"
            ))
        }
    }
    // S-LOOP: A may not mirror the same topic back from B while B mirrors it from A.
    create_mirror(&a, "b-to-a", &b)?;
    let looped = admin(
        &a,
        MirrorRequest::Start {
            mirror: "b-to-a".into(),
            topics: vec!["t".into()],
        },
    );
    let msg = looped.topics[0].error_message.clone().unwrap_or_default();
    if !msg.contains("Detected mirror loop") {
        return Err(format!("reverse mirror while mirroring: {looped:?}"));
    }
    // A's leadership changes; B copies r2 in A's new epoch and bumps its own epoch to hold it.
    restart_leader(&mut a);
    let ea = leader_epoch(&a, 1);
    write(&a, &[2])?;
    b.wait_for("B mirrors r2", T, |b| log_of(b, 1).0.len() == 3);
    same_logs("S-LMLE-1", &a, &b)?;
    if leader_epoch(&b, 1) < ea {
        return Err(format!("DLE {} < SLE {ea}", leader_epoch(&b, 1)));
    }

    // S-LMLE-2: fail over to B (LMLE = A's epoch, bump above it), write on both, fail back.
    let lmle_b = latest_log_epoch(&b);
    if lmle_b != ea as i64 {
        return Err(format!("B's latest epoch {lmle_b} is not A's {ea}"));
    }
    stop(&b, "a-to-b")?;
    let eb = leader_epoch(&b, 1);
    if eb <= ea {
        return Err(format!(
            "B's epoch after failover {eb} is not above the LMLE {ea}"
        ));
    }
    // The failover barrier (MIRROR_PID_RESET) takes offset 3, the first of B's new epoch.
    let barrier = describe_t(&b).and_then(|d| d.barrier_offset);
    if barrier != Some(3) {
        return Err(format!("B's failover barrier at {barrier:?}, expected 3"));
    }
    let at = write(&b, &[103])?;
    if at != 4 {
        return Err(format!(
            "r3' landed at {at}, expected 4 (after the barrier)"
        ));
    }
    if log_of(&b, 1).0.last().map(|r| r.2) != Some(eb as i64) {
        return Err(format!(
            "r3' not in B's bumped epoch {eb}: {:?}",
            log_of(&b, 1)
        ));
    }
    write(&a, &[3])?;
    start(&a, "b-to-a")?;
    a.wait_for("A fails back: r3 replaced by r3'", T, |a| {
        log_of(a, 1).0.iter().any(|r| r.1 == 103)
    });
    wait_state(&a, "A mirroring", MirrorState::Mirroring);
    if describe_t(&a).unwrap().lmle != ea {
        return Err(format!(
            "A looked up LMLE {}, B stored {ea}",
            describe_t(&a).unwrap().lmle
        ));
    }
    same_logs("S-LMLE-2", &a, &b)?;

    // S-LMLE-3: B's epoch moves on; A copies r@4 but not r@5 (paused); A fails over and
    // writes x@5; B fails back and its r@5 (same epoch as A's LMLE) goes by DivergingEpoch.
    restart_leader(&mut b);
    write(&b, &[104])?;
    a.wait_for("A copies r@4", T, |a| log_of(a, 1).0.len() == 5);
    let eb2 = latest_log_epoch(&a);
    let pause = admin(
        &a,
        MirrorRequest::Pause {
            mirror: "b-to-a".into(),
            topics: vec!["t".into()],
        },
    );
    ok("pause", &pause)?;
    wait_state(&a, "A paused", MirrorState::Paused);
    write(&b, &[105])?;
    stop(&a, "b-to-a")?;
    if leader_epoch(&a, 1) as i64 <= eb2 {
        return Err(format!(
            "A's epoch {} after failover is not above LMLE {eb2}",
            leader_epoch(&a, 1)
        ));
    }
    write(&a, &[205])?;
    start(&b, "a-to-b")?;
    b.wait_for("B fails back: r@5 replaced by x@5", T, |b| {
        log_of(b, 1).0.iter().any(|r| r.1 == 205)
    });
    wait_state(&b, "B mirroring", MirrorState::Mirroring);
    if describe_t(&b).unwrap().lmle as i64 != eb2 {
        return Err(format!(
            "B looked up LMLE {}, A stored {eb2}",
            describe_t(&b).unwrap().lmle
        ));
    }
    let (records, _) = log_of(&b, 1);
    let values: Vec<i64> = records.iter().map(|r| r.1).collect();
    if values != [0, 1, 2, 103, 104, 205] {
        return Err(format!("S-LMLE-3: B holds {values:?}"));
    }
    same_logs("S-LMLE-3", &a, &b)?;

    // B's own leadership changes while it mirrors: its epoch cache must not record B's epoch
    // (M11). Paused, B fetches nothing before its cache is read, so the check sees the cache
    // itself, not what a fetch makes of it; a failover now would store a local epoch as the
    // LMLE.
    pause_or_resume(&b, "a-to-b", true);
    wait_state(&b, "B paused", MirrorState::Paused);
    // Asked again, as a tool whose first answer was lost asks, a pause finds its work done.
    pause_or_resume(&b, "a-to-b", true);
    restart_leader(&mut b);
    let (cache_a, cache_b) = (log_of(&a, 1).1, log_of(&b, 1).1);
    if cache_a != cache_b {
        return Err(format!(
            "M11: B's epoch cache after its restart {cache_b:?}, A's {cache_a:?}"
        ));
    }
    pause_or_resume(&b, "a-to-b", false);
    // A fetch since the restart reports the source's offset.
    poll(&b, "M11: B mirrors again after its restart", |b| {
        describe_t(b).is_some_and(|d| d.source_offset >= 0 && d.lag == 0)
    })?;
    same_logs("M11 after B's restart", &a, &b)?;
    if replica(&b, 1)["cluster_id"] != "B" || replica(&b, 1)["mirror_state"] != "MIRRORING" {
        return Err(format!("dump-log of B: {}", replica(&b, 1)));
    }
    Ok(())
}

/// Produces one idempotent batch to `t`-0 on the cluster's leader, retrying while there is no
/// leader to take it.
fn write_idempotent(c: &Cluster, producer: (i64, i16, i32), values: &[i64]) -> Result<i64, i16> {
    let deadline = std::time::Instant::now() + T;
    loop {
        let leader = c.partition_state("t", 0).map_or(-1, |s| s.0);
        let r = if leader > 0 {
            produce_idempotent(
                &c.addr(leader),
                "t",
                producer,
                values,
                Duration::from_secs(5),
            )
        } else {
            Err(-100)
        };
        match r {
            Err(6 | -100) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            other => return other,
        }
    }
}

/// Both clusters hand out producer ids from the same range, so after a failover the new
/// writer's first idempotent producer has the id of the source's. The failover barrier ends the
/// mirrored producers' state, on append and when the log is loaded again: the local producer
/// starts afresh, neither refused as out of order nor answered as a retry of the source's batch
/// (which acknowledges a write that is never stored).
#[test]
fn a_producer_id_the_source_used_starts_afresh_after_failover() {
    let a = cluster("A", 1, "", None);
    let mut b = cluster("B", 1, "", None);
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    let (code, pid, epoch) = init_producer_id(&a.addr(1), None);
    assert_eq!(code, 0);
    for seq in 0..3 {
        let at = write_idempotent(&a, (pid, epoch, seq), &[10 + i64::from(seq)]);
        assert_eq!(at, Ok(i64::from(seq)));
    }
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors A's three batches", T, |b| {
        log_of(b, 1).0.len() == 3
    });
    stop(&b, "a-to-b").unwrap();
    wait_state(&b, "B stopped", MirrorState::Stopped);
    assert_eq!(describe_t(&b).and_then(|d| d.barrier_offset), Some(3));

    let (code, local_pid, local_epoch) = init_producer_id(&b.addr(1), None);
    assert_eq!(code, 0);
    assert_eq!(
        (local_pid, local_epoch),
        (pid, epoch),
        "the scenario needs B's first producer id to be A's"
    );
    assert_eq!(write_idempotent(&b, (pid, epoch, 0), &[20]), Ok(4));
    assert_eq!(write_idempotent(&b, (pid, epoch, 1), &[21]), Ok(5));
    // Loaded again from the segments (no snapshot after kill -9): a retry of seq 1 is B's own
    // batch, not A's at offset 1, and seq 2 follows.
    b.node(1).kill9();
    b.node(1).restart();
    assert_eq!(write_idempotent(&b, (pid, epoch, 1), &[21]), Ok(5));
    assert_eq!(write_idempotent(&b, (pid, epoch, 2), &[22]), Ok(6));
    let values: Vec<(i64, i64)> = log_of(&b, 1).0.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(
        values,
        [(0, 10), (1, 11), (2, 12), (4, 20), (5, 21), (6, 22)]
    );
}

/// A cluster's first failover creates its LMLE topic. It was created with as many replicas as
/// brokers were alive at that moment: in a harness run a partition had fenced two of three, the
/// topic got one replica, which min.insync.replicas=2 never lets take the acks=all LMLE write,
/// and that cluster could never fail over again. Now it gets a replica on three registered
/// brokers, as Kafka's internal topics do, and a failover with one of them down waits for it.
#[test]
fn a_first_failover_with_a_broker_down_waits_for_it() {
    let a = cluster("A", 1, "", None);
    // Only fencing takes a replica out of an ISR here, so the probe below shows it.
    let mut b = cluster(
        "B",
        3,
        "min.insync.replicas=2\nreplica.lag.time.max.ms=600000\n",
        None,
    );
    // The mirrored topic itself has one replica: its own writes need just that one.
    assert_eq!(
        create_topic(&a.addr(1), "t", 1, 1, &[("min.insync.replicas", "1")]),
        0
    );
    write(&a, &[1]).unwrap();
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    poll(&b, "B mirrors r1", |b| {
        describe_t(b).is_some_and(|d| d.destination_offset == 1)
    })
    .unwrap();
    let host = b.partition_state("t", 0).unwrap().0;
    assert_eq!(create_topic(&b.addr(host), "probe", 1, 3, &[]), 0);
    let down = (1..=3).find(|n| *n != host).unwrap();
    b.node(down).kill9();
    b.wait_for("the stopped broker fenced", T, |b| {
        b.partition_state_at(host, "probe", 0)
            .is_some_and(|s| s.2.len() == 2 && !s.2.contains(&i64::from(down)))
    });
    let addr = b.addr(host);
    let stopper = std::thread::spawn(move || {
        rt().block_on(tidemark_broker::admin::mirror(
            &addr,
            94,
            MirrorRequest::Stop {
                mirror: "a-to-b".into(),
                topics: vec!["t".into()],
            },
        ))
    });
    // The stop gives up (or the admin call times out) while the LMLE topic cannot be created.
    let answer = stopper.join().unwrap().map(|(v, _)| v);
    let refused = answer.as_ref().map_or(true, |v| {
        v["topics"][0]["error_code"] != 0 || v["error_code"] != 0
    });
    assert!(refused, "the stop succeeded with a broker down: {answer:?}");
    assert_ne!(describe_t(&b).map(|d| d.state), Some(MirrorState::Stopped));
    b.node(down).restart();
    wait_state(
        &b,
        "B stopped once its broker is back",
        MirrorState::Stopped,
    );
    b.wait_for("the LMLE topic on all three brokers", T, |b| {
        b.partition_state_at(host, "__mirror_state", 0)
            .is_some_and(|s| s.2.len() == 3)
    });
}

/// A failover of two topics, one of them led by a broker that is down: the other is writable at
/// once, not after the first one's wait runs out. The stop used to wait for each topic in turn,
/// and a harness run's failover left a healthy topic mirroring for the whole 30 s.
#[test]
fn a_topic_that_cannot_stop_does_not_hold_the_others_back() {
    let a = cluster("A", 1, "", None);
    let mut b = cluster("B", 3, "min.insync.replicas=1\n", None);
    for topic in ["t", "u", "w"] {
        assert_eq!(create_topic(&a.addr(1), topic, 1, 1, &[]), 0);
    }
    create_mirror(&b, "a-to-b", &a).unwrap();
    let request = |stop: bool, topics: &[&str]| {
        let (mirror, topics) = (
            "a-to-b".to_string(),
            topics.iter().map(|t| t.to_string()).collect(),
        );
        if stop {
            MirrorRequest::Stop { mirror, topics }
        } else {
            MirrorRequest::Start { mirror, topics }
        }
    };
    let state = |b: &Cluster, topic: &str| {
        admin(
            b,
            MirrorRequest::Describe {
                mirror: None,
                lookup: None,
            },
        )
        .mirrors
        .iter()
        .flat_map(|m| m.topics.iter())
        .filter(|t| t.name == topic)
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.state)
        .next()
    };
    // A first failover, of w, with every broker up, creates the LMLE topic on all three.
    ok("start w", &admin(&b, request(false, &["w"]))).unwrap();
    b.wait_for("w mirroring", T, |b| {
        state(b, "w") == Some(MirrorState::Mirroring)
    });
    ok("stop w", &admin(&b, request(true, &["w"]))).unwrap();
    // t lands on broker 1 (one replica, placed on the first live broker); u, started once
    // broker 1 is down and fenced, on another.
    ok("start t", &admin(&b, request(false, &["t"]))).unwrap();
    b.wait_for("t mirroring on broker 1", T, |b| {
        state(b, "t") == Some(MirrorState::Mirroring)
            && b.partition_state("t", 0).is_some_and(|s| s.0 == 1)
    });
    b.node(1).kill9();
    b.wait_for("broker 1 fenced: t without its leader", T, |b| {
        b.partition_state("t", 0).is_some_and(|s| s.0 != 1)
    });
    ok("start u", &admin(&b, request(false, &["u"]))).unwrap();
    b.wait_for("u mirroring on another broker", T, |b| {
        state(b, "u") == Some(MirrorState::Mirroring)
            && b.partition_state("u", 0).is_some_and(|s| s.0 > 1)
    });
    let addr = b.addr(2);
    let stop = request(true, &["t", "u"]);
    std::thread::spawn(move || rt().block_on(tidemark_broker::admin::mirror(&addr, 94, stop)));
    // Well inside the 30 s a stop waits for t.
    b.wait_for(
        "u stopped while t cannot stop",
        Duration::from_secs(15),
        |b| state(b, "u") == Some(MirrorState::Stopped),
    );
    assert_eq!(state(&b, "t"), Some(MirrorState::Stopping));
}

#[test]
fn s_lmle_correct_broker() {
    s_lmle(None).unwrap();
}

#[test]
fn s_lmle_catches_no_epoch_bump_on_failover() {
    let err = s_lmle(Some("no-epoch-bump-on-failover")).expect_err("the bug must break S-LMLE-2");
    eprintln!("{err}");
    assert!(err.contains("not above the LMLE"), "{err}");
}

#[test]
fn s_lmle_catches_local_epoch_in_mirror_cache() {
    let err = s_lmle(Some("local-epoch-in-mirror-cache")).expect_err("the bug must break M11");
    eprintln!("{err}");
    assert!(err.contains("M11"), "{err}");
}

/// With `local-epoch-in-mirror-cache` and proactive bumps, B's first bump puts B's own epoch
/// in B's cache; A knows no epoch that high, so it answers the next fetch with
/// OFFSET_OUT_OF_RANGE for an offset inside its range. B used to refetch that offset forever,
/// still MIRRORING; now the partition fails, naming the epoch A does not know.
#[test]
fn an_epoch_the_source_does_not_know_fails_the_partition_not_refetched_forever() {
    let a = cluster("A", 1, "", None);
    let b = cluster("B", 1, "", Some("local-epoch-in-mirror-cache"));
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    write(&a, &[0]).unwrap();
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0", T, |b| log_of(b, 1).0.len() == 1);
    b.wait_for("B's proactive bump", T, |b| leader_epoch(b, 1) >= 10);
    b.wait_for("B's partition FAILED", T, |b| {
        describe_t(b).is_some_and(|d| {
            d.state == MirrorState::Failed
                && d.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("the source knows no leader epoch"))
        })
    });
}

/// Which node leads `t`-0, as node 3 of A (never a replica of `t`, never stopped) sees it.
fn a_leader(a: &Cluster) -> i32 {
    a.partition_state_at(3, "t", 0).map_or(-2, |s| s.0)
}

/// S-ULE-1 and S-ULE-2 (KIP-1279's unclean-leader-election page, the KIP page's "Case 1") on a 5-node A (two of them die, the
/// quorum stays) with `t` on nodes 1 and 2, and a 1-node B. A's replica 2 takes records in an epoch B will later own; A's replica 1
/// then leads uncleanly without them, writes in its own epoch, and A fails back from B. Returns
/// the final records of A's leader after replica 1 is gone and replica 2 leads, and B's.
type Records = Vec<(i64, i64, i64)>;

fn s_ule(flag: bool, bug: Option<&str>) -> Result<(Records, Records), String> {
    let (mut a, b) = ule_setup(flag, bug)?;
    // M3 is judged at A's first fetch from B, which follows the LMLE truncation: B answers the
    // log as the truncation left it. Later rounds may repair a missed truncation (a diverging
    // epoch cuts the leader) or fail on it, so waiting to see A mirror would judge them instead.
    if flag {
        // The LMLE truncation waits for every replica, so it waits for replica 2 (S-ULE-2),
        // and A fetches nothing before replica 2, holding r1..r3 above the LMLE, takes part.
        poll(
            &a,
            "A's LMLE truncation waits for replica 2 to join the ISR",
            |a| {
                describe_t(a).is_some_and(|d| {
                    let waits = d
                        .waiting_for
                        .as_deref()
                        .is_some_and(|w| w.contains("NotAllInIsr"));
                    (d.state == MirrorState::Preparing && waits) || fetched(&d)
                })
            },
        )?;
        if describe_t(&a).is_some_and(|d| fetched(&d)) {
            return Err(
                "S-ULE-2 (M3): A fetched from B while replica 2, down, held batches above the LMLE"
                    .into(),
            );
        }
        a.node(2).restart();
    }
    poll(&a, "A's first fetch from B", |a| {
        describe_t(a).is_some_and(|d| fetched(&d))
    })?;
    // S-ULE-1: the LMLE truncation removed r4, written in an epoch above the LMLE.
    same_logs_at("S-ULE-1: A's leader against B", &a, 1, &b, 1)?;
    if !flag {
        a.node(2).restart();
    }
    poll(&a, "replica 2 back in the ISR", |a| {
        a.partition_state_at(3, "t", 0)
            .is_some_and(|s| s.2.len() == 2)
    })?;
    // Later, replica 1 is lost and replica 2 leads.
    a.node(1).kill9();
    poll(&a, "replica 2 leads", |a| {
        a_leader(a) == 2 && replica(a, 2)["role"] == "leader"
    })?;
    Ok((log_of(&a, 2).0, log_of(&b, 1).0))
}

/// Topic `t` on A's nodes 1 and 2 with `configs`; once both are in the ISR, r0 is written and B
/// mirrors it from A (mirror `a-to-b`).
fn t_mirrored_by_b(a: &Cluster, b: &Cluster, configs: &[(&str, &str)]) -> Result<(), String> {
    assert_eq!(
        create_topic_assigned(&a.addr(1), "t", 1, -1, &[&[1, 2]], configs),
        0
    );
    poll(a, "ISR [1, 2]", |a| {
        a.partition_state_at(3, "t", 0)
            .is_some_and(|s| s.2 == vec![1, 2])
    })?;
    write(a, &[0])?;
    create_mirror(b, "a-to-b", a)?;
    start(b, "a-to-b")?;
    poll(b, "B mirrors r0", |b| {
        describe_t(b).is_some_and(|d| d.destination_offset == 1)
    })
}

/// An unclean election of `t`-0 in A: its leader `dead` is killed, `stale` (out of the ISR)
/// comes back, and once `t` is leaderless node 3 (never a replica) elects uncleanly until
/// `stale` leads.
fn unclean_election_in_a(a: &mut Cluster, dead: i32, stale: i32) -> Result<(), String> {
    a.node(dead).kill9();
    a.node(stale).restart();
    poll(a, "t leaderless", |a| a_leader(a) == -1)?;
    poll(a, &format!("an unclean election of replica {stale}"), |a| {
        rt().block_on(tidemark_broker::admin::elect_leaders(
            &a.addr(3),
            "t",
            0,
            true,
        ))
        .is_ok_and(|(_, ok)| ok)
    })?;
    poll(a, &format!("replica {stale} leads"), |a| {
        a_leader(a) == stale && replica(a, stale)["role"] == "leader"
    })
}

/// The common start of the S-ULE scenarios, up to A starting to fail back from B (replica 2 of
/// A is down, holding r1..r3 in the epoch B took at its failover).
fn ule_setup(flag: bool, bug: Option<&str>) -> Result<(Cluster, Cluster), String> {
    let mut a = cluster("A", 5, SEED_EPOCHS, bug);
    let b = cluster("B", 1, SEED_EPOCHS, None);
    let flag_value = if flag { "true" } else { "false" };
    // B mirrors r0, then pauses: it sees nothing of what A does next.
    t_mirrored_by_b(
        &a,
        &b,
        &[("mirror.support.unclean.leader.election", flag_value)],
    )?;
    let pause = admin(
        &b,
        MirrorRequest::Pause {
            mirror: "a-to-b".into(),
            topics: vec!["t".into()],
        },
    );
    ok("pause", &pause)?;
    wait_state(&b, "B paused", MirrorState::Paused);
    // Replica 1 dies; replica 2 leads cleanly and writes r1..r3 in its epoch.
    a.node(1).kill9();
    poll(&a, "replica 2 leads", |a| a_leader(a) == 2)?;
    for v in [1, 2, 3] {
        write(&a, &[v])?;
    }
    // Replica 2 dies; replica 1 comes back stale and is elected uncleanly; it writes r4.
    unclean_election_in_a(&mut a, 2, 1)?;
    write(&a, &[4])?;
    // Failover to B: LMLE 0, B's epoch bumped to 1, the epoch replica 2 wrote r1..r3 in.
    stop(&b, "a-to-b")?;
    write(&b, &[100])?;
    // Failback: A mirrors from B.
    create_mirror(&a, "b-to-a", &b)?;
    start(&a, "b-to-a")?;
    Ok((a, b))
}

/// Whether the destination leader has had an answer to a mirror fetch from the source.
fn fetched(d: &tidemark_broker::mirror::wire::PartitionDescription) -> bool {
    d.source_offset >= 0
}

fn values_of(records: &Records) -> Vec<i64> {
    records.iter().map(|r| r.1).collect()
}

#[test]
fn s_ule_flag_true_converges_after_a_later_election() {
    let (a, b) = s_ule(true, None).unwrap();
    assert_eq!(values_of(&b), [0, 100]);
    assert_eq!(a, b, "A's new leader against B");
}

/// The documented limitation with the flag false: replica 2 never took part in the LMLE
/// truncation and keeps r1 and r2 in the epoch B owns (B's failover barrier at offset 1 and 100
/// at 2); once it leads, A and B differ.
#[test]
fn s_ule_flag_false_shows_the_documented_limitation() {
    let (a, b) = s_ule(false, None).unwrap();
    assert_eq!(values_of(&b), [0, 100]);
    assert_eq!(
        values_of(&a),
        [0, 1, 2],
        "replica 2 kept r1 and r2 where B has its barrier and 100"
    );
    let at_2 = |records: &Records| records.iter().find(|r| r.0 == 2).map(|r| (r.1, r.2));
    let (a2, b2) = (at_2(&a).unwrap(), at_2(&b).unwrap());
    assert_ne!(a2.0, b2.0);
    assert_eq!(a2.1, b2.1, "same epoch, different cluster: undetectable");
}

/// A's first fetch asks B for A's epoch of r4, which B never wrote: the partition fails and
/// keeps r4 (judged then, not after waiting to see A mirror).
#[test]
fn s_ule_catches_skip_lmle_truncation() {
    let err = s_ule(false, Some("skip-lmle-truncation")).expect_err("the bug must break S-ULE-1");
    assert!(err.contains("S-ULE-1"), "{err}");
}

#[test]
fn s_ule_catches_isr_only_lmle_truncation() {
    let err =
        s_ule(true, Some("isr-only-lmle-truncation")).expect_err("the bug must break S-ULE-2");
    assert!(err.contains("S-ULE-2 (M3)"), "{err}");
}

/// All values below the high watermark of `t`-0 on the cluster's leader.
fn committed_values(c: &Cluster) -> Option<Vec<i64>> {
    let leader = c.partition_state("t", 0)?.0;
    if leader < 1 {
        return None;
    }
    common::client::read_all(&c.addr(leader), "t", 0)
        .ok()
        .map(|(r, _)| r.iter().map(|x| x.1).collect())
}

/// Produces `values` to cluster `active` in batches with acks=all, killing (-9) and restarting
/// the partition leader of cluster `victim` halfway; returns the values acknowledged.
fn produce_phase(
    clusters: &mut [Cluster; 2],
    active: usize,
    victim: usize,
    values: &[i64],
) -> Vec<i64> {
    let mut acked = Vec::new();
    let chunks: Vec<&[i64]> = values.chunks(500).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        if i == chunks.len() / 2 {
            let c = &mut clusters[victim];
            let l = c.partition_state("t", 0).map_or(1, |s| s.0.max(1));
            c.node(l).kill9();
            c.node(l).restart();
        }
        if write(&clusters[active], chunk).is_ok() {
            acked.extend_from_slice(chunk);
        }
    }
    acked
}

/// Two 3-node clusters; 100,000 records with acks=all in ten phases, failing over and back
/// five times, with a leader killed (-9) in each phase (two phases on the producing cluster,
/// then two on the mirroring one). Both clusters end identical on every replica (records and
/// epoch caches, from dump-log), and every acknowledged record is there: failover waits for the
/// mirror to catch up, so nothing acknowledged is abandoned (the count is printed).
#[test]
fn failover_and_failback_five_times_with_kills() {
    const PHASES: usize = 10;
    const PER_PHASE: i64 = 10_000;
    let props = "min.insync.replicas=2\n";
    let mut clusters = [cluster("A", 3, props, None), cluster("B", 3, props, None)];
    assert_eq!(create_topic(&clusters[0].addr(1), "t", 1, 3, &[]), 0);
    // The mirror each cluster runs: A's from B, B's from A.
    let names = ["b-to-a", "a-to-b"];
    let mut acked: Vec<i64> = Vec::new();
    let mut abandoned = 0usize;
    for phase in 0..PHASES {
        let (x, y) = (phase % 2, 1 - phase % 2);
        if phase < 2 {
            create_mirror(&clusters[y], names[y], &clusters[x]).unwrap();
        }
        start(&clusters[y], names[y]).unwrap();
        let first = phase as i64 * PER_PHASE;
        let values: Vec<i64> = (first..first + PER_PHASE).collect();
        let victim = if phase % 4 < 2 { x } else { y };
        acked.extend(produce_phase(&mut clusters, x, victim, &values));
        let want = committed_values(&clusters[x]).expect("the active cluster serves");
        clusters[y].wait_for("the mirror catches up", Duration::from_secs(120), |p| {
            committed_values(p).is_some_and(|v| v.len() == want.len())
        });
        let before = committed_values(&clusters[y]).unwrap();
        stop(&clusters[y], names[y]).unwrap();
        abandoned += want.len() - before.len();
    }
    // The last failover made A writable; B mirrors it once more to compare the two.
    start(&clusters[1], names[1]).unwrap();
    let want = committed_values(&clusters[0]).unwrap();
    clusters[1].wait_for(
        "the final mirror catches up",
        Duration::from_secs(120),
        |p| committed_values(p).is_some_and(|v| v == want),
    );
    // A leader records its epoch's start before any record of it; followers learn an epoch from
    // its records. Epochs that hold no record are left out of the comparison.
    let held = |c: &Cluster, n: i32| {
        let (records, epochs) = log_of(c, n);
        let end = records.last().map_or(0, |r| r.0 + 1);
        let epochs: Vec<(i64, i64)> = epochs.into_iter().filter(|e| e.1 < end).collect();
        (records, epochs)
    };
    let reference = held(&clusters[0], 1);
    for (c, name) in clusters.iter().zip(["A", "B"]) {
        for n in 1..=3 {
            c.wait_for(
                &format!("{name} replica {n} identical"),
                Duration::from_secs(60),
                |c| held(c, n) == reference,
            );
        }
    }
    let have: std::collections::BTreeSet<i64> = want.iter().copied().collect();
    let lost: Vec<i64> = acked
        .iter()
        .copied()
        .filter(|v| !have.contains(v))
        .collect();
    eprintln!(
        "acknowledged {}, final log {} records, abandoned at failover {abandoned}, lost {}",
        acked.len(),
        want.len(),
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "acknowledged values lost: {:?}",
        &lost[..lost.len().min(20)]
    );
}

/// Sets a topic config of `t` on the cluster (IncrementalAlterConfigs).
fn set_topic_config(c: &Cluster, key: &str, value: &str) -> Result<(), String> {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::IncrementalAlterConfigsRequest;
    use kafka_protocol::protocol::StrBytes;
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("t"))
            .with_configs(vec![AlterableConfig::default()
                .with_name(StrBytes::from_string(key.to_string()))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_string(value.to_string())))]),
    ]);
    let addr = c.running()[0].clone();
    let resp = rt()
        .block_on(async {
            let mut conn = tidemark_broker::replica::client::KafkaConnection::connect(
                &addr,
                Duration::from_secs(15),
                "test",
            )
            .await?;
            conn.call(1, &req).await
        })
        .map_err(|e| format!("alter config: {e}"))?;
    match resp.responses[0].error_code {
        0 => Ok(()),
        code => Err(format!("alter config {key}={value}: error {code}")),
    }
}

/// After the S-ULE setup with the flag false, A mirrors from B (its first LMLE truncation ran on
/// the ISR only), fails over, and B fails back. Then either (S-ULE-3) an unclean election in A
/// elects replica 2, or (S-ULE-4) the flag is turned on, B fails over again and A fails back a
/// second time before replica 2 leads. Returns A's and B's final records and, for S-ULE-4, the
/// offset of the LMLE truncation run with the flag on.
fn s_ule_3_4(enable_flag: bool) -> Result<(Records, Records, i64), String> {
    let (mut a, b) = ule_setup(false, None)?;
    poll(&a, "A mirroring", |a| {
        describe_t(a).is_some_and(|d| d.state == MirrorState::Mirroring)
    })?;
    same_logs_at("A's leader against B", &a, 1, &b, 1)?;
    stop(&a, "b-to-a")?;
    write(&a, &[200])?;
    start(&b, "a-to-b")?;
    poll(&b, "B mirrors A's write", |b| {
        log_of(b, 1).0.iter().any(|r| r.1 == 200)
    })?;
    if !enable_flag {
        unclean_election_in_a(&mut a, 1, 2)?;
        poll(&b, "B mirrors A's new leader", |b| {
            describe_t(b).is_some_and(|d| d.source_offset >= 0 && d.lag == 0)
        })?;
        return Ok((log_of(&a, 2).0, log_of(&b, 1).0, 0));
    }
    set_topic_config(&a, "mirror.support.unclean.leader.election", "true")?;
    stop(&b, "a-to-b")?;
    let point = write(&b, &[300])?;
    start(&a, "b-to-a")?;
    poll(&a, "A's second LMLE truncation waits for replica 2", |a| {
        describe_t(a).is_some_and(|d| {
            d.state == MirrorState::Preparing
                && d.waiting_for
                    .as_deref()
                    .is_some_and(|w| w.contains("NotAllInIsr"))
        })
    })?;
    a.node(2).restart();
    poll(&a, "A mirrors B's write", |a| {
        log_of(a, 1).0.iter().any(|r| r.1 == 300)
    })?;
    poll(&a, "replica 2 back in the ISR", |a| {
        a.partition_state_at(3, "t", 0)
            .is_some_and(|s| s.2.len() == 2)
    })?;
    a.node(1).kill9();
    poll(&a, "replica 2 leads", |a| {
        a_leader(a) == 2 && replica(a, 2)["role"] == "leader"
    })?;
    Ok((log_of(&a, 2).0, log_of(&b, 1).0, point))
}

/// S-ULE-3 (the KIP page's "Case 2"), flag false: after A failed back and then over again, an
/// unclean election in A makes the replica that missed the LMLE truncation lead; it kept r1 in
/// the epoch B owns, and the clusters differ there (the documented limitation).
#[test]
fn s_ule_3_flag_false_shows_the_documented_limitation() {
    let (a, b, _) = s_ule_3_4(false).unwrap();
    assert_eq!(values_of(&a)[..2], [0, 1], "replica 2 kept r1");
    assert_eq!(values_of(&b)[1], 100, "B keeps its own write at offset 1");
    assert_eq!(
        a[1].2, b[1].2,
        "same epoch, different cluster: undetectable"
    );
}

/// S-ULE-4: the flag turned on mid-flight guarantees only what follows the next LMLE
/// truncation: replica 2 still differs from B before that point and matches it from there on.
#[test]
fn s_ule_4_flag_enabled_mid_flight() {
    let (a, b, point) = s_ule_3_4(true).unwrap();
    let after = |r: &Records| -> Records { r.iter().filter(|x| x.0 >= point).cloned().collect() };
    assert!(!after(&b).is_empty());
    assert_eq!(
        after(&a),
        after(&b),
        "from the flag-on truncation at {point}"
    );
    assert_ne!(
        a[1], b[1],
        "before it, replica 2's r1 survives (the weaker guarantee)"
    );
}

/// KIP-1279, while MIRRORING: with `mirror.support.unclean.leader.election=true` on the
/// destination, a truncation caused by an unclean election in the source (a diverging epoch)
/// holds the partition in ULE_RECOVERY until every destination replica has followed it; then it
/// mirrors again and every replica of B equals A's new leader. The truncation takes back
/// records committed on B, so it runs in a new leader epoch (no high watermark drop under one
/// epoch), which starts past the truncated log's end: the follower must still rejoin.
#[test]
fn ule_in_the_source_while_mirroring_waits_for_every_replica() {
    ule_while_mirroring(None);
}

/// The same with the flag ignored: B mirrors on without waiting for its follower.
#[test]
#[should_panic(expected = "B waits in ULE_RECOVERY")]
fn ule_while_mirroring_catches_isr_only_lmle_truncation() {
    ule_while_mirroring(Some("isr-only-lmle-truncation"));
}

fn ule_while_mirroring(bug: Option<&str>) {
    let mut a = cluster("A", 5, "", None);
    let mut b = cluster("B", 3, "", bug);
    t_mirrored_by_b(&a, &b, &[]).unwrap();
    set_topic_config(&b, "mirror.support.unclean.leader.election", "true").unwrap();
    // A's replica 2 falls out of the ISR; r1 and r2 reach B but not it.
    a.node(2).kill9();
    a.wait_for("A's ISR [1]", T, |a| {
        a.partition_state_at(3, "t", 0)
            .is_some_and(|s| s.2 == vec![1])
    });
    write(&a, &[1]).unwrap();
    write(&a, &[2]).unwrap();
    b.wait_for("B mirrors r1, r2", T, |b| {
        describe_t(b).is_some_and(|d| d.destination_offset == 3)
    });
    // One of B's followers of t goes down.
    let (leader, _, isr) = b.partition_state("t", 0).unwrap();
    let follower = isr
        .iter()
        .map(|r| *r as i32)
        .find(|r| *r != leader)
        .expect("a follower");
    b.node(follower).kill9();
    b.wait_for("B's ISR without the follower", T, |b| {
        b.partition_state("t", 0)
            .is_some_and(|s| s.2 == vec![leader as i64])
    });
    // r1 and r2 are committed on B: its ISR is its leader alone.
    let committed_in = b.partition_state("t", 0).unwrap().1;
    // Unclean election in A: replica 2 (only r0) leads and writes r3'.
    unclean_election_in_a(&mut a, 1, 2).unwrap();
    write(&a, &[30]).unwrap();
    // Decided either way as soon as B shows it: waiting, or mirroring r3' without its follower.
    let waits = |d: &PartitionDescription| {
        d.state == MirrorState::UleRecovery
            && d.waiting_for
                .as_deref()
                .is_some_and(|w| w.contains("NotAllInIsr"))
    };
    let mirrors_on =
        |d: &PartitionDescription| d.state == MirrorState::Mirroring && d.destination_offset == 2;
    b.wait_for("B in ULE_RECOVERY, or mirroring again", T, |b| {
        describe_t(b).is_some_and(|d| waits(&d) || mirrors_on(&d))
    });
    let d = describe_t(&b).unwrap();
    assert!(
        waits(&d),
        "B waits in ULE_RECOVERY for its follower: it mirrors on without it ({d:?})"
    );
    // Nothing is mirrored in ULE_RECOVERY, so no mirrored batch moved B's epoch since.
    assert!(
        b.partition_state("t", 0).unwrap().1 > committed_in,
        "B took back committed r1, r2 still in epoch {committed_in}"
    );
    // The follower comes back past the new epoch's start, truncates to B's log end and must
    // join the ISR there: ULE_RECOVERY waits for it without mirroring anything more.
    b.node(follower).restart();
    b.wait_for("B mirrors again", T, |b| {
        describe_t(b)
            .is_some_and(|d| d.state == MirrorState::Mirroring && d.destination_offset == 2)
    });
    let want: Vec<i64> = log_of(&a, 2).0.iter().map(|r| r.1).collect();
    assert_eq!(want, [0, 30]);
    for n in 1..=3 {
        b.wait_for(&format!("B replica {n} holds A's log"), T, |b| {
            b.dump(n).iter().all(|r| r["topic"] != "t") || log_of(b, n).0 == log_of(&a, 2).0
        });
    }
}

/// KIP-1279's failed-source case: the source topic is deleted while B mirrors it; the
/// partition goes FAILED with RetryAttempt -1 and is not retried, and the operator can still
/// fail over (STOPPED, writable).
#[test]
fn source_topic_deleted_is_a_terminal_failure() {
    use kafka_protocol::messages::DeleteTopicsRequest;
    let a = cluster("A", 1, "", None);
    let b = cluster("B", 1, "", None);
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    write(&a, &[0]).unwrap();
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0", T, |b| log_of(b, 1).0.len() == 1);
    let req = DeleteTopicsRequest::default()
        .with_topic_names(vec![kafka_protocol::messages::TopicName(
            kafka_protocol::protocol::StrBytes::from_static_str("t"),
        )])
        .with_timeout_ms(15_000);
    let resp = rt()
        .block_on(async {
            let mut c = tidemark_broker::replica::client::KafkaConnection::connect(
                &a.addr(1),
                Duration::from_secs(15),
                "test",
            )
            .await?;
            c.call(4, &req).await
        })
        .unwrap();
    assert_eq!(resp.responses[0].error_code, 0);
    b.wait_for("B's partition FAILED for good", T, |b| {
        describe_t(b).is_some_and(|d| d.state == MirrorState::Failed && d.retry_attempt == -1)
    });
    let d = describe_t(&b).unwrap();
    assert!(
        d.last_error
            .as_deref()
            .is_some_and(|e| e.contains("has no partition t-0")),
        "{d:?}"
    );
    stop(&b, "a-to-b").unwrap();
    write(&b, &[1]).unwrap();
}

/// A failback whose LMLE truncation takes back records readers saw committed runs in a new
/// leader epoch: readers under the old one are fenced and check their position (KIP-320)
/// instead of seeing the high watermark drop under the epoch they read in (the harness found it
/// as `hw-regression`). A's epoch is first moved above B's, so no mirrored batch bumps it later.
#[test]
fn a_failback_truncating_committed_records_moves_to_a_new_epoch() {
    let mut a = cluster("A", 1, SEED_EPOCHS, None);
    let b = cluster("B", 1, SEED_EPOCHS, None);
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    write(&a, &[0]).unwrap();
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0", T, |b| log_of(b, 1).0.len() == 1);
    stop(&b, "a-to-b").unwrap();
    write(&b, &[100]).unwrap();
    while leader_epoch(&a, 1) <= leader_epoch(&b, 1) {
        restart_leader(&mut a);
    }
    assert_eq!(write(&a, &[1]).unwrap(), 1, "r1 committed on A at offset 1");
    let written_in = leader_epoch(&a, 1);
    create_mirror(&a, "b-to-a", &b).unwrap();
    start(&a, "b-to-a").unwrap();
    a.wait_for("A fails back: r1 replaced by B's 100", T, |a| {
        log_of(a, 1).0.iter().any(|r| r.1 == 100)
    });
    wait_state(&a, "A mirroring", MirrorState::Mirroring);
    assert_eq!(log_of(&a, 1).0, log_of(&b, 1).0);
    assert!(
        leader_epoch(&a, 1) > written_in,
        "A took back committed r1 still in epoch {written_in}"
    );
}

/// A failback's truncation of committed records that has to wait in the epoch it moved to
/// (with the flag on, for every replica) holds the high watermark at the cut from the start of
/// that epoch: readers in it used to see the old high watermark, which the truncation then took
/// back under the same epoch (the harness found it as `hw-regression` in a correct-broker run).
#[test]
fn a_truncation_waiting_in_its_new_epoch_holds_the_high_watermark_at_the_cut() {
    let mut a = cluster("A", 3, SEED_EPOCHS, None);
    let b = cluster("B", 1, SEED_EPOCHS, None);
    t_mirrored_by_b(
        &a,
        &b,
        &[("mirror.support.unclean.leader.election", "true")],
    )
    .unwrap();
    stop(&b, "a-to-b").unwrap();
    write(&b, &[100]).unwrap();
    // A's leadership moves (a new epoch, above the LMLE 0) and r1 is committed on both replicas.
    a.node(1).kill9();
    poll(&a, "node 2 leads t", |a| a_leader(a) == 2).unwrap();
    a.node(1).restart();
    poll(&a, "ISR [1, 2] again", |a| {
        a.partition_state_at(3, "t", 0)
            .is_some_and(|s| s.2.len() == 2)
    })
    .unwrap();
    assert_eq!(write(&a, &[1]).unwrap(), 1);
    let leader = a_leader(&a);
    let other = if leader == 1 { 2 } else { 1 };
    poll(&a, "r1 committed", |a| {
        read_all(&a.addr(leader), "t", 0).is_ok_and(|(_, hw)| hw == 2)
    })
    .unwrap();
    // The other replica goes: the LMLE truncation (flag on) waits for it, in a new epoch.
    a.node(other).kill9();
    poll(&a, "the other replica out of the ISR", |a| {
        a.partition_state_at(3, "t", 0)
            .is_some_and(|s| s.2 == [i64::from(leader)])
    })
    .unwrap();
    create_mirror(&a, "b-to-a", &b).unwrap();
    start(&a, "b-to-a").unwrap();
    poll(
        &a,
        "A's leader holding the high watermark at the cut, offset 1",
        |a| read_all(&a.addr(leader), "t", 0).is_ok_and(|(_, hw)| hw <= 1),
    )
    .unwrap();
    let d = describe_t(&a).unwrap();
    assert_eq!(d.state, MirrorState::Preparing, "the truncation ran: {d:?}");
    a.node(other).restart();
    wait_state(&a, "A mirroring", MirrorState::Mirroring);
    same_logs_at("after the failback", &a, leader, &b, 1).unwrap();
}

/// The second truncation of a failback, by the diverging epoch the source answers the first
/// fetch with, takes back what A wrote after the failover under the last mirrored epoch itself
/// (the LMLE truncation keeps it: its epoch is not above the LMLE). When that cuts records readers
/// saw committed it too runs in a new leader epoch (the harness found readers of A seeing the
/// high watermark drop under one epoch). A's epoch is first moved above B's, so no mirrored batch
/// bumps it later.
#[test]
fn a_failback_truncating_committed_records_by_diverging_epoch_moves_to_a_new_epoch() {
    let mut a = cluster("A", 1, SEED_EPOCHS, None);
    let b = cluster("B", 1, SEED_EPOCHS, None);
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    write(&a, &[0]).unwrap();
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0", T, |b| log_of(b, 1).0.len() == 1);
    stop(&b, "a-to-b").unwrap();
    write(&b, &[100]).unwrap();
    assert_eq!(write(&a, &[1]).unwrap(), 1, "r1 committed on A at offset 1");
    while leader_epoch(&a, 1) <= leader_epoch(&b, 1) {
        restart_leader(&mut a);
    }
    let before = leader_epoch(&a, 1);
    create_mirror(&a, "b-to-a", &b).unwrap();
    start(&a, "b-to-a").unwrap();
    a.wait_for("A fails back: r1 replaced by B's 100", T, |a| {
        log_of(a, 1).0.iter().any(|r| r.1 == 100)
    });
    wait_state(&a, "A mirroring", MirrorState::Mirroring);
    assert_eq!(log_of(&a, 1).0, log_of(&b, 1).0);
    assert!(
        leader_epoch(&a, 1) > before,
        "A took back committed r1 still in epoch {before}"
    );
}

/// KIP-1279's proactive epoch bump: B mirrors r0 (A's epoch 0) while its own leader epoch is 0,
/// within the threshold of 3, so B moves its leader epoch to 0 + 10 and mirrors on; its epoch
/// cache still holds only A's epoch (M11). With the bump off, B's epoch stays below that.
#[test]
fn proactive_epoch_bump_keeps_the_destination_ahead() {
    for (props, bumps) in [("", true), (SEED_EPOCHS, false)] {
        let a = cluster("A", 1, "", None);
        let b = cluster("B", 1, props, None);
        assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
        write(&a, &[0]).unwrap();
        let source_epoch = leader_epoch(&a, 1);
        create_mirror(&b, "a-to-b", &a).unwrap();
        start(&b, "a-to-b").unwrap();
        b.wait_for("B mirrors r0", T, |b| log_of(b, 1).0.len() == 1);
        // r1 is mirrored in a later round than r0, after any bump r0 asked for.
        write(&a, &[1]).unwrap();
        b.wait_for("B mirrors r1", T, |b| log_of(b, 1).0.len() == 2);
        let (records, epochs) = log_of(&b, 1);
        assert_eq!(records, log_of(&a, 1).0, "props {props:?}");
        assert_eq!(epochs, [(source_epoch as i64, 0)], "only A's epoch (M11)");
        let dle = leader_epoch(&b, 1);
        if bumps {
            b.wait_for("B's epoch bumped to A's + 10", T, |b| {
                leader_epoch(b, 1) >= source_epoch + 10
            });
            assert_eq!(
                describe_t(&b).map(|d| d.state),
                Some(MirrorState::Mirroring)
            );
        } else {
            assert!(dle < source_epoch + 10, "no bump asked, epoch {dle}");
        }
    }
}

/// Pauses or resumes the mirroring of `t`.
fn pause_or_resume(c: &Cluster, mirror: &str, pause: bool) {
    let (mirror, topics) = (mirror.to_string(), vec!["t".to_string()]);
    let req = if pause {
        MirrorRequest::Pause { mirror, topics }
    } else {
        MirrorRequest::Resume { mirror, topics }
    };
    ok("pause or resume", &admin(c, req)).unwrap();
}

/// KIP-1279 on source retention: the source's log start moves past the mirror's position (A's
/// oldest segments go while B is paused, as retention deletes them: files removed with the broker
/// down); B's next fetch is out of range, and B starts over at A's log start, so both logs start
/// at the same offset and hold the same batches at the same offsets.
#[test]
fn source_log_start_past_the_mirror_keeps_offsets_identical() {
    let mut a = cluster("A", 1, "", None);
    let b = cluster("B", 1, "", None);
    // The smallest segments: every batch rolls its own, so any offset can be a segment base.
    assert_eq!(
        create_topic(&a.addr(1), "t", 1, 1, &[("segment.bytes", "14")]),
        0
    );
    for v in 0..2 {
        write(&a, &[v]).unwrap();
    }
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0, r1", T, |b| log_of(b, 1).0.len() == 2);
    pause_or_resume(&b, "a-to-b", true);
    wait_state(&b, "B paused", MirrorState::Paused);
    for v in 2..6 {
        write(&a, &[v]).unwrap();
    }
    a.node(1).terminate();
    let dir = a.node(1).data_dir().join("t-0");
    let mut removed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let base = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse::<i64>().ok());
        if base.is_some_and(|b| b < 4) {
            std::fs::remove_file(&path).unwrap();
            removed += 1;
        }
    }
    assert!(
        removed >= 4,
        "A's segments below offset 4 ({removed} files)"
    );
    a.node(1).restart();
    a.wait_for("A leads t from offset 4", T, |a| {
        replica(a, 1)["role"] == "leader" && log_of(a, 1).0.first().map(|r| r.0) == Some(4)
    });
    pause_or_resume(&b, "a-to-b", false);
    b.wait_for("B starts over at A's log start", T, |b| {
        log_of(b, 1).0 == log_of(&a, 1).0
    });
    let offsets: Vec<i64> = log_of(&b, 1).0.iter().map(|r| r.0).collect();
    assert_eq!(offsets, [4, 5]);
    assert_eq!(
        describe_t(&b).map(|d| d.state),
        Some(MirrorState::Mirroring)
    );
}

/// Deletes topic `t` on the cluster of `addr`.
fn delete_topic_t(addr: &str) {
    use kafka_protocol::messages::DeleteTopicsRequest;
    let req = DeleteTopicsRequest::default()
        .with_topic_names(vec![kafka_protocol::messages::TopicName(
            kafka_protocol::protocol::StrBytes::from_static_str("t"),
        )])
        .with_timeout_ms(15_000);
    let resp = rt()
        .block_on(async {
            let mut c = tidemark_broker::replica::client::KafkaConnection::connect(
                addr,
                Duration::from_secs(15),
                "test",
            )
            .await?;
            c.call(4, &req).await
        })
        .unwrap();
    assert_eq!(resp.responses[0].error_code, 0);
}

/// KIP-1279 mirrors a topic by its id: a source topic deleted and re-created under the same
/// name is another topic. B, paused while A re-creates `t` and writes r9 into it, must not
/// truncate its r0..r2 to the new topic's log or copy r9: its partition goes FAILED for good,
/// naming both ids.
#[test]
fn a_recreated_source_topic_is_not_mirrored_into_the_old_one() {
    let a = cluster("A", 1, "", None);
    let b = cluster("B", 1, "", None);
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    for v in 0..3 {
        write(&a, &[v]).unwrap();
    }
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0..r2", T, |b| log_of(b, 1).0.len() == 3);
    pause_or_resume(&b, "a-to-b", true);
    wait_state(&b, "B paused", MirrorState::Paused);
    let before = log_of(&b, 1).0;
    delete_topic_t(&a.addr(1));
    a.wait_for("A re-creates t", T, |a| {
        create_topic(&a.addr(1), "t", 1, 1, &[]) == 0
    });
    write(&a, &[9]).unwrap();
    pause_or_resume(&b, "a-to-b", false);
    b.wait_for("B's partition FAILED for good", T, |b| {
        describe_t(b).is_some_and(|d| d.state == MirrorState::Failed && d.retry_attempt == -1)
    });
    let d = describe_t(&b).unwrap();
    assert!(
        d.last_error
            .as_deref()
            .is_some_and(|e| e.contains("deleted and re-created")),
        "{d:?}"
    );
    assert_eq!(log_of(&b, 1).0, before, "B's records kept as they were");
}

/// KIP-1279: the destination's log start follows the source's. DeleteRecords on A moves A's
/// log start to 3 while B mirrors (in range of B's log); B's leader raises its own log start to
/// 3 from the fetch answers, and both logs then hold r3..r5 at the same offsets.
#[test]
fn destination_log_start_follows_the_source() {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::DeleteRecordsRequest;
    let a = cluster("A", 1, "", None);
    let b = cluster("B", 1, "", None);
    // One batch per segment, so the log start can move to any offset and delete segments.
    assert_eq!(
        create_topic(&a.addr(1), "t", 1, 1, &[("segment.bytes", "14")]),
        0
    );
    for v in 0..6 {
        write(&a, &[v]).unwrap();
    }
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0..r5", T, |b| log_of(b, 1).0.len() == 6);
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(15_000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(kafka_protocol::messages::TopicName(
                kafka_protocol::protocol::StrBytes::from_static_str("t"),
            ))
            .with_partitions(vec![DeleteRecordsPartition::default()
                .with_partition_index(0)
                .with_offset(3)])]);
    let resp = rt()
        .block_on(async {
            let mut c = tidemark_broker::replica::client::KafkaConnection::connect(
                &a.addr(1),
                Duration::from_secs(15),
                "test",
            )
            .await?;
            c.call(2, &req).await
        })
        .unwrap();
    assert_eq!(resp.topics[0].partitions[0].error_code, 0);
    b.wait_for("B's log start follows A's to 3", T, |b| {
        replica(b, 1)["log_start_offset"] == 3
    });
    let offsets: Vec<i64> = log_of(&b, 1).0.iter().map(|r| r.0).collect();
    assert_eq!(offsets, [3, 4, 5]);
    same_logs("after DeleteRecords on A", &a, &b).unwrap();
    assert_eq!(
        describe_t(&b).map(|d| d.state),
        Some(MirrorState::Mirroring)
    );
}

/// Commits `offset` for group `group` on `t`-0 on the cluster, as an operator does (generation
/// -1, no member): 0 once a node took it, else -1.
fn commit(c: &Cluster, group: &'static str, offset: i64) -> i16 {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        FindCoordinatorRequest, GroupId, OffsetCommitRequest, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)])]);
    rt().block_on(async {
        for n in 1..=c.nodes.len() as i32 {
            let Ok(mut conn) = tidemark_broker::replica::client::KafkaConnection::connect(
                &c.addr(n),
                Duration::from_secs(15),
                "test",
            )
            .await
            else {
                continue;
            };
            // Kafka creates `__consumer_offsets` when a coordinator is first looked for.
            let find = FindCoordinatorRequest::default()
                .with_key(StrBytes::from_static_str(group))
                .with_key_type(0);
            if conn.call(3, &find).await.is_err() {
                continue;
            }
            if let Ok(r) = conn.call(8, &req).await {
                let code = r.topics[0].partitions[0].error_code;
                if code == 0 {
                    return 0;
                }
            }
        }
        -1
    })
}

/// The offset group `group` committed for `t`-0 on the cluster, asked of every node (one of
/// them coordinates it), or -1.
fn committed(c: &Cluster, group: &'static str) -> i64 {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::{GroupId, OffsetFetchRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partition_indexes(vec![0])]));
    rt().block_on(async {
        for n in 1..=c.nodes.len() as i32 {
            let Ok(mut conn) = tidemark_broker::replica::client::KafkaConnection::connect(
                &c.addr(n),
                Duration::from_secs(15),
                "test",
            )
            .await
            else {
                continue;
            };
            if let Ok(r) = conn.call(7, &req).await {
                if r.error_code == 0 {
                    if let Some(p) = r.topics.first().and_then(|t| t.partitions.first()) {
                        if p.committed_offset >= 0 {
                            return p.committed_offset;
                        }
                    }
                }
            }
        }
        -1
    })
}

/// KIP-1279's group offset sync: group `g` commits offset 2 for `t`-0 on A; B, mirroring `t`,
/// takes it for its own `g` (untranslated: offsets are identical), and a later commit of 3 on
/// A too. Group `audit`, excluded by the mirror's `mirror.groups.exclude`, commits before that
/// 3; the sync round that brings 3 lists groups in order, so it has passed `audit` by then and
/// left it alone. A pattern that does not compile is refused when the mirror is created.
#[test]
fn group_offsets_follow_the_source_for_the_groups_the_mirror_includes() {
    let a = cluster("A", 1, "", None);
    let b = cluster("B", 1, "", None);
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    for v in 0..4 {
        write(&a, &[v]).unwrap();
    }
    let create = |exclude: &str| {
        admin(
            &b,
            MirrorRequest::Create {
                mirror: "a-to-b".into(),
                source_bootstrap: a.running().join(","),
                configs: [("mirror.groups.exclude".to_string(), exclude.to_string())].into(),
            },
        )
    };
    let bad = create("audit,(");
    assert_eq!(bad.error_code, 40, "INVALID_CONFIG: {bad:?}");
    ok("create mirror a-to-b", &create("audit.*")).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0..r3", T, |b| log_of(b, 1).0.len() == 4);
    a.wait_for("g commits 2 on A", T, |a| commit(a, "g", 2) == 0);
    b.wait_for("B's g at A's offset 2", T, |b| committed(b, "g") == 2);
    a.wait_for("audit commits 1 on A", T, |a| commit(a, "audit", 1) == 0);
    a.wait_for("g commits 3 on A", T, |a| commit(a, "g", 3) == 0);
    b.wait_for("B's g at A's offset 3", T, |b| committed(b, "g") == 3);
    assert_eq!(committed(&b, "audit"), -1, "an excluded group was synced");
}

/// KIP-1279's source outage with retries exhausted (S-FAILED's variant): B's partition fails
/// while A is down, retries twice (`mirror.failed.retry.max.attempts=2`) and then stays FAILED
/// with RetryAttempt -1 even once A is back; RecoverMirrorTopics makes it retry, and it mirrors
/// again from where it was.
#[test]
fn recover_mirror_topics_retries_a_partition_that_gave_up() {
    let mut a = cluster("A", 1, "", None);
    let b = cluster(
        "B",
        1,
        "mirror.failed.retry.max.attempts=2\nmirror.failed.retry.initial.backoff.ms=100\n",
        None,
    );
    assert_eq!(create_topic(&a.addr(1), "t", 1, 1, &[]), 0);
    write(&a, &[0]).unwrap();
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B mirrors r0", T, |b| log_of(b, 1).0.len() == 1);
    a.node(1).terminate();
    b.wait_for("B gave up retrying", T, |b| {
        describe_t(b).is_some_and(|d| d.state == MirrorState::Failed && d.retry_attempt == -1)
    });
    a.node(1).restart();
    write(&a, &[1]).unwrap();
    let d = describe_t(&b).unwrap();
    assert_eq!(
        (d.state, d.retry_attempt),
        (MirrorState::Failed, -1),
        "a partition that gave up does not retry by itself"
    );
    let r = admin(
        &b,
        MirrorRequest::Recover {
            mirror: "a-to-b".into(),
            topics: vec!["t".into()],
        },
    );
    ok("recover", &r).unwrap();
    b.wait_for("B mirrors r1 after the recovery", T, |b| {
        log_of(b, 1).0 == log_of(&a, 1).0 && log_of(b, 1).0.len() == 2
    });
    let d = describe_t(&b).unwrap();
    assert_eq!((d.state, d.retry_attempt), (MirrorState::Mirroring, 0));
}

/// Topic configs of `t` set on the topic itself (DescribeConfigs' source 1), by name.
fn topic_configs(c: &Cluster) -> std::collections::BTreeMap<String, String> {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::DescribeConfigsRequest;
    use kafka_protocol::protocol::StrBytes;
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("t"))
            .with_configuration_keys(None)]);
    let addr = c.running()[0].clone();
    let resp = rt()
        .block_on(async {
            let mut conn = tidemark_broker::replica::client::KafkaConnection::connect(
                &addr,
                Duration::from_secs(15),
                "test",
            )
            .await?;
            conn.call(1, &req).await
        })
        .expect("describe configs");
    resp.results[0]
        .configs
        .iter()
        .filter(|c| c.config_source == 1)
        .map(|c| {
            let v = c.value.as_ref().map(|v| v.to_string()).unwrap_or_default();
            (c.name.to_string(), v)
        })
        .collect()
}

/// KIP-1279's topic config sync: configs set on the source topic (at creation, and altered
/// later) become the mirror topic's; the mirror's own `mirror.support.unclean.leader.election`
/// stays its own.
#[test]
fn topic_configs_follow_the_source() {
    let a = cluster("A", 1, "", None);
    let b = cluster("B", 1, "", None);
    assert_eq!(
        create_topic(&a.addr(1), "t", 1, 1, &[("segment.bytes", "100000")]),
        0
    );
    write(&a, &[0]).unwrap();
    create_mirror(&b, "a-to-b", &a).unwrap();
    start(&b, "a-to-b").unwrap();
    b.wait_for("B takes segment.bytes", T, |b| {
        topic_configs(b).get("segment.bytes").map(String::as_str) == Some("100000")
    });
    set_topic_config(&b, "mirror.support.unclean.leader.election", "true").unwrap();
    set_topic_config(&a, "flush.messages", "7").unwrap();
    b.wait_for("B takes flush.messages", T, |b| {
        topic_configs(b).get("flush.messages").map(String::as_str) == Some("7")
    });
    let on_b = topic_configs(&b);
    assert_eq!(
        on_b.get("mirror.support.unclean.leader.election")
            .map(String::as_str),
        Some("true"),
        "B's own flag is not the source's: {on_b:?}"
    );
    assert_eq!(
        on_b.get("segment.bytes").map(String::as_str),
        Some("100000")
    );
}
