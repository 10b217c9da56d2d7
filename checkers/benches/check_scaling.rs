//! How reading and checking scale: µs per op at 1M and 2M ops, the ratio of the two times, and
//! the memory the check needs. Goals: ≤ 5 µs per op on one core, time(2N) /
//! time(N) ≤ 2.2, memory in proportion to distinct values rather than ops.
//!
//! Times are CPU time of the checking thread (the machine is shared, so wall time varies with
//! whatever else runs), the best of a few runs. Each scenario runs in a child process (this binary with `--child`), so that its peak memory
//! is its own. The child simulates a correct run, serializes it to jsonl in memory, resets its
//! peak-RSS counter, then reads and checks the jsonl; the memory figure is the peak during
//! read + check minus the resident size just before it (which holds the jsonl text).
//! Run with `cargo bench -p tidemark-checkers`.
//!
//! Measured on the project's 2-vCPU machine (AMD EPYC, 32 MB L3), shared with other builds:
//!
//! | ops | sends | distinct values | CPU s | µs/op | read + check memory |
//! |---|---|---|---|---|---|
//! | 1M | 50% | 491k | 1.14 | 1.14 | 94 MB (191 B/value) |
//! | 2M | 50% | 981k | 2.30 | 1.15 | 220 MB (224 B/value) |
//! | 4M | 50% | 1.96M | 4.69 | 1.17 | 434 MB (222 B/value) |
//! | 2M | 10% | 197k | 2.35 | 1.18 | 54 MB (276 B/value) |
//!
//! time(2M)/time(1M) = 2.02, time(4M)/time(2M) = 2.04; the same 2M ops with a fifth of the
//! values need a quarter of the memory.
//!
//! The mirrored rows check the same runs as mirror runs: ops on cluster a, every replica copied
//! onto cluster b, a failover or failback every 1000 lines, so every mirror check (abandoned
//! writes, M3, M5, mirror divergence, epoch ownership) runs on every record. Measured side by
//! side with the one-cluster rows, on a busier machine (best of 3 runs per child, CPU s):
//!
//! | ops | one cluster, before the mirror checks | one cluster, with them | mirrored |
//! |---|---|---|---|
//! | 1M | 2.65 | 2.85 | 4.69 |
//! | 2M | 5.84 | 5.75 | 9.54 |
//!
//! One cluster: no slower within the machine's noise (each figure is the best of two rounds
//! of the two binaries alternated). Mirrored: time(2M)/time(1M) = 2.03, 1.66× the one-cluster
//! time with twice the replicas to read and compare.
//!
//! The apart row checks the one-cluster 2M run with two of its three brokers cut off from each
//! other throughout, so that `ack-below-min-isr` judges every acknowledgement (while no
//! brokers are apart it judges none). Five pairs alternated (2026-12-06, a busy machine), the
//! check's CPU s: apart 2.56–3.03, one cluster 2.45–2.98, ratio median 1.04 (0.996–1.17);
//! memory the same (≈ 207 MB).
#[path = "../tests/support/sim.rs"]
mod sim;

use std::process::Command;
use std::time::Instant;

use serde_json::json;
use sim::{simulate_into, SimConfig};
use tidemark_checkers::{check_history, read_history, read_replicas, Validity};

/// Read + check runs per scenario; the fastest is reported.
const RUNS: usize = 3;

/// How a scenario's run is laid out.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    OneCluster,
    /// Mirrored onto a second cluster.
    Mirrored,
    /// One cluster of three brokers, two of them cut off from each other for the whole run, so
    /// that every acknowledgement is judged by `ack-below-min-isr` (its worst case: none is
    /// when no brokers are apart).
    Apart,
}

/// (ops, percent of client ops that are sends, layout)
const SCENARIOS: [(usize, u64, Layout); 7] = [
    (1_000_000, 50, Layout::OneCluster),
    (2_000_000, 50, Layout::OneCluster),
    (4_000_000, 50, Layout::OneCluster),
    (2_000_000, 10, Layout::OneCluster),
    (1_000_000, 50, Layout::Mirrored),
    (2_000_000, 50, Layout::Mirrored),
    (2_000_000, 50, Layout::Apart),
];
/// Partitions of the simulated topic.
const PARTITIONS: i64 = 8;
/// History lines between a mirrored run's failovers and failbacks.
const CHANGE_EVERY: u64 = 1000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let ops = args[i + 1].parse().expect("ops");
        let send_percent = args[i + 2].parse().expect("send percent");
        let layout = match args.get(i + 3).map(String::as_str) {
            Some("mirrored") => Layout::Mirrored,
            Some("apart") => Layout::Apart,
            _ => Layout::OneCluster,
        };
        child(ops, send_percent, layout);
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs benchmarks too; this one takes minutes.
        println!("check_scaling: skipped (run it with `cargo bench -p tidemark-checkers`)");
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let mut rows = Vec::new();
    println!(
        "{:>9} {:>6} {:>8} {:>10} {:>8} {:>8} {:>9} {:>10} {:>12}",
        "ops",
        "sends%",
        "clusters",
        "values",
        "cpu s",
        "wall s",
        "µs/op",
        "check MB",
        "bytes/value"
    );
    for (ops, send_percent, layout) in SCENARIOS {
        let out = Command::new(&exe)
            .args(["--child", &ops.to_string(), &send_percent.to_string()])
            .args(match layout {
                Layout::OneCluster => None,
                Layout::Mirrored => Some("mirrored"),
                Layout::Apart => Some("apart"),
            })
            .output()
            .expect("run child");
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let row: serde_json::Value = serde_json::from_slice(&out.stdout).expect("child output");
        let secs = row["secs"].as_f64().unwrap();
        let wall = row["wall_secs"].as_f64().unwrap();
        let values = row["values"].as_u64().unwrap();
        let mem = row["check_bytes"].as_u64().unwrap();
        println!(
            "{:>9} {:>6} {:>8} {:>10} {:>8.2} {:>8.2} {:>9.2} {:>10.1} {:>12.0}",
            ops,
            send_percent,
            if layout == Layout::Mirrored { 2 } else { 1 },
            values,
            secs,
            wall,
            secs * 1e6 / ops as f64,
            mem as f64 / 1e6,
            mem as f64 / values as f64
        );
        rows.push((ops, send_percent, secs, mem));
    }
    let ratio = rows[1].2 / rows[0].2;
    println!("cpu time(2M)/time(1M) = {ratio:.2} (goal ≤ 2.2); µs/op is cpu time per op");
    // At 1M ops the hot tables still half fit in a 32 MB L3; from 2M on they do not, so the
    // next doubling shows the algorithm's own scaling.
    println!("cpu time(4M)/time(2M) = {:.2}", rows[2].2 / rows[1].2);
    println!(
        "memory at 2M ops: {:.1} MB with 50% sends, {:.1} MB with 10% sends (same ops, fewer values)",
        rows[1].3 as f64 / 1e6,
        rows[3].3 as f64 / 1e6
    );
    println!(
        "mirrored (a failover or failback every {CHANGE_EVERY} lines): cpu time(2M)/time(1M) = {:.2}; at 2M, {:.2}× the one-cluster time",
        rows[5].2 / rows[4].2,
        rows[5].2 / rows[1].2
    );
    println!(
        "two brokers apart for the whole run (every acknowledgement judged by ack-below-min-isr): at 2M, {:.2}× the one-cluster time",
        rows[6].2 / rows[1].2
    );
}

/// The simulated run as a mirror run: its ops on cluster a, its replicas copied onto cluster b,
/// and a failover to b or a failback of b (mirroring a again) every [`CHANGE_EVERY`] lines
/// (marks that abandon nothing, and a stays writable, so the verdict stays valid), so every
/// mirror check runs on every record.
fn mirror(op: &mut tidemark_checkers::Op, history: &mut Vec<u8>, next: &mut u64) {
    op.cluster = Some("a".into());
    if op.index < CHANGE_EVERY * (*next + 1) {
        return;
    }
    let (f, from, to) = if next.is_multiple_of(2) {
        ("failover", "a", "b")
    } else {
        ("failback", "a", "b")
    };
    *next += 1;
    let far = i64::MAX / 2;
    let marks: Vec<_> = (0..PARTITIONS)
        .map(|p| json!({"topic": "t", "partition": p, "lmle": far, "mirrored_offset": far, "epoch": 0}))
        .collect();
    let mark = json!({"from": from, "to": to, "topics": [], "partitions": marks});
    for (kind, value) in [("invoke", json!({})), ("info", mark)] {
        let line = json!({"index": op.index, "time": op.time, "process": "nemesis",
                          "type": kind, "f": f, "value": value, "cluster": to});
        serde_json::to_writer(&mut *history, &line).unwrap();
        history.push(b'\n');
        op.index += 1;
    }
}

fn child(ops: usize, send_percent: u64, layout: Layout) {
    let mirrored = layout == Layout::Mirrored;
    let cfg = SimConfig {
        seed: 42,
        ops,
        partitions: PARTITIONS,
        workers: 16,
        max_poll: 10,
        send_percent,
    };
    let mut test = json!({"workload": "queue"});
    if layout == Layout::Apart {
        let node = |n: &str| json!({"name": n, "cluster": "", "port": 9092});
        test["nodes"] = json!([node("n1"), node("n2"), node("n3")]);
        test["broker_config"] = json!({"min.insync.replicas": "2"});
    }
    let mut history = serde_json::to_vec(&json!({"tidemark_history": 1, "test": test})).unwrap();
    history.push(b'\n');
    if layout == Layout::Apart {
        let cut = json!({"grudge": {"n2": ["n3"], "n3": ["n2"]}});
        for (index, (kind, value)) in [("invoke", json!({})), ("info", cut)]
            .into_iter()
            .enumerate()
        {
            let line = json!({"index": index, "time": 0, "process": "nemesis", "type": kind,
                              "f": "start-partition", "value": value});
            serde_json::to_writer(&mut history, &line).unwrap();
            history.push(b'\n');
        }
    }
    let mut values = 0u64;
    // The cut's two lines come first in an apart run.
    let first = if layout == Layout::Apart { 2 } else { 0 };
    let (mut shift, mut changes) = (first, 0u64);
    let mut replicas = simulate_into(cfg, &mut |mut op| {
        if op.f == "send" && op.kind == tidemark_checkers::OpType::Invoke {
            values += op.value["values"].as_array().map_or(0, |v| v.len() as u64);
        }
        op.index += shift;
        if mirrored {
            let before = op.index;
            mirror(&mut op, &mut history, &mut changes);
            shift += op.index - before;
        }
        serde_json::to_writer(&mut history, &op).unwrap();
        history.push(b'\n');
    });
    if mirrored {
        let copies: Vec<_> = replicas
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.cluster = "b".into();
                r.node = format!("b-{}", r.node);
                r
            })
            .collect();
        for r in &mut replicas {
            r.cluster = "a".into();
        }
        replicas.extend(copies);
    }
    let mut replicas_text = Vec::new();
    for r in &replicas {
        serde_json::to_writer(&mut replicas_text, r).unwrap();
        replicas_text.push(b'\n');
    }
    drop(replicas);

    // Writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_kb("VmRSS");
    // The machine is shared: CPU time is what the check costs on one core, whatever else runs,
    // and the best of a few runs is the figure least disturbed by others.
    let (mut secs, mut wall) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..RUNS {
        let (start, cpu_start) = (Instant::now(), cpu_secs());
        let replicas = read_replicas(&replicas_text[..]).expect("replicas");
        let results = check_history(read_history(&history[..]).expect("header"), Some(&replicas))
            .expect("history");
        secs = secs.min(cpu_secs() - cpu_start);
        wall = wall.min(start.elapsed().as_secs_f64());
        assert_eq!(results.valid, Validity::Valid, "{}", results.summary(3));
    }
    let peak = status_kb("VmHWM");
    let check_bytes = if reset {
        peak.saturating_sub(before) * 1024
    } else {
        peak * 1024
    };
    println!(
        "{}",
        json!({"ops": ops, "values": values, "secs": secs, "wall_secs": wall,
               "check_bytes": check_bytes,
               "peak_reset": reset, "history_bytes": history.len()})
    );
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

/// A `kB` field of /proc/self/status.
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
