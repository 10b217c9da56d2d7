//! How fast a broker that lost its disk rejoins the ISR of a tiered partition, with KIP-1023's
//! `follower.fetch.last.tiered.offset.enable` off and on, measured in one run (the target is on
//! at least 5× faster than off).
//!
//! Three brokers share a local-directory remote store; `bench`-0 lives on nodes 1 (leader) and 2.
//! 1 GiB goes to it at acks=1 in 32 KiB batches; segments are sized so that eight close and are
//! uploaded (90% of the data) and the active one holds the rest. Local retention
//! (`local.retention.bytes`) lets the leader delete only its first uploaded segment, so its local
//! log starts above 0 but still holds seven uploaded segments, the case KIP-1023 is about: the
//! empty follower's fetch from 0 is told OFFSET_MOVED_TO_TIERED_STORAGE; with the flag off it
//! then replicates the leader's whole local log (about 89% of the data), with it on only what is
//! not uploaded yet (10%). While the leader's local log still starts at 0 an empty follower's
//! fetch is served as any other and the flag changes nothing (kips.md §2.3: the follower turns to
//! the remote store only on OFFSET_OUT_OF_RANGE or OFFSET_MOVED_TO_TIERED_STORAGE).
//!
//! Each round sets the flag for the cluster (IncrementalAlterConfigs), kills node 2, deletes its
//! data directory but the metadata quorum's log, waits until the ISR is node 1 alone, and times
//! from starting node 2 to node 2 in the ISR again, the process start included. Rounds run off,
//! on, on, off, so neither setting always comes first into the page cache.
//!
//! `cargo bench -p tidemark-broker --bench tiered_rejoin` (`TIDEMARK_BENCH_MIB=N` writes N MiB
//! instead of 1024, for a quick look).

#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{client, Cluster};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    BrokerId, IncrementalAlterConfigsRequest, ListOffsetsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use support::{PER_BATCH, RECORD};
use tidemark_broker::replica::client::KafkaConnection;

const DEFAULT_MIB: usize = 1024;
/// Closed segments, uploaded: eight of 1/8.9 of the data each leave 10% in the active one.
const CLOSED_SEGMENTS: usize = 8;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// ListOffsets v11 of `bench`-0 at `timestamp`: the offset.
fn list_offset(addr: &str, timestamp: i64) -> i64 {
    rt().block_on(async {
        let mut c = KafkaConnection::connect(addr, Duration::from_secs(5), "bench")
            .await
            .unwrap();
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("bench")))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(timestamp)])]);
        let resp = c.call(11, &req).await.unwrap();
        let p = &resp.topics[0].partitions[0];
        assert_eq!(p.error_code, 0, "ListOffsets {timestamp}");
        p.offset
    })
}

/// Sets `follower.fetch.last.tiered.offset.enable` for the cluster.
fn set_flag(addr: &str, on: bool) {
    rt().block_on(async {
        let mut c = KafkaConnection::connect(addr, Duration::from_secs(5), "bench")
            .await
            .unwrap();
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(4)
                .with_resource_name(StrBytes::from_static_str(""))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(StrBytes::from_static_str(
                        "follower.fetch.last.tiered.offset.enable",
                    ))
                    .with_config_operation(0)
                    .with_value(Some(StrBytes::from_string(on.to_string())))]),
        ]);
        let resp = c.call(0, &req).await.unwrap();
        assert_eq!(resp.responses[0].error_code, 0, "setting the flag");
    })
}

/// Bytes of `bench`-0's segment files in a data directory.
fn local_bytes(data_dir: &Path) -> u64 {
    std::fs::read_dir(data_dir.join("bench-0"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn isr(c: &Cluster) -> Vec<i64> {
    c.partition_state_at(1, "bench", 0)
        .map(|(_, _, isr)| isr)
        .unwrap_or_default()
}

/// Kills node 2, deletes its data but the quorum's log, waits until it is out of the ISR, then
/// starts it and times its way back in. Returns (until it served, until it was in the ISR, bytes
/// it replicated).
fn rejoin(c: &mut Cluster) -> (Duration, Duration, u64) {
    c.node(2).kill9();
    let data = c.nodes[1].data_dir();
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
    c.wait_for("node 2 out of the ISR", Duration::from_secs(60), |c| {
        isr(c) == [1]
    });
    let start = Instant::now();
    c.node(2).restart();
    let serving = start.elapsed();
    let deadline = start + Duration::from_secs(600);
    while !isr(c).contains(&2) {
        assert!(Instant::now() < deadline, "node 2 did not rejoin in 10 min");
        std::thread::sleep(Duration::from_millis(10));
    }
    (serving, start.elapsed(), local_bytes(&data))
}

fn main() {
    let mib: usize = std::env::var("TIDEMARK_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MIB);
    let batch = tidemark_broker::log::testing::batch(
        &support::record_values()
            .iter()
            .map(Vec::as_slice)
            .collect::<Vec<_>>(),
    );
    let requests = mib * 1024 * 1024 / (PER_BATCH * RECORD);
    let total_bytes = requests * batch.len();
    // Eight closed segments hold 90% of the bytes; the active one the remaining 10%, which is
    // less than a segment so it does not roll.
    let segment_bytes = total_bytes * 9 / 10 / CLOSED_SEGMENTS + batch.len();
    let remote = tempfile::tempdir().unwrap();
    let props = format!(
        "remote.log.storage.dir={}\nremote.log.manager.task.interval.ms=500\nauto.leader.rebalance.enable=false\nreplica.lag.time.max.ms=5000\n",
        remote.path().display()
    );
    let mut c = Cluster::start(3, &props, &[]);
    assert_eq!(
        client::create_topic_assigned(
            &c.addr(1),
            "bench",
            1,
            2,
            &[&[1, 2]],
            &[
                ("segment.bytes", &segment_bytes.to_string()),
                ("remote.storage.enable", "true"),
                ("min.insync.replicas", "1"),
                // A segment less than everything: the first uploaded segment goes locally.
                (
                    "local.retention.bytes",
                    &(total_bytes - segment_bytes).to_string(),
                ),
            ],
        ),
        0
    );
    c.wait_for("both replicas in the ISR", Duration::from_secs(30), |c| {
        isr(c).len() == 2
    });
    let frame = support::produce_frame(1, &batch);
    let wrote = support::drive(&c.addr(1), requests, frame, |_, _| {});
    println!(
        "wrote {} MiB in {:.1} s ({} records of {RECORD} B)",
        total_bytes >> 20,
        wrote.as_secs_f64(),
        requests * PER_BATCH
    );
    let leader_data = c.nodes[0].data_dir();
    let end = (requests * PER_BATCH) as i64;
    c.wait_for(
        "the closed segments uploaded and node 2 caught up",
        Duration::from_secs(600),
        |c| {
            let pending = list_offset(&c.addr(1), -6);
            let bases = std::fs::read_dir(leader_data.join("bench-0"))
                .unwrap()
                .filter_map(|e| {
                    let name = e.ok()?.file_name().to_string_lossy().to_string();
                    name.strip_suffix(".log")?.parse::<i64>().ok()
                })
                .max();
            bases == Some(pending)
                && list_offset(&c.addr(1), -4) > 0
                && isr(c).len() == 2
                && list_offset(&c.addr(1), -1) == end
        },
    );
    let pending = list_offset(&c.addr(1), -6);
    let local_start = list_offset(&c.addr(1), -4);
    println!(
        "{} records, {} uploaded ({:.1}%), segment.bytes {segment_bytes}, leader's local log from \
         offset {local_start}: {} MiB",
        end,
        pending,
        100.0 * pending as f64 / end as f64,
        local_bytes(&leader_data) >> 20
    );

    let mut times: Vec<(bool, Duration)> = Vec::new();
    println!("| round | flag | serving (s) | in the ISR (s) | node 2 replicated (MiB) |");
    println!("|---|---|---|---|---|");
    for (round, on) in [false, true, true, false].into_iter().enumerate() {
        set_flag(&c.addr(1), on);
        let (serving, took, bytes) = rejoin(&mut c);
        println!(
            "| {} | {} | {:.2} | {:.2} | {} |",
            round + 1,
            if on { "on" } else { "off" },
            serving.as_secs_f64(),
            took.as_secs_f64(),
            bytes >> 20
        );
        times.push((on, took));
    }
    let mean = |on: bool| {
        let t: Vec<f64> = times
            .iter()
            .filter(|(f, _)| *f == on)
            .map(|(_, d)| d.as_secs_f64())
            .collect();
        t.iter().sum::<f64>() / t.len() as f64
    };
    let (off, on) = (mean(false), mean(true));
    println!(
        "rejoin with the flag off {off:.2} s, on {on:.2} s: on is {:.1}x faster (target >= 5x)",
        off / on
    );
}
