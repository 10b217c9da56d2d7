//! Do the nemeses find real bugs, and only real bugs? Each injectable bug the default fault mix
//! is meant to expose is run against a broker that has it, and the correct broker against the
//! same mix, which must stay valid.
//!
//! CI runs one short run per bug with a targeted mix and a seed known to catch it, and one run
//! of the correct broker under the default mix. Two bugs that one response shows
//! (`read-past-high-watermark`, `ack-before-replication`) are also run with no fault at all. `hw-truncation` is run against two scripted
//! handoffs (a kill-only mix caught it in some seeds on one machine and in none on another). `isr-join-before-caught-up` is run against two
//! scripted rolling restarts, and the correct broker against the same rolls. The mirroring bugs are each run against a
//! scripted schedule of failovers, failbacks and the faults around them that the bug's catalogue
//! entry needs (`--workload mirror --nemesis-schedule`), one seed each; a leader change in the
//! destination while it mirrors exposes `local-epoch-in-mirror-cache`. The full matrix (five seeds of 60 s per bug and
//! for the correct broker, under the default mix) and the time-to-detection benchmark take tens
//! of minutes, so they are `#[ignore]`d; run them with
//! `cargo test --test nemesis_detect -- --ignored --nocapture --test-threads 1`.

// Shared with the e2e crate, which uses all of it; this binary only some.
#[allow(dead_code)]
#[path = "e2e/support/engine.rs"]
mod engine_support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use engine_support::*;
use serde_json::Value;

/// The by-hand matrices and benchmark take turns: they measure detection, which two of them
/// at once would skew. The CI tests run beside each other, as in any run on a loaded machine.
static TURN: Mutex<()> = Mutex::new(());

/// How one run ended.
struct Verdict {
    valid: Option<bool>,
    anomalies: Vec<String>,
    run: PathBuf,
    wall_s: f64,
    _store: tempfile::TempDir,
}

/// Runs `tidemark test` with `args` and reads its verdict.
fn run(args: &[&str]) -> Verdict {
    let store = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = Command::new(tidemark())
        .arg("test")
        .args(args)
        .args(["--quiet", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let wall_s = started.elapsed().as_secs_f64();
    let run = std::fs::canonicalize(store.path().join("latest")).unwrap_or_default();
    let results: Option<Value> = std::fs::read(run.join("results.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let Some(results) = results else {
        panic!(
            "{args:?} produced no verdict (exit {:?}):\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let anomalies = results["bad_anomaly_types"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    Verdict {
        valid: results["valid"].as_bool(),
        anomalies,
        run,
        wall_s,
        _store: store,
    }
}

/// A run of a broker with an injected bug must be invalid and forbid `anomaly`; `context` is
/// added to the message when it is not.
fn assert_caught(v: &Verdict, anomaly: &str, context: &str) {
    assert_eq!(
        v.valid,
        Some(false),
        "the bug went unnoticed{context}: {}",
        v.run.display()
    );
    assert!(
        v.anomalies.iter().any(|a| a == anomaly),
        "{:?}",
        v.anomalies
    );
}

/// Runs `tidemark test` with `args(seed)` for each of `seeds` until a run is invalid; that run,
/// else the last. Timing decides as well as the seed, so a later seed gets a second chance.
fn first_invalid(seeds: &[&str], args: impl Fn(&str) -> Vec<String>) -> Verdict {
    let mut last = None;
    for seed in seeds {
        let args = args(seed);
        let v = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let caught = v.valid == Some(false);
        last = Some(v);
        if caught {
            break;
        }
    }
    last.expect("at least one seed")
}

/// `schedule` written where `--nemesis-schedule` reads it, in a directory that lives as long as
/// the returned guard.
fn schedule_file(schedule: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("schedule.json");
    std::fs::write(&file, schedule).unwrap();
    let path = file.display().to_string();
    (dir, path)
}

/// Keeps a run directory that shows a finding, for whoever investigates.
fn keep(v: &Verdict, what: &str) -> PathBuf {
    let dest = std::env::temp_dir().join(format!(
        "tidemark-finding-{what}-{}",
        v.run.file_name().unwrap().to_string_lossy()
    ));
    let _ = Command::new("cp").arg("-r").arg(&v.run).arg(&dest).status();
    dest
}

#[test]
fn the_correct_broker_stays_valid_under_the_default_mix() {
    require_root("the_correct_broker_stays_valid_under_the_default_mix");
    broker();
    let v = run(&["--time-limit", "30", "--seed", "2"]);
    assert_valid_and_clean(&v, "correct");
}

/// A run of the correct broker must be valid (else it is kept, as `what`, for whoever
/// investigates) and leave nothing behind.
fn assert_valid_and_clean(v: &Verdict, what: &str) {
    let kept = if v.valid == Some(true) {
        PathBuf::new()
    } else {
        keep(v, what)
    };
    assert_eq!(
        v.valid,
        Some(true),
        "{:?}; kept in {}",
        v.anomalies,
        kept.display()
    );
    let test: Value =
        serde_json::from_slice(&std::fs::read(v.run.join("test.json")).unwrap()).unwrap();
    assert_nothing_left(&test);
}

/// Two handoffs: a leader killed while the in-sync replica next in line is frozen, so the last
/// replica, which the bug makes truncate to its high watermark as it follows the frozen one,
/// leads next without having fetched again.
const HANDOFFS: &str = r#"[
  {"time_s": 3, "f": "handoff", "value": {}},
  {"time_s": 10, "f": "handoff", "value": {}}
]"#;

#[test]
fn a_follower_truncating_to_its_high_watermark_is_caught() {
    require_root("a_follower_truncating_to_its_high_watermark_is_caught");
    broker();
    let (_dir, schedule) = schedule_file(HANDOFFS);
    // The loss needs acknowledged records above the last replica's high watermark as the
    // leader dies, which load decides: later seeds get more chances (in a full suite on two
    // cores, seed 1 has missed).
    let v = first_invalid(&["1", "2", "3"], |seed| {
        [
            "--time-limit",
            "20",
            "--seed",
            seed,
            "--inject-bug",
            "hw-truncation",
            "--nemesis-schedule",
            &schedule,
        ]
        .map(String::from)
        .to_vec()
    });
    assert_caught(&v, "lost-write", "");
}

/// Two rolling restarts of two nodes each, each restarted node's replication capped at 2 kB/s
/// (below what the workload writes) until its roll ends: the second node's controlled shutdown
/// hands its leaderships to an in-sync replica, which the first may claim to be.
const ROLLS: &str = r#"[
  {"time_s": 3, "f": "roll",
   "value": {"nodes": ["n1", "n2"], "kbytes_per_s": 2, "down_ms": 2500, "wait_ms": 4000}},
  {"time_s": 16, "f": "roll",
   "value": {"nodes": ["n3", "n1"], "kbytes_per_s": 2, "down_ms": 2500, "wait_ms": 4000}}
]"#;

/// A rolling restart on `broker` (an injected bug or the correct one): its verdict, and for each
/// restarted node the seconds it took to be back in every ISR (`None`: not within the wait) and
/// the partitions it led as it was stopped.
fn rolls(bug: Option<&str>) -> (Verdict, Vec<(Option<u64>, Value)>) {
    let (_dir, schedule) = schedule_file(ROLLS);
    let mut args = vec![
        "--nemesis-schedule",
        &schedule,
        "--time-limit",
        "30",
        "--seed",
        "1",
    ];
    if let Some(bug) = bug {
        args.extend(["--inject-bug", bug]);
    }
    let v = run(&args);
    let history = std::fs::read_to_string(v.run.join("history.jsonl")).unwrap();
    let restarted: Vec<(Option<u64>, Value)> = history
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|o| o["f"] == "roll" && o["type"] == "info")
        .flat_map(|o| {
            o["value"]["restarted"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|r| (r["in_sync_ms"].as_u64(), r["led"].clone()))
        .collect();
    (v, restarted)
}

#[test]
fn a_replica_let_into_the_isr_before_it_caught_up_is_caught_by_a_rolling_restart() {
    require_root("a_replica_let_into_the_isr_before_it_caught_up_is_caught_by_a_rolling_restart");
    broker();
    let (v, restarted) = rolls(Some("isr-join-before-caught-up"));
    assert_eq!(restarted.len(), 4, "two rolls of two nodes: {restarted:?}");
    let in_sync: Vec<Option<u64>> = restarted.iter().map(|r| r.0).collect();
    assert_caught(
        &v,
        "lost-write",
        &format!(" (in sync after {in_sync:?} ms)"),
    );
}

#[test]
fn the_correct_broker_keeps_a_throttled_restarted_replica_out_of_the_isr_and_stays_valid() {
    require_root(
        "the_correct_broker_keeps_a_throttled_restarted_replica_out_of_the_isr_and_stays_valid",
    );
    broker();
    let (v, restarted) = rolls(None);
    assert_eq!(restarted.len(), 4, "two rolls of two nodes: {restarted:?}");
    // A node restarted under load cannot catch up at 2 kB/s: the operator's wait runs out.
    assert!(restarted.iter().any(|r| r.0.is_none()), "{restarted:?}");
    // Each stop records the leaderships it hands over; the rolls stop every node, so some stop
    // found its node leading.
    assert!(
        restarted.iter().all(|r| r.1.is_array()),
        "the cluster was read before each stop: {restarted:?}"
    );
    assert!(
        restarted
            .iter()
            .any(|r| r.1.as_array().is_some_and(|led| !led.is_empty())),
        "{restarted:?}"
    );
    assert_valid_and_clean(&v, "correct-roll");
}

/// Failover, then failback: B writes in the epoch it must have bumped.
const FAILOVER_FAILBACK: &str = r#"[
  {"time_s": 3, "f": "failover", "value": {}},
  {"time_s": 9, "f": "failback", "value": {}}
]"#;

/// Failover, then A's leader killed while clients not yet redirected still write to A: A holds
/// records of an epoch above the last mirrored one, which only the LMLE truncation removes when
/// A fails back (the DivergingEpoch answer cannot: B bumped to that same epoch).
const FAILOVER_KILL_FAILBACK: &str = r#"[
  {"time_s": 3, "f": "failover", "value": {}},
  {"time_s": 5, "f": "kill", "value": {"cluster": "a", "targets": "leader"}},
  {"time_s": 7, "f": "start", "value": {"cluster": "a", "nodes": ["a1", "a2", "a3"]}},
  {"time_s": 11, "f": "failback", "value": {}}
]"#;

/// The destination's partition leaders killed and restarted while it mirrors: each partition
/// gets a new leader in B, which must keep its epoch cache to the mirrored batches (M11).
const DESTINATION_LEADERS_KILLED: &str = r#"[
  {"time_s": 3, "f": "kill", "value": {"cluster": "b", "targets": "leaders"}},
  {"time_s": 5, "f": "start", "value": {"cluster": "b", "nodes": ["b1", "b2", "b3"]}}
]"#;

/// A mirror run replaying `schedule` for `time_limit` seconds with `args` besides.
fn mirror_run(schedule: &str, time_limit: &str, seed: &str, args: &[&str]) -> Verdict {
    let (_dir, file) = schedule_file(schedule);
    let mut all = vec![
        "--workload",
        "mirror",
        "--nemesis-schedule",
        &file,
        "--time-limit",
        time_limit,
        "--seed",
        seed,
    ];
    all.extend_from_slice(args);
    run(&all)
}

/// A failback cut short: the old source fails back (its split-brain writes under the mirrored
/// epoch, above where the other cluster's epoch ends), a strand cuts its new mirror leader off
/// from the followers moments later and kills it, an eligible follower that still held those
/// writes leads, and a failover makes that cluster writable again. The faults of a recorded
/// run of `--workload mirror --nemesis kill,failover --seed 3641` (60 s) that lost 361 writes
/// the other cluster had acknowledged: the LMLE truncation cut only at the end of the mirrored
/// epoch in its own log, leaving the rest to the first mirror fetch, which the new leader never
/// made. The broker now aligns the cut with the source's end of that epoch before the replicas
/// are waited for.
#[test]
fn a_failback_cut_short_by_a_leader_failure_keeps_what_the_source_acknowledged() {
    require_root("a_failback_cut_short_by_a_leader_failure_keeps_what_the_source_acknowledged");
    broker();
    let schedule = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/schedules/failback-strand-failover.json"
    ))
    .unwrap();
    let v = mirror_run(&schedule, "60", "3641", &[]);
    assert_valid_and_clean(&v, "correct-failback-cut-short");
}

/// Runs `bug` against `schedule` and asserts it is reported with `anomaly`.
fn mirror_bug_caught(bug: &str, schedule: &str, time_limit: &str, extra: &[&str], anomaly: &str) {
    broker();
    // Proactive epoch bumps keep each cluster's epochs far apart, so the epoch collisions these
    // bugs need rarely happen in a short run: off here, as in the broker's seed scenarios. A
    // cluster configured without them is one users run too.
    let mut args = vec![
        "--inject-bug",
        bug,
        "--broker-config",
        "mirror.epoch.bump.threshold=0",
    ];
    args.extend_from_slice(extra);
    let v = mirror_run(schedule, time_limit, "1", &args);
    assert_eq!(
        v.valid,
        Some(false),
        "{bug} went unnoticed: {}",
        keep(&v, bug).display()
    );
    assert!(
        v.anomalies.contains(&anomaly.to_string()),
        "{bug}: {:?}, {}",
        v.anomalies,
        keep(&v, bug).display()
    );
}

#[test]
fn a_failover_without_an_epoch_bump_is_caught() {
    require_root("a_failover_without_an_epoch_bump_is_caught");
    mirror_bug_caught(
        "no-epoch-bump-on-failover",
        FAILOVER_FAILBACK,
        "12",
        &[],
        "epoch-ownership",
    );
}

#[test]
fn a_failback_without_the_lmle_truncation_is_caught() {
    require_root("a_failback_without_the_lmle_truncation_is_caught");
    mirror_bug_caught(
        "skip-lmle-truncation",
        FAILOVER_KILL_FAILBACK,
        "14",
        &[],
        "mirror-divergence",
    );
}

/// Five seeds of 60 s under the default mix: each bug caught in four at least, the correct
/// broker valid in all five.
#[test]
#[ignore = "about 18 minutes; run by hand"]
fn detection_matrix() {
    require_root("detection_matrix");
    broker();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let mut table = Vec::new();
    for (bug, needed) in [
        ("ack-before-replication", 4),
        ("hw-truncation", 4),
        ("none", 5),
    ] {
        let mut hits = 0;
        let mut row = Vec::new();
        for seed in 1..=5 {
            let seed = seed.to_string();
            let mut args = vec!["--time-limit", "60", "--seed", &seed];
            if bug != "none" {
                args.extend(["--inject-bug", bug]);
            }
            let v = run(&args);
            let hit = if bug == "none" {
                v.valid == Some(true)
            } else {
                v.valid == Some(false)
            };
            hits += usize::from(hit);
            let note = if bug == "none" && !hit {
                format!(" kept in {}", keep(&v, "correct").display())
            } else {
                String::new()
            };
            row.push(format!(
                "seed {seed}: {:?} {:?}{note}",
                v.valid, v.anomalies
            ));
        }
        println!("{bug}: {hits}/5\n  {}", row.join("\n  "));
        table.push((bug, hits, needed));
    }
    for (bug, hits, needed) in table {
        assert!(hits >= needed, "{bug}: {hits}/5, needed {needed}");
    }
}

#[test]
fn a_mirror_leader_recording_its_own_epoch_is_caught() {
    require_root("a_mirror_leader_recording_its_own_epoch_is_caught");
    mirror_bug_caught(
        "local-epoch-in-mirror-cache",
        DESTINATION_LEADERS_KILLED,
        "10",
        &[],
        "mirror-epoch-cache",
    );
}

/// The issue's matrix: `--workload mirror --nemesis failover,partition,kill,unclean
/// --time-limit 60` over five seeds, the correct broker valid in all five and each mirroring
/// bug reported invalid, with an anomaly its catalogue entry names, in four at least. The bug
/// runs turn proactive epoch bumps off (as `mirror_bug_caught` does), and
/// `isr-only-lmle-truncation` runs with `mirror.support.unclean.leader.election` on, the only
/// setting under which it differs from the correct broker.
#[test]
#[ignore = "about 45 minutes; run by hand"]
fn mirror_detection_matrix() {
    require_root("mirror_detection_matrix");
    broker();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let no_bumps = ["--broker-config", "mirror.epoch.bump.threshold=0"];
    let rows: [(&str, &[&str], &[&str]); 5] = [
        ("none", &[], &[]),
        (
            "no-epoch-bump-on-failover",
            &no_bumps,
            &["mirror-divergence", "epoch-ownership"],
        ),
        (
            "skip-lmle-truncation",
            &no_bumps,
            &["mirror-divergence", "lmle-truncation"],
        ),
        (
            "isr-only-lmle-truncation",
            &[
                "--mirror-unclean-support",
                "--broker-config",
                "mirror.epoch.bump.threshold=0",
            ],
            &["lmle-truncation", "mirror-divergence"],
        ),
        (
            "local-epoch-in-mirror-cache",
            &no_bumps,
            &["mirror-divergence", "mirror-epoch-cache"],
        ),
    ];
    let mut table = Vec::new();
    for (bug, extra, named) in rows {
        let mut hits = 0;
        for seed in 1..=5 {
            let seed = seed.to_string();
            let mut args = vec![
                "--workload",
                "mirror",
                "--nemesis",
                "failover,partition,kill,unclean",
                "--time-limit",
                "60",
                "--seed",
                &seed,
            ];
            if bug != "none" {
                args.extend(["--inject-bug", bug]);
            }
            args.extend_from_slice(extra);
            let v = run(&args);
            let hit = if bug == "none" {
                v.valid == Some(true)
            } else {
                v.valid == Some(false) && named.iter().any(|a| v.anomalies.iter().any(|x| x == a))
            };
            hits += usize::from(hit);
            let kept = if hit {
                String::new()
            } else {
                format!(" kept in {}", keep(&v, bug).display())
            };
            println!("{bug} seed {seed}: {:?} {:?}{kept}", v.valid, v.anomalies);
        }
        table.push((bug, hits, if bug == "none" { 5 } else { 4 }));
    }
    for (bug, hits, needed) in table {
        assert!(hits >= needed, "{bug}: {hits}/5, needed {needed}");
    }
}

/// For each bug and five seeds: test seconds (main phases of 20 s runs, seeds s, s+100, ...)
/// until the first run that reports it; prints the median.
#[test]
#[ignore = "tens of minutes; run by hand"]
fn detection_benchmark() {
    require_root("detection_benchmark");
    broker();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    const RUN_S: u64 = 20;
    const MAX_RUNS: u64 = 6;
    for bug in ["ack-before-replication", "hw-truncation"] {
        let mut seconds = Vec::new();
        let mut walls = Vec::new();
        for seed in 1..=5u64 {
            let mut total = 0;
            let mut wall = 0.0;
            let mut found = false;
            for k in 0..MAX_RUNS {
                let s = (seed + 100 * k).to_string();
                let limit = RUN_S.to_string();
                let v = run(&["--time-limit", &limit, "--seed", &s, "--inject-bug", bug]);
                total += RUN_S;
                wall += v.wall_s;
                if v.valid == Some(false) {
                    found = true;
                    break;
                }
            }
            seconds.push(if found { total } else { u64::MAX });
            walls.push(wall);
        }
        let mut sorted = seconds.clone();
        sorted.sort_unstable();
        let median = sorted[2];
        println!(
            "{bug}: test seconds to detection per seed {seconds:?} (wall {:?}); median {}",
            walls.iter().map(|w| w.round() as u64).collect::<Vec<_>>(),
            if median == u64::MAX {
                "not found".to_string()
            } else {
                median.to_string()
            }
        );
    }
}

/// Runs the default mix at 30 s against `bug` with each of `seeds` until one is invalid, and
/// checks it reports one of `anomalies`. The seeds are ones `tidemark bench-detection` saw catch
/// the bug (docs/detection.md); timing decides too, so a seed that caught it once may not again.
fn caught_by_the_default_mix(bug: &str, seeds: &[&str], anomalies: &[&str]) {
    broker();
    let v = first_invalid(seeds, |seed| {
        ["--time-limit", "30", "--seed", seed, "--inject-bug", bug]
            .map(String::from)
            .to_vec()
    });
    assert_eq!(
        v.valid,
        Some(false),
        "{bug} went unnoticed: {}",
        v.run.display()
    );
    assert!(
        v.anomalies.iter().any(|a| anomalies.contains(&a.as_str())),
        "{bug}: {:?}",
        v.anomalies
    );
}

#[test]
#[ignore = "the fault-free test below catches it in 10 s; this one shows the default mix does too; run by hand"]
fn a_leader_serving_consumers_past_the_high_watermark_is_caught() {
    require_root("a_leader_serving_consumers_past_the_high_watermark_is_caught");
    caught_by_the_default_mix(
        "read-past-high-watermark",
        &["1", "2"],
        &[
            "read-above-high-watermark",
            "inconsistent-offsets",
            "aborted-read",
        ],
    );
}

/// What one response shows needs no fault: a fetch that returned records at or above the high
/// watermark it reported.
#[test]
fn a_leader_serving_past_its_high_watermark_is_caught_without_a_fault() {
    require_root("a_leader_serving_past_its_high_watermark_is_caught_without_a_fault");
    caught_without_a_fault("read-past-high-watermark", "read-above-high-watermark");
}

/// Nor an acknowledgement the ISR did not hold yet: a later poll of the same leader in the
/// same epoch reports the high watermark below the acknowledged record.
#[test]
fn a_leader_acknowledging_before_replication_is_caught_without_a_fault() {
    require_root("a_leader_acknowledging_before_replication_is_caught_without_a_fault");
    caught_without_a_fault("ack-before-replication", "ack-above-high-watermark");
}

/// Runs `bug` for 10 s with no faults (seed 1, then seed 2 should a poll have missed the
/// window) and checks the verdict forbids `anomaly`.
fn caught_without_a_fault(bug: &str, anomaly: &str) {
    broker();
    let v = first_invalid(&["1", "2"], |seed| {
        [
            "--nemesis",
            "none",
            "--time-limit",
            "10",
            "--seed",
            seed,
            "--inject-bug",
            bug,
        ]
        .map(String::from)
        .to_vec()
    });
    assert_caught(&v, anomaly, " without a fault");
}

/// One partition's leader cut off from its followers on the brokers' listeners for 6 s, the
/// controllers still reaching it: its ISR shrinks to itself, below `min.insync.replicas`.
const REPLICATION_CUT: &str = r#"[
  {"time_s": 2, "f": "start-partition", "value": {"kind": "leader-replication"}},
  {"time_s": 8, "f": "stop-partition", "value": {}}
]"#;

/// A leader whose ISR is itself alone must refuse acks=all writes; one that takes them is
/// caught by the acknowledgements no follower could have fetched while the cut held, with no
/// failure after it. The correct broker answers NOT_ENOUGH_REPLICAS under the same cut.
#[test]
fn a_leader_acknowledging_with_its_isr_below_the_minimum_is_caught_during_the_cut() {
    require_root("a_leader_acknowledging_with_its_isr_below_the_minimum_is_caught_during_the_cut");
    broker();
    let (_dir, schedule) = schedule_file(REPLICATION_CUT);
    let schedule = schedule.as_str();
    let args = |bug: &'static [&'static str]| {
        let mut a = vec![
            "--nemesis-schedule",
            schedule,
            "--time-limit",
            "12",
            "--seed",
            "1",
        ];
        a.extend(bug);
        a
    };
    let v = run(&args(&["--inject-bug", "no-strict-min-isr"]));
    assert_caught(&v, "ack-below-min-isr", " by a replication cut");
    assert_valid_and_clean(&run(&args(&[])), "correct-under-a-replication-cut");
}

/// The `info` of the run's one `last-stand`.
fn last_stand_info(v: &Verdict) -> Value {
    std::fs::read_to_string(v.run.join("history.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|o| o["f"] == "last-stand" && o["type"] == "info")
        .expect("a last-stand info")
}

/// Kafka's eligible leader replicas test as one move: a partition's followers leave one by one
/// with writes between, the leader alone is killed, the followers come back.
const LAST_STAND: &str = r#"[
  {"time_s": 3, "f": "last-stand", "value": {}},
  {"time_s": 16, "f": "start", "value": {}}
]"#;

/// The correct broker elects the follower whose leaving took the ISR below the minimum (an
/// eligible leader replica, KIP-966), never the one that left first, and loses nothing; a
/// leader that acknowledges alone in its ISR loses what it took once that replica leads, and
/// the history proves it acknowledged with no follower able to hold the records. Each seed
/// draws how the followers leave (on three combined nodes, one stopped leaves the other cut off:
/// a second down would leave the controllers no majority).
#[test]
fn a_leader_left_alone_by_its_followers_hands_over_to_an_eligible_replica() {
    require_root("a_leader_left_alone_by_its_followers_hands_over_to_an_eligible_replica");
    broker();
    let (_dir, schedule) = schedule_file(LAST_STAND);
    let args = |seed: &'static str, bug: &'static [&'static str]| {
        let mut a = vec![
            "--nemesis-schedule",
            schedule.as_str(),
            "--time-limit",
            "22",
            "--seed",
            seed,
        ];
        a.extend(bug);
        a
    };
    for seed in ["1", "2"] {
        let v = run(&args(seed, &[]));
        assert_valid_and_clean(&v, "correct-under-a-last-stand");
        let info = last_stand_info(&v);
        let stand = &info["value"];
        assert!(info.get("error").is_none(), "{info}");
        assert_eq!(stand["nodes"], serde_json::json!([stand["killed"].clone()]));
        let left = stand["left"].as_array().unwrap();
        assert_eq!(left.len(), 2, "{info}");
        // Each follower was out of the ISR once it had left.
        for d in left {
            let isr = d["isr"].as_array().unwrap();
            assert!(!isr.contains(&d["node"]), "{info}");
        }
        assert_eq!(
            stand["isr_at_kill"],
            serde_json::json!([stand["killed"].clone()])
        );
        // The last to leave is the eligible one, unless it crashed: then none is until the
        // leader is back, and the election is not waited for.
        if left[1]["how"] == "crash" {
            assert!(stand.get("elected").is_none(), "{info}");
        } else {
            assert_eq!(stand["elected"], left[1]["node"], "{info}");
        }
    }
    // The last follower cut off, so that acknowledgements wait on it as the ISR shrinks (a
    // controlled shutdown leaves none waiting): the bug answers them once the leader is alone.
    let (_cut_dir, cut_last) =
        schedule_file(&LAST_STAND.replacen("{}", r#"{"how": ["crash", "cut"]}"#, 1));
    let v = run(&[
        "--nemesis-schedule",
        &cut_last,
        "--time-limit",
        "22",
        "--seed",
        "1",
        "--inject-bug",
        "no-strict-min-isr",
    ]);
    assert_caught(&v, "lost-write", " by a last stand");
    assert_caught(&v, "ack-below-min-isr", " by a last stand");
}

/// The same, the last follower leaving by a power loss (it comes back without what it had not
/// fsynced: an unclean shutdown takes it out of the eligible replicas, KIP-966), the first cut
/// off; the schedule's ask for a power loss puts the data directories on tidemark-powerfs.
const LAST_STAND_POWER: &str = r#"[
  {"time_s": 3, "f": "last-stand", "value": {"how": ["cut", "power-loss"]}},
  {"time_s": 16, "f": "start", "value": {}}
]"#;

/// With no eligible replica left, only the last leader may lead, once it is back: the correct
/// broker waits for it and loses nothing. (A controller that keeps a replica back from an
/// unclean shutdown eligible elects the one that lost records; docs/detection.md.)
#[test]
fn a_follower_back_from_a_power_loss_is_not_eligible_and_nothing_is_lost() {
    require_root("a_follower_back_from_a_power_loss_is_not_eligible_and_nothing_is_lost");
    broker();
    let (_dir, schedule) = schedule_file(LAST_STAND_POWER);
    let v = run(&[
        "--nemesis-schedule",
        &schedule,
        "--time-limit",
        "22",
        "--seed",
        "1",
    ]);
    assert_valid_and_clean(&v, "correct-under-a-last-stand-with-a-power-loss");
    let test: Value =
        serde_json::from_slice(&std::fs::read(v.run.join("test.json")).unwrap()).unwrap();
    assert_eq!(test["nemesis"], serde_json::json!(["kill", "power"]));
    let info = last_stand_info(&v);
    assert!(info.get("error").is_none(), "{info}");
    let left = info["value"]["left"].as_array().unwrap();
    assert_eq!(left[0]["how"], "cut", "{info}");
    assert_eq!(left[1]["how"], "power-loss", "{info}");
    assert!(
        left[1]["dropped"].is_object() && left[1]["seed"].is_u64(),
        "{info}"
    );
    // Not waited for: no replica was eligible until the last leader came back.
    assert!(info["value"].get("elected").is_none(), "{info}");
}

#[test]
#[ignore = "the default mix catches it in 5 to 8 of 10 seeds at 30 s, not every one (docs/detection.md); run by hand"]
fn a_leader_acknowledging_as_it_loses_leadership_is_caught() {
    require_root("a_leader_acknowledging_as_it_loses_leadership_is_caught");
    caught_by_the_default_mix(
        "ack-on-leadership-loss",
        &["1", "2"],
        &["lost-write", "inconsistent-offsets"],
    );
}
