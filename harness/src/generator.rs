//! The schedule of a test as a pure, seeded state machine (Jepsen's generator model). A
//! [`Generator`] is asked for the next op given a [`Context`] — the time and which workers are
//! free — and the runner's RNG, and is told of every invocation and completion. It never reads a
//! clock or any other randomness, so the same seed and the same completions give the same ops;
//! [`simulate`](crate::interpreter::simulate) drives one through the interpreter without a
//! cluster.
//!
//! Ops are addressed to workers; the runner maps workers to processes (a client worker whose op
//! ends `info` takes a fresh process number) and owns the clock.

use std::collections::BTreeMap;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use crate::op::{Invocation, Op, OpType, Process};

/// The RNG every generator draws from; the runner seeds it from the test's seed.
pub type Rng = ChaCha8Rng;

/// Creates the test RNG for `seed`.
pub fn rng(seed: u64) -> Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// The nemesis's RNG for `seed`: the test RNG's key on a stream of its own, so that the faults
/// drawn and the client ops drawn do not depend on each other (a replayed fault schedule, which
/// draws nothing, leaves the clients' draws as the recorded run made them).
pub fn nemesis_rng(seed: u64) -> Rng {
    let mut rng = rng(seed);
    rng.set_stream(1);
    rng
}

/// A thread of execution in the runner: a client slot or the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Worker {
    /// Client worker `i` (0-based), bound to node `i mod nodes`.
    Client(usize),
    /// The nemesis worker.
    Nemesis,
}

/// What a generator sees: the time and the workers. Routing combinators ([`Clients`],
/// [`NemesisOnly`], [`EachWorker`]) narrow `workers` and `free` to the workers their generator may
/// use, so "every worker is free" means every worker in view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// Nanoseconds since the test started.
    pub time: u64,
    /// The workers in view, sorted (clients first, then the nemesis).
    pub workers: Vec<Worker>,
    /// Those of them that are free, sorted.
    pub free: Vec<Worker>,
    /// The process each client worker currently runs as (all client workers, in or out of view).
    pub processes: Vec<u64>,
}

impl Context {
    /// A context at `time` with `clients` client workers (process i for worker i) and a nemesis,
    /// all free.
    pub fn all_free(time: u64, clients: usize) -> Self {
        let mut workers: Vec<Worker> = (0..clients).map(Worker::Client).collect();
        workers.push(Worker::Nemesis);
        Context {
            time,
            free: workers.clone(),
            workers,
            processes: (0..clients as u64).collect(),
        }
    }

    /// Whether every worker in view is free.
    pub fn everyone_free(&self) -> bool {
        self.free.len() == self.workers.len()
    }

    /// The process a worker runs as.
    pub fn process(&self, worker: Worker) -> Process {
        match worker {
            Worker::Client(i) => Process::Client(self.processes[i]),
            Worker::Nemesis => Process::Nemesis,
        }
    }

    /// The free client workers.
    pub fn free_clients(&self) -> impl Iterator<Item = usize> + '_ {
        self.free.iter().filter_map(|w| match w {
            Worker::Client(i) => Some(*i),
            Worker::Nemesis => None,
        })
    }

    /// A uniformly chosen free client worker.
    pub fn random_free_client(&self, rng: &mut Rng) -> Option<Worker> {
        let n = self.free_clients().count();
        if n == 0 {
            return None;
        }
        let k = rng.random_range(0..n);
        self.free_clients().nth(k).map(Worker::Client)
    }

    fn restricted(&self, keep: impl Fn(&Worker) -> bool) -> Context {
        Context {
            workers: self.workers.iter().copied().filter(&keep).collect(),
            free: self.free.iter().copied().filter(&keep).collect(),
            ..self.clone()
        }
    }
}

/// An op the generator wants performed.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Which worker performs it (must be free in the context it was planned in).
    pub worker: Worker,
    /// When, in nanoseconds since the start; the runner waits until then.
    pub time: u64,
    /// What.
    pub op: Invocation,
}

/// A generator's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Perform this op.
    Op(Planned),
    /// Nothing now; ask again after a completion, or at the given time if any.
    Pending(Option<u64>),
    /// Exhausted: never asks for anything again.
    Done,
}

/// A pure schedule of ops.
///
/// Contract:
/// - [`next`](Generator::next) depends only on the generator's state, the context and draws
///   from `rng`. An op it returns is committed: the runner performs it, on the named free worker,
///   no earlier than its time. `Done` is final.
/// - [`update`](Generator::update) is told of every invocation and completion the runner
///   records (client and nemesis), with the worker that performed it, in history order.
pub trait Generator: Send {
    /// The next op, or why there is none.
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next;

    /// Learns of an invocation or completion.
    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        let _ = (ctx, worker, op);
    }
}

impl<G: Generator + ?Sized> Generator for &mut G {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        (**self).next(ctx, rng)
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        (**self).update(ctx, worker, op)
    }
}

impl Generator for Box<dyn Generator> {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        (**self).next(ctx, rng)
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        (**self).update(ctx, worker, op)
    }
}

/// An endless stream of client ops from a function; each goes to a random free client worker,
/// now. The function may return `None` to end the stream.
pub struct FromFn<F> {
    f: F,
}

/// Builds a [`FromFn`].
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: FnMut(&Context, Worker, &mut Rng) -> Option<Invocation> + Send,
{
    FromFn { f }
}

impl<F> Generator for FromFn<F>
where
    F: FnMut(&Context, Worker, &mut Rng) -> Option<Invocation> + Send,
{
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        let Some(worker) = ctx.random_free_client(rng) else {
            return Next::Pending(None);
        };
        match (self.f)(ctx, worker, rng) {
            Some(op) => Next::Op(Planned {
                worker,
                time: ctx.time,
                op,
            }),
            None => Next::Done,
        }
    }
}

/// One op for the nemesis worker, then done.
pub struct Once {
    op: Option<Invocation>,
    worker: Worker,
}

/// A single nemesis op.
pub fn nemesis_once(f: &str, value: serde_json::Value) -> Once {
    Once {
        op: Some(Invocation {
            f: f.to_string(),
            value,
        }),
        worker: Worker::Nemesis,
    }
}

impl Generator for Once {
    fn next(&mut self, ctx: &Context, _rng: &mut Rng) -> Next {
        if self.op.is_none() {
            return Next::Done;
        }
        if !ctx.free.contains(&self.worker) {
            return Next::Pending(None);
        }
        let op = self.op.take().expect("checked above");
        Next::Op(Planned {
            worker: self.worker,
            time: ctx.time,
            op,
        })
    }
}

/// Picks uniformly among its generators for each op (Jepsen's `mix`); exhausted ones drop out.
pub struct Mix {
    gens: Vec<Box<dyn Generator>>,
}

/// Builds a [`Mix`].
pub fn mix(gens: Vec<Box<dyn Generator>>) -> Mix {
    Mix { gens }
}

impl Generator for Mix {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        while !self.gens.is_empty() {
            let i = rng.random_range(0..self.gens.len());
            match self.gens[i].next(ctx, rng) {
                Next::Done => {
                    self.gens.remove(i);
                }
                other => return other,
            }
        }
        Next::Done
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        for g in &mut self.gens {
            g.update(ctx, worker, op);
        }
    }
}

/// The field of a nemesis op's invocation asking for a burst of client load before the fault
/// acts: its value is the burst's length in milliseconds.
pub const BURST_KEY: &str = "burst_ms";

/// When a burst a nemesis invocation asked for (`BURST_KEY`) ends, in nanoseconds.
pub fn burst_end(op: &Op) -> Option<u64> {
    if op.process != Process::Nemesis || op.kind != OpType::Invoke {
        return None;
    }
    let ms = op.value.get(BURST_KEY)?.as_u64()?;
    Some(op.time.saturating_add(ms.saturating_mul(1_000_000)))
}

/// Spaces ops out by a uniform random interval in [0, 2·dt] (Jepsen's `stagger`): over all
/// workers together this gives about one op per `dt`. During a burst a nemesis op asked for
/// ([`BURST_KEY`]) ops go out as fast as workers are free.
pub struct Stagger<G> {
    dt: u64,
    next_time: Option<u64>,
    burst_until: u64,
    inner: G,
}

/// Builds a [`Stagger`] with mean interval `dt` nanoseconds.
pub fn stagger<G: Generator>(dt: u64, inner: G) -> Stagger<G> {
    Stagger {
        dt,
        next_time: None,
        burst_until: 0,
        inner,
    }
}

impl<G: Generator> Generator for Stagger<G> {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        match self.inner.next(ctx, rng) {
            Next::Op(mut p) => {
                let bursting = ctx.time < self.burst_until;
                let t = if bursting {
                    p.time
                } else {
                    p.time.max(self.next_time.unwrap_or(ctx.time))
                };
                p.time = t;
                let gap = if self.dt == 0 || bursting {
                    0
                } else {
                    rng.random_range(0..=2 * self.dt)
                };
                self.next_time = Some(t + gap);
                Next::Op(p)
            }
            other => other,
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        if let Some(end) = burst_end(op) {
            self.burst_until = self.burst_until.max(end);
        }
        self.inner.update(ctx, worker, op)
    }
}

/// Ends its generator `dt` nanoseconds after it is first asked (Jepsen's `time-limit`).
pub struct TimeLimit<G> {
    dt: u64,
    deadline: Option<u64>,
    inner: G,
}

/// Builds a [`TimeLimit`].
pub fn time_limit<G: Generator>(dt: u64, inner: G) -> TimeLimit<G> {
    TimeLimit {
        dt,
        deadline: None,
        inner,
    }
}

impl<G: Generator> Generator for TimeLimit<G> {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        let deadline = *self.deadline.get_or_insert(ctx.time + self.dt);
        if ctx.time >= deadline {
            return Next::Done;
        }
        match self.inner.next(ctx, rng) {
            Next::Op(p) if p.time >= deadline => Next::Done,
            Next::Pending(t) => Next::Pending(Some(t.map_or(deadline, |t| t.min(deadline)))),
            other => other,
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        self.inner.update(ctx, worker, op)
    }
}

/// Stops after `n` ops.
pub struct Limit<G> {
    left: usize,
    inner: G,
}

/// Builds a [`Limit`].
pub fn limit<G: Generator>(n: usize, inner: G) -> Limit<G> {
    Limit { left: n, inner }
}

impl<G: Generator> Generator for Limit<G> {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        if self.left == 0 {
            return Next::Done;
        }
        let n = self.inner.next(ctx, rng);
        if matches!(n, Next::Op(_)) {
            self.left -= 1;
        }
        n
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        self.inner.update(ctx, worker, op)
    }
}

/// Waits `dt` nanoseconds from when it is first asked, then is done.
pub struct Sleep {
    dt: u64,
    until: Option<u64>,
}

/// Builds a [`Sleep`].
pub fn sleep(dt: u64) -> Sleep {
    Sleep { dt, until: None }
}

impl Generator for Sleep {
    fn next(&mut self, ctx: &Context, _rng: &mut Rng) -> Next {
        let until = *self.until.get_or_insert(ctx.time + self.dt);
        if ctx.time >= until {
            Next::Done
        } else {
            Next::Pending(Some(until))
        }
    }
}

/// Runs generators one after another; each starts only when every worker is free (Jepsen's
/// `phases`, which synchronizes between phases).
pub struct Phases {
    gens: std::collections::VecDeque<Box<dyn Generator>>,
    started: bool,
}

/// Builds a [`Phases`].
pub fn phases(gens: Vec<Box<dyn Generator>>) -> Phases {
    Phases {
        gens: gens.into(),
        started: false,
    }
}

impl Generator for Phases {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        loop {
            let Some(g) = self.gens.front_mut() else {
                return Next::Done;
            };
            if !self.started {
                if !ctx.everyone_free() {
                    return Next::Pending(None);
                }
                self.started = true;
            }
            match g.next(ctx, rng) {
                Next::Done => {
                    self.gens.pop_front();
                    self.started = false;
                }
                other => return other,
            }
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        if self.started {
            if let Some(g) = self.gens.front_mut() {
                g.update(ctx, worker, op);
            }
        }
    }
}

/// Lets its generator use only client workers (Jepsen's `clients`). It hears the clients' ops
/// and, unlike Jepsen's, the nemesis's completions, so a workload can follow what the faults
/// did (the mirror workload moves its writes with failovers).
pub struct Clients<G>(pub G);

impl<G: Generator> Generator for Clients<G> {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        self.0
            .next(&ctx.restricted(|w| matches!(w, Worker::Client(_))), rng)
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        if matches!(worker, Worker::Client(_)) || op.kind == OpType::Info || burst_end(op).is_some()
        {
            self.0.update(ctx, worker, op)
        }
    }
}

/// Lets its generator use only the nemesis worker (Jepsen's `nemesis`).
pub struct NemesisOnly<G>(pub G);

impl<G: Generator> Generator for NemesisOnly<G> {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        self.0.next(&ctx.restricted(|w| *w == Worker::Nemesis), rng)
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        if worker == Worker::Nemesis {
            self.0.update(ctx, worker, op)
        }
    }
}

/// Lets its generator draw from an RNG of its own instead of the one it is handed.
pub struct OwnRng<G> {
    gen: G,
    rng: Rng,
}

/// Builds an [`OwnRng`].
pub fn own_rng<G: Generator>(rng: Rng, gen: G) -> OwnRng<G> {
    OwnRng { gen, rng }
}

impl<G: Generator> Generator for OwnRng<G> {
    fn next(&mut self, ctx: &Context, _rng: &mut Rng) -> Next {
        self.gen.next(ctx, &mut self.rng)
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        self.gen.update(ctx, worker, op)
    }
}

/// Runs several generators side by side and emits whichever op comes first (Jepsen's `any`).
/// Its generators must use disjoint workers (e.g. [`Clients`] and [`NemesisOnly`]): an op one
/// of them returned is held until its time, and no other generator may claim its worker.
pub struct Any {
    gens: Vec<(Box<dyn Generator>, Option<Planned>, bool)>,
}

/// Builds an [`Any`].
pub fn any(gens: Vec<Box<dyn Generator>>) -> Any {
    Any {
        gens: gens.into_iter().map(|g| (g, None, false)).collect(),
    }
}

impl Generator for Any {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        let mut wake: Option<u64> = None;
        for (g, held, done) in &mut self.gens {
            if held.is_some() || *done {
                continue;
            }
            match g.next(ctx, rng) {
                Next::Op(p) => *held = Some(p),
                Next::Pending(t) => {
                    if let Some(t) = t {
                        wake = Some(wake.map_or(t, |w| w.min(t)));
                    }
                }
                Next::Done => *done = true,
            }
        }
        let earliest = self
            .gens
            .iter()
            .enumerate()
            .filter_map(|(i, (_, held, _))| held.as_ref().map(|p| (p.time, i)))
            .min();
        match earliest {
            Some((_, i)) => Next::Op(self.gens[i].1.take().expect("held op")),
            None if self.gens.iter().all(|(_, _, done)| *done) => Next::Done,
            None => Next::Pending(wake),
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        for (g, _, _) in &mut self.gens {
            g.update(ctx, worker, op);
        }
    }
}

/// Gives every client worker its own generator, made by a function of the worker's index and
/// the number of client workers (Jepsen's `each-thread`). Done when all are done.
pub struct EachWorker<F> {
    make: F,
    gens: BTreeMap<usize, (Box<dyn Generator>, bool)>,
}

/// Builds an [`EachWorker`].
pub fn each_worker<F>(make: F) -> EachWorker<F>
where
    F: FnMut(usize, usize) -> Box<dyn Generator> + Send,
{
    EachWorker {
        make,
        gens: BTreeMap::new(),
    }
}

impl<F> Generator for EachWorker<F>
where
    F: FnMut(usize, usize) -> Box<dyn Generator> + Send,
{
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        let workers = ctx.processes.len();
        for i in 0..workers {
            self.gens
                .entry(i)
                .or_insert_with(|| ((self.make)(i, workers), false));
        }
        let mut wake: Option<u64> = None;
        for i in ctx.free_clients().collect::<Vec<_>>() {
            let (g, done) = self.gens.get_mut(&i).expect("made above");
            if *done {
                continue;
            }
            match g.next(&ctx.restricted(|w| *w == Worker::Client(i)), rng) {
                Next::Op(p) => return Next::Op(p),
                Next::Pending(t) => {
                    if let Some(t) = t {
                        wake = Some(wake.map_or(t, |w| w.min(t)));
                    }
                }
                Next::Done => *done = true,
            }
        }
        if self.gens.values().all(|(_, done)| *done) {
            Next::Done
        } else {
            Next::Pending(wake)
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        if let Worker::Client(i) = worker {
            if let Some((g, _)) = self.gens.get_mut(&i) {
                g.update(ctx, worker, op);
            }
        }
    }
}

/// Gives every client process its own generator, made by a function of the process number
/// (Jepsen's `each-process`): a worker whose op ended `info` runs as a new process and so starts
/// a fresh generator. Done when the generators of all current processes are done.
pub struct EachProcess<F> {
    make: F,
    gens: BTreeMap<u64, (Box<dyn Generator>, bool)>,
}

/// Builds an [`EachProcess`].
pub fn each_process<F>(make: F) -> EachProcess<F>
where
    F: FnMut(u64) -> Box<dyn Generator> + Send,
{
    EachProcess {
        make,
        gens: BTreeMap::new(),
    }
}

impl<F> Generator for EachProcess<F>
where
    F: FnMut(u64) -> Box<dyn Generator> + Send,
{
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        for p in &ctx.processes {
            self.gens
                .entry(*p)
                .or_insert_with(|| ((self.make)(*p), false));
        }
        let mut wake: Option<u64> = None;
        for i in ctx.free_clients().collect::<Vec<_>>() {
            let (g, done) = self.gens.get_mut(&ctx.processes[i]).expect("made above");
            if *done {
                continue;
            }
            match g.next(&ctx.restricted(|w| *w == Worker::Client(i)), rng) {
                Next::Op(p) => return Next::Op(p),
                Next::Pending(t) => {
                    if let Some(t) = t {
                        wake = Some(wake.map_or(t, |w| w.min(t)));
                    }
                }
                Next::Done => *done = true,
            }
        }
        let all_done = ctx
            .processes
            .iter()
            .all(|p| self.gens.get(p).is_some_and(|(_, done)| *done));
        if all_done {
            Next::Done
        } else {
            Next::Pending(wake)
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        if let (Worker::Client(_), Process::Client(p)) = (worker, op.process) {
            if let Some((g, _)) = self.gens.get_mut(&p) {
                g.update(ctx, worker, op);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::simulate;
    use crate::op::{OpType, Outcome};
    use serde_json::json;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn counter_gen() -> impl Generator {
        let mut n = 0;
        from_fn(move |_ctx, _w, rng| {
            n += 1;
            let f = if rng.random_bool(0.5) { "send" } else { "poll" };
            Some(Invocation {
                f: f.into(),
                value: json!(n),
            })
        })
    }

    fn ok_after(ms: u64) -> impl FnMut(&Invocation) -> (Outcome, serde_json::Value, u64) {
        move |op| (Outcome::Ok, op.value.clone(), ms * MS)
    }

    #[tokio::test(start_paused = true)]
    async fn a_generator_with_its_own_rng_draws_the_same_whatever_the_runners_seed() {
        fn gen() -> impl Generator {
            time_limit(S, stagger(10 * MS, counter_gen()))
        }
        async fn run(seed: u64) -> Vec<Op> {
            let mut g = own_rng(nemesis_rng(7), gen());
            simulate(&mut g, 5, seed, 10_000, ok_after(3)).await
        }
        let a = run(1).await;
        assert!(a.len() > 50, "{}", a.len());
        assert_eq!(a, run(2).await);
        // The nemesis's stream is not the test RNG itself.
        assert_ne!(a, simulate(&mut gen(), 5, 7, 10_000, ok_after(3)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_seed_gives_the_same_history_and_another_seed_does_not() {
        async fn run(seed: u64) -> Vec<Op> {
            let mut g = time_limit(2 * S, stagger(10 * MS, counter_gen()));
            simulate(&mut g, 5, seed, 10_000, ok_after(3)).await
        }
        let a = run(7).await;
        assert!(a.len() > 100, "{}", a.len());
        assert_eq!(a, run(7).await);
        assert_ne!(a, run(8).await);
    }

    #[tokio::test(start_paused = true)]
    async fn stagger_sets_the_mean_rate_and_time_limit_ends_it() {
        let mut g = time_limit(10 * S, stagger(10 * MS, counter_gen()));
        let h = simulate(&mut g, 10, 1, 100_000, ok_after(1)).await;
        let invokes = h.iter().filter(|o| o.kind == OpType::Invoke).count();
        // About 100 ops/s for 10 s.
        assert!((800..1200).contains(&invokes), "{invokes}");
        assert!(h
            .iter()
            .filter(|o| o.kind == OpType::Invoke)
            .all(|o| o.time < 10 * S));
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_whose_op_ends_info_gets_a_new_process() {
        let mut g = limit(4, counter_gen());
        let mut k = 0;
        let h = simulate(&mut g, 1, 3, 100, move |op| {
            k += 1;
            let outcome = if k == 2 { Outcome::Info } else { Outcome::Ok };
            (outcome, op.value.clone(), MS)
        })
        .await;
        let procs: Vec<(OpType, Process)> = h.iter().map(|o| (o.kind, o.process)).collect();
        assert_eq!(
            procs,
            vec![
                (OpType::Invoke, Process::Client(0)),
                (OpType::Ok, Process::Client(0)),
                (OpType::Invoke, Process::Client(0)),
                (OpType::Info, Process::Client(0)),
                (OpType::Invoke, Process::Client(1)),
                (OpType::Ok, Process::Client(1)),
                (OpType::Invoke, Process::Client(1)),
                (OpType::Ok, Process::Client(1)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn phases_wait_for_every_worker_before_the_next_phase() {
        let first = limit(3, counter_gen());
        let second = limit(
            1,
            from_fn(|_, _, _| {
                Some(Invocation {
                    f: "final".into(),
                    value: json!(null),
                })
            }),
        );
        let mut g = phases(vec![Box::new(first), Box::new(second)]);
        let h = simulate(&mut g, 3, 1, 100, |op| {
            let latency = if op.f == "final" { MS } else { 50 * MS };
            (Outcome::Ok, op.value.clone(), latency)
        })
        .await;
        let final_invoke = h.iter().position(|o| o.f == "final").unwrap();
        let completions_before = h[..final_invoke]
            .iter()
            .filter(|o| o.kind != OpType::Invoke)
            .count();
        assert_eq!(completions_before, 3, "{h:#?}");
    }

    #[tokio::test(start_paused = true)]
    async fn any_interleaves_clients_and_the_nemesis() {
        let clients = Clients(time_limit(S, stagger(10 * MS, counter_gen())));
        let nemesis = NemesisOnly(phases(vec![
            Box::new(sleep(300 * MS)),
            Box::new(nemesis_once("start-partition", json!({}))),
            Box::new(sleep(300 * MS)),
            Box::new(nemesis_once("stop-partition", json!({}))),
        ]));
        let mut g = any(vec![Box::new(clients), Box::new(nemesis)]);
        let h = simulate(&mut g, 2, 1, 10_000, ok_after(2)).await;
        let nem: Vec<(&str, OpType, u64)> = h
            .iter()
            .filter(|o| o.process == Process::Nemesis)
            .map(|o| (o.f.as_str(), o.kind, o.time / (100 * MS)))
            .collect();
        assert_eq!(nem.len(), 4, "{nem:?}");
        assert_eq!(nem[0].0, "start-partition");
        assert_eq!(nem[2].0, "stop-partition");
        assert!(nem[0].2 >= 3 && nem[2].2 >= 6, "{nem:?}");
        assert!(h.iter().any(|o| o.process == Process::Client(0)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_nemesis_op_asking_for_a_burst_unstaggers_the_clients_until_it_ends() {
        // 100 ms between client ops on average, except for the second after the nemesis's op.
        let clients = Clients(time_limit(4 * S, stagger(100 * MS, counter_gen())));
        let nemesis = NemesisOnly(phases(vec![
            Box::new(sleep(2 * S)),
            Box::new(nemesis_once("kill", json!({BURST_KEY: 1000}))),
        ]));
        let mut g = any(vec![Box::new(clients), Box::new(nemesis)]);
        let h = simulate(&mut g, 4, 1, 100_000, ok_after(2)).await;
        let burst_at = h
            .iter()
            .find(|o| o.process == Process::Nemesis)
            .map(|o| o.time)
            .unwrap();
        let between = |from: u64, to: u64| {
            h.iter()
                .filter(|o| o.process != Process::Nemesis && o.kind == OpType::Invoke)
                .filter(|o| o.time >= from && o.time < to)
                .count()
        };
        let calm = between(burst_at - S, burst_at);
        let burst = between(burst_at, burst_at + S);
        let after = between(burst_at + S + 10 * MS, burst_at + 2 * S);
        assert!((3..=20).contains(&calm), "{calm}");
        assert!(
            burst > 10 * calm,
            "{burst} ops in the burst, {calm} in a calm second"
        );
        assert!(after <= 20, "{after} ops in the second after the burst");
    }

    #[tokio::test(start_paused = true)]
    async fn each_process_starts_over_for_a_process_that_crashed() {
        let mut g = each_process(|p| {
            Box::new(limit(
                2,
                from_fn(move |_, _, _| {
                    Some(Invocation {
                        f: "read".into(),
                        value: json!(p),
                    })
                }),
            )) as Box<dyn Generator>
        });
        let mut n = 0;
        let h = simulate(&mut g, 1, 1, 100, move |op| {
            n += 1;
            let outcome = if n == 1 { Outcome::Info } else { Outcome::Ok };
            (outcome, op.value.clone(), MS)
        })
        .await;
        let invoked: Vec<(Process, serde_json::Value)> = h
            .iter()
            .filter(|o| o.kind == OpType::Invoke)
            .map(|o| (o.process, o.value.clone()))
            .collect();
        // Process 0 crashed after one op; process 1 gets its own two ops.
        assert_eq!(
            invoked,
            vec![
                (Process::Client(0), json!(0)),
                (Process::Client(1), json!(1)),
                (Process::Client(1), json!(1)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn each_worker_gives_every_worker_its_own_schedule() {
        let mut g = each_worker(|i, n| {
            Box::new(limit(
                2,
                from_fn(move |_, _, _| {
                    Some(Invocation {
                        f: "poll".into(),
                        value: json!({"worker": i, "of": n}),
                    })
                }),
            )) as Box<dyn Generator>
        });
        let h = simulate(&mut g, 3, 1, 100, ok_after(1)).await;
        for i in 0..3u64 {
            let mine: Vec<&Op> = h
                .iter()
                .filter(|o| o.kind == OpType::Invoke && o.process == Process::Client(i))
                .collect();
            assert_eq!(mine.len(), 2);
            assert!(mine
                .iter()
                .all(|o| o.value == json!({"worker": i, "of": 3})));
        }
    }
}
