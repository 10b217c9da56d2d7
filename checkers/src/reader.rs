//! Streaming readers for `history.jsonl` and `replicas.jsonl`. They sit in front of the pure
//! analyses: a history is read one line at a time from any [`BufRead`], so checking a run never
//! needs all of its ops in memory, and every problem is reported with the line it is on.

use std::collections::HashMap;
use std::io::{BufRead, Read};

use serde::Deserialize;
use serde_json::Value;

use crate::op::{Op, ReplicaState};
use crate::queue::LineOp;

/// Input that cannot be checked: a malformed line, a missing header, an unreadable file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct BadInput {
    /// The file, when the caller named it (see [`BadInput::in_file`]).
    pub file: Option<String>,
    /// The 1-based line the problem is on, when it is on one.
    pub line: Option<u64>,
    /// What is wrong.
    pub problem: String,
}

impl BadInput {
    /// A problem on `line`.
    pub fn at(line: u64, problem: impl Into<String>) -> Self {
        BadInput {
            file: None,
            line: Some(line),
            problem: problem.into(),
        }
    }

    /// A problem with the input as a whole.
    pub fn whole(problem: impl Into<String>) -> Self {
        BadInput {
            file: None,
            line: None,
            problem: problem.into(),
        }
    }

    /// The same problem, naming the file it was found in.
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }

    fn describe(&self) -> String {
        match (&self.file, self.line) {
            (Some(f), Some(l)) => format!("{f}:{l}: {}", self.problem),
            (Some(f), None) => format!("{f}: {}", self.problem),
            (None, Some(l)) => format!("line {l}: {}", self.problem),
            (None, None) => self.problem.clone(),
        }
    }
}

/// The longest line a history or replica file may hold, newline aside. A line is one op or one
/// replica: far larger than a log line can be (a poll of a few thousand records, a replica of a
/// few hundred thousand), but bounded, so a corrupt or endless file (`/dev/zero`) is bad input
/// naming its line instead of a read that grows until memory runs out.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// What [`read_line`] found.
enum Line {
    /// The input is over.
    End,
    /// A line (with its newline unless it is the last).
    Read,
    /// A line longer than [`MAX_LINE_BYTES`].
    TooLong,
}

/// Reads one line into `buf` (cleared first), reading at most one byte past the limit.
fn read_line(input: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<Line> {
    buf.clear();
    let n = input
        .take(MAX_LINE_BYTES as u64 + 1)
        .read_until(b'\n', buf)?;
    Ok(match n {
        0 => Line::End,
        n if n > MAX_LINE_BYTES && buf.last() != Some(&b'\n') => Line::TooLong,
        _ => Line::Read,
    })
}

fn too_long(line: u64) -> BadInput {
    BadInput::at(
        line,
        format!(
            "line longer than {} MiB (no newline within the limit)",
            MAX_LINE_BYTES >> 20
        ),
    )
}

/// The first line of a history.
#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Header {
    tidemark_history: u64,
    #[serde(default)]
    test: Value,
}

/// The history format version this crate reads.
pub const HISTORY_VERSION: u64 = 1;

/// Reads `history.jsonl` one op at a time. Created by [`read_history`], which has already read
/// and checked the header; iterating yields each op or the first problem, then stops.
///
/// A last line that lacks its newline and does not parse is what a killed run leaves behind:
/// it is skipped and noted in [`HistoryReader::warnings`] rather than rejected.
pub struct HistoryReader<R> {
    input: R,
    test: Value,
    header_line: u64,
    line: u64,
    next_index: u64,
    buf: Vec<u8>,
    warnings: Vec<String>,
    done: bool,
}

/// Reads the header of a history and returns a reader of its ops.
pub fn read_history<R: BufRead>(mut input: R) -> Result<HistoryReader<R>, BadInput> {
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        let read = read_line(&mut input, &mut buf)
            .map_err(|e| BadInput::at(line + 1, format!("cannot read: {e}")))?;
        line += 1;
        match read {
            Line::End => {
                return Err(BadInput::whole(
                    "empty history: no header line {\"tidemark_history\": 1, \"test\": {...}}",
                ))
            }
            Line::TooLong => return Err(too_long(line)),
            Line::Read => {}
        }
        if !buf.iter().all(u8::is_ascii_whitespace) {
            break;
        }
    }
    let header = parse_header(&buf).map_err(|p| BadInput::at(line, p))?;
    Ok(HistoryReader {
        input,
        test: header.test,
        header_line: line,
        line,
        next_index: 0,
        buf,
        warnings: Vec::new(),
        done: false,
    })
}

fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        format!("missing header: the first line must be {{\"tidemark_history\": 1, \"test\": {{...}}}} ({e})")
    })?;
    if v.get("tidemark_history").is_none() {
        return Err(
            "missing header: the first line must be {\"tidemark_history\": 1, \"test\": {...}}, \
             not an op"
                .into(),
        );
    }
    let header: Header = serde_json::from_value(v).map_err(|e| format!("malformed header: {e}"))?;
    if header.tidemark_history != HISTORY_VERSION {
        return Err(format!(
            "unsupported history version {} (this tidemark reads version {HISTORY_VERSION})",
            header.tidemark_history
        ));
    }
    if !(header.test.is_object() || header.test.is_null()) {
        return Err("malformed header: \"test\" must be an object".into());
    }
    Ok(header)
}

impl<R: BufRead> HistoryReader<R> {
    /// The test map from the header (`{}` when the header had none).
    pub fn test(&self) -> &Value {
        &self.test
    }

    /// The 1-based line number of the header.
    pub fn header_line(&self) -> u64 {
        self.header_line
    }

    /// The 1-based line number of the op most recently returned.
    pub fn line(&self) -> u64 {
        self.line
    }

    /// What was tolerated while reading, e.g. a truncated last line.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Reads the next line that is not blank into the buffer; false at the end of the input.
    fn advance(&mut self) -> Result<bool, BadInput> {
        loop {
            let read = read_line(&mut self.input, &mut self.buf)
                .map_err(|e| BadInput::at(self.line + 1, format!("cannot read: {e}")))?;
            match read {
                Line::End => return Ok(false),
                Line::TooLong => return Err(too_long(self.line + 1)),
                Line::Read => self.line += 1,
            }
            if !self.buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(true);
            }
        }
    }

    fn read_op(&mut self) -> Result<Option<Op>, BadInput> {
        if !self.advance()? {
            return Ok(None);
        }
        match serde_json::from_slice::<Op>(&self.buf) {
            Ok(op) => {
                expect_index(self.line, &mut self.next_index, op.index)?;
                Ok(Some(op))
            }
            Err(e) => {
                let complete = self.buf.last() == Some(&b'\n');
                unparsable(self.line, complete, &e, &mut self.warnings).map(|()| None)
            }
        }
    }

    /// Feeds every remaining op to `observe`, parsed straight from its line with its value
    /// left raw (the fast path of [`crate::check_history`]). An error from `observe` is bad
    /// input on that op's line.
    pub(crate) fn for_each_line_op(
        &mut self,
        mut observe: impl FnMut(&LineOp<'_>) -> Result<(), String>,
    ) -> Result<(), BadInput> {
        while !self.done {
            self.done = true;
            if !self.advance()? {
                break;
            }
            match serde_json::from_slice::<LineOp>(&self.buf) {
                Ok(op) => {
                    expect_index(self.line, &mut self.next_index, op.index)?;
                    observe(&op).map_err(|p| BadInput::at(self.line, p))?;
                }
                Err(e) => {
                    let complete = self.buf.last() == Some(&b'\n');
                    unparsable(self.line, complete, &e, &mut self.warnings)?;
                    break;
                }
            }
            self.done = false;
        }
        Ok(())
    }
}

/// Indices are dense and in file order.
fn expect_index(line: u64, next: &mut u64, index: u64) -> Result<(), BadInput> {
    if index != *next {
        return Err(BadInput::at(
            line,
            format!(
                "op index {index} out of sequence: expected {next} (indices are dense, in file order)"
            ),
        ));
    }
    *next += 1;
    Ok(())
}

/// A line that does not parse is bad input, unless it is a last line cut short by a killed run:
/// then it ends the history with a warning.
fn unparsable(
    line: u64,
    complete: bool,
    e: &serde_json::Error,
    warnings: &mut Vec<String>,
) -> Result<(), BadInput> {
    if complete {
        return Err(BadInput::at(line, format!("malformed op: {e}")));
    }
    warnings.push(format!(
        "line {line}: ignored a truncated last line (a killed run?): {e}"
    ));
    Ok(())
}

impl<R: BufRead> Iterator for HistoryReader<R> {
    type Item = Result<Op, BadInput>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.read_op().transpose();
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}

/// Reads every line of `replicas.jsonl`. Replica states are small next to a history (one record
/// per value per replica), so they are read whole. A state that cannot be real (see
/// [`ReplicaState::check_values`]) or a replica listed twice is bad input naming its line.
pub fn read_replicas<R: BufRead>(mut input: R) -> Result<Vec<ReplicaState>, BadInput> {
    let mut out = Vec::new();
    let mut seen: HashMap<(String, String, String, i64), u64> = HashMap::new();
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        let read = read_line(&mut input, &mut buf)
            .map_err(|e| BadInput::at(line + 1, format!("cannot read: {e}")))?;
        line += 1;
        match read {
            Line::End => return Ok(out),
            Line::TooLong => return Err(too_long(line)),
            Line::Read => {}
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let replica: ReplicaState = serde_json::from_slice(&buf)
            .map_err(|e| BadInput::at(line, format!("malformed replica state: {e}")))?;
        replica
            .check_values()
            .map_err(|e| BadInput::at(line, format!("impossible replica state: {e}")))?;
        let key = (
            replica.cluster.clone(),
            replica.node.clone(),
            replica.topic.clone(),
            replica.partition,
        );
        if let Some(first) = seen.insert(key, line) {
            return Err(BadInput::at(
                line,
                format!(
                    "the same replica ({}/{}/{} on {}) is also on line {first}",
                    replica.cluster, replica.topic, replica.partition, replica.node
                ),
            ));
        }
        out.push(replica);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{OpType, Process};

    const HEADER: &str = "{\"tidemark_history\": 1, \"test\": {\"name\": \"q\"}}\n";

    fn ops(text: &str) -> Result<(Vec<Op>, Vec<String>), BadInput> {
        let mut r = read_history(text.as_bytes())?;
        let ops = r.by_ref().collect::<Result<Vec<_>, _>>()?;
        Ok((ops, r.warnings().to_vec()))
    }

    #[test]
    fn reads_header_and_ops() {
        let text = format!(
            "{HEADER}{}\n\n{}\n",
            r#"{"index":0,"time":1,"process":0,"type":"invoke","f":"poll","value":{"topic":"t","partition":0,"from":0}}"#,
            r#"{"index":1,"time":2,"process":"nemesis","type":"info","f":"kill","value":{"nodes":["n1"]},"extra":1}"#
        );
        let mut r = read_history(text.as_bytes()).unwrap();
        assert_eq!(r.test()["name"], "q");
        let a = r.next().unwrap().unwrap();
        assert_eq!((a.process, a.kind), (Process::Client(0), OpType::Invoke));
        let b = r.next().unwrap().unwrap();
        assert_eq!(b.process, Process::Nemesis);
        assert_eq!(r.line(), 4);
        assert!(r.next().is_none());
    }

    #[test]
    fn missing_header_is_bad_input() {
        let e = ops(r#"{"index":0,"time":1,"process":0,"type":"invoke","f":"poll"}"#).unwrap_err();
        assert_eq!(e.line, Some(1));
        assert!(e.problem.contains("missing header"), "{e}");
        assert!(ops("").unwrap_err().problem.contains("no header"));
        let e = ops("{\"tidemark_history\": 2}\n").unwrap_err();
        assert!(e.problem.contains("version 2"), "{e}");
    }

    #[test]
    fn malformed_line_names_its_line() {
        let text = format!(
            "{HEADER}{{\"index\":0,\"time\":1,\"process\":0,\"type\":\"bogus\",\"f\":\"poll\"}}\n"
        );
        let e = ops(&text).unwrap_err().in_file("h.jsonl");
        assert_eq!(e.line, Some(2));
        assert!(e.to_string().starts_with("h.jsonl:2: malformed op"), "{e}");
    }

    #[test]
    fn out_of_sequence_index_is_bad_input() {
        let text = format!(
            "{HEADER}{{\"index\":1,\"time\":1,\"process\":0,\"type\":\"invoke\",\"f\":\"poll\"}}\n"
        );
        assert!(ops(&text).unwrap_err().problem.contains("out of sequence"));
    }

    #[test]
    fn truncated_last_line_is_a_warning() {
        let text = format!("{HEADER}{{\"index\":0,\"time\":1,\"process\":0,\"type\":\"invoke\",\"f\":\"poll\"}}\n{{\"index\":1,\"ti");
        let (ops, warnings) = ops(&text).unwrap();
        assert_eq!(ops.len(), 1);
        assert!(warnings[0].contains("line 3"), "{warnings:?}");
        let complete = format!("{HEADER}{{\"index\":1,\"ti\n");
        assert!(self::ops(&complete).is_err());
    }

    #[test]
    fn a_line_longer_than_the_limit_is_bad_input_naming_it() {
        let zeros = std::io::repeat(0).take(MAX_LINE_BYTES as u64 + 2);
        let e = read_history(std::io::BufReader::new(zeros)).err().unwrap();
        assert_eq!(e.line, Some(1));
        assert!(e.problem.contains("longer than 16 MiB"), "{e}");
        let long_op = format!("{HEADER}{}\n", " ".repeat(MAX_LINE_BYTES + 1));
        let e = ops(&long_op).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        let e = read_replicas(&long_op.as_bytes()[HEADER.len()..]).unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        // A line of exactly the limit is fine (here, blank).
        let at_limit = format!("{HEADER}{}\n", " ".repeat(MAX_LINE_BYTES));
        assert!(ops(&at_limit).unwrap().0.is_empty());
    }

    #[test]
    fn impossible_replica_values_are_bad_input_naming_line_and_field() {
        let good = r#"{"cluster":"a","node":"n1","topic":"t","partition":0,"log_start_offset":0,"high_watermark":2,"log_end_offset":2,"records":[[0,1,0],[1,2,0]]}"#;
        assert_eq!(
            read_replicas(format!("{good}\n").as_bytes()).unwrap().len(),
            1
        );
        for (bad, field) in [
            (
                good.replace("\"high_watermark\":2", "\"high_watermark\":3"),
                "high_watermark 3",
            ),
            (
                good.replace("\"log_start_offset\":0", "\"log_start_offset\":-1"),
                "log_start_offset -1",
            ),
            (
                good.replace("\"partition\":0", "\"partition\":9223372036854775807"),
                "partition 9223372036854775807",
            ),
            (good.replace("[0,1,0]", "[-5,1,0]"), "offset -5"),
            (
                good.replace("\"high_watermark\":2", "\"high_watermark\":-1"),
                "high_watermark -1",
            ),
        ] {
            let text = format!("{}\n{bad}\n", good.replace("n1", "n0"));
            let e = read_replicas(text.as_bytes()).unwrap_err();
            assert_eq!(e.line, Some(2), "{e}");
            assert!(e.problem.contains(field), "{field}: {e}");
        }
        let twice = format!("{good}\n{good}\n");
        let e = read_replicas(twice.as_bytes()).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.problem.contains("also on line 1"), "{e}");
    }

    #[test]
    fn replicas_errors_name_their_line() {
        let text = "{\"cluster\":\"a\",\"node\":\"n1\",\"topic\":\"t\",\"partition\":0,\"error\":\"down\"}\n{\"node\": 3}\n";
        let e = read_replicas(text.as_bytes()).unwrap_err();
        assert_eq!(e.line, Some(2));
        let ok = read_replicas(&text.as_bytes()[..text.find('\n').unwrap() + 1]).unwrap();
        assert_eq!(ok[0].error.as_deref(), Some("down"));
    }
}
