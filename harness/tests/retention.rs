//! The harness's Kafka client against a real broker whose retention deleted old segments: a
//! fetch from the old start fails with OFFSET_OUT_OF_RANGE and names the new log start, and a
//! fetch from there reads on. The broker binary is the one `cargo build --workspace` puts beside
//! this test's directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_harness::dial::Direct;
use tidemark_harness::kafka::{Connection, ResponseError};

const TIMEOUT: Duration = Duration::from_secs(10);

fn broker_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let b = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("tidemark-broker");
    assert!(
        b.is_file(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        b.display()
    );
    b
}

/// A standalone broker on loopback, killed when dropped.
struct Broker {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Broker {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_broker(port: u16, props: &str) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "node.id=1\nlisteners=PLAINTEXT://127.0.0.1:{port}\nlog.dirs={}\n{props}",
        dir.path().join("data").display()
    );
    let config = dir.path().join("server.properties");
    std::fs::write(&config, text).unwrap();
    let log = std::fs::File::create(dir.path().join("broker.log")).unwrap();
    let child = Command::new(broker_binary())
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Broker { child, dir }
}

async fn connect(addr: std::net::SocketAddr, broker: &Broker) -> Connection {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Connection::connect(Arc::new(Direct), addr, TIMEOUT).await {
            Ok(c) => return c,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("broker did not serve: {e}\n{}", broker.log()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_from_a_deleted_offset_names_the_new_log_start() {
    let port = free_port();
    let broker = start_broker(
        port,
        "log.segment.bytes=4096\nlog.retention.bytes=12000\nlog.retention.ms=-1\nlog.retention.check.interval.ms=200\n",
    );
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut c = connect(addr, &broker).await;
    assert_eq!(c.create_topic("kept", 1, 1).await.unwrap(), 0);
    for i in 0..40 {
        let values: Vec<i64> = (0..20).map(|j| 1_000_000_000_000 + i * 20 + j).collect();
        let r = c.produce("kept", 0, &values, -1).await.unwrap();
        assert_eq!(r.error_code, 0, "produce {i}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let start = loop {
        let r = c
            .fetch("kept", 0, 0, -1, 1 << 20, Duration::ZERO)
            .await
            .unwrap();
        if r.error_code == ResponseError::OffsetOutOfRange.code() {
            assert!(r.records.is_empty());
            break r.log_start_offset;
        }
        assert_eq!(r.error_code, 0);
        assert!(
            Instant::now() < deadline,
            "retention deleted nothing\n{}",
            broker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(start > 0 && start < 800, "new log start {start}");
    let r = c
        .fetch("kept", 0, start, -1, 1 << 20, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(r.error_code, 0);
    assert!(r.log_start_offset >= start);
    let first = r.records.first().expect("records from the new start");
    assert_eq!(first.offset, r.log_start_offset);
    assert_eq!(
        first.value.as_deref(),
        Some((1_000_000_000_000 + first.offset).to_string().as_bytes())
    );
}
