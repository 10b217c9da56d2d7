//! The v2 record batch header, read at Kafka's fixed byte offsets. The broker treats batches as
//! opaque bytes: it needs the header to assign offsets, stamp the leader epoch and check the CRC,
//! and walks the records only to count them (decompressing a compressed batch, as Kafka's
//! validation does), so a header cannot claim records the batch does not hold.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::compression::{self, Decompressor};

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
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORD_COUNT_AT: usize = 57;
const TRANSACTIONAL_BIT: i16 = 1 << 4;
const CONTROL_BIT: i16 = 1 << 5;
const COMPRESSION_MASK: i16 = 0x7;

/// Control record type of KIP-1279's barrier (`MIRROR_PID_RESET`): written when a mirror topic
/// fails over, it ends every producer id learned from mirrored batches, since the cluster's own
/// producers may be given the same ids.
pub const MIRROR_PID_RESET: i16 = 7;

/// Bytes after the header that always hold a control record's key: length, attributes,
/// timestamp delta (a varlong), offset delta and key length varints, then version and type.
pub const CONTROL_KEY_SPAN: usize = 5 + 1 + 10 + 5 + 5 + 4;

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
    pub is_transactional: bool,
    /// -1 for a producer that is not idempotent.
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The first record's sequence number, -1 without a producer id.
    pub base_sequence: i32,
    /// A control batch whose record is [`MIRROR_PID_RESET`] (known only when the bytes read
    /// reach its key: every batch split from whole bytes, and [`control_type`] otherwise).
    pub is_pid_reset: bool,
}

impl BatchHeader {
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }

    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }

    /// The last record's sequence number; sequences wrap from `i32::MAX` to 0, as Kafka's do.
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return self.base_sequence;
        }
        ((i64::from(self.base_sequence) + i64::from(self.last_offset_delta))
            % (i64::from(i32::MAX) + 1)) as i32
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
    #[error("header declares {declared} records but the batch holds {found}")]
    Records { declared: i32, found: String },
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
    let is_control = be_i16(buf, ATTRIBUTES_AT) & CONTROL_BIT != 0;
    let is_pid_reset = is_control
        && control_type(&buf[HEADER_LEN..buf.len().min(length as usize + LOG_OVERHEAD)])
            == Some(MIRROR_PID_RESET);
    Ok(BatchHeader {
        base_offset: be_i64(buf, 0),
        size: length as usize + LOG_OVERHEAD,
        leader_epoch: be_i32(buf, LEADER_EPOCH_AT),
        last_offset_delta,
        record_count,
        max_timestamp: be_i64(buf, MAX_TIMESTAMP_AT),
        is_control,
        is_pid_reset,
        is_transactional: be_i16(buf, ATTRIBUTES_AT) & TRANSACTIONAL_BIT != 0,
        producer_id: be_i64(buf, PRODUCER_ID_AT),
        producer_epoch: be_i16(buf, PRODUCER_EPOCH_AT),
        base_sequence: be_i32(buf, BASE_SEQUENCE_AT),
    })
}

/// The type in the key of the first record of a control batch, given the bytes after its header
/// (at least [`CONTROL_KEY_SPAN`] of them, or the whole rest); `None` when they do not hold one.
pub fn control_type(mut records: &[u8]) -> Option<i16> {
    let buf = &mut records;
    read_varint(buf).ok()?;
    if !buf.has_remaining() {
        return None;
    }
    buf.get_i8();
    read_varlong(buf).ok()?;
    read_varint(buf).ok()?;
    let key_len = read_varint(buf).ok()?;
    if key_len < 4 || buf.remaining() < 4 {
        return None;
    }
    buf.get_i16();
    Some(buf.get_i16())
}

/// A `MIRROR_PID_RESET` control batch naming the cluster the topic mirrored from (value:
/// version 0, then the id as a length-prefixed string), for the leader to stamp and append.
pub fn mirror_pid_reset_batch(source_cluster_id: &str, timestamp_ms: i64) -> Vec<u8> {
    let mut key = BytesMut::new();
    key.put_i16(0);
    key.put_i16(MIRROR_PID_RESET);
    let id = &source_cluster_id.as_bytes()[..source_cluster_id.len().min(i16::MAX as usize)];
    let mut value = BytesMut::new();
    value.put_i16(0);
    value.put_i16(id.len() as i16);
    value.put_slice(id);
    single_record_batch(key.freeze(), value.freeze(), true, timestamp_ms)
}

/// One uncompressed record in a v2 batch without a producer, for the broker's own writes (a
/// failover barrier, an LMLE record); the leader stamps its offset and epoch on append.
pub fn single_record_batch(key: Bytes, value: Bytes, control: bool, timestamp_ms: i64) -> Vec<u8> {
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    let record = Record {
        transactional: false,
        control,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: timestamp_ms,
        key: Some(key),
        value: Some(value),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    let opts = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, [&record], &opts)
        .expect("one uncompressed record always encodes");
    buf.to_vec()
}

/// The source cluster a whole `MIRROR_PID_RESET` batch names; `None` for any other batch.
pub fn pid_reset_source(batch: &[u8]) -> Option<String> {
    let h = parse_header(batch).ok()?;
    if !h.is_pid_reset || batch.len() < h.size {
        return None;
    }
    let mut buf = Bytes::copy_from_slice(&batch[..h.size]);
    let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut buf).ok()?;
    let mut value = set.records.first()?.value.clone()?;
    if value.remaining() < 4 {
        return None;
    }
    value.get_i16();
    let len = usize::try_from(value.get_i16()).ok()?;
    (value.remaining() >= len).then(|| String::from_utf8_lossy(&value[..len]).into_owned())
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

/// Counts the records of one whole, CRC-checked batch and checks the header's record count.
pub fn verify_record_count(batch: &[u8], header: &BatchHeader) -> Result<(), BatchError> {
    let attributes = be_i16(batch, ATTRIBUTES_AT);
    let records = &batch[HEADER_LEN..];
    // Uncompressed records are walked in place: the decompressors take `Bytes`, and copying
    // every produced batch into one cost far more than the walk itself.
    let compressed = || Bytes::copy_from_slice(records);
    let counted = match attributes & COMPRESSION_MASK {
        0 => count_records(&mut &records[..]),
        1 => compression::Gzip::decompress(&mut compressed(), count_records),
        2 => compression::Snappy::decompress(&mut compressed(), count_records),
        3 => compression::Lz4::decompress(&mut compressed(), count_records),
        4 => compression::Zstd::decompress(&mut compressed(), count_records),
        other => Err(anyhow::anyhow!("unknown compression type {other}")),
    };
    match counted {
        Ok(n) if n == i64::from(header.record_count) => Ok(()),
        Ok(n) => Err(BatchError::Records {
            declared: header.record_count,
            found: n.to_string(),
        }),
        Err(e) => Err(BatchError::Records {
            declared: header.record_count,
            found: format!("unreadable records ({e:#})"),
        }),
    }
}

/// Walks length-prefixed records (a zigzag varint length, then that many bytes) to the end.
fn count_records<B: Buf>(buf: &mut B) -> anyhow::Result<i64> {
    let mut n = 0i64;
    while buf.has_remaining() {
        let len = read_varint(buf)?;
        let len = usize::try_from(len)
            .map_err(|_| anyhow::anyhow!("record {n} has negative length {len}"))?;
        if len > buf.remaining() {
            anyhow::bail!("record {n} needs {len} bytes, {} remain", buf.remaining());
        }
        buf.advance(len);
        n += 1;
    }
    Ok(n)
}

/// Kafka's signed varint: zigzag-encoded, 7 bits per byte, at most 5 bytes.
fn read_varint<B: Buf>(buf: &mut B) -> anyhow::Result<i32> {
    read_zigzag(buf, 5).map(|v| v as i32)
}

/// Kafka's signed varlong: the same encoding in at most 10 bytes.
fn read_varlong<B: Buf>(buf: &mut B) -> anyhow::Result<i64> {
    read_zigzag(buf, 10)
}

fn read_zigzag<B: Buf>(buf: &mut B, max_bytes: u32) -> anyhow::Result<i64> {
    let mut raw = 0u64;
    for i in 0..max_bytes {
        if !buf.has_remaining() {
            anyhow::bail!("varint is cut off");
        }
        let b = buf.get_u8();
        raw |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let v = (raw >> 1) as i64 ^ -((raw & 1) as i64);
            // A 5-byte varint's value is 32 bits wide: sign-extend from there.
            return Ok(if max_bytes == 5 {
                i64::from(v as i32)
            } else {
                v
            });
        }
    }
    anyhow::bail!("varint is longer than {max_bytes} bytes")
}

/// Splits a buffer of concatenated batches, checking each header, CRC and record count. Every byte must
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
        verify_record_count(&buf[pos..pos + header.size], &header)?;
        out.push((pos, header));
        pos += header.size;
    }
    Ok(out)
}

/// The bytes a batch's stamped copy starts with: its first `STAMPED_PREFIX` bytes with the base
/// offset and leader epoch rewritten (both lie outside the CRC). The rest of the batch is kept as
/// the producer sent it, so a leader's append writes the two without copying the batch.
pub fn stamped_prefix(batch: &[u8], base_offset: i64, leader_epoch: i32) -> [u8; STAMPED_PREFIX] {
    let mut prefix = [0u8; STAMPED_PREFIX];
    prefix.copy_from_slice(&batch[..STAMPED_PREFIX]);
    prefix[..8].copy_from_slice(&base_offset.to_be_bytes());
    prefix[LEADER_EPOCH_AT..LEADER_EPOCH_AT + 4].copy_from_slice(&leader_epoch.to_be_bytes());
    prefix
}

/// The bytes of a batch's header up to (not including) the magic byte: base offset, length and
/// leader epoch.
pub const STAMPED_PREFIX: usize = MAGIC_AT;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::log::testing::batch;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    /// Rewrites the header's record count (and last offset delta to match) and recomputes the
    /// CRC, as a lying producer would.
    pub(crate) fn with_count(mut b: Vec<u8>, count: i32) -> Vec<u8> {
        b[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&count.to_be_bytes());
        b[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4]
            .copy_from_slice(&(count - 1).to_be_bytes());
        let crc = crc32c::crc32c(&b[ATTRIBUTES_AT..]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn gzip_batch(n: usize) -> Vec<u8> {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: i as i32 - 1,
                timestamp: 1_700_000_000_000,
                key: None,
                value: Some(Bytes::from(format!("v{i}"))),
                headers: IndexMap::new(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let opts = RecordEncodeOptions {
            version: 2,
            compression: Compression::Gzip,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &opts).unwrap();
        buf.to_vec()
    }

    #[test]
    fn record_count_must_match_the_records() {
        let good = batch(&[b"a", b"b", b"c"]);
        assert!(split_batches(&good).is_ok());
        // Fewer declared than held, and more.
        for lie in [1, 2, 4, 9] {
            let err = split_batches(&with_count(good.clone(), lie)).unwrap_err();
            assert_eq!(
                err,
                BatchError::Records {
                    declared: lie,
                    found: "3".into()
                }
            );
        }
        let zipped = gzip_batch(4);
        assert!(split_batches(&zipped).is_ok());
        assert!(matches!(
            split_batches(&with_count(zipped, 3)),
            Err(BatchError::Records { declared: 3, .. })
        ));
    }

    #[test]
    fn a_pid_reset_barrier_is_known_by_its_key_from_its_first_bytes() {
        let barrier = mirror_pid_reset_batch("cluster-a", 1_700_000_000_000);
        let (_, h) = split_batches(&barrier).unwrap()[0];
        assert!(h.is_control && h.is_pid_reset);
        assert_eq!((h.producer_id, h.record_count), (-1, 1));
        assert_eq!(pid_reset_source(&barrier).as_deref(), Some("cluster-a"));
        // A header read with just the span after it, as a segment scan reads it.
        let span = &barrier[..HEADER_LEN + CONTROL_KEY_SPAN.min(barrier.len() - HEADER_LEN)];
        assert!(parse_header(span).unwrap().is_pid_reset);
        assert!(!parse_header(&barrier[..HEADER_LEN]).unwrap().is_pid_reset);
        // A control record cut anywhere reads as no type until its key is whole, never panics.
        let types: Vec<Option<i16>> = (0..=barrier.len() - HEADER_LEN)
            .map(|cut| control_type(&barrier[HEADER_LEN..HEADER_LEN + cut]))
            .collect();
        let whole = types.iter().position(Option::is_some).unwrap();
        assert!(whole > 4, "{types:?}");
        assert!(types[whole..].iter().all(|t| *t == Some(MIRROR_PID_RESET)));
        let data = batch(&[b"a"]);
        assert!(!parse_header(&data).unwrap().is_pid_reset);
        assert_eq!(pid_reset_source(&data), None);
    }

    #[test]
    fn varints_decode_as_kafka_writes_them() {
        for (bytes, want) in [
            (&[0x00][..], 0),
            (&[0x01][..], -1),
            (&[0x02][..], 1),
            (&[0xac, 0x02][..], 150),
            (&[0xff, 0xff, 0xff, 0xff, 0x0f][..], i32::MIN),
        ] {
            assert_eq!(read_varint(&mut &bytes[..]).unwrap(), want, "{bytes:?}");
        }
        assert!(read_varint(&mut &[0x80u8][..]).is_err());
    }
}
