//! Node log excerpts around each anomaly: the lines of every file snarfed into
//! `nodes/<node>/` whose timestamps fall near the moment an anomaly's ops ran, so a reader sees
//! what the brokers said then without opening the logs. Files without parseable timestamps show
//! their tail. Each file is read once, streaming, and everything kept is bounded.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use crate::text::clip;

/// When the test started on the wall clock, to match log timestamps to history times.
pub struct Start {
    /// Nanoseconds since the Unix epoch.
    pub unix_ns: i128,
    /// Where it was read from.
    pub source: &'static str,
}

/// Lines kept on each side of an anomaly's moment.
pub const HALF: usize = 20;
/// Lines of a file's tail.
pub const TAIL: usize = 30;
/// Seconds on each side of an anomaly's moment whose lines belong to its excerpt.
pub const SPAN_S: i128 = 3;
/// Longest line shown.
const LINE_CHARS: usize = 400;
/// Files shown per node, and nodes shown; the page counts the rest.
const MAX_FILES: usize = 8;
const MAX_NODES: usize = 16;

/// When an anomaly happened, in history time.
pub struct Moment {
    pub label: String,
    /// Nanoseconds since the test started.
    pub time: u64,
}

/// The excerpts of one node.
pub struct NodeLogs {
    pub node: String,
    pub files: Vec<FileLog>,
    /// Files not shown because of [`MAX_FILES`].
    pub left_out: usize,
}

/// The excerpts of one file.
pub struct FileLog {
    pub name: String,
    pub size: u64,
    /// One per moment, in the order of the moments.
    pub excerpts: Vec<Excerpt>,
    /// The last lines, and why they are shown.
    pub tail: Option<(Vec<Line>, String)>,
    /// Why nothing is shown (binary, unreadable).
    pub skipped: Option<String>,
}

/// Lines near one moment.
pub struct Excerpt {
    pub label: String,
    pub lines: Vec<Line>,
    /// Lines within the span, of which `lines` are the ones nearest the moment.
    pub in_span: u64,
}

/// A numbered line (1-based).
pub struct Line {
    pub number: u64,
    pub text: String,
}

/// Nodes and their excerpts, from `nodes_dir` (missing: none), and how many nodes past
/// [`MAX_NODES`] are left out.
pub fn excerpts(
    nodes_dir: &Path,
    moments: &[Moment],
    start: Option<&Start>,
) -> (Vec<NodeLogs>, usize) {
    let mut nodes: Vec<_> = match std::fs::read_dir(nodes_dir) {
        Ok(d) => d
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .collect(),
        Err(_) => return (Vec::new(), 0),
    };
    nodes.sort_by_key(|e| e.file_name());
    let left_out = nodes.len().saturating_sub(MAX_NODES);
    let shown = nodes
        .iter()
        .take(MAX_NODES)
        .map(|node| {
            let mut files: Vec<_> = std::fs::read_dir(node.path())
                .map(|d| {
                    d.flatten()
                        // Regular files only: a symlink could point anywhere.
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                        .collect()
                })
                .unwrap_or_default();
            files.sort_by_key(|e| e.file_name());
            NodeLogs {
                node: node.file_name().to_string_lossy().into_owned(),
                left_out: files.len().saturating_sub(MAX_FILES),
                files: files
                    .iter()
                    .take(MAX_FILES)
                    .map(|f| file_log(&f.path(), moments, start))
                    .collect(),
            }
        })
        .collect();
    (shown, left_out)
}

struct Collect {
    center: i128,
    before: VecDeque<Line>,
    after: Vec<Line>,
    in_span: u64,
}

fn file_log(path: &Path, moments: &[Moment], start: Option<&Start>) -> FileLog {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut log = FileLog {
        name,
        size,
        excerpts: Vec::new(),
        tail: None,
        skipped: None,
    };
    let mut input = match File::open(path) {
        Ok(f) => BufReader::new(f),
        Err(e) => {
            log.skipped = Some(format!("unreadable: {e}"));
            return log;
        }
    };
    if input
        .fill_buf()
        .is_ok_and(|b| b.iter().take(8192).any(|&c| c == 0))
    {
        log.skipped = Some("binary".into());
        return log;
    }
    let mut collect: Vec<Collect> = match start {
        Some(s) => moments
            .iter()
            .map(|m| Collect {
                center: s.unix_ns + i128::from(m.time),
                before: VecDeque::new(),
                after: Vec::new(),
                in_span: 0,
            })
            .collect(),
        None => Vec::new(),
    };
    let mut tail: VecDeque<Line> = VecDeque::new();
    let mut stamped = false;
    let mut last_ts: Option<i128> = None;
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        // A line is read up to a bound, so one huge line cannot exhaust memory.
        match input.by_ref().take(64 * 1024).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if buf.last() != Some(&b'\n') && buf.len() == 64 * 1024 {
            let _ = input.skip_until(b'\n');
        }
        number += 1;
        let text = String::from_utf8_lossy(&buf);
        let text = text.trim_end_matches(['\n', '\r']);
        // Continuation lines (a backtrace) belong to the last stamped line's time.
        if let Some(ts) = timestamp(text) {
            last_ts = Some(ts);
            stamped = true;
        }
        let line = || Line {
            number,
            text: clip(text, LINE_CHARS),
        };
        if let Some(ts) = last_ts {
            for c in &mut collect {
                let span = SPAN_S * 1_000_000_000;
                if ts < c.center - span || ts > c.center + span {
                    continue;
                }
                c.in_span += 1;
                if ts < c.center {
                    if c.before.len() == HALF {
                        c.before.pop_front();
                    }
                    c.before.push_back(line());
                } else if c.after.len() < HALF {
                    c.after.push(line());
                }
            }
        }
        if tail.len() == TAIL {
            tail.pop_front();
        }
        tail.push_back(line());
    }
    let why = if moments.is_empty() {
        Some("no anomaly has a time to match: the file's last lines")
    } else if start.is_none() {
        Some("the test's wall-clock start is unknown: the file's last lines")
    } else if !stamped {
        Some("no timestamps in this file: its last lines")
    } else if collect.iter().all(|c| c.in_span == 0) {
        Some("no lines near any anomaly: the file's last lines")
    } else {
        None
    };
    if let Some(why) = why {
        log.tail = Some((tail.into(), why.to_owned()));
    }
    if stamped {
        log.excerpts = moments
            .iter()
            .zip(collect)
            .map(|(m, c)| {
                let mut lines: Vec<Line> = c.before.into();
                lines.extend(c.after);
                Excerpt {
                    label: m.label.clone(),
                    lines,
                    in_span: c.in_span,
                }
            })
            .collect();
    }
    log
}

/// The Unix time in ns of a timestamp near the start of a log line: `YYYY-MM-DD[T ]HH:MM:SS`,
/// an optional fraction, then `Z`, an offset `±HH:MM`/`±HHMM`, or nothing (taken as UTC).
pub fn timestamp(line: &str) -> Option<i128> {
    let b = line.as_bytes();
    let at = (0..b.len().min(48)).find(|&i| looks_like_date(&b[i..]))?;
    let b = &b[at..];
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        std::str::from_utf8(b.get(r)?).ok()?.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    let mut i = 19;
    let mut frac_ns = 0i64;
    if b.get(i) == Some(&b'.') || b.get(i) == Some(&b',') {
        i += 1;
        let mut scale = 100_000_000i64;
        while let Some(c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            frac_ns += i64::from(c - b'0') * scale;
            scale /= 10;
            i += 1;
        }
    }
    let offset_s = match b.get(i) {
        Some(&s @ (b'+' | b'-')) => {
            let h = num(i + 1..i + 3)?;
            let m = if b.get(i + 3) == Some(&b':') {
                num(i + 4..i + 6)
            } else {
                num(i + 3..i + 5)
            }
            .unwrap_or(0);
            let o = h * 3600 + m * 60;
            if s == b'+' {
                o
            } else {
                -o
            }
        }
        _ => 0,
    };
    Some(unix_ns(y, mo, d, secs, frac_ns)? - i128::from(offset_s) * 1_000_000_000)
}

fn looks_like_date(b: &[u8]) -> bool {
    const SHAPE: &[u8] = b"dddd-dd-ddTdd:dd:dd";
    b.len() >= SHAPE.len()
        && SHAPE.iter().zip(b).all(|(s, c)| match s {
            b'd' => c.is_ascii_digit(),
            b'T' => *c == b'T' || *c == b' ',
            s => s == c,
        })
}

/// Nanoseconds since the Unix epoch of a UTC civil time (Howard Hinnant's days-from-civil).
pub fn unix_ns(y: i64, m: i64, d: i64, secs_of_day: i64, ns: i64) -> Option<i128> {
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((i128::from(days) * 86_400 + i128::from(secs_of_day)) * 1_000_000_000 + i128::from(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tracing_and_other_timestamps() {
        let t = timestamp("2024-02-29T23:59:59.123456Z  INFO node{id=1}: hello").unwrap();
        assert_eq!(t, 1_709_251_199_123_456_000);
        assert_eq!(
            timestamp("[2024-02-29 23:59:59,123] INFO x"),
            Some(1_709_251_199_123_000_000)
        );
        assert_eq!(
            timestamp("2024-03-01T01:59:59+02:00 x"),
            Some(1_709_251_199_000_000_000)
        );
        assert_eq!(timestamp("no time here"), None);
        assert_eq!(unix_ns(1970, 1, 1, 0, 0), Some(0));
    }
}
