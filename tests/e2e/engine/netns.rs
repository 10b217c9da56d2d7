//! The embedded runtime with real brokers: nodes in network namespaces serve the Kafka wire to
//! the harness's client namespace, grudges become iptables rules that cut exactly the links they
//! name, the broker's kill, pause and dump abilities act on the real process, and destroying the
//! runtime leaves nothing behind.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::engine::*;
use tidemark_harness::broker::{BrokerConfig, TidemarkBroker, CLIENT_PORT, CONTROLLER_PORT};
use tidemark_harness::client::ClientContext;
use tidemark_harness::db::Db;
use tidemark_harness::kafka::{Connection, ParseResponseErrorCode, ResponseError};
use tidemark_harness::leftovers;
use tidemark_harness::net::{Grudge, Iptables, Net};
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::probe::await_ready;
use tidemark_harness::remote;
use tidemark_harness::runner::CancellationToken;
use tidemark_harness::runtime::{Node, Runtime};

/// Whether `from` can open a TCP connection to `to`'s broker port.
fn reaches(from: &Node, to: &Node) -> bool {
    reaches_port(from, to, CLIENT_PORT)
}

/// Whether `from` can open a TCP connection to `to`'s `port`.
fn reaches_port(from: &Node, to: &Node, port: u16) -> bool {
    let cmd = format!(
        "timeout 2 bash -c 'exec 3<>/dev/tcp/{}/{port}' 2>/dev/null",
        to.ip
    );
    from.remote.exec(&cmd).unwrap().exit == 0
}

fn client_context(runtime: &NetnsRuntime, db: &dyn Db, nodes: &[Node]) -> ClientContext {
    ClientContext::new(
        nodes,
        |n| db.endpoint(n),
        runtime.dialer(),
        Duration::from_secs(5),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_serve_grudges_cut_links_and_the_broker_abilities_work() {
    require_root("nodes_serve_grudges_cut_links_and_the_broker_abilities_work");
    let work = tempfile::tempdir().unwrap();
    let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
    let names: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
    let nodes = runtime.create("a", &names).unwrap();
    let test_record = serde_json::json!({"runtime": runtime.describe()});
    let db = TidemarkBroker::new(broker(), BrokerConfig::for_replication(1), vec![]);
    for n in &nodes {
        db.setup(n, &nodes).unwrap();
    }
    let cx = client_context(&runtime, &db, &nodes);
    await_ready(&cx, Duration::from_secs(30), &CancellationToken::new())
        .await
        .unwrap();

    // Every node reaches every other; then n1 drops traffic from n2 only.
    for a in &nodes {
        for b in &nodes {
            if a.name != b.name {
                assert!(reaches(a, b), "{} -> {}", a.name, b.name);
            }
        }
    }
    let grudge: Grudge = BTreeMap::from([("n1".to_string(), BTreeSet::from(["n2".to_string()]))]);
    Iptables.drop_all(&nodes, &grudge).unwrap();
    assert!(!reaches(&nodes[1], &nodes[0]), "n2 -> n1 should be cut");
    assert!(reaches(&nodes[2], &nodes[0]), "n3 -> n1 should still work");
    assert!(reaches(&nodes[0], &nodes[2]), "n1 -> n3 should still work");
    // The harness's client path is not part of the grudge.
    Connection::connect(cx.dialer.clone(), cx.nodes[0].addr, cx.timeout)
        .await
        .unwrap();
    Iptables.heal(&nodes).unwrap();
    assert!(reaches(&nodes[1], &nodes[0]), "healed");

    // Cut on the brokers' listener only: the controllers' port still connects, both ways.
    let grudge: Grudge = BTreeMap::from([
        ("n1".to_string(), BTreeSet::from(["n2".to_string()])),
        ("n2".to_string(), BTreeSet::from(["n1".to_string()])),
    ]);
    Iptables
        .drop_on_ports(&nodes, &grudge, &[CLIENT_PORT])
        .unwrap();
    assert!(
        !reaches(&nodes[1], &nodes[0]),
        "n2 -> n1:9092 should be cut"
    );
    assert!(
        !reaches(&nodes[0], &nodes[1]),
        "n1 -> n2:9092 should be cut"
    );
    assert!(
        reaches_port(&nodes[1], &nodes[0], CONTROLLER_PORT),
        "n2 -> n1's quorum port"
    );
    assert!(
        reaches_port(&nodes[0], &nodes[1], CONTROLLER_PORT),
        "n1 -> n2's quorum port"
    );
    assert!(reaches(&nodes[2], &nodes[0]), "n3 -> n1 should still work");
    Connection::connect(cx.dialer.clone(), cx.nodes[0].addr, cx.timeout)
        .await
        .unwrap();
    Iptables.heal(&nodes).unwrap();
    assert!(reaches(&nodes[1], &nodes[0]), "healed");

    // The thin client writes and reads back through the real broker.
    let mut c = Connection::connect(cx.dialer.clone(), cx.nodes[0].addr, cx.timeout)
        .await
        .unwrap();
    assert_eq!(c.create_topic("t", 1, 1).await.unwrap().err(), None);
    assert_eq!(
        c.create_topic("t", 1, 1).await.unwrap().err(),
        Some(ResponseError::TopicAlreadyExists)
    );
    let meta = c.metadata(Some(&["t".to_string()])).await.unwrap();
    assert_eq!(meta.leader("t", 0), Some(1));
    let first = c.produce("t", 0, &[10, 11, 12], -1).await.unwrap();
    assert_eq!((first.error_code.err(), first.base_offset), (None, 0));
    let second = c.produce("t", 0, &[13], -1).await.unwrap();
    assert_eq!(second.base_offset, 3);
    let read = c
        .fetch("t", 0, 1, -1, 1 << 20, Duration::from_millis(10))
        .await
        .unwrap();
    assert_eq!(read.error_code.err(), None);
    assert_eq!(read.high_watermark, 4);
    let got: Vec<(i64, String)> = read
        .records
        .iter()
        .map(|r| {
            (
                r.offset,
                String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![(1, "11".into()), (2, "12".into()), (3, "13".into())]
    );
    drop(c);

    // Kill, start, pause, resume and dump act on the real process.
    let n1 = &nodes[0];
    let kill = db.as_kill().unwrap();
    let pause = db.as_pause().unwrap();
    assert!(kill.is_running(n1).unwrap());
    pause.pause(n1).unwrap();
    let stalled = tokio::time::timeout(
        Duration::from_millis(1500),
        Connection::connect(cx.dialer.clone(), cx.nodes[0].addr, cx.timeout),
    )
    .await;
    assert!(stalled.is_err(), "a paused broker must not answer");
    pause.resume(n1).unwrap();
    Connection::connect(cx.dialer.clone(), cx.nodes[0].addr, cx.timeout)
        .await
        .unwrap();
    kill.kill(n1).unwrap();
    assert!(!kill.is_running(n1).unwrap());
    kill.start(n1).unwrap();
    assert!(kill.is_running(n1).unwrap());
    await_ready(&cx, Duration::from_secs(30), &CancellationToken::new())
        .await
        .unwrap();
    db.stop(n1).unwrap();
    let dump = db.as_replica_dump().unwrap().dump_replicas(n1).unwrap();
    let t0 = dump
        .iter()
        .map(|r| &r.state)
        .find(|r| r.topic == "t" && r.partition == 0)
        .unwrap();
    assert_eq!(t0.node, "n1");
    assert_eq!(t0.cluster, "a");
    assert_eq!(t0.log_end_offset, Some(4));
    assert_eq!(t0.records[3].value, 13);
    let logs = db.as_log_files().unwrap().log_files(n1);
    assert!(remote::run(
        n1.remote.as_ref(),
        &remote::command_line(&["test", "-s", &logs[0].display().to_string()])
    )
    .is_ok());

    db.teardown(n1).unwrap();
    let data = n1.dir.join("data");
    assert!(!data.exists(), "{} survived the wipe", data.display());

    runtime.destroy().unwrap();
    assert_nothing_left(&test_record);
}

#[test]
fn the_netns_runtime_names_what_it_needs_when_not_root() {
    if leftovers::is_root() {
        // As root the runtime must be available.
        let work = tempfile::tempdir().unwrap();
        assert!(NetnsRuntime::new(work.path(), "x").is_ok());
        return;
    }
    let err = NetnsRuntime::new(std::path::Path::new("/tmp"), "x")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("needs root"), "{err}");
}

#[test]
fn a_panic_while_nodes_exist_still_removes_them() {
    require_root("a_panic_while_nodes_exist_still_removes_them");
    let work = tempfile::tempdir().unwrap();
    let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
    let record = serde_json::json!({"runtime": runtime.describe()});
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let nodes = runtime.create("a", &["n1".to_string()]).unwrap();
        // A process started from the run's directory, so the leftover check can see it.
        let sleeper = nodes[0].dir.join("sleeper");
        crate::support::copy_executable(std::path::Path::new("/bin/sleep"), &sleeper);
        remote::run(
            nodes[0].remote.as_ref(),
            &format!(
                "nohup setsid {} 600 > /dev/null 2>&1 < /dev/null &",
                sleeper.display()
            ),
        )
        .unwrap();
        panic!("the run blew up");
    }));
    assert!(panicked.is_err());
    assert_nothing_left(&record);
}
