//! What the person at the terminal sees while a test runs: a progress bar with elapsed and
//! total time and the ok/fail/info counts on a terminal, plain periodic lines otherwise (CI logs).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::op::Outcome;

/// Completed client ops by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    ok: u64,
    fail: u64,
    info: u64,
}

/// Reports a run's progress on stderr.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: Duration,
    counts: Counts,
    last_line: Instant,
    last_tick: Instant,
    every: Duration,
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines every 5 s otherwise; `quiet` shows nothing.
    pub fn new(total: Duration, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(total.as_secs().max(1));
            b.set_style(
                ProgressStyle::with_template("[{bar:30}] {pos}/{len}s  {msg}")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            b
        });
        Progress {
            bar,
            total,
            counts: Counts::default(),
            last_line: Instant::now(),
            last_tick: Instant::now(),
            every: if quiet {
                Duration::MAX
            } else {
                Duration::from_secs(5)
            },
        }
    }

    /// Announces a phase of the run.
    pub fn phase(&mut self, name: &str) {
        match &self.bar {
            Some(b) => b.println(format!("tidemark: {name}")),
            None if self.every != Duration::MAX => eprintln!("tidemark: {name}"),
            None => {}
        }
    }

    /// Counts a completed client op.
    pub fn record(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => self.counts.ok += 1,
            Outcome::Fail => self.counts.fail += 1,
            Outcome::Info => self.counts.info += 1,
        }
    }

    /// Updates the display for `elapsed` time into the main phase (at most ten times a second,
    /// since the runner calls this on every turn of its loop).
    pub fn tick(&mut self, elapsed: Duration) {
        if self.last_tick.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.last_tick = Instant::now();
        let c = self.counts;
        let msg = format!("ok {}  fail {}  info {}", c.ok, c.fail, c.info);
        match &self.bar {
            Some(b) => {
                b.set_position(elapsed.as_secs().min(self.total.as_secs()));
                b.set_message(msg);
            }
            None => {
                if self.last_line.elapsed() >= self.every {
                    self.last_line = Instant::now();
                    eprintln!(
                        "tidemark: {:>4}s/{}s  {msg}",
                        elapsed.as_secs(),
                        self.total.as_secs()
                    );
                }
            }
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
