//! Broker configuration in Kafka's own vocabulary: a `server.properties` file plus `--override`
//! pairs, every key checked against the set this broker understands so that a typo is an error
//! naming the key, the value and the line rather than a silently ignored setting.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a configuration value came from, so an error can point at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Line `line` (1-based) of the properties file.
    File { path: PathBuf, line: usize },
    /// A `--override key=value` argument.
    Override,
    /// A topic-level setting from CreateTopics or IncrementalAlterConfigs.
    Topic,
    /// A cluster-wide dynamic broker setting from IncrementalAlterConfigs.
    Dynamic,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line } => write!(f, "{}:{}", path.display(), line),
            Origin::Override => write!(f, "--override"),
            Origin::Topic => write!(f, "topic config"),
            Origin::Dynamic => write!(f, "dynamic cluster config"),
        }
    }
}

/// A configuration mistake, with the key, the value and where it was written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{origin}: unknown configuration key `{key}`")]
    UnknownKey { key: String, origin: Origin },
    #[error("{origin}: invalid value `{value}` for `{key}`: {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
        origin: Origin,
    },
    #[error("{origin}: line is not `key=value`: `{text}`")]
    Syntax { text: String, origin: Origin },
    #[error("{path}:{second}: `{key}` is set again (first set on line {first})")]
    DuplicateKey {
        key: String,
        path: PathBuf,
        first: usize,
        second: usize,
    },
    #[error("missing required configuration `{key}`")]
    Missing { key: String },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Settings that may also be overridden per topic; the broker's values are the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    pub min_insync_replicas: i32,
    pub unclean_leader_election_enable: bool,
    pub segment_bytes: u64,
    /// fsync after this many appended messages; 1 means before every acknowledgement.
    pub flush_interval_messages: u64,
    /// KIP-1279: LMLE truncation waits for every replica, not just the ISR, so a later unclean
    /// election cannot resurrect records beyond the LMLE.
    pub mirror_support_unclean_leader_election: bool,
    /// Largest record batch a producer may append, in bytes (log overhead included), as Kafka
    /// measures it; larger ones are refused with MESSAGE_TOO_LARGE.
    pub max_message_bytes: u64,
    /// Delete a closed segment once its newest record is older than this (ms); -1: never.
    pub retention_ms: i64,
    /// Delete the oldest closed segments while the log is larger than this (bytes); -1: never.
    pub retention_bytes: i64,
    /// KIP-405 `remote.storage.enable`: the leader uploads closed segments below the last stable
    /// offset to the remote store, and local retention may then delete them here.
    pub remote_storage_enable: bool,
    /// `local.retention.ms`: how long uploaded segments stay local; -2: as `retention.ms`.
    pub local_retention_ms: i64,
    /// `local.retention.bytes`: how large the local part may grow; -2: as `retention.bytes`.
    pub local_retention_bytes: i64,
}

/// Kafka's default `message.max.bytes`: 1 MiB plus the 12-byte log overhead.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 1024 * 1024 + 12;

/// Kafka's default `log.retention.hours=168`.
const DEFAULT_RETENTION_MS: i64 = 168 * 3_600_000;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            min_insync_replicas: 1,
            unclean_leader_election_enable: false,
            segment_bytes: 1 << 30,
            flush_interval_messages: u64::MAX,
            mirror_support_unclean_leader_election: false,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            retention_ms: DEFAULT_RETENTION_MS,
            retention_bytes: -1,
            remote_storage_enable: false,
            local_retention_ms: -2,
            local_retention_bytes: -2,
        }
    }
}

/// KIP-1023's flag: whether an empty follower of a tiered topic starts at the last tiered
/// offset. Static, and dynamic for the whole cluster.
pub const FETCH_LAST_TIERED_OFFSET_KEY: &str = "follower.fetch.last.tiered.offset.enable";

/// Broker keys that may be changed at run time for the whole cluster (Kafka's cluster-default
/// dynamic broker configs).
pub const DYNAMIC_CLUSTER_KEYS: &[&str] = &[FETCH_LAST_TIERED_OFFSET_KEY];

/// Checks a dynamic cluster config: a key of [`DYNAMIC_CLUSTER_KEYS`] with a value it takes.
pub fn validate_dynamic_cluster_config(key: &str, value: &str) -> Result<(), ConfigError> {
    let origin = Origin::Dynamic;
    match key {
        FETCH_LAST_TIERED_OFFSET_KEY => parse_bool(key, value, &origin).map(|_| ()),
        _ => Err(ConfigError::UnknownKey {
            key: key.to_string(),
            origin,
        }),
    }
}

/// Topic-level key names and the broker keys they default from.
pub const TOPIC_KEYS: &[(&str, &str)] = &[
    ("min.insync.replicas", "min.insync.replicas"),
    (
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
    ),
    ("segment.bytes", "log.segment.bytes"),
    ("flush.messages", "log.flush.interval.messages"),
    (
        "mirror.support.unclean.leader.election",
        "mirror.support.unclean.leader.election",
    ),
    ("max.message.bytes", "message.max.bytes"),
    ("retention.ms", "log.retention.ms"),
    ("retention.bytes", "log.retention.bytes"),
    ("remote.storage.enable", "remote.storage.enable"),
    ("local.retention.ms", "log.local.retention.ms"),
    ("local.retention.bytes", "log.local.retention.bytes"),
];

impl LogConfig {
    /// Applies one topic-level setting (Kafka's topic key names) to this configuration.
    pub fn set_topic_key(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let origin = Origin::Topic;
        match key {
            "min.insync.replicas" => {
                self.min_insync_replicas =
                    parse_num(key, value, 1, i32::MAX as i64, &origin)? as i32
            }
            "unclean.leader.election.enable" => {
                self.unclean_leader_election_enable = parse_bool(key, value, &origin)?
            }
            "segment.bytes" => {
                self.segment_bytes = parse_num(key, value, 14, i64::MAX, &origin)? as u64
            }
            "flush.messages" => {
                self.flush_interval_messages = parse_num(key, value, 1, i64::MAX, &origin)? as u64
            }
            "mirror.support.unclean.leader.election" => {
                self.mirror_support_unclean_leader_election = parse_bool(key, value, &origin)?
            }
            "max.message.bytes" => {
                self.max_message_bytes = parse_num(key, value, 0, i32::MAX as i64, &origin)? as u64
            }
            "retention.ms" => self.retention_ms = parse_num(key, value, -1, i64::MAX, &origin)?,
            "retention.bytes" => {
                self.retention_bytes = parse_num(key, value, -1, i64::MAX, &origin)?
            }
            "remote.storage.enable" => {
                self.remote_storage_enable = parse_bool(key, value, &origin)?
            }
            "local.retention.ms" => {
                self.local_retention_ms = parse_num(key, value, -2, i64::MAX, &origin)?
            }
            "local.retention.bytes" => {
                self.local_retention_bytes = parse_num(key, value, -2, i64::MAX, &origin)?
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    key: key.to_string(),
                    origin,
                })
            }
        }
        Ok(())
    }

    /// The value of a topic-level key, rendered as Kafka would.
    pub fn topic_value(&self, key: &str) -> Option<String> {
        Some(match key {
            "min.insync.replicas" => self.min_insync_replicas.to_string(),
            "unclean.leader.election.enable" => self.unclean_leader_election_enable.to_string(),
            "segment.bytes" => self.segment_bytes.to_string(),
            "flush.messages" => {
                if self.flush_interval_messages == u64::MAX {
                    i64::MAX.to_string()
                } else {
                    self.flush_interval_messages.to_string()
                }
            }
            "mirror.support.unclean.leader.election" => {
                self.mirror_support_unclean_leader_election.to_string()
            }
            "max.message.bytes" => self.max_message_bytes.to_string(),
            "retention.ms" => self.retention_ms.to_string(),
            "retention.bytes" => self.retention_bytes.to_string(),
            "remote.storage.enable" => self.remote_storage_enable.to_string(),
            "local.retention.ms" => self.local_retention_ms.to_string(),
            "local.retention.bytes" => self.local_retention_bytes.to_string(),
            _ => return None,
        })
    }
}

/// A named listener, `NAME://host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub host: String,
    pub port: u16,
    /// The address to bind, resolved while the configuration is read so that a host name that
    /// does not resolve is a configuration error; `None` for advertised listeners, never bound.
    pub bind: Option<SocketAddr>,
}

impl Listener {
    pub fn socket_addr(&self) -> Result<SocketAddr, String> {
        self.bind
            .ok_or_else(|| format!("listener {} is advertised only, not bound", self.name))
    }
}

/// Resolves a listener's host (empty: every interface), preferring an IPv4 address.
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve `{host}`: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("`{host}` resolves to no address"))
}

/// One voter of the controller quorum, `id@host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Voter {
    pub id: i32,
    pub host: String,
    pub port: u16,
}

/// What a node runs (`process.roles`): KRaft's combined mode, a broker that reaches the controller
/// quorum over the network, or a controller voter that serves no clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessRoles {
    Combined,
    Broker,
    Controller,
}

impl ProcessRoles {
    fn parse(value: &str) -> Result<ProcessRoles, String> {
        let roles: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .collect();
        if let Some(r) = roles.iter().find(|r| !["broker", "controller"].contains(r)) {
            return Err(format!(
                "unknown role `{r}`: roles are `broker` and `controller`"
            ));
        }
        match (roles.contains(&"broker"), roles.contains(&"controller")) {
            (true, true) => Ok(ProcessRoles::Combined),
            (true, false) => Ok(ProcessRoles::Broker),
            (false, true) => Ok(ProcessRoles::Controller),
            (false, false) => Err("names no role: `broker`, `controller` or both".to_string()),
        }
    }

    /// Kafka's rules: a dedicated node needs a quorum; a controller is one of its voters and a
    /// broker-only node is not.
    fn check(self, node_id: i32, voters: &[Voter]) -> Result<(), String> {
        let voter = voters.iter().any(|v| v.id == node_id);
        match self {
            ProcessRoles::Combined if voters.is_empty() => Ok(()),
            _ if voters.is_empty() => {
                Err("a dedicated broker or controller needs controller.quorum.voters".to_string())
            }
            ProcessRoles::Broker if voter => Err(format!(
                "node {node_id} is in controller.quorum.voters, so it must have the controller role"
            )),
            ProcessRoles::Controller | ProcessRoles::Combined if !voter => Err(format!(
                "a controller must be in controller.quorum.voters, which does not name node {node_id}"
            )),
            _ => Ok(()),
        }
    }

    /// Whether the node serves clients and hosts replicas.
    pub fn broker(self) -> bool {
        self != ProcessRoles::Controller
    }

    /// Whether the node runs the metadata quorum (or, without voters, its own metadata).
    pub fn controller(self) -> bool {
        self != ProcessRoles::Broker
    }
}

/// The resolved broker configuration.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    pub node_id: i32,
    /// `process.roles`; combined when absent.
    pub process_roles: ProcessRoles,
    pub listeners: Vec<Listener>,
    pub advertised_listeners: Vec<Listener>,
    pub controller_listener_names: Vec<String>,
    pub controller_quorum_voters: Vec<Voter>,
    pub log_dir: PathBuf,
    pub num_partitions: i32,
    pub default_replication_factor: i16,
    pub auto_create_topics_enable: bool,
    pub replica_lag_time_max: Duration,
    /// The most record bytes one follower fetch asks for (`replica.fetch.max.bytes`; at least
    /// one batch comes whatever its size). Default 8 MiB (Kafka's is 1 MiB).
    pub replica_fetch_max_bytes: i32,
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    /// `auto.leader.rebalance.enable`: the active controller moves leadership back to preferred
    /// replicas every `leader_imbalance_check_interval`.
    pub auto_leader_rebalance_enable: bool,
    pub leader_imbalance_check_interval: Duration,
    /// `eligible.leader.replicas.version` (KIP-966's feature level, 0 or 1): at 1 the controller
    /// keeps the replicas that left an ISR below `min.insync.replicas` as eligible leaders and
    /// takes a broker back from an unclean shutdown out of them. Kafka 4.1 turns it on for new
    /// clusters, as here.
    pub eligible_leader_replicas: bool,
    /// How often every replica applies retention (`log.retention.check.interval.ms`).
    pub retention_check_interval: Duration,
    pub log: LogConfig,
    /// This cluster's id, as Metadata reports it; mirrors tell clusters apart by it.
    pub cluster_id: String,
    /// API key of CreateClusterMirror; the other mirror APIs follow at the KIP's distances
    /// (the KIP's keys are provisional, so they may be moved away from a clash).
    pub mirror_api_key_base: i16,
    /// The group coordinator's settings.
    pub groups: GroupConfig,
    /// KIP-1279's proactive epoch bump: a mirrored batch whose epoch is within this many of the
    /// local leader epoch (and not above it) schedules a bump; 0 turns proactive bumps off.
    pub mirror_epoch_bump_threshold: i32,
    /// How far above the mirrored batch's epoch a proactive bump moves the local leader epoch.
    pub mirror_epoch_bump_increment: i32,
    /// KIP-1279's FAILED retries: the first backoff, the largest one, and the attempts after
    /// which a partition stays FAILED until RecoverMirrorTopics.
    pub mirror_failed_retry_initial_backoff: Duration,
    pub mirror_failed_retry_max_backoff: Duration,
    pub mirror_failed_retry_max_attempts: i32,
    /// Tiered storage (KIP-405, KIP-1023): where the remote store is and how the broker uses it.
    pub tiered: TieredConfig,
    /// Every key as finally set, for DescribeConfigs.
    pub raw: BTreeMap<String, String>,
}

/// The broker's tiered-storage settings, under Kafka's key names where Kafka has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TieredConfig {
    /// The remote store shared by every broker of the cluster (data and metadata): a directory
    /// (`remote.log.storage.dir`) or an S3 bucket (`remote.log.storage.s3.*`); `None`: no remote
    /// store, and a topic cannot enable remote storage.
    pub store: Option<RemoteStoreConfig>,
    /// `remote.log.manager.task.interval.ms`: how often a leader uploads closed segments and
    /// applies local retention (Kafka's default 30000).
    pub task_interval: Duration,
    /// `follower.fetch.last.tiered.offset.enable` (KIP-1023): an empty follower of a tiered topic
    /// starts at the leader's earliest offset pending upload; dynamic, cluster-wide default.
    pub follower_fetch_last_tiered_offset_enable: bool,
}

/// Where the remote store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteStoreConfig {
    /// `remote.log.storage.dir`: a directory every broker sees.
    Dir(PathBuf),
    /// `remote.log.storage.s3.bucket` and its companions.
    S3(S3Config),
}

/// An S3-compatible store (Kafka names no keys for one: its plugins have their own; these follow
/// `remote.log.storage.*`). Credentials come from the environment, never from this file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    /// `remote.log.storage.s3.bucket`: the bucket, which must exist.
    pub bucket: String,
    /// `remote.log.storage.s3.endpoint`: an `http://` or `https://` URL of an S3-compatible
    /// server; `None`: AWS's endpoint for the region. Plain http is allowed only by naming it.
    pub endpoint: Option<String>,
    /// `remote.log.storage.s3.region` (default `us-east-1`).
    pub region: String,
    /// `remote.log.storage.s3.path.style.access` (default false): `<endpoint>/<bucket>/<key>`
    /// instead of `<bucket>.<endpoint>/<key>`, as most self-hosted servers need.
    pub path_style_access: bool,
}

/// The group coordinator's settings, under Kafka's key names.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// `offsets.topic.num.partitions`: partitions of `__consumer_offsets` (Kafka's default is
    /// 50; 10 keeps test clusters small).
    pub offsets_topic_num_partitions: i32,
    /// `offsets.topic.replication.factor`, capped at the brokers registered when the topic is
    /// created.
    pub offsets_topic_replication_factor: i16,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an empty group
    /// waits for more members.
    pub initial_rebalance_delay: Duration,
    /// `group.min.session.timeout.ms` and `group.max.session.timeout.ms`.
    pub min_session_timeout: Duration,
    pub max_session_timeout: Duration,
    /// `offset.metadata.max.bytes`: the longest commit metadata string accepted.
    pub offset_metadata_max_bytes: usize,
}

const BROKER_KEYS: &[&str] = &[
    "node.id",
    "broker.id",
    "process.roles",
    "listeners",
    "advertised.listeners",
    "controller.listener.names",
    "controller.quorum.voters",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "log.dirs",
    "log.dir",
    "num.partitions",
    "default.replication.factor",
    "min.insync.replicas",
    "unclean.leader.election.enable",
    "log.segment.bytes",
    "log.flush.interval.messages",
    "auto.create.topics.enable",
    "replica.lag.time.max.ms",
    "replica.fetch.max.bytes",
    "broker.heartbeat.interval.ms",
    "broker.session.timeout.ms",
    "cluster.id",
    "mirror.api.key.base",
    "mirror.epoch.bump.threshold",
    "mirror.epoch.bump.increment",
    "mirror.failed.retry.initial.backoff.ms",
    "mirror.failed.retry.max.backoff.ms",
    "mirror.failed.retry.max.attempts",
    "mirror.support.unclean.leader.election",
    "message.max.bytes",
    "log.retention.ms",
    "log.retention.minutes",
    "log.retention.hours",
    "log.retention.bytes",
    "log.retention.check.interval.ms",
    "auto.leader.rebalance.enable",
    "leader.imbalance.check.interval.seconds",
    "eligible.leader.replicas.version",
    "offsets.topic.num.partitions",
    "offsets.topic.replication.factor",
    "group.initial.rebalance.delay.ms",
    "group.min.session.timeout.ms",
    "group.max.session.timeout.ms",
    "offset.metadata.max.bytes",
    "remote.log.storage.dir",
    "remote.log.storage.s3.bucket",
    "remote.log.storage.s3.endpoint",
    "remote.log.storage.s3.region",
    "remote.log.storage.s3.path.style.access",
    "remote.log.manager.task.interval.ms",
    FETCH_LAST_TIERED_OFFSET_KEY,
    "log.local.retention.ms",
    "log.local.retention.bytes",
];

impl BrokerConfig {
    /// Reads a properties file and applies `key=value` overrides after it.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut entries = Vec::new();
        let mut first_line: BTreeMap<String, usize> = BTreeMap::new();
        for (i, raw_line) in text.lines().enumerate() {
            let origin = Origin::File {
                path: path.to_path_buf(),
                line: i + 1,
            };
            let line = raw_line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let (k, v) = split_pair(line).ok_or_else(|| ConfigError::Syntax {
                text: line.to_string(),
                origin: origin.clone(),
            })?;
            // A key set twice in one file is a mistake: which line was meant is anyone's guess.
            if let Some(first) = first_line.insert(k.clone(), i + 1) {
                return Err(ConfigError::DuplicateKey {
                    key: k,
                    path: path.to_path_buf(),
                    first,
                    second: i + 1,
                });
            }
            entries.push((k, v, origin));
        }
        for o in overrides {
            let (k, v) = split_pair(o).ok_or_else(|| ConfigError::Syntax {
                text: o.clone(),
                origin: Origin::Override,
            })?;
            entries.push((k, v, Origin::Override));
        }
        Self::from_entries(entries)
    }

    /// Builds the configuration from `(key, value, origin)` triples; later entries win.
    pub fn from_entries(entries: Vec<(String, String, Origin)>) -> Result<Self, ConfigError> {
        let mut set: BTreeMap<String, (String, Origin)> = BTreeMap::new();
        for (k, v, origin) in entries {
            if !BROKER_KEYS.contains(&k.as_str()) {
                return Err(ConfigError::UnknownKey { key: k, origin });
            }
            set.insert(k, (v, origin));
        }
        let get = |k: &str| set.get(k).map(|(v, o)| (v.as_str(), o));
        let required = |k: &str| get(k).ok_or_else(|| ConfigError::Missing { key: k.to_string() });

        let (v, o) =
            get("node.id")
                .or_else(|| get("broker.id"))
                .ok_or_else(|| ConfigError::Missing {
                    key: "node.id".to_string(),
                })?;
        let node_id = parse_num("node.id", v, 0, i32::MAX as i64, o)? as i32;

        let process_roles = match get("process.roles") {
            Some((v, o)) => Some((
                ProcessRoles::parse(v).map_err(|why| bad("process.roles", v, &why, o))?,
                v,
                o,
            )),
            None => None,
        };

        let (v, o) = required("listeners")?;
        let listeners = parse_listeners("listeners", v, o, true)?;
        let advertised_listeners = match get("advertised.listeners") {
            Some((v, o)) => parse_listeners("advertised.listeners", v, o, false)?,
            None => listeners.clone(),
        };
        let controller_listener_names = match get("controller.listener.names") {
            Some((v, _)) => v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            None => vec!["CONTROLLER".to_string()],
        };
        let controller_quorum_voters = match get("controller.quorum.voters") {
            Some((v, o)) => parse_voters(v, o)?,
            None => Vec::new(),
        };
        let roles = match process_roles {
            Some((roles, v, o)) => {
                roles
                    .check(node_id, &controller_quorum_voters)
                    .map_err(|why| bad("process.roles", v, &why, o))?;
                roles
            }
            None => {
                if let Some((v, o)) = get("controller.quorum.voters") {
                    ProcessRoles::Combined
                        .check(node_id, &controller_quorum_voters)
                        .map_err(|why| bad("controller.quorum.voters", v, &why, o))?;
                }
                ProcessRoles::Combined
            }
        };
        // A voter's quorum listens on its controller listener; a standalone node (no voters)
        // keeps its metadata in-process and a broker-only node reaches the voters', so neither
        // needs one. A node with the broker role serves clients on another listener.
        for name in &controller_listener_names {
            if roles.controller()
                && !controller_quorum_voters.is_empty()
                && !listeners.iter().any(|l| &l.name == name)
            {
                let (v, o) = get("controller.listener.names").unwrap_or((name, &Origin::Override));
                return Err(bad(
                    "controller.listener.names",
                    v,
                    &format!("no listener named {name} in `listeners`"),
                    o,
                ));
            }
        }

        if roles.broker()
            && !listeners
                .iter()
                .any(|l| !controller_listener_names.contains(&l.name))
        {
            let (v, o) = required("listeners")?;
            return Err(bad(
                "listeners",
                v,
                "a node with the broker role needs a listener for clients (one not named in controller.listener.names)",
                o,
            ));
        }

        let (v, o) =
            get("log.dirs")
                .or_else(|| get("log.dir"))
                .ok_or_else(|| ConfigError::Missing {
                    key: "log.dirs".to_string(),
                })?;
        let dirs: Vec<&str> = v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if dirs.len() != 1 {
            return Err(bad(
                "log.dirs",
                v,
                "exactly one log directory is supported",
                o,
            ));
        }
        let log_dir = PathBuf::from(dirs[0]);

        let num = |k: &str, default: i64, min: i64, max: i64| -> Result<i64, ConfigError> {
            match get(k) {
                Some((v, o)) => parse_num(k, v, min, max, o),
                None => Ok(default),
            }
        };
        let boolean = |k: &str, default: bool| -> Result<bool, ConfigError> {
            match get(k) {
                Some((v, o)) => parse_bool(k, v, o),
                None => Ok(default),
            }
        };
        let flush = num("log.flush.interval.messages", i64::MAX, 1, i64::MAX)?;
        // Kafka's precedence: ms, then minutes, then hours; a negative value means forever.
        let retention_ms = if get("log.retention.ms").is_some() {
            num("log.retention.ms", DEFAULT_RETENTION_MS, -1, i64::MAX)?
        } else if get("log.retention.minutes").is_some() {
            let m = num("log.retention.minutes", 0, -1, i64::MAX / 60_000)?;
            if m < 0 {
                -1
            } else {
                m * 60_000
            }
        } else {
            let h = num("log.retention.hours", 168, -1, i64::MAX / 3_600_000)?;
            if h < 0 {
                -1
            } else {
                h * 3_600_000
            }
        };
        let log = LogConfig {
            min_insync_replicas: num("min.insync.replicas", 1, 1, i32::MAX as i64)? as i32,
            unclean_leader_election_enable: boolean("unclean.leader.election.enable", false)?,
            segment_bytes: num("log.segment.bytes", 1 << 30, 14, i64::MAX)? as u64,
            flush_interval_messages: if flush == i64::MAX {
                u64::MAX
            } else {
                flush as u64
            },
            mirror_support_unclean_leader_election: boolean(
                "mirror.support.unclean.leader.election",
                false,
            )?,
            max_message_bytes: num(
                "message.max.bytes",
                DEFAULT_MAX_MESSAGE_BYTES as i64,
                0,
                i32::MAX as i64,
            )? as u64,
            retention_ms,
            retention_bytes: num("log.retention.bytes", -1, -1, i64::MAX)?,
            remote_storage_enable: false,
            local_retention_ms: num("log.local.retention.ms", -2, -2, i64::MAX)?,
            local_retention_bytes: num("log.local.retention.bytes", -2, -2, i64::MAX)?,
        };
        let cluster_id = match get("cluster.id") {
            Some((v, o)) => {
                if v.is_empty() || v.chars().any(|c| c.is_whitespace()) {
                    return Err(bad(
                        "cluster.id",
                        v,
                        "must be non-empty without whitespace",
                        o,
                    ));
                }
                v.to_string()
            }
            None => "tidemark".to_string(),
        };
        let tiered = TieredConfig {
            store: remote_store(&get, &boolean)?,
            task_interval: Duration::from_millis(num(
                "remote.log.manager.task.interval.ms",
                30_000,
                1,
                i64::MAX,
            )? as u64),
            follower_fetch_last_tiered_offset_enable: boolean(FETCH_LAST_TIERED_OFFSET_KEY, false)?,
        };
        let mirror_api_key_base = num("mirror.api.key.base", 94, 0, i16::MAX as i64 - 16)? as i16;
        if let Some(clash) = crate::mirror::wire::clashing_key(mirror_api_key_base) {
            let (v, o) = get("mirror.api.key.base").expect("the default clashes with nothing");
            return Err(bad(
                "mirror.api.key.base",
                v,
                &format!("mirror API key {clash} is already a Kafka API this broker knows"),
                o,
            ));
        }
        let groups = GroupConfig {
            offsets_topic_num_partitions: num("offsets.topic.num.partitions", 10, 1, 10_000)?
                as i32,
            offsets_topic_replication_factor: num(
                "offsets.topic.replication.factor",
                3,
                1,
                i16::MAX as i64,
            )? as i16,
            initial_rebalance_delay: Duration::from_millis(num(
                "group.initial.rebalance.delay.ms",
                3_000,
                0,
                i32::MAX as i64,
            )? as u64),
            min_session_timeout: Duration::from_millis(num(
                "group.min.session.timeout.ms",
                6_000,
                0,
                i32::MAX as i64,
            )? as u64),
            max_session_timeout: Duration::from_millis(num(
                "group.max.session.timeout.ms",
                1_800_000,
                0,
                i32::MAX as i64,
            )? as u64),
            offset_metadata_max_bytes: num("offset.metadata.max.bytes", 4096, 0, i32::MAX as i64)?
                as usize,
        };
        Ok(BrokerConfig {
            node_id,
            process_roles: roles,
            listeners,
            advertised_listeners,
            controller_listener_names,
            controller_quorum_voters,
            log_dir,
            num_partitions: num("num.partitions", 1, 1, 100_000)? as i32,
            default_replication_factor: num("default.replication.factor", 1, 1, i16::MAX as i64)?
                as i16,
            auto_create_topics_enable: boolean("auto.create.topics.enable", true)?,
            replica_lag_time_max: Duration::from_millis(num(
                "replica.lag.time.max.ms",
                30_000,
                1,
                i64::MAX,
            )? as u64),
            replica_fetch_max_bytes: num("replica.fetch.max.bytes", 8 << 20, 1, i32::MAX as i64)?
                as i32,
            heartbeat_interval: Duration::from_millis(num(
                "broker.heartbeat.interval.ms",
                2_000,
                1,
                i64::MAX,
            )? as u64),
            session_timeout: Duration::from_millis(num(
                "broker.session.timeout.ms",
                9_000,
                1,
                i64::MAX,
            )? as u64),
            auto_leader_rebalance_enable: boolean("auto.leader.rebalance.enable", true)?,
            eligible_leader_replicas: num("eligible.leader.replicas.version", 1, 0, 1)? == 1,
            leader_imbalance_check_interval: Duration::from_secs(num(
                "leader.imbalance.check.interval.seconds",
                300,
                1,
                i64::MAX / 1000,
            )? as u64),
            retention_check_interval: Duration::from_millis(num(
                "log.retention.check.interval.ms",
                300_000,
                1,
                i64::MAX,
            )? as u64),
            log,
            cluster_id,
            mirror_api_key_base,
            groups,
            mirror_epoch_bump_threshold: num("mirror.epoch.bump.threshold", 3, 0, 1 << 20)? as i32,
            mirror_epoch_bump_increment: num("mirror.epoch.bump.increment", 10, 1, 1 << 20)? as i32,
            mirror_failed_retry_initial_backoff: Duration::from_millis(num(
                "mirror.failed.retry.initial.backoff.ms",
                1_000,
                1,
                i64::MAX,
            )? as u64),
            mirror_failed_retry_max_backoff: Duration::from_millis(num(
                "mirror.failed.retry.max.backoff.ms",
                30_000,
                1,
                i64::MAX,
            )? as u64),
            mirror_failed_retry_max_attempts: num(
                "mirror.failed.retry.max.attempts",
                100,
                1,
                i16::MAX as i64,
            )? as i32,
            tiered,
            raw: set.into_iter().map(|(k, (v, _))| (k, v)).collect(),
        })
    }

    /// The listener clients use: the first one that is not a controller listener.
    pub fn client_listener(&self) -> Option<&Listener> {
        self.listeners
            .iter()
            .find(|l| !self.controller_listener_names.contains(&l.name))
    }

    /// The advertised address of the client listener.
    pub fn advertised_client_listener(&self) -> Option<&Listener> {
        let name = &self.client_listener()?.name;
        self.advertised_listeners
            .iter()
            .find(|l| &l.name == name)
            .or_else(|| self.client_listener())
    }
}

fn split_pair(line: &str) -> Option<(String, String)> {
    let idx = line.find(['=', ':'])?;
    let k = line[..idx].trim();
    if k.is_empty() {
        return None;
    }
    Some((k.to_string(), line[idx + 1..].trim().to_string()))
}

/// The remote store the `remote.log.storage.*` keys name: a directory or an S3 bucket, not both.
fn remote_store<'a>(
    get: &impl Fn(&str) -> Option<(&'a str, &'a Origin)>,
    boolean: &impl Fn(&str, bool) -> Result<bool, ConfigError>,
) -> Result<Option<RemoteStoreConfig>, ConfigError> {
    const S3_KEYS: [&str; 3] = [
        "remote.log.storage.s3.endpoint",
        "remote.log.storage.s3.region",
        "remote.log.storage.s3.path.style.access",
    ];
    let dir = get("remote.log.storage.dir");
    let Some((bucket, o)) = get("remote.log.storage.s3.bucket") else {
        if let Some((key, (v, o))) = S3_KEYS.iter().find_map(|k| Some((k, get(k)?))) {
            return Err(bad(key, v, "needs remote.log.storage.s3.bucket", o));
        }
        return match dir {
            Some((v, o)) if v.is_empty() => {
                Err(bad("remote.log.storage.dir", v, "must be a path", o))
            }
            Some((v, _)) => Ok(Some(RemoteStoreConfig::Dir(PathBuf::from(v)))),
            None => Ok(None),
        };
    };
    if dir.is_some() {
        return Err(bad(
            "remote.log.storage.s3.bucket",
            bucket,
            "cannot be set with remote.log.storage.dir: a cluster has one remote store",
            o,
        ));
    }
    // S3's bucket naming rules, so that a typo is refused here rather than by every request.
    let valid_bucket = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid_bucket {
        return Err(bad(
            "remote.log.storage.s3.bucket",
            bucket,
            "must be an S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, \
             starting and ending with a letter or digit",
            o,
        ));
    }
    let endpoint = match get("remote.log.storage.s3.endpoint") {
        Some((v, o)) => {
            let host = v
                .strip_prefix("http://")
                .or_else(|| v.strip_prefix("https://"));
            if host.is_none_or(|h| h.is_empty() || h.contains(char::is_whitespace)) {
                return Err(bad(
                    "remote.log.storage.s3.endpoint",
                    v,
                    "must be an http:// or https:// URL",
                    o,
                ));
            }
            Some(v.trim_end_matches('/').to_string())
        }
        None => None,
    };
    let region = match get("remote.log.storage.s3.region") {
        Some((v, o)) if v.is_empty() || v.contains(char::is_whitespace) => {
            return Err(bad(
                "remote.log.storage.s3.region",
                v,
                "must be a region name such as us-east-1",
                o,
            ))
        }
        Some((v, _)) => v.to_string(),
        None => "us-east-1".to_string(),
    };
    Ok(Some(RemoteStoreConfig::S3(S3Config {
        bucket: bucket.to_string(),
        endpoint,
        region,
        path_style_access: boolean("remote.log.storage.s3.path.style.access", false)?,
    })))
}

fn bad(key: &str, value: &str, reason: &str, origin: &Origin) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
        origin: origin.clone(),
    }
}

fn parse_num(
    key: &str,
    value: &str,
    min: i64,
    max: i64,
    origin: &Origin,
) -> Result<i64, ConfigError> {
    let n: i64 = value
        .parse()
        .map_err(|_| bad(key, value, "expected an integer", origin))?;
    if n < min || n > max {
        return Err(bad(
            key,
            value,
            &format!("must be between {min} and {max}"),
            origin,
        ));
    }
    Ok(n)
}

fn parse_bool(key: &str, value: &str, origin: &Origin) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(key, value, "expected true or false", origin)),
    }
}

fn parse_host_port(s: &str) -> Option<(String, u16)> {
    let idx = s.rfind(':')?;
    let host = s[..idx]
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = s[idx + 1..].parse().ok()?;
    Some((host, port))
}

/// Parses `NAME://host:port,...`; with `bind`, each host is resolved to the address to listen on.
fn parse_listeners(
    key: &str,
    value: &str,
    origin: &Origin,
    bind: bool,
) -> Result<Vec<Listener>, ConfigError> {
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, rest) = part.split_once("://").ok_or_else(|| {
            bad(
                key,
                value,
                &format!("`{part}` is not NAME://host:port"),
                origin,
            )
        })?;
        let (host, port) = parse_host_port(rest).ok_or_else(|| {
            bad(
                key,
                value,
                &format!("`{part}` has no valid host:port"),
                origin,
            )
        })?;
        if out.iter().any(|l: &Listener| l.name == name) {
            return Err(bad(
                key,
                value,
                &format!("listener {name} is named twice"),
                origin,
            ));
        }
        let bind = if bind {
            let addr = resolve(&host, port)
                .map_err(|reason| bad(key, value, &format!("`{part}`: {reason}"), origin))?;
            Some(addr)
        } else {
            None
        };
        out.push(Listener {
            name: name.to_string(),
            host,
            port,
            bind,
        });
    }
    if out.is_empty() {
        return Err(bad(key, value, "no listener given", origin));
    }
    Ok(out)
}

fn parse_voters(value: &str, origin: &Origin) -> Result<Vec<Voter>, ConfigError> {
    let key = "controller.quorum.voters";
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, rest) = part
            .split_once('@')
            .ok_or_else(|| bad(key, value, &format!("`{part}` is not id@host:port"), origin))?;
        let id: i32 = id
            .parse()
            .map_err(|_| bad(key, value, &format!("`{id}` is not a node id"), origin))?;
        let (host, port) = parse_host_port(rest).ok_or_else(|| {
            bad(
                key,
                value,
                &format!("`{part}` has no valid host:port"),
                origin,
            )
        })?;
        out.push(Voter { id, host, port });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String, Origin)> {
        pairs
            .iter()
            .enumerate()
            .map(|(i, (k, v))| {
                (
                    k.to_string(),
                    v.to_string(),
                    Origin::File {
                        path: "s.properties".into(),
                        line: i + 1,
                    },
                )
            })
            .collect()
    }

    const BASE: &[(&str, &str)] = &[
        ("node.id", "1"),
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
        ),
        ("log.dirs", "/tmp/x"),
    ];

    #[test]
    fn parses_kafka_style_file() {
        let cfg = BrokerConfig::from_entries(entries(BASE)).unwrap();
        assert_eq!(cfg.node_id, 1);
        assert_eq!(cfg.client_listener().unwrap().port, 9092);
        assert_eq!(cfg.log.min_insync_replicas, 1);
        assert!(cfg.auto_create_topics_enable);
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let mut e = entries(BASE);
        e.push((
            "log.segmnt.bytes".into(),
            "10".into(),
            Origin::File {
                path: "s.properties".into(),
                line: 7,
            },
        ));
        let err = BrokerConfig::from_entries(e).unwrap_err().to_string();
        assert!(
            err.contains("log.segmnt.bytes") && err.contains("s.properties:7"),
            "{err}"
        );
    }

    #[test]
    fn cluster_id_and_mirror_keys() {
        let cfg = BrokerConfig::from_entries(entries(BASE)).unwrap();
        assert_eq!(
            (cfg.cluster_id.as_str(), cfg.mirror_api_key_base),
            ("tidemark", 94)
        );
        let mut pairs = BASE.to_vec();
        pairs.push(("cluster.id", "my cluster"));
        let err = BrokerConfig::from_entries(entries(&pairs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cluster.id") && err.contains("`my cluster`"),
            "{err}"
        );
        let mut pairs = BASE.to_vec();
        pairs.push(("mirror.api.key.base", "1"));
        let err = BrokerConfig::from_entries(entries(&pairs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mirror.api.key.base") && err.contains("already a Kafka API"),
            "{err}"
        );
        let mut lc = LogConfig::default();
        lc.set_topic_key("mirror.support.unclean.leader.election", "true")
            .unwrap();
        assert!(lc.mirror_support_unclean_leader_election);
        assert!(lc
            .set_topic_key("mirror.support.unclean.leader.election", "yes")
            .is_err());
    }

    #[test]
    fn retention_keys_follow_kafka_precedence_and_topic_overrides() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = BASE.to_vec();
            pairs.extend_from_slice(extra);
            BrokerConfig::from_entries(entries(&pairs)).unwrap()
        };
        let cfg = with(&[]);
        assert_eq!(cfg.log.retention_ms, 168 * 3_600_000);
        assert_eq!(cfg.log.retention_bytes, -1);
        assert_eq!(cfg.retention_check_interval, Duration::from_secs(300));
        assert_eq!(
            with(&[("log.retention.hours", "2")]).log.retention_ms,
            7_200_000
        );
        assert_eq!(
            with(&[("log.retention.hours", "2"), ("log.retention.minutes", "3")])
                .log
                .retention_ms,
            180_000
        );
        let cfg = with(&[
            ("log.retention.minutes", "3"),
            ("log.retention.ms", "-1"),
            ("log.retention.bytes", "1000"),
            ("log.retention.check.interval.ms", "250"),
        ]);
        assert_eq!(cfg.log.retention_ms, -1);
        assert_eq!(cfg.log.retention_bytes, 1000);
        assert_eq!(cfg.retention_check_interval, Duration::from_millis(250));
        let mut topic = cfg.log.clone();
        topic.set_topic_key("retention.ms", "60000").unwrap();
        topic.set_topic_key("retention.bytes", "-1").unwrap();
        assert_eq!((topic.retention_ms, topic.retention_bytes), (60_000, -1));
        assert_eq!(topic.topic_value("retention.ms").as_deref(), Some("60000"));
        let err = topic.set_topic_key("retention.bytes", "-2").unwrap_err();
        assert!(err.to_string().contains("retention.bytes"), "{err}");
    }

    #[test]
    fn tiered_storage_keys_default_as_kafka_and_refuse_bad_values() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = BASE.to_vec();
            pairs.extend_from_slice(extra);
            BrokerConfig::from_entries(entries(&pairs)).unwrap()
        };
        let cfg = with(&[]);
        assert_eq!(cfg.tiered.store, None);
        assert_eq!(cfg.tiered.task_interval, Duration::from_secs(30));
        assert!(!cfg.tiered.follower_fetch_last_tiered_offset_enable);
        assert_eq!(
            (cfg.log.local_retention_ms, cfg.log.local_retention_bytes),
            (-2, -2)
        );
        let cfg = with(&[
            ("remote.log.storage.dir", "/srv/remote"),
            ("remote.log.manager.task.interval.ms", "200"),
            ("follower.fetch.last.tiered.offset.enable", "true"),
            ("log.local.retention.ms", "1000"),
        ]);
        assert_eq!(
            cfg.tiered.store,
            Some(RemoteStoreConfig::Dir(PathBuf::from("/srv/remote")))
        );
        assert_eq!(cfg.tiered.task_interval, Duration::from_millis(200));
        assert!(cfg.tiered.follower_fetch_last_tiered_offset_enable);
        let mut topic = cfg.log.clone();
        assert_eq!(topic.local_retention_ms, 1000);
        topic
            .set_topic_key("remote.storage.enable", "true")
            .unwrap();
        topic.set_topic_key("local.retention.bytes", "-2").unwrap();
        assert!(topic.remote_storage_enable);
        assert_eq!(
            topic.topic_value("local.retention.ms").as_deref(),
            Some("1000")
        );
        let err = topic.set_topic_key("local.retention.ms", "-3").unwrap_err();
        assert!(err.to_string().contains("local.retention.ms"), "{err}");
        let err = topic
            .set_topic_key("remote.storage.enable", "yes")
            .unwrap_err();
        assert!(err.to_string().contains("remote.storage.enable"), "{err}");
    }

    #[test]
    fn an_s3_remote_store_is_configured_by_its_keys_and_bad_ones_are_named() {
        let with = |extra: &[(&str, &str)]| {
            let mut pairs = BASE.to_vec();
            pairs.extend_from_slice(extra);
            BrokerConfig::from_entries(entries(&pairs))
        };
        let cfg = with(&[
            ("remote.log.storage.s3.bucket", "tiered-logs"),
            ("remote.log.storage.s3.endpoint", "http://127.0.0.1:9000/"),
            ("remote.log.storage.s3.path.style.access", "true"),
        ])
        .unwrap();
        assert_eq!(
            cfg.tiered.store,
            Some(RemoteStoreConfig::S3(S3Config {
                bucket: "tiered-logs".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: "us-east-1".into(),
                path_style_access: true,
            }))
        );
        let refused = |extra: &[(&str, &str)], key: &str| {
            let err = with(extra).unwrap_err().to_string();
            assert!(err.contains(key), "{extra:?}: {err}");
        };
        refused(
            &[
                ("remote.log.storage.dir", "/srv/remote"),
                ("remote.log.storage.s3.bucket", "b-1"),
            ],
            "remote.log.storage.s3.bucket",
        );
        refused(
            &[("remote.log.storage.s3.bucket", "Bad_Bucket")],
            "remote.log.storage.s3.bucket",
        );
        refused(
            &[
                ("remote.log.storage.s3.bucket", "b-1"),
                ("remote.log.storage.s3.endpoint", "127.0.0.1:9000"),
            ],
            "remote.log.storage.s3.endpoint",
        );
        refused(
            &[
                ("remote.log.storage.s3.bucket", "b-1"),
                ("remote.log.storage.s3.region", ""),
            ],
            "remote.log.storage.s3.region",
        );
        refused(
            &[
                ("remote.log.storage.s3.bucket", "b-1"),
                ("remote.log.storage.s3.path.style.access", "yes"),
            ],
            "remote.log.storage.s3.path.style.access",
        );
        refused(
            &[("remote.log.storage.s3.endpoint", "http://127.0.0.1:9000")],
            "remote.log.storage.s3.endpoint",
        );
    }

    #[test]
    fn roles_follow_kafkas_rules_for_dedicated_nodes() {
        let parse = |extra: &[(&'static str, &'static str)], listeners: &'static str| {
            let mut pairs = BASE.to_vec();
            pairs[1] = ("listeners", listeners);
            pairs.extend_from_slice(extra);
            BrokerConfig::from_entries(entries(&pairs))
                .map(|c| c.process_roles)
                .map_err(|e| e.to_string())
        };
        let both = "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093";
        let client = "PLAINTEXT://127.0.0.1:9092";
        let controller = "CONTROLLER://127.0.0.1:9093";
        let me = ("controller.quorum.voters", "1@127.0.0.1:9093");
        let others = ("controller.quorum.voters", "7@127.0.0.1:9093");
        assert_eq!(parse(&[], both), Ok(ProcessRoles::Combined));
        assert_eq!(
            parse(&[("process.roles", "controller, broker"), me], both),
            Ok(ProcessRoles::Combined)
        );
        assert_eq!(
            parse(&[("process.roles", "broker"), others], client),
            Ok(ProcessRoles::Broker)
        );
        assert_eq!(
            parse(&[("process.roles", "controller"), me], controller),
            Ok(ProcessRoles::Controller)
        );
        let refused = |extra: &[(&'static str, &'static str)], listeners, says: &str| {
            let err = parse(extra, listeners).unwrap_err();
            assert!(err.contains(says), "{err}");
            err
        };
        let err = refused(
            &[("process.roles", "broker,observer")],
            both,
            "unknown role `observer`",
        );
        assert!(err.contains("process.roles") && err.contains(":4"), "{err}");
        refused(
            &[("process.roles", "broker")],
            client,
            "needs controller.quorum.voters",
        );
        refused(
            &[("process.roles", "broker"), me],
            client,
            "must have the controller role",
        );
        refused(
            &[("process.roles", "controller"), others],
            controller,
            "does not name node 1",
        );
        refused(
            &[("process.roles", "broker"), others],
            controller,
            "a listener for clients",
        );
        refused(&[("process.roles", ",")], both, "names no role");
        refused(&[others], both, "does not name node 1");
        // A voter needs a controller listener for its quorum; a standalone or broker-only node
        // does not.
        refused(&[me], client, "no listener named CONTROLLER");
        refused(
            &[("process.roles", "controller"), me],
            client,
            "no listener named CONTROLLER",
        );
        assert!(parse(&[], client).is_ok());
    }

    #[test]
    fn bad_value_names_key_value_and_line() {
        let mut pairs = BASE.to_vec();
        pairs.push(("min.insync.replicas", "two"));
        let err = BrokerConfig::from_entries(entries(&pairs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("min.insync.replicas") && err.contains("`two`") && err.contains(":4"),
            "{err}"
        );
        let mut pairs = BASE.to_vec();
        pairs.push(("auto.create.topics.enable", "yes"));
        let err = BrokerConfig::from_entries(entries(&pairs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("auto.create.topics.enable") && err.contains("true or false"),
            "{err}"
        );
    }

    #[test]
    fn bad_listener_and_voters_rejected() {
        let mut pairs = BASE.to_vec();
        pairs[1] = ("listeners", "127.0.0.1:9092");
        assert!(BrokerConfig::from_entries(entries(&pairs)).is_err());
        let mut pairs = BASE.to_vec();
        pairs.push(("controller.quorum.voters", "1@127.0.0.1"));
        let err = BrokerConfig::from_entries(entries(&pairs))
            .unwrap_err()
            .to_string();
        assert!(err.contains("controller.quorum.voters"), "{err}");
    }

    #[test]
    fn listener_host_names_resolve_and_unresolvable_ones_name_key_value_and_line() {
        let mut pairs = BASE.to_vec();
        pairs[1] = ("listeners", "PLAINTEXT://localhost:9092,CONTROLLER://:9093");
        let cfg = BrokerConfig::from_entries(entries(&pairs)).unwrap();
        let client = cfg.client_listener().unwrap();
        assert_eq!(client.host, "localhost");
        assert!(client.socket_addr().unwrap().ip().is_loopback());
        assert!(cfg.listeners[1]
            .socket_addr()
            .unwrap()
            .ip()
            .is_unspecified());
        // A NUL byte cannot be in a host name: refused without any lookup leaving the machine.
        pairs[1] = ("listeners", "PLAINTEXT://bad\0host:9092");
        let err = BrokerConfig::from_entries(entries(&pairs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s.properties:2") && err.contains("`listeners`") && err.contains("bad"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_key_in_the_file_names_both_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.properties");
        std::fs::write(
            &p,
            "node.id=3\nlisteners=PLAINTEXT://127.0.0.1:1\nlog.dirs=/x\n# c\nnode.id=4\n",
        )
        .unwrap();
        let err = BrokerConfig::load(&p, &[]).unwrap_err().to_string();
        assert!(
            err.contains("server.properties:5")
                && err.contains("`node.id`")
                && err.contains("first set on line 1"),
            "{err}"
        );
        // An override may still replace a key of the file.
        std::fs::write(
            &p,
            "node.id=3\nlisteners=PLAINTEXT://127.0.0.1:1\nlog.dirs=/x\n",
        )
        .unwrap();
        assert_eq!(
            BrokerConfig::load(&p, &["node.id=5".into()])
                .unwrap()
                .node_id,
            5
        );
    }

    #[test]
    fn missing_required_key() {
        let err = BrokerConfig::from_entries(entries(&BASE[..2]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("log.dirs"), "{err}");
    }

    #[test]
    fn topic_keys_override() {
        let mut lc = LogConfig::default();
        lc.set_topic_key("min.insync.replicas", "2").unwrap();
        assert_eq!(lc.min_insync_replicas, 2);
        assert!(lc.set_topic_key("min.insync.replicas", "0").is_err());
        assert!(lc.set_topic_key("no.such", "1").is_err());
        assert_eq!(
            lc.topic_value("flush.messages").unwrap(),
            i64::MAX.to_string()
        );
    }

    #[test]
    fn override_file_loading() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.properties");
        std::fs::write(
            &p,
            "# c\nnode.id=3\nlisteners=PLAINTEXT://127.0.0.1:1\nlog.dirs=/x\nbogus line\n",
        )
        .unwrap();
        let err = BrokerConfig::load(&p, &[]).unwrap_err().to_string();
        assert!(err.contains(":5"), "{err}");
        std::fs::write(
            &p,
            "node.id=3\nlisteners=PLAINTEXT://127.0.0.1:1\nlog.dirs=/x\n",
        )
        .unwrap();
        let cfg = BrokerConfig::load(&p, &["node.id=4".into()]).unwrap();
        assert_eq!(cfg.node_id, 4);
    }
}
