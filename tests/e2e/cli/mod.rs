//! The command line's checking and reporting commands, and the newcomer's set-up.

mod check;
mod host_setup;
mod report;
