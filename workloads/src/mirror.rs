//! The mirror workload: the queue workload over two clusters, the second mirroring the first's
//! topics (KIP-1279), while failovers and failbacks move which one takes writes.
//!
//! Setup creates the topics on the first cluster (A), registers the mirrors both ways (`a-to-b`
//! on B, `b-to-a` on A, for failbacks) and starts B mirroring A's topics, waiting until every
//! partition mirrors. Every op names its cluster (`"cluster": "b"` in its value, which the
//! history line records): sends go to the cluster the generator believes writable (and, after a
//! failover until the failback, a share to the cluster failed over from), polls to either at
//! random. The generator learns the writable cluster from the nemesis's `failover`
//! (`to` takes writes) and `failback` (`from` keeps them) infos, and from a send refused with
//! READ_ONLY_TOPIC (the other cluster, then); whatever it believes, each send's outcome is what
//! the broker answered. Final reads drain every partition on both clusters, after the nemesis
//! has settled the mirror (a failed-over one failed back) and waited for it to catch up.

use futures::future::BoxFuture;
use rand::RngExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tidemark_harness::client::{Client, ClientContext};
use tidemark_harness::generator::{self, Context, Generator, Next, Rng, Worker};
use tidemark_harness::kafka::Connection;
use tidemark_harness::mirror::MirrorState;
use tidemark_harness::op::{Completion, Invocation, Op, OpType, Outcome};
use tidemark_harness::workload::{SetupContext, Workload};

use crate::queue::{create_topics, wait_for_brokers, Drain, QueueClient, QueueGen, QueueOptions};

/// How long setup waits for B's partitions to mirror.
const MIRRORING_WITHIN: std::time::Duration = std::time::Duration::from_secs(25);

/// The mirror workload's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MirrorOptions {
    /// The queue's topics, partitions and op mix.
    #[serde(flatten)]
    pub queue: QueueOptions,
    /// `mirror.support.unclean.leader.election` of every topic at the start (set through the
    /// brokers' default, so mirror topics have it too).
    pub unclean_support: bool,
    /// Share of polls that read the cluster not taking writes.
    pub mirror_poll_fraction: f64,
    /// Between a failover and the next failback, the share of sends still made to the cluster
    /// failed over from, as by clients not yet redirected: acknowledged there and never
    /// mirrored, they are what the failback abandons.
    pub stale_send_fraction: f64,
}

impl MirrorOptions {
    /// The queue's defaults with `replication_factor` replicas, the flag as `unclean_support`.
    pub fn new(replication_factor: i16, unclean_support: bool) -> Self {
        MirrorOptions {
            queue: QueueOptions::new(replication_factor),
            unclean_support,
            mirror_poll_fraction: 0.5,
            stale_send_fraction: 0.2,
        }
    }
}

/// The mirror workload.
#[derive(Debug, Clone)]
pub struct MirrorWorkload {
    options: MirrorOptions,
    source: String,
    destination: String,
}

impl MirrorWorkload {
    /// A mirror workload with `options`: cluster `destination` mirrors `source`, which takes the
    /// first writes.
    pub fn new(options: MirrorOptions, source: &str, destination: &str) -> Self {
        MirrorWorkload {
            options,
            source: source.into(),
            destination: destination.into(),
        }
    }
}

/// The name of the mirror on `destination` copying `source` (as the nemesis names it).
pub fn mirror_name(source: &str, destination: &str) -> String {
    format!("{source}-to-{destination}")
}

impl Workload for MirrorWorkload {
    fn name(&self) -> &'static str {
        "mirror"
    }

    fn options(&self) -> Value {
        serde_json::to_value(&self.options).unwrap_or(Value::Null)
    }

    fn setup<'a>(&'a self, cx: SetupContext<'a>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let find = |name: &str| {
                cx.clusters
                    .iter()
                    .find(|c| c.cluster == name)
                    .ok_or_else(|| anyhow::anyhow!("the mirror workload needs cluster {name}"))
            };
            let (a, b) = (find(&self.source)?, find(&self.destination)?);
            let mirror = cx
                .db
                .as_mirror()
                .ok_or_else(|| anyhow::anyhow!("the database cannot mirror clusters"))?;
            let q = &self.options.queue;
            create_topics(a, q).await?;
            // The mirror creates B's topics with the source's replication factor, capped at the
            // brokers B has registered: all of them must have.
            let mut conn =
                Connection::connect(b.dialer.clone(), b.nodes[0].addr, b.timeout).await?;
            let brokers = wait_for_brokers(&mut conn, q.replication_factor as usize).await?;
            if brokers < q.replication_factor as usize {
                anyhow::bail!(
                    "cluster {} reports {brokers} broker(s), fewer than the replication factor {}",
                    b.cluster,
                    q.replication_factor
                );
            }
            let (ab, ba) = (
                mirror_name(&a.cluster, &b.cluster),
                mirror_name(&b.cluster, &a.cluster),
            );
            mirror.create_mirror(b, &ab, a).await?;
            mirror.create_mirror(a, &ba, b).await?;
            mirror.start_mirror(b, &ab, &q.topics).await?;
            let deadline = tokio::time::Instant::now() + MIRRORING_WITHIN;
            let wanted = q.topics.len() * q.partitions as usize;
            loop {
                let parts = mirror.describe_mirror(b, &ab).await;
                let mirroring = parts.as_ref().is_ok_and(|ps| {
                    ps.len() == wanted && ps.iter().all(|(_, p)| p.state == MirrorState::Mirroring)
                });
                if mirroring {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    anyhow::bail!(
                        "{ab} on cluster {} not mirroring every partition within \
                         {MIRRORING_WITHIN:?}: {parts:?}",
                        b.cluster
                    );
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            // Clients of B find every partition's leader, as on A.
            create_topics(b, q).await
        })
    }

    fn open(&self, clusters: &[ClientContext], node: usize) -> Box<dyn Client> {
        Box::new(MirrorClient {
            clients: clusters
                .iter()
                .map(|cx| {
                    let home = node % cx.nodes.len().max(1);
                    let client = QueueClient::new(cx.clone(), home, self.options.queue.clone());
                    (cx.cluster.clone(), client)
                })
                .collect(),
        })
    }

    fn generator(&self) -> Box<dyn Generator> {
        Box::new(MirrorGen::new(
            self.options.clone(),
            &self.source,
            &self.destination,
        ))
    }

    fn final_generator(&self) -> Box<dyn Generator> {
        let parts = self.options.queue.partitions();
        let clusters = [self.source.clone(), self.destination.clone()];
        Box::new(generator::each_worker(move |worker, workers| {
            let mine: Vec<(String, i32)> = parts
                .iter()
                .enumerate()
                .filter(|(i, _)| i % workers == worker)
                .map(|(_, tp)| tp.clone())
                .collect();
            let per_cluster: Vec<Box<dyn Generator>> = clusters
                .iter()
                .map(|c| {
                    Box::new(OnCluster {
                        cluster: c.clone(),
                        inner: Drain::new(mine.clone()),
                    }) as Box<dyn Generator>
                })
                .collect();
            Box::new(generator::phases(per_cluster)) as Box<dyn Generator>
        }))
    }
}

/// One process's clients, one per cluster; each op goes to the cluster its value names.
struct MirrorClient {
    clients: Vec<(String, QueueClient)>,
}

impl Client for MirrorClient {
    fn invoke<'a>(&'a mut self, op: &'a Invocation) -> BoxFuture<'a, Completion> {
        Box::pin(async move {
            let cluster = op.value.get("cluster").and_then(Value::as_str);
            let Some((_, client)) = self
                .clients
                .iter_mut()
                .find(|(c, _)| Some(c.as_str()) == cluster)
            else {
                let mut c = Completion::new(Outcome::Fail, op.value.clone());
                c.error = Some(format!("op names no cluster of the test: {cluster:?}"));
                return c;
            };
            client.invoke(op).await
        })
    }
}

/// Adds `"cluster": <cluster>` to every op of `inner`.
struct OnCluster<G> {
    cluster: String,
    inner: G,
}

fn on_cluster(mut op: Invocation, cluster: &str) -> Invocation {
    if let Value::Object(m) = &mut op.value {
        m.insert("cluster".into(), json!(cluster));
    }
    op
}

impl<G: Generator> Generator for OnCluster<G> {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        match self.inner.next(ctx, rng) {
            Next::Op(mut p) => {
                p.op = on_cluster(p.op, &self.cluster);
                Next::Op(p)
            }
            other => other,
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        self.inner.update(ctx, worker, op);
    }
}

/// The main phase: the queue's sends and polls, sends to the cluster believed writable, polls to
/// the writable one or (a `mirror_poll_fraction` of them) the other.
pub struct MirrorGen {
    inner: QueueGen,
    writable: String,
    other: String,
    mirror_poll_fraction: f64,
    stale_send_fraction: f64,
    /// The cluster failed over from, until the failback.
    failed_over_from: Option<String>,
}

impl MirrorGen {
    /// Sends start on `writable`; `other` is the mirror.
    pub fn new(options: MirrorOptions, writable: &str, other: &str) -> Self {
        MirrorGen {
            inner: QueueGen::new(options.queue),
            writable: writable.into(),
            other: other.into(),
            mirror_poll_fraction: options.mirror_poll_fraction,
            stale_send_fraction: options.stale_send_fraction,
            failed_over_from: None,
        }
    }

    fn take_writes(&mut self, cluster: &str) {
        if cluster == self.other {
            std::mem::swap(&mut self.writable, &mut self.other);
        }
    }
}

impl Generator for MirrorGen {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        match self.inner.next(ctx, rng) {
            Next::Op(mut p) => {
                let stale = self.failed_over_from.clone();
                let cluster = match (p.op.f.as_str(), stale) {
                    ("poll", _) if rng.random_bool(self.mirror_poll_fraction) => self.other.clone(),
                    ("send", Some(old)) if rng.random_bool(self.stale_send_fraction) => old,
                    _ => self.writable.clone(),
                };
                p.op = on_cluster(p.op, &cluster);
                Next::Op(p)
            }
            other => other,
        }
    }

    fn update(&mut self, ctx: &Context, worker: Worker, op: &Op) {
        self.inner.update(ctx, worker, op);
        let field = |k: &str| op.value.get(k).and_then(Value::as_str).map(str::to_owned);
        match (worker, op.kind, op.f.as_str()) {
            (Worker::Nemesis, OpType::Info, "failover") if op.error.is_none() => {
                if let (Some(from), Some(to)) = (field("from"), field("to")) {
                    self.take_writes(&to);
                    self.failed_over_from = Some(from);
                }
            }
            (Worker::Nemesis, OpType::Info, "failback") => {
                if let Some(from) = field("from") {
                    self.take_writes(&from);
                    self.failed_over_from = None;
                }
            }
            // The cluster it wrote to is a mirror now: the other must have taken over.
            (Worker::Client(_), OpType::Fail, "send")
                if op.error.as_deref() == Some("ReadOnlyTopic")
                    && op.cluster.as_deref() == Some(self.writable.as_str()) =>
            {
                std::mem::swap(&mut self.writable, &mut self.other);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_harness::interpreter::simulate;

    fn gen() -> MirrorGen {
        MirrorGen::new(MirrorOptions::new(3, false), "a", "b")
    }

    #[tokio::test(start_paused = true)]
    async fn sends_go_to_the_writable_cluster_and_polls_read_both() {
        let mut g = gen();
        let h = simulate(&mut g, 3, 4, 400, |op| {
            (Outcome::Ok, op.value.clone(), 1_000_000)
        })
        .await;
        let invokes = h.iter().filter(|o| o.kind == OpType::Invoke);
        let (mut sends_b, mut polls) = (0, [0, 0]);
        for o in invokes {
            let c = o.value["cluster"].as_str().unwrap();
            match (o.f.as_str(), c) {
                ("send", "b") => sends_b += 1,
                ("poll", "a") => polls[0] += 1,
                ("poll", "b") => polls[1] += 1,
                _ => {}
            }
        }
        assert_eq!(sends_b, 0);
        assert!(polls[0] > 20 && polls[1] > 20, "{polls:?}");
    }

    #[test]
    fn failovers_failbacks_and_read_only_answers_move_the_writes() {
        let mut g = gen();
        let ctx = Context::all_free(0, 2);
        let nemesis = |f: &str, v: Value| {
            Op::new(
                1,
                tidemark_harness::op::Process::Nemesis,
                OpType::Info,
                f,
                v,
            )
        };
        g.update(
            &ctx,
            Worker::Nemesis,
            &nemesis("failover", json!({"from": "a", "to": "b"})),
        );
        assert_eq!(g.writable, "b");
        assert_eq!(g.failed_over_from.as_deref(), Some("a"));
        g.update(
            &ctx,
            Worker::Nemesis,
            &nemesis("failback", json!({"from": "b", "to": "a"})),
        );
        assert_eq!(g.writable, "b");
        assert_eq!(g.failed_over_from, None);
        let mut refused = Op::new(
            2,
            tidemark_harness::op::Process::Client(0),
            OpType::Fail,
            "send",
            json!({"cluster": "b"}),
        );
        refused.cluster = Some("b".into());
        refused.error = Some("ReadOnlyTopic".into());
        g.update(&ctx, Worker::Client(0), &refused);
        assert_eq!(g.writable, "a");
        // A refusal from the cluster it no longer writes to changes nothing.
        g.update(&ctx, Worker::Client(0), &refused);
        assert_eq!(g.writable, "a");
        let mut failed_over = nemesis("failover", json!({"from": "a", "to": "b"}));
        failed_over.error = Some("stop mirror a-to-b on b: timed out".into());
        g.update(&ctx, Worker::Nemesis, &failed_over);
        assert_eq!(g.writable, "a");
    }
}
