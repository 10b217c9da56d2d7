//! Streaming the history to `history.jsonl` while the test runs, so a killed run keeps a
//! checkable prefix. The header line comes first; every op is written as it is recorded and the
//! file is flushed at least every [`FLUSH_EVERY`] (and on every call to [`HistoryWriter::flush`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use crate::op::Op;

/// The longest a recorded op may sit in memory before it reaches the file.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Appends ops to `history.jsonl`, assigning dense indices.
pub struct HistoryWriter {
    path: PathBuf,
    out: BufWriter<File>,
    next_index: u64,
    last_flush: Instant,
}

impl HistoryWriter {
    /// Creates the file and writes the header `{"tidemark_history": 1, "test": test}`.
    pub fn create(path: &Path, test: &Value) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = HistoryWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 16, file),
            next_index: 0,
            last_flush: Instant::now(),
        };
        // Written by hand so the format marker comes first, as the spec shows it.
        let header = format!(
            "{{\"tidemark_history\":1,\"test\":{}}}\n",
            serde_json::to_string(test)?
        );
        w.out
            .write_all(header.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        w.flush()?;
        Ok(w)
    }

    /// Writes `op` with the next index (overwriting the index it carries) and returns the op as
    /// written.
    pub fn append(&mut self, mut op: Op) -> anyhow::Result<Op> {
        op.index = self.next_index;
        self.next_index += 1;
        self.line(&op)?;
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(op)
    }

    /// Pushes everything written so far to the file.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.last_flush = Instant::now();
        Ok(())
    }

    /// Whether the last flush is older than [`FLUSH_EVERY`].
    pub fn flush_due(&self) -> bool {
        self.last_flush.elapsed() >= FLUSH_EVERY
    }

    fn line<T: serde::Serialize>(&mut self, v: &T) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, v)
            .and_then(|_| self.out.write_all(b"\n").map_err(serde_json::Error::io))
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

impl Drop for HistoryWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{OpType, Process};
    use serde_json::json;

    fn op(f: &str) -> Op {
        Op {
            index: 99,
            time: 5,
            process: Process::Client(0),
            kind: OpType::Invoke,
            f: f.into(),
            value: json!({"topic": "t", "partition": 0, "values": [1]}),
            node: None,
            cluster: None,
            error: None,
        }
    }

    #[test]
    fn header_first_then_dense_indices_readable_by_the_checkers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut w = HistoryWriter::create(&path, &json!({"name": "t", "seed": 1})).unwrap();
        assert_eq!(w.append(op("send")).unwrap().index, 0);
        assert_eq!(w.append(op("send")).unwrap().index, 1);
        drop(w);
        let text = std::fs::read_to_string(&path).unwrap();
        let header = text.lines().next().unwrap();
        assert!(header.starts_with("{\"tidemark_history\":1,"), "{header}");
        let first: Value = serde_json::from_str(header).unwrap();
        assert_eq!(first["tidemark_history"], json!(1));
        assert_eq!(first["test"]["seed"], json!(1));
        let reader = tidemark_checkers::read_history(std::io::BufReader::new(
            std::fs::File::open(&path).unwrap(),
        ))
        .unwrap();
        let indices: Vec<u64> = reader.map(|o| o.unwrap().index).collect();
        assert_eq!(indices, vec![0, 1]);
    }

    #[test]
    fn a_line_reaches_the_file_within_the_flush_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut w = HistoryWriter::create(&path, &json!({})).unwrap();
        w.append(op("send")).unwrap();
        std::thread::sleep(FLUSH_EVERY + Duration::from_millis(20));
        assert!(w.flush_due());
        w.append(op("poll")).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
    }
}
