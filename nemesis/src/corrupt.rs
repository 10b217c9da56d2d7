//! Disk faults (Jepsen's `truncate-file` and `bitflip`, as in the NATS analysis): `corrupt-file`
//! kills its targets (a minority, so committed data survives elsewhere, unless the replicas that
//! kept it crash too and the damaged one is the last to have led: Kafka then elects it, KIP-966's
//! last known leader, and the verdict policy allows what its damage took), damages the newest
//! segment of one partition replica on each through the database's [`DataDir`] ability, and
//! leaves them stopped; a later `start` brings them back and their recovery must notice.
//!
//! - `truncate` cuts the last bytes of the segment (usually mid-batch: a torn tail).
//! - `bitflip` flips bits inside the CRC-covered part of the last batches, so a broker that
//!   checks CRCs on recovery can tell.
//!
//! The record names node, file (relative to the data directory, so a replay in a new run finds
//! it), the size before, and the offset and bytes changed, with the flipped bits.
//!
//! [`DataDir`]: tidemark_harness::db::DataDir

use std::path::{Path, PathBuf};

use rand::seq::IndexedRandom;
use rand::RngExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tidemark_harness::generator::Rng;
use tidemark_harness::remote::{self, command_line, escape};
use tidemark_harness::runtime::Node;

use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::{known_node, NodeSpec, TargetFields, Targets};

/// The disk fault.
pub struct Corrupt;

/// The most bytes a truncation cuts.
const MAX_CUT: u64 = 4096;
/// How many of the last batches a bit flip may hit.
const TAIL_BATCHES: usize = 8;
/// Where a Kafka v2 batch's CRC-covered part starts (after offset, length, epoch, magic, crc).
const CRC_START: u64 = 21;

/// One damaged file, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Damage {
    /// The node.
    pub node: String,
    /// Relative to the data directory, e.g. `t0-1/00000000000000000000.log`.
    pub file: String,
    /// `truncate` or `bitflip`.
    pub mode: Mode,
    /// The file's size before.
    #[serde(default)]
    pub size: u64,
    /// Truncate: the new length. Bitflip: the first flipped position.
    pub offset: u64,
    /// Truncate: bytes cut. Bitflip: bytes changed.
    #[serde(default)]
    pub bytes: u64,
    /// Bitflip: `(position, bit)` of every flip.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flips: Vec<(u64, u8)>,
}

/// What to do to a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Cut its tail.
    Truncate,
    /// Flip bits in its last batches.
    Bitflip,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Truncate => "truncate",
            Mode::Bitflip => "bitflip",
        }
    }
}

impl Damage {
    /// Checks a parsed record at `field` against the test's `nodes`.
    fn check(&self, nodes: &[String], field: &str) -> Result<(), String> {
        known_node(&self.node, nodes, &format!("{field}.node"))?;
        if !is_segment_path(&self.file) {
            return Err(format!(
                "field `{field}.file`: expected <topic>-<partition>/<20 digits>.log, got {:?}",
                self.file
            ));
        }
        if self.mode == Mode::Bitflip && self.flips.is_empty() {
            return Err(format!("field `{field}.flips`: a bitflip needs its flips"));
        }
        if let Some(i) = self.flips.iter().position(|(_, bit)| *bit > 7) {
            return Err(format!("field `{field}.flips[{i}]`: bits are 0 to 7"));
        }
        Ok(())
    }
}

/// The value of `corrupt-file`: targets and a mode (drawn when absent), or in a recorded `info`
/// the damage done, which a replay does again.
#[derive(Debug, Default, Deserialize)]
struct CorruptValue {
    #[serde(default)]
    nodes: Option<Vec<String>>,
    #[serde(default)]
    targets: Option<NodeSpec>,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    files: Option<Vec<Damage>>,
}

/// A parsed `corrupt-file`.
#[derive(Debug, PartialEq)]
struct CorruptOp {
    /// What to damage: these records again, or a plan drawn on the resolved targets.
    what: Plan,
    mode: Option<Mode>,
}

#[derive(Debug, PartialEq)]
enum Plan {
    Replay(Vec<Damage>),
    Draw(Targets),
}

impl CorruptOp {
    fn parse(value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: CorruptValue = parse(value)?;
        let what = match v.files {
            Some(files) => {
                for (i, d) in files.iter().enumerate() {
                    d.check(nodes, &format!("files[{i}]"))?;
                }
                Plan::Replay(files)
            }
            None => Plan::Draw(
                TargetFields {
                    nodes: v.nodes,
                    targets: v.targets,
                }
                .targets(nodes, None)?,
            ),
        };
        Ok(CorruptOp { what, mode: v.mode })
    }
}

/// Whether `p` looks like `<topic>-<partition>/<20 digits>.log` (and climbs nowhere).
pub fn is_segment_path(p: &str) -> bool {
    let Some((dir, file)) = p.split_once('/') else {
        return false;
    };
    let replica = dir.rsplit_once('-').is_some_and(|(t, i)| {
        !t.is_empty() && !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit())
    });
    let segment = file
        .strip_suffix(".log")
        .is_some_and(|s| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()));
    replica && segment && !dir.starts_with("__") && !dir.contains("..")
}

/// Lists `(relative path, size)` of the newest segment of every partition replica in `data`.
fn newest_segments(node: &Node, data: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let script = format!(
        "cd {} 2>/dev/null || exit 0; for d in *-*; do case \"$d\" in __*) continue;; esac; \
         [ -d \"$d\" ] || continue; \
         f=$(ls \"$d\" | grep -E '^[0-9]{{20}}\\.log$' | sort | tail -n 1); \
         [ -n \"$f\" ] && echo \"$d/$f $(stat -c %s \"$d/$f\")\"; done; true",
        escape(&data.display().to_string())
    );
    let out = remote::run(node.remote.as_ref(), &script)?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let (path, size) = l.rsplit_once(' ')?;
            Some((path.to_string(), size.parse().ok()?))
        })
        .filter(|(p, _)| is_segment_path(p))
        .collect())
}

/// `(start, end)` of every whole batch in a Kafka segment.
pub fn batches(bytes: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 12 <= bytes.len() {
        let len = i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().expect("4 bytes"));
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|l| (pos + 12).checked_add(l))
        else {
            break;
        };
        if len < CRC_START as i32 || end > bytes.len() {
            break;
        }
        out.push((pos as u64, end as u64));
        pos = end;
    }
    out
}

/// Chooses one to three bit flips inside the CRC-covered part of the last batches (anywhere in
/// the file when it holds no whole batch).
pub fn choose_flips(bytes: &[u8], rng: &mut Rng) -> Vec<(u64, u8)> {
    let all = batches(bytes);
    let tail = &all[all.len().saturating_sub(TAIL_BATCHES)..];
    let k = rng.random_range(1..=3);
    let mut flips: Vec<(u64, u8)> = (0..k)
        .map(|_| {
            let pos = match tail.choose(rng) {
                Some((start, end)) => rng.random_range(start + CRC_START..*end),
                None => rng.random_range(0..bytes.len() as u64),
            };
            (pos, rng.random_range(0..8u8))
        })
        .collect();
    flips.sort_unstable();
    flips.dedup();
    flips
}

/// The command that writes `byte` at `pos` of `path` in place.
fn poke_command(path: &str, pos: u64, byte: u8) -> String {
    format!(
        "printf '\\{:03o}' | dd of={} bs=1 seek={pos} count=1 conv=notrunc 2>/dev/null",
        byte,
        escape(path)
    )
}

/// Applies `damage` (whose offsets are known) to the file under `data` on `node`.
fn apply(node: &Node, data: &Path, damage: &Damage) -> anyhow::Result<()> {
    let path = data.join(&damage.file).display().to_string();
    match damage.mode {
        Mode::Truncate => {
            remote::run(
                node.remote.as_ref(),
                &command_line(&["truncate", "-s", &damage.offset.to_string(), &path]),
            )?;
        }
        Mode::Bitflip => {
            let bytes = download(node, Path::new(&path))?;
            let mut cmds = Vec::new();
            let mut changed = bytes.clone();
            for (pos, bit) in &damage.flips {
                let Some(b) = changed.get_mut(*pos as usize) else {
                    anyhow::bail!("{path} has no byte {pos} (size {})", bytes.len());
                };
                *b ^= 1 << bit;
                cmds.push(poke_command(&path, *pos, *b));
            }
            remote::run(node.remote.as_ref(), &cmds.join(" && "))?;
        }
    }
    Ok(())
}

fn download(node: &Node, path: &Path) -> anyhow::Result<Vec<u8>> {
    let local = tempfile::NamedTempFile::new()?;
    node.remote.download(path, local.path())?;
    Ok(std::fs::read(local.path())?)
}

/// Picks a segment on `node` and decides the damage.
fn plan(node: &Node, data: &Path, mode: Mode, rng: &mut Rng) -> anyhow::Result<Damage> {
    let segments = newest_segments(node, data)?;
    let with_data: Vec<&(String, u64)> = segments.iter().filter(|(_, s)| *s > 0).collect();
    let (file, size) = with_data
        .choose(rng)
        .map(|s| (*s).clone())
        .ok_or_else(|| anyhow::anyhow!("no segment with data under {}", data.display()))?;
    Ok(match mode {
        Mode::Truncate => {
            let cut = rng.random_range(1..=size.min(MAX_CUT));
            Damage {
                node: node.name.clone(),
                file,
                mode,
                size,
                offset: size - cut,
                bytes: cut,
                flips: Vec::new(),
            }
        }
        Mode::Bitflip => {
            let bytes = download(node, &data.join(&file))?;
            let flips = choose_flips(&bytes, rng);
            let distinct: std::collections::BTreeSet<u64> = flips.iter().map(|f| f.0).collect();
            Damage {
                node: node.name.clone(),
                file,
                mode,
                size: bytes.len() as u64,
                offset: flips.first().map_or(0, |f| f.0),
                bytes: distinct.len() as u64,
                flips,
            }
        }
    })
}

impl Fault for Corrupt {
    fn fs(&self) -> &'static [&'static str] {
        &["corrupt-file"]
    }

    fn parse<'a>(
        &'a self,
        _f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(CorruptOp::parse(value, nodes)?))
    }
}

impl FaultOp for CorruptOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let kill = env
            .cx
            .db
            .as_kill()
            .ok_or_else(|| Failed::nothing("the database cannot be stopped"))?;
        let data_dir = env
            .cx
            .db
            .as_data_dir()
            .ok_or_else(|| Failed::nothing("the database does not say where its data is"))?;
        let CorruptOp { what, mode } = *self;
        let (replay, targets, nodes) = match what {
            Plan::Replay(list) => {
                let mut nodes: Vec<String> = list.iter().map(|d| d.node.clone()).collect();
                nodes.sort();
                nodes.dedup();
                (Some(list), None, nodes)
            }
            Plan::Draw(t) => {
                let nodes = env.resolve(&t)?;
                (None, t.spec_name(), nodes)
            }
        };
        let mode = match mode {
            Some(m) => m,
            None if env.rng.random_bool(0.5) => Mode::Truncate,
            None => Mode::Bitflip,
        };
        let (stopped, mut errors) = env.on_each(&nodes, |n| kill.kill(n));
        // Plans draw from the RNG one node at a time, so a seed gives the same damage.
        let mut damage = Vec::new();
        let all_nodes = env.cx.nodes;
        for name in &stopped {
            let Some(node) = all_nodes.iter().find(|n| &n.name == name) else {
                continue;
            };
            let data: PathBuf = data_dir.data_dir(node);
            let planned: anyhow::Result<Vec<Damage>> = match &replay {
                Some(list) => Ok(list.iter().filter(|d| &d.node == name).cloned().collect()),
                None => plan(node, &data, mode, env.rng).map(|d| vec![d]),
            };
            let result = planned.and_then(|ds| {
                for d in &ds {
                    apply(node, &data, d)?;
                }
                Ok(ds)
            });
            match result {
                Ok(ds) => damage.extend(ds),
                Err(e) => errors.push(format!("{name}: {e:#}")),
            }
        }
        let mut record = json!({
            "nodes": stopped,
            "mode": mode.name(),
            "files": damage,
        });
        if let Some(spec) = targets {
            record["targets"] = json!(spec);
        }
        Failed::partly(record, &errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_harness::generator::rng;

    /// A segment of `n` fake batches of `len` bytes each (12-byte prefix plus body).
    fn segment(n: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            out.extend((i as i64).to_be_bytes());
            out.extend(((len - 12) as i32).to_be_bytes());
            out.extend(std::iter::repeat_n(0xAB, len - 12));
        }
        out
    }

    #[test]
    fn batches_are_found_and_a_torn_tail_is_not_one() {
        let mut s = segment(3, 70);
        assert_eq!(batches(&s), vec![(0, 70), (70, 140), (140, 210)]);
        s.truncate(200);
        assert_eq!(batches(&s).len(), 2);
    }

    #[test]
    fn flips_land_in_the_crc_covered_part_of_the_last_batches() {
        let s = segment(20, 60);
        for seed in 0..50 {
            let flips = choose_flips(&s, &mut rng(seed));
            assert!((1..=3).contains(&flips.len()));
            for (pos, bit) in flips {
                assert!(bit < 8);
                let within = pos % 60;
                assert!(within >= CRC_START, "{pos}");
                assert!(pos >= 12 * 60, "not in the last eight batches: {pos}");
            }
        }
        let tiny = vec![1u8, 2, 3];
        let flips = choose_flips(&tiny, &mut rng(1));
        assert!(flips.iter().all(|(p, _)| *p < 3));
    }

    #[test]
    fn segment_paths_are_checked() {
        assert!(is_segment_path("t0-1/00000000000000000000.log"));
        assert!(is_segment_path("my-topic-12/00000000000000004096.log"));
        assert!(!is_segment_path(
            "__cluster_metadata-0/00000000000000000000.log"
        ));
        assert!(!is_segment_path("t0-1/0000.log"));
        assert!(!is_segment_path("../t0-1/00000000000000000000.log"));
        assert!(!is_segment_path("t0/00000000000000000000.log"));
    }

    #[test]
    fn a_bit_flip_is_written_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        std::fs::write(&path, [0u8, 0x10, 0xff]).unwrap();
        let p = path.display().to_string();
        let local = tidemark_harness::remote::Local::host();
        remote::run(&local, &poke_command(&p, 1, 0x90)).unwrap();
        remote::run(&local, &poke_command(&p, 2, 0x00)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![0u8, 0x90, 0x00]);
    }

    #[test]
    fn records_round_trip_and_bad_ones_name_the_field() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let d = Damage {
            node: "n2".into(),
            file: "t0-1/00000000000000000000.log".into(),
            mode: Mode::Bitflip,
            size: 900,
            offset: 850,
            bytes: 2,
            flips: vec![(850, 3), (861, 0)],
        };
        let recorded = serde_json::to_value(&d).unwrap();
        let parse = |v: Value| CorruptOp::parse(&v, &nodes);
        assert_eq!(
            parse(json!({"files": [recorded], "nodes": ["n2"], "mode": "bitflip"})),
            Ok(CorruptOp {
                what: Plan::Replay(vec![d.clone()]),
                mode: Some(Mode::Bitflip)
            })
        );
        assert_eq!(
            parse(json!({"targets": "one"})),
            Ok(CorruptOp {
                what: Plan::Draw(Targets::Spec(NodeSpec::One)),
                mode: None
            })
        );
        let truncated = Damage {
            mode: Mode::Truncate,
            flips: Vec::new(),
            ..d.clone()
        };
        assert_eq!(
            serde_json::to_value(&truncated).unwrap(),
            json!({"node": "n2", "file": "t0-1/00000000000000000000.log", "mode": "truncate",
                   "size": 900, "offset": 850, "bytes": 2})
        );
        let mut bad = serde_json::to_value(&d).unwrap();
        bad["file"] = json!("../../etc/passwd");
        let e = parse(json!({"files": [recorded, bad]})).unwrap_err();
        assert!(e.starts_with("field `files[1].file`"), "{e}");
        let mut bad = serde_json::to_value(&d).unwrap();
        bad["flips"] = json!([[850, 9]]);
        let e = parse(json!({"files": [bad]})).unwrap_err();
        assert!(e.starts_with("field `files[0].flips[0]`"), "{e}");
        let e = parse(json!({"files": [{"node": "n2"}]})).unwrap_err();
        assert!(
            e.starts_with("field `files[0]`: missing field `file`"),
            "{e}"
        );
        let e = parse(json!({"targets": "one", "mode": "shred"})).unwrap_err();
        assert!(e.starts_with("field `mode`"), "{e}");
    }
}
