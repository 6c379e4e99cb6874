//! Segment files: naming, the segment header, and the preallocated spare.
//!
//! A segment is `{base_lsn:020}.seg`, exactly `segment_bytes` long, zero-filled by real writes
//! when it is prepared (not fallocate: unwritten extents would make every later fdatasync update
//! extent metadata on ext4/xfs). It starts with a 24-byte header:
//!
//! ```text
//! [8 magic "HAVENJ01"][u64 base_lsn][u32 epoch][u32 crc32c over the first 20 bytes]
//! ```
//! followed by records back to back (see `record.rs`); a zero `len` ends the log in the segment.
//!
//! `epoch` names the master that wrote the segment when brokers share the journal directory
//! (0 for a standalone broker, and in files written before epochs existed, whose bytes there are
//! zero). A new master starts a new segment, so every segment is written by one master and the
//! epochs of consecutive segments never decrease; recovery refuses a journal where they do.
//!
//! The writer keeps one spare prepared ahead of need, named `spare.tmp`: it is zero-filled a
//! chunk at a time between batches and fsynced once complete. A segment the broker no longer
//! needs is recycled instead when it can be (`recycled-<n>.tmp`): renaming it costs nothing,
//! where zero-filling a new one cost up to 14% of a busy broker's CPU (docs/PERFORMANCE.md).
//!
//! A recycled file still holds the old segment's records after the new ones. They cannot be
//! mistaken for the log: their LSNs are below the new segment's base. So that the log still ends
//! at a zero `len` in a sealed segment, a segment with such a stale tail gets an end-of-log
//! marker (`END_MARKER_BYTES` zeros) written after every batch, in the same fdatasync
//! (`ActiveSegment::stale_tail`). Rolling over writes the header
//! into the spare, fdatasyncs it, renames it to its `.seg` name and fsyncs the directory, so a
//! `.seg` name never points at a file without a valid header. A crash at any point leaves either
//! a `.tmp` (deleted by recovery; nothing in it was ever reported durable) or a valid segment.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::fs::FileOps;
use crate::Lsn;

/// Bytes of the segment header.
pub const SEGMENT_HEADER_BYTES: u64 = 24;
pub const SEGMENT_MAGIC: &[u8; 8] = b"HAVENJ01";
/// File name of the spare segment being prepared.
pub const SPARE_FILE_NAME: &str = "spare.tmp";
pub const SEGMENT_SUFFIX: &str = ".seg";
/// Prefix of a retired segment kept to become a spare.
pub const RECYCLED_PREFIX: &str = "recycled-";
/// Zero bytes that end the log in a segment: a record `len` of zero (see `record::frame`).
pub const END_MARKER_BYTES: u64 = 4;
pub const TMP_SUFFIX: &str = ".tmp";

pub fn segment_file_name(base_lsn: Lsn) -> String {
    format!("{base_lsn:020}{SEGMENT_SUFFIX}")
}

/// The base LSN encoded in a segment file name, or None if it is not a segment name.
pub fn parse_segment_file_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn encode_header(base_lsn: Lsn, epoch: u32) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..16].copy_from_slice(&base_lsn.to_le_bytes());
    h[16..20].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(decode_header(&h), Ok((base_lsn, epoch)));
    h
}

/// The base LSN and epoch in a segment header, or why the header is invalid.
pub fn decode_header(h: &[u8; SEGMENT_HEADER_BYTES as usize]) -> Result<(Lsn, u32), String> {
    if &h[0..8] != SEGMENT_MAGIC {
        return Err(format!("bad segment magic {:?}", &h[0..8]));
    }
    let crc = u32::from_le_bytes(h[20..24].try_into().unwrap());
    if crc32c::crc32c(&h[0..20]) != crc {
        return Err("segment header CRC mismatch".to_string());
    }
    let epoch = u32::from_le_bytes(h[16..20].try_into().unwrap());
    Ok((u64::from_le_bytes(h[8..16].try_into().unwrap()), epoch))
}

/// The segment the writer appends to.
#[derive(Debug)]
pub struct ActiveSegment {
    pub file: File,
    pub path: PathBuf,
    pub base_lsn: Lsn,
    /// File length; records end at or before it.
    pub capacity_bytes: u64,
    /// Where the next record goes.
    pub write_pos: u64,
    /// The bytes after `write_pos` may be old records or garbage rather than zeros (a recycled
    /// file, or a tail recovery found dirty): each batch ends with an end-of-log marker.
    pub stale_tail: bool,
}

impl ActiveSegment {
    pub fn remaining_bytes(&self) -> u64 {
        self.capacity_bytes - self.write_pos
    }

    /// Writes the end-of-log marker at `write_pos` (as much of it as fits), if the tail needs
    /// one. Part of a batch: the caller's fdatasync covers it.
    pub fn end_log(&self, ops: &dyn FileOps) -> std::io::Result<()> {
        let n = END_MARKER_BYTES.min(self.remaining_bytes());
        if !self.stale_tail || n == 0 {
            return Ok(());
        }
        ops.write_at(
            &self.file,
            &[0u8; END_MARKER_BYTES as usize][..n as usize],
            self.write_pos,
        )
    }
}

/// A segment file being zero-filled ahead of need.
#[derive(Debug)]
pub struct Spare {
    file: File,
    path: PathBuf,
    filled_bytes: u64,
    target_bytes: u64,
    synced: bool,
    /// A retired segment: full of old records rather than zeros.
    recycled: bool,
}

impl Spare {
    /// A spare whose zeros are a hole (`set_len`) rather than written: ready at once. Used for
    /// the first segment of a new master, so a takeover does not wait to write a whole segment
    /// of zeros; its fdatasyncs may cost a little more (extent updates) until the next roll.
    pub fn create_sparse(
        ops: &dyn FileOps,
        dir: &Path,
        target_bytes: u64,
    ) -> Result<Spare, (&'static str, std::io::Error)> {
        let mut spare = Spare::create(dir, target_bytes).map_err(|e| ("create", e))?;
        spare
            .file
            .set_len(target_bytes)
            .map_err(|e| ("set_len", e))?;
        ops.sync_all(&spare.file).map_err(|e| ("fsync", e))?;
        spare.filled_bytes = target_bytes;
        spare.synced = true;
        Ok(spare)
    }

    pub fn create(dir: &Path, target_bytes: u64) -> std::io::Result<Spare> {
        let path = dir.join(SPARE_FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(Spare {
            file,
            path,
            filled_bytes: 0,
            target_bytes,
            synced: false,
            recycled: false,
        })
    }

    /// Renames the retired segment `from` (exactly `target_bytes` long) to `to` and keeps it as
    /// a ready spare. The caller fsyncs the directory, which makes the retirement durable.
    pub fn recycle(
        ops: &dyn FileOps,
        from: &Path,
        to: PathBuf,
        target_bytes: u64,
    ) -> Result<Spare, (&'static str, std::io::Error)> {
        ops.rename(from, &to).map_err(|e| ("rename", e))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&to)
            .map_err(|e| ("open", e))?;
        Ok(Spare {
            file,
            path: to,
            filled_bytes: target_bytes,
            target_bytes,
            synced: true,
            recycled: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_ready(&self) -> bool {
        self.synced
    }

    /// Zeros still to write before the spare is complete.
    pub fn unfilled_bytes(&self) -> u64 {
        self.target_bytes - self.filled_bytes
    }

    /// Writes up to `bytes_max` more zeros (taken from `zeros`, repeated); fsyncs the file once
    /// it is complete. Returns whether the spare is ready.
    pub fn fill_step(
        &mut self,
        ops: &dyn FileOps,
        zeros: &[u8],
        bytes_max: u64,
    ) -> Result<bool, (&'static str, std::io::Error)> {
        let mut budget = bytes_max;
        while self.filled_bytes < self.target_bytes && budget > 0 {
            let n = (self.target_bytes - self.filled_bytes)
                .min(zeros.len() as u64)
                .min(budget);
            ops.write_at(&self.file, &zeros[..n as usize], self.filled_bytes)
                .map_err(|e| ("write", e))?;
            self.filled_bytes += n;
            budget -= n;
        }
        if self.filled_bytes == self.target_bytes && !self.synced {
            ops.sync_all(&self.file).map_err(|e| ("fsync", e))?;
            self.synced = true;
        }
        Ok(self.synced)
    }

    /// Fills whatever is left and fsyncs.
    pub fn finish(
        &mut self,
        ops: &dyn FileOps,
        zeros: &[u8],
    ) -> Result<(), (&'static str, std::io::Error)> {
        let ready = self.fill_step(ops, zeros, u64::MAX)?;
        assert!(ready);
        Ok(())
    }

    /// Turns the ready spare into the segment starting at `base_lsn`: header, fdatasync, rename,
    /// fsync dir. On error returns the path the failed operation was on.
    pub fn into_segment(
        self,
        ops: &dyn FileOps,
        dir: &Path,
        base_lsn: Lsn,
        epoch: u32,
    ) -> Result<ActiveSegment, (&'static str, PathBuf, std::io::Error)> {
        assert!(self.synced, "spare is complete before it becomes a segment");
        // A recycled file's old first record follows the header: end the log before it.
        let mut start = [0u8; (SEGMENT_HEADER_BYTES + END_MARKER_BYTES) as usize];
        start[..SEGMENT_HEADER_BYTES as usize].copy_from_slice(&encode_header(base_lsn, epoch));
        let n = if self.recycled {
            start.len()
        } else {
            SEGMENT_HEADER_BYTES as usize
        };
        ops.write_at(&self.file, &start[..n], 0)
            .map_err(|e| ("write", self.path.clone(), e))?;
        ops.sync_data(&self.file)
            .map_err(|e| ("fdatasync", self.path.clone(), e))?;
        let path = dir.join(segment_file_name(base_lsn));
        ops.rename(&self.path, &path)
            .map_err(|e| ("rename", self.path.clone(), e))?;
        ops.sync_dir(dir)
            .map_err(|e| ("fsync dir", dir.to_path_buf(), e))?;
        Ok(ActiveSegment {
            file: self.file,
            path,
            base_lsn,
            capacity_bytes: self.target_bytes,
            write_pos: SEGMENT_HEADER_BYTES,
            stale_tail: self.recycled,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_damage() {
        let h = encode_header(42, 7);
        assert_eq!(decode_header(&h), Ok((42, 7)));
        for i in 0..h.len() {
            let mut d = h;
            d[i] ^= 0x10;
            assert!(decode_header(&d).is_err(), "byte {i}");
        }
        assert!(decode_header(&[0; 24]).is_err());
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(segment_file_name(1), "00000000000000000001.seg");
        assert_eq!(
            parse_segment_file_name(&segment_file_name(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(parse_segment_file_name("1.seg"), None);
        assert_eq!(parse_segment_file_name(SPARE_FILE_NAME), None);
    }
}
