//! The layouts in `schema` against kafka-protocol itself, for every message and version: frames
//! generated from a layout (random lengths, every field of the version, tagged fields present or
//! not, unknown tags) must be decoded by the crate to their last byte and encoded back to the same
//! bytes, and accepted by the walk, which must also need their last byte. Frames with a count
//! blown up must be refused, or decode without harm.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use tidemark_wirebound::schema::{Field, Message, Ty, REQUESTS, RESPONSES};
use tidemark_wirebound::{check_request, check_response, min_size};

const SAMPLES_PER_VERSION: usize = 300;

struct Gen {
    rng: ChaCha8Rng,
    version: i16,
    flexible: bool,
    /// Whether the frame carries a tag of a field the version does not have.
    elsewhere_tag: bool,
}

impl Gen {
    fn uvarint(out: &mut Vec<u8>, mut v: u32) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn length(&self, out: &mut Vec<u8>, n: usize, width: usize) {
        if self.flexible {
            Self::uvarint(out, n as u32 + 1);
        } else {
            out.extend_from_slice(&(n as i64).to_be_bytes()[8 - width..]);
        }
    }

    /// A value of `ty`. Inside a tagged field every value differs from its default (the crate
    /// leaves default-valued tagged fields out when encoding).
    fn ty(&mut self, out: &mut Vec<u8>, ty: &Ty, tagged: bool) {
        match ty {
            // One byte is a boolean or an INT8: 0 or 1 are valid and encode back the same.
            Ty::Fixed(1) => out.push(if tagged {
                1
            } else {
                self.rng.random_range(0..2)
            }),
            Ty::Fixed(n) => {
                out.push(self.rng.random_range(1..0x7f));
                for _ in 1..*n {
                    out.push(self.rng.random());
                }
            }
            Ty::Str | Ty::Bytes => {
                let n = self.rng.random_range(0..6);
                self.length(out, n, if matches!(ty, Ty::Str) { 2 } else { 4 });
                for _ in 0..n {
                    out.push(self.rng.random_range(b'a'..=b'z'));
                }
            }
            Ty::Array(elem) => {
                let n = self.rng.random_range(usize::from(tagged)..3);
                self.length(out, n, 4);
                for _ in 0..n {
                    self.ty(out, elem, tagged);
                }
            }
            Ty::Struct(fields) => self.fields(out, fields, tagged),
            Ty::NullableStruct(fields) => {
                if !tagged && self.rng.random_bool(0.3) {
                    out.push(0xff);
                } else {
                    out.push(1);
                    self.fields(out, fields, tagged);
                }
            }
        }
    }

    fn fields(&mut self, out: &mut Vec<u8>, fields: &[Field], tagged: bool) {
        let version = self.version;
        for f in fields
            .iter()
            .filter(|f| f.tag.is_none() && f.in_version(version))
        {
            self.ty(out, &f.ty, tagged);
        }
        if !self.flexible {
            return;
        }
        let mut tags: Vec<(u32, Vec<u8>)> = Vec::new();
        for f in fields.iter().filter(|f| f.in_version(version)) {
            if let Some(tag) = f.tag {
                if self.rng.random_bool(0.6) {
                    let mut body = Vec::new();
                    self.ty(&mut body, &f.ty, true);
                    tags.push((tag, body));
                }
            }
        }
        // Tags the crate does not read in this version, kept as unknown (or refused): one of a
        // field of other versions, with a byte more than its value, and one of no field.
        let mut others: Vec<(u32, Vec<u8>)> = Vec::new();
        for f in fields.iter().filter(|f| !f.in_version(version)) {
            if let Some(tag) = f.tag {
                if self.rng.random_bool(0.1) {
                    let mut body = Vec::new();
                    self.ty(&mut body, &f.ty, true);
                    body.push(0);
                    others.push((tag, body));
                    self.elsewhere_tag = true;
                }
            }
        }
        if self.rng.random_bool(0.3) {
            let n = self.rng.random_range(0..4);
            let body = (0..n).map(|_| self.rng.random()).collect();
            others.push((100 + self.rng.random_range(0..50), body));
        }
        others.sort_by_key(|(tag, _)| *tag);
        tags.extend(others);
        Self::uvarint(out, tags.len() as u32);
        for (tag, body) in tags {
            Self::uvarint(out, tag);
            Self::uvarint(out, body.len() as u32);
            out.extend(body);
        }
    }
}

fn round_trip(request: bool, m: &Message, version: i16, frame: &[u8]) -> Result<Vec<u8>, String> {
    let key = ApiKey::try_from(m.key).unwrap();
    let mut buf = Bytes::copy_from_slice(frame);
    let mut out = BytesMut::new();
    if request {
        let decoded = RequestKind::decode(key, &mut buf, version).map_err(|e| format!("{e:#}"))?;
        decoded
            .encode(&mut out, version)
            .map_err(|e| format!("{e:#}"))?;
    } else {
        let decoded = ResponseKind::decode(key, &mut buf, version).map_err(|e| format!("{e:#}"))?;
        decoded
            .encode(&mut out, version)
            .map_err(|e| format!("{e:#}"))?;
    }
    if !buf.is_empty() {
        return Err(format!("{} bytes left undecoded", buf.len()));
    }
    Ok(out.to_vec())
}

fn check(request: bool, m: &Message, version: i16, frame: &[u8]) -> bool {
    if request {
        check_request(m.key, version, frame).is_ok()
    } else {
        check_response(m.key, version, frame).is_ok()
    }
}

fn agree(request: bool, messages: &[Message]) {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for m in messages {
        for version in m.min..=m.max {
            let mut g = Gen {
                rng: ChaCha8Rng::seed_from_u64(rng.random()),
                version,
                flexible: version >= m.flexible,
                elsewhere_tag: false,
            };
            for sample in 0..SAMPLES_PER_VERSION {
                let mut frame = Vec::new();
                g.elsewhere_tag = false;
                g.fields(&mut frame, m.fields, false);
                let what = format!(
                    "{} v{version} {} sample {sample} {frame:02x?}",
                    m.name,
                    if request { "request" } else { "response" }
                );
                assert!(
                    check(request, m, version, &frame),
                    "{what}: refused by the walk"
                );
                let again = match round_trip(request, m, version, &frame) {
                    Ok(again) => again,
                    // The crate refuses tags of fields that exist only in other versions.
                    Err(e) if g.elsewhere_tag && e.contains("is not valid for version") => continue,
                    Err(e) => panic!("{what}: kafka-protocol refuses it: {e}"),
                };
                assert_eq!(
                    again, frame,
                    "{what}: kafka-protocol encodes it differently"
                );
                assert!(
                    frame.is_empty() || !check(request, m, version, &frame[..frame.len() - 1]),
                    "{what}: the walk does not need the last byte"
                );
            }
        }
    }
}

#[test]
fn request_layouts_agree_with_kafka_protocol() {
    agree(true, REQUESTS);
}

#[test]
fn response_layouts_agree_with_kafka_protocol() {
    agree(false, RESPONSES);
}

/// Every array element takes at least one byte in every version that has the array, so a count
/// bounded by the bytes left is bounded by the frame's size.
#[test]
fn every_array_element_takes_at_least_one_byte() {
    fn visit(ty: &Ty, version: i16, flexible: bool, path: &str) {
        match ty {
            Ty::Array(elem) => {
                assert!(
                    min_size(elem, version, flexible) >= 1,
                    "{path} v{version}: elements may be empty"
                );
                visit(elem, version, flexible, path);
            }
            Ty::Struct(fields) | Ty::NullableStruct(fields) => {
                for f in fields.iter().filter(|f| f.in_version(version)) {
                    visit(&f.ty, version, flexible, &format!("{path}.{}", f.name));
                }
            }
            _ => {}
        }
    }
    for m in REQUESTS.iter().chain(RESPONSES) {
        for version in m.min..=m.max {
            let flexible = version >= m.flexible;
            visit(&Ty::Struct(m.fields), version, flexible, m.name);
        }
    }
}

/// Valid frames with one 4-byte window or one byte overwritten by a huge value: the walk refuses
/// them, or the crate decodes them (to success or error) without reserving the claimed space.
#[test]
fn blown_up_counts_are_refused_or_harmless() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut refused = 0;
    for (request, messages) in [(true, REQUESTS), (false, RESPONSES)] {
        for m in messages {
            for version in m.min..=m.max {
                let mut g = Gen {
                    rng: ChaCha8Rng::seed_from_u64(rng.random()),
                    version,
                    flexible: version >= m.flexible,
                    elsewhere_tag: false,
                };
                for _ in 0..100 {
                    let mut frame = Vec::new();
                    g.fields(&mut frame, m.fields, false);
                    if frame.len() < 4 {
                        continue;
                    }
                    let at = rng.random_range(0..frame.len() - 3);
                    if g.flexible {
                        frame[at..at + 4].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
                        frame.insert(at + 4, 0x0f);
                    } else {
                        frame[at..at + 4].copy_from_slice(&i32::MAX.to_be_bytes());
                    }
                    if check(request, m, version, &frame) {
                        let _ = round_trip(request, m, version, &frame);
                    } else {
                        refused += 1;
                    }
                }
            }
        }
    }
    assert!(refused > 0, "no blown-up frame was refused");
}
