//! The results browser behind `tidemark serve`: the store's runs newest first, coloured by
//! verdict and filtered by test, verdict and anomaly type; each run's report (rendered on the
//! fly when the run has none), history, results and node logs; any timeline page of any run;
//! and a run as a `.tar.gz`. Jepsen's `serve` lists and zips runs but cannot filter; this adds
//! the filters its maintainers wish for.
//!
//! Nothing outside the store is ever served: a requested path is refused when it is absolute or
//! has a `.` or `..` segment (after percent-decoding), and what remains must canonicalize
//! (following symlinks) to a path inside the canonical store. Only a run directory's own
//! `report.html` (`<test>/<stamp>/` holding test.json and history.jsonl) is served as HTML.
//!
//! The server is meant for a browser on this machine, and defends itself against the rest:
//! a request must name this server in its Host header (an IP address or `localhost`, with the
//! bound port), so a page on another site cannot read the store through DNS rebinding; clients
//! get [`Limits::header_timeout`] to send a request's headers (which also closes idle kept-alive
//! connections) and at most [`Limits::connections`] connections are served at once. Rendering is
//! the expensive part: a page rendered on request is kept (until the run's files change) and
//! at most [`Limits::renders`] renders run at once.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Deserialize;
use tidemark_checkers::Validity;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OnceCell, Semaphore};

use crate::text::{encode_path, encode_segment};

/// Runs listed per index page.
pub const RUNS_PER_PAGE: usize = 200;

const CSP_REPORT: &str = "default-src 'none'; style-src 'unsafe-inline'; \
    script-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";
const CSP_INDEX: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'";

const CSS: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1300px;padding:0 18px 40px;color:#1d1d1d;background:#f7f7f5}
table{border-collapse:collapse;background:#fff;width:100%}
td,th{border:1px solid #dadada;padding:3px 8px;text-align:left}
th{background:#efefef}
tr.valid td:first-child{border-left:6px solid #2e7d32}tr.valid{background:#eef7ee}
tr.invalid td:first-child{border-left:6px solid #c62828}tr.invalid{background:#fdeaea}
tr.unknown td:first-child{border-left:6px solid #d9822b}tr.unknown{background:#fdf3e6}
tr.unchecked td:first-child{border-left:6px solid #8a8a8a}
.bad{color:#c62828;font-weight:600}.note{color:#555}
form{margin:12px 0;display:flex;gap:12px;align-items:center}
a{color:#1f5fa8}td a{margin-right:8px}
"#;

/// How much the server takes on.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time a client gets to send a request's headers; also how long a kept-alive connection
    /// may sit idle.
    pub header_timeout: Duration,
    /// Longest a connection stays open, however busy (a slow reader of a large archive too).
    pub connection_lifetime: Duration,
    /// Connections served at once; past that a connection gets 503 and is closed.
    pub connections: usize,
    /// Reports and timeline pages rendered at once.
    pub renders: usize,
    /// Rendered pages kept for the next request.
    pub cached_pages: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            connection_lifetime: Duration::from_secs(600),
            connections: 64,
            renders: 2,
            cached_pages: 16,
        }
    }
}

struct Store {
    root: PathBuf,
    renders: Renders,
}

/// The browser's routes over the store at `store`, answering only requests whose Host header
/// names `bound`.
pub fn router(store: &Path, bound: SocketAddr, limits: &Limits) -> anyhow::Result<Router> {
    let root = std::fs::canonicalize(store)
        .map_err(|e| anyhow::anyhow!("store {}: {e}", store.display()))?;
    if !root.is_dir() {
        anyhow::bail!("store {} is not a directory", store.display());
    }
    let renders = Renders {
        slots: Arc::new(Semaphore::new(limits.renders.max(1))),
        pages: Mutex::new(VecDeque::new()),
        keep: limits.cached_pages,
    };
    Ok(Router::new()
        .route("/", get(index))
        .route("/runs/{*path}", get(file))
        .route("/timeline/{*path}", get(timeline))
        .route("/archive/{*path}", get(archive))
        .with_state(Arc::new(Store { root, renders }))
        .layer(middleware::from_fn_with_state(bound, check_host)))
}

/// Serves the browser on `listener` with the default [`Limits`] until the process ends.
pub async fn serve(listener: TcpListener, store: &Path) -> anyhow::Result<()> {
    serve_with(listener, store, Limits::default()).await
}

/// Serves the browser on `listener` within `limits` until the process ends.
pub async fn serve_with(listener: TcpListener, store: &Path, limits: Limits) -> anyhow::Result<()> {
    let bound = listener.local_addr()?;
    let app = router(store, bound, &limits)?;
    let open = Arc::new(Semaphore::new(limits.connections));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of file descriptors and the like: give open connections a moment to close.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tokio::spawn(turn_away(stream));
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let limits = limits.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            // A connection that errs or outlives its time is simply closed.
            let _ = tokio::time::timeout(limits.connection_lifetime, conn).await;
        });
    }
}

/// Answers a connection past the limit with 503 and closes it, reading (briefly) what the
/// client sent so the close does not reset the connection before the answer arrives.
async fn turn_away(mut stream: TcpStream) {
    let body = "refused: too many open connections";
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Whether a Host header names this server: an IP address this server listens on (any address
/// when bound to all of them; rebinding needs a name, so an address is safe) or a loopback
/// name, with the bound port (80 when the header gives none).
fn host_allowed(host: &str, bound: SocketAddr) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, "")) => (ip, None),
            Some((ip, port)) => match port.strip_prefix(':') {
                Some(p) => (ip, Some(p)),
                None => return false,
            },
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        },
    };
    let port_ok = match port {
        Some(p) => p.parse::<u16>().ok() == Some(bound.port()),
        None => bound.port() == 80,
    };
    let name_ok = if name.eq_ignore_ascii_case("localhost") {
        true
    } else {
        match name.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == bound.ip() || bound.ip().is_unspecified(),
            Err(_) => false,
        }
    };
    port_ok && name_ok
}

async fn check_host(State(bound): State<SocketAddr>, req: Request, next: Next) -> Response {
    match req.headers().get(header::HOST).map(|h| h.to_str()) {
        None => (
            StatusCode::BAD_REQUEST,
            "refused: the request has no Host header",
        )
            .into_response(),
        Some(Ok(host)) if host_allowed(host, bound) => next.run(req).await,
        Some(_) => (
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "refused: the Host header does not name this server; use http://localhost:{}/ \
                 or http://{bound}/",
                bound.port()
            ),
        )
            .into_response(),
    }
}

/// A page rendered on request, with the state of the run's files it was rendered from.
struct Cached {
    key: (PathBuf, Option<u64>),
    files: Vec<(PathBuf, u64, Option<SystemTime>)>,
    page: Arc<OnceCell<Result<Bytes, String>>>,
}

/// Renders on request: each page once per state of its run's files, at most `slots` at a time.
struct Renders {
    slots: Arc<Semaphore>,
    pages: Mutex<VecDeque<Cached>>,
    keep: usize,
}

/// The run's files (top level and `nodes/<node>/`) with their sizes and times: a render of the
/// run stays good while these stay the same.
fn run_files(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    let nodes = dir.join("nodes");
    if let Ok(d) = std::fs::read_dir(&nodes) {
        dirs.extend(d.flatten().map(|e| e.path()));
        dirs.push(nodes);
    }
    for d in dirs {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if let Ok(m) = e.metadata() {
                if m.is_file() {
                    out.push((e.path(), m.len(), m.modified().ok()));
                }
            }
        }
    }
    out.sort();
    out
}

impl Renders {
    /// The page `page` (a whole report when `None`) of the run at `dir`, rendered by `f`
    /// unless a render from the same files is kept.
    async fn get(
        &self,
        dir: PathBuf,
        page: Option<u64>,
        f: impl FnOnce() -> anyhow::Result<String> + Send + 'static,
    ) -> Result<Bytes, String> {
        let probe = dir.clone();
        let files = tokio::task::spawn_blocking(move || run_files(&probe))
            .await
            .map_err(|e| e.to_string())?;
        let key = (dir, page);
        let cell = {
            let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
            let at = pages.iter().position(|c| c.key == key);
            match at {
                Some(i) if pages[i].files == files => pages[i].page.clone(),
                _ => {
                    if let Some(i) = at {
                        pages.remove(i);
                    }
                    let page = Arc::new(OnceCell::new());
                    pages.push_back(Cached {
                        key,
                        files,
                        page: page.clone(),
                    });
                    while pages.len() > self.keep.max(1) {
                        pages.pop_front();
                    }
                    page
                }
            }
        };
        // Requests for the same page wait for one render; the slot travels with the render, so
        // a client that goes away does not free it while the render still runs.
        cell.get_or_init(|| async {
            let slot = self
                .slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| e.to_string())?;
            let rendered = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                f()
            })
            .await;
            match rendered {
                Ok(Ok(html)) => Ok(Bytes::from(html)),
                Ok(Err(e)) => Err(format!("cannot render: {e:#}")),
                Err(e) => Err(format!("cannot render: {e}")),
            }
        })
        .await
        .clone()
    }
}

/// Why a path is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Absolute, or with a `.`/`..` segment, a backslash or a NUL.
    BadPath,
    /// Does not exist.
    Missing,
    /// Resolves outside the store.
    Outside,
}

impl Refused {
    fn status(&self) -> StatusCode {
        match self {
            Refused::BadPath => StatusCode::BAD_REQUEST,
            Refused::Missing => StatusCode::NOT_FOUND,
            Refused::Outside => StatusCode::FORBIDDEN,
        }
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let msg = match self {
            Refused::BadPath => "refused: the path must be relative, without . or .. segments",
            Refused::Missing => "not found",
            Refused::Outside => "refused: the path leads outside the store",
        };
        (self.status(), msg).into_response()
    }
}

/// Checks the shape of a relative path: no absolute path, no `.` or `..` segment.
fn check_relative(rel: &str) -> Result<(), Refused> {
    if rel.starts_with('/') || rel.contains(['\\', '\0']) {
        return Err(Refused::BadPath);
    }
    if rel.split('/').any(|s| s == ".." || s == ".") {
        return Err(Refused::BadPath);
    }
    Ok(())
}

/// `rel` (already percent-decoded) inside the canonical store `root`, canonicalized; refused
/// when absolute, when it has a `.`/`..` segment, or when a symlink takes it outside.
pub fn resolve(root: &Path, rel: &str) -> Result<PathBuf, Refused> {
    check_relative(rel)?;
    let canon = std::fs::canonicalize(root.join(rel)).map_err(|_| Refused::Missing)?;
    if !canon.starts_with(root) {
        return Err(Refused::Outside);
    }
    Ok(canon)
}

#[derive(Deserialize, Default)]
struct Filter {
    test: Option<String>,
    verdict: Option<String>,
    anomaly: Option<String>,
    page: Option<usize>,
}

/// A run as the index lists it.
struct RunEntry {
    test: String,
    stamp: String,
    verdict: &'static str,
    anomalies: Vec<String>,
    bad: Vec<String>,
    has_report: bool,
    /// `test/stamp` of the run of this store it was shrunk from (test.json's `shrunk_from`).
    shrunk_from: Option<String>,
}

impl RunEntry {
    fn key(&self) -> String {
        format!("{}/{}", self.test, self.stamp)
    }
}

/// The shape of test.json the index reads.
#[derive(Deserialize)]
struct TestSummary {
    shrunk_from: Option<PathBuf>,
}

/// `original` as `test/stamp` when it is a run directory of the store at `root` (canonical).
fn store_key(root: &Path, original: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(original).ok()?;
    let rel = canon.strip_prefix(root).ok()?;
    let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
    (parts.len() == 2).then(|| parts.join("/"))
}

/// The runs in the order the index lists them: each with the runs shrunk from it right after it
/// (marked `true`); a shrunk run whose original is not listed keeps its own place.
fn nested<'a>(runs: &[&'a RunEntry]) -> Vec<(&'a RunEntry, bool)> {
    let listed: std::collections::BTreeSet<String> = runs.iter().map(|r| r.key()).collect();
    let under_listed = |r: &RunEntry| r.shrunk_from.as_ref().is_some_and(|k| listed.contains(k));
    let mut out = Vec::with_capacity(runs.len());
    for run in runs.iter().filter(|r| !under_listed(r)) {
        out.push((*run, false));
        let key = run.key();
        out.extend(
            runs.iter()
                .filter(|r| r.shrunk_from.as_deref() == Some(key.as_str()))
                .map(|r| (*r, true)),
        );
    }
    out
}

#[derive(Deserialize)]
struct ResultsSummary {
    valid: Validity,
    #[serde(default)]
    anomaly_types: Vec<String>,
    #[serde(default)]
    bad_anomaly_types: Vec<String>,
}

fn real_dirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                // `latest` links and anything else that is not a real directory are skipped.
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn scan(root: &Path) -> Vec<RunEntry> {
    let mut runs = Vec::new();
    for (test, test_dir) in real_dirs(root) {
        for (stamp, dir) in real_dirs(&test_dir) {
            let results = std::fs::read(dir.join("results.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<ResultsSummary>(&b).ok());
            if results.is_none() && !dir.join("history.jsonl").is_file() {
                continue;
            }
            let (verdict, anomalies, bad) = match results {
                Some(r) => (
                    match r.valid {
                        Validity::Valid => "valid",
                        Validity::Invalid => "invalid",
                        Validity::Unknown => "unknown",
                    },
                    r.anomaly_types,
                    r.bad_anomaly_types,
                ),
                None => ("unchecked", Vec::new(), Vec::new()),
            };
            let shrunk_from = std::fs::read(dir.join("test.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<TestSummary>(&b).ok())
                .and_then(|t| t.shrunk_from)
                .and_then(|original| store_key(root, &original));
            runs.push(RunEntry {
                test: test.clone(),
                stamp,
                verdict,
                anomalies,
                bad,
                has_report: dir.join("report.html").is_file(),
                shrunk_from,
            });
        }
    }
    // Stamps are UTC times that sort as text: newest first across tests.
    runs.sort_by(|a, b| b.stamp.cmp(&a.stamp).then_with(|| a.test.cmp(&b.test)));
    runs
}

fn html_response(markup: Markup, csp: &'static str) -> Response {
    let mut r = markup.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

async fn index(State(store): State<Arc<Store>>, Query(filter): Query<Filter>) -> Response {
    let root = store.root.clone();
    let Ok(runs) = tokio::task::spawn_blocking(move || scan(&root)).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    html_response(index_page(&runs, &filter), CSP_INDEX)
}

fn index_page(runs: &[RunEntry], filter: &Filter) -> Markup {
    let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    let (test, verdict, anomaly) = (
        nonempty(&filter.test),
        nonempty(&filter.verdict),
        nonempty(&filter.anomaly),
    );
    let tests: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.test.as_str()).collect();
    let kinds: std::collections::BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| r.anomalies.iter().map(String::as_str))
        .chain(tidemark_checkers::AnomalyKind::ALL.iter().map(|k| k.name()))
        .collect();
    let shown: Vec<&RunEntry> = runs
        .iter()
        .filter(|r| test.as_ref().is_none_or(|t| &r.test == t))
        .filter(|r| verdict.as_ref().is_none_or(|v| r.verdict == v))
        .filter(|r| anomaly.as_ref().is_none_or(|a| r.anomalies.contains(a)))
        .collect();
    let shown = nested(&shown);
    let pages = shown.len().div_ceil(RUNS_PER_PAGE).max(1);
    let page = filter.page.unwrap_or(0).min(pages - 1);
    let link = |p: usize| {
        let mut q = vec![format!("page={p}")];
        for (k, v) in [
            ("test", &test),
            ("verdict", &verdict),
            ("anomaly", &anomaly),
        ] {
            if let Some(v) = v {
                q.push(format!("{k}={}", encode_segment(v)));
            }
        }
        format!("/?{}", q.join("&"))
    };
    let selected = |cur: &Option<String>, v: &str| cur.as_deref() == Some(v);
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "tidemark runs" } style { (PreEscaped(CSS)) } }
            body {
                h1 { "tidemark runs" }
                form method="get" action="/" {
                    label { "test " select name="test" {
                        option value="" { "any" }
                        @for t in &tests { option value=(t) selected[selected(&test, t)] { (t) } }
                    } }
                    label { "verdict " select name="verdict" {
                        option value="" { "any" }
                        @for v in ["valid", "invalid", "unknown", "unchecked"] {
                            option value=(v) selected[selected(&verdict, v)] { (v) }
                        }
                    } }
                    label { "anomaly " select name="anomaly" {
                        option value="" { "any" }
                        @for k in &kinds { option value=(k) selected[selected(&anomaly, k)] { (k) } }
                    } }
                    button type="submit" { "filter" }
                    a href="/" { "clear" }
                }
                p.note {
                    @if shown.is_empty() { "No runs match." }
                    @else {
                        "Runs " (page * RUNS_PER_PAGE + 1) "–" ((page * RUNS_PER_PAGE + RUNS_PER_PAGE).min(shown.len()))
                        " of " (shown.len()) " matching (" (runs.len()) " in the store), newest first; page "
                        (page + 1) " of " (pages) ". "
                        @if page > 0 { a href=(link(page - 1)) { "‹ newer" } " " }
                        @if page + 1 < pages { a href=(link(page + 1)) { "older ›" } }
                    }
                }
                table #runs {
                    tr { th { "started (UTC)" } th { "test" } th { "verdict" } th { "anomalies" } th { "files" } }
                    @for (r, shrunk) in shown.iter().skip(page * RUNS_PER_PAGE).take(RUNS_PER_PAGE) {
                        @let base = encode_path(&[&r.test, &r.stamp]);
                        tr class=(r.verdict) {
                            td { @if *shrunk { "↳ " } (r.stamp) }
                            td { (r.test) @if *shrunk { " (shrunk from the run above)" } }
                            td { (r.verdict) }
                            td {
                                @for (i, a) in r.anomalies.iter().enumerate() {
                                    @if i > 0 { ", " }
                                    @if r.bad.contains(a) { span.bad { (a) } } @else { (a) }
                                }
                            }
                            td {
                                a href=(format!("/runs/{base}/report.html")) {
                                    "report" @if !r.has_report { " (rendered now)" }
                                }
                                a href=(format!("/runs/{base}/history.jsonl")) { "history" }
                                a href=(format!("/runs/{base}/results.json")) { "results" }
                                a href=(format!("/runs/{base}/nodes/")) { "node logs" }
                                a href=(format!("/runs/{base}/")) { "files" }
                                a href=(format!("/archive/{base}")) { "tar.gz" }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, e)| e) {
        Some("json") => "application/json",
        Some("jsonl" | "log" | "txt" | "properties" | "csv" | "md" | "edn") => {
            "text/plain; charset=utf-8"
        }
        _ => "application/octet-stream",
    }
}

/// Whether `dir` (canonical) is a run directory of the store at `root`: `<test>/<stamp>/`
/// holding test.json and history.jsonl.
fn is_run(root: &Path, dir: &Path) -> bool {
    dir.parent().and_then(Path::parent) == Some(root)
        && dir.join("test.json").is_file()
        && dir.join("history.jsonl").is_file()
}

async fn file(State(store): State<Arc<Store>>, UrlPath(rel): UrlPath<String>) -> Response {
    let root = store.root.clone();
    // A run without report.html gets one rendered for this request (and not written).
    if let Some(run) = rel.strip_suffix("report.html") {
        let run = run.trim_end_matches('/');
        if check_relative(&rel).is_ok() && !root.join(&rel).exists() {
            let dir = match resolve(&root, run) {
                Ok(d) if is_run(&root, &d) => d,
                Ok(_) => return Refused::Missing.into_response(),
                Err(e) => return e.into_response(),
            };
            let at = dir.clone();
            let page = store
                .renders
                .get(dir, None, move || crate::render_report(&at));
            return render(page.await);
        }
    }
    let path = match resolve(&root, &rel) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if path.is_dir() {
        if !rel.is_empty() && !rel.ends_with('/') {
            let last = rel.rsplit('/').next().unwrap_or_default();
            return Redirect::to(&format!("{}/", encode_segment(last))).into_response();
        }
        return html_response(listing(&rel, &path), CSP_INDEX);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(_) => return Refused::Missing.into_response(),
    };
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    // Only a run's own report is served as HTML; anything a node wrote is text or bytes.
    let is_report = name == "report.html" && path.parent().is_some_and(|d| is_run(&root, d));
    let (ctype, csp) = if is_report {
        ("text/html; charset=utf-8", CSP_REPORT)
    } else {
        (content_type(&name), "default-src 'none'")
    };
    (
        [
            (header::CONTENT_TYPE, ctype),
            (header::CONTENT_SECURITY_POLICY, csp),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

fn render(page: Result<Bytes, String>) -> Response {
    match page {
        Ok(html) => (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CONTENT_SECURITY_POLICY, CSP_REPORT),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            html,
        )
            .into_response(),
        Err(e) => (StatusCode::UNPROCESSABLE_ENTITY, e).into_response(),
    }
}

fn listing(rel: &str, dir: &Path) -> Markup {
    let mut entries: Vec<(String, bool)> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let is_dir = e.path().is_dir();
                    (e.file_name().to_string_lossy().into_owned(), is_dir)
                })
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "/" (rel) } style { (PreEscaped(CSS)) } }
            body {
                p { a href="/" { "all runs" } }
                h1 { "/" (rel) }
                ul {
                    li { a href="../" { "../" } }
                    @for (name, is_dir) in &entries {
                        @let href = if *is_dir { format!("{}/", encode_segment(name)) } else { encode_segment(name) };
                        li { a href=(href) { (name) @if *is_dir { "/" } } }
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct PageQuery {
    page: Option<u64>,
}

async fn timeline(
    State(store): State<Arc<Store>>,
    UrlPath(rel): UrlPath<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    let dir = match resolve(&store.root, &rel) {
        Ok(d) if is_run(&store.root, &d) => d,
        Ok(_) => return Refused::Missing.into_response(),
        Err(e) => return e.into_response(),
    };
    let page = q.page.unwrap_or(0);
    let at = dir.clone();
    let rendered = store.renders.get(dir, Some(page), move || {
        crate::render_timeline_page(&at, page)
    });
    render(rendered.await)
}

/// Sends what it is given to the response body; fails once the client has gone.
struct ChannelWriter(tokio::sync::mpsc::Sender<std::io::Result<Bytes>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client gone"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `dir` as a gzipped tar, its entries under `prefix`, symlinks kept as links (never
/// followed, so the archive holds only what is inside the run).
pub fn write_archive<W: Write>(dir: &Path, prefix: &Path, out: W) -> std::io::Result<W> {
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    tar.append_dir_all(prefix, dir)?;
    tar.into_inner()?.finish()
}

async fn archive(State(store): State<Arc<Store>>, UrlPath(rel): UrlPath<String>) -> Response {
    let rel = rel.trim_end_matches('/').to_owned();
    let dir = match resolve(&store.root, &rel) {
        Ok(d) if is_run(&store.root, &d) => d,
        Ok(_) => return Refused::Missing.into_response(),
        Err(e) => return e.into_response(),
    };
    let names: Vec<String> = dir
        .strip_prefix(&store.root)
        .unwrap_or(&dir)
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let prefix: PathBuf = names.iter().collect();
    let file_name: String = names
        .join("-")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(8);
    tokio::task::spawn_blocking(move || {
        let out = std::io::BufWriter::with_capacity(1 << 16, ChannelWriter(tx.clone()));
        let done = write_archive(&dir, &prefix, out).and_then(|mut w| w.flush());
        if let Err(e) = done {
            // The client sees a cut body rather than a valid-looking partial archive.
            let _ = tx.blocking_send(Err(e));
        }
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    (
        [
            (header::CONTENT_TYPE, "application/gzip".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file_name}.tar.gz\""),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrunk_runs_are_listed_under_their_original() {
        let store = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(store.path()).unwrap();
        let run = |stamp: &str, test_json: serde_json::Value| {
            let dir = root.join("queue").join(stamp);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("history.jsonl"), "").unwrap();
            std::fs::write(dir.join("test.json"), test_json.to_string()).unwrap();
            dir
        };
        let original = run("20260101T000000.000Z", serde_json::json!({}));
        run("20260101T010000.000Z", serde_json::json!({}));
        run(
            "20260101T020000.000Z",
            serde_json::json!({"shrunk_from": original}),
        );
        run(
            "20260101T030000.000Z",
            serde_json::json!({"shrunk_from": "/elsewhere/queue/x"}),
        );
        let runs = scan(&root);
        let listed: Vec<&RunEntry> = runs.iter().collect();
        let order: Vec<(&str, bool)> = nested(&listed)
            .iter()
            .map(|(r, shrunk)| (r.stamp.as_str(), *shrunk))
            .collect();
        assert_eq!(
            order,
            [
                ("20260101T030000.000Z", false),
                ("20260101T010000.000Z", false),
                ("20260101T000000.000Z", false),
                ("20260101T020000.000Z", true),
            ]
        );
        // Filtered out, the original no longer holds its shrunk run.
        let without: Vec<&RunEntry> = runs
            .iter()
            .filter(|r| r.stamp != "20260101T000000.000Z")
            .collect();
        assert!(nested(&without).iter().all(|(_, shrunk)| !shrunk));
    }

    #[test]
    fn only_hosts_naming_this_server_are_answered() {
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for ok in [
            "localhost:8080",
            "LOCALHOST:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
        ] {
            assert!(host_allowed(ok, local), "{ok}");
        }
        for bad in [
            "localhost",
            "localhost:80",
            "evil.example:8080",
            "127.0.0.1.nip.io:8080",
            "10.0.0.5:8080",
            "[::1]8080",
            "[::1",
            "",
        ] {
            assert!(!host_allowed(bad, local), "{bad}");
        }
        let all: SocketAddr = "0.0.0.0:80".parse().unwrap();
        assert!(host_allowed("10.0.0.5", all));
        assert!(host_allowed("10.0.0.5:80", all));
        assert!(!host_allowed("box.example", all));
        let one: SocketAddr = "192.168.1.4:9000".parse().unwrap();
        assert!(host_allowed("192.168.1.4:9000", one));
        assert!(!host_allowed("192.168.1.5:9000", one));
    }

    fn renders(slots: usize) -> Renders {
        Renders {
            slots: Arc::new(Semaphore::new(slots)),
            pages: Mutex::new(VecDeque::new()),
            keep: 16,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_requests_for_a_page_share_one_render() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("history.jsonl"), "{}").unwrap();
        let r = Arc::new(renders(2));
        let calls = Arc::new(AtomicUsize::new(0));
        let asks: Vec<_> = (0..20)
            .map(|_| {
                let (r, calls, dir) = (r.clone(), calls.clone(), dir.path().to_path_buf());
                tokio::spawn(async move {
                    r.get(dir, None, move || {
                        calls.fetch_add(1, Ordering::SeqCst);
                        Ok("page".to_string())
                    })
                    .await
                })
            })
            .collect();
        for a in asks {
            assert_eq!(a.await.unwrap().unwrap(), Bytes::from("page"));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn renders_of_different_pages_take_turns() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let r = Arc::new(renders(2));
        let active = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let asks: Vec<_> = (0..8u64)
            .map(|page| {
                let (r, active, most) = (r.clone(), active.clone(), most.clone());
                let dir = dir.path().to_path_buf();
                tokio::spawn(async move {
                    r.get(dir, Some(page), move || {
                        let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        // Work long enough that unbounded renders would overlap.
                        let began = std::time::Instant::now();
                        let mut x = 0u64;
                        while began.elapsed() < Duration::from_millis(50) {
                            x = x.wrapping_mul(31).wrapping_add(7);
                        }
                        active.fetch_sub(1, Ordering::SeqCst);
                        Ok(x.to_string())
                    })
                    .await
                })
            })
            .collect();
        for a in asks {
            a.await.unwrap().unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!((1..=2).contains(&most), "{most} renders at once");
    }

    #[test]
    fn relative_paths_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("q/1")).unwrap();
        std::fs::write(root.join("q/1/a.log"), "x").unwrap();
        assert!(resolve(&root, "q/1/a.log").is_ok());
        assert_eq!(resolve(&root, "../etc/passwd"), Err(Refused::BadPath));
        assert_eq!(resolve(&root, "q/../../x"), Err(Refused::BadPath));
        assert_eq!(resolve(&root, "/etc/passwd"), Err(Refused::BadPath));
        assert_eq!(resolve(&root, "q/./1"), Err(Refused::BadPath));
        assert_eq!(resolve(&root, "q/nope"), Err(Refused::Missing));
        std::os::unix::fs::symlink("/etc", root.join("q/1/out")).unwrap();
        assert_eq!(resolve(&root, "q/1/out/passwd"), Err(Refused::Outside));
    }
}
