//! Consumer groups through the group coordinator with real clients: kcat's balanced consumer
//! (`kcat -G`) and confluent-kafka group consumers (librdkafka, through
//! `tests/clients/confluent_group.py`) against real broker processes. A group of three reads
//! 100,000 records from 6 partitions while one member is killed; every record is consumed, the
//! offsets are committed, and the commits survive killing the coordinator's broker.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::client::{create_topic, read_all};
use common::{kcat, BrokerProc, Cluster};
use tidemark_broker::group::{partition_for, OFFSETS_TOPIC};

const T: Duration = Duration::from_secs(60);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/confluent_group.py")
}

/// Runs the confluent-kafka helper to completion and returns its stdout.
fn confluent(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("python3 must be installed");
    assert!(
        out.status.success(),
        "confluent_group.py {args:?} failed ({}); is confluent-kafka installed \
         (pip install -r scripts/python-requirements.txt)?\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A group consumer process writing what it reads to a file.
struct GroupConsumer {
    child: Child,
    out: PathBuf,
}

impl GroupConsumer {
    fn start(bootstrap: &str, topic: &str, group: &str, out: PathBuf) -> Self {
        let child = Command::new("python3")
            .arg(script())
            .args(["consume", bootstrap, topic, group])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 must be installed");
        GroupConsumer { child, out }
    }

    /// The (partition, offset, value) lines read so far.
    fn read(&self) -> Vec<(i32, i64, u64)> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let mut f = l.split(' ');
                Some((
                    f.next()?.parse().ok()?,
                    f.next()?.parse().ok()?,
                    f.next()?.parse().ok()?,
                ))
            })
            .collect()
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM: the consumer closes, committing what it consumed, and leaves the group.
    fn close(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                assert!(status.success(), "consumer exited {status}: {err}");
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("consumer did not close within {T:?}");
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn committed(bootstrap: &str, topic: &str, group: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let out = confluent(&[
        "committed",
        bootstrap,
        topic,
        group,
        &partitions.to_string(),
    ]);
    let v: BTreeMap<String, i64> = serde_json::from_str(out.trim()).unwrap();
    v.into_iter()
        .map(|(k, o)| (k.parse().unwrap(), o))
        .collect()
}

#[test]
fn kcat_balanced_consumers_read_everything_once_committed() {
    let b = BrokerProc::start(&["--override", "group.initial.rebalance.delay.ms=0"]);
    let input: Vec<u8> = (0..2000)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    assert_eq!(create_topic(&b.bootstrap(), "k", 3, 1, &[]), 0);
    kcat(&["-b", &b.bootstrap(), "-P", "-t", "k", "-p", "-1"], &input);
    let consume = || {
        kcat(
            &[
                "-b",
                &b.bootstrap(),
                "-G",
                "kg",
                "k",
                "-e",
                "-q",
                "-X",
                "auto.offset.reset=earliest",
            ],
            b"",
        )
    };
    let first = String::from_utf8(consume()).unwrap();
    let mut seen: Vec<u64> = first.lines().map(|l| l.parse().unwrap()).collect();
    seen.sort();
    assert_eq!(
        seen,
        (0..2000).collect::<Vec<u64>>(),
        "the first member reads every record"
    );
    // kcat commits as it goes and on leaving: the same group starts where it stopped.
    kcat(
        &["-b", &b.bootstrap(), "-P", "-t", "k", "-p", "0"],
        b"2000\n2001\n",
    );
    let second = String::from_utf8(consume()).unwrap();
    let mut rest: Vec<&str> = second.lines().collect();
    rest.sort();
    assert!(
        rest == ["2000", "2001"],
        "the rejoining group must read only what is new, read {} records: {:?}…",
        rest.len(),
        &rest[..rest.len().min(5)]
    );
}

#[test]
fn a_group_of_three_survives_a_killed_member_and_a_killed_coordinator() {
    let mut c = Cluster::start(3, "", &[]);
    let bootstrap = c.running().join(",");
    let (topic, group, n) = ("orders", "billing", 100_000u64);
    assert_eq!(create_topic(&c.addr(1), topic, 6, 3, &[]), 0);
    c.wait_for("every partition led", T, |c| {
        (0..6).all(|p| c.partition_state(topic, p).is_some_and(|(l, _, _)| l > 0))
    });
    confluent(&["produce", &bootstrap, topic, &n.to_string()]);

    let dir = tempfile::tempdir().unwrap();
    let mut consumers: Vec<GroupConsumer> = (0..3)
        .map(|i| {
            GroupConsumer::start(
                &bootstrap,
                topic,
                group,
                dir.path().join(format!("c{i}.txt")),
            )
        })
        .collect();
    let distinct = |cs: &[GroupConsumer]| -> BTreeSet<u64> {
        cs.iter()
            .flat_map(|c| c.read())
            .map(|(_, _, v)| v)
            .collect()
    };
    // Kill a member once it has read something and the group is part way through.
    let deadline = Instant::now() + T;
    while !(consumers[2].read().len() > 1000 && distinct(&consumers).len() as u64 > n / 5) {
        assert!(
            Instant::now() < deadline,
            "the group did not get going: {} read",
            distinct(&consumers).len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    consumers[2].kill9();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let seen = distinct(&consumers).len() as u64;
        if seen == n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {seen} of {n} records consumed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let all: Vec<(i32, i64, u64)> = consumers.iter().flat_map(|c| c.read()).collect();
    assert!(
        all.iter().all(|(_, _, v)| *v < n),
        "no value outside what was produced"
    );
    for c in consumers.iter_mut().take(2) {
        c.close();
    }

    let ends: BTreeMap<i32, i64> = (0..6)
        .map(|p| {
            let (leader, _, _) = c.partition_state(topic, p).unwrap();
            (p, read_all(&c.addr(leader), topic, p).unwrap().1)
        })
        .collect();
    assert_eq!(ends.values().sum::<i64>(), n as i64);
    assert_eq!(
        committed(&bootstrap, topic, group, 6),
        ends,
        "every partition committed to its end"
    );

    // The coordinator is the leader of the group's partition of __consumer_offsets.
    let offsets_partition = partition_for(group, 10);
    let (coordinator, epoch, _) = c.partition_state(OFFSETS_TOPIC, offsets_partition).unwrap();
    c.node(coordinator).kill9();
    c.wait_for("a new coordinator", T, |c| {
        c.partition_state(OFFSETS_TOPIC, offsets_partition)
            .is_some_and(|(l, e, _)| l > 0 && l != coordinator && e > epoch)
    });
    let survivors = c.running().join(",");
    assert_eq!(
        committed(&survivors, topic, group, 6),
        ends,
        "the commits outlive the coordinator that took them"
    );
}
