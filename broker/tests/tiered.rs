//! Tiered storage (KIP-405, KIP-1023) on real broker processes sharing a local-directory remote
//! store: the leader uploads closed committed segments, local retention deletes only uploaded
//! ones, and every offset stays readable from remote plus local, by the test client and by kcat;
//! ListOffsets answers the tiered sentinels, each only from its version.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{client, kcat, Cluster};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tidemark_broker::replica::client::KafkaConnection;

/// ListOffsets for partition 0 of `topic` at `version`: (error, offset, leader epoch).
fn list_offset(addr: &str, topic: &str, timestamp: i64, version: i16) -> (i16, i64, i32) {
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
        let resp = c.call(version, &req).await.unwrap();
        let p = &resp.topics[0].partitions[0];
        (p.error_code, p.offset, p.leader_epoch)
    })
}

/// Base offsets of the local segment files of `topic`-0 in a data directory.
fn local_bases(data_dir: &Path, topic: &str) -> Vec<i64> {
    let mut bases: Vec<i64> = std::fs::read_dir(data_dir.join(format!("{topic}-0")))
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().to_string();
                name.strip_suffix(".log")?.parse().ok()
            })
            .collect()
        })
        .unwrap_or_default();
    bases.sort_unstable();
    bases
}

#[test]
fn uploaded_segments_leave_the_local_log_and_every_offset_reads_back_from_remote_and_local() {
    let remote = tempfile::tempdir().unwrap();
    let props = format!(
        "remote.log.storage.dir={}\nremote.log.manager.task.interval.ms=200\n",
        remote.path().display()
    );
    let c = Cluster::start(1, &props, &[]);
    let addr = c.addr(1);
    assert_eq!(
        client::create_topic(
            &addr,
            "t",
            1,
            1,
            &[
                ("segment.bytes", "300"),
                ("remote.storage.enable", "true"),
                ("local.retention.ms", "0"),
            ],
        ),
        0
    );
    // Before anything is uploaded or deleted, the earliest pending upload is the log start.
    c.wait_for("a leader", Duration::from_secs(20), |c| {
        list_offset(&c.addr(1), "t", -1, 10).0 == 0
    });
    let total = 60;
    for v in 0..total {
        assert_eq!(
            client::produce(&addr, "t", 0, &[v], -1, Duration::from_secs(5)),
            Ok(v)
        );
    }
    let data = c.nodes[0].data_dir();
    c.wait_for(
        "uploaded segments deleted locally",
        Duration::from_secs(30),
        |_| {
            local_bases(&data, "t")
                .first()
                .is_some_and(|b| *b > total / 2)
        },
    );
    let local_start = local_bases(&data, "t")[0];

    // ListOffsets: -2 the log start (in the remote store), -4 the local log start, -5 the
    // highest tiered offset, -6 refused below v11 (KIP-1023's version).
    assert_eq!(list_offset(&addr, "t", -2, 10).1, 0);
    let (err, earliest_local, _) = list_offset(&addr, "t", -4, 8);
    assert_eq!((err, earliest_local), (0, local_start));
    let (err, highest_tiered, _) = list_offset(&addr, "t", -5, 9);
    assert_eq!(err, 0);
    assert!(
        highest_tiered >= local_start - 1 && highest_tiered < total,
        "highest tiered {highest_tiered}, local start {local_start}"
    );
    assert_eq!(list_offset(&addr, "t", -4, 7).0, 35, "-4 before v8");
    assert_eq!(list_offset(&addr, "t", -5, 8).0, 35, "-5 before v9");
    assert_eq!(list_offset(&addr, "t", -6, 10).0, 35, "-6 before v11");

    // Every offset from 0, the remote part first, then the local part.
    let (records, hw) = client::read_all(&addr, "t", 0).unwrap();
    assert_eq!(hw, total);
    let got: Vec<(i64, i64)> = records.iter().map(|(o, v, _)| (*o, *v)).collect();
    let want: Vec<(i64, i64)> = (0..total).map(|v| (v, v)).collect();
    assert_eq!(got, want);

    // librdkafka from the beginning: it sees the remote offsets as any others.
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
    let lines: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let want: Vec<String> = (0..total).map(|v| format!("{v} {v}")).collect();
    assert_eq!(lines, want);
}
