//! The v2 record batch header, read at Kafka's fixed byte offsets. The broker treats batches as
//! opaque bytes: it only needs the header to assign offsets, stamp the leader epoch and check the
//! CRC, so it never decompresses a record.

use bytes::BytesMut;

/// Bytes before the first record: the fixed v2 header.
pub const HEADER_LEN: usize = 61;
/// baseOffset and batchLength: the part of the header outside `batchLength`'s count.
pub const LOG_OVERHEAD: usize = 12;
const LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const MAX_TIMESTAMP_AT: usize = 35;
const RECORD_COUNT_AT: usize = 57;
const CONTROL_BIT: i16 = 1 << 5;

/// The header fields the log uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Length of the whole batch in bytes, including the 12-byte log overhead.
    pub size: usize,
    pub leader_epoch: i32,
    pub last_offset_delta: i32,
    pub record_count: i32,
    pub max_timestamp: i64,
    pub is_control: bool,
}

impl BatchHeader {
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }

    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }
}

/// Why bytes are not a valid batch.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch truncated: {have} bytes of {need}")]
    Truncated { have: usize, need: usize },
    #[error("unsupported magic {0} (only record batch v2 is accepted)")]
    Magic(i8),
    #[error("invalid batch length {0}")]
    Length(i32),
    #[error("CRC mismatch: header says {stored:#010x}, content has {actual:#010x}")]
    Crc { stored: u32, actual: u32 },
    #[error("record count {count} does not match last offset delta {delta}")]
    Count { count: i32, delta: i32 },
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// Reads the header at the start of `buf`; `buf` need hold only the header, not the records.
pub fn parse_header(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    if buf.len() < HEADER_LEN {
        return Err(BatchError::Truncated {
            have: buf.len(),
            need: HEADER_LEN,
        });
    }
    let length = be_i32(buf, 8);
    if length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
        return Err(BatchError::Length(length));
    }
    let magic = buf[MAGIC_AT] as i8;
    if magic != 2 {
        return Err(BatchError::Magic(magic));
    }
    let last_offset_delta = be_i32(buf, LAST_OFFSET_DELTA_AT);
    let record_count = be_i32(buf, RECORD_COUNT_AT);
    if last_offset_delta < 0 || record_count < 0 || record_count > last_offset_delta + 1 {
        return Err(BatchError::Count {
            count: record_count,
            delta: last_offset_delta,
        });
    }
    Ok(BatchHeader {
        base_offset: be_i64(buf, 0),
        size: length as usize + LOG_OVERHEAD,
        leader_epoch: be_i32(buf, LEADER_EPOCH_AT),
        last_offset_delta,
        record_count,
        max_timestamp: be_i64(buf, MAX_TIMESTAMP_AT),
        is_control: be_i16(buf, ATTRIBUTES_AT) & CONTROL_BIT != 0,
    })
}

/// Checks the CRC-32C of one whole batch (it covers the attributes through the end).
pub fn verify_crc(batch: &[u8]) -> Result<(), BatchError> {
    let stored = be_i32(batch, CRC_AT) as u32;
    let actual = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    if stored != actual {
        return Err(BatchError::Crc { stored, actual });
    }
    Ok(())
}

/// Splits a buffer of concatenated batches, checking each header and CRC. Every byte must
/// belong to a valid batch: a partial trailing batch is an error here.
pub fn split_batches(buf: &[u8]) -> Result<Vec<(usize, BatchHeader)>, BatchError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let header = parse_header(&buf[pos..])?;
        if pos + header.size > buf.len() {
            return Err(BatchError::Truncated {
                have: buf.len() - pos,
                need: header.size,
            });
        }
        verify_crc(&buf[pos..pos + header.size])?;
        out.push((pos, header));
        pos += header.size;
    }
    Ok(out)
}

/// Rewrites the base offset and leader epoch of the batch at `at`; both lie outside the CRC.
pub fn stamp(buf: &mut BytesMut, at: usize, base_offset: i64, leader_epoch: i32) {
    buf[at..at + 8].copy_from_slice(&base_offset.to_be_bytes());
    buf[at + LEADER_EPOCH_AT..at + LEADER_EPOCH_AT + 4]
        .copy_from_slice(&leader_epoch.to_be_bytes());
}
