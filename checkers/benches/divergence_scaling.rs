//! How the divergence check scales with the replicas of one partition. Each replica is compared
//! with one reference per offset, so the time should grow with the records (replicas × offsets),
//! not with the pairs of replicas: doubling the replicas should about double the time.
//!
//! Each scenario is one partition of `replicas` replicas of `OFFSETS` records. One replica holds
//! another value at ten offsets, one lacks a record, and every follower holds another epoch than
//! the leader at the last offset: 12 divergent offsets, whatever the number of replicas. Times
//! are CPU time of this thread, the best of a few runs. Run with `cargo bench -p
//! tidemark-checkers --bench divergence_scaling`.
//!
//! Measured on the project's 2-vCPU machine, shared with other builds:
//!
//! | replicas | records | CPU s | divergent offsets |
//! |---|---|---|---|
//! | 3,000 | 600k | 0.05 | 12 |
//! | 6,000 | 1.2M | 0.10 | 12 |
//! | 12,000 | 2.4M | 0.23 | 12 |
//!
//! time(6000)/time(3000) = 2.00, time(12000)/time(6000) = 2.28. Before the reference-per-offset
//! comparison (every pair of replicas compared), the Hardening issue measured 150 s and
//! 224,925,000 reported divergences (one per pair of replicas and offset) for 3,000 replicas.

use serde_json::json;
use tidemark_checkers::{check, EpochEntry, Record, ReplicaState};

/// Records per replica.
const OFFSETS: i64 = 200;
/// Checks per scenario; the fastest is reported.
const RUNS: usize = 3;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs benchmarks too.
        println!("divergence_scaling: skipped (run it with `cargo bench -p tidemark-checkers`)");
        return;
    }
    println!(
        "{:>9} {:>9} {:>8} {:>10}",
        "replicas", "records", "cpu s", "divergent"
    );
    let mut times = Vec::new();
    for replicas in [3000, 6000, 12000] {
        let states = states(replicas);
        let mut best = f64::INFINITY;
        let mut divergent = 0;
        for _ in 0..RUNS {
            let start = cpu_secs();
            let r = check(&json!({"workload": "queue"}), Vec::new(), Some(&states));
            best = best.min(cpu_secs() - start);
            divergent = r.anomaly_counts.get("divergence").copied().unwrap_or(0);
        }
        println!(
            "{:>9} {:>9} {:>8.2} {:>10}",
            replicas,
            replicas as i64 * OFFSETS,
            best,
            divergent
        );
        times.push(best);
    }
    println!(
        "cpu time(6000)/time(3000) = {:.2}, time(12000)/time(6000) = {:.2} (linear: 2)",
        times[1] / times[0],
        times[2] / times[1]
    );
}

/// `n` replicas of t/0 as the module docs describe.
fn states(n: usize) -> Vec<ReplicaState> {
    (0..n)
        .map(|i| {
            let mut records: Vec<Record> = (0..OFFSETS).map(|o| Record::new(o, o, 0)).collect();
            if i == 7 {
                for r in &mut records[..10] {
                    r.value += 1_000_000;
                }
            }
            if i == 9 {
                records.remove(20);
            }
            if i > 0 {
                records.last_mut().expect("records").epoch = Some(1);
            }
            ReplicaState {
                cluster: "a".into(),
                node: format!("n{i}"),
                topic: "t".into(),
                partition: 0,
                role: Some(if i == 0 { "leader" } else { "follower" }.into()),
                log_start_offset: Some(0),
                high_watermark: Some(OFFSETS),
                log_end_offset: Some(OFFSETS),
                epochs: vec![EpochEntry {
                    epoch: 0,
                    start_offset: 0,
                }],
                records,
                error: None,
                tiered: None,
                remote_bootstrap: None,
                producers: None,
                unclean_elections: Vec::new(),
            }
        })
        .collect()
}

/// CPU time this thread has run, from the scheduler's own account (nanoseconds on the CPU).
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: u64 = stat
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("cpu ns");
    ns as f64 / 1e9
}
