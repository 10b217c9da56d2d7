//! A response encoded as a list of chunks instead of one buffer: the record sets a fetch response
//! carries are kept by reference (the buffers they were read into from the log) rather than
//! copied into the encoded response, and the chunks go out in one vectored write. At acks=all
//! every record is fetched twice (by each follower), so that copy was paid on every record the
//! leader acknowledged.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;

/// Slices shorter than this are copied even when they are one of the shared record sets: a
/// chunk of its own costs an iovec and a reference count.
const SHARE_AT_LEAST: usize = 512;

/// The encoder's buffer. Fields are encoded into `current`; a slice the encoder puts that is one
/// of `shared` (same address and length, as the encoder hands over a `Bytes` field's contents)
/// ends the current chunk and becomes a chunk of its own, without a copy.
pub struct ResponseChunks {
    done: Vec<Bytes>,
    done_len: usize,
    current: BytesMut,
    shared: Vec<Bytes>,
}

impl ResponseChunks {
    /// A buffer that will keep each of `shared` by reference when the encoder puts it whole.
    pub fn new(shared: Vec<Bytes>) -> ResponseChunks {
        ResponseChunks {
            done: Vec::new(),
            done_len: 0,
            current: BytesMut::with_capacity(4096),
            shared,
        }
    }

    /// The encoded response.
    pub fn finish(mut self) -> Response {
        self.end_chunk();
        Response {
            chunks: self.done.into(),
        }
    }

    fn end_chunk(&mut self) {
        if !self.current.is_empty() {
            let chunk = self.current.split().freeze();
            self.done_len += chunk.len();
            self.done.push(chunk);
        }
    }

    fn shared_slice(&self, src: &[u8]) -> Option<Bytes> {
        if src.len() < SHARE_AT_LEAST {
            return None;
        }
        self.shared
            .iter()
            .find(|b| b.as_ptr() == src.as_ptr() && b.len() == src.len())
            .cloned()
    }
}

// `BufMut` is an unsafe trait, so this is the broker's one `unsafe` item: every method hands over
// to `current`'s, whose contract is the one required here.
#[allow(unsafe_code)]
unsafe impl BufMut for ResponseChunks {
    fn remaining_mut(&self) -> usize {
        self.current.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialised `cnt` bytes of `current`'s chunk, as `BufMut` requires.
        unsafe { self.current.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.current.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        match self.shared_slice(src) {
            Some(shared) => {
                self.end_chunk();
                self.done_len += shared.len();
                self.done.push(shared);
            }
            None => self.current.extend_from_slice(src),
        }
    }
}

/// Offsets count from the start of the response; gaps (which only record batch encoding uses,
/// never a response's fields) must lie in the current chunk.
impl ByteBufMut for ResponseChunks {
    fn offset(&self) -> usize {
        self.done_len + self.current.len()
    }

    fn seek(&mut self, offset: usize) {
        let local = offset
            .checked_sub(self.done_len)
            .expect("a response is never rewound past a finished chunk");
        self.current.resize(local, 0);
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        let start = r
            .start
            .checked_sub(self.done_len)
            .expect("a response's gap lies in its current chunk");
        &mut self.current[start..r.end - self.done_len]
    }
}

/// An encoded response: its chunks in order, read as one buffer.
#[derive(Debug, Default)]
pub struct Response {
    chunks: VecDeque<Bytes>,
}

impl Response {
    /// The response as its size prefix (Kafka's framing) followed by its chunks.
    pub fn framed(mut self) -> anyhow::Result<Response> {
        let len = u32::try_from(self.remaining())?;
        self.chunks
            .push_front(Bytes::copy_from_slice(&len.to_be_bytes()));
        Ok(self)
    }
}

impl From<Bytes> for Response {
    fn from(b: Bytes) -> Response {
        Response {
            chunks: VecDeque::from([b]),
        }
    }
}

impl Buf for Response {
    fn remaining(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |c| &c[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let front = self
                .chunks
                .front_mut()
                .expect("advanced past the end of a response");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.chunks.pop_front();
        }
        while self.chunks.front().is_some_and(Bytes::is_empty) {
            self.chunks.pop_front();
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, chunk) in dst
            .iter_mut()
            .zip(self.chunks.iter().filter(|c| !c.is_empty()))
        {
            *slot = IoSlice::new(chunk);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{FetchResponse, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn bytes_of(mut r: Response) -> Bytes {
        r.copy_to_bytes(r.remaining())
    }

    fn fetch_response(records: &[Bytes]) -> FetchResponse {
        FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(
                records
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        PartitionData::default()
                            .with_partition_index(i as i32)
                            .with_high_watermark(7)
                            .with_records(Some(r.clone()))
                    })
                    .collect(),
            )])
    }

    #[test]
    fn a_fetch_response_encodes_as_one_buffer_does_and_keeps_its_records_by_reference() {
        let records: Vec<Bytes> = (0..3u8)
            .map(|i| Bytes::from(vec![i; 1000 + i as usize]))
            .collect();
        for version in [4, 11, 12, 13, 16] {
            let resp = fetch_response(&records);
            let mut whole = BytesMut::new();
            resp.encode(&mut whole, version).unwrap();
            let mut chunks = ResponseChunks::new(records.clone());
            resp.encode(&mut chunks, version).unwrap();
            let out = chunks.finish();
            for r in &records {
                assert!(
                    out.chunks.iter().any(|c| c.as_ptr() == r.as_ptr()),
                    "v{version}: a record set was copied"
                );
            }
            assert_eq!(bytes_of(out), whole.freeze(), "v{version}");
        }
    }

    #[test]
    fn small_or_unregistered_slices_are_copied() {
        let small = Bytes::from(vec![1u8; 10]);
        let big = Bytes::from(vec![2u8; 4000]);
        let mut chunks = ResponseChunks::new(vec![small.clone()]);
        chunks.put_slice(&small);
        chunks.put_slice(&big);
        let out = chunks.finish();
        assert_eq!(out.chunks.len(), 1);
        assert_eq!(out.remaining(), 4010);
    }

    #[test]
    fn a_framed_response_reads_back_through_partial_advances_and_vectored_chunks() {
        let shared = Bytes::from(vec![9u8; 600]);
        let mut chunks = ResponseChunks::new(vec![shared.clone()]);
        chunks.put_slice(b"head");
        chunks.put_slice(&shared);
        chunks.put_slice(b"tail");
        let mut out = chunks.finish().framed().unwrap();
        assert_eq!(out.remaining(), 4 + 608);
        let mut slices = [IoSlice::new(&[]); 8];
        assert_eq!(out.chunks_vectored(&mut slices), 4);
        let mut read = Vec::new();
        while out.has_remaining() {
            let step = out.chunk().len().min(3);
            read.extend_from_slice(&out.chunk()[..step]);
            out.advance(step);
        }
        let mut want = 608u32.to_be_bytes().to_vec();
        want.extend_from_slice(b"head");
        want.extend_from_slice(&shared);
        want.extend_from_slice(b"tail");
        assert_eq!(read, want);
    }
}
