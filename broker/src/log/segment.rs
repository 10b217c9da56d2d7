//! One segment: a file of concatenated batches named by its base offset, plus its index. Reading
//! uses positioned reads so fetches never disturb the append position.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::batch::{self, BatchHeader, HEADER_LEN};
use super::index::OffsetIndex;
use super::LogError;

/// `00000000000000000042.log` for base offset 42.
pub fn file_name(base_offset: i64, ext: &str) -> String {
    format!("{base_offset:020}.{ext}")
}

#[derive(Debug)]
pub struct Segment {
    pub base_offset: i64,
    log_path: PathBuf,
    file: File,
    size: u64,
    index: OffsetIndex,
    /// Offset after the last batch in this segment (`base_offset` when empty).
    next_offset: i64,
    /// The largest batch max timestamp in the segment, -1 when empty: time retention judges a
    /// segment by its newest record, as Kafka's `largestTimestamp` does.
    max_timestamp: i64,
}

/// A segment no longer appended to, to be fsynced away from the append path: its own handles on
/// the segment's files, so the flush needs no access to the log (and a segment deleted meanwhile
/// is flushed harmlessly).
pub struct RolledSegment {
    log: (File, PathBuf),
    index: (File, PathBuf),
}

impl RolledSegment {
    pub fn flush(self) {
        for (file, path) in [self.log, self.index] {
            crate::durable::sync_or_halt(&file, &path, true);
        }
    }
}

/// What a CRC scan of a segment found.
pub struct ScanOutcome {
    /// Bytes of valid batches from the start of the file.
    pub valid_bytes: u64,
    pub next_offset: i64,
    /// The largest max timestamp of the valid batches, -1 when there are none.
    pub max_timestamp: i64,
    /// Why the scan stopped before the end of the file, if it did.
    pub stopped: Option<String>,
}

impl Segment {
    pub fn create(dir: &Path, base_offset: i64) -> Result<Self, LogError> {
        let log_path = dir.join(file_name(base_offset, "log"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&log_path)
            .map_err(|e| LogError::io(&log_path, e))?;
        let index = OffsetIndex::create(&dir.join(file_name(base_offset, "index")), base_offset)?;
        super::sync_dir(dir).map_err(|e| LogError::io(dir, e))?;
        Ok(Segment {
            base_offset,
            log_path,
            file,
            size: 0,
            index,
            next_offset: base_offset,
            max_timestamp: -1,
        })
    }

    /// Opens an existing segment. With `verify`, every batch is CRC-checked and a torn or corrupt
    /// tail is cut off; otherwise only headers are walked to find the end offset.
    pub fn open(
        dir: &Path,
        base_offset: i64,
        verify: bool,
    ) -> Result<(Self, Option<String>), LogError> {
        let log_path = dir.join(file_name(base_offset, "log"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log_path)
            .map_err(|e| LogError::io(&log_path, e))?;
        let size = file
            .metadata()
            .map_err(|e| LogError::io(&log_path, e))?
            .len();
        let scan =
            scan(&file, base_offset, size, verify).map_err(|e| LogError::io(&log_path, e))?;
        let mut cut = None;
        if scan.valid_bytes < size {
            file.set_len(scan.valid_bytes)
                .map_err(|e| LogError::io(&log_path, e))?;
            crate::durable::sync_or_halt(&file, &log_path, true);
            cut = Some(format!(
                "cut {} bytes at position {} of {}: {}",
                size - scan.valid_bytes,
                scan.valid_bytes,
                log_path.display(),
                scan.stopped.unwrap_or_else(|| "torn tail".to_string())
            ));
        }
        let index_path = dir.join(file_name(base_offset, "index"));
        let index =
            match (cut.is_none() && !verify)
                .then(|| OffsetIndex::load(&index_path, base_offset, scan.valid_bytes))
                .transpose()?
                .flatten()
            {
                Some(index) => index,
                None => rebuild_index(&file, &index_path, base_offset, scan.valid_bytes).map_err(
                    |e| match e {
                        RebuildError::Io(e) => LogError::io(&log_path, e),
                        RebuildError::Log(e) => e,
                    },
                )?,
            };
        let seg = Segment {
            base_offset,
            log_path,
            file,
            size: scan.valid_bytes,
            index,
            next_offset: scan.next_offset,
            max_timestamp: scan.max_timestamp,
        };
        Ok((seg, cut))
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }

    pub fn path(&self) -> &Path {
        &self.log_path
    }

    /// Appends whole, already-stamped batches starting at `self.next_offset`: the bytes of
    /// `parts` in order, in which `batches` gives each batch's position.
    pub fn append(
        &mut self,
        parts: &[IoSlice],
        batches: &[(usize, BatchHeader)],
    ) -> Result<(), LogError> {
        let len = write_all_vectored_at(&self.file, parts, self.size)
            .map_err(|e| LogError::io(&self.log_path, e))?;
        for (at, h) in batches {
            self.index
                .on_append(h.base_offset, self.size + *at as u64, h.size as u64)?;
            self.max_timestamp = self.max_timestamp.max(h.max_timestamp);
        }
        self.size += len as u64;
        if let Some((_, last)) = batches.last() {
            self.next_offset = last.next_offset();
        }
        Ok(())
    }

    /// fsyncs the segment and its index (halting if that fails).
    pub fn flush(&self) {
        crate::durable::sync_or_halt(&self.file, &self.log_path, true);
        self.index.flush();
    }

    /// Its files, to fsync from another thread once it has rolled (see [`RolledSegment`]).
    pub fn rolled(&self) -> Result<RolledSegment, LogError> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| LogError::io(&self.log_path, e))?;
        Ok(RolledSegment {
            log: (file, self.log_path.clone()),
            index: self.index.file_handle()?,
        })
    }

    /// The first batch whose last offset is ≥ `offset`: its position and header.
    pub fn find(&self, offset: i64) -> Result<Option<(u64, BatchHeader)>, LogError> {
        let mut pos = self.index.floor(offset);
        while pos < self.size {
            let h = self.header_at(pos)?;
            if h.last_offset() >= offset {
                return Ok(Some((pos, h)));
            }
            pos += h.size as u64;
        }
        Ok(None)
    }

    /// The header of the batch at `pos`; for a control batch its key is read too, so a
    /// producer-id reset barrier is known as one.
    pub fn header_at(&self, pos: u64) -> Result<BatchHeader, LogError> {
        let mut buf = [0u8; HEADER_LEN];
        self.file
            .read_exact_at(&mut buf, pos)
            .map_err(|e| LogError::io(&self.log_path, e))?;
        let corrupt = |e: batch::BatchError| LogError::Corrupt {
            path: self.log_path.clone(),
            reason: format!("at position {pos}: {e}"),
        };
        let h = batch::parse_header(&buf).map_err(corrupt)?;
        if !h.is_control {
            return Ok(h);
        }
        let span = (h.size - HEADER_LEN).min(batch::CONTROL_KEY_SPAN);
        let mut with_key = vec![0u8; HEADER_LEN + span];
        self.file
            .read_exact_at(&mut with_key, pos)
            .map_err(|e| LogError::io(&self.log_path, e))?;
        batch::parse_header(&with_key).map_err(corrupt)
    }

    pub fn read(&self, pos: u64, len: usize) -> Result<Vec<u8>, LogError> {
        let mut buf = Vec::new();
        self.read_into(pos, len, &mut buf)?;
        Ok(buf)
    }

    /// Appends `len` bytes from `pos` to `out`, read straight into it: a fetch's response is
    /// built without an intermediate copy per batch.
    pub fn read_into(&self, pos: u64, len: usize, out: &mut Vec<u8>) -> Result<(), LogError> {
        let at = out.len();
        out.resize(at + len, 0);
        let read = self.file.read_exact_at(&mut out[at..], pos);
        if let Err(e) = read {
            out.truncate(at);
            return Err(LogError::io(&self.log_path, e));
        }
        Ok(())
    }

    /// Cuts the segment so that no batch with an offset ≥ `offset` remains. Returns the new
    /// next offset (the base of the first removed batch).
    pub fn truncate_to(&mut self, offset: i64) -> Result<i64, LogError> {
        if let Some((pos, h)) = self.find(offset)? {
            self.file
                .set_len(pos)
                .map_err(|e| LogError::io(&self.log_path, e))?;
            self.index.truncate_to_position(pos)?;
            self.size = pos;
            self.next_offset = h.base_offset.max(self.base_offset);
            let mut at = 0;
            self.max_timestamp = -1;
            while at < self.size {
                let h = self.header_at(at)?;
                self.max_timestamp = self.max_timestamp.max(h.max_timestamp);
                at += h.size as u64;
            }
        }
        Ok(self.next_offset)
    }

    /// Deletes the segment's files.
    pub fn delete(self) -> Result<(), LogError> {
        let index_path = self.log_path.with_extension("index");
        std::fs::remove_file(&self.log_path).map_err(|e| LogError::io(&self.log_path, e))?;
        match std::fs::remove_file(&index_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(LogError::io(&index_path, e)),
            _ => Ok(()),
        }
    }
}

enum RebuildError {
    Io(std::io::Error),
    Log(LogError),
}

fn rebuild_index(
    file: &File,
    path: &Path,
    base_offset: i64,
    size: u64,
) -> Result<OffsetIndex, RebuildError> {
    let mut index = OffsetIndex::create(path, base_offset).map_err(RebuildError::Log)?;
    let mut pos = 0;
    let mut buf = [0u8; HEADER_LEN];
    while pos < size {
        file.read_exact_at(&mut buf, pos)
            .map_err(RebuildError::Io)?;
        let h = batch::parse_header(&buf).map_err(|e| {
            RebuildError::Log(LogError::Invalid(format!("index rebuild at {pos}: {e}")))
        })?;
        index
            .on_append(h.base_offset, pos, h.size as u64)
            .map_err(RebuildError::Log)?;
        pos += h.size as u64;
    }
    Ok(index)
}

/// Walks the batches of a segment file; stops at the first incomplete, malformed, out-of-order
/// or (with `verify`) corrupt batch.
fn scan(file: &File, base_offset: i64, size: u64, verify: bool) -> std::io::Result<ScanOutcome> {
    let mut pos = 0u64;
    let mut next_offset = base_offset;
    let mut max_timestamp = -1;
    let mut header = [0u8; HEADER_LEN];
    let stop = |pos, next_offset, max_timestamp, why: String| ScanOutcome {
        valid_bytes: pos,
        next_offset,
        max_timestamp,
        stopped: Some(why),
    };
    while pos < size {
        if size - pos < HEADER_LEN as u64 {
            return Ok(stop(
                pos,
                next_offset,
                max_timestamp,
                "incomplete batch header".into(),
            ));
        }
        file.read_exact_at(&mut header, pos)?;
        let h = match batch::parse_header(&header) {
            Ok(h) => h,
            Err(e) => return Ok(stop(pos, next_offset, max_timestamp, e.to_string())),
        };
        if pos + h.size as u64 > size {
            return Ok(stop(
                pos,
                next_offset,
                max_timestamp,
                format!("batch at offset {} is incomplete", h.base_offset),
            ));
        }
        if h.base_offset < next_offset {
            return Ok(stop(
                pos,
                next_offset,
                max_timestamp,
                format!("batch offset {} goes backwards", h.base_offset),
            ));
        }
        if verify {
            let mut whole = vec![0u8; h.size];
            file.read_exact_at(&mut whole, pos)?;
            let valid =
                batch::verify_crc(&whole).and_then(|_| batch::verify_record_count(&whole, &h));
            if let Err(e) = valid {
                return Ok(stop(
                    pos,
                    next_offset,
                    max_timestamp,
                    format!("batch at offset {}: {e}", h.base_offset),
                ));
            }
        }
        next_offset = h.next_offset();
        max_timestamp = max_timestamp.max(h.max_timestamp);
        pos += h.size as u64;
    }
    Ok(ScanOutcome {
        valid_bytes: pos,
        next_offset,
        max_timestamp,
        stopped: None,
    })
}

/// Writes every byte of `parts`, in order, at `offset` (pwritev, again after a short write) and
/// returns how many that was.
fn write_all_vectored_at(file: &File, parts: &[IoSlice], offset: u64) -> io::Result<usize> {
    /// Linux's `IOV_MAX`.
    const MAX_SLICES: usize = 1024;
    let total = parts.iter().map(|p| p.len()).sum();
    let mut owned: Vec<IoSlice> = parts.iter().filter(|p| !p.is_empty()).copied().collect();
    let mut slices = &mut owned[..];
    let mut written = 0u64;
    while !slices.is_empty() {
        let at = i64::try_from(offset + written).map_err(io::Error::other)?;
        match nix::sys::uio::pwritev(file, &slices[..slices.len().min(MAX_SLICES)], at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                written += n as u64;
                IoSlice::advance_slices(&mut slices, n);
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total)
}
