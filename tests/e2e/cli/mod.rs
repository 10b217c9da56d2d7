//! The command line's checking, reporting, replaying and shrinking commands, and the newcomer's
//! set-up.

mod check;
mod host_setup;
mod report;
mod shrink;
