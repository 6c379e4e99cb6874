//! Random reads by LSN, for paging message bodies back in.
//!
//! The broker keeps message bodies on disk and reads them back when consumers need them, mostly
//! in ascending LSN order and in batches. A `Reader` does that on its own file descriptors,
//! without talking to the writer thread; the design favours runs of ascending reads and keeps
//! random reads cheap.
//!
//! * Segments: a `BTreeMap` from base LSN to segment. LSN `l` is in the segment with the
//!   greatest base `<= l`. The directory is listed again only on a miss (no known segment could
//!   hold `l`, `l` is past the end of the last known one, or a segment file has vanished), so
//!   steady reading does no directory I/O. The writer deletes released segments (always a
//!   prefix) at any time. A descriptor that is still open on a deleted file can still be read;
//!   that is harmless, because the records were released, not damaged. The writer may instead
//!   recycle a released file as a newer segment: a descriptor on it then shows records the
//!   listing does not expect. Only a record with the wanted LSN and a matching CRC is ever
//!   returned (the CRC covers the LSN), so the worst is an error; on one, the reader closes
//!   every file no longer at its segment's name, lists the directory again, and retries. A listing drops every
//!   known segment below the oldest file still present. At most `segments_open_max` files are
//!   open: beyond that, the least recently used one is closed together with its index.
//! * Sparse index: for each open segment, the file offset of every `index_stride_records`-th
//!   record. It is built lazily by walking forward from the furthest record seen so far (the
//!   *frontier*, `scanned_lsn`), so the active segment's index grows as reads go further. A
//!   read starts at the nearest known boundary at or before its LSN (an index entry, the
//!   position after the previous read, or the frontier) and steps over record headers.
//! * Read-ahead: one buffer of `chunk_bytes`, filled by one `pread`. Records are parsed out of
//!   it, so a run of ascending reads costs one syscall per chunk, not one per record. A record
//!   larger than the chunk is read straight into the returned payload, and one that is only
//!   stepped over is not read at all. Memory: one chunk plus the indexes of the open segments
//!   (8 bytes per `index_stride_records` records).
//!
//! The CRC of every returned payload is checked. Damage is `JournalError::Corrupt` naming the
//! file and offset, never wrong data.
//!
//! Reading the active segment while the writer appends. The caller may read only LSNs reported
//! durable, so while `read(l)` runs, every record up to `l` is complete on disk, and a chunk
//! filled during that call shows those records in their final form. A chunk kept from an
//! earlier call may end in records that were being written when it was filled: torn, part old
//! zeros and part new bytes. Hence the rule:
//! * Behind the frontier, buffered bytes are final. They were checked when the frontier passed
//!   them, and the chunk is never older than that check.
//! * At or past the frontier, a record from a chunk filled by an earlier call is accepted only
//!   if its CRC matches. Anything else there (zeros, bad framing, a wrong LSN, a bad CRC) makes
//!   the reader fill the chunk again before it concludes anything.
//!
//! A reader reads files, not a `Journal` instance, and stays valid across a restart of the
//! journal in the same directory. Recovery only zeroes records that were never complete, and
//! the frontier never passes a record that was not durable.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Bound;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::record::{frame, Frame, RECORD_HEADER_BYTES};
use crate::segment::{
    decode_header, parse_segment_file_name, segment_file_name, SEGMENT_HEADER_BYTES,
};
use crate::{JournalError, Lsn, SEGMENT_BYTES_MAX};

/// Default bytes read ahead per `pread`: 1 MiB.
const READ_CHUNK_BYTES_DEFAULT: usize = 1024 * 1024;
/// Default records between two entries of a segment's sparse index: 256. The index costs 8 bytes
/// per entry, and a random read steps over at most this many record headers.
const INDEX_STRIDE_RECORDS_DEFAULT: u64 = 256;
/// Default for the most segment files a reader keeps open: 64.
const SEGMENTS_OPEN_MAX_DEFAULT: usize = 64;

/// The limits of a `Reader`. `Default` gives the values meant for production. Tests shrink them
/// to exercise chunk boundaries and file closing with small data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReaderLimits {
    /// Bytes read ahead per `pread`, and the size of the one read buffer. Default 1 MiB.
    pub chunk_bytes: usize,
    /// Records between two sparse index entries. Default 256.
    pub index_stride_records: u64,
    /// Most segment files kept open. Beyond that, the least recently used one is closed and its
    /// index is dropped. Default 64.
    pub segments_open_max: usize,
}

impl Default for ReaderLimits {
    fn default() -> ReaderLimits {
        ReaderLimits {
            chunk_bytes: READ_CHUNK_BYTES_DEFAULT,
            index_stride_records: INDEX_STRIDE_RECORDS_DEFAULT,
            segments_open_max: SEGMENTS_OPEN_MAX_DEFAULT,
        }
    }
}

impl ReaderLimits {
    fn validate(&self) -> Result<(), String> {
        let chunk_range = RECORD_HEADER_BYTES..=SEGMENT_BYTES_MAX as usize;
        if !chunk_range.contains(&self.chunk_bytes) {
            return Err(format!(
                "reader chunk_bytes {} outside {chunk_range:?}",
                self.chunk_bytes
            ));
        }
        if self.index_stride_records == 0 {
            return Err("reader index_stride_records must be > 0".to_string());
        }
        if self.segments_open_max == 0 {
            return Err("reader segments_open_max must be > 0".to_string());
        }
        Ok(())
    }
}

/// Counters since `Reader::open`, for metrics (and for tests of the read-ahead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// `pread`s that filled the read-ahead chunk.
    pub chunk_reads: u64,
    /// `pread`s of one payload larger than the chunk, straight into the returned payload.
    pub large_record_reads: u64,
    /// Directory listings (one at open, then one per miss).
    pub dir_listings: u64,
}

/// Reads records back by LSN from the segment files, independently of the writer.
/// Only LSNs already durable (reported by `Journal::durable`) may be read.
///
/// Not shared: each task that reads opens its own (`&mut self` for reads, because the read
/// buffer, the indexes and the open files are all per reader).
pub struct Reader {
    dir: PathBuf,
    limits: ReaderLimits,
    /// Every segment of the last directory listing that has not been dropped since, by base
    /// LSN. An entry has a file open only if it has been read recently.
    segments: BTreeMap<Lsn, Segment>,
    /// How many `segments` have a file open. At most `limits.segments_open_max`.
    open_count: usize,
    chunk: Chunk,
    /// The record boundary right after the last record returned, where the next read of an
    /// ascending run starts. Always at or behind its segment's frontier.
    cursor: Option<Position>,
    /// Number of the `read` call in progress, starting at 1. Tells whether `chunk` was filled
    /// during it.
    read_seq: u64,
    /// Ticks on every segment use, for closing the least recently used file.
    use_clock: u64,
    stats: ReaderStats,
}

struct Segment {
    open: Option<OpenSegment>,
    last_used: u64,
}

/// An open segment file and what is known about its layout.
struct OpenSegment {
    file: File,
    path: PathBuf,
    base_lsn: Lsn,
    /// File length (segments are preallocated, so records end at or before it).
    file_bytes: u64,
    /// `index[k]` is the offset of record `base_lsn + k * stride`, for every such record
    /// before `scanned_lsn`.
    index: Vec<u64>,
    /// The frontier: the first record not yet walked over, and the offset where it starts (or
    /// will start). Every record before it has been seen with correct framing and LSN, in its
    /// final form.
    scanned_lsn: Lsn,
    scanned_offset: u64,
}

/// The read-ahead buffer: bytes `[offset, offset + len)` of one segment.
struct Chunk {
    /// Allocated to `chunk_bytes` on the first fill.
    buf: Vec<u8>,
    len: usize,
    /// The segment these bytes are from, or None if the chunk holds nothing.
    segment_base: Option<Lsn>,
    offset: u64,
    /// The `read_seq` of the call that filled it.
    filled_in_read: u64,
    /// Fills so far (`ReaderStats::chunk_reads`).
    reads: u64,
}

/// A record boundary.
#[derive(Clone, Copy, Debug)]
struct Position {
    segment_base: Lsn,
    lsn: Lsn,
    offset: u64,
}

/// How a walk through one segment towards an LSN ended.
enum Walk {
    Found(Vec<u8>),
    /// The log in the segment ends before the LSN: `next_lsn` would have started at `offset`.
    End {
        next_lsn: Lsn,
        offset: u64,
    },
}

impl Reader {
    /// A reader with the default limits on the journal directory `dir`, which must exist.
    pub fn open(dir: &Path) -> Result<Reader, JournalError> {
        Reader::open_with_limits(dir, ReaderLimits::default())
    }

    /// A reader with the given limits. `JournalError::Config` if they are out of range.
    pub fn open_with_limits(dir: &Path, limits: ReaderLimits) -> Result<Reader, JournalError> {
        limits.validate().map_err(JournalError::Config)?;
        let mut reader = Reader {
            dir: dir.to_path_buf(),
            limits,
            segments: BTreeMap::new(),
            open_count: 0,
            chunk: Chunk {
                buf: Vec::new(),
                len: 0,
                segment_base: None,
                offset: 0,
                filled_in_read: 0,
                reads: 0,
            },
            cursor: None,
            read_seq: 0,
            use_clock: 0,
            stats: ReaderStats::default(),
        };
        reader.refresh()?;
        Ok(reader)
    }

    /// The payload of record `lsn`. `lsn` must be durable (see `Journal::durable`).
    ///
    /// Errors: `NotFound` if no segment holds `lsn`: it was released, or it is 0 or past the
    /// end of the log. `Io` if a read fails. `Corrupt` (file and offset) if the record or the
    /// framing leading to it is damaged, or if the segment that must hold it ends too early.
    /// A released LSN may still be returned while this reader has its segment file open.
    /// Released means "may be gone", not "must fail".
    pub fn read(&mut self, lsn: Lsn) -> Result<Vec<u8>, JournalError> {
        if lsn == 0 {
            return Err(JournalError::NotFound { lsn });
        }
        self.read_seq += 1;
        match self.read_listed(lsn) {
            Ok(Some(payload)) => return Ok(payload),
            Ok(None) => {}
            // Damage, or a stale listing: the writer recycles released segment files, so a
            // descriptor this reader kept open on one may now show a newer segment's records.
            Err(e @ JournalError::Corrupt { .. }) => {
                if !self.close_recycled()? {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
        // A miss. The writer may have rolled over or deleted segments since the last listing.
        self.refresh()?;
        self.read_listed(lsn)?.ok_or(JournalError::NotFound { lsn })
    }

    pub fn stats(&self) -> ReaderStats {
        ReaderStats {
            chunk_reads: self.chunk.reads,
            ..self.stats
        }
    }

    /// Reads `lsn` from the segments listed so far. None if they do not hold it.
    fn read_listed(&mut self, lsn: Lsn) -> Result<Option<Vec<u8>>, JournalError> {
        let Some(base) = self.segments.range(..=lsn).next_back().map(|(b, _)| *b) else {
            return Ok(None);
        };
        let next_base = self
            .segments
            .range((Bound::Excluded(lsn), Bound::Unbounded))
            .next()
            .map(|(b, _)| *b);
        if !self.open_segment(base)? {
            return Ok(None);
        }
        let seg = self
            .segments
            .get_mut(&base)
            .and_then(|s| s.open.as_mut())
            .expect("segment was just opened");
        let walk = walk_to(
            seg,
            lsn,
            &mut self.chunk,
            &mut self.cursor,
            &self.limits,
            self.read_seq,
            &mut self.stats.large_record_reads,
        )?;
        match (walk, next_base) {
            (Walk::Found(payload), _) => Ok(Some(payload)),
            // The last known segment ends before `lsn`, which must be in a newer one.
            (Walk::End { .. }, None) => Ok(None),
            // A sealed segment ends early: records the next segment does not start with are
            // missing.
            (Walk::End { next_lsn, offset }, Some(next)) => Err(corrupt(
                &seg.path,
                offset,
                format!(
                    "log in the segment ends before LSN {next_lsn} but the next segment starts at \
                     LSN {next}: LSN {lsn} is missing"
                ),
            )),
        }
    }

    /// Opens the file of segment `base` unless it is open already. Returns false if the file is
    /// gone (released).
    fn open_segment(&mut self, base: Lsn) -> Result<bool, JournalError> {
        self.use_clock += 1;
        let slot = self.segments.get_mut(&base).expect("segment is listed");
        slot.last_used = self.use_clock;
        if slot.open.is_some() {
            return Ok(true);
        }
        let path = self.dir.join(segment_file_name(base));
        let io = |e| JournalError::io(&path, e);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(e)),
        };
        let file_bytes = file.metadata().map_err(io)?.len();
        if file_bytes < SEGMENT_HEADER_BYTES {
            return Err(corrupt(
                &path,
                0,
                format!("segment shorter ({file_bytes} bytes) than its header"),
            ));
        }
        let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let (header_base, _epoch) =
            decode_header(&header).map_err(|reason| corrupt(&path, 0, reason))?;
        if header_base != base {
            return Err(corrupt(
                &path,
                0,
                format!("segment header says base LSN {header_base}, file name says {base}"),
            ));
        }
        if self.open_count == self.limits.segments_open_max {
            self.close_least_recently_used();
        }
        let slot = self.segments.get_mut(&base).expect("segment is listed");
        slot.open = Some(OpenSegment {
            file,
            path,
            base_lsn: base,
            file_bytes,
            index: Vec::new(),
            scanned_lsn: base,
            scanned_offset: SEGMENT_HEADER_BYTES,
        });
        self.open_count += 1;
        assert!(self.open_count <= self.limits.segments_open_max);
        Ok(true)
    }

    fn close_least_recently_used(&mut self) {
        let base = self
            .segments
            .iter()
            .filter(|(_, s)| s.open.is_some())
            .min_by_key(|(_, s)| s.last_used)
            .map(|(b, _)| *b)
            .expect("a segment is open when the limit is reached");
        self.close(base);
    }

    /// Closes segment `base`'s file, if open, and forgets what was read from it.
    fn close(&mut self, base: Lsn) {
        let Some(slot) = self.segments.get_mut(&base) else {
            return;
        };
        if slot.open.take().is_some() {
            self.open_count -= 1;
        }
        // The index and frontier went with the file. Positions and buffered bytes must not
        // outlive them.
        if self.cursor.is_some_and(|c| c.segment_base == base) {
            self.cursor = None;
        }
        if self.chunk.segment_base == Some(base) {
            self.chunk.segment_base = None;
        }
    }

    /// Closes every open segment whose file is no longer the one at its name (released, and
    /// renamed away to be recycled). Returns whether there was one.
    fn close_recycled(&mut self) -> Result<bool, JournalError> {
        let mut gone = Vec::new();
        for (base, slot) in &self.segments {
            let Some(open) = &slot.open else { continue };
            let io = |e| JournalError::io(&open.path, e);
            let ours = open.file.metadata().map_err(io)?.ino();
            match std::fs::metadata(&open.path) {
                Ok(m) if m.ino() == ours => {}
                Ok(_) => gone.push(*base),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => gone.push(*base),
                Err(e) => return Err(io(e)),
            }
        }
        for base in &gone {
            self.close(*base);
        }
        Ok(!gone.is_empty())
    }

    /// Lists the directory again: adds new segments and drops those below the oldest file
    /// present (released, because the writer deletes only a prefix).
    fn refresh(&mut self) -> Result<(), JournalError> {
        self.stats.dir_listings += 1;
        let io = |e| JournalError::io(&self.dir, e);
        let mut listed = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            if let Some(base) = entry.file_name().to_str().and_then(parse_segment_file_name) {
                listed.push(base);
            }
        }
        let oldest = listed.iter().min().copied().unwrap_or(Lsn::MAX);
        let released: Vec<Lsn> = self.segments.range(..oldest).map(|(b, _)| *b).collect();
        for base in released {
            self.close(base);
            self.segments.remove(&base);
        }
        for base in listed {
            self.segments.entry(base).or_insert(Segment {
                open: None,
                last_used: 0,
            });
        }
        Ok(())
    }
}

impl OpenSegment {
    /// Moves the frontier over the record at the frontier, which has been checked.
    fn extend(&mut self, total_bytes: usize, stride: u64) {
        let n = self.scanned_lsn - self.base_lsn;
        if n.is_multiple_of(stride) {
            assert_eq!(self.index.len() as u64, n / stride, "index has no holes");
            self.index.push(self.scanned_offset);
        }
        self.scanned_lsn += 1;
        self.scanned_offset += total_bytes as u64;
        assert!(
            self.scanned_offset <= self.file_bytes,
            "checked records fit in the file"
        );
    }
}

impl Chunk {
    /// Buffered bytes `[offset, offset + bytes)` of segment `base`, if all are buffered.
    fn get(&self, base: Lsn, offset: u64, bytes: u64) -> Option<&[u8]> {
        if self.segment_base != Some(base) || offset < self.offset {
            return None;
        }
        let start = offset - self.offset;
        let end = start.checked_add(bytes)?;
        (end <= self.len as u64).then(|| &self.buf[start as usize..end as usize])
    }

    /// Whether the chunk holds bytes of segment `base` read during call `read_seq`.
    fn is_fresh(&self, base: Lsn, read_seq: u64) -> bool {
        self.segment_base == Some(base) && self.filled_in_read == read_seq
    }

    /// Reads up to `chunk_bytes` of `seg` from `offset` (less at the end of the file).
    fn fill(
        &mut self,
        seg: &OpenSegment,
        offset: u64,
        chunk_bytes: usize,
        read_seq: u64,
    ) -> Result<(), JournalError> {
        assert!(offset <= seg.file_bytes);
        let n = (seg.file_bytes - offset).min(chunk_bytes as u64) as usize;
        if self.buf.len() != chunk_bytes {
            self.buf = vec![0u8; chunk_bytes];
        }
        // Holds nothing until the read succeeds.
        self.segment_base = None;
        self.reads += 1;
        seg.file
            .read_exact_at(&mut self.buf[..n], offset)
            .map_err(|e| JournalError::io(&seg.path, e))?;
        self.segment_base = Some(seg.base_lsn);
        self.offset = offset;
        self.len = n;
        self.filled_in_read = read_seq;
        Ok(())
    }
}

/// Walks segment `seg` from the nearest known record boundary at or before `lsn` to `lsn` and
/// returns its CRC-checked payload, moving the frontier (and growing the index) on the way.
///
/// Each step either moves forward one record or fills the chunk, and fills happen only when
/// the chunk does not cover what is needed or is stale. After such a fill it covers what is
/// needed and is fresh, so the loop ends.
fn walk_to(
    seg: &mut OpenSegment,
    lsn: Lsn,
    chunk: &mut Chunk,
    cursor: &mut Option<Position>,
    limits: &ReaderLimits,
    read_seq: u64,
    large_record_reads: &mut u64,
) -> Result<Walk, JournalError> {
    let base = seg.base_lsn;
    let stride = limits.index_stride_records;
    assert!(base <= lsn, "LSN {lsn} is not in segment {base}");
    let (mut at_lsn, mut at) = if lsn >= seg.scanned_lsn {
        (seg.scanned_lsn, seg.scanned_offset)
    } else {
        let k = (lsn - base) / stride;
        assert!(
            k < seg.index.len() as u64,
            "the index covers every stride behind the frontier"
        );
        let indexed = (base + k * stride, seg.index[k as usize]);
        match *cursor {
            Some(c) if c.segment_base == base && indexed.0 < c.lsn && c.lsn <= lsn => {
                (c.lsn, c.offset)
            }
            _ => indexed,
        }
    };
    loop {
        assert!(at_lsn <= seg.scanned_lsn && at <= seg.file_bytes);
        let at_frontier = at_lsn == seg.scanned_lsn;
        if at_frontier {
            assert_eq!(at, seg.scanned_offset);
        }
        let fresh = chunk.is_fresh(base, read_seq);
        // See the module comment: past the frontier, only a chunk filled during this call shows
        // records in their final form.
        let trusted = !at_frontier || fresh;
        let available = seg.file_bytes - at;
        let Some(head) = chunk.get(base, at, available.min(RECORD_HEADER_BYTES as u64)) else {
            chunk.fill(seg, at, limits.chunk_bytes, read_seq)?;
            continue;
        };
        let (header, total) = match frame(head, available) {
            Frame::Record {
                header,
                total_bytes,
            } if header.lsn == at_lsn => (header, total_bytes),
            _ if !trusted => {
                chunk.fill(seg, at, limits.chunk_bytes, read_seq)?;
                continue;
            }
            Frame::End if at_frontier => {
                return Ok(Walk::End {
                    next_lsn: at_lsn,
                    offset: at,
                })
            }
            Frame::End => {
                return Err(corrupt(
                    &seg.path,
                    at,
                    format!("end-of-log marker where LSN {at_lsn} was read before"),
                ))
            }
            Frame::Bad(reason) => {
                return Err(corrupt(
                    &seg.path,
                    at,
                    format!("{reason} where LSN {at_lsn} should start"),
                ))
            }
            Frame::Record { header, .. } => {
                return Err(corrupt(
                    &seg.path,
                    at,
                    format!("LSN gap: expected LSN {at_lsn}, found {}", header.lsn),
                ))
            }
        };

        if at_lsn == lsn {
            let payload = match chunk.get(base, at, total as u64) {
                Some(record) => record[RECORD_HEADER_BYTES..].to_vec(),
                None if total <= limits.chunk_bytes => {
                    chunk.fill(seg, at, limits.chunk_bytes, read_seq)?;
                    continue;
                }
                None => {
                    // Larger than the chunk: one read straight into the payload we return.
                    *large_record_reads += 1;
                    let mut payload = vec![0u8; total - RECORD_HEADER_BYTES];
                    seg.file
                        .read_exact_at(&mut payload, at + RECORD_HEADER_BYTES as u64)
                        .map_err(|e| JournalError::io(&seg.path, e))?;
                    payload
                }
            };
            if !header.crc_matches(&payload) {
                if !trusted {
                    chunk.fill(seg, at, limits.chunk_bytes, read_seq)?;
                    continue;
                }
                return Err(corrupt(
                    &seg.path,
                    at,
                    format!("CRC mismatch in record LSN {lsn}"),
                ));
            }
            if at_frontier {
                seg.extend(total, stride);
            }
            *cursor = Some(Position {
                segment_base: base,
                lsn: lsn + 1,
                offset: at + total as u64,
            });
            return Ok(Walk::Found(payload));
        }

        // Stepping over a record on the way to `lsn`. Its framing and LSN are checked, and its
        // payload is not needed. A stale chunk past the frontier needs the CRC as well, because
        // the record may have been torn when the chunk was filled.
        if at_frontier {
            if !fresh {
                let whole = chunk
                    .get(base, at, total as u64)
                    .is_some_and(|record| header.crc_matches(&record[RECORD_HEADER_BYTES..]));
                if !whole {
                    chunk.fill(seg, at, limits.chunk_bytes, read_seq)?;
                    continue;
                }
            }
            seg.extend(total, stride);
        }
        at += total as u64;
        at_lsn += 1;
    }
}

fn corrupt(segment: &Path, offset: u64, reason: impl Into<String>) -> JournalError {
    JournalError::Corrupt {
        segment: segment.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}
