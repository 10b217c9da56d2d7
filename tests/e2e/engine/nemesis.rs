//! The runner with a nemesis: a partition fault scheduled beside the clients, performed through
//! the `Net` ability on real namespaces, recorded as nemesis invoke/info pairs with the grudge it
//! applied, healed again in the final phase, and a run that still ends with a verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::support::engine::*;
use serde_json::{json, Value};
use tidemark_harness::broker::{BrokerConfig, TidemarkBroker};
use tidemark_harness::generator::{self, Generator};
use tidemark_harness::leftovers;
use tidemark_harness::nemesis::{Nemesis, NemesisContext};
use tidemark_harness::net::{Grudge, Iptables};
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::op::{Completion, Invocation, Outcome};
use tidemark_harness::progress::Progress;
use tidemark_harness::runner::{self, CancellationToken, RunOutcome};
use tidemark_harness::runtime::Runtime;
use tidemark_harness::test::{cluster_names, Test, TestOptions};
use tidemark_workloads::queue::{Queue, QueueOptions};

const S: u64 = 1_000_000_000;

/// Cuts n1 off from the other nodes, in both directions, and heals it.
struct IsolateFirst;

impl Nemesis for IsolateFirst {
    fn fs(&self) -> Vec<&'static str> {
        vec!["start-partition", "stop-partition"]
    }

    fn invoke(&self, cx: &NemesisContext<'_>, op: &Invocation) -> Completion {
        let result = match op.f.as_str() {
            "start-partition" => {
                let first = cx.nodes[0].name.clone();
                let rest: BTreeSet<String> = cx.nodes[1..].iter().map(|n| n.name.clone()).collect();
                let mut grudge: Grudge = BTreeMap::from([(first.clone(), rest.clone())]);
                for n in rest {
                    grudge.insert(n, BTreeSet::from([first.clone()]));
                }
                cx.net
                    .drop_all(cx.nodes, &grudge)
                    .map(|()| json!({"kind": "isolate-first", "grudge": grudge}))
            }
            _ => cx.net.heal(cx.nodes).map(|()| json!({})),
        };
        match result {
            Ok(value) => Completion::new(Outcome::Info, value),
            Err(e) => Completion {
                error: Some(format!("{e:#}")),
                ..Completion::new(Outcome::Info, Value::Null)
            },
        }
    }

    fn generator(&self) -> Box<dyn Generator> {
        Box::new(generator::phases(vec![
            Box::new(generator::sleep(2 * S)),
            Box::new(generator::nemesis_once("start-partition", json!({}))),
            Box::new(generator::sleep(3 * S)),
            Box::new(generator::nemesis_once("stop-partition", json!({}))),
        ]))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_is_applied_recorded_and_healed() {
    require_root("a_partition_is_applied_recorded_and_healed");
    let work = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
    let record = json!({"runtime": runtime.describe()});
    let options = TestOptions {
        name: "partition".into(),
        seed: 3,
        nodes: 3,
        controllers: 0,
        clusters: cluster_names(1),
        concurrency: 6,
        time_limit: Duration::from_secs(8),
        rate: 100.0,
        nemesis: vec!["isolate-first".into()],
        runtime: "netns".into(),
        store: store.path().to_path_buf(),
        op_timeout: Duration::from_secs(3),
        ready_timeout: Duration::from_secs(30),
        converge_timeout: Duration::from_secs(15),
        final_timeout: Duration::from_secs(30),
        argv: vec![],
        shrunk_from: None,
        shrunk_keeping: None,
    };
    let test = Test {
        runtime: Box::new(runtime),
        db: Arc::new(TidemarkBroker::new(
            broker(),
            BrokerConfig::for_replication(3),
            vec![],
        )),
        net: Arc::new(Iptables),
        workload: Arc::new(Queue::new(QueueOptions::new(3))),
        nemesis: Some(Arc::new(IsolateFirst)),
        options,
    };
    let mut progress = Progress::new(Duration::from_secs(8), true);
    let report = runner::run(test, CancellationToken::new(), &mut progress).await;
    let RunOutcome::Checked(results) = &report.outcome else {
        panic!("the run did not finish: {:?}", report.outcome);
    };
    assert!(report.exit_code() <= 2, "{}", results.summary(3));

    let history = std::fs::read_to_string(report.run_dir.unwrap().join("history.jsonl")).unwrap();
    let nemesis: Vec<Value> = history
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|o| o["process"] == "nemesis")
        .collect();
    let steps: Vec<(&str, &str)> = nemesis
        .iter()
        .map(|o| (o["f"].as_str().unwrap(), o["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        steps,
        vec![
            ("start-partition", "invoke"),
            ("start-partition", "info"),
            ("stop-partition", "invoke"),
            ("stop-partition", "info"),
            // The final phase heals whatever the nemesis did.
            ("stop-partition", "invoke"),
            ("stop-partition", "info"),
            ("resume", "invoke"),
            ("resume", "info"),
            ("start", "invoke"),
            ("start", "info"),
            // Then the runner waits for the replicas to agree.
            ("converge", "invoke"),
            ("converge", "info"),
        ]
    );
    assert_eq!(nemesis[11]["value"]["converged"], true, "{}", nemesis[11]);
    assert_eq!(
        nemesis[1]["value"]["grudge"],
        json!({"n1": ["n2", "n3"], "n2": ["n1"], "n3": ["n1"]})
    );
    assert!(
        nemesis.iter().all(|o| o.get("error").is_none()),
        "{nemesis:?}"
    );
    let started = nemesis[1]["time"].as_u64().unwrap();
    let stopped = nemesis[2]["time"].as_u64().unwrap();
    assert!(
        (2 * S..4 * S).contains(&started) && (5 * S..8 * S).contains(&stopped),
        "partition from {started} to {stopped}"
    );
    assert_nothing_left(&record);
}
