//! `tidemark shrink RUN_DIR`: the smallest run that still shows an invalid run's anomaly, found
//! by running it again with less. First the time limit is cut to just past the fault that
//! exposed the anomaly (the faults after it dropped), then delta debugging drops faults, then
//! the faults left are shortened, then the time limit is cut to just past the last fault op and
//! the client load halved; each step is kept when its run still forbids the anomaly type, and a
//! time cut that loses it is tried once more halfway back. Every run is a replay of the original
//! (same command line, seed and broker build, faults doing what was recorded; see
//! [`crate::rerun`]) in a scratch store inside the store, within a budget of runs and minutes.
//! The smallest failing run is moved into the store as a run of its own, its test.json saying
//! `shrunk_from` and `shrunk_keeping` (the type kept, which its replay asks about), with its
//! schedule beside it as `schedule.json`. The pure parts (faults, shortening, ddmin, the time
//! cut's search) are `tidemark_nemesis::shrink`.
//!
//! Exits 0 when it wrote a run, 1 when no run in the budget showed the anomaly, 254 on bad input,
//! 255 when a run failed or was interrupted.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tidemark_nemesis::shrink::{self, Fault, ScheduledOp};

use crate::evidence;
use crate::rerun::{write_schedule, Recorded, Trial, TrialError, TrialRun, Trials};

/// How long a run goes on after the last fault op it keeps: time for a lost acknowledgement's
/// new leader to take over before the final phase heals.
const MARGIN_NS: u64 = 2_000_000_000;

/// Runs a time cut may take: the cut itself and, when it loses the anomaly, one halfway back.
const TIME_TRIES: usize = 2;

/// Time cuts closer than this to one already tried are not worth a run.
const TIME_RESOLUTION_NS: u64 = 4_000_000_000;

/// Arguments of `tidemark shrink`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The invalid run to shrink (store/<test>/<time>, or a `latest` link to one).
    pub dir: PathBuf,
    /// At most this many runs.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub budget_runs: usize,
    /// Start no run after this many minutes.
    #[arg(long, default_value_t = 60.0, value_name = "M")]
    pub budget_minutes: f64,
    /// The anomaly type to keep [default: the one the run evidenced first].
    #[arg(long, value_name = "TYPE")]
    pub anomaly: Option<String>,
    /// Run the broker binary at the recorded path even when it is not the recorded build.
    #[arg(long)]
    pub any_broker: bool,
    /// The store the smallest run goes to [default: the run's store].
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

/// A smaller run to try: which faults, how long, how much load.
#[derive(Debug, Clone)]
struct Candidate {
    faults: Vec<Fault>,
    time_limit_ns: u64,
    concurrency: usize,
    rate: f64,
}

impl Candidate {
    /// The ops it performs: its faults' ops before its time limit.
    fn schedule(&self) -> Vec<ScheduledOp> {
        shrink::schedule(&self.faults)
            .into_iter()
            .filter(|o| o.time < self.time_limit_ns)
            .collect()
    }

    fn trial(&self) -> Trial {
        Trial {
            schedule: self.schedule(),
            time_limit_s: self.time_limit_ns as f64 / 1e9,
            concurrency: self.concurrency,
            rate: self.rate,
        }
    }

    /// `2 faults (kill 13.0 s, pause 5.5 s), 19.3 s, 10 workers, 100 ops/s`.
    fn describe(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .filter(|f| f.start.time < self.time_limit_ns)
            .map(|f| match &f.end {
                Some(end) if end.time < self.time_limit_ns => format!(
                    "{} {:.1}–{:.1} s",
                    f.start.f,
                    f.start.time as f64 / 1e9,
                    end.time as f64 / 1e9
                ),
                _ => format!("{} {:.1} s", f.start.f, f.start.time as f64 / 1e9),
            })
            .collect();
        format!(
            "{} fault{} ({}), {:.1} s, {} workers, {} ops/s",
            faults.len(),
            if faults.len() == 1 { "" } else { "s" },
            faults.join(", "),
            self.time_limit_ns as f64 / 1e9,
            self.concurrency,
            self.rate
        )
    }
}

/// The shrink's state: the budget, the runs made, the smallest failing one.
struct Shrinker<'a> {
    recorded: &'a Recorded,
    anomaly: String,
    trials: Trials,
    scratch: PathBuf,
    budget_runs: usize,
    budget: Duration,
    started: Instant,
    runs: usize,
    best: Option<(Candidate, TrialRun)>,
    /// Why the shrink must stop: an interrupted or failed run.
    stopped: Option<TrialError>,
}

impl Shrinker<'_> {
    /// Runs `candidate`; whether it forbade the anomaly type, `None` when the budget is spent or
    /// the shrink stopped.
    fn attempt(&mut self, step: &str, candidate: &Candidate) -> Option<bool> {
        if self.stopped.is_some() {
            return None;
        }
        if self.runs >= self.budget_runs || self.started.elapsed() >= self.budget {
            println!("{step}: budget spent");
            return None;
        }
        self.runs += 1;
        let schedule_file = self.scratch.join(format!("schedule-{}.json", self.runs));
        println!(
            "[run {}/{}, {:.1} min] {step}: {}",
            self.runs,
            self.budget_runs,
            self.started.elapsed().as_secs_f64() / 60.0,
            candidate.describe()
        );
        let run = match self.trials.run(
            self.recorded,
            &candidate.trial(),
            &self.scratch,
            &schedule_file,
            Some((&self.recorded.dir, &self.anomaly)),
        ) {
            Ok(run) => run,
            Err(e) => {
                self.stopped = Some(e);
                return None;
            }
        };
        let kept = run.verdict.bad.contains(&self.anomaly);
        println!(
            "    {} in {:.0} s: {}",
            run.verdict.describe(),
            run.wall.as_secs_f64(),
            if kept {
                format!("{} again, kept", self.anomaly)
            } else {
                format!("no {}, dropped", self.anomaly)
            }
        );
        if kept {
            self.best = Some((candidate.clone(), run));
        }
        Some(kept)
    }

    /// Runs `cut`, and when it loses the anomaly a limit halfway back towards `longest`
    /// ([`shrink::shortest_failing_time`]); the runs that keep it become the best.
    fn cut_time(&mut self, step: &str, cut: &Candidate, longest: u64) {
        shrink::shortest_failing_time(
            cut.time_limit_ns,
            longest,
            TIME_RESOLUTION_NS,
            TIME_TRIES,
            |t| {
                let c = Candidate {
                    time_limit_ns: t,
                    ..cut.clone()
                };
                self.attempt(step, &c)
            },
        );
    }

    /// The smallest failing candidate so far, else the original.
    fn current(&self, original: &Candidate) -> Candidate {
        self.best
            .as_ref()
            .map_or_else(|| original.clone(), |(c, _)| c.clone())
    }
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let bad = |e: String| {
        eprintln!("tidemark shrink: {e}");
        crate::EXIT_BAD_INPUT
    };
    let failed = |e: String| {
        eprintln!("tidemark shrink: {e}");
        crate::EXIT_HARNESS_FAILED
    };
    if args.budget_runs == 0 || !(args.budget_minutes > 0.0 && args.budget_minutes.is_finite()) {
        return bad("--budget-runs and --budget-minutes must be positive".into());
    }
    let recorded = match Recorded::load(&args.dir) {
        Ok(r) => r,
        Err(e) => return bad(e),
    };
    if recorded.verdict.valid != serde_json::Value::Bool(false) {
        return bad(format!(
            "{}: results.json: the run is {}: nothing to shrink",
            recorded.dir.display(),
            recorded.verdict.describe()
        ));
    }
    if let Err(e) = recorded.check_broker(args.any_broker) {
        return bad(e);
    }
    let anomaly = match args.anomaly {
        Some(a) if recorded.verdict.bad.contains(&a) => a,
        Some(a) => {
            return bad(format!(
                "--anomaly {a}: the run did not forbid it; it forbade {}",
                recorded
                    .verdict
                    .bad
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
        None => first_evidenced(&recorded),
    };
    let store = args.store.unwrap_or_else(|| recorded.store.clone());
    let scratch = match tempfile::Builder::new()
        .prefix(".shrink-")
        .tempdir_in(&store)
    {
        Ok(d) => d,
        Err(e) => return failed(format!("a scratch store in {}: {e}", store.display())),
    };
    let trials = match Trials::new() {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let original = Candidate {
        faults: shrink::faults(&recorded.schedule),
        time_limit_ns: (recorded.time_limit_s * 1e9) as u64,
        concurrency: recorded.concurrency,
        rate: recorded.rate,
    };
    println!(
        "shrinking {} keeping {anomaly}: {}",
        recorded.dir.display(),
        original.describe()
    );
    let mut shrinker = Shrinker {
        recorded: &recorded,
        anomaly,
        trials,
        scratch: scratch.path().to_path_buf(),
        budget_runs: args.budget_runs,
        budget: Duration::from_secs_f64(args.budget_minutes * 60.0),
        started: Instant::now(),
        runs: 0,
        best: None,
        stopped: None,
    };
    steps(&mut shrinker, &original);
    match shrinker.stopped.take() {
        Some(TrialError::Interrupted) => {
            eprintln!("tidemark shrink: interrupted; nothing written");
            return crate::EXIT_HARNESS_FAILED;
        }
        Some(TrialError::Failed(e)) => return failed(e),
        None => {}
    }
    let Some((best, run)) = shrinker.best.take() else {
        println!(
            "no run of {} showed {} again; nothing written",
            shrinker.runs, shrinker.anomaly
        );
        return 1;
    };
    let dest = match keep(&run.dir, &store, &best.schedule()) {
        Ok(d) => d,
        Err(e) => return failed(e),
    };
    println!(
        "smallest run showing {}: {}\n  {}\n  schedule: {} (tidemark test --nemesis-schedule)\n  \
         replay: tidemark replay {} --anomaly {} --times 5\n  {} runs in {:.1} min",
        shrinker.anomaly,
        dest.display(),
        best.describe(),
        dest.join("schedule.json").display(),
        dest.display(),
        shrinker.anomaly,
        shrinker.runs,
        shrinker.started.elapsed().as_secs_f64() / 60.0
    );
    0
}

/// The forbidden anomaly type the run evidenced first (by [`evidence::first_of_kind`]), else
/// the first of them.
fn first_evidenced(recorded: &Recorded) -> String {
    let bad = &recorded.verdict.bad;
    bad.iter()
        .min_by_key(|kind| {
            evidence::first_of_kind(&recorded.ops, &recorded.results, kind).unwrap_or(u64::MAX)
        })
        .cloned()
        .unwrap_or_default()
}

/// The steps, each from the smallest failing candidate so far.
fn steps(s: &mut Shrinker, original: &Candidate) {
    // The faults up to the one that exposed the anomaly, and the time just past it.
    if let Some(exposed) = evidence::first_of_kind(&s.recorded.ops, &s.recorded.results, &s.anomaly)
    {
        let faults: Vec<Fault> = original
            .faults
            .iter()
            .filter(|f| f.start.time <= exposed)
            .cloned()
            .collect();
        let end = faults.last().map_or(exposed, |f| f.end_time().max(exposed));
        let cut = Candidate {
            faults,
            time_limit_ns: (end + MARGIN_NS).min(original.time_limit_ns),
            ..original.clone()
        };
        if cut.time_limit_ns < original.time_limit_ns {
            s.cut_time("cut to the exposing fault", &cut, original.time_limit_ns);
        } else if cut.faults.len() < original.faults.len() {
            s.attempt("cut to the exposing fault", &cut);
        }
    }
    let current = s.current(original);
    if current.faults.len() >= 2 {
        // Every subset ddmin moves to is a run that failed, so its answer is the best run
        // found, which `s.current` reads back (also when the budget ran out mid-way).
        shrink::ddmin(current.faults.len(), |subset| {
            let c = Candidate {
                faults: subset.iter().map(|&i| current.faults[i].clone()).collect(),
                ..current.clone()
            };
            s.attempt("drop faults", &c)
        });
    }
    for _ in 0..2 {
        let current = s.current(original);
        if !current.faults.iter().any(Fault::can_shorten) {
            break;
        }
        let shorter = Candidate {
            faults: current.faults.iter().map(|f| f.shortened(0.5)).collect(),
            ..current
        };
        if s.attempt("halve the faults", &shorter) != Some(true) {
            break;
        }
    }
    let current = s.current(original);
    let last_op = current.schedule().last().map_or(0, |o| o.time);
    let limit = (last_op + MARGIN_NS).min(current.time_limit_ns);
    if limit + 500_000_000 < current.time_limit_ns {
        let cut = Candidate {
            time_limit_ns: limit,
            ..current.clone()
        };
        s.cut_time("cut the time limit", &cut, current.time_limit_ns);
    }
    let current = s.current(original);
    if current.rate > 1.0 {
        let c = Candidate {
            rate: current.rate / 2.0,
            ..current
        };
        s.attempt("halve the rate", &c);
    }
    let current = s.current(original);
    if current.concurrency >= 2 {
        let c = Candidate {
            concurrency: current.concurrency / 2,
            ..current
        };
        s.attempt("halve the workers", &c);
    }
}

/// Moves the run in `dir` (in the scratch store) into `store` under its test's name, points the
/// `latest` links at it, writes its schedule beside it and renders its report again (the
/// commands in it name the run's new place). Returns where it went.
fn keep(dir: &Path, store: &Path, schedule: &[ScheduledOp]) -> Result<PathBuf, String> {
    let (Some(stamp), Some(test)) = (dir.file_name(), dir.parent().and_then(Path::file_name))
    else {
        return Err(format!("{}: not a run directory", dir.display()));
    };
    let test_dir = store.join(test);
    std::fs::create_dir_all(&test_dir).map_err(|e| format!("{}: {e}", test_dir.display()))?;
    let dest = test_dir.join(stamp);
    std::fs::rename(dir, &dest)
        .map_err(|e| format!("moving {} to {}: {e}", dir.display(), dest.display()))?;
    for (link, target) in [
        (test_dir.join("latest"), PathBuf::from(stamp)),
        (store.join("latest"), Path::new(test).join(stamp)),
    ] {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link)
            .map_err(|e| format!("{}: {e}", link.display()))?;
    }
    write_schedule(&dest.join("schedule.json"), schedule)?;
    tidemark_report::write_report(&dest).map_err(|e| format!("{}: {e:#}", dest.display()))?;
    Ok(dest)
}
