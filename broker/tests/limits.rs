//! The broker under the resource limits a host may impose: an address-space limit (`ulimit -v`)
//! while clients send frames whose element counts claim far more than the frame holds, and a
//! file-descriptor limit (`ulimit -n`) while clients connect and close over and over.

mod common;
mod rlimit;

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{api_versions_roundtrip, frame, read_frame, BrokerProc};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use rlimit::{limit, ADDRESS_SPACE};

/// A frame of a request header with a null client id followed by `body`.
fn raw_frame(key: ApiKey, version: i16, header_tagged: bool, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&(key as i16).to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&5i32.to_be_bytes());
    f.extend_from_slice(&(-1i16).to_be_bytes());
    if header_tagged {
        f.push(0);
    }
    f.extend_from_slice(body);
    let mut out = (f.len() as u32).to_be_bytes().to_vec();
    out.extend(f);
    out
}

/// Sends `bytes` and reads until the broker answers or closes; either is fine, dying is not.
fn send_hostile(b: &mut BrokerProc, what: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    let answer = read_frame(&mut s);
    assert!(
        b.is_running(),
        "broker died on {what} ({answer:?})\n{}",
        b.log()
    );
    let mut s = TcpStream::connect(("127.0.0.1", b.port))
        .unwrap_or_else(|e| panic!("broker no longer accepts after {what}: {e}\n{}", b.log()));
    api_versions_roundtrip(&mut s)
        .unwrap_or_else(|e| panic!("broker no longer serves after {what}: {e}\n{}", b.log()));
}

#[test]
fn hostile_counts_under_an_address_space_limit_close_only_their_connection() {
    let mut b = BrokerProc::start(&[]);
    limit(b.pid().unwrap(), ADDRESS_SPACE);
    // Metadata v4, 18 bytes in all: a header, then a topics array claiming 2^31 - 1 entries.
    let metadata_v4 = raw_frame(ApiKey::Metadata, 4, false, &i32::MAX.to_be_bytes());
    send_hostile(&mut b, "Metadata v4 with 2^31-1 topics", &metadata_v4);
    // Metadata v12 (flexible): a compact count of 2^32 - 2 entries.
    let metadata_v12 = raw_frame(ApiKey::Metadata, 12, true, &[0xff, 0xff, 0xff, 0xff, 0x0f]);
    send_hostile(&mut b, "Metadata v12 with 2^32-2 topics", &metadata_v12);
    // Produce v8: one topic, then a partition array of 2^31 - 1 entries.
    let mut produce = Vec::new();
    produce.extend_from_slice(&(-1i16).to_be_bytes());
    produce.extend_from_slice(&1i16.to_be_bytes());
    produce.extend_from_slice(&1000i32.to_be_bytes());
    produce.extend_from_slice(&1i32.to_be_bytes());
    produce.extend_from_slice(&1i16.to_be_bytes());
    produce.push(b't');
    produce.extend_from_slice(&i32::MAX.to_be_bytes());
    let produce_v8 = raw_frame(ApiKey::Produce, 8, false, &produce);
    send_hostile(&mut b, "Produce v8 with 2^31-1 partitions", &produce_v8);
    assert!(!b.log().contains("panicked"), "{}", b.log());
}

/// Open file descriptors of a process.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/<pid>/fd")
        .count()
}

/// Polls until the broker holds at most `bound` descriptors; the count on failure.
fn wait_fds_at_most(pid: u32, bound: usize, within: Duration) -> Result<(), usize> {
    let deadline = Instant::now() + within;
    loop {
        let n = open_fds(pid);
        if n <= bound {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(n);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connection_churn_leaves_no_descriptors_behind() {
    const CYCLES: usize = 100_000;
    const CHECK_EVERY: usize = 5_000;
    let mut b = BrokerProc::start(&[]);
    let pid = b.pid().unwrap();
    // Below what the cycles would pile up if closed connections lingered.
    limit(pid, "--nofile=256");
    let start = open_fds(pid);
    let request = frame(ApiKey::ApiVersions, 3, 1, &ApiVersionsRequest::default());
    let addr = SocketAddr::from(([127, 0, 0, 1], b.port));
    let started = Instant::now();
    for i in 0..CYCLES {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect {i} failed: {e}\n{}", b.log()));
        match i % 4 {
            // Idle: connect and close.
            0 | 1 => {}
            // A request answered, then close.
            2 => {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.write_all(&request).unwrap();
                read_frame(&mut s).unwrap_or_else(|e| panic!("cycle {i}: {e}\n{}", b.log()));
            }
            // A request, then end of input before its answer is read.
            _ => {
                s.write_all(&request).unwrap();
                s.shutdown(Shutdown::Write).unwrap();
            }
        }
        drop(s);
        if (i + 1) % CHECK_EVERY == 0 {
            if let Err(n) = wait_fds_at_most(pid, start + 64, Duration::from_secs(10)) {
                panic!(
                    "after {} cycles the broker holds {n} descriptors (started with {start})",
                    i + 1
                );
            }
        }
    }
    let elapsed = started.elapsed();
    if let Err(n) = wait_fds_at_most(pid, start + 4, Duration::from_secs(10)) {
        panic!("after {CYCLES} cycles the broker holds {n} descriptors (started with {start})");
    }
    let mut s = TcpStream::connect(("127.0.0.1", b.port)).unwrap();
    api_versions_roundtrip(&mut s).expect("the broker still serves");
    assert!(b.is_running(), "{}", b.log());
    eprintln!("{CYCLES} connect/close cycles in {elapsed:?}");
}
