//! The results browser behind `tidemark serve`: the store's runs newest first, coloured by
//! verdict and filtered by test, verdict and anomaly type; each run's report (rendered on the
//! fly when the run has none), history, results and node logs; any timeline page of any run;
//! and a run as a `.tar.gz`. Jepsen's `serve` lists and zips runs but cannot filter; this adds
//! the filters its maintainers wish for.
//!
//! Nothing outside the store is ever served: a requested path is refused when it is absolute or
//! has a `.` or `..` segment (after percent-decoding), and what remains must canonicalize
//! (following symlinks) to a path inside the canonical store.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Deserialize;
use tidemark_checkers::Validity;
use tokio::net::TcpListener;

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

struct Store {
    root: PathBuf,
}

/// The browser's routes over the store at `store`.
pub fn router(store: &Path) -> anyhow::Result<Router> {
    let root = std::fs::canonicalize(store)
        .map_err(|e| anyhow::anyhow!("store {}: {e}", store.display()))?;
    if !root.is_dir() {
        anyhow::bail!("store {} is not a directory", store.display());
    }
    Ok(Router::new()
        .route("/", get(index))
        .route("/runs/{*path}", get(file))
        .route("/timeline/{*path}", get(timeline))
        .route("/archive/{*path}", get(archive))
        .with_state(Arc::new(Store { root })))
}

/// Serves the browser on `listener` until the process ends.
pub async fn serve(listener: TcpListener, store: &Path) -> anyhow::Result<()> {
    axum::serve(listener, router(store)?).await?;
    Ok(())
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
            runs.push(RunEntry {
                test: test.clone(),
                stamp,
                verdict,
                anomalies,
                bad,
                has_report: dir.join("report.html").is_file(),
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
                    @for r in shown.iter().skip(page * RUNS_PER_PAGE).take(RUNS_PER_PAGE) {
                        @let base = encode_path(&[&r.test, &r.stamp]);
                        tr class=(r.verdict) {
                            td { (r.stamp) }
                            td { (r.test) }
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

fn is_run(dir: &Path) -> bool {
    dir.join("history.jsonl").is_file()
}

async fn file(State(store): State<Arc<Store>>, UrlPath(rel): UrlPath<String>) -> Response {
    let root = store.root.clone();
    // A run without report.html gets one rendered for this request (and not written).
    if let Some(run) = rel.strip_suffix("report.html") {
        let run = run.trim_end_matches('/');
        if check_relative(&rel).is_ok() && !root.join(&rel).exists() {
            let dir = match resolve(&root, run) {
                Ok(d) if is_run(&d) => d,
                Ok(_) => return Refused::Missing.into_response(),
                Err(e) => return e.into_response(),
            };
            return render(move || crate::render_report(&dir)).await;
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
    let is_report = name == "report.html" && path.parent().is_some_and(is_run);
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

async fn render(f: impl FnOnce() -> anyhow::Result<String> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(html)) => html_response(PreEscaped(html), CSP_REPORT),
        Ok(Err(e)) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("cannot render: {e:#}"),
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
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
        Ok(d) if is_run(&d) => d,
        Ok(_) => return Refused::Missing.into_response(),
        Err(e) => return e.into_response(),
    };
    let page = q.page.unwrap_or(0);
    render(move || crate::render_timeline_page(&dir, page)).await
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
        Ok(d) if is_run(&d) || d.join("results.json").is_file() => d,
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
