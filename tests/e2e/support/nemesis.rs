//! Shared by the nemesis tests: a real cluster of brokers in network namespaces with the
//! nemesis beside it, and ways to look at what a fault did to it (TCP reachability, process
//! states, files, logs).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tidemark_harness::broker::{BrokerConfig, TidemarkBroker};
use tidemark_harness::client::ClientContext;
use tidemark_harness::db::Db;
use tidemark_harness::kafka::{Connection, ParseResponseErrorCode};
use tidemark_harness::leftovers;
use tidemark_harness::nemesis::{Nemesis, NemesisContext};
use tidemark_harness::net::Iptables;
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::op::{Completion, Invocation};
use tidemark_harness::probe::await_ready;
use tidemark_harness::remote;
use tidemark_harness::runner::CancellationToken;
use tidemark_harness::runtime::{Node, Runtime};
use tidemark_nemesis::cluster::ClusterView;
use tidemark_nemesis::{Nemeses, NemesisOptions};

/// Where Debian puts libfaketime.
pub const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Brokers on namespace nodes, with a nemesis to throw faults at them.
pub struct Cluster {
    pub runtime: NetnsRuntime,
    pub nodes: Vec<Node>,
    pub db: Arc<TidemarkBroker>,
    pub net: Iptables,
    pub cx: ClientContext,
    pub nemesis: Nemeses,
    pub record: Value,
    pub rt: tokio::runtime::Runtime,
    _work: tempfile::TempDir,
}

impl Cluster {
    /// `n` brokers with `config`, under faketime when asked, serving.
    pub fn start(n: usize, config: BrokerConfig, faketime: bool) -> Self {
        let work = tempfile::tempdir().unwrap();
        let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
        let names: Vec<String> = (1..=n).map(|i| format!("n{i}")).collect();
        let nodes = runtime.create("a", &names).unwrap();
        let record = serde_json::json!({"runtime": runtime.describe()});
        let mut db = TidemarkBroker::new(crate::support::engine::broker(), config, vec![]);
        if faketime {
            db = db.with_faketime(FAKETIME.into());
        }
        for node in &nodes {
            db.setup(node, &nodes).unwrap();
        }
        let cx = ClientContext::new(
            &nodes,
            |n| db.endpoint(n),
            runtime.dialer(),
            Duration::from_secs(5),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(await_ready(
            &cx,
            Duration::from_secs(30),
            &CancellationToken::new(),
        ))
        .unwrap();
        Cluster {
            runtime,
            nodes,
            db: Arc::new(db),
            net: Iptables,
            cx,
            nemesis: Nemeses::new(NemesisOptions {
                seed: 7,
                ..NemesisOptions::default()
            }),
            record,
            rt,
            _work: work,
        }
    }

    /// Performs one nemesis op as the runner would, on a blocking thread.
    pub fn invoke(&self, f: &str, value: Value) -> Completion {
        let op = Invocation {
            f: f.to_string(),
            value,
        };
        let cx = NemesisContext {
            nodes: &self.nodes,
            controllers: &[],
            every_node: &self.nodes,
            db: self.db.as_ref(),
            net: &self.net,
            client: &self.cx,
            clusters: std::slice::from_ref(&self.cx),
        };
        self.nemesis.invoke(&cx, &op)
    }

    /// Performs an op that must succeed; returns its info value.
    pub fn must(&self, f: &str, value: Value) -> Value {
        let done = self.invoke(f, value.clone());
        assert!(done.error.is_none(), "{f} {value}: {:?}", done.error);
        done.value
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    /// Creates a topic through the first node and waits until every partition has a leader
    /// and a full ISR.
    pub fn create_topic(&self, topic: &str, partitions: i32, rf: i16) {
        self.rt.block_on(async {
            let mut c = Connection::connect(
                self.cx.dialer.clone(),
                self.cx.nodes[0].addr,
                self.cx.timeout,
            )
            .await
            .unwrap();
            for _ in 0..50 {
                if c.metadata(Some(&[])).await.unwrap().brokers.len() >= rf as usize {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(
                c.create_topic(topic, partitions, rf).await.unwrap().err(),
                None
            );
        });
        self.wait("a full ISR everywhere", Duration::from_secs(30), |v| {
            v.partitions.iter().filter(|p| p.topic == topic).count() == partitions as usize
                && v.partitions
                    .iter()
                    .filter(|p| p.topic == topic)
                    .all(|p| p.leader.is_some() && p.isr.len() == rf as usize)
        });
    }

    /// The cluster as the nemesis sees it.
    pub fn view(&self) -> ClusterView {
        let cx = NemesisContext {
            nodes: &self.nodes,
            controllers: &[],
            every_node: &self.nodes,
            db: self.db.as_ref(),
            net: &self.net,
            client: &self.cx,
            clusters: std::slice::from_ref(&self.cx),
        };
        ClusterView::read(&cx).unwrap_or_default()
    }

    /// The metadata quorum's active controller and epoch, as the first node that answers
    /// DescribeQuorum tells them.
    pub fn quorum(&self) -> Option<(i32, i32)> {
        self.rt.block_on(async {
            for n in &self.nodes {
                let at = self.db.endpoint(n);
                let Ok(mut c) =
                    Connection::connect(self.cx.dialer.clone(), at, Duration::from_secs(2)).await
                else {
                    continue;
                };
                if let Ok(q) = c.active_controller().await {
                    return Some(q);
                }
            }
            None
        })
    }

    /// Waits until `done` holds for the cluster view.
    pub fn wait(&self, what: &str, timeout: Duration, done: impl Fn(&ClusterView) -> bool) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if done(&self.view()) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} did not happen within {timeout:?}: {:?}",
                self.view()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends `values` (acks=all) to the partition's current leader; true when acknowledged.
    pub fn produce(&self, topic: &str, partition: i32, values: &[i64]) -> bool {
        let Some(leader) = self
            .view()
            .partition(topic, partition)
            .and_then(|p| p.leader.clone())
        else {
            return false;
        };
        let addr = self.db.endpoint(self.node(&leader));
        self.rt.block_on(async {
            let Ok(mut c) =
                Connection::connect(self.cx.dialer.clone(), addr, Duration::from_secs(2)).await
            else {
                return false;
            };
            c.produce(topic, partition, values, -1)
                .await
                .is_ok_and(|r| r.error_code.err().is_none())
        })
    }

    /// Runs a shell command on a node and returns its output.
    pub fn sh(&self, node: &str, cmd: &str) -> String {
        remote::run(self.node(node).remote.as_ref(), cmd).unwrap()
    }

    /// Whether `from` can open a TCP connection to `to`'s broker port within a second.
    pub fn reaches(&self, from: &str, to: &str) -> bool {
        self.reaches_on(from, to, 9092)
    }

    /// Whether a TCP connect from `from` to `to`'s `port` succeeds within a second.
    pub fn reaches_on(&self, from: &str, to: &str, port: u16) -> bool {
        let ip = self.node(to).ip;
        let cmd = format!("timeout 1 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>/dev/null");
        self.node(from).remote.exec(&cmd).unwrap().exit == 0
    }

    /// The broker's pid on a node, from its pid file.
    pub fn pid(&self, node: &str) -> Option<u32> {
        let n = self.node(node);
        std::fs::read_to_string(n.dir.join("broker.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// The scheduler state of a process (`R`, `S`, `T`, ...), if it exists.
    pub fn state(pid: u32) -> Option<char> {
        Self::stat_state(&format!("/proc/{pid}/stat"))
    }

    /// The states of every thread of process `pid`.
    pub fn thread_states(pid: u32) -> Vec<char> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| Self::stat_state(&t.path().join("stat").to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn stat_state(path: &str) -> Option<char> {
        let stat = std::fs::read_to_string(path).ok()?;
        stat[stat.rfind(')')? + 1..].trim_start().chars().next()
    }

    /// The broker log of a node.
    pub fn log(&self, node: &str) -> String {
        std::fs::read_to_string(self.node(node).dir.join("broker.log")).unwrap_or_default()
    }

    /// Stops everything and checks nothing is left.
    pub fn destroy(mut self) {
        self.runtime.destroy().unwrap();
        crate::support::engine::assert_nothing_left(&self.record);
    }
}
