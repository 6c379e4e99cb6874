//! Recovery: turns the files in the journal directory back into an LSN sequence.
//!
//! Each segment is streamed once through a buffered reader (one record in memory at a time) and
//! every valid record is handed to the caller's `on_record`. The question recovery must answer
//! for damaged bytes is "torn tail or corruption?":
//!
//! * Torn tail — only possible in the last segment, where the writer was when the process or
//!   machine died, and only if nothing valid follows the damage. Nothing after the damage was
//!   ever reported durable (durability is published only after fdatasync of everything before
//!   it), so the log is ended there with an end-of-log marker (a logical truncation that keeps
//!   the preallocation) and a warning.
//! * Old records — a recycled segment (see `segment.rs`) holds its previous life's records
//!   after the log. One with a valid CRC and an LSN below the segment's base ends the log in
//!   the last segment (its end-of-log marker may not have reached the disk before a crash);
//!   the scan for valid records after damage skips them whole.
//! * Anything else — a bad record in a sealed segment, a bad record or zero-length marker in
//!   the last segment followed by a valid record, a record with a valid CRC but the wrong LSN,
//!   or segments whose LSNs do not join up — is `JournalError::Corrupt` naming the file and
//!   offset. Data that was reported durable may be involved, so it is never skipped.
//!
//! "Followed by a valid record" is found by scanning every byte offset after the damage for a
//! header whose length fits, whose LSN is in the plausible range and whose CRC matches.
//!
//! Caveat the broker must know: after a power loss in the middle of one write+fdatasync batch,
//! the disk may have persisted a later page of that batch but not an earlier one. That also
//! looks like "a bad record followed by a valid one" and is reported as `Corrupt`, although no
//! durable data was lost. We choose the false alarm (refuse to start) over the risk of silently
//! dropping records that were acknowledged; the rule of the brief.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::config::FIRST_SEGMENT_BYTES_MAX;
use crate::fs::FileOps;
use crate::record::{frame, Frame, RecordHeader, RECORD_HEADER_BYTES};
use crate::segment::{
    decode_header, encode_header, parse_segment_file_name, ActiveSegment, Spare,
    SEGMENT_HEADER_BYTES, TMP_SUFFIX,
};
use crate::{JournalConfig, JournalError, Lsn, SegmentInfo};

/// Buffer of the reader that streams a segment: 1 MiB.
const READ_BUFFER_BYTES: usize = 1024 * 1024;
/// Leftover temporary files are renamed to `<name>.<pid>-<n>.discard` and deleted in the
/// background; a later start deletes any it finds.
const DISCARD_SUFFIX: &str = ".discard";
/// Window of the scan for valid records after damage: 1 MiB.
const SCAN_WINDOW_BYTES: usize = 1024 * 1024;
/// Bytes one scan may spend checking CRCs of would-be old records that turn out not to be
/// records: 256 MiB (tens of milliseconds). Old LSNs are a wide range, so payload bytes can
/// look like a header often (arrays of small integers); past this the scan stops skipping
/// old records and only looks for new ones, which is bounded by the file's size.
const OLD_RECORD_MISS_BYTES_MAX: usize = 256 << 20;
/// Chunk of zeros written when zeroing a torn tail: 1 MiB.
pub(crate) const ZERO_CHUNK_BYTES: usize = 1024 * 1024;

/// The replay callback of `Journal::open`.
pub(crate) type OnRecord<'a> = dyn FnMut(Lsn, &[u8]) -> Result<(), String> + 'a;

pub(crate) struct Recovered {
    pub segments: Vec<SegmentInfo>,
    pub active: ActiveSegment,
    pub next_lsn: Lsn,
}

/// How reading a segment's records ended.
enum Stop {
    /// A zero length, or the end of the file exactly at a record boundary.
    End,
    /// Damaged or incomplete record.
    Bad(String),
}

pub(crate) fn recover(
    config: &JournalConfig,
    ops: &dyn FileOps,
    on_record: &mut OnRecord<'_>,
) -> Result<Recovered, JournalError> {
    let dir = &config.dir;
    std::fs::create_dir_all(dir).map_err(|e| JournalError::io(dir, e))?;

    let mut segment_files: Vec<(Lsn, PathBuf)> = Vec::new();
    let mut removed_tmp = false;
    // Leftover files are renamed out of the way at once and deleted by a background thread:
    // freeing a preallocated 64 MiB spare takes tens of milliseconds, and a shared-store
    // takeover (the dead master's spare is always left over) should not wait for it.
    let mut discards = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| JournalError::io(dir, e))? {
        let entry = entry.map_err(|e| JournalError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(base) = parse_segment_file_name(name) {
            segment_files.push((base, entry.path()));
        } else if name.ends_with(TMP_SUFFIX) {
            // A spare being prepared, or one that got its header but was never renamed: nothing
            // in it was reported durable.
            warn!(path = %entry.path().display(), "journal: removing leftover temporary file");
            let doomed = dir.join(format!(
                "{name}.{}-{}{DISCARD_SUFFIX}",
                std::process::id(),
                discards.len()
            ));
            ops.rename(&entry.path(), &doomed)
                .map_err(|e| JournalError::io(entry.path(), e))?;
            discards.push(doomed);
            removed_tmp = true;
        } else if name.ends_with(DISCARD_SUFFIX) {
            // Renamed for deletion by an earlier run that stopped before deleting it.
            discards.push(entry.path());
        }
    }
    if removed_tmp {
        ops.sync_dir(dir).map_err(|e| JournalError::io(dir, e))?;
    }
    if !discards.is_empty() {
        let spawned = std::thread::Builder::new()
            .name("haven-journal-discard".into())
            .spawn(move || {
                for path in discards {
                    if let Err(e) = std::fs::remove_file(&path) {
                        warn!(path = %path.display(), "journal: cannot delete a discarded file: {e}");
                    }
                }
            });
        if let Err(e) = spawned {
            warn!("journal: discarded files stay until the next start: {e}");
        }
    }
    segment_files.sort();

    if segment_files.is_empty() {
        info!(dir = %dir.display(), "journal: empty directory, creating first segment");
        let active = create_segment(config, ops, 1)?;
        return Ok(Recovered {
            segments: vec![SegmentInfo {
                base_lsn: 1,
                end_lsn: 1,
                bytes: active.write_pos,
                sealed: false,
            }],
            active,
            next_lsn: 1,
        });
    }

    let mut segments = Vec::with_capacity(segment_files.len());
    let mut expected: Option<(Lsn, PathBuf)> = None;
    let count = segment_files.len();
    let mut active = None;
    let mut next_lsn = 0;
    // (epoch, segment) of the newest epoch seen so far.
    let mut newest: Option<(u32, PathBuf)> = None;
    for (i, (name_base, path)) in segment_files.into_iter().enumerate() {
        let last = i + 1 == count;
        let (seg, end_lsn, epoch) = recover_segment(
            config,
            ops,
            &path,
            name_base,
            last,
            expected.as_ref(),
            on_record,
        )?;
        if let Some((newer, newer_path)) = &newest {
            if epoch < *newer {
                return Err(corrupt(
                    &path,
                    0,
                    format!(
                        "written by the master of epoch {epoch} after {} was written by the \
                         master of epoch {newer}: two masters wrote this journal",
                        newer_path.display()
                    ),
                ));
            }
        }
        if newest.as_ref().is_none_or(|(e, _)| epoch > *e) {
            newest = Some((epoch, path.clone()));
        }
        segments.push(SegmentInfo {
            base_lsn: name_base,
            end_lsn,
            bytes: seg.write_pos,
            sealed: !last,
        });
        expected = Some((end_lsn, path));
        if last {
            next_lsn = end_lsn;
            active = Some(seg);
        }
    }
    let mut active = active.expect("at least one segment");
    let (last_epoch, _) = newest.expect("at least one segment");
    if config.epoch < last_epoch {
        return Err(JournalError::StaleEpoch {
            mine: config.epoch,
            found: last_epoch,
        });
    }
    if config.epoch > last_epoch {
        // A new master: its records go in a segment of their own, so that anything a deposed
        // master might still write lands in the old segment, where the next recovery finds
        // it overlapping the new one (or, for a new segment of its own, the epochs out of
        // order) and refuses to start rather than interleave two masters' records.
        let last = segments.last_mut().expect("at least one segment");
        if last.end_lsn == last.base_lsn {
            ops.write_at(&active.file, &encode_header(last.base_lsn, config.epoch), 0)
                .map_err(|e| JournalError::io(&active.path, e))?;
            ops.sync_data(&active.file)
                .map_err(|e| JournalError::io(&active.path, e))?;
        } else {
            last.sealed = true;
            let spare = Spare::create_sparse(ops, dir, config.segment_bytes)
                .map_err(|(_, e)| JournalError::io(dir, e))?;
            active = spare
                .into_segment(ops, dir, next_lsn, config.epoch)
                .map_err(|(_, p, e)| JournalError::io(p, e))?;
            segments.push(SegmentInfo {
                base_lsn: next_lsn,
                end_lsn: next_lsn,
                bytes: active.write_pos,
                sealed: false,
            });
        }
        info!(dir = %dir.display(), epoch = config.epoch, previous = last_epoch,
            "journal: new master epoch; its records start a new segment");
    }
    info!(
        dir = %dir.display(),
        segments = segments.len(),
        next_lsn,
        "journal: recovered"
    );
    Ok(Recovered {
        segments,
        active,
        next_lsn,
    })
}

/// Creates the first segment of an empty directory, synchronously. Unless segments are
/// sparse, it is only `FIRST_SEGMENT_BYTES_MAX` long: zero-filling and flushing a whole 64 MiB
/// took 40-50 ms of a 48 ms start on the benchmark machine (and once 160 ms, past issue 9's
/// start-up target of 100 ms), all of it before the broker could serve; 4 MiB takes about 4 ms
/// (BENCHMARKS.md). The writer rolls over to a full-size spare when it is full, and that spare
/// is zero-filled between batches like every other, so no sync ever goes into a hole. (A hole
/// would be ready at once, but then each append's `fdatasync` also has to allocate blocks and
/// write file metadata, which is why non-sparse journals zero-fill at all.)
fn create_segment(
    config: &JournalConfig,
    ops: &dyn FileOps,
    base_lsn: Lsn,
) -> Result<ActiveSegment, JournalError> {
    let (dir, segment_bytes, epoch) = (&config.dir, config.segment_bytes, config.epoch);
    let mut spare = if config.sparse_segments {
        Spare::create_sparse(ops, dir, segment_bytes).map_err(|(_, e)| JournalError::io(dir, e))?
    } else {
        Spare::create(dir, segment_bytes.min(FIRST_SEGMENT_BYTES_MAX))
            .map_err(|e| JournalError::io(dir, e))?
    };
    let zeros = vec![0u8; ZERO_CHUNK_BYTES];
    spare
        .finish(ops, &zeros)
        .map_err(|(_, e)| JournalError::io(spare.path(), e))?;
    spare
        .into_segment(ops, dir, base_lsn, epoch)
        .map_err(|(_, p, e)| JournalError::io(p, e))
}

fn corrupt(segment: &Path, offset: u64, reason: impl Into<String>) -> JournalError {
    JournalError::Corrupt {
        segment: segment.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

/// Recovers one segment; returns it (positioned for appending), its end LSN and its epoch.
fn recover_segment(
    config: &JournalConfig,
    ops: &dyn FileOps,
    path: &Path,
    name_base: Lsn,
    last: bool,
    expected: Option<&(Lsn, PathBuf)>,
    on_record: &mut OnRecord<'_>,
) -> Result<(ActiveSegment, Lsn, u32), JournalError> {
    let io = |e| JournalError::io(path, e);
    let file = OpenOptions::new()
        .read(true)
        .write(last)
        .open(path)
        .map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();

    if let Some((expected_base, prev)) = expected {
        if name_base != *expected_base {
            return Err(corrupt(
                path,
                0,
                format!(
                    "LSN gap: previous segment {} ends before LSN {expected_base} but this segment starts at LSN {name_base}",
                    prev.display()
                ),
            ));
        }
    }

    // Header.
    let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
    let header_len = file_len.min(SEGMENT_HEADER_BYTES) as usize;
    file.read_exact_at(&mut header[..header_len], 0)
        .map_err(io)?;
    let header_zero = header.iter().all(|&b| b == 0);
    if header_zero && last {
        // Not produced by this writer (headers are synced before the rename), but a file system
        // that reorders may leave it; an empty last segment is harmless if nothing valid is in it.
        let scan = scan_for_valid(&file, SEGMENT_HEADER_BYTES, file_len, name_base).map_err(io)?;
        if let Some((offset, lsn)) = scan.valid {
            return Err(corrupt(
                path,
                0,
                format!(
                    "segment header is zero but a valid record LSN {lsn} is at offset {offset}"
                ),
            ));
        }
        warn!(path = %path.display(), "journal: last segment has a zero header; rewriting it as empty");
        ops.write_at(&file, &encode_header(name_base, config.epoch), 0)
            .map_err(io)?;
        let mut seg = active_segment(file, path, name_base, file_len, SEGMENT_HEADER_BYTES);
        end_tail(ops, &mut seg, scan.nonzero).map_err(io)?;
        return Ok((seg, name_base, config.epoch));
    }
    if header_len < SEGMENT_HEADER_BYTES as usize {
        return Err(corrupt(
            path,
            0,
            format!("segment shorter ({file_len} bytes) than its header"),
        ));
    }
    let (base, epoch) = decode_header(&header).map_err(|reason| corrupt(path, 0, reason))?;
    if base != name_base {
        return Err(corrupt(
            path,
            0,
            format!("segment header says base LSN {base}, file name says {name_base}"),
        ));
    }

    // Records.
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, &file);
    reader
        .seek(SeekFrom::Start(SEGMENT_HEADER_BYTES))
        .map_err(io)?;
    let mut pos = SEGMENT_HEADER_BYTES;
    let mut lsn = base;
    let mut payload = Vec::new();
    let stop = loop {
        let available = file_len - pos;
        if available == 0 {
            break Stop::End;
        }
        let mut hbytes = [0u8; RECORD_HEADER_BYTES];
        let hlen = available.min(RECORD_HEADER_BYTES as u64) as usize;
        reader.read_exact(&mut hbytes[..hlen]).map_err(io)?;
        let (h, total) = match frame(&hbytes[..hlen], available) {
            Frame::End => break Stop::End,
            Frame::Bad(reason) => break Stop::Bad(reason),
            Frame::Record {
                header,
                total_bytes,
            } => (header, total_bytes),
        };
        payload.resize(total - RECORD_HEADER_BYTES, 0);
        reader.read_exact(&mut payload).map_err(io)?;
        if !h.crc_matches(&payload) {
            break Stop::Bad(format!("CRC mismatch (record claims LSN {})", h.lsn));
        }
        if last && h.lsn < base {
            // The previous life of a recycled file: the log ends before it.
            break Stop::End;
        }
        if h.lsn != lsn {
            // A record that checks out but is not the next one: never a torn write.
            return Err(corrupt(
                path,
                pos,
                format!("LSN gap: expected LSN {lsn}, found {}", h.lsn),
            ));
        }
        on_record(lsn, &payload).map_err(JournalError::Replay)?;
        pos += total as u64;
        lsn += 1;
    };
    drop(reader);

    let mut tail_nonzero = true;
    match &stop {
        Stop::End if !last => {}
        Stop::Bad(reason) if !last => {
            return Err(corrupt(path, pos, format!("{reason} in a sealed segment")));
        }
        Stop::End | Stop::Bad(_) => {
            let bad = match &stop {
                Stop::Bad(reason) => Some(reason.clone()),
                Stop::End => None,
            };
            // The damaged record itself must not be found again: start one byte later.
            let from = if bad.is_some() { pos + 1 } else { pos };
            let scan = scan_for_valid(&file, from, file_len, lsn).map_err(io)?;
            // A damaged record's own bytes start before the scan did.
            tail_nonzero = bad.is_some() || scan.nonzero;
            if let Some((offset, found)) = scan.valid {
                let what = bad.as_deref().unwrap_or("end-of-log marker (zero length)");
                return Err(corrupt(
                    path,
                    pos,
                    format!("{what} followed by a valid record LSN {found} at offset {offset}"),
                ));
            }
            if let Some(reason) = &bad {
                warn!(
                    path = %path.display(),
                    offset = pos,
                    next_lsn = lsn,
                    "journal: torn tail ({reason}); truncating"
                );
            } else if scan.nonzero && scan.stale_records == 0 {
                warn!(
                    path = %path.display(),
                    offset = pos,
                    "journal: garbage after the end of the log; ending the log before it"
                );
            }
        }
    }

    let mut seg = active_segment(file, path, base, file_len, pos);
    if last {
        end_tail(ops, &mut seg, tail_nonzero).map_err(io)?;
    }
    Ok((seg, lsn, epoch))
}

fn active_segment(file: File, path: &Path, base: Lsn, file_len: u64, pos: u64) -> ActiveSegment {
    ActiveSegment {
        file,
        path: path.to_path_buf(),
        base_lsn: base,
        capacity_bytes: file_len,
        write_pos: pos,
        stale_tail: false,
    }
}

/// Makes the recovered last segment ready for appends: if anything after the log is not zero
/// (old records of a recycled file, or a torn tail), ends the log there with a marker and has
/// the writer end every batch with one. Rewriting the tail with zeros instead would cost up to
/// a whole segment's writes on every start and every shared-store takeover. A segment shorter
/// than `segment_bytes` (the first of a journal, a truncated file, or one written with a
/// smaller setting) keeps its length: the writer rolls over when it is full. Extending it here
/// would put a zero-fill of up to a whole segment back into every such start.
fn end_tail(ops: &dyn FileOps, seg: &mut ActiveSegment, tail_nonzero: bool) -> std::io::Result<()> {
    if tail_nonzero {
        seg.stale_tail = true;
        seg.end_log(ops)?;
        ops.sync_all(&seg.file)?;
    }
    Ok(())
}

struct Scan {
    /// First valid record found: (offset, lsn).
    valid: Option<(u64, Lsn)>,
    /// Whether any byte scanned (up to the valid record, if found) is not zero.
    nonzero: bool,
    /// Old records (valid, LSN below `lsn_min`) skipped: a recycled file's previous life.
    stale_records: u64,
}

/// Looks at every offset in `[from, file_len)` for a record with LSN >= `lsn_min` whose length
/// fits and whose CRC matches. Reads a window at a time; verifies candidates with positional
/// reads. Records are at least 16 bytes, which bounds the plausible LSNs.
///
/// A valid record with a lower LSN is an old one of a recycled file, and is skipped whole: a
/// newer record cannot start inside it without changing its bytes, and its CRC proves they are
/// unchanged. That keeps the scan of a recycled tail to about one CRC per old record rather
/// than a header check at each of up to 64 Mi offsets (an estimate: about 100 ms). What it may
/// spend on look-alikes is bounded by `OLD_RECORD_MISS_BYTES_MAX`.
fn scan_for_valid(file: &File, from: u64, file_len: u64, lsn_min: Lsn) -> std::io::Result<Scan> {
    let mut scan = Scan {
        valid: None,
        nonzero: false,
        stale_records: 0,
    };
    if from >= file_len {
        return Ok(scan);
    }
    let lsn_span = (file_len - from) / RECORD_HEADER_BYTES as u64 + 1;
    let mut window = vec![0u8; SCAN_WINDOW_BYTES];
    let mut payload = Vec::new();
    let mut at = from;
    // Offsets below this are inside an old record already verified.
    let mut skip_to = from;
    let mut old_miss_bytes = 0usize;
    while at < file_len {
        let n = (file_len - at).min(SCAN_WINDOW_BYTES as u64) as usize;
        file.read_exact_at(&mut window[..n], at)?;
        let w = &window[..n];
        let starts = n.saturating_sub(RECORD_HEADER_BYTES - 1);
        // A header starting in an all-zero window has a zero length unless it straddles the
        // window edge; the overlap below re-reads those offsets in the next window.
        let zero = all_zero(w);
        scan.nonzero |= !zero;
        for s in (0..starts).filter(|_| !zero) {
            let offset = at + s as u64;
            if offset < skip_to {
                continue;
            }
            let h = RecordHeader::decode(w[s..s + RECORD_HEADER_BYTES].try_into().unwrap());
            let Some(total) = h.encoded_bytes() else {
                continue;
            };
            let new = h.lsn >= lsn_min && h.lsn - lsn_min < lsn_span;
            // Only within the window (no extra read), and within the budget.
            let old = h.lsn != 0
                && h.lsn < lsn_min
                && s + total <= n
                && old_miss_bytes < OLD_RECORD_MISS_BYTES_MAX;
            if !(new || old) || offset + total as u64 > file_len {
                continue;
            }
            let body = match w.get(s + RECORD_HEADER_BYTES..s + total) {
                Some(body) => body,
                None => {
                    payload.resize(total - RECORD_HEADER_BYTES, 0);
                    file.read_exact_at(&mut payload, offset + RECORD_HEADER_BYTES as u64)?;
                    &payload
                }
            };
            if !h.crc_matches(body) {
                if !new {
                    old_miss_bytes += total;
                }
                continue;
            }
            if new {
                scan.valid = Some((offset, h.lsn));
                return Ok(scan);
            }
            scan.stale_records += 1;
            skip_to = offset + total as u64;
        }
        if at + n as u64 == file_len {
            break;
        }
        // Overlap so headers straddling the window edge are seen.
        at += starts.max(1) as u64;
    }
    Ok(scan)
}

/// Whether every byte is zero. OR-folds 64-byte blocks so the compiler can vectorise it: the
/// tail of the last segment (up to a whole segment of zeros) is scanned on every start and
/// every shared-store takeover, where a byte-at-a-time loop cost tens of milliseconds.
fn all_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(64);
    for block in &mut blocks {
        let mut acc = 0u64;
        for word in block.chunks_exact(8) {
            acc |= u64::from_ne_bytes(word.try_into().expect("8 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::all_zero;

    #[test]
    fn all_zero_sees_a_single_nonzero_byte_anywhere() {
        for len in [0usize, 1, 7, 63, 64, 65, 200, 4096] {
            let mut v = vec![0u8; len];
            assert!(all_zero(&v));
            for i in 0..len {
                v[i] = 1;
                assert!(!all_zero(&v), "len {len}, byte {i}");
                v[i] = 0;
            }
        }
    }
}
