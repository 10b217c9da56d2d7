//! Workloads: a [`Workload`] bundles what a kind of test needs: how to prepare the database, how
//! to open clients, the schedule of ops and the final reads. Apart from [`crate::client`] because
//! setup uses the database's abilities ([`Db`]), and the database reaches nodes through client
//! addresses: one module for both would tie them in a cycle.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::client::{Client, ClientContext};
use crate::db::Db;
use crate::generator::Generator;

/// What a workload's setup may use: every cluster's client side (the workload's own cluster
/// first) and the database's abilities (e.g. [`Mirror`](crate::db::Mirror)).
pub struct SetupContext<'a> {
    /// Every cluster, the workload's first.
    pub clusters: &'a [ClientContext],
    /// The database.
    pub db: &'a dyn Db,
}

/// A kind of test.
///
/// Contract:
/// - [`setup`](Workload::setup) prepares the database once all nodes serve (e.g. creates topics)
///   and returns once every node agrees the preparation is visible, or an error.
/// - [`open`](Workload::open) makes a client for a fresh process bound to node index `node` of
///   the first of `clusters` (the workload's own; a workload of several clusters, such as
///   mirroring, may use the others too); it must not block (connections are made on first use).
/// - A client op is recorded with the cluster its invocation value names (`"cluster": "b"`),
///   else with the workload's cluster; the generator chooses it.
/// - [`generator`](Workload::generator) is the main phase's client schedule, run under the test's
///   time limit and rate by the runner. [`final_generator`](Workload::final_generator) runs after
///   every fault is healed, with fresh processes, to read everything back.
///
/// The verdict is not the workload's to choose: the checkers crate picks the checker from the
/// `workload` name the history header records ([`tidemark_checkers::check_run`]).
pub trait Workload: Send + Sync {
    /// Name, e.g. `queue`.
    fn name(&self) -> &'static str;

    /// The workload's resolved options, for test.json.
    fn options(&self) -> Value;

    /// Prepares the database.
    fn setup<'a>(&'a self, cx: SetupContext<'a>) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Opens a client for a new process talking first to node `node` of the first cluster.
    fn open(&self, clusters: &[ClientContext], node: usize) -> Box<dyn Client>;

    /// The main phase's client ops.
    fn generator(&self) -> Box<dyn Generator>;

    /// The final reads, after healing.
    fn final_generator(&self) -> Box<dyn Generator>;
}
