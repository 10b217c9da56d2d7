//! A night's index page: every case with its verdict, the expected one, its duration, anomaly
//! counts and a link to its report; the night's exit code and its own overhead between runs;
//! and the trend, which cases flipped since the previous night and each case's last nights.
//! Pure: the caller says where each case's report is, relative to the page.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::matrix::Expected;
use super::night::{CaseRecord, Status, Trend};

/// What the page says about the night as a whole.
pub struct Summary<'a> {
    /// The page's title.
    pub title: &'a str,
    /// When the night (or the newest of its shards) started.
    pub started: &'a str,
    /// `shard 1/4`, `shards 1/2, 2/2 of 2`, or `the whole matrix`.
    pub scope: String,
    /// Cases of the whole matrix, and cases on this page.
    pub matrix_cases: usize,
    /// The night's exit code.
    pub exit_code: u8,
    /// Whether every case of its scope was reached.
    pub finished: bool,
    /// The largest and the mean gap between runs, seconds.
    pub overhead_s: (f64, f64),
    /// Something the reader must know first (missing shards), if any.
    pub warning: Option<String>,
}

/// One row: a case and the link to its report, relative to the page.
pub struct Row<'a> {
    /// The case.
    pub case: &'a CaseRecord,
    /// Its report.html, if it has a run directory.
    pub report: Option<String>,
}

const CSS: &str = "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}\
td,th{padding:.25em .6em;border-bottom:1px solid #ddd;text-align:left}\
tr.as-expected{background:#eef7ee}tr.unexpected{background:#fdeaea}\
tr.unknown{background:#fff6dd}tr.crashed{background:#f0e0f6}\
span.s{display:inline-block;width:1.2em;text-align:center}\
.as-expected .s,.s.as-expected{color:#2e7d32}.s.unexpected{color:#c62828}\
.s.unknown{color:#b8860b}.s.crashed{color:#7b1fa2}p.warn{color:#c62828;font-weight:bold}";

fn mark(status: Option<Status>) -> Markup {
    match status {
        None => html! { span.s title="not in that night" { "·" } },
        Some(s) => html! {
            span class={ "s " (s.name()) } title=(s.name()) {
                (match s {
                    Status::AsExpected => "✓",
                    Status::Unexpected => "✗",
                    Status::Unknown => "?",
                    Status::Crashed => "!",
                })
            }
        },
    }
}

/// The index page.
pub fn render(summary: &Summary, rows: &[Row], trend: &Trend) -> String {
    let count = |s: Status| rows.iter().filter(|r| r.case.status == s).count();
    let (max, mean) = summary.overhead_s;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (summary.title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                h1 { (summary.title) }
                @if let Some(w) = &summary.warning { p.warn { (w) } }
                p id="summary" {
                    "Started " (summary.started) ", " (summary.scope) ": "
                    (rows.len()) " of the matrix's " (summary.matrix_cases) " cases"
                    @if !summary.finished { " (not finished)" } ". "
                    (count(Status::AsExpected)) " as expected, "
                    (count(Status::Unexpected)) " unexpected, "
                    (count(Status::Unknown)) " unknown, "
                    (count(Status::Crashed)) " crashed. Exit code "
                    span id="exit-code" { (summary.exit_code) } "."
                }
                p id="overhead" {
                    "Overhead between runs (from one run's exit to the next one's start): max "
                    (format!("{max:.3}")) " s, mean " (format!("{mean:.3}")) " s."
                }
                table id="cases" {
                    tr {
                        th { "workload" } th { "nemesis" } th { "seed" } th { "broker" }
                        th { "runtime" } th { "status" } th { "verdict" } th { "expected" }
                        th { "duration s" } th { "anomalies" } th { "report" }
                    }
                    @for r in rows {
                        @let c = r.case;
                        tr class=(c.status.name()) {
                            td { (c.id.workload) } td { (c.id.nemesis) } td { (c.id.seed) }
                            td { (c.id.bug.as_deref().unwrap_or("correct")) }
                            td { (c.id.runtime) }
                            td.status { (c.status.name()) }
                            td.verdict { (c.verdict.name()) }
                            td { (match c.expected { Expected::Valid => "valid", Expected::Invalid => "invalid" }) }
                            td { (format!("{:.1}", c.duration_s)) }
                            td {
                                @for (kind, n) in &c.anomaly_counts { (kind) " " (n) br; }
                                @if let Some(m) = &c.message { em { (m) } }
                            }
                            td {
                                @if let Some(link) = &r.report { a href=(link) { "report" } }
                            }
                        }
                    }
                }
                h2 { "Trend" }
                @if trend.nights.len() < 2 {
                    p id="flips" { "No earlier night in this store to compare with." }
                } @else if trend.flips.is_empty() {
                    p id="flips" { "No case flipped since the night of " (trend.nights[trend.nights.len() - 2]) "." }
                } @else {
                    p { "Flipped since the night of " (trend.nights[trend.nights.len() - 2]) ":" }
                    ul id="flips" {
                        @for f in &trend.flips {
                            li { (f.id.label()) ": " (f.before.name()) " → " (f.after.name()) }
                        }
                    }
                }
                table id="trend" {
                    tr {
                        th { "case" }
                        @for n in &trend.nights { th title=(n) { (n.get(..8).unwrap_or(n)) } }
                    }
                    @for (id, statuses) in &trend.history {
                        tr {
                            td { (id.label()) }
                            @for s in statuses { td { (mark(*s)) } }
                        }
                    }
                }
            }
        }
    }
    .into_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nightly::night::tests::record;
    use crate::nightly::night::{trend, Verdict};

    #[test]
    fn the_page_shows_every_case_the_exit_code_and_the_flips() {
        let before = vec![record(1, Some("ack-before-replication"), Verdict::Invalid)];
        let now = vec![
            record(1, Some("ack-before-replication"), Verdict::Valid),
            record(2, None, Verdict::Valid),
        ];
        let t = trend(&[
            ("20260101T0".into(), before),
            ("20260102T0".into(), now.clone()),
        ]);
        let rows: Vec<Row> = now
            .iter()
            .map(|c| Row {
                case: c,
                report: Some("../../q/x/report.html".into()),
            })
            .collect();
        let page = render(
            &Summary {
                title: "tidemark nightly <night>",
                started: "20260102T0",
                scope: "the whole matrix".into(),
                matrix_cases: 2,
                exit_code: 1,
                finished: true,
                overhead_s: (0.5, 0.25),
                warning: None,
            },
            &rows,
            &t,
        );
        assert!(page.contains("tidemark nightly &lt;night&gt;"));
        assert!(page.contains("<span id=\"exit-code\">1</span>"));
        assert_eq!(page.matches("<tr class=\"unexpected\">").count(), 1);
        assert_eq!(page.matches("<tr class=\"as-expected\">").count(), 1);
        assert!(page.contains("max 0.500 s, mean 0.250 s"));
        assert!(page.contains(
            "<li>queue / partition / seed 1 / ack-before-replication / netns: as-expected → unexpected</li>"
        ));
        assert_eq!(page.matches("href=\"../../q/x/report.html\"").count(), 2);
    }
}
