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
use common::{kcat, BrokerProc, Cluster, PYTHON};
use tidemark_broker::group::{partition_for, OFFSETS_TOPIC};
use tidemark_broker::replica::client::KafkaConnection;

const T: Duration = Duration::from_secs(60);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/confluent_group.py")
}

/// Runs the confluent-kafka helper to completion and returns its stdout.
fn confluent(args: &[&str]) -> String {
    let out = Command::new(PYTHON)
        .arg(script())
        .args(args)
        .output()
        .expect("the clients' Python must be installed: run scripts/setup-host");
    assert!(
        out.status.success(),
        "confluent_group.py {args:?} failed ({}); is confluent-kafka installed \
         (scripts/setup-host installs it)?\n{}",
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
        let child = Command::new(PYTHON)
            .arg(script())
            .args(["consume", bootstrap, topic, group])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the clients' Python must be installed: run scripts/setup-host");
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
    // The producer's sticky partitioner may leave a partition empty: nothing was consumed there,
    // so nothing is committed (librdkafka reports -1001, no offset).
    let before = committed(&bootstrap, topic, group, 6);
    for (p, end) in &ends {
        let got = before.get(p).copied();
        assert!(
            got == Some(*end) || (*end == 0 && got.is_some_and(|o| o < 0)),
            "every partition committed to its end: partition {p} at {got:?}, end {end} \
             (committed {before:?}, ends {ends:?})"
        );
    }

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
        before,
        "the commits outlive the coordinator that took them"
    );
}

/// One request over a fresh connection to `addr`.
fn call<R>(addr: &str, version: i16, req: &R) -> R::Response
where
    R: kafka_protocol::protocol::Request + kafka_protocol::protocol::Encodable,
    R::Response: kafka_protocol::protocol::Decodable,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut conn = KafkaConnection::connect(addr, Duration::from_secs(20), "wire-test")
            .await
            .unwrap();
        conn.call(version, req).await.unwrap()
    })
}

#[test]
fn the_coordinator_answers_with_kafkas_errors() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::ResponseError as E;

    let c = Cluster::start(3, "group.initial.rebalance.delay.ms=0\n", &[]);
    assert_eq!(create_topic(&c.addr(1), "t", 1, 3, &[]), 0);
    let s = |v: &str| StrBytes::from_string(v.to_string());
    let group = GroupId(s("wire"));
    let find = FindCoordinatorRequest::default().with_key(s("wire"));
    let deadline = Instant::now() + T;
    let coordinator = loop {
        let r = call(&c.addr(1), 3, &find);
        if r.error_code == 0 {
            break r.node_id.0;
        }
        assert_eq!(r.error_code, E::CoordinatorNotAvailable.code(), "{r:?}");
        assert!(Instant::now() < deadline, "no coordinator: {r:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let txn = call(&c.addr(1), 3, &find.clone().with_key_type(1));
    assert_eq!(txn.error_code, E::InvalidRequest.code());
    assert!(txn.error_message.unwrap().contains("transactions"));

    let join = JoinGroupRequest::default()
        .with_group_id(group.clone())
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(bytes::Bytes::from_static(b"m"))]);
    let other = (1..=3).find(|id| *id != coordinator).unwrap();
    assert_eq!(
        call(&c.addr(other), 5, &join).error_code,
        E::NotCoordinator.code()
    );
    let at = c.addr(coordinator);
    let first = loop {
        let r = call(&at, 5, &join);
        if r.error_code != E::CoordinatorLoadInProgress.code() {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(first.error_code, E::MemberIdRequired.code());
    let member = first.member_id.clone();
    assert!(member.starts_with("wire-test-"), "{member}");
    let hb = |member: &str, generation: i32| {
        call(
            &at,
            4,
            &HeartbeatRequest::default()
                .with_group_id(group.clone())
                .with_member_id(s(member))
                .with_generation_id(generation),
        )
        .error_code
    };
    assert_eq!(hb("nobody", 0), E::UnknownMemberId.code());
    let joined = call(&at, 5, &join.clone().with_member_id(member.clone()));
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    assert_eq!(joined.leader, member);
    let synced = call(
        &at,
        3,
        &SyncGroupRequest::default()
            .with_group_id(group.clone())
            .with_generation_id(1)
            .with_member_id(member.clone())
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(member.clone())
                .with_assignment(bytes::Bytes::from_static(b"all of t"))]),
    );
    assert_eq!(synced.error_code, 0);
    assert_eq!(synced.assignment.as_ref(), b"all of t");
    assert_eq!(hb(&member, 1), 0);
    assert_eq!(hb(&member, 0), E::IllegalGeneration.code());

    let commit = |generation: i32, offset: i64| {
        call(
            &at,
            8,
            &OffsetCommitRequest::default()
                .with_group_id(group.clone())
                .with_generation_id_or_member_epoch(generation)
                .with_member_id(member.clone())
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(TopicName(s("t")))
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(offset),
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(7)
                            .with_committed_offset(offset),
                    ])]),
        )
        .topics[0]
            .partitions
            .iter()
            .map(|p| p.error_code)
            .collect::<Vec<_>>()
    };
    assert_eq!(commit(1, 42), [0, E::UnknownTopicOrPartition.code()]);
    assert_eq!(
        commit(2, 43),
        [
            E::IllegalGeneration.code(),
            E::UnknownTopicOrPartition.code()
        ]
    );
    let fetched = call(
        &at,
        5,
        &OffsetFetchRequest::default()
            .with_group_id(group.clone())
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("t")))
                .with_partition_indexes(vec![0])])),
    );
    assert_eq!(fetched.topics[0].partitions[0].committed_offset, 42);

    let described = call(
        &at,
        5,
        &DescribeGroupsRequest::default().with_groups(vec![group.clone(), GroupId(s("none"))]),
    );
    assert_eq!(described.groups[0].group_state.as_str(), "Stable");
    assert_eq!(described.groups[0].protocol_data.as_str(), "range");
    assert_eq!(described.groups[0].members.len(), 1);
    let listed = call(&at, 4, &ListGroupsRequest::default());
    assert!(listed
        .groups
        .iter()
        .any(|g| g.group_id == group && g.group_state.as_str() == "Stable"));

    let left = call(
        &at,
        3,
        &LeaveGroupRequest::default()
            .with_group_id(group.clone())
            .with_members(vec![
                kafka_protocol::messages::leave_group_request::MemberIdentity::default()
                    .with_member_id(s(&member)),
            ]),
    );
    assert_eq!(left.members[0].error_code, 0);
    assert_eq!(hb(&member, 1), E::UnknownMemberId.code());
}
