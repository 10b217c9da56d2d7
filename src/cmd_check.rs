//! `tidemark check`: re-analyse a recorded run. It reads `history.jsonl` (streamed, so a long
//! run needs no more memory than its distinct values) and `replicas.jsonl` when there is one
//! through [`tidemark_checkers::check_files`], the checking `tidemark test` and `tidemark report`
//! use too, writes `results.json` (never over one of its inputs), prints a few lines (or the
//! JSON), and exits 0 valid, 1 invalid, 2 unknown (nothing forbidden found, but lost writes or
//! divergence could not be judged), 254 bad input.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tidemark_checkers::{check_files, BadInput, RunFiles};

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

fn resolve(args: &Args) -> Result<(RunFiles, PathBuf), BadInput> {
    let name = || args.path.display().to_string();
    let meta = std::fs::metadata(&args.path)
        .map_err(|e| BadInput::whole(e.to_string()).in_file(name()))?;
    let (files, dir) = if meta.is_dir() {
        (RunFiles::in_dir(&args.path)?, args.path.clone())
    } else {
        let dir = args
            .path
            .parent()
            .map_or_else(PathBuf::new, Path::to_path_buf);
        let files = RunFiles {
            history: args.path.clone(),
            replicas: None,
        };
        (files, dir)
    };
    let files = RunFiles {
        replicas: args.replicas.clone().or(files.replicas),
        ..files
    };
    let out = args.out.clone().unwrap_or_else(|| dir.join("results.json"));
    let inputs = std::iter::once(&files.history).chain(&files.replicas);
    if let Some(input) = inputs.into_iter().find(|i| same_file(&out, i)) {
        return Err(BadInput::whole(format!(
            "--out {} is the input {}: refusing to overwrite it",
            out.display(),
            input.display()
        )));
    }
    Ok((files, out))
}

/// Whether two paths name one existing file, however they reach it (links, `.`, `..`).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let checked = resolve(&args).and_then(|(files, out)| Ok((check_files(&files)?, files, out)));
    let (results, files, out) = match checked {
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
    if let Err(e) = std::fs::write(&out, &json) {
        eprintln!("tidemark check: cannot write {}: {e}", out.display());
        return crate::EXIT_HARNESS_FAILED;
    }
    let mut stdout = std::io::stdout().lock();
    let printed = if args.json {
        stdout.write_all(json.as_bytes())
    } else {
        let mut text = format!("history: {}\n", files.history.display());
        if let Some(r) = &files.replicas {
            text.push_str(&format!("replicas: {}\n", r.display()));
        }
        text.push_str(&results.summary(args.examples));
        if let Some(tally) = crate::cmd_test::faults_of(&files.history) {
            text.push_str(&format!("faults: {tally}\n"));
        }
        text.push_str(&format!("results: {}\n", out.display()));
        stdout.write_all(text.as_bytes())
    };
    // A closed stdout (e.g. piped into `head`) does not change the verdict.
    let _ = printed.and_then(|()| stdout.flush());
    results.valid.exit_code()
}
