//! A night as JUnit XML, which every CI system shows: one testcase per case, named by its id;
//! an unexpected verdict or an unknown one is a `failure` (an injected bug that came back valid
//! among them), a crash an `error`, a case that did not run `skipped`.

use super::matrix::Expected;
use super::night::{CaseRecord, Status, Verdict};

/// The JUnit XML of `cases`, a suite called `suite`.
pub fn render(suite: &str, timestamp: &str, cases: &[CaseRecord], overhead_max_s: f64) -> String {
    let count = |f: &dyn Fn(&CaseRecord) -> bool| cases.iter().filter(|c| f(c)).count();
    let skipped = count(&|c| c.verdict == Verdict::NotRun);
    let errors = count(&|c| c.status == Status::Crashed);
    let failures = count(&|c| {
        c.verdict != Verdict::NotRun && matches!(c.status, Status::Unexpected | Status::Unknown)
    });
    let time: f64 = cases.iter().map(|c| c.duration_s).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let head = format!(
        "name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" \
         time=\"{time:.3}\"",
        escape(suite),
        cases.len()
    );
    x += &format!("<testsuites {head}>\n");
    x += &format!(
        "  <testsuite {head} timestamp=\"{}\">\n",
        escape(&iso8601(timestamp))
    );
    x += &format!(
        "    <properties>\n      <property name=\"overhead_between_runs_max_s\" \
         value=\"{overhead_max_s:.3}\"/>\n    </properties>\n"
    );
    for c in cases {
        let id = &c.id;
        x += &format!(
            "    <testcase classname=\"tidemark.nightly.{}.{}\" name=\"{}\" time=\"{:.3}\">\n",
            escape(&id.workload),
            escape(&id.nemesis.replace(',', "+")),
            escape(&format!(
                "seed {} {} {}{}",
                id.seed,
                id.bug.as_deref().unwrap_or("correct"),
                id.runtime,
                id.variant
                    .as_deref()
                    .map_or(String::new(), |v| format!(" {v}"))
            )),
            c.duration_s
        );
        let expected = match c.expected {
            Expected::Valid => "valid",
            Expected::Invalid => "invalid",
        };
        let detail = format!(
            "expected {expected}, got {}{}{}",
            c.verdict.name(),
            if c.anomaly_counts.is_empty() {
                String::new()
            } else {
                format!(
                    "; anomalies {}",
                    c.anomaly_counts
                        .iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            c.message
                .as_deref()
                .map(|m| format!("; {m}"))
                .unwrap_or_default()
        );
        match (c.verdict, c.status) {
            (Verdict::NotRun, _) => {
                x += &format!("      <skipped message=\"{}\"/>\n", escape(&detail))
            }
            (_, Status::AsExpected) => {}
            (_, Status::Crashed) => {
                x += &format!(
                    "      <error message=\"{}\" type=\"crashed\"/>\n",
                    escape(&detail)
                )
            }
            (_, status) => {
                x += &format!(
                    "      <failure message=\"{}\" type=\"{}\"/>\n",
                    escape(&detail),
                    status.name()
                )
            }
        }
        if let Some(dir) = &c.run_dir {
            x += &format!(
                "      <system-out>run directory {}</system-out>\n",
                escape(&dir.display().to_string())
            );
        }
        x += "    </testcase>\n";
    }
    x += "  </testsuite>\n</testsuites>\n";
    x
}

/// A store's stamp, `yyyyMMddTHHmmss.SSSZ` (perhaps with a `-1` suffix), as the ISO 8601 date
/// and time JUnit readers expect, `yyyy-MM-ddTHH:mm:ss.SSSZ`; anything else as it is.
fn iso8601(stamp: &str) -> String {
    let b = stamp.as_bytes();
    if b.len() < 20 || b[8] != b'T' || b[15] != b'.' || b[19] != b'Z' {
        return stamp.to_string();
    }
    format!(
        "{}-{}-{}T{}:{}:{}Z",
        &stamp[0..4],
        &stamp[4..6],
        &stamp[6..8],
        &stamp[9..11],
        &stamp[11..13],
        &stamp[13..19]
    )
}

/// `s` safe in XML text and attribute values.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 cannot carry at all (a child's stderr may hold them).
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nightly::night::tests::record;

    #[test]
    fn a_missed_bug_is_a_failure_and_a_crash_an_error() {
        let bug = Some("ack-before-replication");
        let mut crashed = record(2, None, Verdict::Crashed);
        crashed.message = Some("exit 255: <no results> \u{1}".into());
        let cases = vec![
            record(1, None, Verdict::Valid),
            record(1, bug, Verdict::Valid),
            crashed,
            record(3, None, Verdict::NotRun),
        ];
        let x = render("tidemark nightly", "20260101T000000.000Z", &cases, 0.25);
        assert!(x.contains(
            "<testsuites name=\"tidemark nightly\" tests=\"4\" failures=\"1\" errors=\"1\" \
             skipped=\"1\" time=\"50.000\">"
        ));
        assert!(
            x.contains("<failure message=\"expected invalid, got valid\" type=\"unexpected\"/>")
        );
        assert!(x.contains(
            "<error message=\"expected valid, got crashed; exit 255: &lt;no results&gt; ?\" \
             type=\"crashed\"/>"
        ));
        assert!(x.contains("<skipped message=\"expected valid, got not-run\"/>"));
        assert!(x.contains(
            "<testcase classname=\"tidemark.nightly.queue.partition\" \
             name=\"seed 1 ack-before-replication netns\" time=\"12.500\">"
        ));
        assert!(x.contains("timestamp=\"2026-01-01T00:00:00.000Z\""));
        assert_eq!(
            iso8601("20261204T022400.961Z-1"),
            "2026-12-04T02:24:00.961Z"
        );
        assert_eq!(x.matches("<testcase ").count(), 4);
        assert_eq!(x.matches("</testcase>").count(), 4);
    }
}
