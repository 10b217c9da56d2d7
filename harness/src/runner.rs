//! Drives a [`Test`] from nothing to a verdict: the phase script. Each phase's ops run through
//! the [`interpreter`](crate::interpreter); waiting for the database is [`probe`](crate::probe)'s,
//! and the evidence from the nodes is [`collect`](crate::collect)'s.
//!
//! A run: create each cluster's nodes -> write test.json and the history header -> deploy and
//! start the broker -> wait until every node serves -> workload setup -> main phase (clients and
//! nemesis under the time limit) -> heal everything, start what is down, wait for replicas to
//! converge -> final reads with fresh clients -> stop brokers cleanly, dump every replica -> check
//! (before teardown can fail) -> snarf node logs -> teardown. Teardown also runs after errors, on
//! cancellation (Ctrl-C) and, through the runtime's `Drop`, on panic.
//!
//! A test has one or more clusters, each its own quorum on its own nodes, all reached through
//! one runtime; a cluster with dedicated controllers has them beside its brokers, reached by the
//! network and the healing but not by clients, replicas or target specs. Serving, convergence and healing are per cluster; the workload's clients talk to
//! the first unless an op names another (`"cluster": "b"`); a fault acts on the cluster its op
//! names, else on the first. After healing, the nemesis's settle ops (a mirror settled in a
//! steady direction) run before replicas are awaited.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context as _;
use futures::future::BoxFuture;
use serde_json::Value;
pub use tokio_util::sync::CancellationToken;

use crate::checker::{check_run, write_results, Results};
use crate::client::{Client, ClientContext};
use crate::collect::{dump_replicas, snarf_logs};
use crate::db::{Db, Unconverged};
use crate::generator::{self, Generator};
use crate::history::HistoryWriter;
use crate::interpreter::{fault_cluster, Interpreter, OpClusters, OpenClient, PerformFault};
use crate::nemesis::{heal as engine_heal, heal_ops, Nemesis, NemesisContext};
use crate::net::Net;
use crate::op::{Completion, Invocation, Outcome};
use crate::probe::{await_convergence, await_serving};
use crate::progress::Progress;
use crate::runtime::{Node, NodeRole};
use crate::store::RunDir;
use crate::test::Test;
use crate::workload::{SetupContext, Workload};

/// How a run ended.
#[derive(Debug)]
pub enum RunOutcome {
    /// The run finished and was checked.
    Checked(Box<Results>),
    /// Ctrl-C or SIGTERM stopped the run; the history so far is on disk.
    Interrupted,
    /// The harness itself failed.
    Failed(anyhow::Error),
}

/// What a run produced.
#[derive(Debug)]
pub struct RunReport {
    /// The run directory, once it was created.
    pub run_dir: Option<PathBuf>,
    /// How it ended.
    pub outcome: RunOutcome,
}

impl RunReport {
    /// The exit code, Jepsen style: 0 valid, 1 invalid, 2 unknown, 255 the harness failed or
    /// was interrupted.
    pub fn exit_code(&self) -> u8 {
        match &self.outcome {
            RunOutcome::Checked(r) => r.valid.exit_code(),
            RunOutcome::Interrupted | RunOutcome::Failed(_) => 255,
        }
    }
}

/// Runs `test` to its end and tears everything down, whatever happens.
pub async fn run(mut test: Test, cancel: CancellationToken, progress: &mut Progress) -> RunReport {
    let mut run_dir = None;
    let mut nodes = None;
    let result = run_phases(&mut test, &cancel, progress, &mut run_dir, &mut nodes).await;
    // Node logs are evidence whatever happened, so they are collected before every teardown.
    if let (Some(dir), Some(nodes)) = (&run_dir, &nodes) {
        progress.phase("collecting node logs");
        snarf_logs(nodes, test.db.as_ref(), dir);
    }
    progress.phase("teardown");
    let teardown = tokio::task::block_in_place(|| test.runtime.destroy());
    progress.finish();
    let outcome = match (result, teardown) {
        (Ok(Some(results)), Ok(())) => RunOutcome::Checked(Box::new(results)),
        (Ok(None), Ok(())) => RunOutcome::Interrupted,
        (Err(e), _) => RunOutcome::Failed(e),
        (Ok(_), Err(e)) => RunOutcome::Failed(e.context("teardown")),
    };
    RunReport {
        run_dir: run_dir.map(|d: RunDir| d.path().to_path_buf()),
        outcome,
    }
}

/// Everything up to the verdict; `None` when cancelled.
async fn run_phases(
    test: &mut Test,
    cancel: &CancellationToken,
    progress: &mut Progress,
    run_dir_out: &mut Option<RunDir>,
    nodes_out: &mut Option<Arc<Vec<Node>>>,
) -> anyhow::Result<Option<Results>> {
    let opts = test.options.clone();
    progress.phase(&format!(
        "creating {} cluster(s) of {} nodes ({} runtime)",
        opts.clusters.len(),
        opts.nodes,
        opts.runtime
    ));
    let mut made: Vec<Node> = Vec::new();
    for cluster in &opts.clusters {
        let mut names = opts.node_names(cluster);
        let controllers = opts.controller_names(cluster);
        names.extend(controllers.iter().cloned());
        let created = tokio::task::block_in_place(|| test.runtime.create(cluster, &names));
        // What was made so far is evidence too, whether or not the next cluster can be made.
        made.extend(created?.into_iter().map(|mut n| {
            if !controllers.is_empty() {
                n.role = if controllers.contains(&n.name) {
                    NodeRole::Controller
                } else {
                    NodeRole::Broker
                };
            }
            n
        }));
        *nodes_out = Some(Arc::new(made.clone()));
    }
    let nodes: Arc<Vec<Node>> = Arc::new(made);

    let run_dir = RunDir::create(&opts.store, &opts.name, SystemTime::now())?;
    *run_dir_out = Some(run_dir.clone());
    let description = test.describe(&nodes);
    run_dir.write_test(&description)?;
    let history = HistoryWriter::create(&run_dir.history(), &description)?;
    progress.phase(&format!("run directory {}", run_dir.path().display()));

    let home = opts.workload_cluster().to_owned();
    let select = |keep: &dyn Fn(&Node) -> bool| -> Vec<Node> {
        nodes.iter().filter(|n| keep(n)).cloned().collect()
    };
    // Clients, replicas and target specs see the brokers; dedicated controllers only vote.
    let members = |name: &str| select(&|n| n.cluster == name && n.role.is_broker());
    let controllers = |name: &str| select(&|n| n.cluster == name && !n.role.is_broker());
    let brokers: Arc<Vec<Node>> = Arc::new(select(&|n| n.role.is_broker()));
    // The workload's cluster first, as `SetupContext` and `Workload::open` promise.
    let mut clients: Vec<ClientContext> = opts
        .clusters
        .iter()
        .map(|name| {
            ClientContext::new(
                &members(name),
                |n| test.db.endpoint(n),
                test.runtime.dialer(),
                opts.op_timeout,
            )
        })
        .collect();
    clients.sort_by_key(|c| c.cluster != home);
    if clients
        .first()
        .is_none_or(|c| c.cluster != home || c.nodes.is_empty())
    {
        anyhow::bail!("the workload's cluster has no nodes");
    }
    let clients: Arc<[ClientContext]> = clients.into();
    let clusters: Vec<Parts> = opts
        .clusters
        .iter()
        .map(|name| Parts {
            client: clients
                .iter()
                .find(|c| &c.cluster == name)
                .cloned()
                .expect("a context per cluster"),
            all: clients.clone(),
            nodes: Arc::new(members(name)),
            controllers: Arc::new(controllers(name)),
            every_node: brokers.clone(),
            db: test.db.clone(),
            net: test.net.clone(),
        })
        .collect();

    progress.phase("deploying tidemark-broker");
    let db = test.db.clone();
    // Each node's quorum is its own cluster's nodes.
    on_nodes(&nodes, |n| {
        db.setup(n, &select(&|m| m.cluster == n.cluster))
    })?;
    for c in &clusters {
        await_serving(
            &c.client,
            &c.nodes,
            test.db.as_ref(),
            opts.ready_timeout,
            cancel,
        )
        .await?;
    }

    let workload = test.workload.clone();
    let setup = SetupContext {
        clusters: &clients,
        db: test.db.as_ref(),
    };
    tokio::time::timeout(opts.ready_timeout, workload.setup(setup))
        .await
        .context("workload setup timed out")??;

    let mut interp = Interpreter::new(
        opts.concurrency,
        opts.seed,
        history,
        Arc::new(WorkloadClients {
            workload: workload.clone(),
            clusters: clients.clone(),
        }),
        test.nemesis.clone().map(|nemesis| {
            Arc::new(NemesisWorker {
                nemesis,
                clusters: clusters.clone(),
                home: home.clone(),
            }) as Arc<dyn PerformFault>
        }),
        opts.op_timeout,
    )
    .with_clusters(OpClusters {
        clients: Some(home.clone()),
        nemesis: Some(home.clone()),
    });

    progress.phase(&format!("main phase, {} s", opts.time_limit.as_secs()));
    let limit = opts.time_limit.as_nanos() as u64;
    let clients = generator::time_limit(limit, workload.generator());
    let mut main: Vec<Box<dyn Generator>> = vec![if opts.rate > 0.0 {
        Box::new(generator::Clients(generator::stagger(
            (1e9 / opts.rate) as u64,
            clients,
        )))
    } else {
        Box::new(generator::Clients(clients))
    }];
    if let Some(nemesis) = &test.nemesis {
        main.push(Box::new(generator::NemesisOnly(generator::time_limit(
            limit,
            generator::own_rng(generator::nemesis_rng(opts.seed), nemesis.generator()),
        ))));
    }
    let mut main = generator::any(main);
    if !interp.run(&mut main, cancel, progress, true).await? {
        return Ok(None);
    }

    progress.phase("healing, restarting stopped nodes");
    heal(&mut interp, test.nemesis.as_deref(), &clusters)?;
    for c in &clusters {
        await_serving(
            &c.client,
            &c.nodes,
            test.db.as_ref(),
            opts.ready_timeout,
            cancel,
        )
        .await?;
    }
    if let Some(nemesis) = test.nemesis.as_deref() {
        settle(&mut interp, nemesis, &clusters, &home)?;
    }
    progress.phase("waiting for replicas to converge");
    for c in &clusters {
        let op = Invocation {
            f: "converge".into(),
            value: serde_json::json!({ "timeout_s": opts.converge_timeout.as_secs_f64() }),
        };
        let mut held_out = None;
        interp.perform_now(&op, &c.client.cluster, |op| {
            let waiting = await_convergence(
                &c.client,
                &c.nodes,
                test.db.as_ref(),
                opts.converge_timeout,
                cancel,
            );
            let answer =
                tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(waiting));
            converge_completion(op, answer, &mut held_out)
        })?;
        if let Some(n) = held_out {
            progress.phase(&format!(
                "replicas of cluster {} did not converge in time ({n} caught up and left out of the ISR); reading anyway",
                c.client.cluster
            ));
        }
    }
    if cancel.is_cancelled() {
        return Ok(None);
    }

    progress.phase("final reads with fresh clients");
    interp.fresh_processes();
    let mut fin = generator::Clients(generator::time_limit(
        opts.final_timeout.as_nanos() as u64,
        workload.final_generator(),
    ));
    if !interp.run(&mut fin, cancel, progress, false).await? {
        return Ok(None);
    }
    interp.history().flush()?;
    drop(interp);

    progress.phase("stopping brokers, dumping replicas");
    let db = test.db.clone();
    // Brokers first: a clean stop hands leadership over through the controllers.
    on_nodes(&brokers, |n| db.stop(n))?;
    let voters = select(&|n| !n.role.is_broker());
    on_nodes(&voters, |n| db.stop(n))?;
    let replicas = dump_replicas(&brokers, test.db.as_ref());
    run_dir.write_replicas(&replicas)?;

    progress.phase("checking");
    // The run is judged from what it left on disk, exactly as `tidemark check` would judge it.
    let results = check_run(run_dir.path()).map_err(|e| anyhow::anyhow!("checking: {e}"))?;
    write_results(&run_dir.results(), &results)?;
    Ok(Some(results))
}

/// The `converge` op's completion: the invocation's value plus `converged`, and when not, what
/// was not (`reasons`, `leaderless`, `out_of_isr`, `stuck_high_watermarks`); `held_out` gets
/// how many replicas were caught up and left out of the ISR.
fn converge_completion(
    op: &Invocation,
    answer: Result<(), Unconverged>,
    held_out: &mut Option<usize>,
) -> Completion {
    let mut value = op.value.clone();
    value["converged"] = Value::Bool(answer.is_ok());
    if let Err(not) = answer {
        *held_out = Some(not.out_of_isr.len());
        value["reasons"] = serde_json::json!(not.reasons);
        value["leaderless"] = serde_json::json!(not.leaderless);
        value["out_of_isr"] = serde_json::json!(not.out_of_isr);
        value["stuck_high_watermarks"] = serde_json::json!(not.stuck_high_watermarks);
    }
    Completion::new(Outcome::Info, value)
}

/// Runs `f` on every node in parallel threads; returns the first error.
fn on_nodes<F>(nodes: &[Node], f: F) -> anyhow::Result<()>
where
    F: Fn(&Node) -> anyhow::Result<()> + Sync,
{
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let handles: Vec<_> = nodes
                .iter()
                .map(|n| {
                    let f = &f;
                    s.spawn(move || f(n).with_context(|| n.name.clone()))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
                })
                .collect::<anyhow::Result<Vec<()>>>()
                .map(drop)
        })
    })
}

/// One cluster's nodes, its database and network, and its clients' context (and every
/// cluster's, for faults between clusters).
#[derive(Clone)]
struct Parts {
    nodes: Arc<Vec<Node>>,
    controllers: Arc<Vec<Node>>,
    every_node: Arc<Vec<Node>>,
    db: Arc<dyn Db>,
    net: Arc<dyn Net>,
    client: ClientContext,
    all: Arc<[ClientContext]>,
}

impl Parts {
    fn context(&self) -> NemesisContext<'_> {
        NemesisContext {
            nodes: &self.nodes,
            controllers: &self.controllers,
            every_node: &self.every_node,
            db: self.db.as_ref(),
            net: self.net.as_ref(),
            client: &self.client,
            clusters: &self.all,
        }
    }
}

/// Opens the workload's clients, client worker `i` bound to node `i mod nodes` of the
/// workload's cluster (the first of `clusters`).
struct WorkloadClients {
    workload: Arc<dyn Workload>,
    clusters: Arc<[ClientContext]>,
}

impl OpenClient for WorkloadClients {
    fn open(&self, worker: usize) -> Box<dyn Client> {
        self.workload
            .open(&self.clusters, worker % self.clusters[0].nodes.len())
    }
}

/// The test's nemesis, on a blocking thread of the runtime as its contract allows, acting on
/// the cluster each op names, else on `home`.
struct NemesisWorker {
    nemesis: Arc<dyn Nemesis>,
    clusters: Vec<Parts>,
    home: String,
}

impl PerformFault for NemesisWorker {
    fn perform(&self, op: Invocation) -> BoxFuture<'static, Completion> {
        let nemesis = self.nemesis.clone();
        let cluster = fault_cluster(&op, Some(&self.home)).unwrap_or_default();
        let parts = self
            .clusters
            .iter()
            .find(|c| c.client.cluster == cluster)
            .cloned();
        let names: Vec<String> = self
            .clusters
            .iter()
            .map(|c| c.client.cluster.clone())
            .collect();
        Box::pin(async move {
            let Some(parts) = parts else {
                let mut c = Completion::new(Outcome::Info, op.value.clone());
                c.error = Some(format!(
                    "field `cluster`: no cluster {cluster:?}; clusters: {}",
                    names.join(", ")
                ));
                return c;
            };
            tokio::task::spawn_blocking(move || nemesis.invoke(&parts.context(), &op))
                .await
                .unwrap_or_else(|e| {
                    let mut c = Completion::new(Outcome::Info, Value::Null);
                    c.error = Some(format!("nemesis panicked: {e}"));
                    c
                })
        })
    }
}

/// Performs the nemesis's settle ops, each on the cluster it names (else `home`), recorded as
/// nemesis invokes and infos.
fn settle(
    interp: &mut Interpreter<HistoryWriter>,
    nemesis: &dyn Nemesis,
    clusters: &[Parts],
    home: &str,
) -> anyhow::Result<()> {
    for op in nemesis.settle_ops() {
        let cluster = fault_cluster(&op, Some(home)).unwrap_or_default();
        let parts = clusters
            .iter()
            .find(|c| c.client.cluster == cluster)
            .with_context(|| format!("settle op {} names no cluster of the test", op.f))?;
        let cx = parts.context();
        interp.perform_now(&op, &cluster, |op| {
            tokio::task::block_in_place(|| nemesis.invoke(&cx, op))
        })?;
    }
    interp.history().flush()
}

/// Heals every fault of every cluster, recording each step as a nemesis invoke and info with
/// the cluster: the nemesis undoes its own faults first (clocks, packet loss), then the engine
/// heals what every database shares.
fn heal(
    interp: &mut Interpreter<HistoryWriter>,
    nemesis: Option<&dyn Nemesis>,
    clusters: &[Parts],
) -> anyhow::Result<()> {
    for parts in clusters {
        let cx = parts.context();
        let steps: Vec<(bool, Invocation)> = nemesis
            .iter()
            .flat_map(|n| n.heal_ops())
            .map(|op| (true, op))
            .chain(heal_ops(&cx).into_iter().map(|op| (false, op)))
            .collect();
        for (by_nemesis, op) in steps {
            interp.perform_now(&op, &parts.client.cluster, |op| {
                tokio::task::block_in_place(|| match (nemesis, by_nemesis) {
                    (Some(n), true) => n.invoke(&cx, op),
                    _ => engine_heal(&cx, op),
                })
            })?;
        }
    }
    interp.history().flush()
}
