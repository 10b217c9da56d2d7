//! Tiered storage (KIP-405, KIP-1023) on real broker processes sharing a local-directory remote
//! store: the leader uploads closed committed segments, local retention deletes only uploaded
//! ones, and every offset stays readable from remote plus local, by the test client and by kcat;
//! ListOffsets answers the tiered sentinels, each only from its version; total retention deletes
//! remote segments and moves the log start; followers apply local retention too; a follower
//! started from the remote store keeps the producer state, so a retry sent to it once it leads is
//! not appended twice; after an unclean election the new leader uploads and serves its own
//! records where the old leader's last segment overlaps them, and the old leader, cut below its
//! local log start, comes back with the epochs and producers below the cut.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{client, kcat, Cluster};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tidemark_broker::replica::client::KafkaConnection;

/// How long the tests wait for a cluster to reach a state.
const T: Duration = Duration::from_secs(20);

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
        "every closed segment uploaded and deleted locally",
        Duration::from_secs(30),
        // Nothing is produced any more: the copy task ends with only the active segment local.
        |_| local_bases(&data, "t").len() == 1,
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

    // dump-log with the remote store: both log starts and the remote segments, 0 to the
    // highest tiered offset without a gap, every one finished.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark-broker"))
        .args(["dump-log", "--data-dir"])
        .arg(&data)
        .arg("--remote-dir")
        .arg(remote.path())
        .args(["--topic", "t"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tiered = &line["tiered"];
    assert_eq!(tiered["log_start_offset"], 0, "{line}");
    assert_eq!(tiered["local_log_start_offset"], local_start, "{line}");
    let segments = tiered["remote_segments"].as_array().unwrap();
    let mut next = 0;
    for s in segments {
        assert_eq!(s["state"], "COPY_SEGMENT_FINISHED", "{s}");
        assert_eq!(s["start_offset"], next, "{s}");
        let end = s["end_offset"].as_i64().unwrap();
        // Its records, as a checker reads the offsets below the local log start: value v at v.
        let records: Vec<(i64, i64)> = s["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r[0].as_i64().unwrap(), r[1].as_i64().unwrap()))
            .collect();
        assert_eq!(
            records,
            (next..=end).map(|o| (o, o)).collect::<Vec<_>>(),
            "{s}"
        );
        next = end + 1;
    }
    assert_eq!(next, highest_tiered + 1);

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

/// Followers apply local retention too, once the leader of their lineage uploaded a segment and
/// their high watermark is past it; when the leader dies, the new one serves every offset from
/// the remote store plus what it kept.
#[test]
fn followers_let_uploaded_segments_go_and_a_new_leader_serves_every_offset() {
    let remote = tempfile::tempdir().unwrap();
    let mut c = tiered_cluster(3, remote.path(), &[("min.insync.replicas", "2")]);
    let addr = c.addr(1);
    let total = 60;
    for v in 0..total {
        assert_eq!(
            client::produce(&addr, "t", 0, &[v], -1, Duration::from_secs(5)),
            Ok(v)
        );
    }
    let dirs: Vec<_> = c.nodes.iter().map(|n| n.data_dir()).collect();
    c.wait_for(
        "every replica down to its active segment",
        Duration::from_secs(30),
        |_| dirs.iter().all(|d| local_bases(d, "t").len() == 1),
    );
    for d in &dirs[1..] {
        assert!(local_bases(d, "t")[0] > 0, "{}", d.display());
    }
    c.node(1).kill9();
    c.wait_for("a new leader", Duration::from_secs(20), |c| {
        c.partition_state("t", 0)
            .is_some_and(|(l, _, _)| l == 2 || l == 3)
    });
    let (leader, _, _) = c.partition_state("t", 0).unwrap();
    let (records, hw) = client::read_all(&c.addr(leader), "t", 0).unwrap();
    assert_eq!(hw, total);
    let got: Vec<(i64, i64)> = records.iter().map(|(o, v, _)| (*o, *v)).collect();
    assert_eq!(got, (0..total).map(|v| (v, v)).collect::<Vec<_>>());
}

/// The log start offset node `node` checkpointed for `topic`-0 (the partition's, below the local
/// one when it started from the remote store).
fn checkpointed_log_start(c: &Cluster, node: i32, topic: &str) -> Option<i64> {
    let text = std::fs::read_to_string(
        c.nodes[node as usize - 1]
            .data_dir()
            .join("log-start-offset-checkpoint"),
    )
    .ok()?;
    text.lines().find_map(|l| {
        let parts: Vec<&str> = l.split_whitespace().collect();
        (parts.len() == 3 && parts[0] == topic && parts[1] == "0")
            .then(|| parts[2].parse().ok())
            .flatten()
    })
}

/// `dump-log`'s line for node `node`'s replica of `t`-0.
fn dumped(c: &Cluster, node: i32) -> serde_json::Value {
    c.dump(node)
        .into_iter()
        .find(|r| r["topic"] == "t")
        .unwrap_or_else(|| panic!("node {node} has no replica of t"))
}

/// What a follower's replica of `t`-0 looks like on disk: local records' offsets and the epoch
/// cache.
fn replica(c: &Cluster, node: i32) -> (Vec<i64>, Vec<(i64, i64)>) {
    let r = dumped(c, node);
    let offsets = r["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[0].as_i64().unwrap())
        .collect();
    let epochs = r["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e[0].as_i64().unwrap(), e[1].as_i64().unwrap()))
        .collect();
    (offsets, epochs)
}

/// Kills `from`, the leader, waits until `to` leads, restarts `from` and waits until it is back
/// in the ISR: one leader epoch more.
fn move_leadership(c: &mut Cluster, from: i32, to: i32, epoch: i32) {
    c.node(from).kill9();
    c.wait_for(
        &format!("node {to} leading in epoch {epoch}"),
        Duration::from_secs(20),
        |c| {
            c.partition_state_at(to, "t", 0)
                .is_some_and(|(l, e, _)| l == to && e == epoch)
        },
    );
    c.node(from).restart();
    c.wait_for(
        &format!("node {from} back in the ISR"),
        Duration::from_secs(20),
        |c| {
            c.partition_state_at(to, "t", 0)
                .is_some_and(|(_, _, isr)| isr.contains(&(from as i64)))
        },
    );
}

/// The seed's scenarios (kips.md §2.4, §2.5) on five brokers, the topic on nodes 1, 3 and 2. Node
/// 2 is follower B; nodes 1 and
/// 3 take turns leading so the epochs start where the seed's tables have them: LE-0 at 0, LE-1
/// at 3, LE-2 at 5, LE-3 at 7. Segments hold three batches, so the remote store gets 0-2 and 3-5
/// (highest tiered offset 5, EPUO 6) and local retention by bytes keeps 3-5 on the leader (local
/// log start 3). B holds `b_holds` records when it is killed and is started once all eight are
/// written. Returns B's local offsets, epoch cache and log start once it caught up, and the first
/// offset it fetched after starting from the remote store (as `dump-log` reports it).
fn seed_scenario(
    flag: bool,
    dynamic_flag: Option<bool>,
    b_holds: i64,
    bug: Option<&str>,
) -> (Vec<i64>, Vec<(i64, i64)>, i64, i64) {
    let remote = tempfile::tempdir().unwrap();
    let batch = tidemark_broker::log::testing::batch(&[b"0"]).len();
    let props = format!(
        "remote.log.storage.dir={}\nremote.log.manager.task.interval.ms=200\nfollower.fetch.last.tiered.offset.enable={flag}\nauto.leader.rebalance.enable=false\n",
        remote.path().display()
    );
    let args: Vec<&str> = bug.map(|b| vec!["--inject-bug", b]).unwrap_or_default();
    // Five voters, so the metadata quorum outlives B and a leader down at once.
    let mut c = Cluster::start(5, &props, &args);
    let segment_bytes = (3 * batch).to_string();
    assert_eq!(
        client::create_topic_assigned(
            &c.addr(1),
            "t",
            1,
            3,
            &[&[1, 3, 2]],
            &[
                ("segment.bytes", &segment_bytes),
                ("local.retention.bytes", &segment_bytes),
                ("remote.storage.enable", "true"),
                ("min.insync.replicas", "1"),
            ],
        ),
        0
    );
    c.wait_for(
        "node 1 leading with all in the ISR",
        Duration::from_secs(20),
        |c| {
            c.partition_state_at(1, "t", 0)
                .is_some_and(|(l, e, isr)| l == 1 && e == 0 && isr.len() == 3)
        },
    );
    let produce = |c: &Cluster, leader: i32, v: i64| {
        assert_eq!(
            client::produce(&c.addr(leader), "t", 0, &[v], -1, Duration::from_secs(5)),
            Ok(v)
        );
    };
    for v in 0..3 {
        if v == b_holds {
            c.node(2).kill9();
        }
        produce(&c, 1, v);
    }
    if b_holds == 3 {
        c.node(2).kill9();
    }
    move_leadership(&mut c, 1, 3, 1);
    for v in 3..5 {
        produce(&c, 3, v);
    }
    move_leadership(&mut c, 3, 1, 2);
    for v in 5..7 {
        produce(&c, 1, v);
    }
    move_leadership(&mut c, 1, 3, 3);
    produce(&c, 3, 7);
    // The leader's side as the seed's table has it once the copy task ran.
    c.wait_for(
        "segments 0-2 and 3-5 tiered, 0-2 deleted locally",
        Duration::from_secs(20),
        |c| {
            list_offset(&c.addr(3), "t", -5, 9).1 == 5 && list_offset(&c.addr(3), "t", -4, 8).1 == 3
        },
    );
    assert_eq!(
        list_offset(&c.addr(3), "t", -6, 11),
        (0, 6, 2),
        "EPUO 6 in epoch 2"
    );
    assert_eq!(list_offset(&c.addr(3), "t", -2, 4).1, 0);

    if let Some(on) = dynamic_flag {
        // Any broker takes it; the metadata log carries it to every broker, B included, which
        // applies the log before it acts on a replica.
        let (code, message) = set_cluster_flag(&c.addr(1), on);
        assert_eq!(code, 0, "{message:?}");
    }
    c.node(2).restart();
    c.wait_for("B caught up", Duration::from_secs(30), |c| {
        c.partition_state_at(3, "t", 0)
            .is_some_and(|(_, _, isr)| isr.contains(&2))
    });
    c.wait_for("B's checkpoints written", Duration::from_secs(10), |c| {
        checkpointed_log_start(c, 2, "t").is_some() && replica(c, 2).0.last() == Some(&7)
    });
    let (offsets, epochs) = replica(&c, 2);
    let log_start = checkpointed_log_start(&c, 2, "t").unwrap();
    // dump-log's record of where B's local log began from the remote store (-1: it did not).
    let b = dumped(&c, 2);
    let first_fetch = b["remote_bootstrap"]["local_log_start_offset"]
        .as_i64()
        .unwrap_or(-1);
    if first_fetch >= 0 {
        assert_eq!(b["remote_bootstrap"]["leader_epoch"], 3, "{b}");
    }
    // Every offset stays readable from the leader, remote part and local part.
    let (records, _) = client::read_all(&c.addr(3), "t", 0).unwrap();
    assert_eq!(
        records.iter().map(|r| r.1).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    (offsets, epochs, log_start, first_fetch)
}

/// IncrementalAlterConfigs of `follower.fetch.last.tiered.offset.enable` on the cluster-default
/// broker resource: (error code, error message).
fn set_cluster_flag(addr: &str, on: bool) -> (i16, Option<String>) {
    alter_config(
        addr,
        4,
        "",
        "follower.fetch.last.tiered.offset.enable",
        &on.to_string(),
    )
}

/// IncrementalAlterConfigs setting `key` to `value` on one resource (type 2: a topic, 4: a
/// broker, `""` the cluster default): (error, message).
fn alter_config(
    addr: &str,
    resource_type: i8,
    resource: &str,
    key: &str,
    value: &str,
) -> (i16, Option<String>) {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::IncrementalAlterConfigsRequest;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = KafkaConnection::connect(addr, Duration::from_secs(10), "test")
            .await
            .unwrap();
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(StrBytes::from_string(resource.to_string()))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(StrBytes::from_string(key.to_string()))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_string(value.to_string())))]),
        ]);
        let resp = c.call(0, &req).await.unwrap();
        let r = &resp.responses[0];
        (
            r.error_code,
            r.error_message.as_ref().map(|m| m.to_string()),
        )
    })
}

#[test]
fn a_broker_without_a_remote_store_refuses_topics_that_would_tier() {
    let c = Cluster::start(1, "", &[]);
    let addr = c.addr(1);
    let tiers = [("remote.storage.enable", "true")];
    assert_eq!(
        client::create_topic(&addr, "t", 1, 1, &tiers),
        40,
        "INVALID_CONFIG"
    );
    // Nothing was created: the same name is free for a topic that does not tier.
    let plain = [("remote.storage.enable", "false")];
    assert_eq!(client::create_topic(&addr, "t", 1, 1, &plain), 0);
    let (code, message) = alter_config(&addr, 2, "t", "remote.storage.enable", "TRUE");
    assert_eq!(code, 40, "INVALID_CONFIG: {message:?}");
    assert!(
        message.is_some_and(|m| m.contains("remote.log.storage.dir")),
        "the refusal names the missing store"
    );
    assert_eq!(alter_config(&addr, 2, "t", "retention.ms", "60000").0, 0);
}

const SEED_EPOCHS: [(i64, i64); 4] = [(0, 0), (1, 3), (2, 5), (3, 7)];

#[test]
fn scenario_1_new_empty_follower_starts_at_the_earliest_pending_upload_with_the_flag_on() {
    let (offsets, epochs, log_start, first_fetch) = seed_scenario(true, None, 0, None);
    assert_eq!(first_fetch, 6);
    assert_eq!(offsets, vec![6, 7], "B's local log = {{6, 7}}");
    assert_eq!(epochs, SEED_EPOCHS);
    assert_eq!(log_start, 0);
}

#[test]
fn scenario_1_with_the_flag_off_the_empty_follower_starts_at_the_leaders_local_log_start() {
    let (offsets, epochs, log_start, first_fetch) = seed_scenario(false, None, 0, None);
    assert_eq!(first_fetch, 3);
    assert_eq!(offsets, vec![3, 4, 5, 6, 7]);
    assert_eq!(epochs, SEED_EPOCHS);
    assert_eq!(log_start, 0);
}

#[test]
fn scenario_2_out_of_sync_follower_ignores_the_flag_and_starts_after_the_tiered_segment() {
    for flag in [true, false] {
        let (offsets, epochs, log_start, first_fetch) = seed_scenario(flag, None, 2, None);
        assert_eq!(first_fetch, 3, "flag {flag}");
        assert_eq!(offsets, vec![3, 4, 5, 6, 7], "flag {flag}");
        assert_eq!(epochs, SEED_EPOCHS, "flag {flag}");
        assert_eq!(log_start, 0, "flag {flag}");
    }
}

#[test]
fn tiered_bootstrap_off_by_one_starts_the_empty_follower_at_the_local_log_start() {
    let (_, _, _, first_fetch) = seed_scenario(true, None, 0, Some("tiered-bootstrap-off-by-one"));
    assert_eq!(
        first_fetch, 3,
        "the bug resumes at the leader's local log start, not at 6"
    );
}

#[test]
fn the_flag_set_at_run_time_for_the_cluster_takes_effect_without_a_restart_of_the_leader() {
    let (offsets, epochs, log_start, first_fetch) = seed_scenario(false, Some(true), 0, None);
    assert_eq!(first_fetch, 6);
    assert_eq!(offsets, vec![6, 7]);
    assert_eq!(epochs, SEED_EPOCHS);
    assert_eq!(log_start, 0);
}

/// The remote store's metadata of `t`-0: (start, end, state) of every segment, oldest first.
fn remote_segments(remote: &Path) -> Vec<(i64, i64, String)> {
    let root = remote.join("__remote_log_metadata");
    let mut out = Vec::new();
    for dir in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        if !dir.file_name().to_string_lossy().starts_with("t-0-") {
            continue;
        }
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            if f.path().extension().is_some_and(|e| e == "json") {
                let m: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(f.path()).unwrap()).unwrap();
                out.push((
                    m["start_offset"].as_i64().unwrap(),
                    m["end_offset"].as_i64().unwrap(),
                    m["state"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn total_retention_deletes_remote_segments_and_moves_the_log_start() {
    let remote = tempfile::tempdir().unwrap();
    let props = format!(
        "remote.log.storage.dir={}\nremote.log.manager.task.interval.ms=200\n",
        remote.path().display()
    );
    let c = Cluster::start(3, &props, &[]);
    let addr = c.addr(1);
    let batch = tidemark_broker::log::testing::batch(&[b"00"]).len();
    // Three batches a segment; retention.bytes keeps about four segments' worth in all.
    let segment_bytes = 3 * batch;
    let retention_bytes = 4 * segment_bytes;
    assert_eq!(
        client::create_topic_assigned(
            &addr,
            "t",
            1,
            3,
            &[&[1, 2, 3]],
            &[
                ("segment.bytes", &segment_bytes.to_string()),
                ("remote.storage.enable", "true"),
                ("local.retention.ms", "0"),
                ("retention.bytes", &retention_bytes.to_string()),
            ],
        ),
        0
    );
    c.wait_for(
        "a leader with all in the ISR",
        Duration::from_secs(20),
        |c| {
            c.partition_state_at(1, "t", 0)
                .is_some_and(|(l, _, isr)| l == 1 && isr.len() == 3)
        },
    );
    let total = 60;
    for v in 0..total {
        assert_eq!(
            client::produce(&addr, "t", 0, &[v + 10], -1, Duration::from_secs(5)),
            Ok(v)
        );
    }
    // By size: the oldest remote segments go, DELETE_SEGMENT_STARTED then FINISHED, their data
    // with them, and the log start moves to the first segment left.
    let remote_dir = remote.path().to_path_buf();
    c.wait_for(
        "remote segments deleted by retention.bytes",
        Duration::from_secs(30),
        |c| {
            let segments = remote_segments(&remote_dir);
            let kept: i64 = segments
                .iter()
                .filter(|s| s.2 == "COPY_SEGMENT_FINISHED")
                .count() as i64;
            list_offset(&c.addr(1), "t", -2, 4).1 > 0
                && kept <= 4
                && local_bases(&c.nodes[0].data_dir(), "t").len() == 1
        },
    );
    let segments = remote_segments(&remote_dir);
    let deleted: Vec<&(i64, i64, String)> = segments
        .iter()
        .filter(|s| s.2 == "DELETE_SEGMENT_FINISHED")
        .collect();
    assert!(!deleted.is_empty(), "{segments:?}");
    assert_eq!(deleted[0].0, 0, "the oldest went first: {segments:?}");
    let first_kept = segments
        .iter()
        .find(|s| s.2 == "COPY_SEGMENT_FINISHED")
        .expect("segments within retention.bytes stay")
        .0;
    assert!(
        deleted.iter().all(|s| s.1 < first_kept),
        "only the oldest: {segments:?}"
    );
    // No segment file of a deleted segment is left in the store.
    let files: usize = std::fs::read_dir(remote.path())
        .unwrap()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with("t-0-"))
        .map(|d| {
            std::fs::read_dir(d.path())
                .unwrap()
                .flatten()
                .filter(|f| f.path().extension().is_some_and(|e| e == "log"))
                .count()
        })
        .sum();
    let finished = segments
        .iter()
        .filter(|s| s.2 == "COPY_SEGMENT_FINISHED")
        .count();
    assert_eq!(files, finished, "{segments:?}");
    let log_start = list_offset(&addr, "t", -2, 4).1;
    assert_eq!(log_start, first_kept);
    // Below the log start is out of range; from it every offset reads back.
    assert_eq!(
        client::read_all(&addr, "t", 0),
        Err(1),
        "OFFSET_OUT_OF_RANGE"
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
    let want: String = (log_start..total)
        .map(|o| format!("{o} {}\n", o + 10))
        .collect();
    assert_eq!(String::from_utf8(out).unwrap(), want);

    // By time: retention.ms lets every uploaded segment go; the log start reaches the local one.
    let (code, message) = alter_config(&addr, 2, "t", "retention.ms", "1");
    assert_eq!(code, 0, "{message:?}");
    c.wait_for(
        "every remote segment deleted by retention.ms",
        Duration::from_secs(30),
        |c| {
            remote_segments(&remote_dir)
                .iter()
                .all(|s| s.2 == "DELETE_SEGMENT_FINISHED")
                && list_offset(&c.addr(1), "t", -2, 4).1 == list_offset(&c.addr(1), "t", -4, 8).1
        },
    );
    let local_start = list_offset(&addr, "t", -4, 8).1;
    assert!(local_start > log_start, "{local_start} {log_start}");
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
    let want: String = (local_start..total)
        .map(|o| format!("{o} {}\n", o + 10))
        .collect();
    assert_eq!(String::from_utf8(out).unwrap(), want);
}

/// An idempotent producer's batches all end up in the remote store; node 3 (second in the
/// assignment) loses its disk and starts from the remote store, then leads once node 1 is
/// killed, and the producer resends its last batch there. Returns the answer, node 3's log end
/// before and after it, and whether `dump-log` listed the producer on node 3 before it led.
fn retry_after_a_remote_bootstrap(bug: Option<&str>) -> (Result<i64, i16>, i64, i64, bool) {
    let remote = tempfile::tempdir().unwrap();
    let props = format!(
        "remote.log.storage.dir={}\nremote.log.manager.task.interval.ms=200\nfollower.fetch.last.tiered.offset.enable=true\nauto.leader.rebalance.enable=false\n",
        remote.path().display()
    );
    let args: Vec<&str> = bug.map(|b| vec!["--inject-bug", b]).unwrap_or_default();
    let mut c = Cluster::start(3, &props, &args);
    let segment_bytes = (3 * tidemark_broker::log::testing::batch(&[b"0"]).len()).to_string();
    assert_eq!(
        client::create_topic_assigned(
            &c.addr(1),
            "t",
            1,
            3,
            &[&[1, 3, 2]],
            &[
                ("segment.bytes", &segment_bytes),
                ("remote.storage.enable", "true"),
                ("local.retention.ms", "0"),
                ("min.insync.replicas", "1"),
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
    let (code, pid, epoch) = client::init_producer_id(&c.addr(1), None);
    assert_eq!(code, 0);
    for seq in 0..6 {
        assert_eq!(
            client::produce_idempotent(
                &c.addr(1),
                "t",
                (pid, epoch, seq),
                &[seq as i64],
                Duration::from_secs(5)
            ),
            Ok(seq as i64)
        );
    }
    // Plain records after them until the idempotent batches are all uploaded, below the
    // earliest pending upload.
    let mut next = 6;
    while list_offset(&c.addr(1), "t", -6, 11).1 <= 6 {
        assert_eq!(
            client::produce(&c.addr(1), "t", 0, &[next], -1, Duration::from_secs(5)),
            Ok(next)
        );
        next += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    c.node(3).kill9();
    let data = c.nodes[2].data_dir();
    for entry in std::fs::read_dir(&data).unwrap() {
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
    });
    // What dump-log says each replica knows of the producer, as its broker rebuilds it.
    let knows = |c: &Cluster, node: i32| -> (bool, serde_json::Value) {
        let r = dumped(c, node);
        let listed = r["producers"]
            .as_array()
            .expect("dump-log lists producers")
            .iter()
            .any(|p| p[0] == pid && p[2] == 5);
        (listed, r["remote_bootstrap"].clone())
    };
    let (node2_knows, _) = knows(&c, 2);
    let (node3_knows, bootstrap) = knows(&c, 3);
    assert!(node2_knows, "node 2 replicated every batch of the producer");
    assert!(
        bootstrap["local_log_start_offset"].as_i64() >= Some(6),
        "node 3 started from the remote store after the producer's batches: {bootstrap}"
    );
    c.node(1).kill9();
    c.wait_for("node 3 leading", Duration::from_secs(20), |c| {
        c.partition_state_at(3, "t", 0)
            .is_some_and(|(l, _, _)| l == 3)
    });
    let end_before = list_offset(&c.addr(3), "t", -1, 4).1;
    let answer = client::produce_idempotent(
        &c.addr(3),
        "t",
        (pid, epoch, 5),
        &[5],
        Duration::from_secs(5),
    );
    let end_after = list_offset(&c.addr(3), "t", -1, 4).1;
    (answer, end_before, end_after, node3_knows)
}

#[test]
fn a_follower_started_from_the_remote_store_recognises_a_producers_retry_once_it_leads() {
    let (answer, before, after, knew) = retry_after_a_remote_bootstrap(None);
    assert!(knew, "node 3 took the producer from the uploaded snapshot");
    assert_eq!(
        answer,
        Ok(5),
        "the retry is answered with its original offset"
    );
    assert_eq!(after, before, "and not appended again");
}

#[test]
fn tiered_bootstrap_drops_producer_state_appends_a_retry_again() {
    let (answer, before, after, knew) =
        retry_after_a_remote_bootstrap(Some("tiered-bootstrap-drops-producer-state"));
    assert!(!knew, "dump-log shows node 3 without the producer");
    assert_eq!(
        (answer, after),
        (Ok(before), before + 1),
        "the retry is appended again at the log end: a duplicate"
    );
}

/// `n` brokers sharing the remote store `remote` (its task every 200 ms) and topic `t` on nodes
/// 1–3, led by node 1 with all three in its ISR: segments of 300 bytes, tiered, local retention
/// 0, and `extra` topic configs.
fn tiered_cluster(n: usize, remote: &Path, extra: &[(&str, &str)]) -> Cluster {
    let props = format!(
        "remote.log.storage.dir={}\nremote.log.manager.task.interval.ms=200\n",
        remote.display()
    );
    let c = Cluster::start(n, &props, &[]);
    let mut configs = vec![
        ("segment.bytes", "300"),
        ("remote.storage.enable", "true"),
        ("local.retention.ms", "0"),
    ];
    configs.extend_from_slice(extra);
    assert_eq!(
        client::create_topic_assigned(&c.addr(1), "t", 1, 3, &[&[1, 2, 3]], &configs),
        0
    );
    c.wait_for("node 1 leading all three", T, |c| {
        c.partition_state_at(1, "t", 0)
            .is_some_and(|(l, _, isr)| l == 1 && isr.len() == 3)
    });
    c
}

/// Five brokers (so the controllers keep a quorum with two replicas down) sharing `remote`, and
/// topic `t` on nodes 1–3 with small segments and local retention 0: an idempotent producer
/// writes 0–9 to all three and goes idle, node 2 is killed, node 1 writes 10–39 alone, uploads
/// past 20 and deletes its local copies; then nodes 1 and 3 die and node 2, lagging at 10, is
/// made leader by a forced unclean election. `before_election` runs while only node 1's
/// uploads are done.
fn unclean_over_uploads(remote: &Path, before_election: impl FnOnce(&Cluster)) -> Cluster {
    let mut c = tiered_cluster(5, remote, &[]);
    let addr = c.addr(1);
    let (err, pid, epoch) = client::init_producer_id(&addr, None);
    assert_eq!(err, 0);
    for v in 0..10 {
        let at = client::produce_idempotent(&addr, "t", (pid, epoch, v as i32), &[v], T);
        assert_eq!(at, Ok(v));
    }
    c.wait_for("node 2 has all ten", T, |c| {
        c.dumped_records(2, "t").len() == 10
    });
    c.node(2).kill9();
    produce(&addr, 10..40);
    c.wait_for("node 1 uploaded past 20 and deleted it", T, |c| {
        remote_segments(remote).iter().any(|s| s.1 >= 20)
            && local_bases(&c.nodes[0].data_dir(), "t")[0] > 10
    });
    before_election(&c);
    c.node(3).kill9();
    c.node(1).kill9();
    c.node(2).restart();
    c.wait_for("no leader", T, |c| {
        c.partition_state_at(5, "t", 0)
            .is_some_and(|(l, _, _)| l == -1)
    });
    c.elect_unclean(2, "t", 0);
    c.wait_for("node 2 leading", T, |c| {
        c.partition_state_at(2, "t", 0)
            .is_some_and(|(l, _, _)| l == 2)
    });
    c
}

/// Produces `values` to `t`-0 at `addr`, one acks=all batch each.
fn produce(addr: &str, values: std::ops::Range<i64>) {
    for v in values {
        let at = client::produce(addr, "t", 0, &[v], -1, Duration::from_secs(5));
        assert!(at.is_ok(), "{v}: {at:?}");
    }
}

/// The new leader's uploads must start where its own lineage's uploads end, not after the old
/// leader's last segment (offsets it then wrote in its own epoch), and a consumer reading below
/// its local log start must get its records: before the fix it skipped uploading its first
/// records, local retention deleted them, and reads there served the old leader's (a correct
/// run of the harness's tiered workload under every fault kind found it).
#[test]
fn after_an_unclean_election_the_new_leader_uploads_and_serves_its_own_records() {
    let remote = tempfile::tempdir().unwrap();
    let c = unclean_over_uploads(remote.path(), |_| {});
    produce(&c.addr(2), 100..140);
    c.wait_for("node 2 down to its active segment", T, |c| {
        local_bases(&c.nodes[1].data_dir(), "t").len() == 1
    });
    let (records, hw) = client::read_all(&c.addr(2), "t", 0).unwrap();
    assert_eq!(hw, 50);
    let got: Vec<i64> = records.iter().map(|r| r.1).collect();
    let expected: Vec<i64> = (0..10).chain(100..140).collect();
    assert_eq!(got, expected, "node 2 serves its own lineage");
}

/// The old leader returns with every local offset above the new leader's cut at 10, while the
/// new leader still holds 10 locally: it must start over, not at the cut, or it keeps neither
/// the epochs of the offsets below the cut (in the remote store) nor the producer idle since
/// before it, and lacks that producer once it leads.
#[test]
fn a_follower_cut_below_its_local_log_start_comes_back_with_the_epochs_and_producers_below() {
    let remote = tempfile::tempdir().unwrap();
    // Node 2 keeps its local log from here on.
    let mut c = unclean_over_uploads(remote.path(), |c| {
        assert_eq!(
            alter_config(&c.addr(1), 2, "t", "local.retention.ms", "-2").0,
            0
        );
    });
    produce(&c.addr(2), 100..110);
    c.node(1).restart();
    c.wait_for("node 1 back in the ISR", T, |c| {
        c.partition_state_at(2, "t", 0)
            .is_some_and(|(_, _, isr)| isr.contains(&1))
    });
    let leader = dumped(&c, 2);
    assert_eq!(
        leader["producers"].as_array().map(Vec::len),
        Some(1),
        "{leader}"
    );
    c.wait_for("node 1's epochs and producers as node 2's", T, |c| {
        let (mine, theirs) = (dumped(c, 1), dumped(c, 2));
        mine["epochs"] == theirs["epochs"] && mine["producers"] == theirs["producers"]
    });
}
