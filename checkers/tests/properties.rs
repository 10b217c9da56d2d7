//! Property tests: histories of a simulated correct queue are clean, and one mutation of the
//! final replica states always produces the matching anomaly.

mod support;

use proptest::prelude::*;
use serde_json::json;
use support::sim::{simulate, Rng, SimConfig};
use support::{replicas_jsonl, to_jsonl};
use tidemark_checkers::{
    check, check_history, read_history, read_replicas, OpType, Record, ReplicaState, Results,
    Validity,
};

fn config(seed: u64, ops: usize, partitions: i64) -> SimConfig {
    SimConfig {
        seed,
        ops,
        partitions,
        workers: 4,
        max_poll: 6,
        send_percent: 50,
    }
}

fn kinds(r: &Results) -> Vec<String> {
    r.anomaly_types.clone()
}

/// Values whose send completed `ok` with an offset, as (partition, offset, value).
fn acked(ops: &[tidemark_checkers::Op]) -> Vec<(i64, i64, i64)> {
    ops.iter()
        .filter(|o| o.f == "send" && o.kind == OpType::Ok)
        .filter_map(|o| {
            let first = o.value.get("offset")?.as_i64()?;
            let p = o.value["partition"].as_i64()?;
            let vals = o.value["values"].as_array()?;
            Some(
                vals.iter()
                    .enumerate()
                    .map(move |(i, v)| (p, first + i as i64, v.as_i64().unwrap()))
                    .collect::<Vec<_>>(),
            )
        })
        .flatten()
        .collect()
}

fn replicas_of(
    replicas: &mut [ReplicaState],
    partition: i64,
) -> impl Iterator<Item = &mut ReplicaState> {
    replicas
        .iter_mut()
        .filter(move |r| r.partition == partition)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn simulated_correct_histories_are_clean(seed in any::<u64>(), ops in 20usize..400, partitions in 1i64..4) {
        let sim = simulate(config(seed, ops, partitions));
        let test = json!({"workload": "queue"});
        let r = check(&test, sim.ops.clone(), Some(&sim.replicas));
        prop_assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
        prop_assert_ne!(r.valid, Validity::Invalid);
        let without = check(&json!({}), sim.ops.clone(), None);
        prop_assert!(without.anomaly_types.is_empty(), "{}", without.summary(5));
        // The same run through the jsonl readers gives the same verdict.
        let text = to_jsonl(&test, &sim.ops);
        let replicas = read_replicas(replicas_jsonl(&sim.replicas).as_bytes()).unwrap();
        prop_assert_eq!(&replicas, &sim.replicas);
        let streamed = check_history(read_history(text.as_bytes()).unwrap(), Some(&replicas)).unwrap();
        prop_assert_eq!(streamed, r);
    }

    #[test]
    fn dropping_an_acknowledged_record_is_a_lost_write(seed in any::<u64>(), ops in 40usize..300, pick in any::<u64>()) {
        let sim = simulate(config(seed, ops, 2));
        let acked = acked(&sim.ops);
        prop_assume!(!acked.is_empty());
        let (p, offset, value) = acked[(pick % acked.len() as u64) as usize];
        let mut replicas = sim.replicas.clone();
        for r in replicas_of(&mut replicas, p) {
            r.records.retain(|x| x.offset != offset);
        }
        let r = check(&json!({}), sim.ops.clone(), Some(&replicas));
        prop_assert!(kinds(&r).contains(&"lost-write".to_owned()), "{}", r.summary(5));
        prop_assert!(r.anomalies["lost-write"].iter().any(|e| e["value"] == value));
        prop_assert_eq!(r.valid, Validity::Invalid);
    }

    #[test]
    fn swapping_two_values_is_inconsistent_offsets(seed in any::<u64>(), ops in 40usize..300, pick in any::<u64>()) {
        let sim = simulate(config(seed, ops, 1));
        let acked = acked(&sim.ops);
        prop_assume!(!acked.is_empty());
        let (_, a, _) = acked[(pick % acked.len() as u64) as usize];
        let len = sim.replicas[0].records.len() as i64;
        prop_assume!(len > 1);
        let b = if a + 1 < len { a + 1 } else { a - 1 };
        let mut replicas = sim.replicas.clone();
        for r in replicas.iter_mut() {
            let (va, vb) = (r.records[a as usize].value, r.records[b as usize].value);
            r.records[a as usize].value = vb;
            r.records[b as usize].value = va;
        }
        let r = check(&json!({}), sim.ops.clone(), Some(&replicas));
        prop_assert!(kinds(&r).contains(&"inconsistent-offsets".to_owned()), "{}", r.summary(5));
        prop_assert!(r.anomalies["inconsistent-offsets"].iter().any(|e| e["offset"] == a));
    }

    #[test]
    fn duplicating_a_record_is_a_duplicate(seed in any::<u64>(), ops in 20usize..300, pick in any::<u64>()) {
        let sim = simulate(config(seed, ops, 1));
        let len = sim.replicas[0].records.len();
        prop_assume!(len > 0);
        let copied = sim.replicas[0].records[(pick % len as u64) as usize];
        let mut replicas = sim.replicas.clone();
        for r in replicas.iter_mut() {
            r.records.push(Record { offset: len as i64, ..copied });
            r.high_watermark = Some(len as i64 + 1);
        }
        let r = check(&json!({}), sim.ops.clone(), Some(&replicas));
        prop_assert!(kinds(&r).contains(&"duplicate".to_owned()), "{}", r.summary(5));
        prop_assert!(r.anomalies["duplicate"].iter().any(|e| e["value"] == copied.value));
    }

    #[test]
    fn lowering_an_epoch_is_an_epoch_regression(seed in any::<u64>(), ops in 20usize..300, pick in any::<u64>(), which in 0usize..3) {
        let sim = simulate(config(seed, ops, 1));
        let len = sim.replicas[0].records.len();
        prop_assume!(len > 1);
        let i = 1 + (pick % (len as u64 - 1)) as usize;
        let mut replicas = sim.replicas.clone();
        let r = &mut replicas[which];
        r.records[i].epoch = Some(r.records[i - 1].epoch.unwrap() - 1);
        let node = r.node.clone();
        let r = check(&json!({}), sim.ops.clone(), Some(&replicas));
        prop_assert!(kinds(&r).contains(&"epoch-regression".to_owned()), "{}", r.summary(5));
        prop_assert!(r.anomalies["epoch-regression"].iter().any(|e| e["node"] == node.as_str()));
    }

    #[test]
    fn changing_one_replicas_record_is_a_divergence(seed in any::<u64>(), ops in 20usize..300, pick in any::<u64>(), which in 0usize..3) {
        let sim = simulate(config(seed, ops, 1));
        let len = sim.replicas[0].records.len();
        prop_assume!(len > 0);
        let i = (pick % len as u64) as usize;
        let mut replicas = sim.replicas.clone();
        replicas[which].records[i].value = -1 - i as i64;
        let r = check(&json!({}), sim.ops.clone(), Some(&replicas));
        prop_assert!(kinds(&r).contains(&"divergence".to_owned()), "{}", r.summary(5));
        prop_assert!(r.anomalies["divergence"].iter().any(|e| e["offset"] == i as i64));
        prop_assert_eq!(r.valid, Validity::Invalid);
    }
}

/// The simulated run on cluster a, mirrored exactly onto cluster b.
fn mirrored(seed: u64, ops: usize) -> (Vec<tidemark_checkers::Op>, Vec<ReplicaState>) {
    let sim = simulate(config(seed, ops, 2));
    let mut ops = sim.ops;
    for op in &mut ops {
        op.cluster = Some("a".into());
    }
    let mut replicas = sim.replicas.clone();
    replicas.extend(sim.replicas.into_iter().map(|mut r| {
        r.cluster = "b".into();
        r.node = format!("{}b", r.node);
        r
    }));
    (ops, replicas)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_changed_mirror_record_is_mirror_divergence(seed in any::<u64>(), ops in 40usize..300, pick in any::<u64>()) {
        let (ops, mut replicas) = mirrored(seed, ops);
        let clean = check(&json!({}), ops.clone(), Some(&replicas));
        prop_assert!(clean.anomaly_types.is_empty(), "{}", clean.summary(5));
        let len = replicas[0].records.len();
        prop_assume!(len > 0);
        let i = (pick % len as u64) as usize;
        for r in replicas.iter_mut().filter(|r| r.cluster == "b" && r.partition == 0) {
            r.records[i].value = -1 - i as i64;
        }
        let r = check(&json!({}), ops, Some(&replicas));
        prop_assert!(kinds(&r).contains(&"mirror-divergence".to_owned()), "{}", r.summary(5));
        prop_assert!(r.anomalies["mirror-divergence"].iter().any(|e| e["offset"] == i as i64));
    }
}

/// Corrupted files never panic: they are bad input or get a verdict.
#[test]
fn corrupted_files_never_panic() {
    let sim = simulate(config(7, 300, 2));
    let history = to_jsonl(&json!({"nemesis": ["kill"]}), &sim.ops).into_bytes();
    let replicas = replicas_jsonl(&sim.replicas).into_bytes();
    let mut rng = Rng::new(99);
    let (mut bad, mut judged) = (0, 0);
    for round in 0..400 {
        let target = if round % 4 == 3 { &replicas } else { &history };
        let mut text = target.clone();
        for _ in 0..1 + rng.below(4) {
            corrupt(&mut text, &mut rng);
        }
        let (h, r) = if round % 4 == 3 {
            (&history, &text)
        } else {
            (&text, &replicas)
        };
        let Ok(replicas) = read_replicas(&r[..]) else {
            bad += 1;
            continue;
        };
        match read_history(&h[..]).and_then(|h| check_history(h, Some(&replicas))) {
            Ok(_) => judged += 1,
            Err(_) => bad += 1,
        }
    }
    assert!(bad > 0 && judged > 0, "bad {bad}, judged {judged}");
}

fn corrupt(text: &mut Vec<u8>, rng: &mut Rng) {
    if text.is_empty() {
        return;
    }
    let at = rng.below(text.len() as u64) as usize;
    match rng.below(5) {
        0 => text[at] ^= 1 << rng.below(8),
        1 => text.truncate(at),
        2 => {
            let alphabet = b"{}[],:\"0123456789-e.\n\xff";
            text.insert(at, alphabet[rng.below(alphabet.len() as u64) as usize]);
        }
        3 => {
            let end = (at + 1 + rng.below(40) as usize).min(text.len());
            text.drain(at..end);
        }
        _ => {
            // A digit run becomes extreme: offsets and values at the edges of i64.
            let digits: &[u8] = if rng.chance(50) {
                b"9223372036854775807"
            } else {
                b"-9223372036854775808"
            };
            if text[at].is_ascii_digit() {
                text.splice(at..at + 1, digits.iter().copied());
            }
        }
    }
}

#[test]
fn extreme_numbers_do_not_overflow() {
    let text = r#"{"tidemark_history": 1, "test": {}}
{"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "send", "value": {"topic": "t", "partition": 0, "values": [1, 2]}}
{"index": 1, "time": 0, "process": 0, "type": "ok", "f": "send", "value": {"topic": "t", "partition": 0, "values": [1, 2], "offset": 9223372036854775807}}
"#;
    let e = check_history(read_history(text.as_bytes()).unwrap(), None).unwrap_err();
    assert!(e.problem.contains("overflows"), "{e}");
    let text = r#"{"tidemark_history": 1, "test": {}}
{"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "poll", "value": {"topic": "t", "partition": 0, "from": -9223372036854775808}}
{"index": 1, "time": 0, "process": 0, "type": "ok", "f": "poll", "value": {"topic": "t", "partition": 0, "from": -9223372036854775808, "records": [[-9223372036854775808, 1, 0], [9223372036854775807, 2, -9223372036854775808], [9223372036854775807, 2, 0]], "high_watermark": -9223372036854775808}}
"#;
    let e = check_history(read_history(text.as_bytes()).unwrap(), None).unwrap_err();
    assert!(e.problem.contains("from -9223372036854775808"), "{e}");
    let text = text.replace("\"from\": -9223372036854775808", "\"from\": 0");
    let e = check_history(read_history(text.as_bytes()).unwrap(), None).unwrap_err();
    assert!(e.problem.contains("offset -9223372036854775808"), "{e}");
    let text = text.replace("[[-9223372036854775808, 1, 0], ", "[");
    let r = check_history(read_history(text.as_bytes()).unwrap(), None).unwrap();
    assert_eq!(r.valid, Validity::Invalid);
}
