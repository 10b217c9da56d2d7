//! `tidemark test --clusters N` end to end on real namespaces: several independent clusters on
//! one bridge, each with its own controller quorum, the workload and faults on the first, every
//! op naming its cluster, and nothing left behind. Bad cluster options are usage errors.

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::engine::*;
use serde_json::Value;

/// `key=value` lines of a properties file.
fn properties(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn bad_cluster_options_are_usage_errors() {
    let e = usage_error(&["--clusters", "0"]);
    assert!(e.contains("--clusters must be 1 to 4"), "{e}");
    let e = usage_error(&["--clusters", "5"]);
    assert!(e.contains("--clusters must be 1 to 4"), "{e}");
    let e = usage_error(&["--clusters", "2", "--nodes", "51"]);
    assert!(
        e.contains("--nodes must be 1 to 50 when there are several clusters"),
        "{e}"
    );

    // A nodes file groups its hosts by cluster; its mistakes name the file and line.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodes");
    let hosts = |text: &str, extra: &[&str]| {
        std::fs::write(&file, text).unwrap();
        let path = file.display().to_string();
        let mut args = vec!["--runtime", "hosts", "--nodes-file", path.as_str()];
        args.extend_from_slice(extra);
        usage_error(&args)
    };
    let path = file.display().to_string();
    let e = hosts("[a]\n10.0.0.1\n[b]\n10.0.1.1\n10.0.1.2\n", &[]);
    let want =
        "every cluster needs as many hosts as the others, but the nodes file lists [a] 1, [b] 2";
    assert!(e.contains(want), "{e}");
    let e = hosts("[a]\n10.0.0.1\n[b]\n10.0.1.1\n", &["--clusters", "3"]);
    assert!(
        e.contains("--clusters 3, but the nodes file lists 2 cluster(s)"),
        "{e}"
    );
    let e = hosts("[a]\n10.0.0.1\n[Beta]\n10.0.1.1\n", &[]);
    assert!(
        e.contains(&format!("{path}:3: cluster name \"Beta\"")),
        "{e}"
    );
}

#[test]
fn two_clusters_run_their_own_quorums_under_faults_on_the_first() {
    require_root("two_clusters_run_their_own_quorums_under_faults_on_the_first");
    broker();
    let store = tempfile::tempdir().unwrap();
    let out = tidemark_test(
        &[
            "--clusters",
            "2",
            "--time-limit",
            "10",
            "--nemesis",
            "partition,kill",
            "--nemesis-interval",
            "2",
            "--seed",
            "11",
        ],
        store.path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("VALID"), "{stdout}");

    let run = store.path().join("latest");
    let test: Value = serde_json::from_slice(&std::fs::read(run.join("test.json")).unwrap())
        .expect("test.json is JSON");
    assert_eq!(test["clusters"], serde_json::json!(["a", "b"]));
    assert_eq!(test["workload_cluster"], "a");
    // Names and addresses tell the clusters apart; ids count within each cluster.
    let nodes: Vec<(String, String, u64, String)> = test["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["cluster"].as_str().unwrap().to_string(),
                n["id"].as_u64().unwrap(),
                n["ip"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String, u64, String)> = [("a", 11), ("b", 61)]
        .iter()
        .flat_map(|&(c, base)| {
            (1..=3u64).map(move |i| {
                (
                    format!("{c}{i}"),
                    c.to_string(),
                    i,
                    format!("10.211.0.{}", base + i - 1),
                )
            })
        })
        .collect();
    assert_eq!(nodes, expected);

    // Each broker's controller quorum is its own cluster's three nodes, and in each cluster
    // exactly one node (its first) initialized a quorum and some node was elected its leader.
    for (name, cluster, id, ip) in &nodes {
        let props = properties(&run.join("nodes").join(name).join("server.properties"));
        assert_eq!(props["node.id"], id.to_string(), "{name}");
        let voters: Vec<String> = nodes
            .iter()
            .filter(|n| &n.1 == cluster)
            .map(|n| format!("{}@{}", n.2, n.3))
            .collect();
        let listed: Vec<String> = props["controller.quorum.voters"]
            .split(',')
            .map(|v| v.rsplit_once(':').unwrap().0.to_string())
            .collect();
        assert_eq!(listed, voters, "{name}");
        assert!(props["listeners"].contains(ip.as_str()), "{name}");
    }
    let log = |name: &str| {
        std::fs::read_to_string(run.join("nodes").join(name).join("broker.log")).unwrap()
    };
    for c in ["a", "b"] {
        let initialized: Vec<String> = (1..=3)
            .map(|i| format!("{c}{i}"))
            .filter(|n| log(n).contains("initialized the metadata quorum"))
            .collect();
        assert_eq!(initialized, [format!("{c}1")], "cluster {c}");
        assert!(
            (1..=3).any(|i| log(&format!("{c}{i}")).contains("elected metadata quorum leader")),
            "cluster {c} elected no quorum leader"
        );
    }

    // Every op names its cluster: clients and faults the first; the final healing covers both.
    let history = json_lines(&run.join("history.jsonl"));
    let ops = &history[1..];
    let node_cluster: BTreeMap<&str, &str> =
        nodes.iter().map(|n| (n.0.as_str(), n.1.as_str())).collect();
    for op in ops {
        let cluster = op["cluster"].as_str().unwrap_or_else(|| panic!("{op}"));
        if op["process"] != "nemesis" {
            assert_eq!(cluster, "a", "{op}");
        }
        if let Some(node) = op["node"].as_str() {
            assert_eq!(node_cluster[node], cluster, "{op}");
        }
    }
    let limit = (test["time_limit_s"].as_f64().unwrap() * 1e9) as u64;
    let faults: Vec<&Value> = ops
        .iter()
        .filter(|o| o["process"] == "nemesis" && o["type"] == "info")
        .filter(|o| o["time"].as_u64().unwrap() <= limit)
        .collect();
    assert!(!faults.is_empty(), "no fault in 10 s");
    for f in &faults {
        assert_eq!(f["cluster"], "a", "{f}");
        // Targets resolve within the cluster: only a's nodes are named.
        let text = f["value"].to_string();
        assert!(!text.contains("\"b1\"") && !text.contains("\"n1\""), "{f}");
    }
    let started: BTreeMap<&str, Vec<&str>> = ops
        .iter()
        .filter(|o| o["process"] == "nemesis" && o["type"] == "info" && o["f"] == "start")
        .filter(|o| o["time"].as_u64().unwrap() > limit)
        .map(|o| {
            let nodes = o["value"]["nodes"].as_array().unwrap();
            (
                o["cluster"].as_str().unwrap(),
                nodes.iter().map(|n| n.as_str().unwrap()).collect(),
            )
        })
        .collect();
    assert_eq!(started["a"], ["a1", "a2", "a3"]);
    assert_eq!(started["b"], ["b1", "b2", "b3"]);

    // Replicas are recorded with their node's cluster.
    let replicas = json_lines(&run.join("replicas.jsonl"));
    assert!(!replicas.is_empty());
    for r in &replicas {
        let node = r["node"].as_str().unwrap();
        assert_eq!(r["cluster"], node_cluster[node], "{r}");
    }
    for n in ["a1", "a2", "a3"] {
        assert!(replicas.iter().any(|r| r["node"] == n), "no replica on {n}");
    }

    assert_nothing_left(&test);
}

#[test]
fn a_scripted_fault_acts_on_the_cluster_it_names() {
    require_root("a_scripted_fault_acts_on_the_cluster_it_names");
    broker();
    let at = |s: u64, f: &str, value: Value| {
        let time = s * 1_000_000_000;
        serde_json::json!({"time": time, "f": f, "value": value})
    };
    let schedule = serde_json::json!([
        at(
            1,
            "kill",
            serde_json::json!({"cluster": "b", "nodes": ["b2"]})
        ),
        at(
            3,
            "start",
            serde_json::json!({"cluster": "b", "nodes": ["b2"]})
        ),
        at(4, "kill", serde_json::json!({"nodes": ["a3"]})),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("faults.json");
    std::fs::write(&file, schedule.to_string()).unwrap();
    let file = file.display().to_string();
    // b's nodes are checked against b's names, and only a's against a's.
    let e = usage_error(&[
        "--clusters",
        "2",
        "--nemesis-schedule",
        &file,
        "--nodes",
        "2",
    ]);
    assert!(
        e.contains("op 2: kill: field `value.nodes[0]`: unknown node \"a3\""),
        "{e}"
    );
    let store = tempfile::tempdir().unwrap();
    let out = tidemark_test(
        &[
            "--clusters",
            "2",
            "--nemesis-schedule",
            &file,
            "--time-limit",
            "6",
            "--seed",
            "3",
        ],
        store.path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");

    let run = store.path().join("latest");
    let history = json_lines(&run.join("history.jsonl"));
    let faults: Vec<(&str, &str, Value)> = history[1..]
        .iter()
        .filter(|o| o["process"] == "nemesis" && o["type"] == "info")
        .take(3)
        .map(|o| {
            assert!(o.get("error").is_none(), "{o}");
            (
                o["f"].as_str().unwrap(),
                o["cluster"].as_str().unwrap(),
                o["value"]["nodes"].clone(),
            )
        })
        .collect();
    assert_eq!(
        faults,
        [
            ("kill", "b", serde_json::json!(["b2"])),
            ("start", "b", serde_json::json!(["b2"])),
            ("kill", "a", serde_json::json!(["a3"])),
        ]
    );
    // The kill really hit b2 (and not a2): its broker started twice.
    let starts = |name: &str| {
        std::fs::read_to_string(run.join("nodes").join(name).join("broker.log"))
            .unwrap()
            .matches("metadata quorum started")
            .count()
    };
    assert_eq!((starts("b2"), starts("a2")), (2, 1));
    let test: Value =
        serde_json::from_slice(&std::fs::read(run.join("test.json")).unwrap()).unwrap();
    assert_nothing_left(&test);
}
