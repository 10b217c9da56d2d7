//! The command line's checking, reporting, replaying, shrinking and nightly commands, and the
//! newcomer's set-up.

mod bench;
mod check;
mod compose;
mod host_setup;
mod nightly;
mod provision;
mod report;
mod shrink;
mod vagrant_nodes;
