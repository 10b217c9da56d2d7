//! tidemark's engine: everything between "here is a test" and "here is its run directory".
//!
//! The engine is a set of small traits, each with a written contract, and the data that flows
//! between them:
//!
//! - [`Remote`](remote::Remote): run a command on a node, move files to and from it.
//!   [`Local`](remote::Local) runs inside a network namespace, [`Ssh`](ssh::Ssh) over SSH.
//! - [`Runtime`](runtime::Runtime): make nodes exist and give each an address.
//!   [`NetnsRuntime`](netns::NetnsRuntime) is the embedded default;
//!   [`HostsRuntime`](hosts::HostsRuntime) drives existing machines over SSH;
//!   [`DockerRuntime`](docker::DockerRuntime) containers of the node [`image`], over SSH too.
//! - [`Db`](db::Db) with the optional [`Kill`](db::Kill), [`Pause`](db::Pause),
//!   [`LogFiles`](db::LogFiles), [`ReplicaDump`](db::ReplicaDump), [`Probe`](db::Probe) and
//!   [`Mirror`](db::Mirror) (cluster mirroring, whose admin requests are in [`mirror`]): the
//!   broker on a node.
//!   [`TidemarkBroker`](broker::TidemarkBroker) deploys `tidemark-broker`.
//! - [`Net`](net::Net): cut and heal links between nodes. [`Iptables`](net::Iptables).
//! - [`Client`](client::Client): one logical process's connection, invoking one op at a time.
//! - [`Generator`](generator::Generator): the pure, seeded schedule of ops.
//! - [`Nemesis`](nemesis::Nemesis): performs fault ops.
//! - [`checker`]: the run is judged from its directory by the checkers crate's
//!   [`check_run`](checker::check_run), which picks the checker from the history header.
//!
//! Around them: [`dial`] opens connections from the harness into the nodes' network (sockets
//! made inside the client namespace), [`kafka`] is the thin Kafka client workloads build on, and
//! [`op`] holds the plain data that flows between the parts.
//!
//! The [`runner`] drives a [`Test`](test::Test) through its phases: the [`interpreter`] runs each
//! phase's ops, [`probe`] waits for the database to serve and its replicas to converge, and
//! [`collect`] gathers replica states and node logs. [`history`] streams every op to disk as it
//! happens, [`store`] lays out the run directory, and [`leftovers`] finds and removes what a
//! killed run left behind; [`prerequisites`] says what a run needs installed
//! before it starts.
//!
//! Dependencies point one way: this crate knows nothing of particular workloads or fault kinds;
//! those crates implement the traits here.

pub mod broker;
pub mod checker;
pub mod client;
pub mod collect;
pub mod db;
pub mod dial;
pub mod docker;
pub mod generator;
pub mod history;
pub mod hosts;
pub mod image;
pub mod interpreter;
pub mod kafka;
pub mod leftovers;
pub mod mirror;
pub mod nemesis;
pub mod net;
pub mod netns;
pub mod op;
pub mod prerequisites;
pub mod probe;
pub mod progress;
pub mod remote;
pub mod runner;
pub mod runtime;
pub mod ssh;
pub mod store;
pub mod test;
pub mod workload;
