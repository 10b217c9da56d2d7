//! How much the engine costs: client ops per second the harness records against a 3-node
//! cluster at concurrency 10 and 50 (rate unlimited), next to the same queue client driven
//! without the harness (no generator, no history), and the wall time of a default 15-s run end
//! to end. Needs root and a built `tidemark-broker` (`TIDEMARK_BROKER`, or target/release or
//! target/debug). Run: `cargo bench -p tidemark-workloads --bench engine`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tidemark_harness::broker::{BrokerConfig, TidemarkBroker};
use tidemark_harness::client::ClientContext;
use tidemark_harness::db::Db;
use tidemark_harness::leftovers;
use tidemark_harness::net::Iptables;
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::op::{Invocation, Outcome};
use tidemark_harness::probe::await_ready;
use tidemark_harness::progress::Progress;
use tidemark_harness::runner::{self, CancellationToken, RunOutcome};
use tidemark_harness::runtime::Runtime;
use tidemark_harness::test::{cluster_names, Test, TestOptions};
use tidemark_harness::workload::{SetupContext, Workload};
use tidemark_workloads::queue::{Queue, QueueOptions};

/// Replicas per partition, as `tidemark test` chooses for three nodes.
const RF: u32 = 3;

/// The workload both sides run. Polls return at once instead of waiting for data and never seek
/// back, so both sides read similar amounts and the figures compare the engine's overhead.
fn queue_options() -> QueueOptions {
    QueueOptions {
        poll_max_wait: Duration::ZERO,
        seek_back_probability: 0.0,
        ..QueueOptions::new(RF as i16)
    }
}
const MEASURE: Duration = Duration::from_secs(10);

fn broker_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TIDEMARK_BROKER") {
        return p.into();
    }
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target");
    ["release", "debug"]
        .iter()
        .map(|p| target.join(p).join("tidemark-broker"))
        .find(|p| p.is_file())
        .expect("build tidemark-broker first (cargo build --release -p tidemark-broker)")
}

fn options(
    store: &std::path::Path,
    concurrency: usize,
    rate: f64,
    time_limit: Duration,
) -> TestOptions {
    TestOptions {
        name: "bench".into(),
        seed: 1,
        nodes: 3,
        controllers: 0,
        clusters: cluster_names(1),
        concurrency,
        time_limit,
        rate,
        nemesis: vec![],
        runtime: "netns".into(),
        store: store.to_path_buf(),
        op_timeout: Duration::from_secs(5),
        ready_timeout: Duration::from_secs(30),
        converge_timeout: Duration::from_secs(10),
        final_timeout: Duration::from_secs(30),
        argv: vec!["bench".into()],
        shrunk_from: None,
        shrunk_keeping: None,
    }
}

fn test(work: &std::path::Path, options: TestOptions) -> Test {
    Test {
        runtime: Box::new(NetnsRuntime::new(work, &leftovers::new_run_id()).unwrap()),
        db: Arc::new(TidemarkBroker::new(
            broker_binary(),
            BrokerConfig::for_replication(RF),
            vec![],
        )),
        net: Arc::new(Iptables),
        workload: Arc::new(Queue::new(queue_options())),
        nemesis: None,
        options,
    }
}

/// Runs a whole test; returns (client ops completed in the main phase per second, wall time).
async fn harness_rate(concurrency: usize, rate: f64, time_limit: Duration) -> (f64, Duration) {
    let work = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let t = test(
        work.path(),
        options(store.path(), concurrency, rate, time_limit),
    );
    let mut progress = Progress::new(time_limit, true);
    let started = Instant::now();
    let report = runner::run(t, CancellationToken::new(), &mut progress).await;
    let wall = started.elapsed();
    let RunOutcome::Checked(results) = &report.outcome else {
        panic!("run failed: {:?}", report.outcome);
    };
    assert_eq!(report.exit_code(), 0, "{}", results.summary(3));
    // Completions recorded during the main phase only (the final reads are not load).
    let history = std::fs::read_to_string(report.run_dir.unwrap().join("history.jsonl")).unwrap();
    let limit = time_limit.as_nanos() as u64;
    let done = history
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|o| o["process"].is_u64() && o["type"] != "invoke")
        .filter(|o| o["time"].as_u64().unwrap_or(u64::MAX) <= limit)
        .count();
    (done as f64 / time_limit.as_secs_f64(), wall)
}

/// The same queue client, `concurrency` tasks in a loop, no generator and no history.
async fn raw_rate(concurrency: usize) -> f64 {
    let work = tempfile::tempdir().unwrap();
    let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
    let names: Vec<String> = (1..=3).map(|i| format!("n{i}")).collect();
    let nodes = runtime.create("a", &names).unwrap();
    let db = TidemarkBroker::new(broker_binary(), BrokerConfig::for_replication(RF), vec![]);
    for n in &nodes {
        db.setup(n, &nodes).unwrap();
    }
    let cx = ClientContext::new(
        &nodes,
        |n| db.endpoint(n),
        runtime.dialer(),
        Duration::from_secs(5),
    );
    await_ready(&cx, Duration::from_secs(30), &CancellationToken::new())
        .await
        .unwrap();
    let queue = Arc::new(Queue::new(queue_options()));
    queue
        .setup(SetupContext {
            clusters: std::slice::from_ref(&cx),
            db: &db,
        })
        .await
        .unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + MEASURE;
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut client = queue.open(std::slice::from_ref(&cx), w % nodes.len());
        let count = count.clone();
        tasks.push(tokio::spawn(async move {
            let mut next_value = (w as i64) << 40;
            let mut positions = [0i64; 4];
            let mut i = 0u64;
            while Instant::now() < deadline {
                // Sends and polls alternate over all four partitions; polls read on from where
                // this task's last poll ended, as the workload's processes do.
                let tp = (i / 2 % 4) as usize;
                let (topic, partition) = (format!("t{}", tp / 2), (tp % 2) as i64);
                let op = if i.is_multiple_of(2) {
                    next_value += 1;
                    Invocation {
                        f: "send".into(),
                        value: json!({"topic": topic, "partition": partition, "values": [next_value]}),
                    }
                } else {
                    Invocation {
                        f: "poll".into(),
                        value: json!({"topic": topic, "partition": partition, "from": positions[tp]}),
                    }
                };
                let done = client.invoke(&op).await;
                assert_ne!(done.outcome, Outcome::Fail, "{:?}", done.error);
                if let Some(last) = done.value["records"]
                    .as_array()
                    .and_then(|r| r.last())
                    .and_then(|r| r[0].as_i64())
                {
                    positions[tp] = last + 1;
                }
                count.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    runtime.destroy().unwrap();
    count.load(Ordering::Relaxed) as f64 / MEASURE.as_secs_f64()
}

fn main() {
    if !leftovers::is_root() {
        eprintln!("engine bench skipped: needs root for network namespaces");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    println!("broker: {}", broker_binary().display());
    for concurrency in [10, 50] {
        let raw = rt.block_on(raw_rate(concurrency));
        let (recorded, _) = rt.block_on(harness_rate(concurrency, 0.0, MEASURE));
        println!(
            "concurrency {concurrency:>2}: harness records {recorded:>7.0} ops/s; \
             the same client alone {raw:>7.0} ops/s ({:.0}%)",
            100.0 * recorded / raw
        );
    }
    let (_, wall) = rt.block_on(harness_rate(10, 100.0, Duration::from_secs(15)));
    println!(
        "a default 15-s run (3 nodes, 10 workers, 100 ops/s) takes {:.1} s end to end",
        wall.as_secs_f64()
    );
}
