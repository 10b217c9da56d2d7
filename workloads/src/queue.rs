//! The queue workload: clients send unique integers to topic-partitions and poll them back from
//! per-process positions, the way Jepsen's Kafka test does with assigned consumers. Every value is
//! written once, so the checker can name the send behind every record it sees.
//!
//! Main phase: a mix of `send` (1 to `max_values_per_send` fresh integers, acks=all) and `poll`
//! (from the process's position in that partition, sometimes seeking back). Final phase: with
//! fresh clients, each worker reads its share of the partitions from offset 0 up to the high
//! watermark.
//!
//! Two modes make the clients behave as Kafka's own do by default. `--producer idempotent`: each
//! process takes a producer id (InitProducerId) and numbers its batches per partition; a send
//! whose answer is lost or retriable is sent again, unchanged, within its op, as an idempotent
//! producer retries, so the broker must deduplicate it. `--consumer group`: each process is a
//! member of one consumer group (see [`crate::group`]); polls become `group-poll`s of the
//! partitions the group assigned it, from the group's committed offsets, and `commit`s commit
//! its positions. Now and then a member `stall`s: it stops heartbeating for longer than the
//! session timeout, as a consumer stuck processing a batch does, and its next group op is a
//! commit sent straight from the membership it had, as such a consumer commits on waking. The
//! coordinator must fence it (its generation ended when it was expired): a zombie's commit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use rand::RngExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_checkers::{PollValue, Record, SendValue};
use tidemark_harness::client::{Client, ClientContext};
use tidemark_harness::generator::{self, Context, Generator, Next, Planned, Rng, Worker};
use tidemark_harness::kafka::{
    encode_idempotent_batch, error_name, ClusterMetadata, Connection, KafkaError,
    ParseResponseErrorCode, ProducerIdentity, ResponseError, READ_ONLY_TOPIC,
};
use tidemark_harness::op::{Completion, Invocation, Op, OpType, Outcome, Process};
use tidemark_harness::workload::{SetupContext, Workload};

use crate::group::{GroupError, GroupMember};

/// How sends are made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProducerMode {
    /// One attempt per send, no producer id: what was acknowledged is all the client knows.
    #[default]
    Plain,
    /// A producer id per process, a sequence per partition, retried sends (Kafka's default
    /// producer since 3.0).
    Idempotent,
}

/// How polls are made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsumerMode {
    /// Each poll names its partition and offset (assign and seek).
    #[default]
    Assign,
    /// Polls read the partitions a consumer group assigned, from its committed offsets.
    Group,
}

/// The consumer group of `--consumer group`.
pub const GROUP: &str = "tidemark";

/// The queue workload's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueOptions {
    /// Topic names.
    pub topics: Vec<String>,
    /// Partitions per topic.
    pub partitions: i32,
    /// Replicas per partition.
    pub replication_factor: i16,
    /// The most values one send carries.
    pub max_values_per_send: usize,
    /// Share of main-phase ops that are sends (the rest are polls).
    pub send_fraction: f64,
    /// Chance that a poll seeks back to an earlier offset instead of reading on.
    pub seek_back_probability: f64,
    /// Chance that a poll carries a leader epoch one below the latest its client knows (a client
    /// whose metadata refresh was lost): a broker must fence it unless it still leads in that
    /// epoch. Absent in older runs: none.
    #[serde(default)]
    pub stale_epoch_probability: f64,
    /// The most bytes one poll asks for.
    pub poll_max_bytes: i32,
    /// How long a poll lets the broker wait for data.
    pub poll_max_wait: Duration,
    /// How sends are made.
    #[serde(default)]
    pub producer: ProducerMode,
    /// How polls are made.
    #[serde(default)]
    pub consumer: ConsumerMode,
    /// With a group consumer, the share of polls that commit instead.
    #[serde(default = "default_commit_fraction")]
    pub commit_fraction: f64,
    /// With a group consumer, the mean time between member stalls (zero: none; absent in older
    /// runs: none).
    #[serde(default)]
    pub stall_every: Duration,
    /// Topic-level configs the topics are created with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub topic_configs: BTreeMap<String, String>,
}

fn default_commit_fraction() -> f64 {
    0.25
}

impl QueueOptions {
    /// Two topics of two partitions, each with `replication_factor` replicas.
    pub fn new(replication_factor: i16) -> Self {
        QueueOptions {
            topics: vec!["t0".into(), "t1".into()],
            partitions: 2,
            replication_factor,
            max_values_per_send: 3,
            send_fraction: 0.5,
            seek_back_probability: 1.0 / 16.0,
            stale_epoch_probability: 1.0 / 16.0,
            poll_max_bytes: 64 * 1024,
            poll_max_wait: Duration::from_millis(100),
            producer: ProducerMode::Plain,
            consumer: ConsumerMode::Assign,
            commit_fraction: default_commit_fraction(),
            stall_every: Duration::from_secs(10),
            topic_configs: BTreeMap::new(),
        }
    }

    /// Every (topic, partition).
    pub fn partitions(&self) -> Vec<(String, i32)> {
        self.topics
            .iter()
            .flat_map(|t| (0..self.partitions).map(move |p| (t.clone(), p)))
            .collect()
    }
}

/// The queue workload.
#[derive(Debug, Clone)]
pub struct Queue {
    options: QueueOptions,
    name: &'static str,
}

impl Queue {
    /// A queue workload with `options`.
    pub fn new(options: QueueOptions) -> Self {
        Queue {
            options,
            name: "queue",
        }
    }

    /// The queue under another workload's name (the checkers pick their checks by it).
    pub fn named(options: QueueOptions, name: &'static str) -> Self {
        Queue { options, name }
    }
}

impl Workload for Queue {
    fn name(&self) -> &'static str {
        self.name
    }

    fn options(&self) -> Value {
        serde_json::to_value(&self.options).unwrap_or(Value::Null)
    }

    fn setup<'a>(&'a self, cx: SetupContext<'a>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(create_topics(&cx.clusters[0], &self.options))
    }

    fn open(&self, clusters: &[ClientContext], node: usize) -> Box<dyn Client> {
        Box::new(QueueClient::new(
            clusters[0].clone(),
            node,
            self.options.clone(),
        ))
    }

    fn generator(&self) -> Box<dyn Generator> {
        Box::new(QueueGen::new(self.options.clone()))
    }

    fn final_generator(&self) -> Box<dyn Generator> {
        let parts = self.options.partitions();
        Box::new(generator::each_worker(move |worker, workers| {
            let mine: Vec<(String, i32)> = parts
                .iter()
                .enumerate()
                .filter(|(i, _)| i % workers == worker)
                .map(|(_, tp)| tp.clone())
                .collect();
            Box::new(Drain::new(mine)) as Box<dyn Generator>
        }))
    }
}

/// Waits until the cluster of `conn` reports `wanted` brokers, or five seconds; returns how many
/// it reports. A broker listens before it registers with the controller, and topics created
/// before all have registered would be placed on fewer.
pub async fn wait_for_brokers(conn: &mut Connection, wanted: usize) -> anyhow::Result<usize> {
    let mut brokers = 0;
    for attempt in 0.. {
        brokers = conn.metadata(Some(&[])).await?.brokers.len();
        if brokers >= wanted || attempt == 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(brokers)
}

/// Waits until the cluster reports enough brokers for the replication factor, creates the
/// topics through the first node, and waits until every replica of every partition knows its
/// leader. The caller bounds the time.
pub async fn create_topics(cx: &ClientContext, o: &QueueOptions) -> anyhow::Result<()> {
    let first = &cx.nodes[0];
    let mut conn = Connection::connect(cx.dialer.clone(), first.addr, cx.timeout).await?;
    let brokers = wait_for_brokers(&mut conn, o.replication_factor as usize).await?;
    for t in &o.topics {
        let code = conn
            .create_topic_with(t, o.partitions, o.replication_factor, &o.topic_configs)
            .await?;
        match code.err() {
            None | Some(ResponseError::TopicAlreadyExists) => {}
            Some(ResponseError::InvalidReplicationFactor) => anyhow::bail!(
                "creating topic {t} with replication factor {}: the cluster reports {brokers} \
                 broker(s); use a smaller --replication-factor",
                o.replication_factor
            ),
            Some(_) => {
                anyhow::bail!("creating topic {t} on {}: {}", first.name, error_name(code))
            }
        }
    }
    let meta = loop {
        let meta = conn.metadata(Some(&o.topics)).await?;
        if all_led(&meta, o) {
            break meta;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let replicas: std::collections::BTreeSet<i32> = meta
        .topics
        .values()
        .flat_map(|(_, parts)| parts.values().flat_map(|p| p.replicas.iter().copied()))
        .collect();
    for id in replicas {
        let node = cx
            .node_by_id(id)
            .ok_or_else(|| anyhow::anyhow!("replica {id} is not a node of the test"))?;
        let mut conn = Connection::connect(cx.dialer.clone(), node.addr, cx.timeout).await?;
        while !all_led(&conn.metadata(Some(&o.topics)).await?, o) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Whether every partition of every topic has a leader in `meta`.
fn all_led(meta: &ClusterMetadata, o: &QueueOptions) -> bool {
    o.topics
        .iter()
        .all(|t| (0..o.partitions).all(|p| meta.leader(t, p).is_some()))
}

/// How a produce error code ends a send: `fail` only when the broker rejected the batch before
/// appending it (READ_ONLY_TOPIC: a mirror topic takes no client writes); anything that may have
/// been appended (or that we do not know) is `info`. NOT_LEADER_OR_FOLLOWER is `info` because a
/// leader may append and then lose leadership before answering (KAFKA-13574).
pub fn produce_outcome(code: i16) -> Outcome {
    use ResponseError::*;
    if code == READ_ONLY_TOPIC {
        return Outcome::Fail;
    }
    match code.err() {
        None => Outcome::Ok,
        Some(
            CorruptMessage
            | UnknownTopicOrPartition
            | LeaderNotAvailable
            | MessageTooLarge
            | InvalidTopicException
            | RecordListTooLarge
            | NotEnoughReplicas
            | InvalidRequiredAcks
            | TopicAuthorizationFailed
            | InvalidTimestamp
            | UnsupportedVersion
            | InvalidRecord,
        ) => Outcome::Fail,
        Some(_) => Outcome::Info,
    }
}

/// A client for one process: follows Metadata to each partition's leader, one connection per
/// broker, one request at a time.
pub struct QueueClient {
    cx: ClientContext,
    home: usize,
    options: QueueOptions,
    metadata: Option<ClusterMetadata>,
    conns: BTreeMap<i32, Connection>,
    /// The timeout of each request: the op's own with one attempt per op, shorter when an op
    /// may need several (retried idempotent sends, joining a group).
    request_timeout: Duration,
    /// The idempotent producer's id, once InitProducerId gave one.
    producer: Option<ProducerIdentity>,
    /// The next sequence number of each partition this producer wrote.
    sequences: BTreeMap<(String, i32), i32>,
    /// The consumer-group member, with `--consumer group`.
    member: Option<GroupMember>,
}

/// Why an op could not be sent, or what happened to it.
struct Failure {
    outcome: Outcome,
    node: Option<String>,
    error: String,
}

impl QueueClient {
    /// A client of `cx` asking node `home` first, for `options`' topics.
    pub fn new(cx: ClientContext, home: usize, options: QueueOptions) -> Self {
        let several =
            options.producer == ProducerMode::Idempotent || options.consumer == ConsumerMode::Group;
        let request_timeout = if several { cx.timeout / 3 } else { cx.timeout };
        let member = (options.consumer == ConsumerMode::Group).then(|| {
            GroupMember::new(
                GROUP.to_string(),
                options.topics.clone(),
                options.partitions(),
            )
        });
        QueueClient {
            cx,
            home,
            options,
            metadata: None,
            conns: BTreeMap::new(),
            request_timeout,
            producer: None,
            sequences: BTreeMap::new(),
            member,
        }
    }

    /// How long the steps of one op may take together, leaving the runner's op timeout room.
    fn op_budget(&self) -> Duration {
        self.cx.timeout * 4 / 5
    }

    /// Metadata that names a leader for every partition, asking the home node first and then
    /// the others (as a Kafka client walks its bootstrap servers).
    async fn refresh_metadata(&mut self) -> Result<(), Failure> {
        let mut last = String::new();
        let n = self.cx.nodes.len();
        for k in 0..n {
            let node = &self.cx.nodes[(self.home + k) % n];
            let attempt = async {
                let mut c =
                    Connection::connect(self.cx.dialer.clone(), node.addr, self.request_timeout)
                        .await?;
                c.metadata(Some(&self.options.topics)).await
            };
            match attempt.await {
                Ok(m) if all_led(&m, &self.options) => {
                    self.metadata = Some(m);
                    return Ok(());
                }
                Ok(m) => {
                    last = format!("{}: no leader for some partition", node.name);
                    self.metadata.get_or_insert(m);
                }
                Err(e) => last = format!("{}: {e}", node.name),
            }
        }
        if self.metadata.is_some() {
            return Ok(());
        }
        Err(Failure {
            outcome: Outcome::Fail,
            node: None,
            error: format!("no metadata: {last}"),
        })
    }

    /// The leader's broker id, node name and a connection to it. Nothing has been sent to the
    /// partition when this fails, so failures here are definite.
    async fn leader(&mut self, topic: &str, partition: i32) -> Result<(i32, String), Failure> {
        if self.metadata.is_none() {
            self.refresh_metadata().await?;
        }
        let meta = self.metadata.as_ref().expect("refreshed above");
        let Some(id) = meta.leader(topic, partition) else {
            self.metadata = None;
            return Err(Failure {
                outcome: Outcome::Fail,
                node: None,
                error: format!("no leader for {topic}/{partition} in metadata"),
            });
        };
        let Some(node) = self.cx.node_by_id(id).cloned() else {
            self.metadata = None;
            return Err(Failure {
                outcome: Outcome::Fail,
                node: None,
                error: format!("leader {id} of {topic}/{partition} is not a node of the test"),
            });
        };
        if self.conns.get(&id).is_none_or(|c| c.is_broken()) {
            let c = Connection::connect(self.cx.dialer.clone(), node.addr, self.request_timeout)
                .await
                .map_err(|e| Failure {
                    outcome: if e.maybe_sent() {
                        Outcome::Info
                    } else {
                        Outcome::Fail
                    },
                    node: Some(node.name.clone()),
                    error: e.to_string(),
                })?;
            self.conns.insert(id, c);
        }
        Ok((id, node.name))
    }

    fn lost(&mut self, id: i32, node: String, e: KafkaError) -> Failure {
        self.conns.remove(&id);
        Failure {
            outcome: if e.maybe_sent() {
                Outcome::Info
            } else {
                Outcome::Fail
            },
            node: Some(node),
            error: e.to_string(),
        }
    }

    async fn send(&mut self, v: &Value) -> Result<(Value, String), Failure> {
        let send: SendValue = parse_value("send", v)?;
        if self.options.producer == ProducerMode::Idempotent {
            return self.send_idempotent(send).await;
        }
        let partition = partition_index(send.partition)?;
        let (id, node) = self.leader(&send.topic, partition).await?;
        let conn = self.conns.get_mut(&id).expect("connected in leader()");
        let r = match conn.produce(&send.topic, partition, &send.values, -1).await {
            Ok(r) => r,
            Err(e) => return Err(self.lost(id, node, e)),
        };
        match produce_outcome(r.error_code) {
            Outcome::Ok => {
                let done = SendValue {
                    offset: Some(r.base_offset),
                    ..send
                };
                Ok((to_value(&done), node))
            }
            outcome => {
                self.metadata = None;
                Err(Failure {
                    outcome,
                    node: Some(node),
                    error: error_name(r.error_code),
                })
            }
        }
    }

    /// This process's producer id, asking the nodes from home on.
    async fn producer_identity(&mut self) -> Result<ProducerIdentity, Failure> {
        if let Some(p) = self.producer {
            return Ok(p);
        }
        let mut last = String::from("no nodes");
        let n = self.cx.nodes.len();
        for k in 0..n {
            let node = &self.cx.nodes[(self.home + k) % n];
            let attempt = async {
                let mut c =
                    Connection::connect(self.cx.dialer.clone(), node.addr, self.request_timeout)
                        .await?;
                c.init_producer_id().await
            };
            match attempt.await {
                Ok(Ok(p)) => {
                    self.producer = Some(p);
                    self.sequences.clear();
                    return Ok(p);
                }
                Ok(Err(code)) => {
                    last = format!("{}: InitProducerId {}", node.name, error_name(code))
                }
                Err(e) => last = format!("{}: InitProducerId: {e}", node.name),
            }
        }
        Err(Failure {
            outcome: Outcome::Fail,
            node: None,
            error: format!("no producer id: {last}"),
        })
    }

    /// An idempotent send: one batch with this producer's id, epoch and the partition's next
    /// sequence, sent again unchanged after a lost answer or a retriable error until it is
    /// answered or the op's budget is spent (as Kafka's producer retries until
    /// `delivery.timeout.ms`). The broker keeps one copy whatever the attempts.
    async fn send_idempotent(&mut self, send: SendValue) -> Result<(Value, String), Failure> {
        let partition = partition_index(send.partition)?;
        let deadline = Instant::now() + self.op_budget();
        let producer = self.producer_identity().await?;
        let key = (send.topic.clone(), partition);
        let sequence = self.sequences.get(&key).copied().unwrap_or(0);
        let batch =
            encode_idempotent_batch(&send.values, producer, sequence).map_err(|e| Failure {
                outcome: Outcome::Fail,
                node: None,
                error: e,
            })?;
        // Whether some attempt may have been appended: then giving up is `info`.
        let mut maybe_appended = false;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last = match self.leader(&send.topic, partition).await {
                Err(f) => f,
                Ok((id, node)) => {
                    let conn = self.conns.get_mut(&id).expect("connected in leader()");
                    match conn
                        .produce_batch(&send.topic, partition, batch.clone(), -1)
                        .await
                    {
                        Err(e) => {
                            maybe_appended |= e.maybe_sent();
                            self.lost(id, node, e)
                        }
                        Ok(r) => match idempotent_outcome(r.error_code) {
                            Retry::Done => {
                                let next = sequence.wrapping_add(send.values.len() as i32);
                                self.sequences.insert(key, next);
                                let done = IdempotentSendDone {
                                    send: SendValue {
                                        offset: (r.base_offset >= 0).then_some(r.base_offset),
                                        ..send
                                    },
                                    attempts,
                                };
                                return Ok((to_value(&done), node));
                            }
                            Retry::Again => {
                                maybe_appended |= produce_outcome(r.error_code) == Outcome::Info;
                                self.metadata = None;
                                Failure {
                                    outcome: Outcome::Info,
                                    node: Some(node),
                                    error: error_name(r.error_code),
                                }
                            }
                            Retry::Fenced => {
                                // The producer's state on the broker is gone or ahead of ours:
                                // start over with a new producer id, as Kafka's producer does.
                                self.producer = None;
                                return Err(Failure {
                                    outcome: if maybe_appended {
                                        Outcome::Info
                                    } else {
                                        Outcome::Fail
                                    },
                                    node: Some(node),
                                    error: error_name(r.error_code),
                                });
                            }
                            Retry::Never => {
                                let outcome = match produce_outcome(r.error_code) {
                                    Outcome::Fail if !maybe_appended => Outcome::Fail,
                                    _ => Outcome::Info,
                                };
                                return Err(Failure {
                                    outcome,
                                    node: Some(node),
                                    error: error_name(r.error_code),
                                });
                            }
                        },
                    }
                }
            };
            if Instant::now() + Duration::from_millis(100) >= deadline {
                return Err(Failure {
                    outcome: if maybe_appended {
                        Outcome::Info
                    } else {
                        Outcome::Fail
                    },
                    node: last.node,
                    error: format!("{} (after {attempts} attempts)", last.error),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs a group step within the op's budget; one cut short forgets the connections it may
    /// have left mid-request.
    async fn within_budget<T>(
        &mut self,
        step: impl AsyncFnOnce(&mut Self) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let budget = self.op_budget();
        match tokio::time::timeout(budget, step(self)).await {
            Ok(r) => r,
            Err(_) => {
                self.conns.clear();
                if let Some(m) = self.member.as_mut() {
                    m.drop_connection();
                }
                Err(Failure {
                    outcome: Outcome::Fail,
                    node: None,
                    error: format!("group step not done within {budget:?}"),
                })
            }
        }
    }

    /// The group member, joined, with a heartbeat sent when one was due.
    async fn joined_member(&mut self) -> Result<&mut GroupMember, Failure> {
        let (cx, home, timeout) = (self.cx.clone(), self.home, self.cx.timeout * 3 / 4);
        let member = self.member.as_mut().ok_or_else(|| Failure {
            outcome: Outcome::Fail,
            node: None,
            error: "this test's consumers are not in a group".into(),
        })?;
        let definite = |e: GroupError| Failure {
            outcome: Outcome::Fail,
            node: None,
            error: e.error,
        };
        member
            .heartbeat_if_due(&cx, home, timeout)
            .await
            .map_err(definite)?;
        member
            .ensure_joined(&cx, home, timeout)
            .await
            .map_err(definite)?;
        Ok(member)
    }

    /// A `group-poll`: joins (or rejoins) the group, then reads the next assigned partition
    /// from the member's position and moves the position past what it read. A read observes
    /// and changes nothing the checker judges, so every failure is `fail`.
    async fn group_poll(&mut self, v: &Value) -> Result<(Value, String), Failure> {
        let _: GroupOp = parse_value("group-poll", v)?;
        self.within_budget(async |c: &mut Self| {
            let member = c.joined_member().await?;
            let membership = member.membership().cloned().expect("joined");
            let Some(((topic, partition), from)) = member.next_partition() else {
                return Err(Failure {
                    outcome: Outcome::Fail,
                    node: None,
                    error: "no partitions assigned to this member".into(),
                });
            };
            let poll = to_value(&PollValue {
                topic: topic.clone(),
                partition: partition.into(),
                from,
                records: Vec::new(),
                high_watermark: None,
                leader_epoch: None,
                local_log_start: None,
                stale_epoch: false,
            });
            let (value, node) = c.poll(&poll).await.map_err(|f| Failure {
                outcome: Outcome::Fail,
                ..f
            })?;
            let done: PollValue = parse_value("poll", &value)?;
            if let Some(last) = done.records.last() {
                c.member
                    .as_mut()
                    .expect("a group client")
                    .advance(&(topic, partition), last.offset + 1);
            }
            let mut value = value;
            let object = value.as_object_mut().expect("a poll value is an object");
            object.insert("group".into(), GROUP.into());
            object.insert("member".into(), membership.member_id.into());
            object.insert("generation".into(), membership.generation.into());
            Ok((value, node))
        })
        .await
    }

    /// A `stall`: the member, joined, stops heartbeating and invoking for the op's `ms` (at
    /// most the op's budget). The generator makes its next group op an `after_stall` commit.
    async fn stall(&mut self, v: &Value) -> Result<(Value, String), Failure> {
        let stall: StallOp = parse_value("stall", v)?;
        let (budget, start) = (self.op_budget(), Instant::now());
        let membership = self
            .within_budget(async |c: &mut Self| Ok(c.joined_member().await?.membership().cloned()))
            .await?
            .expect("joined");
        if membership.assignment.is_empty() {
            return Err(Failure {
                outcome: Outcome::Fail,
                node: None,
                error: "no partitions assigned to this member: it would commit nothing".into(),
            });
        }
        let ms = Duration::from_millis(stall.ms).min(budget.saturating_sub(start.elapsed()));
        tokio::time::sleep(ms).await;
        let done = StallDone {
            group: GROUP.into(),
            member: membership.member_id,
            generation: membership.generation,
            ms: ms.as_millis() as u64,
        };
        Ok((to_value(&done), String::new()))
    }

    /// A `commit`: commits every assigned partition's position in the member's generation. One
    /// `after_stall` goes straight out from the membership the member had, without the
    /// heartbeat that would tell it the group moved on (unless it is not a member at all).
    async fn commit(&mut self, v: &Value) -> Result<(Value, String), Failure> {
        let op: GroupOp = parse_value("commit", v)?;
        self.within_budget(async |c: &mut Self| {
            let zombie =
                op.after_stall && c.member.as_ref().is_some_and(|m| m.membership().is_some());
            if !zombie {
                c.joined_member().await?;
            }
            let (cx, home, timeout) = (c.cx.clone(), c.home, c.cx.timeout * 3 / 4);
            let member = c.member.as_mut().ok_or_else(|| Failure {
                outcome: Outcome::Fail,
                node: None,
                error: "this test's consumers are not in a group".into(),
            })?;
            match member.commit(&cx, home, timeout).await {
                Ok((m, offsets)) => {
                    let done = CommitDone {
                        group: GROUP.into(),
                        member: m.member_id,
                        generation: m.generation,
                        after_stall: op.after_stall,
                        offsets: offsets
                            .into_iter()
                            .map(|(topic, partition, offset)| CommittedOffset {
                                topic,
                                partition: partition.into(),
                                offset,
                            })
                            .collect(),
                    };
                    Ok((to_value(&done), String::new()))
                }
                Err(e) => Err(Failure {
                    outcome: if e.maybe_applied {
                        Outcome::Info
                    } else {
                        Outcome::Fail
                    },
                    node: None,
                    error: e.error,
                }),
            }
        })
        .await
    }

    async fn poll(&mut self, v: &Value) -> Result<(Value, String), Failure> {
        let poll: PollValue = parse_value("poll", v)?;
        let partition = partition_index(poll.partition)?;
        let (id, node) = self.leader(&poll.topic, partition).await?;
        let known = self
            .metadata
            .as_ref()
            .and_then(|m| m.leader_epoch(&poll.topic, partition))
            .unwrap_or(-1);
        // Any epoch below the leader's is fenced (KIP-320), so one below the latest known
        // stands for whatever older metadata a client may hold.
        let stale = poll.stale_epoch && known >= 1;
        let epoch = if stale { known - 1 } else { known };
        let (max_bytes, max_wait) = (self.options.poll_max_bytes, self.options.poll_max_wait);
        let tiered = self
            .options
            .topic_configs
            .get("remote.storage.enable")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let conn = self.conns.get_mut(&id).expect("connected in leader()");
        // Where the leader's local log starts, so the history can tell remote reads: asked first,
        // as it only moves up. Not knowing it costs the poll nothing.
        let local_log_start = if tiered {
            match conn.list_offsets(&poll.topic, partition, -4).await {
                Ok((0, offset, _)) => Some(offset),
                Ok(_) => None,
                Err(e) => return Err(self.lost(id, node, e)),
            }
        } else {
            None
        };
        let r = match conn
            .fetch(
                &poll.topic,
                partition,
                poll.from,
                epoch,
                max_bytes,
                max_wait,
            )
            .await
        {
            Ok(r) => r,
            Err(e) => return Err(self.lost(id, node, e)),
        };
        if r.error_code.err().is_some() {
            // A read that returned an error observed nothing and changed nothing. A stale
            // epoch fenced is what the client asked for: its metadata stays.
            if !(stale && r.error_code.err() == Some(ResponseError::FencedLeaderEpoch)) {
                self.metadata = None;
            }
            return Err(Failure {
                outcome: Outcome::Fail,
                node: Some(node),
                error: error_name(r.error_code),
            });
        }
        let mut records = Vec::with_capacity(r.records.len());
        let mut unparsed_records = Vec::new();
        for rec in &r.records {
            let text = rec.value.as_deref().map(String::from_utf8_lossy);
            let epoch = i64::from(rec.leader_epoch);
            match text.as_deref().and_then(|t| t.parse::<i64>().ok()) {
                Some(value) => records.push(Record::new(rec.offset, value, epoch)),
                None => unparsed_records.push((rec.offset, text.map(String::from), epoch)),
            }
        }
        let done = PollDone {
            poll: PollValue {
                high_watermark: Some(r.high_watermark),
                leader_epoch: r.leader_epoch.map(i64::from),
                local_log_start,
                stale_epoch: stale,
                ..poll
            },
            records,
            unparsed_records,
        };
        Ok((to_value(&done), node))
    }
}

/// What to do after an idempotent send's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Appended, now or by an earlier attempt (DUPLICATE_SEQUENCE_NUMBER).
    Done,
    /// Send the same batch again.
    Again,
    /// The producer id or epoch is no longer the broker's, or a sequence went missing.
    Fenced,
    /// An error no retry mends.
    Never,
}

/// How an idempotent producer treats a produce error code (Kafka's retriable errors retry).
fn idempotent_outcome(code: i16) -> Retry {
    use ResponseError::*;
    match code.err() {
        None | Some(DuplicateSequenceNumber) => Retry::Done,
        Some(
            NotLeaderOrFollower
            | LeaderNotAvailable
            | NotEnoughReplicas
            | NotEnoughReplicasAfterAppend
            | RequestTimedOut
            | NetworkException
            | UnknownTopicOrPartition
            | FencedLeaderEpoch
            | UnknownLeaderEpoch
            | KafkaStorageError
            | CorruptMessage,
        ) => Retry::Again,
        Some(OutOfOrderSequenceNumber | InvalidProducerEpoch | UnknownProducerId) => Retry::Fenced,
        Some(_) => Retry::Never,
    }
}

/// An idempotent send's completion value: the send's, plus how many times the batch was sent.
#[derive(Serialize)]
struct IdempotentSendDone {
    #[serde(flatten)]
    send: SendValue,
    attempts: u32,
}

/// The invocation value of `group-poll` and `commit`: the group, and for the commit a stalled
/// member makes on waking, `after_stall`.
#[derive(Debug, Serialize, Deserialize)]
struct GroupOp {
    group: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    after_stall: bool,
}

/// The invocation value of `stall`: the group, and how long the member stalls.
#[derive(Debug, Serialize, Deserialize)]
struct StallOp {
    group: String,
    ms: u64,
}

/// A `stall`'s completion value: the membership the member stalled in, and how long it did.
#[derive(Debug, Serialize, Deserialize)]
struct StallDone {
    group: String,
    member: String,
    generation: i32,
    ms: u64,
}

/// One committed offset of a `commit`'s completion.
#[derive(Debug, Serialize, Deserialize)]
struct CommittedOffset {
    topic: String,
    partition: i64,
    offset: i64,
}

/// A `commit`'s completion value.
#[derive(Debug, Serialize, Deserialize)]
struct CommitDone {
    group: String,
    member: String,
    generation: i32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    after_stall: bool,
    offsets: Vec<CommittedOffset>,
}

/// A poll's completion value: the invocation's [`PollValue`] with its high watermark, the
/// records (written even when there are none, unlike an invocation's), and beside the spec's
/// fields, for people, the records whose value is not a decimal integer (no send of this workload
/// wrote them) as `[offset, text, leader_epoch]`.
#[derive(Serialize)]
struct PollDone {
    #[serde(flatten)]
    poll: PollValue,
    records: Vec<Record>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unparsed_records: Vec<(i64, Option<String>, i64)>,
}

/// The op value as the typed value of op `f`; a value that is not one fails the op.
fn parse_value<T: serde::de::DeserializeOwned>(f: &str, v: &Value) -> Result<T, Failure> {
    T::deserialize(v).map_err(|e| Failure {
        outcome: Outcome::Fail,
        node: None,
        error: format!("not a {f} value ({e}): {v}"),
    })
}

/// A partition number as Kafka's 32-bit index.
fn partition_index(partition: i64) -> Result<i32, Failure> {
    i32::try_from(partition).map_err(|_| Failure {
        outcome: Outcome::Fail,
        node: None,
        error: format!("partition {partition} is out of range"),
    })
}

/// An op value as JSON; the workload's values are plain data, so this cannot fail.
fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("queue op values serialize")
}

/// A `send` of `values` to a partition.
fn send_op(topic: &str, partition: i32, values: Vec<i64>) -> Invocation {
    Invocation {
        f: "send".into(),
        value: to_value(&SendValue {
            topic: topic.to_string(),
            partition: partition.into(),
            values,
            offset: None,
        }),
    }
}

/// A `poll` of a partition from offset `from`.
fn poll_op(topic: &str, partition: i32, from: i64, stale_epoch: bool) -> Invocation {
    Invocation {
        f: "poll".into(),
        value: to_value(&PollValue {
            topic: topic.to_string(),
            partition: partition.into(),
            from,
            records: Vec::new(),
            high_watermark: None,
            leader_epoch: None,
            local_log_start: None,
            stale_epoch,
        }),
    }
}

/// A `group-poll` or `commit` of the test's group.
fn group_op(f: &str, after_stall: bool) -> Invocation {
    Invocation {
        f: f.into(),
        value: to_value(&GroupOp {
            group: GROUP.into(),
            after_stall,
        }),
    }
}

/// A `stall` of a member for `ms`.
fn stall_op(ms: u64) -> Invocation {
    Invocation {
        f: "stall".into(),
        value: to_value(&StallOp {
            group: GROUP.into(),
            ms,
        }),
    }
}

/// The value of a completed poll, when it is one.
fn completed_poll(op: &Op) -> Option<PollValue> {
    if op.f != "poll" || op.kind != OpType::Ok {
        return None;
    }
    PollValue::deserialize(&op.value).ok()
}

impl Client for QueueClient {
    fn invoke<'a>(&'a mut self, op: &'a Invocation) -> BoxFuture<'a, Completion> {
        Box::pin(async move {
            let result = match op.f.as_str() {
                "send" => self.send(&op.value).await,
                "poll" => self.poll(&op.value).await,
                "group-poll" => self.group_poll(&op.value).await,
                "commit" => self.commit(&op.value).await,
                "stall" => self.stall(&op.value).await,
                other => Err(Failure {
                    outcome: Outcome::Fail,
                    node: None,
                    error: format!("the queue client does not know op {other:?}"),
                }),
            };
            match result {
                Ok((value, node)) => Completion {
                    outcome: Outcome::Ok,
                    value,
                    node: (!node.is_empty()).then_some(node),
                    error: None,
                },
                Err(f) => Completion {
                    outcome: f.outcome,
                    value: op.value.clone(),
                    node: f.node,
                    error: Some(f.error),
                },
            }
        })
    }
}

/// The main phase's schedule: sends of fresh integers and polls from per-process positions.
pub struct QueueGen {
    options: QueueOptions,
    partitions: Vec<(String, i32)>,
    next_value: i64,
    positions: BTreeMap<(u64, usize), i64>,
    /// Until when a nemesis op asked for a burst: only sends meanwhile.
    burst_until: u64,
    /// When the next member stall is due (ns into the phase), with a group consumer.
    next_stall: u64,
    /// The stall in flight, if any, with the gap to leave after it once it succeeds (ns).
    stall_in_flight: Option<u64>,
    /// Processes whose member stalled and has not committed since, with the generation it
    /// stalled in and when the stall ended: their next group op is that commit, once an op of
    /// the group has shown a newer generation (or [`ZOMBIE_WAIT`] passed); until then they
    /// only send, as a consumer whose processing is stuck.
    stalled: BTreeMap<u64, (i64, u64)>,
    /// The highest generation an `ok` group op showed.
    generation: i64,
}

/// How long a stalled member waits at most for the group to show a newer generation before it
/// commits all the same.
const ZOMBIE_WAIT: Duration = Duration::from_secs(5);

/// How long a member stalls: past the session timeout, so the coordinator expires it and the
/// group moves on to a generation without it.
const STALL: Duration =
    Duration::from_millis(crate::group::SESSION_TIMEOUT.as_millis() as u64 + 1000);

impl QueueGen {
    /// A schedule over `options`' topic-partitions.
    pub fn new(options: QueueOptions) -> Self {
        let next_stall = options.stall_every.as_nanos() as u64;
        QueueGen {
            partitions: options.partitions(),
            options,
            next_value: 0,
            positions: BTreeMap::new(),
            burst_until: 0,
            next_stall,
            stall_in_flight: None,
            stalled: BTreeMap::new(),
            generation: -1,
        }
    }

    fn index_of(&self, poll: &PollValue) -> Option<usize> {
        self.partitions
            .iter()
            .position(|(t, p)| *t == poll.topic && i64::from(*p) == poll.partition)
    }
}

impl Generator for QueueGen {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        let Some(worker) = ctx.random_free_client(rng) else {
            return Next::Pending(None);
        };
        let tp = rng.random_range(0..self.partitions.len());
        let (topic, partition) = self.partitions[tp].clone();
        let bursting = ctx.time < self.burst_until;
        let process = match ctx.process(worker) {
            Process::Client(p) => Some(p),
            _ => None,
        };
        let zombie = process.and_then(|p| self.stalled.get(&p).map(|z| (p, *z)));
        let waking = zombie.is_some_and(|(_, (generation, since))| {
            self.generation > generation || ctx.time >= since + ZOMBIE_WAIT.as_nanos() as u64
        });
        let op = if bursting
            || (zombie.is_some() && !waking)
            || rng.random_bool(self.options.send_fraction)
        {
            let n = rng.random_range(1..=self.options.max_values_per_send.max(1)) as i64;
            let values: Vec<i64> = (self.next_value..self.next_value + n).collect();
            self.next_value += n;
            send_op(&topic, partition, values)
        } else if self.options.consumer == ConsumerMode::Group {
            let every = self.options.stall_every.as_nanos() as u64;
            if let Some((p, _)) = zombie {
                self.stalled.remove(&p);
                group_op("commit", true)
            } else if every > 0 && self.stall_in_flight.is_none() && ctx.time >= self.next_stall {
                self.stall_in_flight = Some(rng.random_range(every / 2..=every + every / 2));
                stall_op(STALL.as_millis() as u64)
            } else if rng.random_bool(self.options.commit_fraction) {
                group_op("commit", false)
            } else {
                group_op("group-poll", false)
            }
        } else {
            let Process::Client(process) = ctx.process(worker) else {
                return Next::Pending(None);
            };
            let mut from = self.positions.get(&(process, tp)).copied().unwrap_or(0);
            if from > 0 && rng.random_bool(self.options.seek_back_probability) {
                from = rng.random_range(0..from);
            }
            let p = self.options.stale_epoch_probability;
            poll_op(&topic, partition, from, p > 0.0 && rng.random_bool(p))
        };
        Next::Op(Planned {
            worker,
            time: ctx.time,
            op,
        })
    }

    fn update(&mut self, ctx: &Context, _worker: Worker, op: &Op) {
        if let Some(end) = generator::burst_end(op) {
            self.burst_until = self.burst_until.max(end);
        }
        if op.f == "stall" && op.kind != OpType::Invoke {
            let gap = self.stall_in_flight.take().unwrap_or_default();
            match (op.process, op.kind) {
                (Process::Client(p), OpType::Ok) => {
                    let generation = op.value["generation"].as_i64().unwrap_or(-1);
                    self.stalled.insert(p, (generation, ctx.time));
                    self.next_stall = ctx.time + gap;
                }
                // A member that could not stall (no partitions, not joined) leaves it to the
                // next one.
                _ => self.next_stall = ctx.time,
            }
        }
        if op.kind == OpType::Ok && (op.f == "group-poll" || op.f == "commit") {
            if let Some(g) = op.value["generation"].as_i64() {
                self.generation = self.generation.max(g);
            }
        }
        let Some(poll) = completed_poll(op) else {
            return;
        };
        let (Process::Client(process), Some(tp)) = (op.process, self.index_of(&poll)) else {
            return;
        };
        if let Some(last) = poll.records.last() {
            self.positions.insert((process, tp), last.offset + 1);
        }
    }
}

/// One worker's final reads: each of its partitions from offset 0 until a poll reaches the high
/// watermark. Failed polls are retried after a short pause; the runner's time limit bounds it.
pub struct Drain {
    partitions: Vec<(String, i32)>,
    current: usize,
    position: i64,
    retry_at: u64,
}

/// Pause before retrying a failed final read.
const DRAIN_RETRY: u64 = 100_000_000;

impl Drain {
    /// Reads `partitions` in order.
    pub fn new(partitions: Vec<(String, i32)>) -> Self {
        Drain {
            partitions,
            current: 0,
            position: 0,
            retry_at: 0,
        }
    }
}

impl Generator for Drain {
    fn next(&mut self, ctx: &Context, _rng: &mut Rng) -> Next {
        let Some((topic, partition)) = self.partitions.get(self.current) else {
            return Next::Done;
        };
        if ctx.time < self.retry_at {
            return Next::Pending(Some(self.retry_at));
        }
        let Some(&worker) = ctx.free.first() else {
            return Next::Pending(None);
        };
        Next::Op(Planned {
            worker,
            time: ctx.time,
            op: poll_op(topic, *partition, self.position, false),
        })
    }

    fn update(&mut self, ctx: &Context, _worker: Worker, op: &Op) {
        match op.kind {
            OpType::Invoke => {}
            OpType::Ok => {
                let poll = completed_poll(op);
                if let Some(last) = poll.as_ref().and_then(|p| p.records.last()) {
                    self.position = last.offset + 1;
                }
                if self.position >= poll.and_then(|p| p.high_watermark).unwrap_or(0) {
                    self.current += 1;
                    self.position = 0;
                }
            }
            OpType::Fail | OpType::Info => self.retry_at = ctx.time + DRAIN_RETRY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use tidemark_harness::interpreter::simulate;

    fn opts() -> QueueOptions {
        QueueOptions::new(3)
    }

    #[test]
    fn produce_errors_are_fail_only_when_nothing_was_appended() {
        let outcome = |e: ResponseError| produce_outcome(e.code());
        assert_eq!(produce_outcome(0), Outcome::Ok);
        assert_eq!(outcome(ResponseError::NotEnoughReplicas), Outcome::Fail);
        assert_eq!(
            outcome(ResponseError::UnknownTopicOrPartition),
            Outcome::Fail
        );
        assert_eq!(outcome(ResponseError::CorruptMessage), Outcome::Fail);
        assert_eq!(outcome(ResponseError::InvalidRecord), Outcome::Fail);
        assert_eq!(outcome(ResponseError::NotLeaderOrFollower), Outcome::Info);
        assert_eq!(
            outcome(ResponseError::NotEnoughReplicasAfterAppend),
            Outcome::Info
        );
        assert_eq!(outcome(ResponseError::RequestTimedOut), Outcome::Info);
        assert_eq!(produce_outcome(READ_ONLY_TOPIC), Outcome::Fail);
        assert_eq!(error_name(READ_ONLY_TOPIC), "ReadOnlyTopic");
        assert_eq!(produce_outcome(-1), Outcome::Info);
        assert_eq!(produce_outcome(9999), Outcome::Info);
    }

    #[test]
    fn op_values_have_the_spec_shape() {
        assert_eq!(
            send_op("t", 1, vec![4, 5]).value,
            serde_json::json!({"topic": "t", "partition": 1, "values": [4, 5]})
        );
        let poll = poll_op("t", 0, 7, false);
        assert_eq!(
            poll.value,
            serde_json::json!({"topic": "t", "partition": 0, "from": 7})
        );
        // An empty read still records its records; unreadable values sit beside them.
        let done = to_value(&PollDone {
            poll: PollValue {
                high_watermark: Some(7),
                ..PollValue::deserialize(&poll.value).unwrap()
            },
            records: Vec::new(),
            unparsed_records: vec![(7, Some("x".into()), 2)],
        });
        assert_eq!(
            done,
            serde_json::json!({"topic": "t", "partition": 0, "from": 7, "records": [],
                               "high_watermark": 7, "unparsed_records": [[7, "x", 2]]})
        );
        let mut op = Op::new(0, Process::Client(0), OpType::Ok, "poll", done);
        assert_eq!(completed_poll(&op).unwrap().high_watermark, Some(7));
        op.kind = OpType::Fail;
        assert!(completed_poll(&op).is_none());
    }

    /// A fake log per partition, so polls return what sends wrote.
    fn answer(
        logs: &mut BTreeMap<(String, i64), Vec<i64>>,
        op: &Invocation,
    ) -> (Outcome, Value, u64) {
        let done = if op.f == "send" {
            let send = SendValue::deserialize(&op.value).unwrap();
            let log = logs
                .entry((send.topic.clone(), send.partition))
                .or_default();
            let offset = Some(log.len() as i64);
            log.extend(&send.values);
            to_value(&SendValue { offset, ..send })
        } else {
            let poll = PollValue::deserialize(&op.value).unwrap();
            let log = logs
                .entry((poll.topic.clone(), poll.partition))
                .or_default();
            let records = (poll.from..)
                .zip(log.iter().skip(poll.from as usize))
                .take(5)
                .map(|(o, x)| Record::new(o, *x, 0))
                .collect();
            let high_watermark = Some(log.len() as i64);
            to_value(&PollValue {
                records,
                high_watermark,
                ..poll
            })
        };
        (Outcome::Ok, done, 1_000_000)
    }

    #[tokio::test(start_paused = true)]
    async fn sends_carry_unique_values_and_polls_move_forward_per_process() {
        let mut logs = BTreeMap::new();
        let mut g = QueueGen::new(opts());
        let h = simulate(&mut g, 4, 11, 2000, move |op| answer(&mut logs, op)).await;
        let mut seen = BTreeSet::new();
        for op in h
            .iter()
            .filter(|o| o.f == "send" && o.kind == OpType::Invoke)
        {
            for v in op.value["values"].as_array().unwrap() {
                assert!(seen.insert(v.as_i64().unwrap()), "value {v} sent twice");
            }
        }
        assert!(seen.len() > 500);
        let polls_from_later_offsets = h
            .iter()
            .filter(|o| o.f == "poll" && o.kind == OpType::Invoke)
            .filter(|o| o.value["from"].as_i64().unwrap() > 0)
            .count();
        assert!(polls_from_later_offsets > 100, "{polls_from_later_offsets}");
    }

    #[tokio::test(start_paused = true)]
    async fn members_stall_one_at_a_time_and_commit_first_once_the_group_moved_on() {
        let options = QueueOptions {
            consumer: ConsumerMode::Group,
            stall_every: Duration::from_millis(200),
            ..opts()
        };
        let mut g = QueueGen::new(options);
        // Every third stall fails at once (a member with no partitions): the next group op
        // stalls instead. Each stall moves the group on to a new generation, which the other
        // members' group ops show.
        let mut asked = 0;
        let h = simulate(&mut g, 3, 3, 6000, move |op| {
            let mut value = op.value.clone();
            match op.f.as_str() {
                "stall" => {
                    asked += 1;
                    value["generation"] = serde_json::json!(asked);
                    match asked % 3 {
                        0 => (Outcome::Fail, op.value.clone(), 1_000_000),
                        _ => (Outcome::Ok, value, 150_000_000),
                    }
                }
                "group-poll" | "commit" => {
                    value["generation"] = serde_json::json!(asked + 1);
                    (Outcome::Ok, value, 1_000_000)
                }
                _ => (Outcome::Ok, value, 1_000_000),
            }
        })
        .await;
        let mut in_flight = 0;
        let mut owes: BTreeMap<u64, i64> = BTreeMap::new();
        let mut shown = -1;
        let (mut stalls, mut zombie_commits) = (0, 0);
        let mut failed_at = None;
        for op in &h {
            let Process::Client(p) = op.process else {
                continue;
            };
            let group_op = ["stall", "commit", "group-poll"].contains(&op.f.as_str());
            match (op.f.as_str(), op.kind) {
                ("stall", OpType::Invoke) => {
                    in_flight += 1;
                    assert_eq!(in_flight, 1, "two stalls at once at op {}", op.index);
                }
                ("stall", OpType::Ok) => {
                    in_flight -= 1;
                    stalls += 1;
                    owes.insert(p, op.value["generation"].as_i64().unwrap());
                }
                ("group-poll" | "commit", OpType::Ok) => {
                    shown = shown.max(op.value["generation"].as_i64().unwrap());
                }
                ("stall", _) => {
                    in_flight -= 1;
                    failed_at = Some(op.index);
                }
                _ => {}
            }
            if op.kind == OpType::Invoke && group_op {
                // After a failed stall the next group op is a stall (or a commit owed).
                if let Some(at) = failed_at.take() {
                    assert!(
                        op.f == "stall" || owes.contains_key(&p),
                        "op {} after {at}",
                        op.index
                    );
                }
            }
            if op.kind == OpType::Invoke && group_op && op.f != "stall" {
                let after_stall = op.value["after_stall"] == true;
                let stalled_in = owes.remove(&p);
                assert_eq!(after_stall, stalled_in.is_some(), "op {}", op.index);
                assert!(!after_stall || op.f == "commit", "op {}", op.index);
                // The zombie commits once the group has shown it moved on.
                assert!(stalled_in.is_none_or(|g| shown > g), "op {}", op.index);
                zombie_commits += usize::from(after_stall);
            }
        }
        // About one stall per 200 ms of the run's time, each 150 ms long.
        let seconds = h.last().unwrap().time as f64 / 1e9;
        assert!(
            stalls as f64 >= seconds / 0.5,
            "{stalls} stalls in {seconds} s"
        );
        assert!(zombie_commits + 1 >= stalls, "{zombie_commits} of {stalls}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_schedule_is_deterministic_for_a_seed() {
        async fn run(seed: u64) -> Vec<Op> {
            let mut logs = BTreeMap::new();
            let mut g = QueueGen::new(opts());
            simulate(&mut g, 3, seed, 300, move |op| answer(&mut logs, op)).await
        }
        assert_eq!(run(5).await, run(5).await);
        assert_ne!(run(5).await, run(6).await);
    }

    #[tokio::test(start_paused = true)]
    async fn the_final_reads_cover_every_partition_up_to_its_high_watermark() {
        let mut logs = BTreeMap::new();
        for (i, (t, p)) in opts().partitions().into_iter().enumerate() {
            logs.insert((t, p as i64), (0..(7 * i as i64 + 3)).collect::<Vec<_>>());
        }
        let expected = logs.clone();
        let mut g = Queue::new(opts()).final_generator();
        let h = simulate(g.as_mut(), 3, 1, 1000, move |op| answer(&mut logs, op)).await;
        let mut read: BTreeMap<(String, i64), BTreeSet<i64>> = BTreeMap::new();
        for op in h.iter().filter(|o| o.kind == OpType::Ok) {
            let key = (
                op.value["topic"].as_str().unwrap().to_string(),
                op.value["partition"].as_i64().unwrap(),
            );
            for r in op.value["records"].as_array().unwrap() {
                read.entry(key.clone())
                    .or_default()
                    .insert(r[0].as_i64().unwrap());
            }
        }
        for (key, log) in expected {
            assert_eq!(read[&key].len(), log.len(), "{key:?}");
        }
    }
}
