//! `tidemark image build`: makes the node image of `--runtime docker` and docker/compose.yaml on
//! this machine, with no registry (see [`tidemark_harness::image`]), or says it is up to date.

use std::path::PathBuf;

use tidemark_harness::docker::DEFAULT_IMAGE;
use tidemark_harness::image::{self, ImageInputs};

/// Arguments of `tidemark image`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(clap::Subcommand, Debug)]
enum ImageCommand {
    /// Make the node image (a Debian root from debootstrap, then docker/Dockerfile with the
    /// broker), unless it exists with the same inputs. Needs root the first time.
    #[command(after_help = "Examples:\n  \
        tidemark image build\n  \
        tidemark image build --mirror http://deb.debian.org/debian --name tidemark-node")]
    Build(BuildArgs),
}

#[derive(clap::Args, Debug)]
struct BuildArgs {
    /// The image's name.
    #[arg(long, default_value = DEFAULT_IMAGE, value_name = "NAME")]
    name: String,
    /// The Debian archive to debootstrap from (default: the one apt uses here, else
    /// http://deb.debian.org/debian).
    #[arg(long, value_name = "URL")]
    mirror: Option<String>,
    /// The broker binary to put in the image (default: beside this executable).
    #[arg(long, value_name = "PATH")]
    broker_binary: Option<PathBuf>,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let ImageCommand::Build(args) = args.command;
    let broker = match args.broker_binary {
        Some(p) => p,
        None => match std::env::current_exe() {
            Ok(exe) => exe.with_file_name("tidemark-broker"),
            Err(e) => {
                eprintln!("tidemark image build: cannot locate this executable: {e}");
                return crate::EXIT_HARNESS_FAILED;
            }
        },
    };
    if !broker.is_file() {
        eprintln!(
            "tidemark image build: no broker binary at {}; build it with `cargo build -p \
             tidemark-broker` or pass --broker-binary PATH",
            broker.display()
        );
        return crate::EXIT_BAD_INPUT;
    }
    let inputs = ImageInputs {
        name: args.name,
        mirror: args.mirror.unwrap_or_else(image::default_mirror),
        broker,
    };
    match image::build(&inputs, &mut std::io::stderr()) {
        Ok(built) => {
            let how = if built.reused {
                "up to date"
            } else if built.base_reused {
                "made on the existing base"
            } else {
                "made"
            };
            println!(
                "{}: {how} (base {}, inputs {})",
                inputs.name,
                built.base,
                &built.inputs[..16]
            );
            0
        }
        Err(e) => {
            eprintln!("tidemark image build: {e:#}");
            crate::EXIT_HARNESS_FAILED
        }
    }
}
