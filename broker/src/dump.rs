//! `dump-log`: the final state of every partition replica in a data directory, one JSON line per
//! replica in the `replicas.jsonl` shape of the history spec. It only reads: it is safe to run on
//! the data directory of a running broker, and it never repairs what it finds.
//!
//! Besides the spec's fields a row may carry `notes`, a list of strings saying what could not be
//! read or looked wrong (a gap between segments, a batch that does not parse, a high watermark
//! that is unknown). A high watermark is left out, never guessed, when the
//! `replication-offset-checkpoint` cannot be read or has no entry for the replica: a checker
//! would take a guessed 0 to mean that nothing was ever committed. Each row also carries
//! `cluster_id` (from `meta.properties`), for mirror topics `mirror_state`, so checkers can
//! tell mirrored epochs from local ones, and for a replica that rebuilt its log from the remote
//! store `remote_bootstrap` (where its local log began then, and in which leader epoch), which
//! local retention would otherwise hide; for a replica once elected uncleanly (a forced election,
//! or KIP-966's last known leader), `unclean_elections`, each epoch with its log end then.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;
use serde_json::{json, Value};

use crate::broker::{
    read_cluster_id, read_hw_checkpoint, HW_CHECKPOINT_FILE, LOG_START_CHECKPOINT_FILE,
};
use crate::config::RemoteStoreConfig;
use crate::log::batch;
use crate::log::epoch_cache::{parse_checkpoint, CHECKPOINT_FILE};
use crate::log::producer_state::{self, ProducerStates};
use crate::partition::{
    read_unclean_elections, PersistedState, RemoteBootstrap, REMOTE_BOOTSTRAP_FILE, STATE_FILE,
};
use crate::tiered::manager::TieredStore;

/// Which replicas to dump and how to label them.
#[derive(Clone, Debug, Default)]
pub struct DumpOptions {
    pub data_dir: PathBuf,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub node: Option<String>,
    pub cluster: Option<String>,
    /// The remote store (a `remote.log.storage.dir`, or the S3 bucket a broker's configuration
    /// names, credentials from the environment): its segments of each partition are listed
    /// under `"tiered"`.
    pub remote: Option<RemoteStoreConfig>,
}

/// Writes one line per replica found; returns how many were written.
pub fn dump(opts: &DumpOptions, out: &mut impl Write) -> anyhow::Result<usize> {
    let hws =
        read_hw_checkpoint(&opts.data_dir.join(HW_CHECKPOINT_FILE)).map_err(|e| format!("{e:#}"));
    // A missing or unreadable log-start checkpoint leaves the start at the first segment.
    let starts =
        read_hw_checkpoint(&opts.data_dir.join(LOG_START_CHECKPOINT_FILE)).unwrap_or_default();
    let cluster_id = read_cluster_id(&opts.data_dir)?;
    let mut replicas = BTreeMap::new();
    let entries = std::fs::read_dir(&opts.data_dir)
        .map_err(|e| anyhow::anyhow!("cannot read data dir {}: {e}", opts.data_dir.display()))?;
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().to_string();
        let Some((topic, part)) = name.rsplit_once('-') else {
            continue;
        };
        let Ok(part) = part.parse::<i32>() else {
            continue;
        };
        if opts.topic.as_deref().is_some_and(|t| t != topic)
            || opts.partition.is_some_and(|p| p != part)
        {
            continue;
        }
        replicas.insert((topic.to_string(), part), entry.path());
    }
    let store = match &opts.remote {
        Some(config) => Some(TieredStore::open(config).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let mut n = 0;
    for ((topic, part), dir) in replicas {
        let hw = match &hws {
            Ok(hws) => hws
                .get(&(topic.clone(), part))
                .copied()
                .ok_or_else(|| format!("no entry for {topic}-{part} in {HW_CHECKPOINT_FILE}")),
            Err(e) => Err(e.clone()),
        };
        let stored_start = starts.get(&(topic.clone(), part)).copied();
        let mut line = match replica_state(&dir, hw, stored_start) {
            Ok(v) => v,
            Err(e) => json!({"error": e.to_string()}),
        };
        if let Some(store) = &store {
            let local_start = line["log_start_offset"].as_i64();
            line["tiered"] = tiered_state(store, &topic, part, stored_start, local_start)?;
        }
        let obj = line.as_object_mut().expect("a JSON object");
        obj.insert("topic".into(), json!(topic));
        obj.insert("partition".into(), json!(part));
        if let Some(node) = &opts.node {
            obj.insert("node".into(), json!(node));
        }
        if let Some(cluster) = &opts.cluster {
            obj.insert("cluster".into(), json!(cluster));
        }
        if let Some(id) = &cluster_id {
            obj.insert("cluster_id".into(), json!(id));
        }
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
        n += 1;
    }
    Ok(n)
}

/// A replica's tiered side: the partition's log start (below the local one when older offsets
/// are remote), the local log start, and every segment the remote store's metadata lists for the
/// partition (any topic id of that name), oldest first, each finished one with its records.
fn tiered_state(
    store: &TieredStore,
    topic: &str,
    partition: i32,
    stored_start: Option<i64>,
    local_start: Option<i64>,
) -> anyhow::Result<Value> {
    use crate::tiered::metadata::SegmentState;
    use crate::tiered::storage::TopicIdPartition;
    let mut segments = Vec::new();
    for topic_id in store.metadata.topic_ids(topic, partition)? {
        let tp = TopicIdPartition {
            topic_id,
            topic: topic.to_string(),
            partition,
        };
        segments.extend(store.metadata.list(&tp)?);
    }
    segments.sort_by_key(|s| (s.start_offset, s.event_timestamp_ms));
    // Without a checkpointed log start yet (a broker that has not written one), the oldest
    // finished remote segment is where the partition starts (total retention deletes from the
    // oldest).
    let stored_start = stored_start.or_else(|| {
        segments
            .iter()
            .find(|s| s.state == SegmentState::CopySegmentFinished)
            .map(|s| s.start_offset)
    });
    let log_start = match (stored_start, local_start) {
        (Some(s), Some(l)) => Some(s.min(l)),
        (s, l) => l.or(s),
    };
    let mut rows = Vec::new();
    for s in &segments {
        let mut row = json!({
            "topic_id": s.segment.partition.topic_id,
            "id": s.segment.id,
            "start_offset": s.start_offset,
            "end_offset": s.end_offset,
            "state": s.state,
            "segment_leader_epochs": s.segment_leader_epochs.iter().map(|(e, o)| json!([e, o])).collect::<Vec<_>>(),
            "broker_id": s.broker_id,
        });
        // A finished copy is what readers are served; its records let a checker read every
        // offset below the local log start.
        if s.state == SegmentState::CopySegmentFinished {
            row["records"] = match store.storage.fetch_segment(&s.segment, 0, None) {
                Ok(bytes) => json!(remote_records(&bytes)?),
                Err(e) => {
                    row["error"] = json!(e.to_string());
                    json!([])
                }
            };
        }
        rows.push(row);
    }
    Ok(json!({
        "log_start_offset": log_start,
        "local_log_start_offset": local_start,
        "remote_segments": rows,
    }))
}

/// The data records of a remote segment's bytes as `[offset, value, leader epoch]`.
fn remote_records(bytes: &[u8]) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (pos, h) in batch::split_batches(bytes)? {
        if h.is_control {
            continue;
        }
        let mut buf = Bytes::copy_from_slice(&bytes[pos..pos + h.size]);
        let set = RecordBatchDecoder::decode(&mut buf)
            .map_err(|e| anyhow::anyhow!("cannot decode remote batch at {pos}: {e}"))?;
        for r in set.records {
            out.push(json!([
                r.offset,
                render_value(r.value.as_ref()),
                h.leader_epoch
            ]));
        }
    }
    Ok(out)
}

/// Renders a record value as the queue workload wrote it: a decimal integer, else base64 `raw`.
pub fn render_value(value: Option<&Bytes>) -> Value {
    match value {
        None => Value::Null,
        Some(v) => match std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
        {
            Some(n) => json!(n),
            None => json!({"raw": base64::engine::general_purpose::STANDARD.encode(v)}),
        },
    }
}

/// The state of the replica in `dir`; `hw` is its checkpointed high watermark, or why it is
/// unknown; `stored_start` its checkpointed log start offset. Records below the log start (in
/// the first segment, after DeleteRecords) are left out, as no reader can fetch them.
fn replica_state(
    dir: &Path,
    hw: Result<i64, String>,
    stored_start: Option<i64>,
) -> anyhow::Result<Value> {
    let mut bases: Vec<i64> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(".log")
                .and_then(|s| s.parse().ok())
        })
        .collect();
    bases.sort_unstable();
    let first_base = bases.first().copied().unwrap_or(0);
    let mut records = Vec::new();
    let mut headers = Vec::new();
    let mut next_offset = first_base;
    let mut notes = Vec::new();
    let min_start = stored_start.unwrap_or(first_base);
    'segments: for base in &bases {
        let path = dir.join(crate::log::segment::file_name(*base, "log"));
        let data = std::fs::read(&path)?;
        if *base > next_offset && next_offset != first_base {
            notes.push(format!("gap before segment {base}"));
        }
        let mut pos = 0usize;
        while pos < data.len() {
            let h = match batch::parse_header(&data[pos..]) {
                Ok(h) if pos + h.size <= data.len() => h,
                Ok(_) => {
                    notes.push(format!(
                        "{}: incomplete batch at position {pos}",
                        path.display()
                    ));
                    break 'segments;
                }
                Err(e) => {
                    notes.push(format!("{}: {e} at position {pos}", path.display()));
                    break 'segments;
                }
            };
            let raw = &data[pos..pos + h.size];
            if let Err(e) = batch::verify_crc(raw) {
                notes.push(format!("{}: {e} at position {pos}", path.display()));
                break 'segments;
            }
            if !h.is_control {
                let mut buf = Bytes::copy_from_slice(raw);
                let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| {
                    anyhow::anyhow!("{}: cannot decode batch at {pos}: {e}", path.display())
                })?;
                for r in set.records.into_iter().filter(|r| r.offset >= min_start) {
                    records.push(json!([
                        r.offset,
                        render_value(r.value.as_ref()),
                        h.leader_epoch
                    ]));
                }
            }
            next_offset = h.next_offset();
            pos += h.size;
            headers.push(h);
        }
    }
    let log_start = stored_start.map_or(first_base, |s| s.clamp(first_base, next_offset));
    let producers = producers(dir, log_start, next_offset, &headers, &mut notes);
    let epochs = match std::fs::read_to_string(dir.join(CHECKPOINT_FILE)) {
        Ok(text) => parse_checkpoint(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.join(CHECKPOINT_FILE).display()))?
            .into_iter()
            .map(|e| json!([e.epoch, e.start_offset]))
            .collect(),
        Err(_) => Vec::new(),
    };
    let state: Option<PersistedState> = std::fs::read(dir.join(STATE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let role = match &state {
        Some(s) if s.leader == s.node_id => "leader",
        Some(_) => "follower",
        None => "unknown",
    };
    let mut v = json!({
        "role": role,
        "log_start_offset": log_start,
        "log_end_offset": next_offset,
        "epochs": epochs,
        "records": records,
        "producers": producers,
    });
    match hw {
        Ok(hw) => v["high_watermark"] = json!(hw.min(next_offset)),
        Err(why) => notes.push(format!("high watermark unknown: {why}")),
    }
    if let Some(s) = state {
        v["leader_epoch"] = json!(s.leader_epoch);
        v["isr"] = json!(s.isr);
        // Mirrored epochs came from the other cluster; a checker needs to know which is which.
        if let Some(m) = s.mirror_state {
            v["mirror_state"] = json!(m.name());
        }
    }
    match read_unclean_elections(dir) {
        Ok(elections) if !elections.is_empty() => v["unclean_elections"] = json!(elections),
        Ok(_) => {}
        Err(e) => notes.push(e),
    }
    // Where the replica last rebuilt its log from the remote store, if it ever did.
    let bootstrap = dir.join(REMOTE_BOOTSTRAP_FILE);
    let read = match std::fs::read(&bootstrap) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(e.to_string())),
        Ok(bytes) => {
            Some(serde_json::from_slice::<RemoteBootstrap>(&bytes).map_err(|e| e.to_string()))
        }
    };
    match read {
        Some(Ok(b)) => v["remote_bootstrap"] = json!(b),
        Some(Err(e)) => notes.push(format!("{}: {e}", bootstrap.display())),
        None => {}
    }
    if !notes.is_empty() {
        v["notes"] = json!(notes);
    }
    Ok(v)
}

/// The replica's idempotent producers as its broker rebuilds them when it opens the log: the
/// newest usable snapshot between the log start and the log end, then the batches after it
/// (all of them without one). Each as `[producer_id, epoch, last_sequence, last_offset]`, by
/// producer id. Reads only: an unusable snapshot is noted, not removed.
fn producers(
    dir: &Path,
    log_start: i64,
    log_end: i64,
    headers: &[batch::BatchHeader],
    notes: &mut Vec<String>,
) -> Value {
    let mut offsets = producer_state::snapshot_offsets(dir).unwrap_or_default();
    offsets.retain(|s| (log_start..=log_end).contains(s));
    let (mut states, mut from) = (ProducerStates::default(), log_start);
    for s in offsets.into_iter().rev() {
        match producer_state::read_snapshot(dir, s) {
            Ok(read) => {
                (states, from) = (read, s);
                break;
            }
            Err(why) => notes.push(format!("unusable producer snapshot: {why}")),
        }
    }
    for h in headers.iter().filter(|h| h.base_offset >= from) {
        states.update(h);
    }
    states
        .iter()
        .filter_map(|p| {
            let last = p.batches.back()?;
            Some(json!([
                p.producer_id,
                p.epoch,
                last.last_seq,
                last.last_offset
            ]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump_dir(dir: &Path) -> Vec<Value> {
        let mut out = Vec::new();
        let opts = DumpOptions {
            data_dir: dir.to_path_buf(),
            ..DumpOptions::default()
        };
        dump(&opts, &mut out).unwrap();
        out.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    /// An unreadable checkpoint leaves the high watermark unknown, and says why, rather than 0:
    /// a checker would take 0 to mean nothing was ever committed.
    #[test]
    fn an_unreadable_hw_checkpoint_leaves_the_high_watermark_unknown_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("t-0")).unwrap();
        std::fs::create_dir(dir.path().join("u-1")).unwrap();
        let checkpoint = dir.path().join(HW_CHECKPOINT_FILE);
        std::fs::write(&checkpoint, "0\n1\nt 0 0\n").unwrap();
        let rows = dump_dir(dir.path());
        assert_eq!(rows[0]["high_watermark"], 0);
        assert!(rows[0].get("notes").is_none(), "{}", rows[0]);
        assert!(rows[1].get("high_watermark").is_none(), "{}", rows[1]);
        let note = rows[1]["notes"][0].as_str().unwrap();
        assert!(note.contains("no entry for u-1"), "{note}");

        std::fs::write(&checkpoint, "0\n1\nt zero 0\n").unwrap();
        for row in dump_dir(dir.path()) {
            assert!(row.get("high_watermark").is_none(), "{row}");
            let note = row["notes"][0].as_str().unwrap();
            assert!(note.starts_with("high watermark unknown"), "{note}");
            assert!(note.contains(HW_CHECKPOINT_FILE), "{note}");
        }
    }
}
