//! The sparse offset index of one segment, in Kafka's `.index` layout (relative offset and file
//! position, both 4-byte big-endian), so a fetch seeks near its batch instead of scanning.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::LogError;

/// Bytes appended between two index entries, as Kafka's `index.interval.bytes`.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;

/// The index of one segment: ascending `(batch base offset, file position)`.
#[derive(Debug)]
pub struct OffsetIndex {
    path: PathBuf,
    base_offset: i64,
    entries: Vec<(i64, u64)>,
    file: File,
    bytes_since_entry: u64,
}

impl OffsetIndex {
    /// Creates an empty index file, replacing any existing one.
    pub fn create(path: &Path, base_offset: i64) -> Result<Self, LogError> {
        File::create(path).map_err(|e| LogError::io(path, e))?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| LogError::io(path, e))?;
        Ok(OffsetIndex {
            path: path.to_path_buf(),
            base_offset,
            entries: Vec::new(),
            file,
            bytes_since_entry: INDEX_INTERVAL_BYTES,
        })
    }

    /// Loads an index file; `None` when it is missing or inconsistent with `segment_size`, so the
    /// caller rebuilds it from the segment.
    pub fn load(
        path: &Path,
        base_offset: i64,
        segment_size: u64,
    ) -> Result<Option<Self>, LogError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(LogError::io(path, e)),
        };
        if bytes.len() % 8 != 0 {
            return Ok(None);
        }
        let mut entries = Vec::with_capacity(bytes.len() / 8);
        for chunk in bytes.chunks_exact(8) {
            let rel = u32::from_be_bytes(chunk[..4].try_into().expect("4 bytes"));
            let pos = u32::from_be_bytes(chunk[4..].try_into().expect("4 bytes")) as u64;
            let offset = base_offset + rel as i64;
            let sorted = entries.last().is_none_or(|&(o, p)| o < offset && p < pos);
            if pos >= segment_size.max(1) || !sorted {
                return Ok(None);
            }
            entries.push((offset, pos));
        }
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| LogError::io(path, e))?;
        Ok(Some(OffsetIndex {
            path: path.to_path_buf(),
            base_offset,
            entries,
            file,
            bytes_since_entry: 0,
        }))
    }

    /// Notes a batch appended at `position`; writes an entry every `INDEX_INTERVAL_BYTES`.
    pub fn on_append(&mut self, offset: i64, position: u64, size: u64) -> Result<(), LogError> {
        if self.bytes_since_entry >= INDEX_INTERVAL_BYTES {
            let rel = (offset - self.base_offset) as u32;
            let mut entry = [0u8; 8];
            entry[..4].copy_from_slice(&rel.to_be_bytes());
            entry[4..].copy_from_slice(&(position as u32).to_be_bytes());
            self.file
                .write_all(&entry)
                .map_err(|e| LogError::io(&self.path, e))?;
            self.entries.push((offset, position));
            self.bytes_since_entry = 0;
        }
        self.bytes_since_entry += size;
        Ok(())
    }

    /// The position of the last indexed batch starting at or before `offset`.
    pub fn floor(&self, offset: i64) -> u64 {
        match self.entries.partition_point(|&(o, _)| o <= offset) {
            0 => 0,
            i => self.entries[i - 1].1,
        }
    }

    /// Drops entries at or beyond `position` (the segment was truncated there).
    pub fn truncate_to_position(&mut self, position: u64) -> Result<(), LogError> {
        self.entries.retain(|&(_, p)| p < position);
        self.file
            .set_len(self.entries.len() as u64 * 8)
            .map_err(|e| LogError::io(&self.path, e))?;
        self.bytes_since_entry = INDEX_INTERVAL_BYTES;
        Ok(())
    }

    /// fsyncs the index (halting if that fails, see [`crate::durable::sync_or_halt`]).
    pub fn flush(&self) {
        crate::durable::sync_or_halt(&self.file, &self.path, true);
    }

    /// A second handle on the index file and its path, for a flush from another thread.
    pub fn file_handle(&self) -> Result<(File, PathBuf), LogError> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| LogError::io(&self.path, e))?;
        Ok((file, self.path.clone()))
    }
}
