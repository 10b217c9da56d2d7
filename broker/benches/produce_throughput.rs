//! Produce throughput on loopback with 1 KiB records, as ratios measured in one run so they
//! survive a noisy machine:
//! - one broker, acks=1, next to a loopback baseline (the same frames sent to a sink that only
//!   reads a frame and answers a tiny ack);
//! - a 3-node cluster, acks=all and replication factor 3, next to the single broker at acks=1
//!   (Kafka's published ratio for this pair is 0.54);
//! - an idempotent producer (InitProducerId, a sequence per batch) next to a plain one, on the
//!   single broker at acks=1 and on the cluster at acks=all (the target is ≥ 0.9). These are
//!   measured in pairs, plain and idempotent back to back with the order swapped every pair, so
//!   neither kind always comes first into a page cache, a segment roll or a busy spell of the
//!   machine; each pair's ratio and their median are printed besides the one over all pairs (a
//!   stall of the disk or the machine lands in one measurement and swings the total).
//!
//! Every request's batch gets its sequence rewritten and its CRC recomputed, for plain batches
//! too (same sequence), so the client does the same work in both.
//!
//! `cargo bench -p tidemark-broker --bench produce_throughput` (`TIDEMARK_BENCH_MIB=N` sends N MiB
//! per measurement instead of 512, for a quick look on a busy machine).

#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, InitProducerIdRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use support::{IN_FLIGHT, PER_BATCH, RECORD};

const DEFAULT_MIB: usize = 512;

/// The bench topic's `segment.bytes`: above what a default run sends to one partition, so no
/// segment rolls inside a measurement. A roll still stalls the appends around it for the disk
/// (measured: with 1 GiB segments the measurement holding the roll ran 2.5–6× slower than its
/// pair), and it would land on whichever of a pair comes to it, which is not what the
/// idempotent/plain ratio is about.
const NO_ROLL_SEGMENT_BYTES: &str = "8589934592";

/// Plain/idempotent pairs per setup; each measurement of a pair sends a `PAIRS`th of the bytes.
const PAIRS: usize = 4;

/// A producer's identity: plain, or an idempotent producer id (epoch 0).
#[derive(Clone, Copy)]
enum Producer {
    Plain,
    Idempotent(i64),
}

/// Byte offsets inside a v2 batch (Kafka's layout).
const CRC_AT: usize = 17;
const ATTRIBUTES_AT: usize = 21;
const BASE_SEQUENCE_AT: usize = 53;

/// A produce frame and where its record batch lies in it (start, length).
fn produce_frame(acks: i16, producer: Producer) -> (Vec<u8>, usize, usize) {
    let values = support::record_values();
    let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let batch = match producer {
        Producer::Plain => tidemark_broker::log::testing::batch(&values),
        Producer::Idempotent(pid) => {
            tidemark_broker::log::testing::idempotent_batch(&values, pid, 0, 0)
        }
    };
    support::produce_frame(acks, &batch)
}

/// Sends `n` produce frames with `IN_FLIGHT` outstanding and returns the elapsed time. An
/// idempotent producer's batches carry sequences from `first_seq` on; the next free one is
/// `first_seq + n * PER_BATCH`.
fn drive(addr: &str, n: usize, acks: i16, producer: Producer, first_seq: i32) -> Duration {
    let frame = produce_frame(acks, producer);
    support::drive(addr, n, frame, |batch, sent| {
        let seq = match producer {
            Producer::Plain => -1,
            Producer::Idempotent(_) => first_seq + (sent * PER_BATCH) as i32,
        };
        batch[BASE_SEQUENCE_AT..BASE_SEQUENCE_AT + 4].copy_from_slice(&seq.to_be_bytes());
        let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    })
}

/// One connection's producer over successive measurements: an idempotent producer's sequences
/// go on from where the last measurement stopped.
struct Sender {
    addr: String,
    acks: i16,
    producer: Producer,
    next_seq: i32,
}

impl Sender {
    fn new(addr: &str, acks: i16, producer: Producer) -> Self {
        Sender {
            addr: addr.to_string(),
            acks,
            producer,
            next_seq: 0,
        }
    }

    fn send(&mut self, n: usize) -> Duration {
        let d = drive(&self.addr, n, self.acks, self.producer, self.next_seq);
        self.next_seq += (n * PER_BATCH) as i32;
        d
    }
}

/// `PAIRS` pairs of `n` requests each, plain and idempotent, the first of each pair swapped
/// every pair: the total time of each and every pair's idempotent/plain rate ratio.
fn pairs(plain: &mut Sender, idempotent: &mut Sender, n: usize) -> (Duration, Duration, Vec<f64>) {
    let (mut p, mut i, mut ratios) = (Duration::ZERO, Duration::ZERO, Vec::new());
    for pair in 0..PAIRS {
        let (dp, di) = if pair % 2 == 0 {
            let dp = plain.send(n);
            (dp, idempotent.send(n))
        } else {
            let di = idempotent.send(n);
            (plain.send(n), di)
        };
        ratios.push(dp.as_secs_f64() / di.as_secs_f64());
        p += dp;
        i += di;
    }
    (p, i, ratios)
}

/// InitProducerId v4 from `addr`: a fresh producer id.
fn init_producer_id(addr: &str) -> i64 {
    let mut s = TcpStream::connect(addr).unwrap();
    let req = InitProducerIdRequest::default().with_transaction_timeout_ms(60_000);
    s.write_all(&common::frame(ApiKey::InitProducerId, 4, 1, &req))
        .unwrap();
    let body = common::read_frame(&mut s).unwrap();
    // Correlation id, empty header tags, throttle time, error code, producer id.
    let error = i16::from_be_bytes(body[9..11].try_into().unwrap());
    assert_eq!(error, 0, "InitProducerId failed");
    i64::from_be_bytes(body[11..19].try_into().unwrap())
}

/// A sink that reads whole frames and answers each with an 8-byte frame.
fn spawn_sink() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let s = s.unwrap();
            s.set_nodelay(true).unwrap();
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                let mut len = [0u8; 4];
                let mut body = Vec::new();
                while r.read_exact(&mut len).is_ok() {
                    body.resize(u32::from_be_bytes(len) as usize, 0);
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    if w.write_all(&[0, 0, 0, 4, body[4], body[5], body[6], body[7]])
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn create_bench_topic(addr: &str, rf: i16) {
    let mut s = TcpStream::connect(addr).unwrap();
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("bench")))
            .with_num_partitions(1)
            .with_replication_factor(rf)
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str("segment.bytes"))
                .with_value(Some(StrBytes::from_static_str(
                    NO_ROLL_SEGMENT_BYTES,
                )))])]);
    s.write_all(&common::frame(ApiKey::CreateTopics, 5, 1, &create))
        .unwrap();
    common::read_frame(&mut s).unwrap();
}

fn main() {
    let b = common::BrokerProc::start(&[]);
    create_bench_topic(&b.bootstrap(), 1);
    let cluster = common::Cluster::start(3, "", &[]);
    create_bench_topic(&cluster.addr(1), 3);
    cluster.wait_for("ISR of 3", Duration::from_secs(30), |c| {
        c.partition_state("bench", 0)
            .is_some_and(|s| s.2.len() == 3)
    });
    let leader = cluster.addr(cluster.partition_state("bench", 0).unwrap().0);

    let total_bytes = match std::env::var("TIDEMARK_BENCH_MIB") {
        Ok(v) => v
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("TIDEMARK_BENCH_MIB={v:?} is not a number of MiB")),
        Err(_) => DEFAULT_MIB,
    } << 20;
    let frame_bytes = produce_frame(1, Producer::Plain).0.len();
    let n = total_bytes / (RECORD * PER_BATCH);
    let sink = spawn_sink();
    let mut single = Sender::new(&b.bootstrap(), 1, Producer::Plain);
    let mut single_idem = Sender::new(
        &b.bootstrap(),
        1,
        Producer::Idempotent(init_producer_id(&b.bootstrap())),
    );
    let mut replicated = Sender::new(&leader, -1, Producer::Plain);
    let mut replicated_idem =
        Sender::new(&leader, -1, Producer::Idempotent(init_producer_id(&leader)));
    let mut replicated_acks1 = Sender::new(&leader, 1, Producer::Plain);
    let mut loopback = Sender::new(&sink, 1, Producer::Plain);
    let warm = n / 10;
    for s in [
        &mut loopback,
        &mut single,
        &mut single_idem,
        &mut replicated,
        &mut replicated_idem,
    ] {
        s.send(warm);
    }

    let base = loopback.send(n);
    let per_pair = n / PAIRS;
    let (single_plain, single_idem, single_ratios) = pairs(&mut single, &mut single_idem, per_pair);
    let (replicated_plain, replicated_idem, replicated_ratios) =
        pairs(&mut replicated, &mut replicated_idem, per_pair);
    let replicated_acks1 = replicated_acks1.send(n);
    let rate = |d: Duration, requests: usize| {
        (
            (requests * PER_BATCH) as f64 / d.as_secs_f64(),
            (requests * PER_BATCH * RECORD) as f64 / d.as_secs_f64() / 1e6,
        )
    };
    let paired = per_pair * PAIRS;
    let (lr, lm) = rate(base, n);
    let (sr, sm) = rate(single_plain, paired);
    let (rr, rm) = rate(replicated_plain, paired);
    let (r1r, r1m) = rate(replicated_acks1, n);
    let (sir, sim) = rate(single_idem, paired);
    let (rir, rim) = rate(replicated_idem, paired);
    let listed = |ratios: &[f64]| {
        let mut sorted = ratios.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = (sorted[(PAIRS - 1) / 2] + sorted[PAIRS / 2]) / 2.0;
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        format!("median {median:.2}, pairs {}", each.join(", "))
    };
    println!("produce, 1 KiB records, {PER_BATCH} records/request, {IN_FLIGHT} in flight, {} MiB, frame {frame_bytes} B; idempotent and plain in {PAIRS} alternating pairs", total_bytes >> 20);
    println!("  loopback baseline          : {lr:>10.0} records/s  {lm:>8.1} MB/s");
    println!("  1 broker, acks=1, RF=1     : {sr:>10.0} records/s  {sm:>8.1} MB/s");
    println!("  3 brokers, acks=all, RF=3  : {rr:>10.0} records/s  {rm:>8.1} MB/s");
    println!("  3 brokers, acks=1, RF=3    : {r1r:>10.0} records/s  {r1m:>8.1} MB/s");
    println!("  1 broker, acks=1, idempotent      : {sir:>10.0} records/s  {sim:>8.1} MB/s");
    println!("  3 brokers, acks=all, idempotent   : {rir:>10.0} records/s  {rim:>8.1} MB/s");
    println!("  ratio acks=1 RF=1 / loopback       : {:.2}", sm / lm);
    println!(
        "  ratio acks=all RF=3 / acks=1 RF=1  : {:.2}  (Kafka publishes 0.54)",
        rm / sm
    );
    println!(
        "  ratio idempotent / plain, 1 broker acks=1     : {:.2}  ({}; target >= 0.9)",
        sim / sm,
        listed(&single_ratios)
    );
    println!(
        "  ratio idempotent / plain, 3 brokers acks=all  : {:.2}  ({}; target >= 0.9)",
        rim / rm,
        listed(&replicated_ratios)
    );
}
