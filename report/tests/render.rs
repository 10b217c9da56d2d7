//! Reports of recorded runs: a valid one, an invalid one with several anomaly kinds (verdict
//! from the real checkers), a large one, and one full of hostile names.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use tidemark_report::{render_timeline_page, write_report, MAX_EMBEDDED_PAGES, PAGE_LINES};

/// The values of every `attr="..."` in `html` whose value starts with `prefix`.
fn attrs(html: &str, attr: &str, prefix: &str) -> Vec<String> {
    let needle = format!("{attr}=\"{prefix}");
    html.match_indices(&needle)
        .map(|(at, _)| {
            let rest = &html[at + attr.len() + 2..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect()
}

fn ids(html: &str) -> BTreeSet<String> {
    attrs(html, "id", "").into_iter().collect()
}

/// Every in-page link to an op or an offset view has a target.
fn assert_links_resolve(html: &str) -> usize {
    let ids = ids(html);
    let mut n = 0;
    for prefix in ["#op-", "#offsets-", "#anomaly-"] {
        for href in attrs(html, "href", prefix) {
            assert!(ids.contains(&href[1..]), "{href} has no target");
            n += 1;
        }
    }
    n
}

#[test]
fn valid_run_report() {
    let store = tempfile::tempdir().unwrap();
    let dir = common::valid_run(store.path());
    let path = write_report(&dir).unwrap();
    assert_eq!(path, dir.join("report.html"));
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.contains(r#"class="banner valid""#), "verdict banner");
    assert!(html.contains("VALID · steady"));
    assert!(html.contains("None found."));
    // The two plots, with the partition shaded and labelled inside the SVG.
    assert_eq!(html.matches("<svg").count(), 2);
    let svg = &html[html.find("<svg").unwrap()..html.find("</svg>").unwrap()];
    assert!(svg.contains("partition halves"), "fault label in the plot");
    assert!(
        svg.contains("opacity=\"0.15\""),
        "fault shading in the plot"
    );
    assert!(html.contains(r#"data-pages="1""#));
    assert!(html.contains("page 1 of 1"));
    // Test parameters and replicas.
    assert!(html.contains("<th>seed</th><td>7</td>"), "parameters");
    assert!(html.contains("epochs [epoch, start]"));
    assert!(!html.contains("class=\"diverge\""), "nothing diverges");
    // No network fetches: nothing loaded from elsewhere.
    assert!(!html.contains("src=\"http"));
    assert!(!html.contains("<link"));
}

#[test]
fn invalid_run_report_links_every_anomaly_to_its_ops() {
    let store = tempfile::tempdir().unwrap();
    let dir = common::invalid_run(
        store.path(),
        "queue",
        "t",
        "unclean-election",
        "broker said hello",
    );
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    let kinds: Vec<&str> = results["anomaly_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    for k in [
        "lost-write",
        "divergence",
        "inconsistent-offsets",
        "duplicate",
        "nonmonotonic-poll",
    ] {
        assert!(
            kinds.contains(&k),
            "{k} not found by the checkers: {kinds:?}"
        );
    }
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    assert!(html.contains(r#"class="banner invalid""#));
    for k in &kinds {
        assert!(html.contains(&format!("id=\"anomaly-{k}\"")), "{k} section");
    }
    let links = assert_links_resolve(&html);
    let op_links = attrs(&html, "href", "#op-");
    assert!(op_links.len() >= kinds.len(), "{op_links:?}");
    assert!(links > op_links.len(), "offset view links too");
    assert!(
        html.contains("<td>epoch 2 from 30</td>"),
        "the unclean election"
    );
    // The lost write's op, its offset view with the contested offset, the diverging replica.
    assert!(html.contains("id=\"offsets-0\""));
    assert!(html.contains("class=\"contested\""));
    assert!(
        html.contains("<td class=\"diverge\">n2</td>"),
        "diverging node marked"
    );
    assert!(
        html.contains("td class=\"num diverge\""),
        "differing high watermark marked"
    );
    // Fault intervals: partition, kill, strand, and the instantaneous unclean election.
    for label in [
        "partition halves",
        "kill n3",
        "strand n2",
        "unclean-election",
    ] {
        assert!(html.contains(label), "{label}");
    }
    // Log excerpts around the anomalies, matched by timestamp.
    assert!(html.contains("appended offset 30"));
    assert!(html.contains("near lost-write"));
    assert!(
        html.contains("The test&#39;s wall-clock start")
            || html.contains("wall-clock start is from")
    );
}

#[test]
fn large_run_report_is_paged_and_bounded() {
    let store = tempfile::tempdir().unwrap();
    let pairs = 70_000;
    let dir = common::large_run(store.path(), pairs);
    let began = Instant::now();
    let path = write_report(&dir).unwrap();
    let took = began.elapsed();
    let size = std::fs::metadata(&path).unwrap().len();
    let lines = std::fs::read_to_string(dir.join("history.jsonl"))
        .unwrap()
        .lines()
        .count()
        - 1;
    println!("large run: {lines} history lines; report {size} bytes in {took:?}");
    assert!(lines >= 100_000);
    let html = std::fs::read_to_string(&path).unwrap();
    let pages = (lines as u64).div_ceil(PAGE_LINES);
    assert!(pages > MAX_EMBEDDED_PAGES);
    assert!(html.contains(&format!("data-pages=\"{pages}\"")));
    assert!(
        html.contains(&format!("page 1 of {pages}")),
        "explicit page k of n"
    );
    assert_eq!(
        html.matches("class=\"tl-data\"").count() as u64,
        MAX_EMBEDDED_PAGES,
        "a bounded number of pages embedded"
    );
    assert!(
        html.contains("is not in this file"),
        "non-embedded pages are named, not dropped"
    );
    assert!(html.contains("lost-write"));
    assert_links_resolve(&html);
    // The page holding the lost write's op is embedded.
    let op: u64 = attrs(&html, "href", "#op-")[0][4..].parse().unwrap();
    assert!(html.contains(&format!("data-page=\"{}\"", op / PAGE_LINES)));
    // Fault shading from the pause/resume pairs.
    assert!(html.contains("pause n2"));
    // Bounded: points sampled, pages capped.
    assert!(size < 8 << 20, "report is {size} bytes");
    assert!(html.contains("sampled evenly"));
    // Any page can still be rendered alone.
    let page = render_timeline_page(&dir, pages - 2).unwrap();
    assert!(page.contains(&format!("data-page=\"{}\"", pages - 2)));
    assert_eq!(page.matches("class=\"tl-data\"").count(), 1);
}

#[test]
fn hostile_values_are_escaped() {
    let store = tempfile::tempdir().unwrap();
    let dir = common::invalid_run(
        store.path(),
        "\"><svg onload=alert(4)>",
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(2)>",
        "</pre><img onerror=alert(3)>",
    );
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    for raw in [
        "<script>alert",
        "<img src=x",
        "<img onerror",
        "<svg onload",
        "</pre><img",
    ] {
        assert!(!html.contains(raw), "{raw} appears unescaped");
    }
    // They are shown, escaped: in the anomalies, the plots' fault labels and the log excerpts.
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    let svg_start = html.find("<svg").unwrap();
    let svg = &html[svg_start..svg_start + html[svg_start..].find("</svg>").unwrap()];
    assert!(
        svg.contains("&lt;img src=x onerror=alert(2)&gt;"),
        "SVG text is escaped"
    );
    assert!(html.contains("&lt;/pre&gt;&lt;img onerror=alert(3)&gt;"));
    // Exactly the one script the report itself carries.
    assert_eq!(html.matches("<script").count(), 1);
    assert_links_resolve(&html);
}

#[test]
fn a_run_without_results_is_checked_by_the_report() {
    let store = tempfile::tempdir().unwrap();
    let dir = common::invalid_run(store.path(), "queue", "t", "config", "x");
    std::fs::remove_file(dir.join("results.json")).unwrap();
    std::fs::remove_dir_all(dir.join("nodes")).unwrap();
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    assert!(html.contains(r#"class="banner invalid""#));
    assert!(html.contains("no results.json: checked by the report"));
    assert!(html.contains("No node logs in this run"));
    assert!(write_report(store.path()).is_err(), "not a run directory");
}

#[test]
fn a_run_cut_short_renders() {
    let store = tempfile::tempdir().unwrap();
    let dir = store.path().join("cut").join(common::STAMP);
    std::fs::create_dir_all(&dir).unwrap();
    let header = "{\"tidemark_history\":1,\"test\":{\"name\":\"cut\"}}\n";
    std::fs::write(dir.join("history.jsonl"), header).unwrap();
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    assert!(html.contains("page 1 of 1"));
    assert!(html.contains("No replicas.jsonl in this run."));
    // An invocation without its completion and a torn last line, as a killed run leaves them.
    let torn = format!(
        "{header}{}\n{{\"index\":1,\"ti",
        r#"{"index":0,"time":5,"process":0,"type":"invoke","f":"send","value":{"topic":"t","partition":0,"values":[1]}}"#
    );
    std::fs::write(dir.join("history.jsonl"), torn).unwrap();
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    assert!(
        html.contains("truncated last line"),
        "the reader's warning is shown"
    );
    assert!(
        html.contains("0\t0\t0\tsend\tpending\t"),
        "the pending op is in the timeline"
    );
}

#[test]
fn a_tiered_poll_says_how_many_records_came_from_the_remote_store() {
    use serde_json::json;
    use tidemark_checkers::{OpType, Process, Record};
    let store = tempfile::tempdir().unwrap();
    let mut h = common::History::new();
    let mut records = Vec::new();
    for i in 0..10i64 {
        let t = i as f64 * 10.0;
        h.send(0, (t, t + 2.0), "t", &[i + 1], OpType::Ok, Some(i));
        records.push(Record::new(i, i + 1, 0));
    }
    let poll = json!({"topic": "t", "partition": 0, "from": 0});
    h.push(
        200.0,
        Process::Client(1),
        OpType::Invoke,
        "poll",
        poll,
        None,
    );
    // The leader's local log started at 6: offsets 0-5 were read from the remote store.
    let done = json!({"topic": "t", "partition": 0, "from": 0, "high_watermark": 10,
        "local_log_start": 6,
        "records": records.iter().map(|r| json!([r.offset, r.value, 0])).collect::<Vec<_>>()});
    h.push(205.0, Process::Client(1), OpType::Ok, "poll", done, None);
    let replicas: Vec<_> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| common::replica(n, "follower", "t", records.clone(), 10))
        .collect();
    let dir = common::write_run(
        store.path(),
        "tiered",
        json!({"name": "tiered", "seed": 1, "workload": "tiered", "nemesis": [],
        "nodes": ["n1", "n2", "n3"]}),
        &h,
        &replicas,
    );
    let html = std::fs::read_to_string(write_report(&dir).unwrap()).unwrap();
    assert!(
        html.contains("10 recs @0..9 hw 10 (6 from remote, local from 6)"),
        "the poll's summary marks its remote reads"
    );
}
