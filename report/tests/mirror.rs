//! The report of a two-cluster run: both clusters side by side, the mirror direction over time
//! as bands on the plots, failover and failback as labelled events. The run is literal: a writes,
//! b mirrors, a failover to b abandons a's last write, b writes, a fails back; the clusters end
//! disagreeing at one offset.

mod common;

use common::{replica, write_run, History};
use serde_json::json;
use tidemark_checkers::{OpType, Process, Record, ReplicaState};
use tidemark_report::write_report;

/// Sets the cluster of every op from `from` on.
fn on(h: &mut History, from: usize, cluster: &str) {
    for op in &mut h.ops[from..] {
        op.cluster = Some(cluster.to_owned());
    }
}

fn mirror_run(store: &std::path::Path) -> std::path::PathBuf {
    let mut h = History::new();
    for i in 0..10i64 {
        let t = i as f64 * 10.0;
        h.send(0, (t, t + 3.0), "t", &[i + 1], OpType::Ok, Some(i));
    }
    on(&mut h, 0, "a");
    let mark = |from: &str, to: &str| {
        json!({"from": from, "to": to, "topics": ["t"], "partitions": [
            {"topic": "t", "partition": 0, "lmle": 0, "mirrored_offset": 9, "epoch": 1}]})
    };
    let at = h.ops.len();
    h.nemesis(120.0, 125.0, "failover", mark("a", "b"));
    on(&mut h, at, "b");
    let at = h.ops.len();
    for i in 0..5i64 {
        let t = 150.0 + i as f64 * 10.0;
        h.send(1, (t, t + 3.0), "t", &[11 + i], OpType::Ok, Some(9 + i));
    }
    h.poll(2, 210.0, 215.0, "t", 8, &[(8, 9), (9, 11), (10, 12)]);
    on(&mut h, at, "b");
    let at = h.ops.len();
    h.nemesis(300.0, 305.0, "failback", mark("b", "a"));
    h.push(
        400.0,
        Process::Nemesis,
        OpType::Invoke,
        "kill",
        json!({}),
        None,
    );
    h.push(
        401.0,
        Process::Nemesis,
        OpType::Info,
        "kill",
        json!({"nodes": ["a2"]}),
        None,
    );
    on(&mut h, at, "a");
    let log: Vec<Record> = (0..9)
        .map(|i| Record::new(i, i + 1, 0))
        .chain((0..5).map(|i| Record::new(9 + i, 11 + i, 1)))
        .collect();
    let mut diverged = log.clone();
    diverged[12] = Record::new(12, 99, 1);
    let in_cluster = |cluster: &str, node: &str, role: &str, records: Vec<Record>| {
        let mut r: ReplicaState = replica(node, role, "t", records, 14);
        r.cluster = cluster.to_owned();
        r
    };
    let replicas = vec![
        in_cluster("a", "a1", "leader", diverged.clone()),
        in_cluster("a", "a2", "follower", diverged),
        in_cluster("b", "b1", "leader", log.clone()),
        in_cluster("b", "b2", "follower", log),
    ];
    write_run(
        store,
        "mirror",
        json!({"name": "mirror", "seed": 5, "workload": "mirror", "clusters": ["a", "b"],
               "workload_cluster": "a", "nemesis": ["failover", "kill"]}),
        &h,
        &replicas,
    )
}

#[test]
fn two_clusters_side_by_side_with_the_mirror_direction_over_time() {
    let store = tempfile::tempdir().unwrap();
    let dir = mirror_run(store.path());
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(
        results["bad_anomaly_types"],
        json!(["mirror-divergence", "unexpected-value"])
    );
    assert_eq!(results["anomaly_counts"]["abandoned-write"], 1);
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    // a's acknowledgement at the offset b never mirrored: allowed on its own, and says why.
    assert!(
        html.contains("(allowed: a had not mirrored offset 9 to b at the failover"),
        "entry-level judgement shown"
    );

    // The direction over time, as bands on both plots and as a table.
    let svgs: Vec<&str> = html.split("<svg").skip(1).collect();
    assert_eq!(svgs.len(), 2);
    for svg in &svgs {
        for label in ["a → b", "b writable, not mirrored", "b → a"] {
            assert!(svg.contains(label), "band {label} on the plot");
        }
        for event in ["failover a→b", "failback b→a"] {
            assert!(svg.contains(event), "event {event} on the plot");
        }
    }
    let clusters = &html[html.find("id=\"clusters\"").expect("a clusters section")..];
    let clusters = &clusters[..clusters.find("</section>").unwrap()];
    for row in [
        "0.000",
        "0.125",
        "0.305",
        "a → b",
        "b → a",
        "failover a→b",
        "failback b→a",
    ] {
        assert!(clusters.contains(row), "{row} in the clusters section");
    }
    // Final offsets per cluster, side by side.
    assert!(
        clusters.contains("<th>cluster a</th><th>cluster b</th>"),
        "{clusters}"
    );
    assert!(clusters.contains("a1 · start 0 · hw 14 · end 14 · epoch 1"));
    assert!(clusters.contains("b1 · start 0 · hw 14 · end 14 · epoch 1"));

    // The partition's offsets in both clusters, side by side over the same offsets.
    let offsets = &html[html.find("id=\"offsets\"").unwrap()..];
    let offsets = &offsets[..offsets.find("</section>").unwrap()];
    assert!(offsets.contains("t/0 in clusters a, b"), "{offsets}");
    assert!(offsets.contains("class=\"side\""));
    let a = &offsets[offsets.find(">a:t/0<").unwrap()..offsets.find(">b:t/0<").unwrap()];
    let b = &offsets[offsets.find(">b:t/0<").unwrap()..];
    let rows = |s: &str| s.matches("<td class=\"off").count();
    assert!(rows(a) > 0);
    assert_eq!(rows(a), rows(b), "both clusters over the same offsets");
    assert!(
        a.contains("99") && b.contains(">14<"),
        "the diverging offset in each"
    );
}
