//! Bounds on the element counts of Kafka frames, checked before kafka-protocol decodes them.
//!
//! kafka-protocol (0.18) reserves room for every array from the count the frame claims before it
//! reads a single element, and does the same for the records of a batch and the headers of a
//! record. A 16-byte frame claiming 2^31 entries makes it ask for tens of gigabytes, and a
//! refused allocation aborts the process. The broker (decoding requests) and the harness
//! (decoding responses of a broker under test) both run every frame through this crate first:
//! it walks the frame with the message's layout ([`schema`]) and rejects any count whose
//! elements, each at least as large as the smallest encoding of one, cannot fit in the bytes
//! left. It allocates nothing while walking, so it is safe on any input. It reads the same
//! positions the decoder will and walks the whole frame before accepting it, so in a frame it
//! accepts every array holds as many elements as it claims: the decoder reserves room only for
//! elements that are really there.

pub mod schema;

use std::fmt;

use schema::{Field, Message, Ty};

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundError {
    /// What was being checked, e.g. `Metadata v12 request`.
    pub context: String,
    /// The field, e.g. `topics[0].partitions`; empty for the message itself.
    pub field: String,
    /// The byte offset in the checked buffer where the offending value starts.
    pub offset: usize,
    /// What was wrong.
    pub problem: String,
}

impl fmt::Display for BoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.context)?;
        } else {
            write!(f, "{}, field {}", self.context, self.field)?;
        }
        write!(f, ", byte {}: {}", self.offset, self.problem)
    }
}

impl std::error::Error for BoundError {}

/// Checks the body of a request (the bytes after its header).
pub fn check_request(api_key: i16, version: i16, body: &[u8]) -> Result<(), BoundError> {
    check(schema::REQUESTS, "request", api_key, version, body)
}

/// Checks the body of a response (the bytes after its header).
pub fn check_response(api_key: i16, version: i16, body: &[u8]) -> Result<(), BoundError> {
    check(schema::RESPONSES, "response", api_key, version, body)
}

/// The request layout for an API, when this crate knows it.
pub fn request_layout(api_key: i16) -> Option<&'static Message> {
    schema::REQUESTS.iter().find(|m| m.key == api_key)
}

/// The response layout for an API, when this crate knows it.
pub fn response_layout(api_key: i16) -> Option<&'static Message> {
    schema::RESPONSES.iter().find(|m| m.key == api_key)
}

fn check(
    messages: &[Message],
    direction: &str,
    api_key: i16,
    version: i16,
    body: &[u8],
) -> Result<(), BoundError> {
    let known = messages.iter().find(|m| m.key == api_key);
    let Some(message) = known.filter(|m| (m.min..=m.max).contains(&version)) else {
        return Err(BoundError {
            context: format!("API key {api_key} v{version} {direction}"),
            field: String::new(),
            offset: 0,
            problem: "no known layout, so its counts cannot be checked".into(),
        });
    };
    let mut walk = Walk {
        buf: body,
        pos: 0,
        version,
        flexible: version >= message.flexible,
    };
    walk.fields(message.fields).map_err(|fail| BoundError {
        context: format!("{} v{version} {direction}", message.name),
        field: fail.field(),
        offset: fail.offset,
        problem: fail.problem,
    })
}

/// Smallest encoding of one record: length, attributes, timestamp delta, offset delta, key
/// length, value length and header count, one byte each.
const MIN_RECORD: usize = 7;
/// Smallest encoding of one record header: key length and value length.
const MIN_HEADER: usize = 2;

/// Checks the records of one v2 batch (decompressed) against the count its header claims,
/// including every record's header count against that record's length.
pub fn check_records(record_count: i32, records: &[u8]) -> Result<(), BoundError> {
    let fail = |fail: Fail| BoundError {
        context: format!("record batch of {record_count} records"),
        field: fail.field(),
        offset: fail.offset,
        problem: fail.problem,
    };
    let mut walk = Walk {
        buf: records,
        pos: 0,
        version: 0,
        flexible: false,
    };
    let count = u64::try_from(record_count).map_err(|_| {
        fail(Fail::new(
            0,
            format!("negative record count {record_count}"),
        ))
    })?;
    walk.bound(count, MIN_RECORD).map_err(fail)?;
    for i in 0..count {
        walk.record()
            .map_err(|f| fail(f.within(format!("[{i}]"))))?;
    }
    Ok(())
}

/// Where a walk failed; `path` is innermost first.
struct Fail {
    offset: usize,
    problem: String,
    path: Vec<String>,
}

impl Fail {
    fn new(offset: usize, problem: String) -> Self {
        Fail {
            offset,
            problem,
            path: Vec::new(),
        }
    }

    fn within(mut self, segment: String) -> Self {
        self.path.push(segment);
        self
    }

    fn field(&self) -> String {
        let mut out = String::new();
        for segment in self.path.iter().rev() {
            if !out.is_empty() && !segment.starts_with('[') {
                out.push('.');
            }
            out.push_str(segment);
        }
        out
    }
}

/// A read position in a frame; reads fail at the end rather than past it.
struct Walk<'a> {
    buf: &'a [u8],
    pos: usize,
    version: i16,
    flexible: bool,
}

impl<'a> Walk<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Fail> {
        if n > self.left() {
            return Err(Fail::new(
                self.pos,
                format!("needs {n} bytes, {} left", self.left()),
            ));
        }
        let buf = self.buf;
        let out = &buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn skip(&mut self, n: usize) -> Result<(), Fail> {
        self.take(n).map(|_| ())
    }

    fn int(&mut self, width: usize) -> Result<i64, Fail> {
        let bytes = self.take(width)?;
        let mut value = if bytes[0] & 0x80 != 0 { -1i64 } else { 0 };
        for b in bytes {
            value = (value << 8) | i64::from(*b);
        }
        Ok(value)
    }

    /// An unsigned varint as kafka-protocol reads it: at most five bytes, higher bits dropped.
    fn uvarint(&mut self) -> Result<u32, Fail> {
        let mut value = 0u32;
        for i in 0..5 {
            let b = u32::from(self.take(1)?[0]);
            value |= (b & 0x7f) << (i * 7);
            if b < 0x80 {
                break;
            }
        }
        Ok(value)
    }

    /// A zigzag varint (records).
    fn varint(&mut self) -> Result<i32, Fail> {
        let zigzag = self.uvarint()?;
        Ok(((zigzag >> 1) as i32) ^ -((zigzag & 1) as i32))
    }

    /// A zigzag varlong (records): at most ten bytes.
    fn varlong(&mut self) -> Result<(), Fail> {
        for _ in 0..10 {
            if self.take(1)?[0] < 0x80 {
                break;
            }
        }
        Ok(())
    }

    /// A length or count: `None` for null. `width` is that of the non-compact form.
    fn length(&mut self, width: usize) -> Result<Option<u64>, Fail> {
        let at = self.pos;
        if self.flexible {
            return Ok(self.uvarint()?.checked_sub(1).map(u64::from));
        }
        match self.int(width)? {
            -1 => Ok(None),
            n if n < 0 => Err(Fail::new(at, format!("negative length {n}"))),
            n => Ok(Some(n as u64)),
        }
    }

    /// Fails unless `count` elements of at least `min_each` bytes fit in what is left.
    fn bound(&self, count: u64, min_each: usize) -> Result<(), Fail> {
        let need = count.saturating_mul(min_each.max(1) as u64);
        if need > self.left() as u64 {
            return Err(Fail::new(
                self.pos,
                format!(
                    "{count} elements of at least {} bytes each need {need} bytes, {} left",
                    min_each.max(1),
                    self.left()
                ),
            ));
        }
        Ok(())
    }

    fn ty(&mut self, ty: &Ty) -> Result<(), Fail> {
        match ty {
            Ty::Fixed(n) => self.skip(*n),
            Ty::Str => match self.length(2)? {
                Some(n) => self.skip_len(n),
                None => Ok(()),
            },
            Ty::Bytes => match self.length(4)? {
                Some(n) => self.skip_len(n),
                None => Ok(()),
            },
            Ty::Array(elem) => {
                let at = self.pos;
                let Some(count) = self.length(4)? else {
                    return Ok(());
                };
                let min_each = min_size(elem, self.version, self.flexible);
                self.bound(count, min_each).map_err(|mut f| {
                    f.offset = at;
                    f
                })?;
                for i in 0..count {
                    self.ty(elem).map_err(|f| f.within(format!("[{i}]")))?;
                }
                Ok(())
            }
            Ty::Struct(fields) => self.fields(fields),
            Ty::NullableStruct(fields) => match self.take(1)?[0] as i8 {
                -1 => Ok(()),
                _ => self.fields(fields),
            },
        }
    }

    fn skip_len(&mut self, n: u64) -> Result<(), Fail> {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        self.skip(n)
    }

    fn fields(&mut self, fields: &[Field]) -> Result<(), Fail> {
        let version = self.version;
        for field in fields
            .iter()
            .filter(|f| f.tag.is_none() && f.in_version(version))
        {
            self.ty(&field.ty)
                .map_err(|f| f.within(field.name.to_string()))?;
        }
        if self.flexible {
            self.tagged(fields)?;
        }
        Ok(())
    }

    /// The tagged-field section: known tags are read in place (as the decoder does, whatever
    /// size they declare) and must fill exactly that size; unknown ones are skipped.
    fn tagged(&mut self, fields: &[Field]) -> Result<(), Fail> {
        let at = self.pos;
        let count = self.uvarint()?;
        self.bound(u64::from(count), 2)
            .map_err(|f| Fail::new(at, f.problem).within("tagged fields".to_string()))?;
        let version = self.version;
        for _ in 0..count {
            let tag = self.uvarint()?;
            let size = self.uvarint()? as usize;
            let known = fields
                .iter()
                .find(|f| f.tag == Some(tag) && f.in_version(version));
            match known {
                Some(field) => {
                    let start = self.pos;
                    self.ty(&field.ty)
                        .map_err(|f| f.within(field.name.to_string()))?;
                    if self.pos - start != size {
                        return Err(Fail::new(
                            start,
                            format!(
                                "tagged field {tag} declares {size} bytes but holds {}",
                                self.pos - start
                            ),
                        )
                        .within(field.name.to_string()));
                    }
                }
                None => self.skip(size)?,
            }
        }
        Ok(())
    }

    /// One record of a v2 batch; the walk stays within its declared length.
    fn record(&mut self) -> Result<(), Fail> {
        let at = self.pos;
        let length = self.varint()?;
        let length = usize::try_from(length)
            .map_err(|_| Fail::new(at, format!("negative record length {length}")))?;
        let start = self.pos;
        let body = self.take(length)?;
        let mut r = Walk {
            buf: body,
            pos: 0,
            version: 0,
            flexible: false,
        };
        let shift = |mut f: Fail| {
            f.offset += start;
            f
        };
        r.skip(1).map_err(shift)?;
        r.varlong().map_err(shift)?;
        r.varint().map_err(shift)?;
        for part in ["key", "value"] {
            r.record_bytes(-1)
                .map_err(|f| shift(f).within(part.into()))?;
        }
        let at = r.pos;
        let headers = r.varint().map_err(shift)?;
        let headers = u64::try_from(headers)
            .map_err(|_| shift(Fail::new(at, format!("negative header count {headers}"))))?;
        r.bound(headers, MIN_HEADER)
            .map_err(|f| shift(f).within("headers".into()))?;
        for i in 0..headers {
            let header = |f: Fail| shift(f).within(format!("[{i}]")).within("headers".into());
            r.record_bytes(0)
                .map_err(|f| header(f.within("key".into())))?;
            r.record_bytes(-1)
                .map_err(|f| header(f.within("value".into())))?;
        }
        Ok(())
    }

    /// A varint-length byte string of a record; lengths below `min_len` are refused.
    fn record_bytes(&mut self, min_len: i32) -> Result<(), Fail> {
        let at = self.pos;
        let len = self.varint()?;
        if len < min_len {
            return Err(Fail::new(at, format!("negative length {len}")));
        }
        match usize::try_from(len) {
            Ok(n) => self.skip(n),
            // -1: null.
            Err(_) => Ok(()),
        }
    }
}

/// The fewest bytes one value of `ty` takes in `version`.
pub fn min_size(ty: &Ty, version: i16, flexible: bool) -> usize {
    let length = |wide: usize| if flexible { 1 } else { wide };
    match ty {
        Ty::Fixed(n) => *n,
        Ty::Str => length(2),
        Ty::Bytes | Ty::Array(_) => length(4),
        Ty::Struct(fields) => {
            let own: usize = fields
                .iter()
                .filter(|f| f.tag.is_none() && f.in_version(version))
                .map(|f| min_size(&f.ty, version, flexible))
                .sum();
            own + usize::from(flexible)
        }
        Ty::NullableStruct(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_request_claiming_2_pow_31_topics_is_refused_before_reading_one() {
        let body = i32::MAX.to_be_bytes();
        let err = check_request(3, 4, &body).unwrap_err();
        assert_eq!(err.context, "Metadata v4 request");
        assert_eq!(err.field, "topics");
        assert_eq!(err.offset, 0);
        assert!(err.problem.contains("2147483647 elements"), "{err}");
    }

    #[test]
    fn a_compact_count_is_bounded_too() {
        // Metadata v12: compact topics count 2^32 - 1 (so 2^32 - 2 entries).
        let body = [0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0];
        let err = check_request(3, 12, &body).unwrap_err();
        assert_eq!(err.field, "topics");
        assert!(err.problem.contains("4294967294 elements"), "{err}");
    }

    #[test]
    fn counts_that_fit_pass_and_null_arrays_are_fine() {
        // Metadata v4: null topics, allow_auto_topic_creation.
        let mut body = (-1i32).to_be_bytes().to_vec();
        body.push(1);
        check_request(3, 4, &body).unwrap();
        // Metadata v1: one topic named "a".
        let mut body = 1i32.to_be_bytes().to_vec();
        body.extend_from_slice(&1i16.to_be_bytes());
        body.push(b'a');
        check_request(3, 1, &body).unwrap();
    }

    #[test]
    fn a_nested_count_names_its_path() {
        // Metadata v1 response: no brokers, a controller, one topic whose one partition's
        // replica list claims a million entries.
        let mut b = Vec::new();
        b.extend_from_slice(&0i32.to_be_bytes()); // brokers
        b.extend_from_slice(&1i32.to_be_bytes()); // controller_id
        b.extend_from_slice(&1i32.to_be_bytes()); // topics: 1
        b.extend_from_slice(&0i16.to_be_bytes()); // error_code
        b.extend_from_slice(&1i16.to_be_bytes()); // name "t"
        b.push(b't');
        b.push(0); // is_internal
        b.extend_from_slice(&1i32.to_be_bytes()); // partitions: 1
        b.extend_from_slice(&0i16.to_be_bytes()); // error_code
        b.extend_from_slice(&0i32.to_be_bytes()); // partition_index
        b.extend_from_slice(&0i32.to_be_bytes()); // leader_id
        b.extend_from_slice(&1_000_000i32.to_be_bytes()); // replica_nodes
        b.extend_from_slice(&0i32.to_be_bytes()); // isr_nodes
        let err = check_response(3, 1, &b).unwrap_err();
        assert_eq!(err.field, "topics[0].partitions[0].replica_nodes");
        assert_eq!(err.offset, 32);
        assert!(err.problem.contains("at least 4 bytes"), "{err}");
    }

    #[test]
    fn a_known_tagged_field_must_fill_the_size_it_declares() {
        // ApiVersions v3 response: error 0, no api keys, throttle 0, one tagged field:
        // finalized_features_epoch (tag 1, an INT64) declaring 2 bytes.
        let mut b = vec![0, 0, 1, 0, 0, 0, 0, 1, 1, 2];
        b.extend_from_slice(&7i64.to_be_bytes());
        let err = check_response(18, 3, &b).unwrap_err();
        assert_eq!(err.field, "finalized_features_epoch");
        assert!(
            err.problem.contains("declares 2 bytes but holds 8"),
            "{err}"
        );
    }

    #[test]
    fn unknown_apis_and_versions_are_refused() {
        assert!(check_request(3, 14, &[]).is_err());
        assert!(check_request(99, 0, &[]).is_err());
        assert!(check_response(2, 4, &[]).is_err());
    }

    #[test]
    fn record_counts_and_header_counts_are_bounded() {
        // One record: length 7, attributes, ts delta 0, offset delta 0, key null (-1 → 1),
        // value "x" (len 1 → 2), no headers.
        let one = [14u8, 0, 0, 0, 1, 2, b'x', 0];
        check_records(1, &one).unwrap();
        let err = check_records(i32::MAX, &one).unwrap_err();
        assert!(err.problem.contains("2147483647 elements"), "{err}");
        assert!(check_records(-1, &one).is_err());
        // The same record claiming 2^30 headers.
        let hostile = [22u8, 0, 0, 0, 1, 2, b'x', 0x80, 0x80, 0x80, 0x80, 0x08];
        let err = check_records(1, &hostile).unwrap_err();
        assert_eq!(err.field, "[0].headers");
        assert!(err.problem.contains("1073741824 elements"), "{err}");
    }
}
