//! The system under test on one node. [`Db`] is what every database must do; the optional
//! abilities (kill, pause, log files, replica dumps, a skewable clock, a data directory, readiness
//! and convergence probes, cluster mirroring) are
//! separate traits a database may offer, found through the `as_*` accessors, so fault kinds are
//! only scheduled where they can happen.

use std::net::SocketAddr;
use std::path::PathBuf;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use tidemark_checkers::ReplicaState;

use crate::client::{ClientContext, NodeAddr};
use crate::mirror::PartitionDescription;
use crate::runtime::Node;

/// Installs, configures, starts and stops the database on a node.
///
/// Contract:
/// - [`setup`](Db::setup) installs and configures the database on `node` (knowing every node of
///   its cluster) and starts it; it returns once the process is started, not once it serves.
/// - [`stop`](Db::stop) shuts it down cleanly and keeps its data; [`wipe`](Db::wipe) removes the
///   data of a stopped node; [`teardown`](Db::teardown) does both. All succeed when nothing was
///   running.
/// - [`endpoint`](Db::endpoint) is the address clients use for `node`;
///   [`control_endpoint`](Db::control_endpoint) the one its controller traffic uses, if apart.
/// - All methods block and are called from a blocking context; they may run concurrently for
///   different nodes.
pub trait Db: Send + Sync {
    /// Installs, configures and starts the database on `node`.
    fn setup(&self, node: &Node, cluster: &[Node]) -> anyhow::Result<()>;

    /// Stops the database on `node` cleanly (it may flush and checkpoint), keeping its data.
    /// Stopping a stopped node succeeds.
    fn stop(&self, node: &Node) -> anyhow::Result<()>;

    /// Removes the database's data on `node`; the node must be stopped.
    fn wipe(&self, node: &Node) -> anyhow::Result<()>;

    /// Stops the database on `node` and wipes its data.
    fn teardown(&self, node: &Node) -> anyhow::Result<()> {
        self.stop(node)?;
        self.wipe(node)
    }

    /// Where clients connect for `node`.
    fn endpoint(&self, node: &Node) -> SocketAddr;

    /// Where `node`'s controller traffic (the metadata quorum, broker heartbeats) goes, when the
    /// database has a listener of its own for it.
    fn control_endpoint(&self, _node: &Node) -> Option<SocketAddr> {
        None
    }

    /// What test.json records about this database (binary, version, configuration).
    fn describe(&self) -> Value;

    /// The kill ability, when this database has it.
    fn as_kill(&self) -> Option<&dyn Kill> {
        None
    }

    /// The pause ability, when this database has it.
    fn as_pause(&self) -> Option<&dyn Pause> {
        None
    }

    /// The log-files ability, when this database has it.
    fn as_log_files(&self) -> Option<&dyn LogFiles> {
        None
    }

    /// The replica-dump ability, when this database has it.
    fn as_replica_dump(&self) -> Option<&dyn ReplicaDump> {
        None
    }

    /// The skewable-clock ability, when this database has it.
    fn as_fake_clock(&self) -> Option<&dyn FakeClock> {
        None
    }

    /// The data-directory ability, when this database has it.
    fn as_data_dir(&self) -> Option<&dyn DataDir> {
        None
    }

    /// The readiness and convergence probes, when this database has them.
    fn as_probe(&self) -> Option<&dyn Probe> {
        None
    }

    /// The power-loss ability, when this database has it (its data sits on tidemark-powerfs).
    fn as_power_loss(&self) -> Option<&dyn PowerLoss> {
        None
    }

    /// The failing-disk ability, when this database has it (its data sits on tidemark-powerfs).
    fn as_failing_disk(&self) -> Option<&dyn FailingDisk> {
        None
    }

    /// The cluster-mirroring ability, when this database has it.
    fn as_mirror(&self) -> Option<&dyn Mirror> {
        None
    }

    /// Its tiered-storage remote store, when it has one each node reaches on its own path.
    fn as_remote_store(&self) -> Option<&dyn RemoteStore> {
        None
    }
}

/// Cluster mirroring (KIP-1279): a destination cluster copies topics of a source cluster at the
/// same offsets, read-only until a failover stops it.
///
/// Contract: every request goes from the harness's client side to whichever node of the named
/// cluster answers, and fails with the reason when none does or the database refuses it.
/// - [`create_mirror`](Mirror::create_mirror) registers mirror `name` on `destination`, copying
///   from `source`; the name must be new.
/// - [`start_mirror`](Mirror::start_mirror) makes `topics` mirror topics of mirror `name`
///   (created with the source's ids, or existing ones failing back): once it returns they refuse
///   client writes; the LMLE truncation and copying go on in the background.
/// - [`stop_mirror`](Mirror::stop_mirror) is the failover: it returns once the topics are
///   writable, with the last mirrored leader epoch persisted and the leader epochs bumped above
///   it.
/// - [`describe_mirror`](Mirror::describe_mirror) reads each partition of mirror `name`'s topics
///   as its leader knows it (state, offsets, lag, LMLE), by topic.
/// - [`kept_lmles`](Mirror::kept_lmles) reads the LMLEs `cluster` keeps for `requester`'s
///   partitions of `topic` (persisted by a failover, looked up by a failback), -1 where none.
/// - [`set_unclean_support`](Mirror::set_unclean_support) sets
///   `mirror.support.unclean.leader.election` on one topic of a cluster.
pub trait Mirror: Send + Sync {
    /// Creates mirror `name` on `destination`, of `source`.
    fn create_mirror<'a>(
        &'a self,
        destination: &'a ClientContext,
        name: &'a str,
        source: &'a ClientContext,
    ) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Starts mirroring `topics` on `destination` by mirror `name`.
    fn start_mirror<'a>(
        &'a self,
        destination: &'a ClientContext,
        name: &'a str,
        topics: &'a [String],
    ) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Stops mirroring `topics` on `destination` (failover); they are writable on return.
    fn stop_mirror<'a>(
        &'a self,
        destination: &'a ClientContext,
        name: &'a str,
        topics: &'a [String],
    ) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Each partition of mirror `name` on `cluster`, as (topic, partition state).
    fn describe_mirror<'a>(
        &'a self,
        cluster: &'a ClientContext,
        name: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Vec<(String, PartitionDescription)>>>;

    /// The LMLEs of mirror `name`'s `topic` that `cluster` keeps for `requester`, as
    /// (partition, LMLE).
    fn kept_lmles<'a>(
        &'a self,
        cluster: &'a ClientContext,
        requester: &'a ClientContext,
        name: &'a str,
        topic: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Vec<(i32, i32)>>>;

    /// Sets `mirror.support.unclean.leader.election` of `topic` on `cluster` to `on`.
    fn set_unclean_support<'a>(
        &'a self,
        cluster: &'a ClientContext,
        topic: &'a str,
        on: bool,
    ) -> BoxFuture<'a, anyhow::Result<()>>;
}

/// Asks whether the database serves and whether its replicas agree. The runner repeats these
/// questions until they pass or its deadline comes ([`crate::probe`]).
///
/// Contract: each asks once and answers now; both may be asked while nodes restart or heal.
/// Without this ability the runner does not wait for the database.
pub trait Probe: Send + Sync {
    /// Ok once `node` serves clients, else why not.
    fn serves<'a>(
        &'a self,
        cx: &'a ClientContext,
        node: &'a NodeAddr,
    ) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Ok when every replica of every partition on `nodes` agrees now, else what does not.
    fn converged<'a>(
        &'a self,
        cx: &'a ClientContext,
        nodes: &'a [Node],
    ) -> BoxFuture<'a, Result<(), Unconverged>>;
}

/// What kept a database's replicas from agreeing when its [`Probe`] last asked: plain data, which
/// the runner records in the history (the `converge` op).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unconverged {
    /// Why not, for people: a replica behind its leader, or without a dump to tell.
    pub reasons: Vec<String>,
    /// Partitions without a leader.
    pub leaderless: Vec<PartitionRef>,
    /// Replicas whose log ends where their leader's does, so at or above its high watermark, and
    /// which the ISR still leaves out: caught up, and not let back in.
    pub out_of_isr: Vec<OutOfIsr>,
    /// Partitions whose every replica is in the ISR and holds all its leader holds, under a
    /// leader's high watermark that stays below that log end: nothing left to wait for, and the
    /// records above it never committed.
    pub stuck_high_watermarks: Vec<StuckHighWatermark>,
}

/// A partition, by topic and index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRef {
    pub topic: String,
    pub partition: i32,
}

/// One replica caught up with its leader but outside the partition's ISR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfIsr {
    pub topic: String,
    pub partition: i32,
    /// The replica's node.
    pub node: String,
    /// The leader's node.
    pub leader: String,
    /// The ISR, as node names.
    pub isr: Vec<String>,
    /// Where the replica's log, and its leader's, end.
    pub log_end_offset: i64,
}

/// A leader's high watermark below the log end every replica of its partition, all in the ISR,
/// holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckHighWatermark {
    pub topic: String,
    pub partition: i32,
    /// The leader's node.
    pub leader: String,
    /// The leader's high watermark.
    pub high_watermark: i64,
    /// Where every replica's log ends.
    pub log_end_offset: i64,
}

/// Crash and restart (Jepsen's `Kill`).
///
/// Contract: [`kill`](Kill::kill) ends the process abruptly (SIGKILL, no clean shutdown) and
/// returns once it is gone; killing a dead node succeeds. [`start`](Kill::start) starts a stopped
/// node with its existing data and configuration; starting a running node does nothing.
/// [`is_running`](Kill::is_running) tells whether the process is alive.
pub trait Kill: Send + Sync {
    /// Kills the process on `node`.
    fn kill(&self, node: &Node) -> anyhow::Result<()>;
    /// Starts the process on `node` if it is not running.
    fn start(&self, node: &Node) -> anyhow::Result<()>;
    /// Whether the process on `node` is alive (paused counts as alive).
    fn is_running(&self, node: &Node) -> anyhow::Result<bool>;
}

/// Freeze and thaw (Jepsen's `Pause`): SIGSTOP and SIGCONT.
///
/// Contract: [`pause`](Pause::pause) stops the process from running without ending it; it keeps
/// its sockets and memory. [`resume`](Pause::resume) lets it run again. Both succeed on a node
/// whose process is not running.
pub trait Pause: Send + Sync {
    /// Freezes the process on `node`.
    fn pause(&self, node: &Node) -> anyhow::Result<()>;
    /// Thaws the process on `node`.
    fn resume(&self, node: &Node) -> anyhow::Result<()>;
}

/// Files to snarf into `nodes/<node>/` of the run directory.
///
/// Contract: paths are on the node; files that do not exist are skipped by the caller.
pub trait LogFiles: Send + Sync {
    /// The node's log files.
    fn log_files(&self, node: &Node) -> Vec<PathBuf>;
}

/// Reads every replica's state on a node in the `replicas.jsonl` shape.
///
/// Contract: returns one [`DumpedReplica`] per partition replica of the workload's topics on
/// `node` (the database's internal topics left out), its `cluster` and `node` set to the
/// node's. It reads on-disk state and works whether the process is running or
/// not.
pub trait ReplicaDump: Send + Sync {
    /// The replicas on `node`.
    fn dump_replicas(&self, node: &Node) -> anyhow::Result<Vec<DumpedReplica>>;
}

/// One line of `replicas.jsonl`: the replica state the checkers read, and beside it what else the
/// database said about the replica, kept for people.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DumpedReplica {
    /// What `docs/history-format.md` defines.
    #[serde(flatten)]
    pub state: ReplicaState,
    /// The leader epoch the replica last knew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_epoch: Option<i64>,
    /// The in-sync replicas it last knew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isr: Option<Vec<i32>>,
    /// What the dump noticed while reading (gaps, bad batches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The `cluster.id` of the node's data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// A mirror topic's partition state (`MIRRORING`, `STOPPED`, ...) at the last registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_state: Option<String>,
}

impl DumpedReplica {
    /// The line for a replica whose state could not be read.
    pub fn unreadable(
        cluster: &str,
        node: &str,
        topic: &str,
        partition: i64,
        error: String,
    ) -> Self {
        DumpedReplica {
            state: ReplicaState {
                cluster: cluster.to_string(),
                node: node.to_string(),
                topic: topic.to_string(),
                partition,
                role: None,
                log_start_offset: None,
                high_watermark: None,
                log_end_offset: None,
                epochs: Vec::new(),
                records: Vec::new(),
                error: Some(error),
                tiered: None,
                remote_bootstrap: None,
                producers: None,
                unclean_elections: Vec::new(),
            },
            leader_epoch: None,
            isr: None,
            notes: Vec::new(),
            cluster_id: None,
            mirror_state: None,
        }
    }
}

/// A wall clock that can be skewed per node without a restart (libfaketime).
///
/// Contract: the database's process re-reads [`offset_file`](FakeClock::offset_file) on every
/// wall-clock read. Writing a libfaketime offset in seconds there (`+1.500`, `-2`) skews its wall
/// clock at once; `+0` or removing the file resets it. Monotonic clocks are never skewed.
pub trait FakeClock: Send + Sync {
    /// The offset file of the process on `node`.
    fn offset_file(&self, node: &Node) -> PathBuf;
}

/// Where the database keeps its data on a node.
///
/// Contract: a Kafka-layout log directory (`log.dirs`): a directory `<topic>-<partition>` per
/// replica holding segment files named `<20-digit base offset>.log`. Change files there only
/// while the node's process is stopped.
pub trait DataDir: Send + Sync {
    /// The data directory on `node`.
    fn data_dir(&self, node: &Node) -> PathBuf;
}

/// Tiered storage's remote store (KIP-405), shared by the nodes of a cluster, each reaching it
/// through a path of its own so that one node at a time can lose it.
///
/// Contract: [`cut`](RemoteStore::cut) makes the store unreachable from `node` at once, while the
/// node runs: every access from it then fails as a store that is down, never as an empty one, and
/// the store's content is untouched. [`restore`](RemoteStore::restore) makes it reachable again.
/// Both are idempotent and safe on a stopped node. Replica dumps read the shared store itself,
/// whatever a node's way to it.
pub trait RemoteStore: Send + Sync {
    /// Takes the store away from `node`.
    fn cut(&self, node: &Node) -> anyhow::Result<()>;
    /// Gives it back.
    fn restore(&self, node: &Node) -> anyhow::Result<()>;
}

/// Power loss: the node's data directory is on a filesystem that keeps writes in memory until
/// fsync (tidemark-powerfs), and power can be cut under it.
///
/// Contract: [`power_off`](PowerLoss::power_off) kills the process (SIGKILL), then drops every
/// write to the data directory not yet durable, tearing each file's last unsynced write at a byte
/// `seed` chooses, and leaves the node off; it returns what was dropped (the filesystem's report)
/// once the node is off. [`power_on`](PowerLoss::power_on) mounts what survived and starts the
/// process. Powering off an off node fails; powering on a running node does nothing.
pub trait PowerLoss: Send + Sync {
    /// Cuts power to `node`.
    fn power_off(&self, node: &Node, seed: u64) -> anyhow::Result<Value>;
    /// Boots `node` again on what survived.
    fn power_on(&self, node: &Node) -> anyhow::Result<()>;
}

/// A way for a node's disk to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFault {
    /// Every fsync fails with EIO, and what it would have made durable never is unless written
    /// again, while reads go on seeing it (Linux's page cache after a failed write-back).
    FailFsync,
    /// The disk is full: every write that would grow a file fails with ENOSPC.
    Full,
    /// The disk is nearly full: files grow into a little room left (4 KiB), the write that
    /// fills it is cut short, and growth past it fails with ENOSPC; two writes that make one
    /// change (a batch and its checkpoint) may see one fit and the other refused.
    NearlyFull,
}

impl DiskFault {
    /// Every way, in the order schedules name them.
    pub const ALL: [DiskFault; 3] = [DiskFault::FailFsync, DiskFault::Full, DiskFault::NearlyFull];

    /// Its name in histories and on the filesystem's command line.
    pub fn name(self) -> &'static str {
        match self {
            DiskFault::FailFsync => "fail-fsync",
            DiskFault::Full => "full",
            DiskFault::NearlyFull => "nearly-full",
        }
    }
}

/// A failing disk: the node's data directory is on tidemark-powerfs, which can be made to fail.
///
/// Contract: [`fail`](FailingDisk::fail) puts a [`DiskFault`] in force in the node's data
/// directory until [`heal`](FailingDisk::heal); both return the filesystem's report (`fault`,
/// `lost_bytes` dropped by failed fsyncs, `refused` writes of a full disk).
/// [`reboot`](FailingDisk::reboot) kills the process, unmounts the filesystem (writing back
/// whatever the disk takes) and boots the node on what the disk holds: the cache, and what only
/// it held, is gone. Each is safe on a stopped process; the first two need the filesystem mounted.
pub trait FailingDisk: Send + Sync {
    /// Makes `node`'s disk fail so.
    fn fail(&self, node: &Node, fault: DiskFault) -> anyhow::Result<Value>;
    /// Makes it work again.
    fn heal(&self, node: &Node) -> anyhow::Result<Value>;
    /// Boots `node` again on what its disk holds.
    fn reboot(&self, node: &Node) -> anyhow::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dumped_replicas_keep_the_broker_extras_beside_the_spec_fields() {
        let line = json!({"cluster": "a", "node": "n1", "topic": "t", "partition": 0,
            "role": "leader", "log_start_offset": 0, "high_watermark": 2, "log_end_offset": 2,
            "epochs": [[0, 0]], "records": [[0, 15, 0], [1, 16, 0]],
            "leader_epoch": 0, "isr": [1, 2], "notes": ["gap before segment 9"],
            "cluster_id": "tidemark-a", "mirror_state": "MIRRORING"});
        let r: DumpedReplica = serde_json::from_value(line.clone()).unwrap();
        assert_eq!(r.state.records[1].value, 16);
        assert_eq!(r.state.high_watermark, Some(2));
        assert_eq!(r.isr, Some(vec![1, 2]));
        assert_eq!(serde_json::to_value(&r).unwrap(), line);
        let bad = DumpedReplica::unreadable("a", "n2", "t", 1, "gone".into());
        assert_eq!(
            serde_json::to_value(&bad).unwrap(),
            json!({"cluster": "a", "node": "n2", "topic": "t", "partition": 1,
                   "epochs": [], "records": [], "error": "gone"})
        );
    }
}
