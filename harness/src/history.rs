//! Streaming the history to `history.jsonl` while the test runs, so a killed run keeps a
//! checkable prefix. The header line comes first; ops are serialized and written by a thread of
//! their own (so the runner's loop never waits on JSON or the disk), and the file is flushed at
//! least every [`FLUSH_EVERY`] and on every [`HistoryWriter::flush`].

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use crate::op::Op;

/// The longest a recorded op may sit in memory before it reaches the file.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

enum Msg {
    Op(Box<Op>),
    Flush(mpsc::Sender<()>),
}

/// Appends ops to `history.jsonl`, assigning dense indices.
pub struct HistoryWriter {
    path: PathBuf,
    tx: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    failed: Arc<Mutex<Option<String>>>,
    next_index: u64,
}

impl HistoryWriter {
    /// Creates the file and writes the header `{"tidemark_history": 1, "test": test}`.
    pub fn create(path: &Path, test: &Value) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        // Written by hand so the format marker comes first, as the spec shows it.
        let header = format!(
            "{{\"tidemark_history\":1,\"test\":{}}}\n",
            serde_json::to_string(test)?
        );
        out.write_all(header.as_bytes())
            .and_then(|_| out.flush())
            .with_context(|| format!("writing {}", path.display()))?;
        let (tx, rx) = mpsc::channel();
        let failed = Arc::new(Mutex::new(None));
        let thread = {
            let failed = failed.clone();
            std::thread::Builder::new()
                .name("tdm-history".into())
                .spawn(move || {
                    if let Err(e) = write_loop(out, rx) {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    }
                })
                .context("starting the history writer")?
        };
        Ok(HistoryWriter {
            path: path.to_path_buf(),
            tx: Some(tx),
            thread: Some(thread),
            failed,
            next_index: 0,
        })
    }

    /// Gives `op` the next index, shows it to `observe` (the runner tells the generator), and
    /// queues it for writing.
    pub fn append(&mut self, mut op: Op, observe: impl FnOnce(&Op)) -> anyhow::Result<()> {
        self.check()?;
        op.index = self.next_index;
        self.next_index += 1;
        observe(&op);
        self.send(Msg::Op(Box::new(op)))
    }

    /// Returns once everything appended so far is in the file.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        let (ack, done) = mpsc::channel();
        self.send(Msg::Flush(ack))?;
        let _ = done.recv();
        self.check()
    }

    fn send(&self, msg: Msg) -> anyhow::Result<()> {
        let sent = self.tx.as_ref().map(|tx| tx.send(msg).is_ok());
        if sent != Some(true) {
            self.check()?;
            anyhow::bail!("the history writer for {} stopped", self.path.display());
        }
        Ok(())
    }

    fn check(&self) -> anyhow::Result<()> {
        match &*self.failed.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(anyhow::anyhow!("writing {}: {e}", self.path.display())),
            None => Ok(()),
        }
    }
}

/// The writer thread: one line per op; flushes when the last flush is older than
/// [`FLUSH_EVERY`], when nothing arrived for that long, and when asked.
fn write_loop(mut out: BufWriter<File>, rx: mpsc::Receiver<Msg>) -> std::io::Result<()> {
    let mut last_flush = Instant::now();
    let mut dirty = false;
    loop {
        match rx.recv_timeout(FLUSH_EVERY) {
            Ok(Msg::Op(op)) => {
                serde_json::to_writer(&mut out, &op)?;
                out.write_all(b"\n")?;
                dirty = true;
            }
            Ok(Msg::Flush(ack)) => {
                out.flush()?;
                dirty = false;
                last_flush = Instant::now();
                let _ = ack.send(());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return out.flush(),
        }
        if dirty && last_flush.elapsed() >= FLUSH_EVERY {
            out.flush()?;
            dirty = false;
            last_flush = Instant::now();
        }
    }
}

impl Drop for HistoryWriter {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
            ..Op::new(
                5,
                Process::Client(0),
                OpType::Invoke,
                f,
                json!({"topic": "t", "partition": 0, "values": [1]}),
            )
        }
    }

    #[test]
    fn header_first_then_dense_indices_readable_by_the_checkers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let mut w = HistoryWriter::create(&path, &json!({"name": "t", "seed": 1})).unwrap();
        let mut seen = Vec::new();
        w.append(op("send"), |o| seen.push(o.index)).unwrap();
        w.append(op("send"), |o| seen.push(o.index)).unwrap();
        assert_eq!(seen, vec![0, 1]);
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
        w.append(op("send"), |_| {}).unwrap();
        w.append(op("poll"), |_| {}).unwrap();
        // No flush asked for: the writer gets the lines out on its own.
        std::thread::sleep(3 * FLUSH_EVERY);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        drop(w);
    }
}
