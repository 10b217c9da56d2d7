//! The `tidemark` command and its engine end to end, in one test binary (one link step on a
//! small machine): real network namespaces, broker processes, sshd and kcat. The detection
//! matrix, which runs for many minutes, is its own binary (`tests/nemesis_detect.rs`).
//!
//! - [`engine`]: a run's phases on the netns and hosts runtimes, several clusters in one run,
//!   the client's outcomes, kills and signals of the harness itself, SSH, teardown of what a
//!   killed run left.
//! - [`nemesis`]: every fault kind against real brokers, and scripted or replayed schedules.
//! - [`cli`]: `tidemark check`, `tidemark report`, and the set-up a newcomer runs.
//! - [`support`]: what those share.

mod cli;
mod engine;
mod nemesis;
mod support;
