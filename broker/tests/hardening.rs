//! Hostile inputs against the real broker binary: a second process on a busy log directory,
//! configuration mistakes, illegal topic names, damaged files in a partition directory, batches
//! that lie about their record count, and client strings that try to break the log.

mod common;

use std::net::TcpStream;
use std::time::Duration;

use common::client::{create_topic, produce, produce_records, read_all};
use common::{api_versions_roundtrip, free_port, BrokerProc};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tidemark_broker::replica::client::KafkaConnection;

const T: Duration = Duration::from_secs(20);
const NOT_LEADER: i16 = ResponseError::NotLeaderOrFollower.code();

/// server.properties of a standalone node with fresh ports, storing data in `log_dirs`.
fn props(host: &str, port: u16, log_dirs: &str) -> String {
    format!(
        "node.id=1\nprocess.roles=broker,controller\nlisteners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{}\ncontroller.listener.names=CONTROLLER\nlog.dirs={log_dirs}\n",
        free_port()
    )
}

/// Produces acks=all once the partition has a leader: after a restart the replica opens only
/// once the broker has caught up with the metadata, and until then the answer is
/// NOT_LEADER_OR_FOLLOWER.
fn produce_when_led(b: &BrokerProc, topic: &str, values: &[i64]) -> Result<i64, i16> {
    let deadline = std::time::Instant::now() + T;
    loop {
        match produce(&b.bootstrap(), topic, 0, values, -1, T) {
            Err(NOT_LEADER) if std::time::Instant::now() < deadline => {}
            other => return other,
        }
    }
}

/// The values of partition 0 of `topic` once it can be read.
fn read_when_led(b: &BrokerProc, topic: &str) -> Vec<i64> {
    let deadline = std::time::Instant::now() + T;
    loop {
        match read_all(&b.bootstrap(), topic, 0) {
            Ok((recs, _)) => return recs.iter().map(|r| r.1).collect(),
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(
                    e == NOT_LEADER || e == -100,
                    "read {topic}: error {e}\n{}",
                    b.log()
                );
            }
            Err(e) => panic!("{topic} is not readable: error {e}\n{}", b.log()),
        }
    }
}

#[test]
fn a_second_broker_on_the_same_log_dir_refuses_to_start_naming_it() {
    let first = BrokerProc::start(&[]);
    let data = first.data_dir();
    let port = free_port();
    let text = props("127.0.0.1", port, &data.display().to_string());
    let mut second = BrokerProc::prepare(tempfile::tempdir().unwrap(), port, &text, &[]);
    second.launch();
    let status = second
        .wait_exit(T)
        .unwrap_or_else(|| panic!("the second broker runs on a busy log dir\n{}", second.log()));
    assert!(!status.success(), "{status}");
    let log = second.log();
    assert!(
        log.contains(&data.display().to_string()) && log.contains("in use by another broker"),
        "{log}"
    );
    let mut s = TcpStream::connect(("127.0.0.1", first.port)).unwrap();
    api_versions_roundtrip(&mut s).expect("the first broker still serves");
}

#[test]
fn a_listener_named_by_host_name_binds_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").display().to_string();
    let port = free_port();
    let text = props("localhost", port, &data);
    let mut b = BrokerProc::prepare(dir, port, &text, &[]);
    b.restart();
    assert_eq!(create_topic(&b.bootstrap(), "named", 1, 1, &[]), 0);
    assert_eq!(
        produce(&b.bootstrap(), "named", 0, &[7], -1, T),
        Ok(0),
        "{}",
        b.log()
    );
}

#[test]
fn a_topic_is_led_where_it_was_created_by_the_time_create_topics_answers() {
    let b = BrokerProc::start(&[]);
    for i in 0..20 {
        let t = format!("fresh-{i}");
        assert_eq!(create_topic(&b.bootstrap(), &t, 1, 1, &[]), 0);
        assert_eq!(produce(&b.bootstrap(), &t, 0, &[i], 1, T), Ok(0), "{t}");
    }
}

#[test]
fn a_key_set_twice_is_refused_naming_both_lines_before_the_data_dir_exists() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let text = format!(
        "{}num.partitions=1\nnum.partitions=3\n",
        props("127.0.0.1", port, &data.display().to_string())
    );
    let mut b = BrokerProc::prepare(dir, port, &text, &[]);
    b.launch();
    let status = b.wait_exit(T).expect("the broker must refuse the file");
    assert_eq!(status.code(), Some(2), "{}", b.log());
    let log = b.log();
    assert!(
        log.contains("server.properties:7")
            && log.contains("`num.partitions`")
            && log.contains("first set on line 6"),
        "{log}"
    );
    assert!(
        !data.exists(),
        "the data dir was created for a refused config"
    );
}

fn name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_string()))
}

/// The error code of a Metadata v12 request for `topic` with auto-creation allowed.
fn metadata_error(addr: &str, topic: &str) -> i16 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = KafkaConnection::connect(addr, T, "test").await.unwrap();
        let req = MetadataRequest::default()
            .with_allow_auto_topic_creation(true)
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(name(topic)))
            ]));
        c.call(12, &req).await.unwrap().topics[0].error_code
    })
}

#[test]
fn illegal_topic_names_get_invalid_topic_exception_and_cannot_split_log_lines() {
    let b = BrokerProc::start(&[]);
    let addr = b.bootstrap();
    let long = "x".repeat(250);
    let illegal = [
        "",
        ".",
        "..",
        "a/b",
        "spa ce",
        long.as_str(),
        "line\nINJECTED log line\0",
    ];
    for t in illegal {
        assert_eq!(
            create_topic(&addr, t, 1, 1, &[]),
            ResponseError::InvalidTopicException.code(),
            "CreateTopics {t:?}"
        );
        assert_eq!(
            metadata_error(&addr, t),
            ResponseError::InvalidTopicException.code(),
            "Metadata {t:?}"
        );
        assert_eq!(
            produce(&addr, t, 0, &[1], 1, T),
            Err(ResponseError::InvalidTopicException.code()),
            "Produce {t:?}"
        );
    }
    // Legal names still auto-create, and unknown ones stay unknown to Produce.
    assert_eq!(metadata_error(&addr, "ok.name_1-x"), 0);
    assert_eq!(
        produce(&addr, "never-created", 0, &[1], 1, T),
        Err(ResponseError::UnknownTopicOrPartition.code())
    );
    let log = b.log();
    assert!(!log.contains('\0'), "a NUL reached the log");
    assert!(
        !log.lines().any(|l| l.starts_with("INJECTED")),
        "a client's newline split a log line:\n{log}"
    );
}

/// A topic `t` with values 0..5 written in one leader epoch and 5..10 in a later one (a
/// standalone broker's restart moves the epoch).
fn two_epochs(b: &mut BrokerProc, t: &str) {
    assert_eq!(create_topic(&b.bootstrap(), t, 1, 1, &[]), 0);
    assert_eq!(produce_when_led(b, t, &[0, 1, 2, 3, 4]), Ok(0));
    b.terminate();
    b.restart();
    assert_eq!(produce_when_led(b, t, &[5, 6, 7, 8, 9]), Ok(5));
    b.terminate();
}

#[test]
fn a_garbage_leader_epoch_checkpoint_is_rebuilt_from_the_batches() {
    let mut b = BrokerProc::start(&[]);
    two_epochs(&mut b, "ep");
    let checkpoint = b.data_dir().join("ep-0").join("leader-epoch-checkpoint");
    let good = std::fs::read_to_string(&checkpoint).unwrap();
    assert_eq!(good.lines().count(), 4, "two epochs: {good}");
    std::fs::write(&checkpoint, b"\x00\xffgarbage\n").unwrap();
    b.restart();
    assert_eq!(read_when_led(&b, "ep"), (0..10).collect::<Vec<_>>());
    let rebuilt = std::fs::read_to_string(&checkpoint).unwrap();
    let entries = |text: &str| text.lines().skip(2).map(String::from).collect::<Vec<_>>();
    assert!(
        entries(&rebuilt).starts_with(&entries(&good)),
        "rebuilt {rebuilt:?}, was {good:?} (plus this run's new epoch)"
    );
    let log = b.log();
    assert!(
        log.contains("leader-epoch-checkpoint is unusable") && log.contains("rebuilt it"),
        "{log}"
    );
    assert_eq!(produce_when_led(&b, "ep", &[10]), Ok(10));
}

#[test]
fn an_invalid_partition_state_file_is_reported() {
    let mut b = BrokerProc::start(&[]);
    two_epochs(&mut b, "ps");
    let state = b.data_dir().join("ps-0").join("partition.state");
    std::fs::write(&state, b"{\"node_id\": 1, \"leader\": ").unwrap();
    b.restart();
    assert_eq!(read_when_led(&b, "ps"), (0..10).collect::<Vec<_>>());
    let log = b.log();
    let reported = log
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("is not a valid partition state"));
    assert!(
        reported.is_some_and(|l| l.contains(&state.display().to_string())),
        "{log}"
    );
}

/// One batch of `values` whose header declares `count` records (with a matching last offset
/// delta and a valid CRC), as a buggy or hostile producer could send.
fn lying_batch(values: &[&[u8]], count: i32) -> Vec<u8> {
    let mut b = tidemark_broker::log::testing::batch(values);
    b[57..61].copy_from_slice(&count.to_be_bytes());
    b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[test]
fn a_batch_whose_record_count_lies_is_refused_as_corrupt() {
    let b = BrokerProc::start(&[]);
    assert_eq!(create_topic(&b.bootstrap(), "rc", 1, 1, &[]), 0);
    assert_eq!(produce_when_led(&b, "rc", &[0]), Ok(0));
    let corrupt = ResponseError::CorruptMessage.code();
    for count in [1, 2, 4, 100] {
        assert_eq!(
            produce_records(
                &b.bootstrap(),
                "rc",
                0,
                lying_batch(&[b"x", b"y", b"z"], count),
                -1,
                T
            ),
            Err(corrupt),
            "declared {count} of 3 records"
        );
    }
    assert_eq!(
        produce(&b.bootstrap(), "rc", 0, &[1], -1, T),
        Ok(1),
        "nothing was appended"
    );
    assert_eq!(read_when_led(&b, "rc"), vec![0, 1]);
}
