//! A broker under test that answers with absurd element counts must not abort the harness (and
//! skip its teardown): the client returns an error. The scenarios run in a child process of this
//! test binary under an address-space limit, where reserving room for 2^31 elements fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tidemark_harness::dial::Direct;
use tidemark_harness::kafka::{encode_batch, Connection, KafkaError};

/// Set in the child that runs the scenarios.
const CHILD_ENV: &str = "TIDEMARK_HOSTILE_BROKER_CHILD";
/// Far more than the test needs, far less than 2^31 elements of anything.
const ADDRESS_SPACE: &str = "1073741824";
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the fake broker answers to one request: the response body after its header.
type Script = fn(api_key: i16, version: i16) -> Vec<u8>;

/// Serves one connection on loopback with `script`, answering requests until the client leaves.
fn fake_broker(script: Script) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        loop {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).is_err() {
                return;
            }
            let mut req = vec![0u8; u32::from_be_bytes(len) as usize];
            if s.read_exact(&mut req).is_err() {
                return;
            }
            let key = i16::from_be_bytes([req[0], req[1]]);
            let version = i16::from_be_bytes([req[2], req[3]]);
            let mut resp = req[4..8].to_vec();
            // Response header v1 (a tagged-field count) for flexible versions but ApiVersions.
            let flexible = match key {
                1 => version >= 12,
                3 => version >= 9,
                _ => false,
            };
            if flexible {
                resp.push(0);
            }
            resp.extend(script(key, version));
            let mut out = (resp.len() as u32).to_be_bytes().to_vec();
            out.extend(resp);
            if s.write_all(&out).is_err() {
                return;
            }
        }
    });
    addr
}

/// ApiVersions v0 offering Metadata 0..=12 and Fetch 4..=12.
fn api_versions() -> Vec<u8> {
    let mut b = 0i16.to_be_bytes().to_vec();
    b.extend_from_slice(&2i32.to_be_bytes());
    for (key, min, max) in [(3i16, 0i16, 12i16), (1, 4, 12)] {
        for v in [key, min, max] {
            b.extend_from_slice(&v.to_be_bytes());
        }
    }
    b
}

fn hostile_api_versions(_: i16, _: i16) -> Vec<u8> {
    // Error code 0, then an api_keys array of 2^31 - 1 entries.
    let mut b = 0i16.to_be_bytes().to_vec();
    b.extend_from_slice(&i32::MAX.to_be_bytes());
    b
}

fn hostile_metadata(key: i16, _: i16) -> Vec<u8> {
    if key == 18 {
        return api_versions();
    }
    // Metadata v12: throttle time, then a compact brokers array of 2^32 - 2 entries.
    let mut b = 0i32.to_be_bytes().to_vec();
    b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    b
}

/// CRC-32C (Castagnoli), as record batches carry it.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn hostile_fetch(key: i16, _: i16) -> Vec<u8> {
    if key == 18 {
        return api_versions();
    }
    // A well-formed batch of one record whose header claims 2^31 - 1 records, CRC fixed up.
    let mut batch = encode_batch(&[1]).unwrap().to_vec();
    batch[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let crc = crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    // Fetch v12: throttle, error, session, one topic "t" with partition 0 holding the batch.
    let mut b = Vec::new();
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&[2, 2, b't', 2]);
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    for offset in [1i64, 1, 0] {
        b.extend_from_slice(&offset.to_be_bytes());
    }
    b.push(0);
    b.extend_from_slice(&(-1i32).to_be_bytes());
    assert!(batch.len() < 127, "one-byte compact length");
    b.push(batch.len() as u8 + 1);
    b.extend(batch);
    b.extend_from_slice(&[0, 0, 0]);
    b
}

fn expect_protocol_error<T>(what: &str, r: Result<T, KafkaError>) {
    match r {
        Err(KafkaError::Protocol(e)) => println!("{what}: refused: {e}"),
        Err(e) => panic!("{what}: expected a protocol error, got {e}"),
        Ok(_) => panic!("{what}: a hostile response was accepted"),
    }
}

async fn scenarios() {
    let addr = fake_broker(hostile_api_versions);
    expect_protocol_error(
        "ApiVersions with 2^31-1 api keys",
        Connection::connect(Arc::new(Direct), addr, TIMEOUT).await,
    );

    let addr = fake_broker(hostile_metadata);
    let mut conn = Connection::connect(Arc::new(Direct), addr, TIMEOUT)
        .await
        .unwrap();
    expect_protocol_error("Metadata with 2^32-2 brokers", conn.metadata(None).await);

    let addr = fake_broker(hostile_fetch);
    let mut conn = Connection::connect(Arc::new(Direct), addr, TIMEOUT)
        .await
        .unwrap();
    expect_protocol_error(
        "Fetch with a batch of 2^31-1 records",
        conn.fetch("t", 0, 0, -1, 1 << 20, Duration::from_millis(10))
            .await,
    );
    println!("all hostile responses refused");
}

#[test]
fn hostile_counts_from_a_broker_are_errors_under_an_address_space_limit() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(scenarios());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("prlimit")
        .arg(format!("--as={ADDRESS_SPACE}"))
        .arg(&exe)
        .args([
            "hostile_counts_from_a_broker_are_errors_under_an_address_space_limit",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .expect("prlimit (util-linux) must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all hostile responses refused"),
        "the client under an address-space limit ended with {}\n{stdout}\n{stderr}",
        out.status
    );
    print!("{stdout}");
}
