//! tidemark's workloads: what clients do, and on what schedule. Each workload implements the
//! engine's [`Workload`](tidemark_harness::workload::Workload) trait; the checkers crate judges a
//! run by the workload name its history header records.
//!
//! - [`queue`]: unique integers sent to and polled from several topic-partitions (Jepsen's
//!   Kafka queue test), judged by the queue checker.
//! - [`mirror`]: the queue over two clusters, one mirroring the other, writes following
//!   failovers and failbacks; judged by the same checker, which sees each op's cluster.
//! - [`tiered`]: the queue on topics with tiered storage on, with small segments and short local
//!   retention so data moves to the remote store during a short run.

pub mod group;
pub mod mirror;
pub mod queue;
pub mod tiered;

/// The workloads the CLI offers, by name.
pub const NAMES: &[&str] = &["queue", "mirror", "tiered"];
