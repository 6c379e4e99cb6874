//! Released segments are recycled as spares instead of deleted, so they still hold their
//! previous life's records after the log. Those must never be replayed, must not stop a start
//! after a crash, and must not hide real corruption.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use haven_journal::{Journal, JournalConfig, Lsn};

const SEGMENT_BYTES: u64 = 64 * 1024;
const PAYLOAD_BYTES: usize = 1000;
/// How long the writer thread gets to act on a release.
const WAIT_MS: u64 = 10_000;

fn recycled_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("recycled-"))
        })
        .collect();
    files.sort();
    files
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Fills several segments, releases all but the last two, lets the writer recycle two of the
/// released files, then appends until it has rolled over into both. Returns the config and the
/// first live LSN; the journal is closed.
fn journal_with_recycled_segments(dir: &Path) -> (JournalConfig, Lsn) {
    let cfg = config(dir, SEGMENT_BYTES);
    let (mut j, records) = open(&cfg).unwrap();
    assert!(records.is_empty());
    append_until(&mut j, 400, PAYLOAD_BYTES);
    wait_durable(&j, 399);
    let live = j.segments()[j.segments().len() - 2].base_lsn;
    assert!(j.release_before(live) >= 3, "several segments released");
    // The writer recycles two of the released files and deletes the others; both happen on
    // its thread, and counting segment files before the deletes land (a slow machine, CI
    // 2026-12-02) counted one too many.
    wait_for(
        "two recycled files, the other released ones deleted",
        || recycled_files(dir).len() == 2 && segment_files(dir).len() == j.segments().len(),
    );
    let before = segment_files(dir).len();
    append_until(&mut j, 400 + 2 * 64, PAYLOAD_BYTES);
    wait_durable(&j, 400 + 2 * 64 - 1);
    assert!(
        recycled_files(dir).is_empty(),
        "both recycled files became segments"
    );
    assert_eq!(segment_files(dir).len(), before + 2);
    j.close().unwrap();
    (cfg, live)
}

fn wait_durable(j: &Journal, lsn: Lsn) {
    wait_for("durability", || j.durable_lsn().unwrap() >= lsn);
}

/// (offset of the end of the log, bytes) of a segment file.
fn log_end(path: &Path) -> (u64, Vec<u8>) {
    let (at, total, _) = *record_offsets(path).last().unwrap();
    (at + total, std::fs::read(path).unwrap())
}

fn write_at(path: &Path, bytes: &[u8], offset: u64) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// An encoded record, as the journal writes it.
fn encode(lsn: Lsn, payload: &[u8]) -> Vec<u8> {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&lsn.to_le_bytes()), payload);
    let mut out = Vec::new();
    out.extend_from_slice(&((8 + payload.len()) as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

#[test]
fn recycled_segments_replay_only_their_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, live) = journal_with_recycled_segments(dir.path());
    // The new segments really are recycled: old bytes follow their log's end-of-log marker.
    let last = segment_files(dir.path()).pop().unwrap();
    let (end, bytes) = log_end(&last);
    assert_eq!(bytes[end as usize..end as usize + 4], [0, 0, 0, 0]);
    assert!(
        bytes[end as usize + 4..].iter().any(|&b| b != 0),
        "the tail holds old records"
    );
    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, live, 400 + 2 * 64, PAYLOAD_BYTES);
    // The recycled segment is appended to across a restart, and replays again.
    append_until(&mut j, 600, PAYLOAD_BYTES);
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, live, 600, PAYLOAD_BYTES);
    j.close().unwrap();
}

#[test]
fn an_old_record_where_the_end_marker_was_lost_ends_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, live) = journal_with_recycled_segments(dir.path());
    let segments = segment_files(dir.path());
    let last = segments.last().unwrap();
    let (end, _) = log_end(last);
    // A crash before the marker's write reached the disk leaves whatever was there: here, an
    // intact record of the file's previous life (an LSN below the segment's base).
    let old = encode(live - 1, &payload(live - 1, 40));
    write_at(last, &old, end);
    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, live, 400 + 2 * 64, PAYLOAD_BYTES);
    append_until(&mut j, 400 + 2 * 64 + 3, PAYLOAD_BYTES);
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, live, 400 + 2 * 64 + 3, PAYLOAD_BYTES);
    j.close().unwrap();
}

#[test]
fn a_torn_record_over_old_bytes_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, live) = journal_with_recycled_segments(dir.path());
    let last = segment_files(dir.path()).pop().unwrap();
    let (end, _) = log_end(&last);
    // The first half of a new record reached the disk; the old bytes follow it.
    // (Not `payload`'s bytes: they repeat every 256 LSNs, so the old record at this offset
    // would complete it.)
    let torn = encode(400 + 2 * 64, &[0x5a; PAYLOAD_BYTES]);
    write_at(&last, &torn[..torn.len() / 2], end);
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, live, 400 + 2 * 64, PAYLOAD_BYTES);
    j.close().unwrap();
}

#[test]
fn a_record_after_the_end_with_a_newer_lsn_is_still_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _live) = journal_with_recycled_segments(dir.path());
    let last = segment_files(dir.path()).pop().unwrap();
    let (end, bytes) = log_end(&last);
    let next = 400 + 2 * 64;
    // Beyond the marker, past several old records, a valid record the log should have reached:
    // data that was durable behind a damaged stretch. The scan must not skip over it.
    let far = (bytes.len() as u64 - 4096).max(end + 2048);
    write_at(&last, &encode(next + 1, &payload(next + 1, 40)), far);
    let (_, offset, reason) = expect_corrupt(open(&cfg));
    assert_eq!(offset, end, "{reason}");
    assert!(reason.contains("followed by a valid record"), "{reason}");
}

#[test]
fn an_old_record_at_the_end_of_a_sealed_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, live) = journal_with_recycled_segments(dir.path());
    let segments = segment_files(dir.path());
    let sealed = &segments[segments.len() - 2];
    let (end, _) = log_end(sealed);
    // A sealed segment's last batch always ended the log with a marker that was synced before
    // the next segment existed; an old record there means bytes changed after the fact.
    write_at(sealed, &encode(live - 1, &payload(live - 1, 8)), end);
    let (segment, offset, reason) = expect_corrupt(open(&cfg));
    assert_eq!((&segment, offset), (sealed, end), "{reason}");
}

#[test]
fn a_reader_holding_a_recycled_file_open_still_reads_the_right_records() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SEGMENT_BYTES);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 100, PAYLOAD_BYTES);
    wait_durable(&j, 99);
    // The reader lists segments 1 and 65 and keeps 65 open: as far as it knows, the newest.
    let mut reader = j.reader().unwrap();
    assert_eq!(reader.read(70).unwrap(), payload(70, PAYLOAD_BYTES));
    append_until(&mut j, 400, PAYLOAD_BYTES);
    wait_durable(&j, 399);
    let live = j.segments()[j.segments().len() - 2].base_lsn;
    j.release_before(live);
    // The two oldest released files (1 and 65) are kept, and the writer rolls into them.
    wait_for("two recycled files", || {
        recycled_files(dir.path()).len() == 2
    });
    let end = 400 + 2 * 64;
    append_until(&mut j, end, PAYLOAD_BYTES);
    wait_durable(&j, end - 1);
    assert!(recycled_files(dir.path()).is_empty());
    // Segment 65's file, still open in the reader, now holds the newest records.
    for lsn in (live..end).rev().step_by(7) {
        let read = reader
            .read(lsn)
            .unwrap_or_else(|e| panic!("LSN {lsn}: {e}"));
        assert_eq!(read, payload(lsn, PAYLOAD_BYTES), "LSN {lsn}");
    }
    j.close().unwrap();
}

#[test]
fn look_alike_old_headers_do_not_hide_a_newer_record() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _live) = journal_with_recycled_segments(dir.path());
    let last = segment_files(dir.path()).pop().unwrap();
    let (end, bytes) = log_end(&last);
    // After the marker: bytes that look like an old record's header every 16 bytes (a valid
    // length, an LSN below the base, a wrong CRC), each costing the scan a CRC; then a valid
    // record the log should have reached, which must still be found.
    let mut fake = Vec::new();
    while fake.len() < 32 * 1024 {
        fake.extend_from_slice(&16_000u32.to_le_bytes());
        fake.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        fake.extend_from_slice(&7u64.to_le_bytes());
    }
    write_at(&last, &fake, end + 4);
    let next = 400 + 2 * 64;
    let far = (bytes.len() as u64 - 4096).max(end + 4 + fake.len() as u64 + 64);
    write_at(&last, &encode(next + 1, &payload(next + 1, 40)), far);
    let (_, offset, reason) = expect_corrupt(open(&cfg));
    assert_eq!(offset, end, "{reason}");
    assert!(reason.contains("followed by a valid record"), "{reason}");
}
