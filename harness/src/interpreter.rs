//! The op interpreter (Jepsen's `generator.interpreter`): it asks a [`Generator`] for ops, hands
//! each to its worker (a client process or the nemesis), records every invocation and completion
//! in a [`History`] as it happens, tells the generator of each, and gives a client worker whose
//! op ended `info` a fresh process. It is the one place this logic lives: the runner drives its
//! phases with it, and [`simulate`] runs generators through it without a cluster.
//!
//! Time is tokio's ([`tokio::time::Instant`]), so under a paused clock a whole schedule runs in
//! virtual time and the same seed gives the same history.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::generator::{self, Context, Generator, Next, Planned, Rng, Worker};
use crate::history::HistoryWriter;
use crate::op::{Completion, Invocation, Op, OpType, Outcome, Process};
use crate::progress::Progress;

/// Opens the client of a fresh process.
pub trait OpenClient: Send + Sync {
    /// A client for a new process on client worker `worker`; it must not block.
    fn open(&self, worker: usize) -> Box<dyn Client>;
}

/// Performs the nemesis worker's ops.
///
/// Contract: the future completes once the fault is in force, with a completion recording what
/// was done; the interpreter records it as `info` whatever its outcome.
pub trait PerformFault: Send + Sync {
    /// Performs `op`.
    fn perform(&self, op: Invocation) -> BoxFuture<'static, Completion>;
}

/// Where the interpreter records ops.
///
/// Contract: [`append`](History::append) numbers the op (0, 1, 2, ... in call order), shows the
/// numbered op to `observe`, then keeps it.
pub trait History: Send {
    /// Records `op`.
    fn append(&mut self, op: Op, observe: &mut dyn FnMut(&Op)) -> anyhow::Result<()>;

    /// Makes everything recorded so far durable.
    fn flush(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

impl History for HistoryWriter {
    fn append(&mut self, op: Op, observe: &mut dyn FnMut(&Op)) -> anyhow::Result<()> {
        HistoryWriter::append(self, op, observe)
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        HistoryWriter::flush(self)
    }
}

impl History for Vec<Op> {
    fn append(&mut self, mut op: Op, observe: &mut dyn FnMut(&Op)) -> anyhow::Result<()> {
        op.index = self.len() as u64;
        observe(&op);
        self.push(op);
        Ok(())
    }
}

/// What a worker sends back when its op completes.
type Done = (Worker, Option<Box<dyn Client>>, Completion);

/// The interpreter: workers, the ops in flight, and the process each client worker runs as.
pub struct Interpreter<H> {
    start: Instant,
    rng: Rng,
    history: H,
    clients: Arc<dyn OpenClient>,
    nemesis: Option<Arc<dyn PerformFault>>,
    open: Vec<Option<Box<dyn Client>>>,
    processes: Vec<u64>,
    next_process: u64,
    /// The `f` of the op each busy worker is performing, and the cluster it is recorded with.
    in_flight: BTreeMap<Worker, (String, Option<String>)>,
    op_timeout: Duration,
    clusters: OpClusters,
}

/// The clusters ops are recorded with: every op with the cluster its value names
/// (`"cluster": "b"`), else a client op with the clients' cluster and a nemesis op with the
/// nemesis's default cluster. Without them (a simulation) ops name no cluster but their own.
#[derive(Debug, Clone, Default)]
pub struct OpClusters {
    /// The cluster the clients talk to.
    pub clients: Option<String>,
    /// The cluster of nemesis ops that name none.
    pub nemesis: Option<String>,
}

impl OpClusters {
    /// The cluster `op` of `worker` is recorded with.
    fn of(&self, worker: Worker, op: &Invocation) -> Option<String> {
        match worker {
            Worker::Client(_) => fault_cluster(op, self.clients.as_deref()),
            Worker::Nemesis => fault_cluster(op, self.nemesis.as_deref()),
        }
    }
}

/// The cluster an op acts on: the one its value names in `cluster`, else `default`.
pub fn fault_cluster(op: &Invocation, default: Option<&str>) -> Option<String> {
    op.value
        .get("cluster")
        .and_then(Value::as_str)
        .or(default)
        .map(str::to_owned)
}

impl<H: History> Interpreter<H> {
    /// `concurrency` client workers (processes 0 to `concurrency - 1`), the nemesis worker when
    /// there is a nemesis, the RNG seeded with `seed`, and the clock starting now. A client op
    /// with no completion within `op_timeout` ends `info`.
    pub fn new(
        concurrency: usize,
        seed: u64,
        history: H,
        clients: Arc<dyn OpenClient>,
        nemesis: Option<Arc<dyn PerformFault>>,
        op_timeout: Duration,
    ) -> Self {
        Interpreter {
            start: Instant::now(),
            rng: generator::rng(seed),
            history,
            clients,
            nemesis,
            open: (0..concurrency).map(|_| None).collect(),
            processes: (0..concurrency as u64).collect(),
            next_process: concurrency as u64,
            in_flight: BTreeMap::new(),
            op_timeout,
            clusters: OpClusters::default(),
        }
    }

    /// Records ops with `clusters`.
    pub fn with_clusters(mut self, clusters: OpClusters) -> Self {
        self.clusters = clusters;
        self
    }

    /// The history recorded so far.
    pub fn history(&mut self) -> &mut H {
        &mut self.history
    }

    /// Ends the interpreter, returning its history.
    pub fn into_history(self) -> H {
        self.history
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn context(&self) -> Context {
        let mut workers: Vec<Worker> = (0..self.open.len()).map(Worker::Client).collect();
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
    pub fn fresh_processes(&mut self) {
        for i in 0..self.open.len() {
            self.open[i] = None;
            self.processes[i] = self.next_process;
            self.next_process += 1;
        }
    }

    /// Performs one nemesis op outside any generator (the final phase's healing), recording its
    /// invocation and its `info`, both with `cluster`, the cluster it acts on.
    pub fn perform_now(
        &mut self,
        op: &Invocation,
        cluster: &str,
        perform: impl FnOnce(&Invocation) -> Completion,
    ) -> anyhow::Result<()> {
        let cluster = Some(cluster.to_owned());
        let invoke = Op {
            cluster: cluster.clone(),
            ..Op::new(
                self.now(),
                Process::Nemesis,
                OpType::Invoke,
                &op.f,
                op.value.clone(),
            )
        };
        self.history.append(invoke, &mut |_| {})?;
        let done = perform(op);
        let info = Op {
            cluster,
            error: done.error,
            ..Op::new(
                self.now(),
                Process::Nemesis,
                OpType::Info,
                &op.f,
                done.value,
            )
        };
        self.history.append(info, &mut |_| {})
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
        let nemesis = match p.worker {
            Worker::Nemesis => Some(
                self.nemesis
                    .clone()
                    .context("generator addressed the nemesis, but the test has none")?,
            ),
            Worker::Client(_) => None,
        };
        let process = self.context().process(p.worker);
        let cluster = self.clusters.of(p.worker, &p.op);
        self.in_flight
            .insert(p.worker, (p.op.f.clone(), cluster.clone()));
        let ctx = self.context();
        let invoke = Op {
            cluster,
            ..Op::new(
                self.now(),
                process,
                OpType::Invoke,
                &p.op.f,
                p.op.value.clone(),
            )
        };
        self.history
            .append(invoke, &mut |op| gen.update(&ctx, p.worker, op))?;
        let inv = p.op;
        let op_timeout = self.op_timeout;
        match (p.worker, nemesis) {
            (Worker::Client(i), _) => {
                let mut client = match self.open[i].take() {
                    Some(c) => c,
                    None => self.clients.open(i),
                };
                tasks.spawn(async move {
                    let invoked = tokio::time::timeout(
                        op_timeout,
                        AssertUnwindSafe(client.invoke(&inv)).catch_unwind(),
                    )
                    .await;
                    let why = match invoked {
                        Ok(Ok(done)) => return (p.worker, Some(client), done),
                        Ok(Err(_)) => "indeterminate: client panicked".to_string(),
                        Err(_) => format!("indeterminate: no completion within {op_timeout:?}"),
                    };
                    let mut c = Completion::new(Outcome::Info, inv.value.clone());
                    c.error = Some(why);
                    (p.worker, None, c)
                });
            }
            (Worker::Nemesis, nemesis) => {
                let nemesis = nemesis.expect("looked up above");
                tasks.spawn(async move {
                    let done = AssertUnwindSafe(nemesis.perform(inv))
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|_| {
                            let mut c = Completion::new(Outcome::Info, Value::Null);
                            c.error = Some("nemesis panicked".into());
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
        let (f, cluster) = self
            .in_flight
            .remove(&worker)
            .context("completion from an idle worker")?;
        let ctx = self.context();
        let process = ctx.process(worker);
        let kind = match worker {
            Worker::Nemesis => OpType::Info,
            Worker::Client(_) => done.outcome.into(),
        };
        let op = Op {
            cluster,
            node: done.node,
            error: done.error,
            ..Op::new(self.now(), process, kind, f, done.value)
        };
        self.history
            .append(op, &mut |op| gen.update(&ctx, worker, op))?;
        if let Worker::Client(i) = worker {
            progress.record(done.outcome);
            if done.outcome == Outcome::Info {
                self.processes[i] = self.next_process;
                self.next_process += 1;
            } else {
                self.open[i] = client;
            }
        }
        Ok(())
    }

    /// Runs `gen` until it is done and every op has completed. Returns false when cancelled.
    pub async fn run(
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
            // Biased, so that under a paused clock a completion and a wake-up due at the same
            // instant are always taken in the same order.
            tokio::select! {
                biased;
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
        let deadline = Instant::now() + self.op_timeout + Duration::from_secs(1);
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

/// Answers every op of [`simulate`]: the outcome, the result value and the latency in
/// nanoseconds.
type Answer = dyn FnMut(&Invocation) -> (Outcome, Value, u64) + Send;

/// A client and nemesis that answer with a shared function after its latency.
#[derive(Clone)]
struct Scripted(Arc<Mutex<Box<Answer>>>);

impl Scripted {
    fn answer(&self, op: &Invocation) -> BoxFuture<'static, Completion> {
        let (outcome, value, latency) = (self.0.lock().unwrap_or_else(|p| p.into_inner()))(op);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_nanos(latency)).await;
            Completion::new(outcome, value)
        })
    }
}

impl Client for Scripted {
    fn invoke<'a>(&'a mut self, op: &'a Invocation) -> BoxFuture<'a, Completion> {
        Scripted::answer(self, op)
    }
}

impl OpenClient for Scripted {
    fn open(&self, _worker: usize) -> Box<dyn Client> {
        Box::new(self.clone())
    }
}

impl PerformFault for Scripted {
    fn perform(&self, op: Invocation) -> BoxFuture<'static, Completion> {
        self.answer(&op)
    }
}

/// Drives a generator through the interpreter without a cluster: `clients` client workers and a
/// nemesis worker, all answered by `answer` (an outcome, a result value and a latency in
/// nanoseconds). Returns the history. Stops at `Done` or after `max_ops` invocations. Run it
/// under a paused clock (`#[tokio::test(start_paused = true)]`) so latencies cost no real time
/// and the same seed gives the same history.
pub async fn simulate(
    gen: &mut dyn Generator,
    clients: usize,
    seed: u64,
    max_ops: usize,
    answer: impl FnMut(&Invocation) -> (Outcome, Value, u64) + Send + 'static,
) -> Vec<Op> {
    let scripted = Scripted(Arc::new(Mutex::new(Box::new(answer))));
    let mut interp = Interpreter::new(
        clients,
        seed,
        Vec::new(),
        Arc::new(scripted.clone()),
        Some(Arc::new(scripted)),
        Duration::from_secs(3600),
    );
    let mut gen = generator::limit(max_ops, gen);
    let mut progress = Progress::new(Duration::ZERO, true);
    interp
        .run(&mut gen, &CancellationToken::new(), &mut progress, false)
        .await
        .expect("a simulated run records into memory and cannot fail");
    interp.into_history()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{
        any, from_fn, limit, nemesis_once, phases, sleep, Clients, NemesisOnly,
    };
    use crate::generator::{Context, Next, Planned, Rng, Worker};
    use serde_json::json;

    const MS: u64 = 1_000_000;

    /// `n` ops named `f`, numbered in their value.
    fn numbered(f: &'static str, n: usize) -> impl Generator {
        let mut k = 0;
        limit(
            n,
            from_fn(move |_, _, _| {
                k += 1;
                Some(Invocation {
                    f: f.into(),
                    value: json!(k),
                })
            }),
        )
    }

    /// A client that answers op `k` (its value) by `script(k)`: how it ends and after how long;
    /// `None` never answers, and a panic panics.
    struct Fake {
        script: fn(i64) -> Option<(Outcome, u64)>,
        opened: Arc<Mutex<Vec<usize>>>,
    }

    impl OpenClient for Fake {
        fn open(&self, worker: usize) -> Box<dyn Client> {
            self.opened.lock().unwrap().push(worker);
            Box::new(FakeClient(self.script))
        }
    }

    struct FakeClient(fn(i64) -> Option<(Outcome, u64)>);

    impl Client for FakeClient {
        fn invoke<'a>(&'a mut self, op: &'a Invocation) -> BoxFuture<'a, Completion> {
            let k = op.value.as_i64().unwrap();
            let script = self.0;
            Box::pin(async move {
                match script(k) {
                    Some((outcome, latency)) => {
                        tokio::time::sleep(Duration::from_nanos(latency)).await;
                        let mut c = Completion::new(outcome, op.value.clone());
                        c.node = Some("n1".into());
                        c
                    }
                    None => futures::future::pending().await,
                }
            })
        }
    }

    /// A nemesis that takes 5 ms and records what it did.
    struct FakeNemesis;

    impl PerformFault for FakeNemesis {
        fn perform(&self, op: Invocation) -> BoxFuture<'static, Completion> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Completion::new(Outcome::Ok, json!({"did": op.f}))
            })
        }
    }

    fn interpreter(
        concurrency: usize,
        script: fn(i64) -> Option<(Outcome, u64)>,
        nemesis: bool,
    ) -> (Interpreter<Vec<Op>>, Arc<Mutex<Vec<usize>>>) {
        let opened = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake {
            script,
            opened: opened.clone(),
        };
        let nemesis = nemesis.then(|| Arc::new(FakeNemesis) as Arc<dyn PerformFault>);
        let interp = Interpreter::new(
            concurrency,
            1,
            Vec::new(),
            Arc::new(fake),
            nemesis,
            Duration::from_secs(2),
        )
        .with_clusters(OpClusters {
            clients: Some("a".into()),
            nemesis: Some("a".into()),
        });
        (interp, opened)
    }

    async fn run(interp: &mut Interpreter<Vec<Op>>, gen: &mut dyn Generator) -> bool {
        let mut progress = Progress::new(Duration::ZERO, true);
        interp
            .run(gen, &CancellationToken::new(), &mut progress, false)
            .await
            .unwrap()
    }

    fn lines(h: &[Op]) -> Vec<(OpType, Process, Value)> {
        h.iter()
            .map(|o| (o.kind, o.process, o.value.clone()))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_info_gives_the_worker_a_new_process_and_a_new_client() {
        let (mut interp, opened) = interpreter(
            1,
            |k| Some((if k == 2 { Outcome::Info } else { Outcome::Ok }, MS)),
            false,
        );
        assert!(run(&mut interp, &mut numbered("send", 3)).await);
        let h = interp.into_history();
        assert_eq!(
            lines(&h),
            vec![
                (OpType::Invoke, Process::Client(0), json!(1)),
                (OpType::Ok, Process::Client(0), json!(1)),
                (OpType::Invoke, Process::Client(0), json!(2)),
                (OpType::Info, Process::Client(0), json!(2)),
                (OpType::Invoke, Process::Client(1), json!(3)),
                (OpType::Ok, Process::Client(1), json!(3)),
            ]
        );
        // Dense indices, times in virtual nanoseconds, the node on completions, the cluster on
        // every op.
        assert_eq!(
            h.iter().map(|o| o.index).collect::<Vec<_>>(),
            (0..6).collect::<Vec<_>>()
        );
        assert_eq!((h[1].time, h[5].time), (MS, 3 * MS));
        assert_eq!(
            (h[1].node.as_deref(), h[1].cluster.as_deref()),
            (Some("n1"), Some("a"))
        );
        assert!(
            h.iter().all(|o| o.cluster.as_deref() == Some("a")),
            "{h:#?}"
        );
        // One client per process: the first kept across its ok, a new one after the info.
        assert_eq!(*opened.lock().unwrap(), vec![0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_answers_or_panics_ends_info_and_its_worker_goes_on() {
        let (mut interp, _) = interpreter(
            1,
            |k| match k {
                1 => None,
                2 => panic!("client bug"),
                _ => Some((Outcome::Ok, MS)),
            },
            false,
        );
        assert!(run(&mut interp, &mut numbered("poll", 3)).await);
        let h = interp.into_history();
        let ends: Vec<(OpType, Process, Option<&str>)> = h
            .iter()
            .filter(|o| o.kind != OpType::Invoke)
            .map(|o| (o.kind, o.process, o.error.as_deref()))
            .collect();
        assert_eq!(
            ends,
            vec![
                (
                    OpType::Info,
                    Process::Client(0),
                    Some("indeterminate: no completion within 2s")
                ),
                (
                    OpType::Info,
                    Process::Client(1),
                    Some("indeterminate: client panicked")
                ),
                (OpType::Ok, Process::Client(2), None),
            ]
        );
        assert_eq!(h[1].time, 2_000 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn nemesis_ops_are_info_on_the_nemesis_process_beside_the_clients() {
        let (mut interp, _) = interpreter(2, |_| Some((Outcome::Ok, 20 * MS)), true);
        let clients = Clients(numbered("send", 6));
        let nemesis = NemesisOnly(phases(vec![
            Box::new(sleep(30 * MS)),
            Box::new(nemesis_once("kill", json!({"targets": "one"}))),
        ]));
        let mut gen = any(vec![Box::new(clients), Box::new(nemesis)]);
        assert!(run(&mut interp, &mut gen).await);
        let h = interp.into_history();
        let nem: Vec<(OpType, u64, Value)> = h
            .iter()
            .filter(|o| o.process == Process::Nemesis)
            .map(|o| (o.kind, o.time / MS, o.value.clone()))
            .collect();
        assert_eq!(
            nem,
            vec![
                (OpType::Invoke, 30, json!({"targets": "one"})),
                (OpType::Info, 35, json!({"did": "kill"})),
            ]
        );
        assert_eq!(h.iter().filter(|o| o.kind == OpType::Ok).count(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_nemesis_op_is_recorded_with_the_cluster_its_value_names() {
        let (mut interp, _) = interpreter(1, |_| Some((Outcome::Ok, MS)), true);
        let mut gen = NemesisOnly(phases(vec![
            Box::new(nemesis_once("kill", json!({"targets": "one"}))),
            Box::new(nemesis_once(
                "kill",
                json!({"cluster": "b", "targets": "one"}),
            )),
        ]));
        assert!(run(&mut interp, &mut gen).await);
        let h = interp.into_history();
        let clusters: Vec<(OpType, Option<&str>)> =
            h.iter().map(|o| (o.kind, o.cluster.as_deref())).collect();
        assert_eq!(
            clusters,
            [
                (OpType::Invoke, Some("a")),
                (OpType::Info, Some("a")),
                (OpType::Invoke, Some("b")),
                (OpType::Info, Some("b")),
            ]
        );
    }

    /// Plans its worker whether it is free or not.
    struct Stubborn(Worker);

    impl Generator for Stubborn {
        fn next(&mut self, ctx: &Context, _rng: &mut Rng) -> Next {
            Next::Op(Planned {
                worker: self.0,
                time: ctx.time,
                op: Invocation {
                    f: "send".into(),
                    value: json!(1),
                },
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_op_for_a_missing_nemesis_or_a_busy_worker_is_an_error() {
        let (mut interp, _) = interpreter(1, |_| Some((Outcome::Ok, MS)), false);
        let mut progress = Progress::new(Duration::ZERO, true);
        let cancel = CancellationToken::new();
        let mut gen = Stubborn(Worker::Nemesis);
        let e = interp.run(&mut gen, &cancel, &mut progress, false).await;
        let e = e.unwrap_err().to_string();
        assert!(e.contains("the test has none"), "{e}");
        let mut gen = Stubborn(Worker::Client(0));
        let e = interp.run(&mut gen, &cancel, &mut progress, false).await;
        let e = e.unwrap_err().to_string();
        assert!(e.contains("send for busy worker Client(0)"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_records_the_completions_in_flight() {
        let (mut interp, _) = interpreter(2, |_| Some((Outcome::Ok, 50 * MS)), false);
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(120)).await;
            stop.cancel();
        });
        let mut progress = Progress::new(Duration::ZERO, true);
        let mut gen = numbered("send", 1000);
        let finished = interp
            .run(&mut gen, &cancel, &mut progress, false)
            .await
            .unwrap();
        assert!(!finished);
        let h = interp.into_history();
        let invokes = h.iter().filter(|o| o.kind == OpType::Invoke).count();
        assert_eq!(invokes, 6, "{h:#?}");
        assert_eq!(h.len(), 2 * invokes, "every invocation completed");
    }

    #[tokio::test(start_paused = true)]
    async fn perform_now_records_the_invocation_and_the_info() {
        let (mut interp, _) = interpreter(1, |_| Some((Outcome::Ok, MS)), false);
        let op = Invocation {
            f: "stop-partition".into(),
            value: json!({}),
        };
        interp
            .perform_now(&op, "a", |_| {
                let mut c = Completion::new(Outcome::Ok, json!({"healed": true}));
                c.error = Some("n2: no route".into());
                c
            })
            .unwrap();
        let on_b = Invocation {
            f: "start".into(),
            value: json!({"nodes": ["b1"]}),
        };
        interp
            .perform_now(&on_b, "b", |op| {
                Completion::new(Outcome::Info, op.value.clone())
            })
            .unwrap();
        let h = interp.into_history();
        assert_eq!(
            lines(&h)[..2],
            vec![
                (OpType::Invoke, Process::Nemesis, json!({})),
                (OpType::Info, Process::Nemesis, json!({"healed": true})),
            ]
        );
        assert_eq!(h[1].error.as_deref(), Some("n2: no route"));
        let clusters: Vec<_> = h.iter().map(|o| o.cluster.as_deref()).collect();
        assert_eq!(clusters, [Some("a"), Some("a"), Some("b"), Some("b")]);
    }
}
