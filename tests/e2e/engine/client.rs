//! The queue workload's client against a real replicated cluster, with real faults: every op
//! ends `ok`, `fail` or `info` by what actually happened, as in Jepsen: acknowledged sends
//! read back, and a partition that does not exist, an ISR smaller than `min.insync.replicas` and
//! a cluster that is down are definite failures.

use std::time::{Duration, Instant};

use crate::support::engine::*;
use serde_json::json;
use tidemark_harness::broker::{BrokerConfig, TidemarkBroker};
use tidemark_harness::client::ClientContext;
use tidemark_harness::db::Db;
use tidemark_harness::kafka::Connection;
use tidemark_harness::leftovers;
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::op::{Invocation, Outcome};
use tidemark_harness::probe::await_ready;
use tidemark_harness::runner::CancellationToken;
use tidemark_harness::runtime::{Node, Runtime};
use tidemark_harness::workload::{SetupContext, Workload};
use tidemark_workloads::queue::{Queue, QueueOptions};

fn op(f: &str, value: serde_json::Value) -> Invocation {
    Invocation { f: f.into(), value }
}

/// A send of `values` to t0/0.
fn send(values: &[i64]) -> Invocation {
    op(
        "send",
        json!({"topic": "t0", "partition": 0, "values": values}),
    )
}

/// A poll of t0/0 from offset 0.
fn poll_from_start() -> Invocation {
    op("poll", json!({"topic": "t0", "partition": 0, "from": 0}))
}

/// Three nodes `n1`..`n3` of cluster `a` running brokers with `config`, ready, with the queue
/// workload's topics (replication factor 3) created; clients time out after `timeout`.
async fn queue_cluster(
    runtime: &mut NetnsRuntime,
    config: BrokerConfig,
    timeout: Duration,
) -> (Vec<Node>, TidemarkBroker, ClientContext, Queue) {
    let names: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
    let nodes = runtime.create("a", &names).unwrap();
    let db = TidemarkBroker::new(broker(), config, vec![]);
    for n in &nodes {
        db.setup(n, &nodes).unwrap();
    }
    let cx = ClientContext::new(&nodes, |n| db.endpoint(n), runtime.dialer(), timeout);
    await_ready(&cx, Duration::from_secs(30), &CancellationToken::new())
        .await
        .unwrap();
    let queue = Queue::new(QueueOptions::new(3));
    queue
        .setup(SetupContext {
            clusters: std::slice::from_ref(&cx),
            db: &db,
        })
        .await
        .unwrap();
    (nodes, db, cx, queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_end_ok_fail_or_info_by_what_happened() {
    require_root("ops_end_ok_fail_or_info_by_what_happened");
    let work = tempfile::tempdir().unwrap();
    let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
    let record = json!({"runtime": runtime.describe()});
    let mut config = BrokerConfig::for_replication(3);
    // Every replica must be in sync for acks=all, so one dead follower is enough to refuse sends
    // while the metadata quorum (two of three) can still shrink the ISR.
    config.min_insync_replicas = 3;
    // Followers that stop fetching leave the ISR after a second instead of ten.
    config.replica_lag_time_max_ms = 1000;
    let (nodes, db, cx, queue) = queue_cluster(&mut runtime, config, Duration::from_secs(5)).await;
    let mut client = queue.open(std::slice::from_ref(&cx), 1);

    // An acknowledged send is read back at the offset it was given.
    let sent = client.invoke(&send(&[1, 2])).await;
    assert_eq!(sent.outcome, Outcome::Ok, "{sent:?}");
    assert_eq!(sent.value["offset"], 0);
    let leader_name = sent.node.clone().unwrap();
    let polled = client.invoke(&poll_from_start()).await;
    assert_eq!(polled.outcome, Outcome::Ok, "{polled:?}");
    assert_eq!(polled.value["high_watermark"], 2);
    let records = polled.value["records"].as_array().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(
        (records[0][0].clone(), records[0][1].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(
        (records[1][0].clone(), records[1][1].clone()),
        (json!(1), json!(2))
    );

    // The poll carried the current leader epoch and records it: the broker served it as that
    // epoch's leader. A fetch carrying another epoch is refused and records none.
    let leader = nodes.iter().find(|n| n.name == leader_name).unwrap();
    let mut c = Connection::connect(cx.dialer.clone(), db.endpoint(leader), cx.timeout)
        .await
        .unwrap();
    let meta = c.metadata(Some(&["t0".to_string()])).await.unwrap();
    let epoch = meta.leader_epoch("t0", 0).unwrap();
    assert_eq!(polled.value["leader_epoch"], epoch, "{polled:?}");
    let wait = Duration::from_millis(10);
    let served = c.fetch("t0", 0, 0, epoch, 1 << 20, wait).await.unwrap();
    assert_eq!((served.error_code, served.leader_epoch), (0, Some(epoch)));
    let refused = c.fetch("t0", 0, 0, epoch + 1, 1 << 20, wait).await.unwrap();
    assert_ne!(refused.error_code, 0, "{refused:?}");
    assert_eq!(refused.leader_epoch, None);
    // OffsetForLeaderEpoch as a consumer asks it (how a failover finds where a failed mirror
    // parted from its source): the current epoch ends at the log end; one the leader has not
    // reached is unknown (-1, -1), as Kafka answers it.
    let ends = c.offset_for_leader_epoch("t0", 0, epoch).await.unwrap();
    assert_eq!(ends, (0, epoch, 2));
    let later = c.offset_for_leader_epoch("t0", 0, epoch + 5).await.unwrap();
    assert_eq!(later, (0, -1, -1));

    // A partition that does not exist: nothing could have been written.
    let nowhere = client
        .invoke(&op(
            "send",
            json!({"topic": "t0", "partition": 9, "values": [3]}),
        ))
        .await;
    assert_eq!(nowhere.outcome, Outcome::Fail, "{nowhere:?}");

    // With a follower dead the ISR shrinks below min.insync.replicas: acks=all sends are refused
    // before they are appended.
    let leader = nodes.iter().find(|n| n.name == leader_name).unwrap();
    let kill = db.as_kill().unwrap();
    let follower = nodes.iter().find(|n| n.name != leader_name).unwrap();
    kill.kill(follower).unwrap();
    let leader_addr = db.endpoint(leader);
    let started = Instant::now();
    loop {
        let isr = async {
            let mut c = Connection::connect(cx.dialer.clone(), leader_addr, cx.timeout).await?;
            let m = c.metadata(Some(&["t0".to_string()])).await?;
            Ok::<_, tidemark_harness::kafka::KafkaError>(m.topics["t0"].1[&0].isr.len())
        }
        .await;
        if isr.as_ref().is_ok_and(|n| *n == 2) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the ISR never shrank: {isr:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut client = queue.open(std::slice::from_ref(&cx), 0);
    let refused = client.invoke(&send(&[4])).await;
    assert_eq!(refused.outcome, Outcome::Fail, "{refused:?}");
    assert_eq!(refused.error.as_deref(), Some("NotEnoughReplicas"));

    // With every node down no send can be ok; one never sent is a definite failure.
    for n in &nodes {
        kill.kill(n).unwrap();
    }
    let mut client = queue.open(std::slice::from_ref(&cx), 0);
    let down = client.invoke(&send(&[5])).await;
    assert_eq!(down.outcome, Outcome::Fail, "{down:?}");

    runtime.destroy().unwrap();
    assert_nothing_left(&record);
}

/// A leader that cannot reach its followers nor a metadata quorum cannot commit a send, nor shrink
/// the ISR to commit it without them: it answers REQUEST_TIMED_OUT when the wait it was asked for
/// runs out, before the client's own timeout, so the broker's answer is what the history records
/// (a faulty broker's answer to that wait would be recorded the same way) and the connection
/// stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_wait_for_replicas_runs_out_answers_before_the_client_gives_up() {
    require_root("a_leader_whose_wait_for_replicas_runs_out_answers_before_the_client_gives_up");
    let work = tempfile::tempdir().unwrap();
    let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
    let record = json!({"runtime": runtime.describe()});
    let timeout = Duration::from_secs(4);
    let (nodes, db, cx, queue) =
        queue_cluster(&mut runtime, BrokerConfig::for_replication(3), timeout).await;
    let mut client = queue.open(std::slice::from_ref(&cx), 1);
    // Until every follower has joined the ISR a new topic refuses acks=all sends.
    let started = Instant::now();
    let first = loop {
        let c = client.invoke(&send(&[1])).await;
        if c.outcome == Outcome::Ok || started.elapsed() > Duration::from_secs(30) {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(first.outcome, Outcome::Ok, "{first:?}");
    let leader_name = first.node.clone().unwrap();

    let pause = db.as_pause().unwrap();
    let followers: Vec<_> = nodes.iter().filter(|n| n.name != leader_name).collect();
    for f in &followers {
        pause.pause(f).unwrap();
    }
    let started = Instant::now();
    let waited = client.invoke(&send(&[2])).await;
    let took = started.elapsed();
    for f in &followers {
        pause.resume(f).unwrap();
    }
    assert_eq!(waited.outcome, Outcome::Info, "{waited:?}");
    assert_eq!(
        waited.error.as_deref(),
        Some("RequestTimedOut"),
        "{waited:?} after {took:?}"
    );
    assert_eq!(waited.node.as_deref(), Some(leader_name.as_str()));
    assert!(took < timeout, "answered after {took:?}");

    // The same client goes on over the connection the answer came on.
    let polled = client.invoke(&poll_from_start()).await;
    assert_eq!(polled.outcome, Outcome::Ok, "{polled:?}");

    runtime.destroy().unwrap();
    assert_nothing_left(&record);
}
