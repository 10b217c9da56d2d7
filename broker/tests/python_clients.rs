//! Real Python Kafka clients against real broker processes, with their default settings, as a
//! user meets the broker: confluent-kafka (librdkafka) and kafka-python, installed by
//! `scripts/setup-host` from `scripts/python-requirements.txt` into a virtual environment.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::client::{create_topic, read_all};
use common::{Cluster, PYTHON};

/// Starts `script` under the clients' Python with `args`; stdout piped.
fn python(script: &str, args: &[&str]) -> std::process::Child {
    assert!(
        std::path::Path::new(PYTHON).exists(),
        "{PYTHON} is missing: run scripts/setup-host (it installs scripts/python-requirements.txt)"
    );
    Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python")
}

/// Runs `script` to the end and returns its last stdout line as JSON.
fn python_json(script: &str, args: &[&str]) -> serde_json::Value {
    let out = python(script, args).wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("last line of {stdout:?} is not JSON: {e}"))
}

/// Every value in every partition of `topic` (read from any node that leads it), with how often
/// each occurs.
fn value_counts(c: &Cluster, topic: &str, partitions: i32) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for p in 0..partitions {
        let (leader, _, _) = c.partition_state(topic, p).expect("partition state");
        let (records, _) = read_all(&c.addr(leader), topic, p).expect("read partition");
        for (_, v, _) in records {
            *counts.entry(v).or_insert(0) += 1;
        }
    }
    counts
}

fn assert_exactly_once(counts: &BTreeMap<i64, usize>, n: i64) {
    let duplicated: Vec<_> = counts.iter().filter(|(_, k)| **k > 1).take(10).collect();
    assert!(
        duplicated.is_empty(),
        "duplicates (value, count): {duplicated:?}"
    );
    let missing: Vec<i64> = (0..n)
        .filter(|v| !counts.contains_key(v))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "missing values, first ten: {missing:?}");
    assert_eq!(counts.len() as i64, n, "values beyond 0..{n} were stored");
}

const CONFLUENT_PRODUCE: &str = r#"
import json, sys
from confluent_kafka import Producer
boot, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = Producer({"bootstrap.servers": boot, "enable.idempotence": True})
errors = []
def done(err, msg):
    if err is not None:
        errors.append(str(err))
for i in range(n):
    while True:
        try:
            p.produce(topic, str(i).encode(), callback=done)
            break
        except BufferError:
            p.poll(0.05)
    if i == n // 2:
        print("half", flush=True)
left = p.flush(120)
print(json.dumps({"undelivered": left, "errors": errors[:10], "error_count": len(errors)}))
"#;

#[test]
fn confluent_kafka_idempotent_producer_writes_100k_to_three_nodes() {
    let c = Cluster::start(3, "", &[]);
    assert_eq!(create_topic(&c.addr(1), "cf", 3, 3, &[]), 0);
    let boot = c.running().join(",");
    let out = python_json(CONFLUENT_PRODUCE, &[&boot, "cf", "100000"]);
    assert_eq!(out["undelivered"], 0, "{out}");
    assert_eq!(out["error_count"], 0, "{out}");
    assert_exactly_once(&value_counts(&c, "cf", 3), 100_000);
}

#[test]
fn kafka_python_default_producer_works() {
    let c = Cluster::start(3, "", &[]);
    assert_eq!(create_topic(&c.addr(1), "kp", 2, 3, &[]), 0);
    let boot = c.running().join(",");
    let out = python_json(
        r#"
import json, sys
from kafka import KafkaProducer
boot, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = KafkaProducer(bootstrap_servers=boot.split(","))
futures = [p.send(topic, str(i).encode()) for i in range(n)]
p.flush(60)
offsets = [f.get(timeout=60).offset for f in futures]
p.close()
print(json.dumps({"acked": len(offsets), "idempotent": p.config.get("enable_idempotence")}))
"#,
        &[&boot, "kp", "5000"],
    );
    assert_eq!(out["acked"], 5000, "{out}");
    assert_eq!(
        out["idempotent"], true,
        "kafka-python's default producer is idempotent"
    );
    assert_exactly_once(&value_counts(&c, "kp", 2), 5000);
}

#[test]
fn idempotent_producer_across_a_leader_kill_leaves_no_duplicates() {
    let mut c = Cluster::start(3, "", &[]);
    assert_eq!(
        create_topic(&c.addr(1), "idem", 1, 3, &[("min.insync.replicas", "2")]),
        0
    );
    let boot = c.running().join(",");
    let mut child = python(CONFLUENT_PRODUCE, &[&boot, "idem", "200000"]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "half",
        "the producer did not get half way"
    );
    let (leader, _, _) = c.partition_state("idem", 0).unwrap();
    c.node(leader).kill9();
    let last = lines.last().expect("a result line").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "python failed: {status}");
    let out: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(out["undelivered"], 0, "{out}");
    assert_eq!(out["error_count"], 0, "{out}");
    c.wait_for("a new leader", Duration::from_secs(30), |c| {
        c.partition_state("idem", 0)
            .is_some_and(|(l, _, _)| l > 0 && l != leader)
    });
    assert_exactly_once(&value_counts(&c, "idem", 1), 200_000);
}
