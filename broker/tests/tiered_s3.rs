//! Tiered storage in an S3-compatible store (`remote.log.storage.s3.*`), against a real S3 server:
//! moto's (scripts/python-requirements.txt), started by each test on a loopback port and killed
//! after. The store keeps the storage and metadata contracts, tells a store that is down or a
//! bucket that is missing from a missing object, and brokers sharing a bucket tier, serve every
//! offset back and start a wiped follower from it; `dump-log --remote-config` reads the bucket.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, free_port, kcat, Cluster};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tidemark_broker::config::S3Config;
use tidemark_broker::replica::client::KafkaConnection;
use tidemark_broker::tiered::metadata::{
    RemoteLogMetadataStore, RemoteSegmentMetadata, SegmentState,
};
use tidemark_broker::tiered::s3::{S3Credentials, S3Storage};
use tidemark_broker::tiered::storage::{
    IndexKind, RemoteSegmentId, RemoteStorage, RemoteStorageError, SegmentData, TopicIdPartition,
};

/// moto's server in scripts/setup-host's virtual environment.
const MOTO_SERVER: &str = "/var/lib/tidemark/python-venv/bin/moto_server";

/// The keys the brokers sign with; moto accepts any.
const ACCESS_KEY: &str = "tidemark-test";
const SECRET_KEY: &str = "tidemark-test-secret";

/// A moto S3 server on a loopback port, killed on drop.
struct Moto {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
}

impl Moto {
    /// Starts the server and waits until it answers; fails the test when it cannot.
    fn start() -> Moto {
        assert!(
            Path::new(MOTO_SERVER).exists(),
            "{MOTO_SERVER} is missing: the S3 tests need moto's server from \
             scripts/python-requirements.txt (run scripts/setup-host as root)"
        );
        let port = free_port();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(MOTO_SERVER)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {MOTO_SERVER}: {e}"));
        let mut moto = Moto { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http(port, "GET", "/").is_none() {
            let exited = moto.child.try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "moto's S3 server on 127.0.0.1:{port} did not come up ({}): {}",
                exited.map_or("still starting after 60 s".to_string(), |s| s.to_string()),
                std::fs::read_to_string(moto.log.path()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn create_bucket(&self, bucket: &str) {
        let (status, body) = http(self.port, "PUT", &format!("/{bucket}")).expect("moto answers");
        assert_eq!(status, 200, "creating bucket {bucket}: {body}");
    }

    /// The keys under `prefix` in `bucket`, from the server's own listing.
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) =
            http(self.port, "GET", &format!("/{bucket}?prefix={prefix}")).expect("moto answers");
        assert_eq!(status, 200, "{body}");
        body.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_string)
            .collect()
    }

    fn config(&self, bucket: &str) -> S3Config {
        S3Config {
            bucket: bucket.to_string(),
            endpoint: Some(self.endpoint()),
            region: "us-east-1".to_string(),
            path_style_access: true,
        }
    }

    /// The broker properties naming this server's `bucket`.
    fn props(&self, bucket: &str) -> String {
        format!(
            "remote.log.storage.s3.bucket={bucket}\nremote.log.storage.s3.endpoint={}\n\
             remote.log.storage.s3.path.style.access=true\nremote.log.storage.s3.region=us-east-1\n",
            self.endpoint()
        )
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One unauthenticated HTTP/1.1 request (moto's bucket calls need no signature): (status, body),
/// `None` when nothing answers.
fn http(port: u16, method: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

fn credentials() -> S3Credentials {
    S3Credentials {
        access_key_id: ACCESS_KEY.to_string(),
        secret_access_key: SECRET_KEY.to_string(),
        session_token: None,
    }
}

fn segment_id() -> RemoteSegmentId {
    RemoteSegmentId {
        partition: TopicIdPartition {
            topic_id: uuid::Uuid::from_u128(7),
            topic: "t".to_string(),
            partition: 0,
        },
        id: uuid::Uuid::new_v4(),
    }
}

fn metadata(segment: &RemoteSegmentId, state: SegmentState) -> RemoteSegmentMetadata {
    RemoteSegmentMetadata {
        segment: segment.clone(),
        start_offset: 0,
        end_offset: 9,
        max_timestamp_ms: 1,
        broker_id: 1,
        event_timestamp_ms: 2,
        size_bytes: 10,
        segment_leader_epochs: [(0, 0)].into_iter().collect(),
        state,
    }
}

#[test]
fn the_s3_store_keeps_the_storage_and_metadata_contracts_against_a_real_server() {
    let moto = Moto::start();
    moto.create_bucket("tiered");
    let store = S3Storage::new(&moto.config("tiered"), credentials()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log_file = dir.path().join("00000000000000000000.log");
    std::fs::write(&log_file, b"0123456789").unwrap();
    let seg = segment_id();
    assert!(
        store.list(&seg.partition).unwrap().is_empty(),
        "a reachable bucket without metadata lists nothing"
    );
    store
        .copy_segment(
            &seg,
            SegmentData {
                log_file: &log_file,
                leader_epoch_index: b"0\n1\n0 0\n",
                producer_snapshot: b"{}",
            },
        )
        .unwrap();
    // The objects are where the layout says, in the server itself.
    let mut keys = moto.keys("tiered", "t-0-");
    keys.sort();
    let dir_name = seg.partition.dir_name();
    assert_eq!(
        keys,
        ["leader-epoch-checkpoint", "log", "snapshot"]
            .iter()
            .map(|e| format!("{dir_name}/{}.{e}", seg.id))
            .collect::<Vec<_>>()
    );
    // Another broker's client reads the same bytes, whole and by range, cut at the end.
    let other = S3Storage::new(&moto.config("tiered"), credentials()).unwrap();
    assert_eq!(other.fetch_segment(&seg, 0, None).unwrap(), b"0123456789");
    assert_eq!(other.fetch_segment(&seg, 3, Some(6)).unwrap(), b"345");
    assert_eq!(other.fetch_segment(&seg, 8, Some(100)).unwrap(), b"89");
    assert_eq!(other.fetch_segment(&seg, 12, None).unwrap(), b"");
    assert_eq!(
        other.fetch_index(&seg, IndexKind::LeaderEpoch).unwrap(),
        b"0\n1\n0 0\n"
    );
    assert_eq!(
        other
            .fetch_index(&seg, IndexKind::ProducerSnapshot)
            .unwrap(),
        b"{}"
    );

    // A segment larger than an upload part goes up in parts and reads back whole and by range.
    let big_file = dir.path().join("00000000000000001000.log");
    let big: Vec<u8> = (0..17 * 1024 * 1024 + 5).map(|i| (i % 251) as u8).collect();
    std::fs::write(&big_file, &big).unwrap();
    let big_seg = segment_id();
    store
        .copy_segment(
            &big_seg,
            SegmentData {
                log_file: &big_file,
                leader_epoch_index: b"",
                producer_snapshot: b"",
            },
        )
        .unwrap();
    assert!(other.fetch_segment(&big_seg, 0, None).unwrap() == big);
    assert!(
        other
            .fetch_segment(&big_seg, 9 << 20, Some((9 << 20) + 10))
            .unwrap()
            == big[9 << 20..(9 << 20) + 10]
    );
    store.delete_segment(&big_seg).unwrap();

    // Metadata: states move only forward, and every client lists the newest.
    store
        .put(&metadata(&seg, SegmentState::CopySegmentStarted))
        .unwrap();
    store
        .put(&metadata(&seg, SegmentState::CopySegmentFinished))
        .unwrap();
    assert_eq!(
        other.list(&seg.partition).unwrap(),
        vec![metadata(&seg, SegmentState::CopySegmentFinished)]
    );
    let refused = store
        .put(&metadata(&seg, SegmentState::CopySegmentStarted))
        .unwrap_err();
    assert!(refused.to_string().contains("cannot become"), "{refused}");

    // Delete is idempotent; what is gone is NotFound, as the bucket answers.
    store.delete_segment(&seg).unwrap();
    store.delete_segment(&seg).unwrap();
    assert!(matches!(
        other.fetch_segment(&seg, 0, None),
        Err(RemoteStorageError::NotFound { .. })
    ));
    assert!(matches!(
        other.fetch_index(&seg, IndexKind::LeaderEpoch),
        Err(RemoteStorageError::NotFound { .. })
    ));

    // A bucket that does not exist is a store that fails, never an empty one.
    let missing = S3Storage::new(&moto.config("no-such-bucket"), credentials()).unwrap();
    assert!(
        missing.list(&seg.partition).is_err(),
        "missing bucket lists"
    );
    assert!(matches!(
        missing.fetch_segment(&seg, 0, None),
        Err(RemoteStorageError::Unavailable { .. })
    ));
    // Nor is a server that is not there: every operation fails as Unavailable, within seconds.
    let down = S3Storage::new(
        &S3Config {
            endpoint: Some(format!("http://127.0.0.1:{}", free_port())),
            ..moto.config("tiered")
        },
        credentials(),
    )
    .unwrap();
    let started = Instant::now();
    assert!(down.list(&seg.partition).is_err(), "a server down lists");
    assert!(matches!(
        down.fetch_segment(&seg, 0, None),
        Err(RemoteStorageError::Unavailable { .. })
    ));
    assert!(matches!(
        down.copy_segment(
            &segment_id(),
            SegmentData {
                log_file: &log_file,
                leader_epoch_index: b"",
                producer_snapshot: b"",
            },
        ),
        Err(RemoteStorageError::Unavailable { .. })
    ));
    assert!(down.delete_segment(&seg).is_err());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "a store that is down answers within its retry budget"
    );
}

#[test]
fn a_broker_with_an_s3_store_and_no_credentials_refuses_to_start_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let props = dir.path().join("server.properties");
    std::fs::write(
        &props,
        format!(
            "node.id=1\nprocess.roles=broker,controller\nlisteners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{}\ncontroller.listener.names=CONTROLLER\nlog.dirs={}\nremote.log.storage.s3.bucket=tiered\nremote.log.storage.s3.endpoint=http://127.0.0.1:9\n",
            free_port(),
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark-broker"))
        .arg(&props)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("AWS_ACCESS_KEY_ID"), "{stderr}");
}

/// ListOffsets v11 for partition 0 of `topic`: (error, offset).
fn list_offset(addr: &str, topic: &str, timestamp: i64) -> (i16, i64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = KafkaConnection::connect(addr, Duration::from_secs(5), "test")
            .await
            .unwrap();
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(timestamp)])]);
        let resp = c.call(11, &req).await.unwrap();
        let p = &resp.topics[0].partitions[0];
        (p.error_code, p.offset)
    })
}

/// Offsets of the records of `t`-0 on node `id`.
fn local_offsets(c: &Cluster, id: i32) -> Vec<i64> {
    c.dumped_records(id, "t")
        .into_iter()
        .map(|(o, _)| o)
        .collect()
}

#[test]
fn brokers_sharing_an_s3_bucket_tier_serve_every_offset_and_start_a_wiped_follower_from_it() {
    let moto = Moto::start();
    moto.create_bucket("tiered");
    let props = format!(
        "{}remote.log.manager.task.interval.ms=200\nfollower.fetch.last.tiered.offset.enable=true\nauto.leader.rebalance.enable=false\n",
        moto.props("tiered")
    );
    let env = [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    ];
    let mut c = Cluster::start_env(3, &props, &[], &env);
    assert_eq!(
        client::create_topic_assigned(
            &c.addr(1),
            "t",
            1,
            3,
            &[&[1, 2, 3]],
            &[
                ("segment.bytes", "300"),
                ("remote.storage.enable", "true"),
                ("local.retention.ms", "0"),
            ],
        ),
        0
    );
    c.wait_for(
        "node 1 leading with all in the ISR",
        Duration::from_secs(20),
        |c| {
            c.partition_state_at(1, "t", 0)
                .is_some_and(|(l, _, isr)| l == 1 && isr.len() == 3)
        },
    );
    let addr = c.addr(1);
    let total = 60;
    for v in 0..total {
        assert_eq!(
            client::produce(&addr, "t", 0, &[v], -1, Duration::from_secs(5)),
            Ok(v)
        );
    }
    let data = c.nodes[0].data_dir();
    let local_segments = |data: &Path| {
        std::fs::read_dir(data.join("t-0"))
            .map(|d| {
                d.filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
                })
                .count()
            })
            .unwrap_or(0)
    };
    c.wait_for(
        "every closed segment uploaded to S3 and deleted locally",
        Duration::from_secs(30),
        |_| local_segments(&data) == 1,
    );
    let local_start = list_offset(&addr, "t", -4).1;
    let highest_tiered = list_offset(&addr, "t", -5).1;
    assert!(local_start > 0, "local retention moved the local log start");
    assert!(
        highest_tiered >= local_start - 1,
        "{highest_tiered} {local_start}"
    );
    assert_eq!(list_offset(&addr, "t", -2), (0, 0));
    // The segments and their metadata are in the bucket, not anywhere else.
    let keys = moto.keys("tiered", "");
    assert!(keys
        .iter()
        .any(|k| k.starts_with("t-0-") && k.ends_with(".log")));
    assert!(keys
        .iter()
        .any(|k| k.starts_with("__remote_log_metadata/t-0-") && k.ends_with(".json")));

    // Every offset from 0 from the leader: the remote part, then the local one.
    let (records, hw) = client::read_all(&addr, "t", 0).unwrap();
    assert_eq!(hw, total);
    assert_eq!(
        records.iter().map(|(o, v, _)| (*o, *v)).collect::<Vec<_>>(),
        (0..total).map(|v| (v, v)).collect::<Vec<_>>()
    );
    let out = kcat(
        &[
            "-C",
            "-b",
            &addr,
            "-t",
            "t",
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%o %s\n",
        ],
        b"",
    );
    assert_eq!(
        String::from_utf8(out).unwrap(),
        (0..total).map(|v| format!("{v} {v}\n")).collect::<String>()
    );

    // Node 3 loses its disk (all but the metadata quorum's log) and starts empty: with the flag
    // on it takes its state from the S3 store and fetches from the earliest pending upload.
    let (_, pending) = list_offset(&addr, "t", -6);
    assert_eq!(pending, highest_tiered + 1, "EPUO");
    c.node(3).kill9();
    let data3 = c.nodes[2].data_dir();
    for entry in std::fs::read_dir(&data3).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != "__cluster_metadata") {
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    c.node(3).restart();
    c.wait_for("node 3 back in the ISR", Duration::from_secs(30), |c| {
        c.partition_state_at(1, "t", 0)
            .is_some_and(|(_, _, isr)| isr.contains(&3))
            && local_offsets(c, 3).last() == Some(&(total - 1))
    });
    let log = c.nodes[2].log();
    let started = log
        .lines()
        .rfind(|l| l.contains("started from the remote store"))
        .unwrap_or_else(|| panic!("node 3 did not start from the S3 store:\n{log}"));
    assert!(
        started.contains(&format!("fetch_offset={pending}")),
        "node 3 fetched from the earliest pending upload {pending}: {started}"
    );
    assert_eq!(
        local_offsets(&c, 3),
        (pending..total).collect::<Vec<_>>(),
        "node 3 holds only what was not tiered"
    );

    // dump-log reads the bucket a broker's configuration names: node 3's replica with the
    // partition's log start, its own local one, and every tiered offset in finished segments.
    let dump = |config: &Path, env: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_tidemark-broker"))
            .arg("dump-log")
            .arg("--data-dir")
            .arg(&data3)
            .arg("--remote-config")
            .arg(config)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let config = c.nodes[2].dir.path().join("server.properties");
    let out = dump(&config, &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["topic"] == "t")
        .expect("a line for t-0");
    let tiered = &line["tiered"];
    assert_eq!(tiered["log_start_offset"], 0, "{tiered}");
    assert_eq!(tiered["local_log_start_offset"], pending, "{tiered}");
    let mut remote: Vec<i64> = tiered["remote_segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "COPY_SEGMENT_FINISHED")
        .flat_map(|s| s["records"].as_array().unwrap().clone())
        .map(|r| r[0].as_i64().unwrap())
        .collect();
    remote.sort_unstable();
    remote.dedup();
    assert_eq!(remote, (0..pending).collect::<Vec<_>>(), "{tiered}");
    // Without credentials it refuses, naming the variable; a file without a store is named.
    let out = dump(&config, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AWS_ACCESS_KEY_ID"), "{err}");
    let bare = c.nodes[2].dir.path().join("no-store.properties");
    let without_store: String = std::fs::read_to_string(&config)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("remote.log.storage."))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&bare, without_store).unwrap();
    let out = dump(&bare, &env);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-store.properties") && err.contains("names no remote store"),
        "{err}"
    );
}
