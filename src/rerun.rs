//! Running a recorded test again, which `tidemark replay` and `tidemark shrink` both do: the
//! recorded `tidemark test` command line with the recorded seed and broker build, and the
//! recorded faults (or fewer, shorter ones) as a schedule file, run by a child `tidemark test`
//! into a store and judged from the run directory it leaves. The child owns its cluster's whole
//! life (its runner tears down after errors, Ctrl-C and SIGTERM); this process only waits for it,
//! passes a SIGTERM on, and starts nothing more once either signal came.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use tidemark_checkers::{read_history, Op};
use tidemark_harness::broker::binary_sha256;
use tidemark_nemesis::shrink::{recorded_schedule, ScheduledOp};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// What a recorded run's `test.json` says that a run again needs.
#[derive(Debug, Deserialize)]
struct RecordedTest {
    seed: u64,
    time_limit_s: f64,
    concurrency: usize,
    rate: f64,
    argv: Vec<String>,
    broker: RecordedBroker,
    /// The anomaly type a shrunk run was shrunk keeping; absent in other and older runs.
    #[serde(default)]
    shrunk_keeping: Option<String>,
}

/// test.json's `broker`.
#[derive(Debug, Deserialize)]
struct RecordedBroker {
    binary: PathBuf,
    /// Absent in runs recorded before replays compared builds.
    sha256: Option<String>,
}

/// A verdict as `results.json` gives it: `valid` and the anomaly types it forbade.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// `true`, `false` or `"unknown"`.
    pub valid: Value,
    /// `bad_anomaly_types`.
    pub bad: BTreeSet<String>,
}

impl Verdict {
    fn read(dir: &Path) -> Result<(Verdict, Value), String> {
        let path = dir.join("results.json");
        let results: Value = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let verdict = Verdict {
            valid: results["valid"].clone(),
            bad: crate::evidence::strings(&results["bad_anomaly_types"])
                .into_iter()
                .collect(),
        };
        Ok((verdict, results))
    }

    /// Whether this verdict is `original`'s again: the same `valid`, and every anomaly type
    /// `original` forbade forbidden again (more are allowed: the run found the same bug, and
    /// another).
    pub fn repeats(&self, original: &Verdict) -> bool {
        self.valid == original.valid && original.bad.is_subset(&self.bad)
    }

    /// `valid`, `invalid (lost-write, ...)` or `unknown`.
    pub fn describe(&self) -> String {
        match &self.valid {
            Value::Bool(true) => "valid".into(),
            Value::Bool(false) => format!(
                "invalid ({})",
                self.bad.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
            other => other.as_str().unwrap_or("no verdict").to_string(),
        }
    }
}

/// A recorded run, read and checked once.
pub struct Recorded {
    /// Its directory, with links resolved.
    pub dir: PathBuf,
    /// The store it is in (the directory above its test's).
    pub store: PathBuf,
    /// Its verdict.
    pub verdict: Verdict,
    /// Its `results.json`.
    pub results: Value,
    /// Its history's ops.
    pub ops: Vec<Op>,
    /// Its main phase's faults, as a schedule that does them again.
    pub schedule: Vec<ScheduledOp>,
    /// Its main phase, seconds.
    pub time_limit_s: f64,
    /// Its client workers.
    pub concurrency: usize,
    /// Its client ops per second.
    pub rate: f64,
    test: RecordedTest,
}

impl Recorded {
    /// The anomaly type `tidemark shrink` kept, when this run is a shrunk one.
    pub fn shrunk_keeping(&self) -> Option<&str> {
        self.test.shrunk_keeping.as_deref()
    }

    /// Reads the run in `dir`; errors name the file and the field.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let dir = std::fs::canonicalize(dir)
            .map_err(|e| format!("{}: not a run directory: {e}", dir.display()))?;
        let path = dir.join("test.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: not a run directory: {e}", path.display()))?;
        let test: RecordedTest =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(&text))
                .map_err(|e| format!("{}: field `{}`: {}", path.display(), e.path(), e.inner()))?;
        if test.argv.get(1).map(String::as_str) != Some("test") {
            return Err(format!(
                "{}: field `argv`: {:?} is not a `tidemark test` command line",
                path.display(),
                test.argv
            ));
        }
        let (verdict, results) = Verdict::read(&dir)?;
        let history = dir.join("history.jsonl");
        let file = File::open(&history).map_err(|e| format!("{}: {e}", history.display()))?;
        let ops: Vec<Op> = read_history(BufReader::new(file))
            .and_then(|ops| ops.collect::<Result<_, _>>())
            .map_err(|e| format!("{}: {e}", history.display()))?;
        let limit_ns = (test.time_limit_s * 1e9) as u64;
        let store = dir
            .parent()
            .and_then(Path::parent)
            .ok_or_else(|| format!("{}: not inside a store", dir.display()))?
            .to_path_buf();
        Ok(Recorded {
            schedule: recorded_schedule(&ops, limit_ns),
            time_limit_s: test.time_limit_s,
            concurrency: test.concurrency,
            rate: test.rate,
            dir,
            store,
            verdict,
            results,
            ops,
            test,
        })
    }

    /// Refuses, saying why, when the broker binary at the recorded path is not the recorded
    /// build (by SHA-256), unless `any_broker`.
    pub fn check_broker(&self, any_broker: bool) -> Result<(), String> {
        if any_broker {
            return Ok(());
        }
        let binary = &self.test.broker.binary;
        let recorded = self.test.broker.sha256.as_deref().ok_or_else(|| {
            format!(
                "{}: field `broker.sha256`: absent (a run recorded before tidemark hashed the \
                 broker), so the broker at {} cannot be told to be the same build; pass \
                 --any-broker to run it anyway",
                self.dir.join("test.json").display(),
                binary.display()
            )
        })?;
        let now = binary_sha256(binary).map_err(|e| {
            format!(
                "the recorded broker binary {}: {e}; pass --any-broker to run whatever is there",
                binary.display()
            )
        })?;
        if now != recorded {
            return Err(format!(
                "the broker binary {} is not the build the run used: its SHA-256 is {now}, \
                 test.json's `broker.sha256` is {recorded}; rebuild that version, or pass \
                 --any-broker to run this one",
                binary.display()
            ));
        }
        Ok(())
    }

    /// The recorded `tidemark test` arguments, without those a run again sets itself.
    fn base_args(&self) -> Vec<String> {
        const SET_HERE: &[&str] = &[
            "--seed",
            "--nemesis",
            "--nemesis-targets",
            "--nemesis-schedule",
            "--store",
            "--broker-binary",
            "--time-limit",
            "--concurrency",
            "--rate",
            "--shrunk-from",
            "--shrunk-keeping",
        ];
        let mut out = Vec::new();
        let mut args = self.test.argv.iter().skip(2);
        while let Some(arg) = args.next() {
            let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
            if arg == "--quiet" {
                continue;
            }
            if SET_HERE.contains(&flag) {
                if !arg.contains('=') {
                    args.next();
                }
                continue;
            }
            out.push(arg.clone());
        }
        out
    }
}

/// One run again: which faults, how long, how much load.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// The faults' schedule.
    pub schedule: Vec<ScheduledOp>,
    /// The main phase, seconds.
    pub time_limit_s: f64,
    /// Client workers.
    pub concurrency: usize,
    /// Client ops per second.
    pub rate: f64,
}

impl Trial {
    /// The recorded run as it was.
    pub fn recorded(run: &Recorded) -> Self {
        Trial {
            schedule: run.schedule.clone(),
            time_limit_s: run.time_limit_s,
            concurrency: run.concurrency,
            rate: run.rate,
        }
    }
}

/// A finished run again.
pub struct TrialRun {
    /// Its run directory.
    pub dir: PathBuf,
    /// Its verdict.
    pub verdict: Verdict,
    /// How long it took.
    pub wall: Duration,
}

/// Why a run again gave no verdict.
pub enum TrialError {
    /// SIGINT or SIGTERM: the child tore its cluster down; start nothing more.
    Interrupted,
    /// The child failed (its message) or could not be run.
    Failed(String),
}

/// Runs trials one after another as child `tidemark test`s (this executable). A SIGINT from the
/// terminal reaches the running child too (same process group) and a SIGTERM is passed on to
/// it; either way the child tears its cluster down and exits, and no trial starts after it.
pub struct Trials {
    rt: tokio::runtime::Runtime,
    interrupt: Signal,
    terminate: Signal,
}

impl Trials {
    /// Starts listening for SIGINT and SIGTERM.
    pub fn new() -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the async runtime: {e}"))?;
        let (interrupt, terminate) = rt
            .block_on(async {
                Ok::<_, std::io::Error>((
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::terminate())?,
                ))
            })
            .map_err(|e| format!("listening for signals: {e}"))?;
        Ok(Trials {
            rt,
            interrupt,
            terminate,
        })
    }

    /// Runs `trial` of `run` into `store`, its schedule written to `schedule_file` first;
    /// `shrunk` records the run it shrinks and the anomaly type kept.
    pub fn run(
        &mut self,
        run: &Recorded,
        trial: &Trial,
        store: &Path,
        schedule_file: &Path,
        shrunk: Option<(&Path, &str)>,
    ) -> Result<TrialRun, TrialError> {
        write_schedule(schedule_file, &trial.schedule).map_err(TrialError::Failed)?;
        let mut args: Vec<OsString> = run.base_args().into_iter().map(OsString::from).collect();
        args.extend([
            "--seed".into(),
            run.test.seed.to_string().into(),
            "--broker-binary".into(),
            run.test.broker.binary.clone().into_os_string(),
            "--nemesis-schedule".into(),
            schedule_file.as_os_str().to_owned(),
            "--time-limit".into(),
            trial.time_limit_s.to_string().into(),
            "--concurrency".into(),
            trial.concurrency.to_string().into(),
            "--rate".into(),
            trial.rate.to_string().into(),
            "--store".into(),
            store.as_os_str().to_owned(),
            "--quiet".into(),
        ]);
        if let Some((original, keeping)) = shrunk {
            args.extend([
                "--shrunk-from".into(),
                original.as_os_str().to_owned(),
                "--shrunk-keeping".into(),
                keeping.into(),
            ]);
        }
        let child = self.run_test(&args)?;
        let output = &child.output;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let dir = child.run_dir().ok_or_else(|| {
            TrialError::Failed(format!(
                "tidemark test made no run directory (exit {:?}): {}",
                output.status.code(),
                stderr.trim()
            ))
        })?;
        let (verdict, _) = Verdict::read(&dir).map_err(|e| {
            TrialError::Failed(format!(
                "{e} (tidemark test exited {:?}: {})",
                output.status.code(),
                stderr.trim()
            ))
        })?;
        Ok(TrialRun {
            dir,
            verdict,
            wall: child.ended - child.started,
        })
    }

    /// Runs one child `tidemark test ARGS` (this executable) to its end, its stdout and stderr
    /// captured; `Interrupted` when SIGINT or SIGTERM came before or while it ran.
    pub fn run_test(&mut self, args: &[OsString]) -> Result<ChildTest, TrialError> {
        let exe = std::env::current_exe()
            .map_err(|e| TrialError::Failed(format!("cannot find this executable: {e}")))?;
        let mut cmd = tokio::process::Command::new(exe);
        cmd.arg("test")
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let started = Instant::now();
        let (interrupt, terminate) = (&mut self.interrupt, &mut self.terminate);
        let output = self
            .rt
            .block_on(wait_passing_signals(cmd, interrupt, terminate))?;
        Ok(ChildTest {
            output,
            started,
            ended: Instant::now(),
        })
    }
}

/// A child `tidemark test` that ran to its end.
pub struct ChildTest {
    /// Its exit status and what it wrote.
    pub output: std::process::Output,
    /// Just before it was started.
    pub started: Instant,
    /// Just after it exited.
    pub ended: Instant,
}

impl ChildTest {
    /// The run directory it named on stderr (whatever else writes to the same store), if it
    /// made one.
    pub fn run_dir(&self) -> Option<PathBuf> {
        String::from_utf8_lossy(&self.output.stderr)
            .lines()
            .find_map(|l| l.strip_prefix("tidemark: run directory "))
            .map(PathBuf::from)
    }
}

/// The last line a child `tidemark` wrote on stderr that is not blank: what it said last, why it
/// stopped when it stopped early.
pub fn last_words(stderr: &[u8]) -> Option<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::to_owned)
}

/// Writes a schedule file `--nemesis-schedule` reads: a JSON list of ops, one a line.
pub fn write_schedule(path: &Path, schedule: &[ScheduledOp]) -> Result<(), String> {
    let lines: Vec<String> = schedule
        .iter()
        .map(|op| serde_json::to_string(op).expect("plain data serializes"))
        .collect();
    let text = format!("[\n{}\n]\n", lines.join(",\n"));
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `cmd` to its end, unless a signal came before it started; `Interrupted` when one came.
async fn wait_passing_signals(
    mut cmd: tokio::process::Command,
    interrupt: &mut Signal,
    terminate: &mut Signal,
) -> Result<std::process::Output, TrialError> {
    use futures::FutureExt;
    if interrupt.recv().now_or_never().is_some() || terminate.recv().now_or_never().is_some() {
        return Err(TrialError::Interrupted);
    }
    let child = cmd
        .spawn()
        .map_err(|e| TrialError::Failed(format!("cannot run tidemark test: {e}")))?;
    let pid = child.id();
    let output = child.wait_with_output();
    tokio::pin!(output);
    let mut signalled = false;
    loop {
        tokio::select! {
            out = &mut output => {
                let out = out.map_err(|e| TrialError::Failed(e.to_string()))?;
                return if signalled { Err(TrialError::Interrupted) } else { Ok(out) };
            }
            _ = interrupt.recv() => signalled = true,
            _ = terminate.recv() => {
                signalled = true;
                if let Some(pid) = pid {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
            }
        }
    }
}
