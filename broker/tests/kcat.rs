//! kcat (librdkafka) against the real broker binary: metadata, produce with every acks setting,
//! consume from any offset, list offsets, durability across restart and kill -9, the brokers a
//! cluster lists as one goes down and comes back (and its quorum as DescribeQuorum tells it),
//! and a cluster of dedicated controllers and brokers.

mod common;

use std::time::Duration;

use common::client::create_topic;
use common::{kcat, BrokerProc, Cluster, FAST_FAILOVER};

fn messages(n: usize, salt: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut x = salt
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for i in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pad = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(1 + (x >> 60) as usize);
        let len = 1 + (x >> 33) as usize % pad.len();
        out.extend_from_slice(format!("{i}:{:016x}:{}\n", x, &pad[..len]).as_bytes());
    }
    out
}

/// Compares without printing megabytes: lengths and the first differing line.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let g: Vec<&[u8]> = got.split(|b| *b == b'\n').collect();
        let w: Vec<&[u8]> = want.split(|b| *b == b'\n').collect();
        let first = g
            .iter()
            .zip(&w)
            .position(|(a, b)| a != b)
            .unwrap_or(g.len().min(w.len()));
        panic!(
            "{what}: got {} bytes / {} lines, want {} bytes / {} lines; first difference at line {first}: got {:?}, want {:?}",
            got.len(),
            g.len(),
            want.len(),
            w.len(),
            g.get(first).map(|l| String::from_utf8_lossy(l)),
            w.get(first).map(|l| String::from_utf8_lossy(l)),
        );
    }
}

fn consume_all(b: &BrokerProc, topic: &str, count: usize) -> Vec<u8> {
    let count = count.to_string();
    kcat(
        &[
            "-b",
            &b.bootstrap(),
            "-C",
            "-t",
            topic,
            "-p",
            "0",
            "-o",
            "beginning",
            "-c",
            &count,
            "-e",
            "-f",
            "%s\n",
        ],
        b"",
    )
}

#[test]
fn hundred_thousand_acks_all_survive_restart_byte_identical() {
    let mut b = BrokerProc::start(&[]);
    let input = messages(100_000, 1);
    kcat(
        &[
            "-b",
            &b.bootstrap(),
            "-P",
            "-t",
            "big",
            "-X",
            "acks=all",
            "-X",
            "linger.ms=5",
        ],
        &input,
    );
    assert_eq!(
        consume_all(&b, "big", 100_000),
        input,
        "consumed bytes differ from produced"
    );
    b.terminate();
    b.restart();
    assert_eq!(
        consume_all(&b, "big", 100_000),
        input,
        "differs after a clean restart"
    );
    assert!(
        !b.log().contains("recovery:"),
        "a clean restart needs no recovery:\n{}",
        b.log()
    );
}

#[test]
fn kill_minus_nine_with_flush_on_loses_nothing_acknowledged() {
    let mut b = BrokerProc::start(&["--override", "log.flush.interval.messages=1"]);
    let input = messages(20_000, 2);
    kcat(
        &[
            "-b",
            &b.bootstrap(),
            "-P",
            "-t",
            "durable",
            "-X",
            "acks=all",
        ],
        &input,
    );
    b.kill9();
    b.restart();
    assert_eq!(
        consume_all(&b, "durable", 20_000),
        input,
        "acknowledged records lost across kill -9"
    );
}

#[test]
fn every_acks_setting_metadata_and_offsets() {
    let b = BrokerProc::start(&[]);
    let boot = b.bootstrap();
    for (acks, topic) in [("0", "acks0"), ("1", "acks1"), ("all", "acksall")] {
        let input = messages(500, 3);
        kcat(
            &[
                "-b",
                &boot,
                "-P",
                "-t",
                topic,
                "-X",
                &format!("acks={acks}"),
            ],
            &input,
        );
        assert_same(
            &consume_all(&b, topic, 500),
            &input,
            &format!("acks={acks}"),
        );
    }
    let meta = String::from_utf8(kcat(&["-b", &boot, "-L"], b"")).unwrap();
    for t in ["acks0", "acks1", "acksall"] {
        assert!(
            meta.contains(&format!("topic \"{t}\" with 1 partitions")),
            "{meta}"
        );
    }
    // Consume from an absolute offset and from the end.
    let from_490 = kcat(
        &[
            "-b", &boot, "-C", "-t", "acks1", "-p", "0", "-o", "490", "-e", "-f", "%o\n",
        ],
        b"",
    );
    let offsets: Vec<i64> = String::from_utf8(from_490)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(offsets, (490..500).collect::<Vec<_>>());
    let tail = kcat(
        &[
            "-b", &boot, "-C", "-t", "acks1", "-p", "0", "-o", "-3", "-e", "-f", "%o\n",
        ],
        b"",
    );
    assert_eq!(String::from_utf8(tail).unwrap(), "497\n498\n499\n");
    // ListOffsets by timestamp: everything was written before now.
    let q = String::from_utf8(kcat(&["-b", &boot, "-Q", "-t", "acks1:0:0"], b"")).unwrap();
    assert!(q.contains("offset 0"), "{q}");
}

/// The compression codec of every batch in a partition's segments, read from the files.
fn stored_codecs(b: &BrokerProc, topic: &str) -> Vec<u8> {
    let dir = b.data_dir().join(format!("{topic}-0"));
    let mut segments: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    let mut codecs = Vec::new();
    for seg in segments {
        let bytes = std::fs::read(&seg).unwrap();
        let mut pos = 0;
        while pos + 61 <= bytes.len() {
            let len = i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
            codecs.push(bytes[pos + 22] & 0x7);
            pos += 12 + len;
        }
    }
    codecs
}

#[test]
fn every_codec_is_stored_compressed_and_read_back() {
    let b = BrokerProc::start(&[]);
    for (codec, id) in [("gzip", 1u8), ("snappy", 2), ("lz4", 3), ("zstd", 4)] {
        let topic = format!("codec-{codec}");
        let input = messages(2_000, u64::from(id));
        kcat(
            &[
                "-b",
                &b.bootstrap(),
                "-P",
                "-t",
                &topic,
                "-z",
                codec,
                "-X",
                "acks=all",
                "-X",
                "linger.ms=20",
            ],
            &input,
        );
        let codecs = stored_codecs(&b, &topic);
        assert!(!codecs.is_empty(), "{codec}: no batch stored");
        assert!(
            codecs.iter().all(|c| *c == id),
            "{codec}: stored batch codecs {codecs:?}, want all {id}"
        );
        assert_same(&consume_all(&b, &topic, 2_000), &input, codec);
    }
}

/// The broker ids `kcat -L` lists, from the first running node.
fn listed_brokers(c: &Cluster) -> Vec<i32> {
    let out = kcat(&["-b", &c.running()[0], "-L", "-m", "5"], b"");
    let mut ids: Vec<i32> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("broker ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    ids.sort();
    ids
}

/// The offline replicas Metadata names for partition 0 of `topic`, as `admin describe` reads them.
fn offline_replicas(c: &Cluster, topic: &str) -> Option<serde_json::Value> {
    Some(c.describe(Some(topic))?["partitions"][0]["offline"].clone())
}

/// Kafka's metadata lists live brokers only: once a killed broker's session has expired and it
/// is fenced, clients no longer see it, and its replicas are offline; started again, it is
/// listed once it has registered.
#[test]
fn a_fenced_broker_leaves_the_listed_brokers_and_returns_when_restarted() {
    let mut c = Cluster::start(3, FAST_FAILOVER, &[]);
    assert_eq!(create_topic(&c.addr(1), "spread", 1, 3, &[]), 0);
    assert_eq!(listed_brokers(&c), [1, 2, 3]);
    // In combined mode DescribeQuorum names one of the three as the active controller, every
    // node a voter and none an observer.
    let quorum = c.describe_quorum().expect("a quorum with a leader");
    assert!(
        (1..=3).contains(&quorum["leader"].as_i64().unwrap()),
        "{quorum}"
    );
    assert_eq!(quorum["voters"].as_array().unwrap().len(), 3, "{quorum}");
    assert_eq!(quorum["observers"], serde_json::json!([]), "{quorum}");
    assert_eq!(offline_replicas(&c, "spread"), Some(serde_json::json!([])));
    c.node(3).kill9();
    c.wait_for(
        "broker 3 fenced and unlisted",
        Duration::from_secs(15),
        |c| listed_brokers(c) == [1, 2],
    );
    assert_eq!(offline_replicas(&c, "spread"), Some(serde_json::json!([3])));
    c.node(3).restart();
    c.wait_for("broker 3 listed again", Duration::from_secs(15), |c| {
        listed_brokers(c) == [1, 2, 3]
    });
    assert_eq!(offline_replicas(&c, "spread"), Some(serde_json::json!([])));
}

/// KRaft's production layout: kcat sees only the broker-only nodes, one of them named as the
/// controller it may send admin requests to, and acks=all records come back byte-identical.
#[test]
fn kcat_works_against_dedicated_controllers_and_brokers() {
    let c = Cluster::start_dedicated(3, 3, "");
    assert_eq!(listed_brokers(&c), [4, 5, 6]);
    let listing = String::from_utf8_lossy(&kcat(&["-b", &c.running()[0], "-L"], b"")).to_string();
    assert!(
        listing.lines().any(|l| l.contains("(controller)")
            && [4, 5, 6]
                .iter()
                .any(|b| l.contains(&format!("broker {b} at")))),
        "kcat names a broker as the controller:\n{listing}"
    );
    assert_eq!(create_topic(&c.addr(4), "dedicated", 1, 3, &[]), 0);
    let input = messages(10_000, 3);
    kcat(
        &[
            "-b",
            &c.running().join(","),
            "-P",
            "-t",
            "dedicated",
            "-p",
            "0",
            "-X",
            "acks=all",
        ],
        &input,
    );
    let got = kcat(
        &[
            "-b",
            &c.running()[1],
            "-C",
            "-t",
            "dedicated",
            "-p",
            "0",
            "-o",
            "beginning",
            "-c",
            "10000",
            "-e",
            "-f",
            "%s\n",
        ],
        b"",
    );
    assert_same(&got, &input, "dedicated");
}
