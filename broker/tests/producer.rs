//! The producer side of the broker against a real broker process: batch size limits
//! (`message.max.bytes`, `max.message.bytes`) and the idempotent producer (InitProducerId,
//! sequence checks, duplicates answered with the original offset, state kept across restarts).

mod common;

use std::time::Duration;

use common::client::{create_topic, produce_records};
use common::BrokerProc;

const MESSAGE_TOO_LARGE: i16 = 10;
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
