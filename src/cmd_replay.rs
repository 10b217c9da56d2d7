//! `tidemark replay RUN_DIR [--times N]`: runs a recorded test again on fresh clusters, to see
//! whether what it found comes back. Each try is the recorded `tidemark test` with the recorded
//! seed (so the same client op stream) and broker build (refused when the binary's SHA-256 is
//! not the recorded one, unless `--any-broker`), and the recorded faults at their recorded
//! offsets of test time doing what their `info`s recorded (the nodes they hit, not re-resolved:
//! "the leader" is the node the recording hit). It says after each try whether the same anomaly
//! types came back (or, with `--anomaly TYPE` or for a run `tidemark shrink` made, the type it
//! kept: a lost write and the offsets written again where it was are one bug's two faces, and
//! whether the second shows depends on timing), then the reproduction rate. Exits 0 when every
//! try repeated the recorded verdict, 1 when some did not, 254 on bad input, 255 when a run
//! failed or was interrupted.

use std::path::PathBuf;

use crate::rerun::{Recorded, Trial, TrialError, Trials};

/// Arguments of `tidemark replay`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory to replay (store/<test>/<time>, or a `latest` link to one).
    pub dir: PathBuf,
    /// How many times to run it.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub times: usize,
    /// Run the broker binary at the recorded path even when it is not the recorded build.
    #[arg(long)]
    pub any_broker: bool,
    /// Where the tries' run directories go [default: the recorded run's store].
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// A try reproduces when it forbids this anomaly type, one the recorded run forbade
    /// [default: the type a shrunk run was shrunk keeping, else every type the recorded run
    /// forbade].
    #[arg(long, value_name = "TYPE")]
    pub anomaly: Option<String>,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let bad = |e: String| {
        eprintln!("tidemark replay: {e}");
        crate::EXIT_BAD_INPUT
    };
    if args.times == 0 {
        return bad("--times must be at least 1".into());
    }
    let recorded = match Recorded::load(&args.dir) {
        Ok(r) => r,
        Err(e) => return bad(e),
    };
    if let Err(e) = recorded.check_broker(args.any_broker) {
        return bad(e);
    }
    let anomaly = args
        .anomaly
        .clone()
        .or_else(|| recorded.shrunk_keeping().map(String::from));
    if let Some(kind) = anomaly
        .as_ref()
        .filter(|k| !recorded.verdict.bad.contains(*k))
    {
        return bad(format!(
            "--anomaly {kind}: {} did not forbid it ({})",
            recorded.dir.display(),
            recorded.verdict.describe()
        ));
    }
    let store = args.store.unwrap_or_else(|| recorded.store.clone());
    let failed = |e: String| {
        eprintln!("tidemark replay: {e}");
        crate::EXIT_HARNESS_FAILED
    };
    let scratch = match tempfile::Builder::new()
        .prefix("tidemark-replay-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => return failed(format!("a scratch directory: {e}")),
    };
    let schedule_file = scratch.path().join("schedule.json");
    let mut trials = match Trials::new() {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let trial = Trial::recorded(&recorded);
    println!(
        "replaying {}: {}; {} fault ops, {} s, seed from test.json",
        recorded.dir.display(),
        recorded.verdict.describe(),
        trial.schedule.len(),
        trial.time_limit_s
    );
    let mut repeated = 0;
    for i in 1..=args.times {
        let run = match trials.run(&recorded, &trial, &store, &schedule_file, None) {
            Ok(run) => run,
            Err(TrialError::Interrupted) => {
                eprintln!(
                    "tidemark replay: interrupted after {} of {} tries",
                    i - 1,
                    args.times
                );
                return crate::EXIT_HARNESS_FAILED;
            }
            Err(TrialError::Failed(e)) => return failed(format!("try {i}: {e}")),
        };
        let same = match &anomaly {
            Some(kind) => run.verdict.bad.contains(kind),
            None => run.verdict.repeats(&recorded.verdict),
        };
        repeated += usize::from(same);
        let said = match (same, &anomaly, recorded.verdict.bad.is_empty()) {
            (true, Some(kind), _) => format!("reproduced: {kind} came back"),
            (true, None, false) => "reproduced: the same anomaly types came back".into(),
            (true, None, true) => "reproduced: the same verdict".into(),
            (false, _, _) => "not reproduced".into(),
        };
        println!(
            "try {i}/{}: {}: {said} ({:.0} s, {})",
            args.times,
            run.verdict.describe(),
            run.wall.as_secs_f64(),
            run.dir.display()
        );
    }
    println!(
        "reproduced {repeated} of {} tries ({:.0}%)",
        args.times,
        100.0 * repeated as f64 / args.times as f64
    );
    if repeated == args.times {
        0
    } else {
        1
    }
}
