//! Group consumption on a 3-node cluster: one kcat balanced consumer (`kcat -G`) reading a
//! 6-partition topic, next to a group of three reading the same records, measured in one run as
//! a ratio (the target is ≥ 2×). Each read is timed from the first record any member received
//! to the last record any member received, so what is compared is reading, not joining or
//! leaving:
//! - the brokers hold a new group's first rebalance 1 s (`group.initial.rebalance.delay.ms`) so
//!   that all three members share it, and that wait (and the JoinGroup/SyncGroup/OffsetFetch
//!   round trips) is reported apart, as `join`;
//! - a member exits (`-e`) only once a fetch at the end of each of its partitions came back
//!   empty, and then commits and leaves the group. That tail is reported apart too, as the
//!   rate `to exit`.
//! - kcat writes each record as it consumes it (`-u`). Its stdout is otherwise block-buffered, so
//!   the last lines reached the bench only when kcat exited, after the fetch at the end of each
//!   partition had waited out its long poll (`fetch.wait.max.ms`, 500 ms): half a second on
//!   either side, which held the ratio near 1 whatever the broker did.
//!
//! Each read also reports the CPU the consumers and the brokers used and how busy the whole
//! machine was, so a ratio held down by the cores (three consumers and three brokers share this
//! machine's) is told apart from one held down by the broker.
//!
//! Each round uses a fresh group; the solo and trio rounds alternate. Fetches ask for up to
//! 8 MiB per partition (librdkafka's default is 1 MiB), so each member's few partitions are read
//! in large batches.
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

/// One group read: until the first record arrived (joining), from it to the last record, from
/// it to the last member's exit, and the records read.
struct Read {
    join: Duration,
    reading: Duration,
    to_exit: Duration,
    records: usize,
    /// CPU seconds the members used, to their exit.
    consumers_cpu: f64,
    /// CPU seconds the brokers used meanwhile.
    brokers_cpu: f64,
    /// The share of the machine's CPU time anyone used meanwhile.
    machine_busy: f64,
}

/// `/proc` counts CPU time in USER_HZ ticks, 100 a second in Linux's ABI.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds (user and system) process `pid` used so far; a zombie still reports its own.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // After the command: state, ..., utime (field 14) and stime (field 15).
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / TICKS_PER_SECOND
}

/// The machine's CPU ticks so far from `/proc/stat`: (busy, total).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpu: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap())
        .collect();
    let total: u64 = cpu.iter().sum();
    // idle and iowait.
    (total - cpu[3] - cpu[4], total)
}

/// What one member saw: its first and last record, when it exited, and how many it read.
struct Member {
    first: Option<Instant>,
    last: Option<Instant>,
    exit: Instant,
    records: usize,
    cpu: f64,
}

/// Starts `members` consumers of one new group and times them until all finished.
fn read_in_group(bootstrap: &str, brokers: &[u32], group: &str, members: usize) -> Read {
    let brokers_before: f64 = brokers.iter().map(|&p| cpu_seconds(p)).sum();
    let machine_before = machine_ticks();
    let start = Instant::now();
    let readers: Vec<_> = (0..members)
        .map(|_| {
            let mut child = Command::new("kcat")
                .args(["-b", bootstrap, "-G", group, "bench", "-e", "-q", "-u"])
                .args(["-X", "auto.offset.reset=earliest", "-f", "%p\\n"])
                .args(["-X", "max.partition.fetch.bytes=8388608"])
                .args(["-X", "fetch.max.bytes=52428800"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("kcat must be installed");
            let stdout = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                let (mut first, mut last) = (None, None);
                let mut n = 0;
                for line in BufReader::new(stdout).split(b'\n') {
                    line.unwrap();
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                    n += 1;
                }
                // Read its CPU time once it has exited, before reaping it.
                let pid = child.id();
                while !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                    s.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                }) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let exit = Instant::now();
                let cpu = cpu_seconds(pid);
                let status = child.wait().unwrap();
                assert!(status.success(), "kcat failed: {status}");
                Member {
                    first,
                    last,
                    exit,
                    records: n,
                    cpu,
                }
            })
        })
        .collect();
    let done: Vec<Member> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let first = done.iter().filter_map(|m| m.first).min().unwrap_or(start);
    let last = done.iter().filter_map(|m| m.last).max().unwrap_or(start);
    let exit = done.iter().map(|m| m.exit).max().unwrap_or(start);
    let machine_after = machine_ticks();
    Read {
        join: first - start,
        reading: last - first,
        to_exit: exit - first,
        records: done.iter().map(|m| m.records).sum(),
        consumers_cpu: done.iter().map(|m| m.cpu).sum(),
        brokers_cpu: brokers.iter().map(|&p| cpu_seconds(p)).sum::<f64>() - brokers_before,
        machine_busy: (machine_after.0 - machine_before.0) as f64
            / (machine_after.1 - machine_before.1).max(1) as f64,
    }
}

fn main() {
    let mut c = common::Cluster::start(3, "group.initial.rebalance.delay.ms=1000\n", &[]);
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
    let brokers: Vec<u32> = (1..=3).map(|id| c.node(id).pid().unwrap()).collect();
    read_in_group(&bootstrap, &brokers, "warm", 1);

    let (mut solo, mut trio) = (Totals::default(), Totals::default());
    let mut round_ratios = Vec::new();
    for round in 0..ROUNDS {
        let one = read_in_group(&bootstrap, &brokers, &format!("solo-{round}"), 1);
        assert!(
            one.records >= RECORDS,
            "one consumer read {} of {RECORDS}",
            one.records
        );
        let three = read_in_group(&bootstrap, &brokers, &format!("trio-{round}"), 3);
        assert!(
            three.records >= RECORDS,
            "three consumers read {} of {RECORDS}",
            three.records
        );
        round_ratios.push(one.reading.as_secs_f64() / three.reading.as_secs_f64());
        solo.add(&one);
        trio.add(&three);
    }
    println!(
        "group consume, {RECORDS} records of {RECORD} B on {PARTITIONS} partitions (RF 3, 3 brokers), {ROUNDS} rounds"
    );
    for (name, t) in [("1 consumer ", &solo), ("3 consumers", &trio)] {
        println!(
            "  {name}  : {:>10.0} records/s reading, {:>10.0} records/s to exit  (join {:.2} s)",
            t.rate(t.reading),
            t.rate(t.to_exit),
            t.join.as_secs_f64() / ROUNDS as f64
        );
        println!(
            "                 CPU per round: consumers {:.2} s, brokers {:.2} s; machine busy {:.0}%",
            t.consumers_cpu / ROUNDS as f64,
            t.brokers_cpu / ROUNDS as f64,
            100.0 * t.machine_busy / ROUNDS as f64
        );
    }
    let ratios: Vec<String> = round_ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "  ratio 3 / 1  : {:.2} reading (rounds {}), {:.2} to exit  (target ≥ 2)",
        trio.rate(trio.reading) / solo.rate(solo.reading),
        ratios.join(", "),
        trio.rate(trio.to_exit) / solo.rate(solo.to_exit)
    );
}

/// The sums of one kind of read over the rounds.
#[derive(Default)]
struct Totals {
    join: Duration,
    reading: Duration,
    to_exit: Duration,
    consumers_cpu: f64,
    brokers_cpu: f64,
    machine_busy: f64,
}

impl Totals {
    fn add(&mut self, r: &Read) {
        self.join += r.join;
        self.reading += r.reading;
        self.to_exit += r.to_exit;
        self.consumers_cpu += r.consumers_cpu;
        self.brokers_cpu += r.brokers_cpu;
        self.machine_busy += r.machine_busy;
    }

    /// Records per second over all rounds, taking `d` as their total time.
    fn rate(&self, d: Duration) -> f64 {
        (RECORDS * ROUNDS) as f64 / d.as_secs_f64()
    }
}
