//! Drives a [`Test`] from nothing to a verdict. The runner owns the clock and the seed: it asks
//! the generator for ops, hands them to client and nemesis workers, records every invocation and
//! completion as it happens, and gives a worker whose op ended `info` a fresh process.
//!
//! A run: create nodes -> write test.json and the history header -> deploy and start the
//! broker -> wait until every node serves -> workload setup -> main phase (clients and nemesis under
//! the time limit) -> heal everything, start what is down, wait for replicas to converge ->
//! final reads with fresh clients -> stop brokers cleanly, dump every replica -> check (before
//! teardown can fail) -> snarf node logs -> teardown. Teardown also runs after errors, on
//! cancellation (Ctrl-C) and, through the runtime's `Drop`, on panic.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context as _};
use futures::FutureExt;
use serde_json::Value;
use tokio::task::JoinSet;
pub use tokio_util::sync::CancellationToken;

use crate::checker::{check_file, write_results, ReplicaState, Results};
use crate::client::{Client, ClientContext, Workload};
use crate::db::{Db, DumpedReplica};
use crate::generator::{self, Context, Generator, Next, Planned, Rng, Worker};
use crate::history::HistoryWriter;
use crate::kafka::{ClusterMetadata, Connection};
use crate::nemesis::{heal, heal_ops, Nemesis, NemesisContext};
use crate::net::Net;
use crate::op::{Completion, Invocation, Op, OpType, Outcome, Process};
use crate::progress::Progress;
use crate::remote;
use crate::runtime::Node;
use crate::store::RunDir;
use crate::test::Test;

/// The cluster name of a single-cluster test.
pub const CLUSTER: &str = "a";

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
        "creating {} nodes ({} runtime)",
        opts.nodes, opts.runtime
    ));
    let names = opts.node_names();
    let nodes: Arc<Vec<Node>> = Arc::new(tokio::task::block_in_place(|| {
        test.runtime.create(CLUSTER, &names)
    })?);
    *nodes_out = Some(nodes.clone());

    let run_dir = RunDir::create(&opts.store, &opts.name, SystemTime::now())?;
    *run_dir_out = Some(run_dir.clone());
    let description = test.describe(&nodes);
    run_dir.write_test(&description)?;
    let history = HistoryWriter::create(&run_dir.history(), &description)?;
    progress.phase(&format!("run directory {}", run_dir.path().display()));

    let cx = ClientContext::new(
        &nodes,
        test.db.as_ref(),
        test.runtime.dialer(),
        opts.op_timeout,
    );

    progress.phase("deploying tidemark-broker");
    let db = test.db.clone();
    on_nodes(&nodes, |n| db.setup(n, &nodes))?;
    await_serving(&cx, &nodes, test.db.as_ref(), opts.ready_timeout, cancel).await?;

    let workload = test.workload.clone();
    tokio::time::timeout(opts.ready_timeout, workload.setup(&cx))
        .await
        .context("workload setup timed out")??;

    let mut interp = Interpreter {
        start: Instant::now(),
        rng: generator::rng(opts.seed),
        history,
        cx: cx.clone(),
        workload: workload.clone(),
        nemesis: test.nemesis.clone(),
        parts: Parts {
            nodes: nodes.clone(),
            db: test.db.clone(),
            net: test.net.clone(),
            client: cx.clone(),
        },
        clients: (0..opts.concurrency).map(|_| None).collect(),
        processes: (0..opts.concurrency as u64).collect(),
        next_process: opts.concurrency as u64,
        in_flight: BTreeMap::new(),
        op_timeout: opts.op_timeout,
    };

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
            nemesis.generator(),
        ))));
    }
    let mut main = generator::any(main);
    if !interp.run(&mut main, cancel, progress, true).await? {
        return Ok(None);
    }

    progress.phase("healing, restarting stopped nodes");
    interp.heal()?;
    await_serving(&cx, &nodes, test.db.as_ref(), opts.ready_timeout, cancel).await?;
    progress.phase("waiting for replicas to converge");
    if !await_convergence(&cx, &nodes, test.db.as_ref(), opts.converge_timeout, cancel).await {
        progress.phase("replicas did not converge in time; reading anyway");
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
    interp.history.flush()?;
    drop(interp);

    progress.phase("stopping brokers, dumping replicas");
    let db = test.db.clone();
    on_nodes(&nodes, |n| db.stop(n))?;
    let replicas = dump_replicas(&nodes, test.db.as_ref());
    run_dir.write_replicas(&replicas)?;

    progress.phase("checking");
    let states: Vec<ReplicaState> = replicas.into_iter().map(|r| r.state).collect();
    let checker = workload.checker();
    let results = check_file(checker.as_ref(), &run_dir.history(), Some(&states))?;
    write_results(&run_dir.results(), &results)?;
    Ok(Some(results))
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

/// Waits until every node answers ApiVersions.
pub async fn await_ready(
    cx: &ClientContext,
    timeout: Duration,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    await_nodes(cx, None, timeout, cancel).await
}

/// Like [`await_ready`], but gives up early on a node whose process died, and says why with the
/// end of its log.
async fn await_serving(
    cx: &ClientContext,
    nodes: &[Node],
    db: &dyn Db,
    timeout: Duration,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    await_nodes(cx, Some((nodes, db)), timeout, cancel).await
}

/// The last lines of a node's first log file, for error messages.
fn log_tail(node: &Node, db: &dyn Db) -> String {
    let Some(path) = db
        .as_log_files()
        .and_then(|l| l.log_files(node).into_iter().next())
    else {
        return String::new();
    };
    let cmd = remote::command_line(&["tail", "-n", "15", &path.display().to_string()]);
    match remote::run(node.remote.as_ref(), &cmd) {
        Ok(tail) if !tail.trim().is_empty() => {
            format!("\nlast lines of {}:\n{tail}", path.display())
        }
        _ => String::new(),
    }
}

async fn await_nodes(
    cx: &ClientContext,
    watch: Option<(&[Node], &dyn Db)>,
    timeout: Duration,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    for (i, node) in cx.nodes.iter().enumerate() {
        for attempt in 0u32.. {
            if attempt % 10 == 9 {
                if let Some((nodes, db)) = watch {
                    let n = &nodes[i];
                    let dead = db
                        .as_kill()
                        .map(|k| tokio::task::block_in_place(|| k.is_running(n)))
                        .is_some_and(|r| matches!(r, Ok(false)));
                    if dead {
                        let tail = tokio::task::block_in_place(|| log_tail(n, db));
                        bail!("the broker on {} exited instead of serving{tail}", n.name);
                    }
                }
            }
            let attempt = Connection::connect(
                cx.dialer.clone(),
                node.addr,
                Duration::from_secs(2).min(timeout),
            )
            .await;
            match attempt {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => {
                    let tail = watch
                        .map(|(nodes, db)| tokio::task::block_in_place(|| log_tail(&nodes[i], db)))
                        .unwrap_or_default();
                    bail!(
                        "{} ({}) did not serve within {timeout:?}: {e}{tail}",
                        node.name,
                        node.addr
                    )
                }
                Err(_) => {}
            }
            if cancel.is_cancelled() {
                bail!("cancelled while waiting for {}", node.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Metadata from the first node that answers.
async fn any_metadata(cx: &ClientContext) -> Option<ClusterMetadata> {
    for node in &cx.nodes {
        if let Ok(mut c) = Connection::connect(cx.dialer.clone(), node.addr, cx.timeout).await {
            if let Ok(m) = c.metadata(None).await {
                return Some(m);
            }
        }
    }
    None
}

/// Waits until, for every partition, every replica Metadata lists has the same log end offset
/// and a high watermark equal to it, or `timeout` passes. Returns whether they converged.
async fn await_convergence(
    cx: &ClientContext,
    nodes: &[Node],
    db: &dyn Db,
    timeout: Duration,
    cancel: &CancellationToken,
) -> bool {
    let Some(dumper) = db.as_replica_dump() else {
        return true;
    };
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(meta) = any_metadata(cx).await {
            let dumps: Vec<DumpedReplica> = tokio::task::block_in_place(|| {
                nodes
                    .iter()
                    .flat_map(|n| dumper.dump_replicas(n).unwrap_or_default())
                    .collect()
            });
            if converged(&meta, cx, &dumps) {
                return true;
            }
        }
        if Instant::now() >= deadline || cancel.is_cancelled() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether the replicas in `dumps` agree for every partition in `meta`.
pub fn converged(meta: &ClusterMetadata, cx: &ClientContext, dumps: &[DumpedReplica]) -> bool {
    for (topic, (_, parts)) in &meta.topics {
        for (partition, info) in parts {
            if info.leader < 0 {
                return false;
            }
            let mut ends = BTreeSet::new();
            for id in &info.replicas {
                let Some(node) = cx.node_by_id(CLUSTER, *id) else {
                    return false;
                };
                let row = dumps.iter().map(|r| &r.state).find(|r| {
                    r.node == node.name && r.topic == *topic && r.partition == i64::from(*partition)
                });
                let Some(row) = row else { return false };
                let (Some(hw), Some(leo)) = (row.high_watermark, row.log_end_offset) else {
                    return false;
                };
                if hw != leo {
                    return false;
                }
                ends.insert(leo);
            }
            if ends.len() > 1 {
                return false;
            }
        }
    }
    true
}

/// Every replica on every node; a node whose state could not be read contributes one error
/// line per partition the other nodes hold.
fn dump_replicas(nodes: &[Node], db: &dyn Db) -> Vec<DumpedReplica> {
    let Some(dumper) = db.as_replica_dump() else {
        return Vec::new();
    };
    let results: Vec<(String, anyhow::Result<Vec<DumpedReplica>>)> =
        tokio::task::block_in_place(|| {
            std::thread::scope(|s| {
                let hs: Vec<_> = nodes
                    .iter()
                    .map(|n| s.spawn(move || (n.name.clone(), dumper.dump_replicas(n))))
                    .collect();
                hs.into_iter().filter_map(|h| h.join().ok()).collect()
            })
        });
    let mut partitions: BTreeSet<(String, i64)> = BTreeSet::new();
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for (name, r) in results {
        match r {
            Ok(rows) => {
                partitions.extend(
                    rows.iter()
                        .map(|r| (r.state.topic.clone(), r.state.partition)),
                );
                out.extend(rows);
            }
            Err(e) => failed.push((name, format!("{e:#}"))),
        }
    }
    for (name, error) in failed {
        for (topic, partition) in &partitions {
            out.push(DumpedReplica::unreadable(
                CLUSTER,
                &name,
                topic,
                *partition,
                error.clone(),
            ));
        }
    }
    out
}

/// Copies each node's log files into `nodes/<node>/`; a file that cannot be copied is noted in
/// `nodes/<node>/snarf-errors.txt`.
fn snarf_logs(nodes: &[Node], db: &dyn Db, run_dir: &RunDir) {
    let Some(logs) = db.as_log_files() else {
        return;
    };
    tokio::task::block_in_place(|| {
        for node in nodes {
            let Ok(dir) = run_dir.node_dir(&node.name) else {
                continue;
            };
            let mut errors = Vec::new();
            for path in logs.log_files(node) {
                let Some(file) = path.file_name() else {
                    continue;
                };
                let exists = remote::run(
                    node.remote.as_ref(),
                    &remote::command_line(&["test", "-f", &path.display().to_string()]),
                )
                .is_ok();
                if !exists {
                    continue;
                }
                if let Err(e) = node.remote.download(&path, &dir.join(file)) {
                    errors.push(e.to_string());
                }
            }
            if !errors.is_empty() {
                let _ = std::fs::write(dir.join("snarf-errors.txt"), errors.join("\n"));
            }
        }
    });
}

/// The database, network and nodes, for the nemesis worker.
#[derive(Clone)]
struct Parts {
    nodes: Arc<Vec<Node>>,
    db: Arc<dyn Db>,
    net: Arc<dyn Net>,
    client: ClientContext,
}

/// What a worker sends back when its op completes.
type Done = (Worker, Option<Box<dyn Client>>, Completion);

/// The op interpreter (Jepsen's `generator.interpreter`).
struct Interpreter {
    start: Instant,
    rng: Rng,
    history: HistoryWriter,
    cx: ClientContext,
    workload: Arc<dyn Workload>,
    nemesis: Option<Arc<dyn Nemesis>>,
    parts: Parts,
    clients: Vec<Option<Box<dyn Client>>>,
    processes: Vec<u64>,
    next_process: u64,
    /// The `f` of the op each busy worker is performing.
    in_flight: BTreeMap<Worker, String>,
    op_timeout: Duration,
}

impl Interpreter {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn context(&self) -> Context {
        let mut workers: Vec<Worker> = (0..self.clients.len()).map(Worker::Client).collect();
        if self.nemesis.is_some() {
            workers.push(Worker::Nemesis);
        }
        Context {
            time: self.now(),
            free: workers
                .iter()
                .copied()
                .filter(|w| !self.in_flight.contains_key(w))
                .collect(),
            workers,
            processes: self.processes.clone(),
        }
    }

    /// Every client worker gets a new process (and so a new client).
    fn fresh_processes(&mut self) {
        for i in 0..self.clients.len() {
            self.clients[i] = None;
            self.processes[i] = self.next_process;
            self.next_process += 1;
        }
    }

    /// A history line at the current time, with no node or error yet.
    fn line(&self, process: Process, kind: OpType, f: &str, value: Value) -> Op {
        Op::new(self.now(), process, kind, f, value)
    }

    /// Heals every fault, recording each step as a nemesis invoke and info.
    fn heal(&mut self) -> anyhow::Result<()> {
        let parts = self.parts.clone();
        let cx = NemesisContext {
            nodes: &parts.nodes,
            db: parts.db.as_ref(),
            net: parts.net.as_ref(),
            client: &parts.client,
        };
        // The nemesis undoes its own faults first (clocks, packet loss), then the engine heals
        // what every database shares.
        let own = self.nemesis.clone();
        let steps: Vec<(bool, Invocation)> = own
            .iter()
            .flat_map(|n| n.heal_ops())
            .map(|op| (true, op))
            .chain(heal_ops(&cx).into_iter().map(|op| (false, op)))
            .collect();
        for (by_nemesis, op) in steps {
            let invoke = self.line(Process::Nemesis, OpType::Invoke, &op.f, op.value.clone());
            self.history.append(invoke, |_| {})?;
            let done = tokio::task::block_in_place(|| match (&own, by_nemesis) {
                (Some(n), true) => n.invoke(&cx, &op),
                _ => heal(&cx, &op),
            });
            let mut info = self.line(Process::Nemesis, OpType::Info, &op.f, done.value);
            info.error = done.error;
            self.history.append(info, |_| {})?;
        }
        self.history.flush()
    }

    fn dispatch(
        &mut self,
        p: Planned,
        gen: &mut dyn Generator,
        tasks: &mut JoinSet<Done>,
    ) -> anyhow::Result<()> {
        if self.in_flight.contains_key(&p.worker) {
            bail!(
                "the generator planned {} for busy worker {:?}",
                p.op.f,
                p.worker
            );
        }
        let process = self.context().process(p.worker);
        self.in_flight.insert(p.worker, p.op.f.clone());
        let ctx = self.context();
        let invoke = self.line(process, OpType::Invoke, &p.op.f, p.op.value.clone());
        self.history
            .append(invoke, |op| gen.update(&ctx, p.worker, op))?;
        let inv = p.op;
        let op_timeout = self.op_timeout;
        match p.worker {
            Worker::Client(i) => {
                let mut client = match self.clients[i].take() {
                    Some(c) => c,
                    None => self.workload.open(&self.cx, i % self.cx.nodes.len()),
                };
                tasks.spawn(async move {
                    let invoked = tokio::time::timeout(
                        op_timeout,
                        AssertUnwindSafe(client.invoke(&inv)).catch_unwind(),
                    )
                    .await;
                    let done = match invoked {
                        Ok(Ok(done)) => return (p.worker, Some(client), done),
                        Ok(Err(_)) => "indeterminate: client panicked".to_string(),
                        Err(_) => format!("indeterminate: no completion within {op_timeout:?}"),
                    };
                    let mut c = Completion::new(Outcome::Info, inv.value.clone());
                    c.error = Some(done);
                    (p.worker, None, c)
                });
            }
            Worker::Nemesis => {
                let nemesis = self
                    .nemesis
                    .clone()
                    .context("generator addressed the nemesis, but the test has none")?;
                let parts = self.parts.clone();
                tasks.spawn(async move {
                    let done = tokio::task::spawn_blocking(move || {
                        nemesis.invoke(
                            &NemesisContext {
                                nodes: &parts.nodes,
                                db: parts.db.as_ref(),
                                net: parts.net.as_ref(),
                                client: &parts.client,
                            },
                            &inv,
                        )
                    })
                    .await
                    .unwrap_or_else(|e| {
                        let mut c = Completion::new(Outcome::Info, Value::Null);
                        c.error = Some(format!("nemesis panicked: {e}"));
                        c
                    });
                    (Worker::Nemesis, None, done)
                });
            }
        }
        Ok(())
    }

    fn complete(
        &mut self,
        (worker, client, done): Done,
        gen: &mut dyn Generator,
        progress: &mut Progress,
    ) -> anyhow::Result<()> {
        let f = self
            .in_flight
            .remove(&worker)
            .context("completion from an idle worker")?;
        let ctx = self.context();
        let process = ctx.process(worker);
        let kind = match worker {
            Worker::Nemesis => OpType::Info,
            Worker::Client(_) => done.outcome.into(),
        };
        let mut op = self.line(process, kind, &f, done.value);
        op.cluster = done.node.as_ref().map(|_| CLUSTER.to_string());
        op.node = done.node;
        op.error = done.error;
        self.history.append(op, |op| gen.update(&ctx, worker, op))?;
        if let Worker::Client(i) = worker {
            progress.record(done.outcome);
            if done.outcome == Outcome::Info {
                self.processes[i] = self.next_process;
                self.next_process += 1;
            } else {
                self.clients[i] = client;
            }
        }
        Ok(())
    }

    /// Runs `gen` until it is done and every op has completed. Returns false when cancelled.
    async fn run(
        &mut self,
        gen: &mut dyn Generator,
        cancel: &CancellationToken,
        progress: &mut Progress,
        show_time: bool,
    ) -> anyhow::Result<bool> {
        let phase_start = Instant::now();
        let mut tasks: JoinSet<Done> = JoinSet::new();
        let mut held: Option<Planned> = None;
        let tick = Duration::from_millis(100);
        loop {
            while let Some(done) = tasks.try_join_next() {
                self.complete(done.context("worker task failed")?, gen, progress)?;
            }
            if show_time {
                progress.tick(phase_start.elapsed());
            }
            if cancel.is_cancelled() {
                self.drain(&mut tasks, gen, progress).await?;
                return Ok(false);
            }
            let next = match held.take() {
                Some(p) => Next::Op(p),
                None => gen.next(&self.context(), &mut self.rng),
            };
            let now = self.now();
            let wake = match next {
                Next::Op(p) if p.time <= now => {
                    self.dispatch(p, gen, &mut tasks)?;
                    continue;
                }
                Next::Op(p) => {
                    let t = p.time;
                    held = Some(p);
                    Some(t)
                }
                Next::Pending(t) => t,
                Next::Done if tasks.is_empty() => {
                    self.history.flush()?;
                    return Ok(true);
                }
                Next::Done => None,
            };
            let wait = wake
                .map(|t| Duration::from_nanos(t.saturating_sub(now)))
                .unwrap_or(tick)
                .min(tick);
            tokio::select! {
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    self.complete(done.context("worker task failed")?, gen, progress)?;
                }
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => {}
            }
        }
    }

    /// After cancellation: waits a bounded time for ops in flight so their completions are
    /// recorded, then abandons the rest (they stay open-ended invocations, read as `info`).
    async fn drain(
        &mut self,
        tasks: &mut JoinSet<Done>,
        gen: &mut dyn Generator,
        progress: &mut Progress,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + self.op_timeout + Duration::from_secs(1);
        while !tasks.is_empty() {
            match tokio::time::timeout_at(deadline, tasks.join_next()).await {
                Ok(Some(done)) => {
                    self.complete(done.context("worker task failed")?, gen, progress)?
                }
                Ok(None) | Err(_) => break,
            }
        }
        tasks.abort_all();
        self.history.flush()
    }
}
