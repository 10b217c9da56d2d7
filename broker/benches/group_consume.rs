//! Group consumption on a 3-node cluster: one kcat balanced consumer (`kcat -G`) reading a
//! 6-partition topic, next to a group of three reading the same records, measured in one run as
//! a ratio (the target is ≥ 2×). Each read is timed from the consumers' start to the last one
//! finishing (`-e`: every assigned partition at its end), so joining counts: the brokers hold a
//! new group's first rebalance 1 s (`group.initial.rebalance.delay.ms`) so that all three
//! members share it, and the solo consumer waits the same. Each round uses a fresh group; the
//! solo and trio rounds alternate.
//!
//! `cargo bench -p tidemark-broker --bench group_consume`

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: usize = 300_000;
const RECORD: usize = 512;
const PARTITIONS: i32 = 6;
const ROUNDS: usize = 3;

/// Starts `members` consumers of one new group and returns how long until all finished and
/// how many records they read together.
fn read_in_group(bootstrap: &str, group: &str, members: usize) -> (Duration, usize) {
    let start = Instant::now();
    let children: Vec<_> = (0..members)
        .map(|_| {
            Command::new("kcat")
                .args(["-b", bootstrap, "-G", group, "bench", "-e", "-q"])
                .args(["-X", "auto.offset.reset=earliest", "-f", "%p\\n"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("kcat must be installed")
        })
        .collect();
    let read = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "kcat failed: {}", out.status);
            out.stdout.iter().filter(|b| **b == b'\n').count()
        })
        .sum();
    (start.elapsed(), read)
}

fn main() {
    let c = common::Cluster::start(3, "group.initial.rebalance.delay.ms=1000\n", &[]);
    let bootstrap = c.running().join(",");
    assert_eq!(
        common::client::create_topic(&c.addr(1), "bench", PARTITIONS, 3, &[]),
        0
    );
    c.wait_for("every partition led", Duration::from_secs(30), |c| {
        (0..PARTITIONS).all(|p| c.partition_state("bench", p).is_some_and(|s| s.0 > 0))
    });
    let line = format!("{}\n", "x".repeat(RECORD - 1));
    let input = line.repeat(RECORDS);
    common::kcat(
        &[
            "-b", &bootstrap, "-P", "-t", "bench", "-p", "-1", "-X", "acks=all",
        ],
        input.as_bytes(),
    );
    // Warm-up: the coordinator's partition loads and the page cache fills.
    read_in_group(&bootstrap, "warm", 1);

    let (mut solo, mut trio) = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        let (d, n) = read_in_group(&bootstrap, &format!("solo-{round}"), 1);
        assert!(n >= RECORDS, "one consumer read {n} of {RECORDS}");
        solo += d;
        let (d, n) = read_in_group(&bootstrap, &format!("trio-{round}"), 3);
        assert!(n >= RECORDS, "three consumers read {n} of {RECORDS}");
        trio += d;
    }
    let rate = |d: Duration| (RECORDS * ROUNDS) as f64 / d.as_secs_f64();
    println!(
        "group consume, {RECORDS} records of {RECORD} B on {PARTITIONS} partitions (RF 3, 3 brokers), {ROUNDS} rounds"
    );
    println!("  1 consumer   : {:>10.0} records/s", rate(solo));
    println!("  3 consumers  : {:>10.0} records/s", rate(trio));
    println!(
        "  ratio 3 / 1  : {:.2}  (target ≥ 2)",
        rate(trio) / rate(solo)
    );
}
