//! The producer side of the broker against a real broker process: batch size limits
//! (`message.max.bytes`, `max.message.bytes`) and the idempotent producer (InitProducerId,
//! sequence checks, duplicates answered with the original offset, state kept across restarts).

mod common;

use std::time::Duration;

use common::client::{
    create_topic, init_producer_id, produce_idempotent, produce_records, read_all,
};
use common::BrokerProc;

const MESSAGE_TOO_LARGE: i16 = 10;
const INVALID_REQUEST: i16 = 42;
const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const T: Duration = Duration::from_secs(10);

fn batch_of(value_bytes: usize) -> Vec<u8> {
    tidemark_broker::log::testing::batch(&[&vec![b'x'; value_bytes]])
}

#[test]
fn batches_over_the_size_limits_are_refused_with_message_too_large() {
    let b = BrokerProc::start(&["--override", "message.max.bytes=20000"]);
    let addr = b.bootstrap();
    assert_eq!(create_topic(&addr, "broker-limit", 1, 1, &[]), 0);
    assert_eq!(
        create_topic(&addr, "topic-limit", 1, 1, &[("max.message.bytes", "2000")]),
        0
    );
    assert_eq!(
        produce_records(&addr, "broker-limit", 0, batch_of(19_000), -1, T),
        Ok(0)
    );
    assert_eq!(
        produce_records(&addr, "broker-limit", 0, batch_of(21_000), -1, T),
        Err(MESSAGE_TOO_LARGE)
    );
    assert_eq!(
        produce_records(&addr, "topic-limit", 0, batch_of(1_500), -1, T),
        Ok(0)
    );
    assert_eq!(
        produce_records(&addr, "topic-limit", 0, batch_of(2_500), -1, T),
        Err(MESSAGE_TOO_LARGE)
    );
    // Nothing of a refused batch was appended.
    assert_eq!(
        produce_records(&addr, "topic-limit", 0, batch_of(10), -1, T),
        Ok(1)
    );
}

#[test]
fn default_limit_refuses_a_thirty_megabyte_record() {
    let b = BrokerProc::start(&[]);
    let addr = b.bootstrap();
    assert_eq!(create_topic(&addr, "big", 1, 1, &[]), 0);
    assert_eq!(
        produce_records(
            &addr,
            "big",
            0,
            batch_of(30 << 20),
            -1,
            Duration::from_secs(30)
        ),
        Err(MESSAGE_TOO_LARGE)
    );
    assert_eq!(
        produce_records(&addr, "big", 0, batch_of(1_000_000), -1, T),
        Ok(0)
    );
}

/// Sends one idempotent batch of decimal values with acks=all.
fn send(
    addr: &str,
    topic: &str,
    pid: i64,
    epoch: i16,
    seq: i32,
    values: &[i64],
) -> Result<i64, i16> {
    produce_idempotent(addr, topic, (pid, epoch, seq), values, T)
}

/// [`send`] once the restarted broker leads the partition again (it serves before it leads).
fn send_after_restart(
    addr: &str,
    topic: &str,
    pid: i64,
    seq: i32,
    values: &[i64],
) -> Result<i64, i16> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match send(addr, topic, pid, 0, seq, values) {
            Err(6 | -100) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            other => return other,
        }
    }
}

fn stored_values(addr: &str, topic: &str) -> Vec<i64> {
    read_all(addr, topic, 0)
        .unwrap()
        .0
        .iter()
        .map(|r| r.1)
        .collect()
}

#[test]
fn idempotent_producer_sequences_duplicates_and_epochs() {
    let b = BrokerProc::start(&[]);
    let addr = b.bootstrap();
    assert_eq!(create_topic(&addr, "idem", 1, 1, &[]), 0);
    let (code, pid, epoch) = init_producer_id(&addr, None);
    assert_eq!((code, epoch), (0, 0));
    let (_, other, _) = init_producer_id(&addr, None);
    assert_ne!(pid, other, "two producers got the same id");

    assert_eq!(send(&addr, "idem", pid, 0, 0, &[1, 2, 3]), Ok(0));
    assert_eq!(send(&addr, "idem", pid, 0, 3, &[4]), Ok(3));
    // A retry of either batch is answered with its original offset and not written again.
    assert_eq!(send(&addr, "idem", pid, 0, 0, &[1, 2, 3]), Ok(0));
    assert_eq!(send(&addr, "idem", pid, 0, 3, &[4]), Ok(3));
    // A gap, or a sequence that overlaps without matching a batch, is out of order.
    assert_eq!(
        send(&addr, "idem", pid, 0, 6, &[7]),
        Err(OUT_OF_ORDER_SEQUENCE_NUMBER)
    );
    assert_eq!(
        send(&addr, "idem", pid, 0, 2, &[3, 4]),
        Err(OUT_OF_ORDER_SEQUENCE_NUMBER)
    );
    // A new epoch starts at sequence 0; then the old epoch is fenced.
    assert_eq!(
        send(&addr, "idem", pid, 1, 5, &[6]),
        Err(OUT_OF_ORDER_SEQUENCE_NUMBER)
    );
    assert_eq!(send(&addr, "idem", pid, 1, 0, &[5]), Ok(4));
    assert_eq!(
        send(&addr, "idem", pid, 0, 4, &[6]),
        Err(INVALID_PRODUCER_EPOCH)
    );
    // Another producer has its own sequences.
    assert_eq!(send(&addr, "idem", other, 0, 0, &[100]), Ok(5));
    assert_eq!(stored_values(&addr, "idem"), vec![1, 2, 3, 4, 5, 100]);

    // Transactions fail at once.
    assert_eq!(init_producer_id(&addr, Some("tx-1")).0, INVALID_REQUEST);
}

#[test]
fn producer_state_survives_clean_restart_and_kill_nine() {
    // Small segments: the state is snapshotted at every roll and rebuilt past the snapshot.
    let mut b = BrokerProc::start(&["--override", "log.segment.bytes=16384"]);
    let addr = b.bootstrap();
    assert_eq!(create_topic(&addr, "keep", 1, 1, &[]), 0);
    let (_, pid, _) = init_producer_id(&addr, None);
    let mut seq = 0;
    let mut next_value = 0;
    let mut send_some = |addr: &str, n: usize| {
        for _ in 0..n {
            let values: Vec<i64> = (next_value..next_value + 10).collect();
            send(addr, "keep", pid, 0, seq, &values).unwrap();
            seq += 10;
            next_value += 10;
        }
        (seq, next_value)
    };
    let (s, _) = send_some(&addr, 200);
    let segments = std::fs::read_dir(b.data_dir().join("keep-0"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "snapshot")
        })
        .count();
    assert!(
        segments > 0,
        "no producer snapshot was taken at a segment roll"
    );
    let last_offset = i64::from(s) - 10;
    let last: Vec<i64> = (last_offset..last_offset + 10).collect();

    b.terminate();
    b.restart();
    let addr = b.bootstrap();
    assert_eq!(
        send_after_restart(&addr, "keep", pid, s - 10, &last),
        Ok(last_offset),
        "after a clean restart"
    );
    assert_eq!(
        send(&addr, "keep", pid, 0, s + 10, &[0]),
        Err(OUT_OF_ORDER_SEQUENCE_NUMBER)
    );

    let (s, _) = send_some(&addr, 5);
    b.kill9();
    b.restart();
    let addr = b.bootstrap();
    let last_offset = i64::from(s) - 10;
    let last: Vec<i64> = (last_offset..last_offset + 10).collect();
    assert_eq!(
        send_after_restart(&addr, "keep", pid, s - 10, &last),
        Ok(last_offset),
        "after kill -9"
    );
    assert_eq!(
        send(&addr, "keep", pid, 0, s, &[s as i64]),
        Ok(i64::from(s))
    );
    let stored = stored_values(&addr, "keep");
    assert_eq!(stored, (0..=i64::from(s)).collect::<Vec<_>>());
}
