//! A simulated, correct queue: workers send and poll against partitions whose logs only grow,
//! while a nemesis kills and restarts leaders (bumping the leader epoch). It yields a history
//! and replica states that a correct checker must find clean. Shared by the property tests and
//! the scaling benchmark.

#![allow(dead_code)]

use serde_json::{json, Value};
use tidemark_checkers::{
    EpochEntry, Op, OpType, PollValue, Process, Record, ReplicaState, SendValue,
};

/// SplitMix64: small, fast, and good enough to drive a simulation from one seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What to simulate.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub seed: u64,
    /// History lines to produce (approximately: the last ops complete what is open).
    pub ops: usize,
    pub partitions: i64,
    pub workers: usize,
    /// Most records one poll returns.
    pub max_poll: i64,
    /// Share of new client ops that are sends (the rest are polls), in percent.
    pub send_percent: u64,
}

/// One partition's log: (value, epoch) at each offset; everything is committed.
#[derive(Debug, Default, Clone)]
struct Log {
    records: Vec<(i64, i64)>,
    epoch: i64,
}

/// The simulated run.
pub struct Sim {
    pub ops: Vec<Op>,
    pub replicas: Vec<ReplicaState>,
}

enum Open {
    Send { partition: i64, values: Vec<i64> },
    Poll { partition: i64, from: i64 },
}

/// Simulates a run, keeping every op.
pub fn simulate(cfg: SimConfig) -> Sim {
    let mut ops = Vec::with_capacity(cfg.ops);
    let replicas = simulate_into(cfg, &mut |op| ops.push(op));
    Sim { ops, replicas }
}

/// Simulates a run, handing each op to `sink` as it is made, and returns the replica states.
pub fn simulate_into(cfg: SimConfig, sink: &mut dyn FnMut(Op)) -> Vec<ReplicaState> {
    let mut rng = Rng::new(cfg.seed);
    let mut logs = vec![Log::default(); cfg.partitions as usize];
    let count = std::cell::Cell::new(0u64);
    // Each worker runs one process at a time; an `info` retires the process.
    let mut procs: Vec<u64> = (0..cfg.workers as u64).collect();
    let mut next_proc = cfg.workers as u64;
    let mut open: Vec<Option<Open>> = (0..cfg.workers).map(|_| None).collect();
    let mut next_value = 0i64;
    let mut killed = false;
    let mut push = |process, kind, f: &str, value| {
        let index = count.get();
        count.set(index + 1);
        sink(Op {
            index,
            time: index * 1_000,
            process,
            kind,
            f: f.to_owned(),
            value,
            node: Some("n1".into()),
            cluster: None,
            error: None,
        });
    };
    while (count.get() as usize) < cfg.ops {
        if rng.chance(1) {
            // A leader change: kill, then start, each an invoke and an info.
            let f = if killed { "start" } else { "kill" };
            killed = !killed;
            if killed {
                let p = rng.below(cfg.partitions as u64) as usize;
                logs[p].epoch += 1 + rng.below(3) as i64;
            }
            push(Process::Nemesis, OpType::Invoke, f, json!({}));
            push(Process::Nemesis, OpType::Info, f, json!({"nodes": ["n1"]}));
            continue;
        }
        let w = rng.below(cfg.workers as u64) as usize;
        let process = Process::Client(procs[w]);
        match open[w].take() {
            None => {
                let partition = rng.below(cfg.partitions as u64) as i64;
                if rng.chance(cfg.send_percent) {
                    let n = 1 + rng.below(3) as i64;
                    let values: Vec<i64> = (next_value..next_value + n).collect();
                    next_value += n;
                    let v = send_value(partition, &values, None);
                    push(process, OpType::Invoke, "send", v);
                    open[w] = Some(Open::Send { partition, values });
                } else {
                    let len = logs[partition as usize].records.len() as i64;
                    let from = rng.below(len as u64 + 1) as i64;
                    let v = poll_value(partition, from, Vec::new(), None, None);
                    push(process, OpType::Invoke, "poll", v);
                    open[w] = Some(Open::Poll { partition, from });
                }
            }
            Some(Open::Send { partition, values }) => {
                let log = &mut logs[partition as usize];
                let roll = rng.below(100);
                let (kind, applied) = match roll {
                    0..80 => (OpType::Ok, true),
                    80..90 => (OpType::Fail, false),
                    _ => (OpType::Info, rng.chance(50)),
                };
                let offset = log.records.len() as i64;
                if applied {
                    log.records.extend(values.iter().map(|&v| (v, log.epoch)));
                }
                // One acknowledgement in ten does not say its offset.
                let known = (kind == OpType::Ok && rng.below(10) != 0).then_some(offset);
                push(process, kind, "send", send_value(partition, &values, known));
                if kind == OpType::Info {
                    procs[w] = next_proc;
                    next_proc += 1;
                }
            }
            Some(Open::Poll { partition, from }) => {
                let log = &logs[partition as usize];
                let hw = log.records.len() as i64;
                let to = hw.min(from + 1 + rng.below(cfg.max_poll as u64) as i64);
                let records: Vec<Record> = (from..to)
                    .map(|o| {
                        let (v, e) = log.records[o as usize];
                        Record::new(o, v, e)
                    })
                    .collect();
                let v = poll_value(partition, from, records, Some(hw), Some(log.epoch));
                push(process, OpType::Ok, "poll", v);
            }
        }
    }
    logs.iter()
        .enumerate()
        .flat_map(|(p, log)| {
            let records: Vec<Record> = log
                .records
                .iter()
                .enumerate()
                .map(|(o, &(v, e))| Record::new(o as i64, v, e))
                .collect();
            let mut epochs: Vec<EpochEntry> = Vec::new();
            for r in &records {
                if epochs.last().is_none_or(|l| Some(l.epoch) != r.epoch) {
                    epochs.push(EpochEntry {
                        epoch: r.epoch.unwrap_or_default(),
                        start_offset: r.offset,
                    });
                }
            }
            let hw = records.len() as i64;
            ["n1", "n2", "n3"]
                .into_iter()
                .map(move |node| ReplicaState {
                    cluster: "a".into(),
                    node: node.into(),
                    topic: "t".into(),
                    partition: p as i64,
                    role: Some(if node == "n1" { "leader" } else { "follower" }.into()),
                    log_start_offset: Some(0),
                    high_watermark: Some(hw),
                    log_end_offset: Some(hw),
                    epochs: epochs.clone(),
                    records: records.clone(),
                    error: None,
                    tiered: None,
                    remote_bootstrap: None,
                    producers: None,
                    unclean_elections: Vec::new(),
                })
        })
        .collect()
}

fn send_value(partition: i64, values: &[i64], offset: Option<i64>) -> Value {
    let v = SendValue {
        topic: "t".into(),
        partition,
        values: values.to_vec(),
        offset,
    };
    serde_json::to_value(v).expect("a send value serializes")
}

fn poll_value(
    partition: i64,
    from: i64,
    records: Vec<Record>,
    hw: Option<i64>,
    leader_epoch: Option<i64>,
) -> Value {
    let v = PollValue {
        topic: "t".into(),
        partition,
        from,
        records,
        high_watermark: hw,
        leader_epoch,
        local_log_start: None,
        stale_epoch: false,
    };
    serde_json::to_value(v).expect("a poll value serializes")
}
