//! Recorded runs made for the tests: histories written with the checkers' op types, replica
//! states, results computed by the real checkers, node logs, all in a store laid out as
//! `tidemark test` lays it out.
// Each test binary uses some of these helpers.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tidemark_checkers::{check, Op, OpType, Process, Record, ReplicaState, UncleanElection};

/// The run directories' name: 2024-02-29T23:59:59.123Z, so logs can be stamped relative to it.
pub const STAMP: &str = "20240229T235959.123Z";
pub const START_UNIX_MS: i64 = 1_709_251_199_123;

/// Builds a history op by op, with dense indices and times in ms.
pub struct History {
    pub ops: Vec<Op>,
}

impl History {
    pub fn new() -> Self {
        History { ops: Vec::new() }
    }

    pub fn push(
        &mut self,
        ms: f64,
        process: Process,
        kind: OpType,
        f: &str,
        value: Value,
        error: Option<&str>,
    ) -> u64 {
        let index = self.ops.len() as u64;
        self.ops.push(Op {
            index,
            time: (ms * 1e6) as u64,
            process,
            kind,
            f: f.into(),
            value,
            node: matches!(process, Process::Client(_)).then(|| "n1".to_owned()),
            cluster: None,
            error: error.map(str::to_owned),
        });
        index
    }

    /// A send of `values` by `p` from `t0` to `t1`; returns the completion's index.
    pub fn send(
        &mut self,
        p: u64,
        (t0, t1): (f64, f64),
        topic: &str,
        values: &[i64],
        outcome: OpType,
        offset: Option<i64>,
    ) -> u64 {
        let v = json!({"topic": topic, "partition": 0, "values": values});
        self.push(
            t0,
            Process::Client(p),
            OpType::Invoke,
            "send",
            v.clone(),
            None,
        );
        let mut done = v;
        if let Some(o) = offset {
            done["offset"] = json!(o);
        }
        let error = (outcome != OpType::Ok).then_some("request timed out");
        self.push(t1, Process::Client(p), outcome, "send", done, error)
    }

    /// A poll by `p` returning `records` as (offset, value).
    pub fn poll(
        &mut self,
        p: u64,
        t0: f64,
        t1: f64,
        topic: &str,
        from: i64,
        records: &[(i64, i64)],
    ) -> u64 {
        let v = json!({"topic": topic, "partition": 0, "from": from});
        self.push(
            t0,
            Process::Client(p),
            OpType::Invoke,
            "poll",
            v.clone(),
            None,
        );
        let mut done = v;
        done["records"] = json!(records
            .iter()
            .map(|&(o, v)| json!([o, v, 1]))
            .collect::<Vec<_>>());
        self.push(t1, Process::Client(p), OpType::Ok, "poll", done, None)
    }

    /// A nemesis fault: invoke then info.
    pub fn nemesis(&mut self, t0: f64, t1: f64, f: &str, value: Value) {
        self.push(t0, Process::Nemesis, OpType::Invoke, f, json!({}), None);
        self.push(t1, Process::Nemesis, OpType::Info, f, value, None);
    }
}

pub fn replica(node: &str, role: &str, topic: &str, records: Vec<Record>, hw: i64) -> ReplicaState {
    ReplicaState {
        cluster: "a".into(),
        node: node.into(),
        topic: topic.into(),
        partition: 0,
        role: Some(role.into()),
        log_start_offset: Some(0),
        high_watermark: Some(hw),
        log_end_offset: Some(records.last().map_or(0, |r| r.offset + 1)),
        epochs: vec![(0, 0).into(), (1, 3).into()],
        records,
        error: None,
        tiered: None,
        remote_bootstrap: None,
        producers: None,
        unclean_elections: Vec::new(),
    }
}

/// Writes a run directory under `store/<name>/STAMP` with results from the checkers.
pub fn write_run(
    store: &Path,
    name: &str,
    test: Value,
    history: &History,
    replicas: &[ReplicaState],
) -> PathBuf {
    let dir = store.join(name).join(STAMP);
    std::fs::create_dir_all(dir.join("nodes")).unwrap();
    std::fs::write(
        dir.join("test.json"),
        serde_json::to_vec_pretty(&test).unwrap(),
    )
    .unwrap();
    let mut h = std::io::BufWriter::new(std::fs::File::create(dir.join("history.jsonl")).unwrap());
    writeln!(h, "{}", json!({"tidemark_history": 1, "test": test})).unwrap();
    for op in &history.ops {
        serde_json::to_writer(&mut h, op).unwrap();
        h.write_all(b"\n").unwrap();
    }
    h.flush().unwrap();
    let mut r = std::fs::File::create(dir.join("replicas.jsonl")).unwrap();
    for rep in replicas {
        writeln!(r, "{}", serde_json::to_string(rep).unwrap()).unwrap();
    }
    let results = check(&test, history.ops.iter().cloned(), Some(replicas));
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&results).unwrap(),
    )
    .unwrap();
    dir
}

/// A node log whose lines are stamped at `ms` after the run's start.
pub fn write_log(dir: &Path, node: &str, lines: &[(f64, &str)]) {
    let d = dir.join("nodes").join(node);
    std::fs::create_dir_all(&d).unwrap();
    let mut out = String::new();
    for (ms, text) in lines {
        let t = START_UNIX_MS as f64 + ms;
        let secs = (t / 1000.0).floor() as i64;
        let frac = ((t - secs as f64 * 1000.0) * 1000.0).round() as i64;
        let day = secs.rem_euclid(86_400);
        let date = if secs >= 1_709_251_200 {
            "2024-03-01"
        } else {
            "2024-02-29"
        };
        out.push_str(&format!(
            "{date}T{:02}:{:02}:{:02}.{frac:06}Z  INFO node{{id=1}}: {text}\n",
            day / 3600,
            day % 3600 / 60,
            day % 60
        ));
    }
    std::fs::write(d.join("broker.log"), out).unwrap();
    std::fs::write(
        d.join("server.properties"),
        "node.id=1\nunclean.leader.election.enable=false\n",
    )
    .unwrap();
}

/// A valid run: every acknowledged send is read back and held by every replica.
pub fn valid_run(store: &Path) -> PathBuf {
    let mut h = History::new();
    let mut records = Vec::new();
    for i in 0..40i64 {
        let t = i as f64 * 10.0;
        h.send(
            (i % 3) as u64,
            (t, t + 3.0 + (i % 5) as f64),
            "t",
            &[i + 1],
            OpType::Ok,
            Some(i),
        );
        records.push(Record::new(i, i + 1, 0));
    }
    h.nemesis(
        100.0,
        101.0,
        "start-partition",
        json!({"kind": "halves", "grudge": {"n1": ["n3"]}}),
    );
    h.nemesis(250.0, 251.0, "stop-partition", json!({}));
    let recs: Vec<(i64, i64)> = records.iter().map(|r| (r.offset, r.value)).collect();
    h.poll(3, 410.0, 415.0, "t", 0, &recs);
    let replicas: Vec<ReplicaState> = ["n1", "n2", "n3"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            replica(
                n,
                if i == 0 { "leader" } else { "follower" },
                "t",
                records.clone(),
                40,
            )
        })
        .collect();
    let dir = write_run(
        store,
        "steady",
        json!({"name": "steady", "seed": 7, "workload": "queue",
        "nemesis": ["partition"], "nodes": ["n1", "n2", "n3"]}),
        &h,
        &replicas,
    );
    write_log(
        &dir,
        "n1",
        &[
            (5.0, "started"),
            (120.0, "partition healed"),
            (400.0, "done"),
        ],
    );
    dir
}

/// An invalid run with lost writes, divergence, inconsistent offsets, a duplicate, an
/// unexpected value and a nonmonotonic poll, under partitions and a kill. `topic`, `fault` (an
/// extra instantaneous nemesis op) and `log_line` let the hostile test plant markup.
pub fn invalid_run(store: &Path, name: &str, topic: &str, fault: &str, log_line: &str) -> PathBuf {
    let mut h = History::new();
    let mut leader = Vec::new();
    for i in 0..30i64 {
        let t = i as f64 * 20.0;
        h.send(
            (i % 3) as u64,
            (t, t + 4.0 + (i % 7) as f64),
            topic,
            &[i + 1],
            OpType::Ok,
            Some(i),
        );
        leader.push(Record::new(i, i + 1, if i < 3 { 0 } else { 1 }));
    }
    h.nemesis(
        150.0,
        152.0,
        "start-partition",
        json!({"kind": "halves", "grudge": {"n1": ["n2", "n3"]}}),
    );
    // A strand is a kill too: its interval ends at the start of the node it killed.
    h.nemesis(
        200.0,
        205.0,
        "strand",
        json!({"nodes": ["n2"], "killed": "n2", "cut_ms": 4000}),
    );
    h.nemesis(250.0, 251.0, "start", json!({"nodes": ["n2"]}));
    h.nemesis(300.0, 301.0, "kill", json!({"nodes": ["n3"]}));
    // Acknowledged at offset 30, then lost: the final log holds another value there.
    let lost = h.send(1, (320.0, 330.0), topic, &[31], OpType::Ok, Some(30));
    h.send(2, (325.0, 900.0), topic, &[32], OpType::Info, None);
    leader.push(Record::new(30, 32, 2));
    h.nemesis(400.0, 402.0, "stop-partition", json!({}));
    h.nemesis(450.0, 451.0, "start", json!({"nodes": ["n3"]}));
    h.nemesis(500.0, 501.0, fault, json!({"why": fault}));
    // A poll that goes backwards and sees value 5 at a second offset.
    h.poll(0, 600.0, 610.0, topic, 10, &[(10, 11), (11, 12), (9, 5)]);
    // A poll that sees a value no send wrote.
    h.poll(1, 620.0, 630.0, topic, 20, &[(20, 21), (21, 777)]);
    let mut follower = leader.clone();
    follower[12] = Record::new(12, 555, 1);
    // n1 began epoch 2 at offset 30 by an unclean election, as its broker records it.
    let mut n1 = replica("n1", "leader", topic, leader.clone(), 31);
    n1.unclean_elections = vec![UncleanElection {
        leader_epoch: 2,
        log_end_offset: 30,
    }];
    let replicas = vec![
        n1,
        replica("n2", "follower", topic, follower, 31),
        replica("n3", "follower", topic, leader, 29),
    ];
    let dir = write_run(
        store,
        name,
        json!({"name": name, "seed": 11, "workload": "queue",
        "nemesis": ["partition", "kill"], "nodes": ["n1", "n2", "n3"]}),
        &h,
        &replicas,
    );
    write_log(
        &dir,
        "n1",
        &[
            (100.0, "leader for t-0 at epoch 1"),
            (320.0, "appended offset 30"),
            (325.0, log_line),
            (329.0, "truncating to 30 after epoch change"),
            (900.0, "done"),
        ],
    );
    write_log(
        &dir,
        "n2",
        &[
            (10.0, "follower"),
            (330.0, "fetch from n1 failed: connection refused"),
        ],
    );
    let _ = lost;
    dir
}

/// A run of `pairs` sends and polls (2 lines each) with a fault every 10 s and one lost write.
pub fn large_run(store: &Path, pairs: u64) -> PathBuf {
    let mut h = History::new();
    let mut records = Vec::new();
    let mut next_offset = 0i64;
    let mut value = 0i64;
    let lost_at = pairs / 2;
    let per_ms = 1.0;
    for i in 0..pairs {
        let t = i as f64 * per_ms;
        let p = i % 8;
        if i % 10_000 == 5_000 {
            h.nemesis(t, t + 0.5, "pause", json!({"nodes": ["n2"]}));
        } else if i % 10_000 == 8_000 {
            h.nemesis(t, t + 0.5, "resume", json!({"nodes": ["n2"]}));
        }
        if i % 5 == 4 {
            let from = (next_offset - 3).max(0);
            let recs: Vec<(i64, i64)> = records
                .iter()
                .filter(|r: &&Record| r.offset >= from)
                .map(|r| (r.offset, r.value))
                .collect();
            h.poll(p, t, t + 1.5, "t", from, &recs);
            continue;
        }
        value += 1;
        let lat = 2.0 + ((i * 7919) % 50) as f64 / 10.0;
        let outcome = if i % 997 == 0 {
            OpType::Fail
        } else {
            OpType::Ok
        };
        let offset = (outcome == OpType::Ok).then_some(next_offset);
        h.send(p, (t, t + lat), "t", &[value], outcome, offset);
        if outcome == OpType::Ok {
            if i != lost_at {
                records.push(Record::new(next_offset, value, 0));
            }
            next_offset += 1;
        }
    }
    let hw = next_offset;
    let replicas: Vec<ReplicaState> = ["n1", "n2", "n3"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            replica(
                n,
                if i == 0 { "leader" } else { "follower" },
                "t",
                records.clone(),
                hw,
            )
        })
        .collect();
    let dir = write_run(
        store,
        "large",
        json!({"name": "large", "seed": 3, "workload": "queue",
        "nemesis": ["pause"]}),
        &h,
        &replicas,
    );
    write_log(&dir, "n1", &[(1.0, "started")]);
    dir
}
