//! The `tidemark-broker` executable: `tidemark-broker server.properties [--override k=v]...` runs
//! a broker; `tidemark-broker dump-log` prints replica states for the harness.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tidemark_broker::broker::Broker;
use tidemark_broker::config::{BrokerConfig, ProcessRoles, RemoteStoreConfig};
use tidemark_broker::controller::local::LocalQuorum;
use tidemark_broker::controller::raft::{QuorumConfig, RaftObserver, RaftQuorum};
use tidemark_broker::controller::MetadataQuorum;
use tidemark_broker::dump::{dump, DumpOptions};
use tidemark_broker::faults::{Bug, Faults};
use tidemark_broker::log_dir::LogDirLock;
use tidemark_broker::mirror::wire::MirrorRequest;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

#[derive(Parser)]
#[command(
    name = "tidemark-broker",
    version,
    about = "A Kafka-wire-compatible broker, the system under test of tidemark",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    /// The broker's server.properties (Kafka's key names).
    #[arg(required = true)]
    config: Option<PathBuf>,
    /// Override one setting of the file, as `key=value`; may be repeated.
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Turn on a known-bad behaviour to prove the harness catches it; may be repeated.
    #[arg(long = "inject-bug", value_name = "NAME")]
    inject_bug: Vec<Bug>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Admin operations over the Kafka protocol.
    Admin {
        #[command(subcommand)]
        op: AdminOp,
    },
    /// Print every partition replica in a data dir as one JSON line (replicas.jsonl shape).
    DumpLog {
        /// The broker's log.dirs directory.
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long)]
        topic: Option<String>,
        #[arg(long)]
        partition: Option<i32>,
        /// Add `"node": NAME` to every line.
        #[arg(long)]
        node: Option<String>,
        /// Add `"cluster": NAME` to every line.
        #[arg(long)]
        cluster: Option<String>,
        /// The remote store (`remote.log.storage.dir`): add each replica's tiered side (both
        /// log starts, the remote segments).
        #[arg(long, conflicts_with = "remote_config")]
        remote_dir: Option<PathBuf>,
        /// A broker's configuration file: add each replica's tiered side from the remote store
        /// it names (a directory, or an S3 bucket with credentials from `AWS_*`).
        #[arg(long, value_name = "FILE")]
        remote_config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AdminOp {
    /// Elect a leader for one partition (Kafka's ElectLeaders, KIP-460); prints JSON.
    ElectLeaders {
        #[arg(long)]
        bootstrap_server: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
        /// UNCLEAN election (any live replica may lead, losing what it lacks); default PREFERRED.
        #[arg(long)]
        unclean: bool,
    },
    /// Print leader, leader epoch, replicas and ISR of every partition as JSON.
    Describe {
        #[arg(long)]
        bootstrap_server: String,
        #[arg(long)]
        topic: Option<String>,
    },
    /// The metadata quorum: active controller, epoch, voters and observers (DescribeQuorum).
    DescribeQuorum {
        #[arg(long)]
        bootstrap_server: String,
    },
    /// Cluster mirroring (KIP-1279), like `kafka-cluster-mirrors.sh`; sent to the destination.
    Mirror {
        #[command(subcommand)]
        op: MirrorOp,
        /// The destination cluster.
        #[arg(long, global = true)]
        bootstrap_server: Option<String>,
        /// API key of CreateClusterMirror on the cluster (its `mirror.api.key.base`).
        #[arg(long, global = true, default_value_t = 94)]
        api_key_base: i16,
    },
}

#[derive(Subcommand)]
enum MirrorOp {
    /// Create a mirror of the cluster at --source-bootstrap.
    Create {
        #[arg(long)]
        mirror: String,
        #[arg(long)]
        source_bootstrap: String,
        /// A mirror config as KEY=VALUE (`mirror.groups.include`, `mirror.groups.exclude`);
        /// repeatable.
        #[arg(long = "config", value_parser = parse_config)]
        configs: Vec<(String, String)>,
    },
    /// Start mirroring topics (creating them with the source's topic ids, or failing back).
    Start {
        #[arg(long)]
        mirror: String,
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
    },
    /// Fail over: persist the LMLE, bump the epochs; returns once the topics are writable.
    Stop {
        #[arg(long)]
        mirror: String,
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
    },
    Pause {
        #[arg(long)]
        mirror: String,
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
    },
    Resume {
        #[arg(long)]
        mirror: String,
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
    },
    /// Each partition's state, source and destination offsets, lag, LMLE and last error.
    Describe {
        #[arg(long)]
        mirror: Option<String>,
    },
    List,
    /// Retry FAILED partitions that stopped retrying (retries exhausted).
    Recover {
        #[arg(long)]
        mirror: String,
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
    },
    /// Delete a mirror whose topics are all stopped.
    Delete {
        #[arg(long)]
        mirror: String,
    },
}

impl MirrorOp {
    fn request(self) -> MirrorRequest {
        match self {
            MirrorOp::Create {
                mirror,
                source_bootstrap,
                configs,
            } => MirrorRequest::Create {
                mirror,
                source_bootstrap,
                configs: configs.into_iter().collect(),
            },
            MirrorOp::Start { mirror, topics } => MirrorRequest::Start { mirror, topics },
            MirrorOp::Stop { mirror, topics } => MirrorRequest::Stop { mirror, topics },
            MirrorOp::Pause { mirror, topics } => MirrorRequest::Pause { mirror, topics },
            MirrorOp::Resume { mirror, topics } => MirrorRequest::Resume { mirror, topics },
            MirrorOp::Describe { mirror } => MirrorRequest::Describe {
                mirror,
                lookup: None,
            },
            MirrorOp::List => MirrorRequest::List,
            MirrorOp::Delete { mirror } => MirrorRequest::Delete { mirror },
            MirrorOp::Recover { mirror, topics } => MirrorRequest::Recover { mirror, topics },
        }
    }
}

fn parse_config(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

fn admin(op: AdminOp) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(async {
        match op {
            AdminOp::ElectLeaders {
                bootstrap_server,
                topic,
                partition,
                unclean,
            } => {
                tidemark_broker::admin::elect_leaders(&bootstrap_server, &topic, partition, unclean)
                    .await
            }
            AdminOp::Describe {
                bootstrap_server,
                topic,
            } => tidemark_broker::admin::describe(&bootstrap_server, topic.as_deref())
                .await
                .map(|v| (v, true)),
            AdminOp::DescribeQuorum { bootstrap_server } => {
                tidemark_broker::admin::describe_quorum(&bootstrap_server).await
            }
            AdminOp::Mirror {
                op,
                bootstrap_server,
                api_key_base,
            } => match bootstrap_server {
                Some(b) => tidemark_broker::admin::mirror(&b, api_key_base, op.request()).await,
                None => Err(anyhow::anyhow!("--bootstrap-server is required")),
            },
        }
    });
    match result {
        Ok((v, ok)) => {
            println!("{v}");
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("admin: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Admin { op }) => admin(op),
        Some(Command::DumpLog {
            data_dir,
            topic,
            partition,
            node,
            cluster,
            remote_dir,
            remote_config,
        }) => {
            let remote = match (remote_dir, remote_config) {
                (Some(dir), _) => Some(RemoteStoreConfig::Dir(dir)),
                (None, Some(path)) => match BrokerConfig::load(&path, &[]) {
                    Ok(config) => match config.tiered.store {
                        Some(store) => Some(store),
                        None => {
                            eprintln!(
                                "dump-log: {} names no remote store (remote.log.storage.dir or remote.log.storage.s3.bucket)",
                                path.display()
                            );
                            return ExitCode::FAILURE;
                        }
                    },
                    Err(e) => {
                        eprintln!("dump-log: {e}");
                        return ExitCode::FAILURE;
                    }
                },
                (None, None) => None,
            };
            let opts = DumpOptions {
                data_dir,
                topic,
                partition,
                node,
                cluster,
                remote,
            };
            let stdout = std::io::stdout();
            match dump(&opts, &mut stdout.lock()) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("dump-log: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            let path = cli
                .config
                .expect("clap requires the config without a subcommand");
            let config = match BrokerConfig::load(&path, &cli.overrides) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("tidemark-broker: configuration error: {e}");
                    return ExitCode::from(2);
                }
            };
            tidemark_broker::logging::init(config.node_id);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            match runtime.block_on(run(config, Faults::new(cli.inject_bug))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!("broker failed: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run(config: BrokerConfig, faults: Faults) -> anyhow::Result<()> {
    for bug in faults.names() {
        warn!("!!! INJECTED BUG ENABLED: {bug} — this broker is deliberately unsafe !!!");
    }
    // Held until the process ends: no other broker may use this log directory meanwhile.
    let _log_dir_lock = LogDirLock::acquire(&config.log_dir)?;
    match config.process_roles {
        ProcessRoles::Controller => run_controller(config).await,
        ProcessRoles::Broker => {
            let observer = RaftObserver::start(&config.controller_quorum_voters)?;
            let result = run_broker(config, faults, observer.clone()).await;
            observer.shutdown().await;
            result
        }
        ProcessRoles::Combined => {
            // With voters configured the metadata lives in the raft quorum; a standalone node
            // keeps it in a local file.
            if config.controller_quorum_voters.is_empty() {
                let local = LocalQuorum::open(&config.log_dir)?;
                run_broker(config, faults, local).await
            } else {
                let raft = RaftQuorum::start(QuorumConfig::from_broker_config(&config)?).await?;
                let result = run_broker(config, faults, raft.clone()).await;
                raft.shutdown().await;
                result
            }
        }
    }
}

/// A controller-only node: a voter of the quorum running the active controller's duties (fencing
/// silent brokers, moving leadership back to preferred replicas) whenever it is the active one.
async fn run_controller(config: BrokerConfig) -> anyhow::Result<()> {
    let raft = RaftQuorum::start(QuorumConfig::from_broker_config(&config)?).await?;
    info!(node_id = config.node_id, log_dir = %config.log_dir.display(), "controller started");
    let shutdown = CancellationToken::new();
    let mut duties = vec![tokio::spawn(
        tidemark_broker::controller::fencing::fence_silent_brokers(
            raft.clone(),
            config.session_timeout,
            shutdown.clone(),
        ),
    )];
    if config.auto_leader_rebalance_enable {
        duties.push(tokio::spawn(tidemark_broker::controller::rebalance::run(
            raft.clone(),
            config.leader_imbalance_check_interval,
            shutdown.clone(),
        )));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT: shutting down"),
    }
    shutdown.cancel();
    for d in duties {
        let _ = d.await;
    }
    raft.shutdown().await;
    info!("clean shutdown complete");
    Ok(())
}

/// A node with the broker role, on whichever quorum its roles give it.
async fn run_broker(
    config: BrokerConfig,
    faults: Faults,
    quorum: Arc<dyn MetadataQuorum>,
) -> anyhow::Result<()> {
    let broker = Broker::open(config, faults, quorum)?;
    info!(node_id = broker.config.node_id, log_dir = %broker.log_dir().display(), "broker started");
    let shutdown = CancellationToken::new();
    let duties = broker.start(shutdown.clone());
    let checkpointer = tokio::spawn(checkpoint_loop(broker.clone(), shutdown.clone()));
    let retention = tokio::spawn(retention_loop(broker.clone(), shutdown.clone()));
    let tiered = tokio::spawn(tiered_loop(broker.clone(), shutdown.clone()));
    let rebalance = broker.config.auto_leader_rebalance_enable.then(|| {
        tokio::spawn(tidemark_broker::controller::rebalance::run(
            broker.quorum().clone(),
            broker.config.leader_imbalance_check_interval,
            shutdown.clone(),
        ))
    });
    let mut listener = tokio::spawn(tidemark_broker::protocol::run_listener(
        broker.clone(),
        shutdown.clone(),
    ));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let signalled = tokio::select! {
        _ = term.recv() => { info!("SIGTERM: shutting down"); true }
        _ = tokio::signal::ctrl_c() => { info!("SIGINT: shutting down"); true }
        r = &mut listener => {
            shutdown.cancel();
            r??;
            false
        }
    };
    if signalled {
        // Still serving meanwhile: clients are told NOT_LEADER_OR_FOLLOWER and move on.
        tidemark_broker::shutdown::controlled_shutdown(&broker).await;
    }
    shutdown.cancel();
    if signalled {
        // The connections send the answers they already have before they close.
        let _ = listener.await;
    }
    let _ = checkpointer.await;
    let _ = retention.await;
    let _ = tiered.await;
    if let Some(r) = rebalance {
        let _ = r.await;
    }
    for d in duties {
        let _ = d.await;
    }
    broker.shutdown()?;
    info!("clean shutdown complete");
    Ok(())
}

async fn checkpoint_loop(broker: Arc<Broker>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => broker.checkpoint_high_watermarks(),
        }
    }
}

/// Runs the remote log manager's round each `remote.log.manager.task.interval.ms` (off the
/// async workers: it copies files).
async fn tiered_loop(broker: Arc<Broker>, shutdown: CancellationToken) {
    if broker.tiered.is_none() {
        return;
    }
    let mut tick = tokio::time::interval(broker.config.tiered.task_interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                let b = broker.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || b.run_tiered_tasks()).await {
                    warn!("remote log manager round failed: {e}");
                }
            }
        }
    }
}

/// Applies retention to every replica each `log.retention.check.interval.ms`.
async fn retention_loop(broker: Arc<Broker>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(broker.config.retention_check_interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => broker.enforce_retention(),
        }
    }
}
