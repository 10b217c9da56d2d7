//! The broker's log: one event is one line, whatever it carries. Clients choose many of the
//! strings a broker logs (topic, group, member and mirror names, and error texts that quote
//! them), and a newline in one would split a log line, letting a client forge lines, while a NUL
//! makes tools (the report among them) take the log for binary. Rather than relying on every
//! log statement to format its fields with `?`, the writer escapes control characters in each
//! formatted event before it reaches stderr.

use std::io::{self, Write};

use tracing::Subscriber;
use tracing_subscriber::util::SubscriberInitExt as _;

/// A writer that escapes control characters (but tab) in what it is given, keeping only a
/// final newline: the formatter hands it one whole event per write.
pub struct EscapedLines<W>(pub W);

impl<W: Write> Write for EscapedLines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (body, newline) = match buf.split_last() {
            Some((b'\n', body)) => (body, true),
            _ => (buf, false),
        };
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\0' => out.extend_from_slice(b"\\0"),
                b'\t' => out.push(b),
                0..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
                _ => out.push(b),
            }
        }
        if newline {
            out.push(b'\n');
        }
        // One write of the whole line, so lines of concurrent events do not interleave.
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// The broker's subscriber: `filter`'s events, formatted without colours, written through
/// [`EscapedLines`] to the writers `make` returns.
pub fn subscriber<W, M>(
    filter: tracing_subscriber::EnvFilter,
    make: M,
) -> impl Subscriber + Send + Sync + 'static
where
    W: Write + 'static,
    M: Fn() -> W + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || EscapedLines(make()))
        .with_ansi(false)
        .finish()
}

/// Installs the broker's subscriber (filter from `TIDEMARK_LOG`, default `info`) writing to
/// stderr, with every event inside a `node` span naming `node_id`.
pub fn init(node_id: i32) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIDEMARK_LOG")
        .unwrap_or_else(|_| "info,openraft=off".into());
    subscriber(filter, io::stderr).init();
    let span = tracing::info_span!("node", id = node_id);
    std::mem::forget(span.entered());
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer into a buffer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_client_string_cannot_split_a_log_line_or_put_a_nul_in_it() {
        let captured = Captured::default();
        let sink = captured.clone();
        let sub = subscriber("info".into(), move || sink.clone());
        tracing::subscriber::with_default(sub, || {
            let name = "m\nINJECTED line\0\x1b[31m\r";
            tracing::info!(mirror = %name, "created {}", "a\nb\tc");
            tracing::warn!("second event");
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log:?}");
        assert!(
            lines[0].ends_with(r"created a\nb	c mirror=m\nINJECTED line\0\x1b[31m\r"),
            "{log:?}"
        );
        assert!(lines[1].ends_with("second event"), "{log:?}");
        assert!(!log.contains('\0') && !log.contains('\r') && !log.contains('\x1b'));
    }
}
