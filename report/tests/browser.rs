//! A real browser loads a report and the browser's index: Debian's headless Chromium takes a
//! screenshot and dumps the DOM after the page's script ran. In CI (`CI=true`) a missing
//! Chromium fails the test; elsewhere the test says why it skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// Runs Chromium headless on `url` with `args`, returning its stdout; killed after a minute.
fn run_chromium(bin: &Path, profile: &Path, args: &[&str], url: &str) -> String {
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).unwrap();
        s
    });
    let began = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if began.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    reader.join().unwrap()
}

/// Distinct colours among the screenshot's pixels (a blank or failed page has one or two).
fn distinct_colours(png_path: &Path) -> usize {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png_path).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let bpp = info.color_type.samples();
    let mut colours = std::collections::HashSet::new();
    for px in buf[..info.buffer_size()].chunks(bpp).step_by(7) {
        colours.insert(px.to_vec());
    }
    colours.len()
}

#[test]
fn chromium_renders_the_report_and_the_index() {
    let Some(bin) = chromium() else {
        panic!("chromium is not on PATH: install Debian's chromium package (scripts/setup-host)");
    };
    let store = tempfile::tempdir().unwrap();
    let profile = tempfile::tempdir().unwrap();
    let dir = common::invalid_run(store.path(), "queue", "t", "unclean-election", "hello");
    let report = tidemark_report::write_report(&dir).unwrap();
    common::valid_run(store.path());
    let url = format!("file://{}", report.display());

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        &bin,
        profile.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,2000",
        ],
        &url,
    );
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "screenshot {} is {size} bytes",
        shot.display()
    );
    let colours = distinct_colours(&shot);
    assert!(
        colours > 20,
        "the screenshot has {colours} colours: a blank page?"
    );
    println!(
        "screenshot: {} ({size} bytes, {colours} colours)",
        shot.display()
    );

    let dom = run_chromium(&bin, profile.path(), &["--dump-dom"], &url);
    assert!(dom.contains("<svg"), "the plots are in the DOM");
    assert!(dom.contains("INVALID"));
    // The script ran: the timeline's first page is a table with an op per cell.
    assert!(
        dom.contains("id=\"t-"),
        "timeline rendered by the page's script"
    );
    assert!(dom.contains("page 1 of 1"));
    let at = dom.find("href=\"#op-").expect("an anomaly links to its op");
    let target = &dom[at + 7..];
    let target = &target[..target.find('"').unwrap()];
    assert!(
        dom.contains(&format!("id=\"{target}\"")),
        "{target} exists in the DOM"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let root = store.path().to_path_buf();
    rt.spawn(async move { tidemark_report::serve::serve(listener, &root).await });
    let index = run_chromium(
        &bin,
        profile.path(),
        &["--dump-dom"],
        &format!("http://{addr}/"),
    );
    assert!(index.contains("tidemark runs"), "{index}");
    assert!(index.contains("class=\"invalid\"") && index.contains("class=\"valid\""));
    let served = run_chromium(
        &bin,
        profile.path(),
        &["--dump-dom"],
        &format!("http://{addr}/runs/queue/{}/report.html", common::STAMP),
    );
    assert!(
        served.contains("id=\"t-"),
        "the served report's script runs under its CSP"
    );
}
