//! Group consumption on a 3-node cluster: one kcat balanced consumer (`kcat -G`) reading a
//! 6-partition topic, next to a group of three reading the same records, measured in one run as
//! a ratio (the target is ≥ 2×). Each read is timed from the first record any member received
//! to the last member finishing (`-e`: every assigned partition at its end), so what is compared
//! is reading, not joining: the brokers hold a new group's first rebalance 1 s
//! (`group.initial.rebalance.delay.ms`) so that all three members share it, and that wait (and
//! the JoinGroup/SyncGroup/OffsetFetch round trips) is reported apart, as `join`. Each round uses
//! a fresh group; the solo and trio rounds alternate. Fetches ask for up to 8 MiB per partition
//! (librdkafka's default is 1 MiB), so each member's few partitions are read in large batches.
//!
//! `cargo bench -p tidemark-broker --bench group_consume`

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: usize = 300_000;
const RECORD: usize = 512;
const PARTITIONS: i32 = 6;
const ROUNDS: usize = 3;

/// One group read: until the first record arrived (joining), the reading after it, and the
/// records read.
struct Read {
    join: Duration,
    reading: Duration,
    records: usize,
}

/// Starts `members` consumers of one new group and times them until all finished.
fn read_in_group(bootstrap: &str, group: &str, members: usize) -> Read {
    let start = Instant::now();
    let readers: Vec<_> = (0..members)
        .map(|_| {
            let mut child = Command::new("kcat")
                .args(["-b", bootstrap, "-G", group, "bench", "-e", "-q"])
                .args(["-X", "auto.offset.reset=earliest", "-f", "%p\\n"])
                .args(["-X", "max.partition.fetch.bytes=8388608"])
                .args(["-X", "fetch.max.bytes=52428800"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("kcat must be installed");
            let stdout = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                let mut first = None;
                let mut n = 0;
                for line in BufReader::new(stdout).split(b'\n') {
                    line.unwrap();
                    first.get_or_insert_with(Instant::now);
                    n += 1;
                }
                let status = child.wait().unwrap();
                assert!(status.success(), "kcat failed: {status}");
                (first, Instant::now(), n)
            })
        })
        .collect();
    let done: Vec<(Option<Instant>, Instant, usize)> =
        readers.into_iter().map(|r| r.join().unwrap()).collect();
    let first = done.iter().filter_map(|d| d.0).min().unwrap_or(start);
    let end = done.iter().map(|d| d.1).max().unwrap_or(start);
    Read {
        join: first - start,
        reading: end - first,
        records: done.iter().map(|d| d.2).sum(),
    }
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
    let (mut solo_join, mut trio_join) = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        let r = read_in_group(&bootstrap, &format!("solo-{round}"), 1);
        assert!(
            r.records >= RECORDS,
            "one consumer read {} of {RECORDS}",
            r.records
        );
        solo += r.reading;
        solo_join += r.join;
        let r = read_in_group(&bootstrap, &format!("trio-{round}"), 3);
        assert!(
            r.records >= RECORDS,
            "three consumers read {} of {RECORDS}",
            r.records
        );
        trio += r.reading;
        trio_join += r.join;
    }
    let rate = |d: Duration| (RECORDS * ROUNDS) as f64 / d.as_secs_f64();
    let join = |d: Duration| d.as_secs_f64() / ROUNDS as f64;
    println!(
        "group consume, {RECORDS} records of {RECORD} B on {PARTITIONS} partitions (RF 3, 3 brokers), {ROUNDS} rounds"
    );
    println!(
        "  1 consumer   : {:>10.0} records/s  (join {:.2} s)",
        rate(solo),
        join(solo_join)
    );
    println!(
        "  3 consumers  : {:>10.0} records/s  (join {:.2} s)",
        rate(trio),
        join(trio_join)
    );
    println!(
        "  ratio 3 / 1  : {:.2}  (target ≥ 2)",
        rate(trio) / rate(solo)
    );
}
