//! The human view of a tidemark run: one self-contained `report.html` per run directory, and a
//! results browser over the whole store.
//!
//! This crate sits beside the engine rather than inside it: HTML, plotting and the web server
//! are heavy dependencies the engine does not need, and a separate crate lets the report evolve without touching the runner. It reads only
//! what a run leaves on disk (`docs/history-format.md`), through the checkers crate's types and readers,
//! so it renders a run recorded by any tidemark version that wrote that format.
//!
//! The engine calls, at the end of every `tidemark test`:
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! let report = tidemark_report::write_report(std::path::Path::new("store/queue/latest"))?;
//! println!("report: {}", report.display());
//! # Ok(())
//! # }
//! ```
//!
//! Everything the report shows is bounded, so a run of millions of ops renders in seconds into a
//! file of a few megabytes: the timeline is paged (and beyond [`MAX_EMBEDDED_PAGES`] pages only
//! the pages that matter are embedded, the rest named and served by [`serve`]); plots sample
//! their points; anomaly entries, offset windows and log excerpts have fixed limits, and every
//! limit that cuts something says so on the page.

mod anomalies;
mod digest;
mod limits;
mod logs;
mod offsets;
mod page;
mod plot;
mod run;
pub mod serve;
mod text;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

pub use digest::PAGE_LINES;
pub use limits::MAX_EMBEDDED_PAGES;

/// Renders `report.html` for a run directory (writing it beside the history) and returns its
/// path. The directory must hold `history.jsonl`; `results.json`, `replicas.jsonl`, `test.json`
/// and `nodes/` are used when present (without `results.json` the checkers run in memory).
pub fn write_report(run_dir: &Path) -> anyhow::Result<PathBuf> {
    let html = render_report(run_dir)?;
    let path = run_dir.join("report.html");
    // Written whole then renamed, so a browser never sees half a report.
    let tmp = run_dir.join(".report.html.tmp");
    std::fs::write(&tmp, html).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Renders the report of a run directory as an HTML string, without writing anything.
pub fn render_report(run_dir: &Path) -> anyhow::Result<String> {
    let run = run::Run::load(run_dir, limits::Embed::Report)?;
    Ok(page::report(&run).into_string())
}

/// Renders one page of a run's op timeline as a standalone HTML page (0-based `page`), for
/// timeline pages a large run's `report.html` does not embed.
pub fn render_timeline_page(run_dir: &Path, page: u64) -> anyhow::Result<String> {
    let run = run::Run::load(run_dir, limits::Embed::One(page))?;
    Ok(page::timeline_only(&run).into_string())
}
