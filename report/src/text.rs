//! Small text helpers shared by the report and the browser: bounded strings (every value from a
//! history or a log is cut to a fixed length before it reaches a page), time formats, and URL
//! path encoding for names that come from the store.

use serde_json::Value;

/// `s` cut to at most `max` characters, with `…` marking a cut.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

/// A JSON value on one line, cut to `max` characters.
pub fn json_clip(v: &Value, max: usize) -> String {
    clip(&v.to_string(), max)
}

/// `s` with tabs, newlines and other control characters turned into spaces, so it fits in one
/// field of the timeline's tab-separated data.
pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Nanoseconds since the test started, as seconds with millisecond precision.
pub fn secs(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e9)
}

/// A duration in nanoseconds, in the unit that reads best.
pub fn duration(ns: u64) -> String {
    match ns {
        n if n < 1_000_000 => format!("{:.0} µs", n as f64 / 1e3),
        n if n < 10_000_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n => format!("{:.1} s", n as f64 / 1e9),
    }
}

/// One path segment percent-encoded: unreserved characters stay, everything else is `%XX`.
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A relative path with each segment percent-encoded.
pub fn encode_path(segments: &[&str]) -> String {
    segments
        .iter()
        .map(|s| encode_segment(s))
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_counts_characters_not_bytes() {
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hé", 2), "hé");
    }

    #[test]
    fn one_line_removes_separators() {
        assert_eq!(one_line("a\tb\nc"), "a b c");
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode_segment("a b/../<x>"), "a%20b%2F..%2F%3Cx%3E");
        assert_eq!(encode_path(&["q", "2024T.1Z"]), "q/2024T.1Z");
    }

    #[test]
    fn durations_pick_a_unit() {
        assert_eq!(duration(1_500), "2 µs");
        assert_eq!(duration(2_500_000), "2.5 ms");
        assert_eq!(duration(12_000_000_000), "12.0 s");
    }
}
