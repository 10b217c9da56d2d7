//! The results browser, served in-process on a loopback port and spoken to over raw HTTP/1.1
//! (so request paths and headers reach the server exactly as written, `..` and all).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use common::STAMP;

const NEWER: &str = "20240301T000000.000Z";

struct Reply {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    get_as(addr, path, &format!("Host: {addr}\r\n"))
}

/// A GET with `host` as its Host header line (or none when empty).
fn get_as(addr: SocketAddr, path: &str, host: &str) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\n{host}Connection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = headers[9..12].parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// A store with an invalid run (with a report) and a newer valid run (without one), served.
fn served(store: &Path) -> (tokio::runtime::Runtime, SocketAddr) {
    let invalid = common::invalid_run(store, "queue", "t", "unclean-election", "x");
    tidemark_report::write_report(&invalid).unwrap();
    let valid = common::valid_run(store);
    std::fs::rename(&valid, valid.with_file_name(NEWER)).unwrap();
    std::os::unix::fs::symlink(NEWER, store.join("steady/latest")).unwrap();
    std::os::unix::fs::symlink("/etc", store.join("escape")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let root = store.to_path_buf();
    rt.spawn(async move { tidemark_report::serve::serve(listener, &root).await });
    (rt, addr)
}

#[test]
fn index_lists_runs_newest_first_and_filters() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    let index = get(addr, "/");
    assert_eq!(index.status, 200);
    let html = index.text();
    let (steady, queue) = (html.find(NEWER).unwrap(), html.find(STAMP).unwrap());
    assert!(steady < queue, "newest first");
    assert!(html.contains("<tr class=\"valid\">") && html.contains("<tr class=\"invalid\">"));
    assert!(html.contains("<span class=\"bad\">divergence</span>"));
    assert!(!html.contains(">latest<"), "links are not listed as runs");
    assert!(html.contains(&format!("/archive/queue/{STAMP}")));

    let only = |q: &str| {
        let h = get(addr, q).text();
        (h.contains(NEWER), h.contains(STAMP))
    };
    assert_eq!(only("/?verdict=invalid"), (false, true));
    assert_eq!(only("/?verdict=valid"), (true, false));
    assert_eq!(only("/?test=steady"), (true, false));
    assert_eq!(only("/?anomaly=divergence"), (false, true));
    assert_eq!(only("/?anomaly=mirror-divergence"), (false, false));
    assert_eq!(
        only("/?test=queue&verdict=invalid&anomaly=lost-write"),
        (false, true)
    );
    assert!(get(addr, "/?verdict=valid").text().contains("selected"));
}

#[test]
fn reports_files_and_timeline_pages() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    let r = get(addr, &format!("/runs/queue/{STAMP}/report.html"));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    assert!(r
        .header("content-security-policy")
        .unwrap()
        .contains("default-src 'none'"));
    assert!(r.text().contains("INVALID · queue"));

    // A run without report.html gets one rendered, and nothing is written into the store.
    let r = get(addr, &format!("/runs/steady/{NEWER}/report.html"));
    assert_eq!(r.status, 200);
    assert!(r.text().contains("VALID · steady"));
    assert!(!store
        .path()
        .join("steady")
        .join(NEWER)
        .join("report.html")
        .exists());
    assert_eq!(get(addr, "/runs/steady/latest/report.html").status, 200);

    let r = get(addr, &format!("/runs/queue/{STAMP}/history.jsonl"));
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"tidemark_history\":1"));
    let r = get(addr, &format!("/runs/queue/{STAMP}/results.json"));
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert!(r.text().contains("\"valid\": false"));
    let r = get(addr, &format!("/runs/queue/{STAMP}/nodes/n1/broker.log"));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert_eq!(
        r.header("x-content-type-options").as_deref(),
        Some("nosniff")
    );
    assert!(r.text().contains("appended offset 30"));
    // A node's file named like a report is not served as HTML.
    std::fs::write(
        store
            .path()
            .join("queue")
            .join(STAMP)
            .join("nodes/n1/report.html"),
        "<script>alert(1)</script>",
    )
    .unwrap();
    let r = get(addr, &format!("/runs/queue/{STAMP}/nodes/n1/report.html"));
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    let r = get(addr, &format!("/runs/queue/{STAMP}/nodes/"));
    assert!(r.text().contains("href=\"n1/\""));
    let r = get(addr, &format!("/runs/queue/{STAMP}/nodes"));
    assert_eq!(r.status, 303, "a directory gets its slash");

    let r = get(addr, &format!("/timeline/queue/{STAMP}?page=0"));
    assert_eq!(r.status, 200);
    assert!(r.text().contains("data-page=\"0\""));
    assert_eq!(
        get(addr, &format!("/timeline/queue/{STAMP}/nodes")).status,
        404
    );
    assert_eq!(get(addr, "/runs/queue/nope.json").status, 404);
}

#[test]
fn a_run_downloads_as_tar_gz() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    let r = get(addr, &format!("/archive/queue/{STAMP}"));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/gzip")
    );
    assert!(r.header("content-disposition").unwrap().contains(".tar.gz"));
    let out = tempfile::tempdir().unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(&r.body[..]))
        .unpack(out.path())
        .unwrap();
    let run = out.path().join("queue").join(STAMP);
    for f in [
        "history.jsonl",
        "results.json",
        "replicas.jsonl",
        "report.html",
        "nodes/n1/broker.log",
    ] {
        let want = std::fs::read(store.path().join("queue").join(STAMP).join(f)).unwrap();
        assert_eq!(std::fs::read(run.join(f)).unwrap(), want, "{f}");
    }
    // Through the `latest` link too.
    let r = get(addr, "/archive/steady/latest");
    assert_eq!(r.status, 200);
}

#[test]
fn paths_outside_the_store_are_refused() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    for path in [
        "/runs/../../etc/passwd",
        "/runs/queue/../../../../etc/passwd",
        "/runs/%2e%2e/%2e%2e/etc/passwd",
        "/runs/queue/%2E%2E/%2E%2E/%2E%2E/etc/passwd",
        "/runs/..%2F..%2Fetc%2Fpasswd",
        "/runs//etc/passwd",
        "/runs/%2Fetc%2Fpasswd",
        "/runs/escape/passwd",
        "/runs/queue/./../../etc/passwd",
        "/archive/..%2F..%2Fetc",
        "/archive/escape",
        "/archive/%2Fetc",
        "/timeline/%2e%2e/%2e%2e/etc?page=0",
        "/timeline/escape",
    ] {
        let r = get(addr, path);
        assert!(
            (400..500).contains(&r.status),
            "{path} answered {}",
            r.status
        );
        assert!(!r.text().contains("root:"), "{path} leaked /etc/passwd");
    }
    assert_eq!(get(addr, "/runs/escape/passwd").status, 403);
}

#[test]
fn only_requests_naming_this_server_are_answered() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    let port = addr.port();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        addr.to_string(),
    ] {
        let r = get_as(addr, "/", &format!("Host: {host}\r\n"));
        assert_eq!(r.status, 200, "{host}");
    }
    // A rebinding attacker's name, or the right name on another port, gets nothing.
    for host in [
        format!("attacker.example:{port}"),
        format!("localhost:{}", port.wrapping_add(1)),
        "localhost".to_string(),
    ] {
        let r = get_as(
            addr,
            &format!("/runs/queue/{STAMP}/history.jsonl"),
            &format!("Host: {host}\r\n"),
        );
        assert_eq!(r.status, 421, "{host}");
        assert!(!r.text().contains("tidemark_history"), "{host}");
    }
    assert_eq!(get_as(addr, "/", "").status, 400);
}

/// Reads until the server closes the connection; fails if it has not within two minutes.
fn closed_by_server(mut s: TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .unwrap();
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => raw,
        Err(e) => panic!("the server kept the connection open: {e}"),
    }
}

#[test]
fn slow_and_idle_connections_are_closed() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    // Headers that never end.
    let mut slow = TcpStream::connect(addr).unwrap();
    write!(slow, "GET / HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").unwrap();
    // A kept-alive connection that goes quiet after one request.
    let mut idle = TcpStream::connect(addr).unwrap();
    write!(idle, "GET /?verdict=valid HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let waits = [slow, idle].map(|s| std::thread::spawn(move || closed_by_server(s)));
    let [slow, idle] = waits.map(|w| w.join().unwrap());
    assert!(!String::from_utf8_lossy(&slow).contains("200 OK"));
    assert!(String::from_utf8_lossy(&idle).starts_with("HTTP/1.1 200"));
}

#[test]
fn connections_past_the_limit_are_turned_away() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    let limit = tidemark_report::serve::Limits::default().connections;
    let held: Vec<TcpStream> = (0..limit)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Every held connection is accepted before the next one is judged: each has answered.
    for mut h in &held {
        write!(h, "GET /runs/queue/nope HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut b = [0u8; 12];
        h.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"HTTP/1.1 404");
    }
    let r = get(addr, "/");
    assert_eq!(r.status, 503);
    assert!(r.text().contains("too many"));
    drop(held);
    let started = std::time::Instant::now();
    while get(addr, "/").status != 200 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "closed connections were not freed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn only_a_run_directorys_report_is_html() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    let run = store.path().join("queue").join(STAMP);
    // A node directory that looks like a run: a history and a report of its own.
    for n in ["n1", "n2"] {
        std::fs::copy(
            run.join("history.jsonl"),
            run.join("nodes").join(n).join("history.jsonl"),
        )
        .unwrap();
        std::fs::copy(
            run.join("test.json"),
            run.join("nodes").join(n).join("test.json"),
        )
        .unwrap();
    }
    std::fs::write(
        run.join("nodes/n1/report.html"),
        "<script>alert(1)</script>",
    )
    .unwrap();
    let r = get(addr, &format!("/runs/queue/{STAMP}/nodes/n1/report.html"));
    assert_eq!(r.status, 200);
    assert!(
        !r.header("content-type").unwrap().contains("html"),
        "{:?}",
        r.header("content-type")
    );
    // Nor is a report rendered for it, or a timeline page.
    assert_eq!(
        get(addr, &format!("/runs/queue/{STAMP}/nodes/n2/report.html")).status,
        404
    );
    assert_eq!(
        get(addr, &format!("/timeline/queue/{STAMP}/nodes/n2?page=0")).status,
        404
    );
    // The run's own report still is.
    let r = get(addr, &format!("/runs/queue/{STAMP}/report.html"));
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
}

#[test]
fn a_rendered_report_is_kept_until_the_run_changes() {
    let store = tempfile::tempdir().unwrap();
    let (_rt, addr) = served(store.path());
    let path = format!("/runs/steady/{NEWER}/report.html");
    assert!(get(addr, &path).text().contains("VALID · steady"));
    // Same size and time, other bytes: the kept render is served.
    let test_json = store.path().join("steady").join(NEWER).join("test.json");
    let modified = std::fs::metadata(&test_json).unwrap().modified().unwrap();
    let text = std::fs::read_to_string(&test_json).unwrap();
    assert!(text.contains("\"steady\""));
    std::fs::write(&test_json, text.replace("\"steady\"", "\"STEADY\"")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&test_json)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    let kept = get(addr, &path).text();
    assert!(kept.contains("VALID · steady"), "rendered again");
    // A changed file is a changed run: rendered again.
    std::fs::write(&test_json, text.replace("\"steady\"", "\"steady-2\"")).unwrap();
    assert!(get(addr, &path).text().contains("VALID · steady-2"));
}
