//! The bounds the report shares between loading a run and rendering it, in one module that
//! depends on nothing else here, so the modules that use them do not depend on each other.

/// Offsets shown on each side of an anomalous offset.
pub const WINDOW: i64 = 4;
/// Anomalous offsets per partition that get a window.
pub const MAX_FOCUS: usize = 24;
/// Timeline pages `report.html` embeds at most; past that it embeds the pages that matter and
/// names the others, which `tidemark serve` renders on request.
pub const MAX_EMBEDDED_PAGES: u64 = 120;

/// Which timeline pages a render embeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embed {
    /// A whole report: every page, or a bounded choice of pages.
    Report,
    /// One page, for the browser's timeline route.
    One(u64),
}
