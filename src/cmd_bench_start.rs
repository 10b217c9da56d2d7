//! `tidemark bench-docker-start`: how long a 3-node cluster of the docker runtime takes from
//! `docker run` to its first acknowledged write (acks=all on a topic of three replicas), the
//! harness's own path: containers started and logged in to over SSH, the broker uploaded and
//! started on each, then a topic created and written until a write is acknowledged. The image
//! must exist (`tidemark image build`). Prints each repetition's phases and the median.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tidemark_harness::broker::{BrokerConfig, TidemarkBroker};
use tidemark_harness::db::Db;
use tidemark_harness::dial::Dialer;
use tidemark_harness::docker::{DockerRuntime, DEFAULT_IMAGE};
use tidemark_harness::kafka::Connection;
use tidemark_harness::leftovers;
use tidemark_harness::runtime::Runtime;

/// The write must be acknowledged within this long of the brokers starting.
const ACK_DEADLINE: Duration = Duration::from_secs(60);

/// Arguments of `tidemark bench-docker-start`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Repetitions.
    #[arg(long, default_value_t = 3, value_name = "N")]
    repeat: usize,
    /// The node image.
    #[arg(long, default_value = DEFAULT_IMAGE, value_name = "NAME")]
    image: String,
    /// The broker binary (default: beside this executable).
    #[arg(long, value_name = "PATH")]
    broker_binary: Option<PathBuf>,
}

/// One repetition's phases, from `docker run` of the first container.
struct Phases {
    logged_in: Duration,
    brokers_started: Duration,
    first_ack: Duration,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    if args.repeat == 0 {
        eprintln!("tidemark bench-docker-start: --repeat must be at least 1");
        return crate::EXIT_BAD_INPUT;
    }
    let broker = match &args.broker_binary {
        Some(p) => p.clone(),
        None => match std::env::current_exe() {
            Ok(exe) => exe.with_file_name("tidemark-broker"),
            Err(e) => {
                eprintln!("tidemark bench-docker-start: cannot locate this executable: {e}");
                return crate::EXIT_HARNESS_FAILED;
            }
        },
    };
    let mut firsts = Vec::new();
    println!("| run | containers up, SSH logged in (s) | brokers started (s) | first acks=all write (s) |");
    println!("|---|---|---|---|");
    for i in 1..=args.repeat {
        match once(&args.image, &broker) {
            Ok(p) => {
                println!(
                    "| {i} | {:.2} | {:.2} | {:.2} |",
                    p.logged_in.as_secs_f64(),
                    p.brokers_started.as_secs_f64(),
                    p.first_ack.as_secs_f64()
                );
                firsts.push(p.first_ack);
            }
            Err(e) => {
                eprintln!("tidemark bench-docker-start: run {i}: {e:#}");
                return crate::EXIT_HARNESS_FAILED;
            }
        }
    }
    firsts.sort();
    println!(
        "median container start to first acknowledged write: {:.2} s (target: under 10 s)",
        firsts[firsts.len() / 2].as_secs_f64()
    );
    0
}

fn once(image: &str, broker: &std::path::Path) -> anyhow::Result<Phases> {
    let run = leftovers::new_run_id();
    let mut runtime = DockerRuntime::new(&std::env::temp_dir().join("tidemark"), &run, image);
    let names: Vec<String> = (1..=3).map(|i| format!("n{i}")).collect();
    let started = Instant::now();
    let measured = (|| {
        let nodes = runtime.create("a", &names)?;
        let logged_in = started.elapsed();
        let db = TidemarkBroker::new(
            broker.to_path_buf(),
            BrokerConfig::for_replication(3),
            vec![],
        );
        for node in &nodes {
            db.setup(node, &nodes)?;
        }
        let brokers_started = started.elapsed();
        let endpoints: Vec<SocketAddr> = nodes.iter().map(|n| db.endpoint(n)).collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(first_ack(runtime.dialer(), &endpoints))?;
        anyhow::Ok(Phases {
            logged_in,
            brokers_started,
            first_ack: started.elapsed(),
        })
    })();
    let destroyed = runtime.destroy();
    let phases = measured?;
    destroyed?;
    Ok(phases)
}

/// Creates topic `bench` (three replicas) and writes one record with acks=all to its leader,
/// again and again until one is acknowledged.
async fn first_ack(dialer: Arc<dyn Dialer>, endpoints: &[SocketAddr]) -> anyhow::Result<()> {
    const TOPIC: &str = "bench";
    let timeout = Duration::from_secs(2);
    let deadline = Instant::now() + ACK_DEADLINE;
    let mut last = String::from("nothing tried");
    while Instant::now() < deadline {
        let attempt = async {
            let mut conn = Connection::connect(dialer.clone(), endpoints[0], timeout).await?;
            // 0 made, 36 TOPIC_ALREADY_EXISTS; anything else is tried again.
            let code = conn.create_topic(TOPIC, 1, 3).await?;
            if code != 0 && code != 36 {
                bail!("CreateTopics answered error {code}");
            }
            let meta = conn.metadata(Some(&[TOPIC.to_string()])).await?;
            let leader = meta
                .topics
                .get(TOPIC)
                .and_then(|(_, parts)| parts.get(&0))
                .map(|p| p.leader)
                .filter(|&l| l > 0)
                .context("no leader yet")?;
            let addr = endpoints
                .get(leader as usize - 1)
                .with_context(|| format!("leader {leader} is not a node"))?;
            let mut to_leader = Connection::connect(dialer.clone(), *addr, timeout).await?;
            let answer = to_leader.produce(TOPIC, 0, &[1], -1).await?;
            if answer.error_code != 0 {
                bail!("Produce answered error {}", answer.error_code);
            }
            anyhow::Ok(())
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no acknowledged write within {ACK_DEADLINE:?}; last: {last}")
}
