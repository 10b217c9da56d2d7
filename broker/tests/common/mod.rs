//! Starting and stopping a real `tidemark-broker` process for integration tests, and a minimal
//! raw Kafka request helper.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::{Encodable, StrBytes};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A broker process on loopback with its own data directory.
pub struct BrokerProc {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    args: Vec<String>,
}

impl BrokerProc {
    /// Starts a broker with `extra` arguments (e.g. `--override k=v`) and waits until it serves.
    pub fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let props = dir.path().join("server.properties");
        std::fs::write(
            &props,
            format!(
                "node.id=1\nprocess.roles=broker,controller\nlisteners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{}\ncontroller.listener.names=CONTROLLER\nlog.dirs={}\nnum.partitions=1\n",
                free_port(),
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let mut args = vec![props.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut b = BrokerProc {
            child: None,
            dir,
            port,
            args,
        };
        b.spawn();
        b
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tidemark-broker"))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start tidemark-broker");
        self.child = Some(child);
        wait_ready(self.port, self);
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            let status = c.wait().unwrap();
            assert!(
                status.success(),
                "broker exited with {status} on SIGTERM\n{}",
                self.log()
            );
        }
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the broker first");
        self.spawn();
    }
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_ready(port: u16, b: &mut BrokerProc) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            if api_versions_roundtrip(&mut s).is_ok() {
                return;
            }
        }
        assert!(b.is_running(), "broker exited during start\n{}", b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("broker did not serve within 20 s\n{}", b.log());
}

/// Encodes a request frame (with its length prefix).
pub fn frame<T: Encodable>(key: ApiKey, version: i16, correlation_id: i32, body: &T) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("tidemark-test")));
    header
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    body.encode(&mut buf, version).unwrap();
    let mut out = (buf.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    out
}

/// Reads one response frame body (correlation id first).
pub fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// Sends ApiVersions v0 and checks the answer carries our correlation id and error code 0.
pub fn api_versions_roundtrip(s: &mut TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = kafka_protocol::messages::ApiVersionsRequest::default();
    s.write_all(&frame(ApiKey::ApiVersions, 0, 77, &req))?;
    let body = read_frame(s)?;
    let ok = body.len() >= 6 && body[..4] == 77i32.to_be_bytes() && body[4..6] == [0, 0];
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::other("bad ApiVersions answer"))
    }
}

/// Runs kcat with `args`, feeding `stdin`, and returns stdout; fails the test on a non-zero exit.
pub fn kcat(args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat must be installed (apt-get install kcat)");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        out.status.success(),
        "kcat {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
