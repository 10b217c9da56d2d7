//! `tidemark check`: re-analyse a recorded run. It reads `history.jsonl` (streamed, so a long
//! run needs no more memory than its distinct values) and `replicas.jsonl` when there is one,
//! writes `results.json`, prints a few lines (or the JSON), and exits 0 valid, 1 invalid,
//! 2 unknown, 254 bad input.

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};

use tidemark_checkers::{check_history, read_history, read_replicas, BadInput, ReplicaState};

/// Arguments of `tidemark check`.
#[derive(clap::Args)]
pub struct Args {
    /// A run directory (holding history.jsonl and maybe replicas.jsonl) or a history.jsonl file.
    pub path: PathBuf,
    /// The replicas.jsonl to use [default: replicas.jsonl in the run directory, if present].
    #[arg(long)]
    pub replicas: Option<PathBuf>,
    /// Where to write results.json [default: in the run directory, or beside the history file].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the content of results.json instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// How many examples of each anomaly the summary shows.
    #[arg(long, default_value_t = 5)]
    pub examples: usize,
}

/// Where the inputs and the output are.
struct Paths {
    history: PathBuf,
    replicas: Option<PathBuf>,
    out: PathBuf,
}

fn resolve(args: &Args) -> Result<Paths, String> {
    let meta =
        std::fs::metadata(&args.path).map_err(|e| format!("{}: {e}", args.path.display()))?;
    let (history, default_replicas, dir) = if meta.is_dir() {
        let replicas = args.path.join("replicas.jsonl");
        let replicas = replicas.exists().then_some(replicas);
        (args.path.join("history.jsonl"), replicas, args.path.clone())
    } else {
        let dir = args
            .path
            .parent()
            .map_or_else(PathBuf::new, Path::to_path_buf);
        (args.path.clone(), None, dir)
    };
    Ok(Paths {
        history,
        replicas: args.replicas.clone().or(default_replicas),
        out: args.out.clone().unwrap_or_else(|| dir.join("results.json")),
    })
}

fn open(path: &Path) -> Result<BufReader<File>, BadInput> {
    File::open(path)
        .map(|f| BufReader::with_capacity(1 << 16, f))
        .map_err(|e| {
            BadInput::whole(format!("cannot open: {e}")).in_file(path.display().to_string())
        })
}

fn load_replicas(path: &Path) -> Result<Vec<ReplicaState>, BadInput> {
    read_replicas(open(path)?).map_err(|e| e.in_file(path.display().to_string()))
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let paths = match resolve(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tidemark check: {e}");
            return crate::EXIT_BAD_INPUT;
        }
    };
    let replicas = match paths.replicas.as_deref().map(load_replicas).transpose() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tidemark check: {e}");
            return crate::EXIT_BAD_INPUT;
        }
    };
    let name = paths.history.display().to_string();
    let results = open(&paths.history)
        .and_then(|input| read_history(input).map_err(|e| e.in_file(name.clone())))
        .and_then(|history| check_history(history, replicas.as_deref()))
        .map_err(|e| {
            if e.file.is_none() {
                e.in_file(name.clone())
            } else {
                e
            }
        });
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tidemark check: {e}");
            return crate::EXIT_BAD_INPUT;
        }
    };
    let json = match serde_json::to_string_pretty(&results) {
        Ok(j) => j + "\n",
        Err(e) => {
            eprintln!("tidemark check: cannot serialize results: {e}");
            return crate::EXIT_HARNESS_FAILED;
        }
    };
    if let Err(e) = std::fs::write(&paths.out, &json) {
        eprintln!("tidemark check: cannot write {}: {e}", paths.out.display());
        return crate::EXIT_HARNESS_FAILED;
    }
    let mut stdout = std::io::stdout().lock();
    let printed = if args.json {
        stdout.write_all(json.as_bytes())
    } else {
        let mut text = format!("history: {name}\n");
        if let Some(r) = &paths.replicas {
            text.push_str(&format!("replicas: {}\n", r.display()));
        }
        text.push_str(&results.summary(args.examples));
        text.push_str(&format!("results: {}\n", paths.out.display()));
        stdout.write_all(text.as_bytes())
    };
    // A closed stdout (e.g. piped into `head`) does not change the verdict.
    let _ = printed.and_then(|()| stdout.flush());
    results.valid.exit_code()
}
