//! Hostile inputs against the real broker binary: a second process on a busy log directory,
//! configuration mistakes, illegal topic names, damaged files in a partition directory, batches
//! that lie about their record count, and client strings that try to break the log.

mod common;

use std::net::TcpStream;
use std::time::Duration;

use common::client::{create_topic, produce};
use common::{api_versions_roundtrip, free_port, BrokerProc};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tidemark_broker::errors;
use tidemark_broker::replica::client::KafkaConnection;

const T: Duration = Duration::from_secs(20);

/// server.properties of a standalone node with fresh ports, storing data in `log_dirs`.
fn props(host: &str, port: u16, log_dirs: &str) -> String {
    format!(
        "node.id=1\nprocess.roles=broker,controller\nlisteners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{}\ncontroller.listener.names=CONTROLLER\nlog.dirs={log_dirs}\n",
        free_port()
    )
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
    // The replica opens just after CreateTopics returns; until then the answer is NOT_LEADER.
    let deadline = std::time::Instant::now() + T;
    let written = loop {
        match produce(&b.bootstrap(), "named", 0, &[7], -1, T) {
            Err(errors::NOT_LEADER_OR_FOLLOWER) if std::time::Instant::now() < deadline => {}
            other => break other,
        }
    };
    assert_eq!(written, Ok(0), "{}", b.log());
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
    assert!(!data.exists(), "the data dir was created for a refused config");
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
            errors::INVALID_TOPIC_EXCEPTION,
            "CreateTopics {t:?}"
        );
        assert_eq!(
            metadata_error(&addr, t),
            errors::INVALID_TOPIC_EXCEPTION,
            "Metadata {t:?}"
        );
        assert_eq!(
            produce(&addr, t, 0, &[1], 1, T),
            Err(errors::INVALID_TOPIC_EXCEPTION),
            "Produce {t:?}"
        );
    }
    // Legal names still auto-create, and unknown ones stay unknown to Produce.
    assert_eq!(metadata_error(&addr, "ok.name_1-x"), errors::NONE);
    assert_eq!(
        produce(&addr, "never-created", 0, &[1], 1, T),
        Err(errors::UNKNOWN_TOPIC_OR_PARTITION)
    );
    let log = b.log();
    assert!(!log.contains('\0'), "a NUL reached the log");
    assert!(
        !log.lines().any(|l| l.starts_with("INJECTED")),
        "a client's newline split a log line:\n{log}"
    );
}
