//! The HTML of `report.html`, built with maud so every value from a history, a result or a log
//! is escaped; the only markup inserted unescaped is this module's own CSS and script and the
//! SVG plotters draws (which escapes its text itself). The page works offline: no fetches, no
//! external files. The script only pages the timeline, and builds it with `textContent`, never
//! with markup from the data.

use std::collections::{BTreeMap, BTreeSet};

use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;
use tidemark_checkers::{Process, ReplicaState, Validity};

use crate::anomalies::{Entry, PartKey};
use crate::digest::{Evidence, OpRow, PAGE_LINES};
use crate::limits::{Embed, MAX_EMBEDDED_PAGES, WINDOW};
use crate::logs::Line;
use crate::offsets::{Cell, View};
use crate::plot;
use crate::run::{Run, Verdict};
use crate::text::{clip, duration, encode_path, json_clip, one_line, secs};

/// Replica rows shown.
const MAX_REPLICA_ROWS: usize = 2000;
/// Longest JSON value shown for an op or an anomaly entry.
const VALUE_CHARS: usize = 2000;

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1d;background:#f7f7f5}
main{max-width:1440px;margin:0 auto;padding:0 18px 48px}
a{color:#1f5fa8}
.banner{padding:16px 24px;color:#fff}
.banner h1{margin:0;font-size:26px;letter-spacing:.02em}
.banner p{margin:4px 0 0;opacity:.95}
.valid{background:#2e7d32}.invalid{background:#c62828}.unknown{background:#d9822b}.unchecked{background:#616161}
nav.toc{position:sticky;top:0;background:#fffffff2;border-bottom:1px solid #ddd;padding:6px 24px;z-index:2}
nav.toc a{margin-right:14px}
h2{border-bottom:2px solid #d0d0d0;padding-bottom:4px;margin-top:36px}
h3{margin:22px 0 6px}
table{border-collapse:collapse;font-size:13px;background:#fff}
td,th{border:1px solid #dadada;padding:2px 7px;text-align:left;vertical-align:top}
th{background:#efefef;position:sticky;top:34px}
.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #ddd;padding:6px 8px;overflow:auto;font-size:12px;max-height:440px;margin:4px 0}
.bad{color:#c62828;font-weight:600}.allowed{color:#6b6b6b}
.note{color:#555;font-size:13px}
.diverge{background:#ffd2d2;font-weight:600}
tr.contested>td.off{background:#ffe08a}
td.off.focus{font-weight:700;text-decoration:underline}
tr.gap td{background:#eee;text-align:center;color:#777}
.v0{background:#cfe3ff}.v1{background:#ffd0d0}.v2{background:#d4f2cf}.v3{background:#ffe3b8}
.v4{background:#e7d5ff}.v5{background:#c8f0ef}.v6{background:#f7d2ec}.v7{background:#e2e2c8}
.missing{color:#999}
td.ok{background:#e2edf9}td.fail{background:#fbdcdc}td.info,td.pending{background:#fcecd2}
.tl-body{overflow-x:auto}
.tl-body th{position:static}
.tl table td{white-space:nowrap;font-size:12px;max-width:150px;overflow:hidden;text-overflow:ellipsis}
.tl-nav{margin:8px 0;display:flex;gap:6px;align-items:center}
.tl-nav input{width:5em}
.hl{outline:3px solid #111;outline-offset:-2px}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:middle;margin-right:4px}
svg{max-width:100%;height:auto;background:#fff;border:1px solid #ddd}
ol.entries>li{margin:6px 0}
.side{display:flex;gap:16px;align-items:flex-start;overflow-x:auto}
.side>div{flex:0 0 auto}
details>summary{cursor:pointer;color:#555}
"#;

const SCRIPT: &str = r#"
(function(){
var tl=document.getElementById('timeline');if(!tl)return;
var n=+tl.dataset.pages,size=+tl.dataset.size,data={};
tl.querySelectorAll('.tl-data').forEach(function(d){data[+d.dataset.page]=d;});
var status=tl.querySelector('.tl-status'),body=tl.querySelector('.tl-body'),num=tl.querySelector('.tl-num'),cur=0;
function rows(k){var d=data[k];if(!d)return null;if(!d.rows){d.rows=d.textContent.split('\n').filter(function(l){return l.length;}).map(function(l){return l.split('\t');});}return d.rows;}
function el(t,c,x){var e=document.createElement(t);if(c)e.className=c;if(x!=null)e.textContent=x;return e;}
function show(k,op){
k=Math.max(0,Math.min(n-1,k));var r=rows(k);
if(!r&&tl.dataset.nav){location.search='?page='+k;return false;}
cur=k;num.value=k+1;status.textContent='page '+(k+1)+' of '+n;body.textContent='';
if(!r){body.appendChild(el('p','note',tl.dataset.missing.split('{page}').join(k+1).split('{page0}').join(k)));return false;}
var procs=[];r.forEach(function(x){if(procs.indexOf(x[2])<0)procs.push(x[2]);});
procs.sort(function(a,b){if(a===b)return 0;if(a==='nemesis')return 1;if(b==='nemesis')return -1;return a-b;});
var t=el('table'),h=el('tr');h.appendChild(el('th',null,'start (s)'));
procs.forEach(function(p){h.appendChild(el('th',null,p==='nemesis'?'nemesis':'process '+p));});
t.appendChild(h);var found=null;
r.forEach(function(x){var tr=el('tr');tr.appendChild(el('td','num',(x[5]/1e6).toFixed(3)));
procs.forEach(function(p){if(p!==x[2]){tr.appendChild(el('td'));return;}
var td=el('td',x[4]);td.id='t-'+x[0];td.appendChild(el('b',null,x[3]+' '));td.appendChild(document.createTextNode(x[8]));
td.title=x[3]+' '+x[8]+'\nop '+x[0]+(x[1]?' (invoked as op '+x[1]+')':'')+(x[7]?' on '+x[7]:'')+': '+x[4]+(x[6]?', '+(x[6]/1000).toFixed(1)+' ms':'');
if(op!=null&&(x[0]===String(op)||x[1]===String(op))){td.classList.add('hl');found=td;}
tr.appendChild(td);});t.appendChild(tr);});
body.appendChild(t);if(found)found.scrollIntoView({block:'center'});return op==null||!!found;}
function go(op){var k=Math.floor(op/size);for(var i=k;i<Math.min(n,k+3);i++){if(rows(i)&&show(i,op))return;}show(k,op);}
tl.querySelector('.tl-first').onclick=function(){show(0);};
tl.querySelector('.tl-prev').onclick=function(){show(cur-1);};
tl.querySelector('.tl-next').onclick=function(){show(cur+1);};
tl.querySelector('.tl-last').onclick=function(){show(n-1);};
num.onchange=function(){show((+num.value||1)-1);};
document.addEventListener('click',function(e){var a=e.target.closest&&e.target.closest('a[data-op]');if(!a)return;e.preventDefault();tl.scrollIntoView();go(+a.dataset.op);});
if(/^#t-\d+$/.test(location.hash))go(+location.hash.slice(3));else show(+tl.dataset.start);
})();
"#;

/// Ops by the page that shows them: the page of their completion line.
fn page_of(row: &OpRow) -> u64 {
    row.index / PAGE_LINES
}

fn page_count(run: &Run) -> u64 {
    run.digest.lines.div_ceil(PAGE_LINES).max(1)
}

/// The pages to embed: all when few; otherwise the pages of ops anomalies name, the first and
/// the last, then evenly spaced others up to [`MAX_EMBEDDED_PAGES`].
fn embedded_pages(run: &Run) -> BTreeSet<u64> {
    let n = page_count(run);
    match run.embed {
        Embed::One(k) => BTreeSet::from([k.min(n - 1)]),
        Embed::Report if n <= MAX_EMBEDDED_PAGES => (0..n).collect(),
        Embed::Report => {
            let mut pages: BTreeSet<u64> = [0, n - 1].into();
            for e in run.digest.evidence.keys() {
                if pages.len() as u64 >= MAX_EMBEDDED_PAGES {
                    break;
                }
                pages.insert(e / PAGE_LINES);
            }
            let room = MAX_EMBEDDED_PAGES.saturating_sub(pages.len() as u64);
            for j in 1..=room {
                pages.insert(j * n / (room + 1));
            }
            // Spacing may land twice on one page: the rest of the room goes to the earliest.
            let mut k = 0;
            while (pages.len() as u64) < MAX_EMBEDDED_PAGES && k < n {
                pages.insert(k);
                k += 1;
            }
            pages
        }
    }
}

/// The tab-separated rows of one timeline page (see the script for the fields).
fn page_data(run: &Run, rows: &[&OpRow]) -> String {
    let mut out = String::with_capacity(rows.len() * 64);
    for r in rows {
        let f = run
            .digest
            .fs
            .get(usize::from(r.f))
            .map_or("?", String::as_str);
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            r.index,
            r.invoke.map(|i| i.to_string()).unwrap_or_default(),
            r.process,
            f,
            r.outcome.name(),
            r.start / 1000,
            r.latency()
                .map(|l| (l / 1000).to_string())
                .unwrap_or_default(),
            r.node.as_deref().unwrap_or(""),
            r.summary
        ));
    }
    out
}

fn verdict_class(run: &Run) -> (&'static str, &'static str) {
    match run.verdict.results().map(|r| r.valid) {
        Some(Validity::Valid) => ("valid", "VALID"),
        Some(Validity::Invalid) => ("invalid", "INVALID"),
        Some(Validity::Unknown) => ("unknown", "UNKNOWN"),
        None => ("unchecked", "NOT CHECKED"),
    }
}

/// The whole report.
pub fn report(run: &Run) -> Markup {
    let (class, word) = verdict_class(run);
    let client_ops = run
        .digest
        .ops
        .iter()
        .filter(|o| o.process != Process::Nemesis)
        .count();
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (word) " — " (run.name) " — tidemark" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header.banner.(class) #verdict {
                    h1 { (word) " · " (run.name) }
                    p {
                        (run.store_path) " · " (client_ops) " client ops, "
                        (run.digest.lines) " history lines over " (secs(run.digest.end)) " s"
                        @if let Some(r) = run.verdict.results() {
                            @if !r.bad_anomaly_types.is_empty() {
                                " · forbidden: " (r.bad_anomaly_types.join(", "))
                            }
                        }
                    }
                    p { (verdict_source(&run.verdict)) }
                    @let keeping = run.test.get("shrunk_keeping").and_then(Value::as_str);
                    @if let Some(original) = run.test.get("shrunk_from").and_then(Value::as_str) {
                        p {
                            "Shrunk from " code { (original) }
                            @if let Some(kind) = keeping { ", keeping " (kind) }
                        }
                    }
                    @if class == "invalid" {
                        @let dir = shell_word(&run.dir.display().to_string());
                        @let only = keeping.map(|k| format!(" --anomaly {}", shell_word(k))).unwrap_or_default();
                        p.commands {
                            "Reproduce: " code { "tidemark replay " (dir) (only) " --times 5" }
                            " · find the smallest run that still fails: "
                            code { "tidemark shrink " (dir) }
                        }
                    }
                }
                nav.toc {
                    a href="#anomalies" { "anomalies" }
                    a href="#parameters" { "parameters" }
                    a href="#perf" { "latency & throughput" }
                    @if is_mirrored(run) { a href="#clusters" { "clusters" } }
                    @if !run.offsets.is_empty() { a href="#offsets" { "offsets" } }
                    a href="#evidence" { "ops named" }
                    a href="#timeline" { "timeline" }
                    a href="#replicas" { "replicas" }
                    a href="#logs" { "node logs" }
                    a href="history.jsonl" { "history.jsonl" }
                    a href="results.json" { "results.json" }
                }
                main {
                    (anomalies(run))
                    (parameters(run))
                    (perf(run))
                    (clusters(run))
                    (offset_views(run))
                    (evidence(run))
                    (timeline(run))
                    (replicas(run))
                    (logs(run))
                    p.note { "Rendered by tidemark-report " (env!("CARGO_PKG_VERSION")) "; the run loaded in "
                        (run.load_time.as_millis()) " ms." }
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

/// `word` as one shell word: itself when it holds only characters no shell treats specially,
/// else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-:+@%,=".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A page holding only the timeline, one page of it embedded.
pub fn timeline_only(run: &Run) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "timeline — " (run.name) " — tidemark" }
                style { (PreEscaped(CSS)) }
            }
            body {
                main {
                    p { a href=(format!("/runs/{}/report.html", encode_path(&run.store_path.split('/').collect::<Vec<_>>()))) {
                        "← report of " (run.store_path) } }
                    (timeline(run))
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

fn verdict_source(v: &Verdict) -> String {
    match v {
        Verdict::File(_) => "verdict from results.json".into(),
        Verdict::Computed(_) => "no results.json: checked by the report".into(),
        Verdict::None(why) => clip(why, 300),
    }
}

/// Op index → the row index of evidence holding it (as completion or invocation).
fn evidence_ids(run: &Run) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for (row, e) in &run.digest.evidence {
        for o in [&e.invoke, &e.completion].into_iter().flatten() {
            out.insert(o.index, *row);
        }
    }
    out
}

fn view_index(run: &Run, key: &PartKey) -> Option<usize> {
    run.offsets.iter().position(|v| &v.key == key)
}

fn part_name(key: &PartKey) -> String {
    if key.0.is_empty() {
        format!("{}/{}", key.1, key.2)
    } else {
        format!("{}:{}/{}", key.0, key.1, key.2)
    }
}

fn anomalies(run: &Run) -> Markup {
    let ids = evidence_ids(run);
    let results = run.verdict.results();
    html! {
        section #anomalies {
            h2 { "Anomalies" }
            @if results.is_none() { p { "No verdict: " (verdict_source(&run.verdict)) } }
            @if results.is_some() && run.kinds.is_empty() { p { "None found." } }
            @for k in &run.kinds {
                h3 #(format!("anomaly-{}", k.name)) {
                    (k.name) " "
                    @if k.bad { span.bad { "forbidden" } }
                    @else { span.allowed { "allowed" @if let Some(w) = &k.allowed { ": " (w) } } }
                    " · " (k.count)
                }
                @if k.count > k.entries.len() as u64 {
                    p.note { "The first " (k.entries.len()) " of " (k.count)
                        " are shown; results.json holds up to 10,000." }
                }
                ol.entries {
                    @for e in &k.entries { li { (entry(run, e, &ids)) } }
                }
            }
            @if let Some(r) = results {
                @if !r.stats.is_empty() {
                    h3 { "Operations" }
                    table {
                        tr { th { "f" } th { "ok" } th { "fail" } th { "info" } }
                        @for (f, s) in &r.stats {
                            tr { td { (f) } td.num { (s.ok) } td.num { (s.fail) } td.num { (s.info) } }
                        }
                    }
                }
                @if !r.skipped_checks.is_empty() {
                    h3 { "Checks that could not run" }
                    ul { @for s in &r.skipped_checks { li { b { (s.check) } ": " (s.reason) } } }
                }
            }
            @let warnings: BTreeSet<&String> = results.map(|r| &r.warnings[..]).unwrap_or_default().iter()
                .chain(&run.warnings).chain(&run.digest.warnings).collect();
            @if !warnings.is_empty() {
                h3 { "Warnings" }
                ul { @for w in warnings { li { (clip(w, 600)) } } }
            }
        }
    }
}

fn op_link(op: u64, ids: &BTreeMap<u64, u64>) -> Markup {
    html! {
        @if ids.contains_key(&op) { a href=(format!("#op-{op}")) { "op " (op) } }
        @else { a href=(format!("#t-{op}")) data-op=(op) { "op " (op) } }
    }
}

fn entry(run: &Run, e: &Entry, ids: &BTreeMap<u64, u64>) -> Markup {
    let views: BTreeSet<usize> = e
        .places
        .iter()
        .filter_map(|(k, _)| view_index(run, k))
        .collect();
    // The policy may allow an entry on its own, by where it is.
    let allowed = e.json.get("allowed").and_then(Value::as_str);
    html! {
        (e.headline())
        @if let Some(why) = allowed { " " span.allowed { "(allowed: " (clip(why, 300)) ")" } }
        @if !e.ops.is_empty() {
            " — proof: "
            @for (i, op) in e.ops.iter().enumerate() {
                @if i > 0 { ", " }
                (op_link(*op, ids))
            }
        }
        @for v in views {
            " · " a href=(format!("#offsets-{v}")) { "offsets of " (part_name(&run.offsets[v].key)) }
        }
        details { summary { "entry" } pre { (json_clip(&e.json, VALUE_CHARS)) } }
    }
}

fn parameters(run: &Run) -> Markup {
    html! {
        section #parameters {
            h2 { "Test parameters" }
            p.note { "From " (run.test_source) ". Files: "
                a href="test.json" { "test.json" } ", " a href="history.jsonl" { "history.jsonl" } ", "
                a href="replicas.jsonl" { "replicas.jsonl" } ", " a href="results.json" { "results.json" } "." }
            @match &run.test {
                Value::Object(m) => {
                    table {
                        @for (k, v) in m {
                            tr { th { (k) } td { (match v { Value::String(s) => clip(s, 400), v => json_clip(v, 400) }) } }
                        }
                    }
                }
                v => { pre { (json_clip(v, VALUE_CHARS)) } }
            }
        }
    }
}

fn perf(run: &Run) -> Markup {
    let latency = plot::latency(&run.digest);
    let throughput = plot::throughput(&run.digest);
    html! {
        section #perf {
            h2 { "Latency" }
            @match &latency {
                Ok(p) => {
                    (PreEscaped(&p.svg))
                    p.note {
                        @if p.drawn < p.total {
                            "Points: " (p.drawn) " of " (p.total) " completed client ops, sampled evenly (failed and indeterminate ones first). "
                        } @else { "Points: every completed client op (" (p.total) "). " }
                        "Quantile lines use every ok op. Shaded: faults."
                        @if !run.digest.bands.is_empty() { " The strip along the bottom: the mirror direction (see clusters)." }
                    }
                }
                Err(e) => { p.bad { "The latency plot failed: " (e) } }
            }
            h2 { "Throughput" }
            @match &throughput {
                Ok(p) => { (PreEscaped(&p.svg)) }
                Err(e) => { p.bad { "The throughput plot failed: " (e) } }
            }
            h3 { "Faults" }
            @if run.digest.faults.is_empty() { p { "The nemesis did nothing." } }
            @else {
                table {
                    tr { th { "fault" } th { "from (s)" } th { "to (s)" } }
                    @for f in &run.digest.faults {
                        tr {
                            td { span.swatch style=(format!("background:{}", plot::fault_css(f.kind))) {} (f.label) }
                            td.num { (secs(f.start)) }
                            td.num {
                                @match f.end {
                                    None => "instant",
                                    Some(e) if f.open_ended => { (secs(e)) " (not healed)" }
                                    Some(e) => (secs(e)),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The run has two or more clusters (in its replicas or its mirroring ops).
fn is_mirrored(run: &Run) -> bool {
    !run.digest.bands.is_empty() || replica_clusters(run).len() > 1
}

fn replica_clusters(run: &Run) -> BTreeSet<&str> {
    run.replicas
        .iter()
        .flatten()
        .map(|r| r.cluster.as_str())
        .collect()
}

/// Both clusters side by side: the mirror direction over time (the bands of the plots) with
/// each failover and failback, and each partition's final offsets in every cluster.
fn clusters(run: &Run) -> Markup {
    if !is_mirrored(run) {
        return html! {};
    }
    let names: Vec<&str> = replica_clusters(run).into_iter().collect();
    let mut parts: BTreeMap<(&str, i64), BTreeMap<&str, &ReplicaState>> = BTreeMap::new();
    for r in run.replicas.iter().flatten().filter(|r| r.error.is_none()) {
        let slot = parts
            .entry((r.topic.as_str(), r.partition))
            .or_default()
            .entry(r.cluster.as_str())
            .or_insert(r);
        // The final log's replica: the leader, else the highest high watermark.
        let leads = |x: &ReplicaState| (x.role.as_deref() == Some("leader"), x.high_watermark);
        if leads(r) > leads(slot) {
            *slot = r;
        }
    }
    let changes = run
        .digest
        .faults
        .iter()
        .filter(|f| f.label.starts_with("failover") || f.label.starts_with("failback"));
    html! {
        section #clusters {
            h2 { "Clusters" }
            h3 { "Mirror direction" }
            @if run.digest.bands.is_empty() { p.note { "The history records no mirroring topology." } }
            @else {
                p.note { "The writable cluster and those mirroring from it, as the plots' bottom strip shows; "
                    "each band starts at a failover or failback." }
                table {
                    tr { th { "from (s)" } th { "to (s)" } th { "direction" } }
                    @for b in &run.digest.bands {
                        tr {
                            td.num { (secs(b.start)) } td.num { (secs(b.end)) }
                            td { span.swatch style=(format!("background:{}", plot::band_css(&run.digest.bands, b))) {} (b.label()) }
                        }
                    }
                }
                h3 { "Failovers and failbacks" }
                ul { @for f in changes { li { (secs(f.start)) " s: " (f.label) } } }
            }
            @if !parts.is_empty() {
                h3 { "Final offsets per cluster" }
                p.note { "Each partition's final log in each cluster (its leader, else the replica with the highest high watermark): "
                    "log start, high watermark, log end, and the latest epoch of its cache." }
                table {
                    tr { th { "partition" } @for c in &names { th { "cluster " (c) } } }
                    @for ((topic, partition), by_cluster) in &parts {
                        tr {
                            td { (topic) "/" (partition) }
                            @for c in &names {
                                @match by_cluster.get(c) {
                                    Some(r) => td.num {
                                        (r.node) " · start " (opt(r.log_start_offset)) " · hw " (opt(r.high_watermark))
                                        " · end " (opt(r.log_end_offset)) " · epoch " (opt(r.epochs.last().map(|e| e.epoch)))
                                    },
                                    None => td.missing { "—" },
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn offset_views(run: &Run) -> Markup {
    if run.offsets.is_empty() {
        return html! {};
    }
    let ids = evidence_ids(run);
    // The clusters' views of one partition go side by side, their rows aligned by offset.
    let mut groups: BTreeMap<(&str, i64), Vec<usize>> = BTreeMap::new();
    for (i, v) in run.offsets.iter().enumerate() {
        groups
            .entry((v.key.1.as_str(), v.key.2))
            .or_default()
            .push(i);
    }
    let mut order: Vec<&Vec<usize>> = groups.values().collect();
    order.sort_by_key(|g| g[0]);
    html! {
        section #offsets {
            h2 { "Offsets" }
            p.note { "For each partition with anomalies: the offsets within " (WINDOW)
                " of each anomalous offset (underlined), and the value each acknowledged send, each poll "
                "and each final replica holds there. Contested offsets are highlighted; at them each "
                "value has its own colour. With several clusters, each cluster's view of a partition "
                "stands beside the others, over the same offsets." }
            @for g in order {
                @if g.len() == 1 { (view(g[0], &run.offsets[g[0]], &ids)) }
                @else {
                    h3 { (run.offsets[g[0]].key.1) "/" (run.offsets[g[0]].key.2) " in clusters "
                        (g.iter().map(|&i| run.offsets[i].key.0.as_str()).collect::<Vec<_>>().join(", ")) }
                    div.side { @for &i in g { div { (view(i, &run.offsets[i], &ids)) } } }
                }
            }
        }
    }
}

fn view(i: usize, v: &View, ids: &BTreeMap<u64, u64>) -> Markup {
    let cols = 3 + v.replicas.len();
    html! {
        h3 #(format!("offsets-{i}")) { (part_name(&v.key)) }
        @if v.left_out > 0 { p.note { (v.left_out) " more anomalous offsets have no window here." } }
        @if v.rows.is_empty() { p.note { "The anomalies here name no offset." } }
        @else {
            table {
                tr {
                    th { "offset" } th { "acknowledged sends" } th { "polls" }
                    @for r in &v.replicas {
                        th {
                            (r.node) @if let Some(role) = &r.role { " (" (role) ")" }
                            br;
                            span.note { "start " (opt(r.log_start)) " · hw " (opt(r.high_watermark)) " · end " (opt(r.log_end)) }
                            @if let Some(e) = &r.error { br; span.bad { (clip(e, 80)) } }
                        }
                    }
                }
                @for row in &v.rows {
                    @if row.gap_before { tr.gap { td colspan=(cols) { "…" } } }
                    @let values = row.values();
                    @let class = |x: i64| -> String {
                        if row.contested {
                            format!("v{}", values.iter().position(|&y| y == x).unwrap_or(0) % 8)
                        } else { String::new() }
                    };
                    tr.contested[row.contested] {
                        td.off.focus[v.focus.contains(&row.offset)].num { (row.offset) }
                        td {
                            @for (value, op) in &row.sends {
                                span class=(class(*value)) { (value) } " " (op_link(*op, ids)) br;
                            }
                        }
                        td {
                            @for (value, epoch, count, op) in &row.polls {
                                span class=(class(*value)) { (value) }
                                @if let Some(e) = epoch { span.note { " e" (e) } }
                                " ×" (count) " first " (op_link(*op, ids)) br;
                            }
                        }
                        @for c in &row.cells {
                            @match c {
                                Cell::Record(r) => {
                                    td class=(class(r.value)) { (r.value)
                                        @if let Some(e) = r.epoch { span.note { " e" (e) } } }
                                }
                                Cell::Missing(why) => { td.missing title=(why) { "— " span.note { (why) } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "?".to_owned(), |v| v.to_string())
}

fn evidence(run: &Run) -> Markup {
    let proc_name = |e: &Evidence| {
        e.invoke
            .as_ref()
            .or(e.completion.as_ref())
            .map(|o| o.process.to_string())
    };
    html! {
        section #evidence {
            h2 { "Ops named by anomalies" }
            @if run.digest.evidence.is_empty() { p { "None." } }
            @else {
                p.note { "Each op as invoked and as completed. “timeline” opens its page of the timeline." }
                table {
                    tr { th { "op" } th { "process" } th { "node" } th { "f" } th { "type" }
                         th { "invoked (s)" } th { "latency" } th { "invocation" } th { "completion" }
                         th { "error" } th { "" } }
                    @for (row, e) in &run.digest.evidence {
                        @let done = e.completion.as_ref();
                        @let inv = e.invoke.as_ref();
                        tr #(format!("op-{row}")) {
                            td.num {
                                @if let Some(i) = inv.filter(|i| i.index != *row) {
                                    a id=(format!("op-{}", i.index)) {}
                                    (i.index) " → "
                                }
                                (row)
                            }
                            td { (proc_name(e).unwrap_or_default()) }
                            td { (inv.or(done).and_then(|o| o.node.as_deref()).unwrap_or("")) }
                            td { (inv.or(done).map(|o| o.f.as_str()).unwrap_or("")) }
                            @let t = done.map_or("pending", |d| match d.kind {
                                tidemark_checkers::OpType::Ok => "ok",
                                tidemark_checkers::OpType::Fail => "fail",
                                _ => "info",
                            });
                            td class=(t) { (t) }
                            td.num { (inv.or(done).map(|o| secs(o.time)).unwrap_or_default()) }
                            td.num { @if let (Some(i), Some(d)) = (inv, done) { (duration(d.time.saturating_sub(i.time))) } }
                            td { code { (inv.map(|o| json_clip(&o.value, VALUE_CHARS)).unwrap_or_default()) } }
                            td { code { (done.map(|o| json_clip(&o.value, VALUE_CHARS)).unwrap_or_default()) } }
                            td { (done.and_then(|d| d.error.as_deref()).map(|e| clip(e, 400)).unwrap_or_default()) }
                            td { a href=(format!("#t-{row}")) data-op=(row) { "timeline" } }
                        }
                    }
                }
            }
        }
    }
}

fn timeline(run: &Run) -> Markup {
    let n = page_count(run);
    let pages = embedded_pages(run);
    let mut by_page: BTreeMap<u64, Vec<&OpRow>> = pages.iter().map(|&p| (p, Vec::new())).collect();
    for r in &run.digest.ops {
        if let Some(rows) = by_page.get_mut(&page_of(r)) {
            rows.push(r);
        }
    }
    for rows in by_page.values_mut() {
        rows.sort_by_key(|r| (r.start, r.index));
    }
    let start = match run.embed {
        Embed::One(k) => k.min(n - 1),
        Embed::Report => 0,
    };
    let serve_path = format!(
        "/timeline/{}?page={{page0}}",
        encode_path(&run.store_path.split('/').collect::<Vec<_>>())
    );
    let missing = format!(
        "Page {{page}} of {n} is not in this file: a report embeds at most {MAX_EMBEDDED_PAGES} \
         pages (those with ops named by anomalies, the first, the last and evenly spaced others) \
         so that it stays small. Every page is in history.jsonl; `tidemark serve` shows this one \
         at {serve_path}."
    );
    html! {
        section #timeline .tl data-pages=(n) data-size=(PAGE_LINES) data-start=(start)
            data-missing=(missing) data-nav=[matches!(run.embed, Embed::One(_)).then_some("1")] {
            h2 { "Timeline" }
            p.note {
                "Every op, one column per process, in " (n) @if n == 1 { " page" } @else { " pages" } ": page k shows the ops completed in history lines "
                "k×" (PAGE_LINES) " to (k+1)×" (PAGE_LINES) "−1, ordered by invocation. Hover an op for its details. "
                @if let Embed::One(_) = run.embed { "This view holds page " (start + 1) "; the pager loads the others." }
                @else if pages.len() as u64 == n { "All " (n) " pages are in this file." }
                @else { (pages.len()) " of the " (n) " pages are in this file (pages "
                    (clip(&pages.iter().map(|p| (p + 1).to_string()).collect::<Vec<_>>().join(", "), 400))
                    "); the others are named where they would be." }
            }
            div.tl-nav {
                button.tl-first type="button" { "« first" }
                button.tl-prev type="button" { "‹ prev" }
                "page " input.tl-num type="number" min="1" max=(n) value=(start + 1); " of " (n)
                button.tl-next type="button" { "next ›" }
                button.tl-last type="button" { "last »" }
                span.tl-status.note { "page " (start + 1) " of " (n) }
            }
            noscript { p { "The timeline pages need JavaScript; the ops anomalies name are listed above." } }
            div.tl-body {}
            @for (k, rows) in &by_page {
                div.tl-data hidden data-page=(k) { (page_data(run, rows)) }
            }
        }
    }
}

fn replicas(run: &Run) -> Markup {
    let Some(replicas) = &run.replicas else {
        return html! {
            section #replicas { h2 { "Final replicas" } p { "No replicas.jsonl in this run." } }
        };
    };
    let marks = divergent_cells(replicas);
    let diverging = diverging_nodes(run);
    html! {
        section #replicas {
            h2 { "Final replicas" }
            p.note { "Cells that differ from the partition's leader (or, without a leader, from the other "
                "replicas) are marked; a node marked in red diverges from another replica below both high watermarks." }
            @if replicas.len() > MAX_REPLICA_ROWS {
                p.note { "The first " (MAX_REPLICA_ROWS) " of " (replicas.len()) " replicas are shown; all are in replicas.jsonl." }
            }
            table {
                tr { th { "cluster" } th { "node" } th { "topic" } th { "partition" } th { "role" }
                     th { "log start" } th { "high watermark" } th { "end offset" } th { "epochs [epoch, start]" }
                     th { "records" } th { "unclean elections" } th { "error" } }
                @for (i, r) in replicas.iter().enumerate().take(MAX_REPLICA_ROWS) {
                    @let m = marks.get(&i).copied().unwrap_or_default();
                    @let key = (r.cluster.clone(), r.topic.clone(), r.partition);
                    tr {
                        td { (r.cluster) }
                        td.diverge[diverging.contains(&(key.clone(), r.node.clone()))] { (r.node) }
                        td { (r.topic) }
                        td.num {
                            @if let Some(v) = view_index(run, &key) { a href=(format!("#offsets-{v}")) { (r.partition) } }
                            @else { (r.partition) }
                        }
                        td { (r.role.as_deref().unwrap_or("?")) }
                        td.num.diverge[m[0]] { (opt(r.log_start_offset)) }
                        td.num.diverge[m[1]] { (opt(r.high_watermark)) }
                        td.num.diverge[m[2]] { (opt(r.log_end_offset)) }
                        td.diverge[m[3]] { (epochs(r)) }
                        td.num { (r.records.len()) }
                        td { (unclean_elections(r)) }
                        td { (r.error.as_deref().map(|e| clip(e, 200)).unwrap_or_default()) }
                    }
                }
            }
        }
    }
}

/// The epochs its broker elected the replica in uncleanly, each with the log end it had then:
/// where acknowledged records may have been cut.
fn unclean_elections(r: &ReplicaState) -> String {
    r.unclean_elections
        .iter()
        .map(|e| format!("epoch {} from {}", e.leader_epoch, e.log_end_offset))
        .collect::<Vec<_>>()
        .join(", ")
}

fn epochs(r: &ReplicaState) -> String {
    let mut s: Vec<String> = r
        .epochs
        .iter()
        .take(12)
        .map(|e| format!("[{}, {}]", e.epoch, e.start_offset))
        .collect();
    if r.epochs.len() > 12 {
        s.push(format!("… +{}", r.epochs.len() - 12));
    }
    s.join(" ")
}

type Fields = (Option<i64>, Option<i64>, Option<i64>, String);

/// Per replica (by position), which of log start, high watermark, end offset and epochs differ
/// from the reference replica of its partition: the leader, or else the most common value.
fn divergent_cells(replicas: &[ReplicaState]) -> BTreeMap<usize, [bool; 4]> {
    let mut groups: BTreeMap<(&str, &str, i64), Vec<usize>> = BTreeMap::new();
    for (i, r) in replicas.iter().enumerate() {
        if r.error.is_none() {
            groups
                .entry((&r.cluster, &r.topic, r.partition))
                .or_default()
                .push(i);
        }
    }
    let fields = |r: &ReplicaState| -> Fields {
        (
            r.log_start_offset,
            r.high_watermark,
            r.log_end_offset,
            epochs(r),
        )
    };
    let mut out = BTreeMap::new();
    for members in groups.values() {
        let reference = members
            .iter()
            .find(|&&i| replicas[i].role.as_deref() == Some("leader"))
            .or_else(|| members.first());
        let Some(&reference) = reference else {
            continue;
        };
        let want = fields(&replicas[reference]);
        for &i in members {
            let got = fields(&replicas[i]);
            let m = [
                got.0 != want.0,
                got.1 != want.1,
                got.2 != want.2,
                got.3 != want.3,
            ];
            if m.iter().any(|&x| x) {
                out.insert(i, m);
            }
        }
    }
    out
}

/// Nodes named by divergence anomalies, per partition.
fn diverging_nodes(run: &Run) -> BTreeSet<(PartKey, String)> {
    let mut out = BTreeSet::new();
    for k in run.kinds.iter().filter(|k| k.name == "divergence") {
        for e in &k.entries {
            let Some((key, _)) = e.places.first() else {
                continue;
            };
            for r in e
                .json
                .get("replicas")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = r.get("node").and_then(Value::as_str) {
                    out.insert((key.clone(), n.to_owned()));
                }
            }
        }
    }
    out
}

fn logs(run: &Run) -> Markup {
    html! {
        section #logs {
            h2 { "Node logs" }
            @if run.logs.is_empty() { p { "No node logs in this run (nodes/ is empty or missing)." } }
            @else {
                p.note {
                    "Excerpts of each file in nodes/<node>/ around each anomaly (±" (crate::logs::SPAN_S)
                    " s, at most " (crate::logs::HALF * 2) " lines nearest it). "
                    @match &run.start {
                        Some(s) => { "The test's wall-clock start is from " (s.source) "." }
                        None => { "The test's wall-clock start is unknown, so files show their tails." }
                    }
                }
            }
            @if run.logs_left_out > 0 {
                p.note { (run.logs_left_out) " more nodes have logs in nodes/; they are not excerpted here." }
            }
            @for n in &run.logs {
                h3 { (n.node) }
                @if n.left_out > 0 { p.note { (n.left_out) " more files are in nodes/" (n.node) "/." } }
                @for f in &n.files {
                    h4 {
                        a href=(encode_path(&["nodes", &n.node, &f.name])) { (f.name) }
                        span.note { " " (f.size) " bytes" }
                    }
                    @if let Some(why) = &f.skipped { p.note { "Not shown: " (why) "." } }
                    @for x in &f.excerpts {
                        details open[!x.lines.is_empty()] {
                            summary { "near " (x.label) ": " (x.in_span) " lines within ±" (crate::logs::SPAN_S) " s"
                                @if (x.lines.len() as u64) < x.in_span { ", " (x.lines.len()) " shown" } }
                            @if !x.lines.is_empty() { pre { (lines(&x.lines)) } }
                        }
                    }
                    @if let Some((tail, why)) = &f.tail {
                        p.note { (why) }
                        pre { (lines(tail)) }
                    }
                }
            }
        }
    }
}

fn lines(lines: &[Line]) -> String {
    let mut out = String::new();
    for l in lines {
        out.push_str(&format!("{:>7}  {}\n", l.number, one_line(&l.text)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn paths_are_quoted_only_when_a_shell_would_split_them() {
        assert_eq!(
            shell_word("store/queue/20240229T235959.123Z"),
            "store/queue/20240229T235959.123Z"
        );
        assert_eq!(shell_word("my runs/it's"), r"'my runs/it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
