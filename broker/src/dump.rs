//! `dump-log`: the final state of every partition replica in a data directory, one JSON line per
//! replica in the `replicas.jsonl` shape of the history spec. It only reads: it is safe to run on
//! the data directory of a running broker, and it never repairs what it finds.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;
use serde_json::{json, Value};

use crate::broker::{read_hw_checkpoint, HW_CHECKPOINT_FILE};
use crate::log::batch;
use crate::log::epoch_cache::{parse_checkpoint, CHECKPOINT_FILE};
use crate::partition::{PersistedState, STATE_FILE};

/// Which replicas to dump and how to label them.
#[derive(Clone, Debug, Default)]
pub struct DumpOptions {
    pub data_dir: PathBuf,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub node: Option<String>,
    pub cluster: Option<String>,
}

/// Writes one line per replica found; returns how many were written.
pub fn dump(opts: &DumpOptions, out: &mut impl Write) -> anyhow::Result<usize> {
    let hws = read_hw_checkpoint(&opts.data_dir.join(HW_CHECKPOINT_FILE)).unwrap_or_default();
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
    let mut n = 0;
    for ((topic, part), dir) in replicas {
        let mut line = match replica_state(&dir, hws.get(&(topic.clone(), part)).copied()) {
            Ok(v) => v,
            Err(e) => json!({"error": e.to_string()}),
        };
        let obj = line.as_object_mut().expect("a JSON object");
        obj.insert("topic".into(), json!(topic));
        obj.insert("partition".into(), json!(part));
        if let Some(node) = &opts.node {
            obj.insert("node".into(), json!(node));
        }
        if let Some(cluster) = &opts.cluster {
            obj.insert("cluster".into(), json!(cluster));
        }
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
        n += 1;
    }
    Ok(n)
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

fn replica_state(dir: &Path, hw: Option<i64>) -> anyhow::Result<Value> {
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
    let log_start = bases.first().copied().unwrap_or(0);
    let mut records = Vec::new();
    let mut next_offset = log_start;
    let mut notes = Vec::new();
    'segments: for base in &bases {
        let path = dir.join(crate::log::segment::file_name(*base, "log"));
        let data = std::fs::read(&path)?;
        if *base > next_offset && next_offset != log_start {
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
                for r in set.records {
                    records.push(json!([
                        r.offset,
                        render_value(r.value.as_ref()),
                        h.leader_epoch
                    ]));
                }
            }
            next_offset = h.next_offset();
            pos += h.size;
        }
    }
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
        "high_watermark": hw.unwrap_or(0).min(next_offset),
        "log_end_offset": next_offset,
        "epochs": epochs,
        "records": records,
    });
    if let Some(s) = state {
        v["leader_epoch"] = json!(s.leader_epoch);
        v["isr"] = json!(s.isr);
    }
    if !notes.is_empty() {
        v["notes"] = json!(notes);
    }
    Ok(v)
}
