//! Damage that is not a torn tail must be reported as Corrupt with the file and offset, never
//! skipped: records after it may have been acknowledged.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::*;

const PAYLOAD_BYTES: usize = 100;

fn flip(path: &std::path::Path, offset: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ 0x01], offset).unwrap();
}

#[test]
fn bad_record_followed_by_valid_records_in_last_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64 * 1024);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 11, PAYLOAD_BYTES);
    j.close().unwrap();
    let seg = &segment_files(dir.path())[0];
    let (offset, _, lsn) = record_offsets(seg)[4];
    assert_eq!(lsn, 5);
    flip(seg, offset + 20); // in the payload
    let (segment, at, reason) = expect_corrupt(open(&cfg));
    assert_eq!(&segment, seg);
    assert_eq!(at, offset);
    assert!(reason.contains("followed by a valid record"), "{reason}");
}

#[test]
fn zeroed_length_followed_by_valid_records_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64 * 1024);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 11, PAYLOAD_BYTES);
    j.close().unwrap();
    let seg = &segment_files(dir.path())[0];
    let (offset, _, _) = record_offsets(seg)[6];
    OpenOptions::new()
        .write(true)
        .open(seg)
        .unwrap()
        .write_all_at(&[0; 4], offset)
        .unwrap();
    let (segment, at, _) = expect_corrupt(open(&cfg));
    assert_eq!((&segment, at), (seg, offset));
}

#[test]
fn bad_record_in_a_sealed_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 101, PAYLOAD_BYTES);
    j.close().unwrap();
    let files = segment_files(dir.path());
    assert!(files.len() >= 3, "{files:?}");
    // The last record of the first segment: nothing valid follows it in that file.
    let (offset, _, _) = *record_offsets(&files[0]).last().unwrap();
    flip(&files[0], offset + 17);
    let (segment, at, reason) = expect_corrupt(open(&cfg));
    assert_eq!((&segment, at), (&files[0], offset));
    assert!(reason.contains("sealed"), "{reason}");
}

#[test]
fn missing_middle_segment_is_an_lsn_gap() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 101, PAYLOAD_BYTES);
    j.close().unwrap();
    let files = segment_files(dir.path());
    std::fs::remove_file(&files[1]).unwrap();
    let (segment, at, reason) = expect_corrupt(open(&cfg));
    assert_eq!((&segment, at), (&files[2], 0));
    assert!(reason.contains("LSN gap"), "{reason}");
}

#[test]
fn damaged_segment_header_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 3, PAYLOAD_BYTES);
    j.close().unwrap();
    let seg = &segment_files(dir.path())[0];
    flip(seg, 9);
    let (segment, at, _) = expect_corrupt(open(&cfg));
    assert_eq!((&segment, at), (seg, 0));
}

#[test]
fn replay_error_aborts_open() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 3, PAYLOAD_BYTES);
    j.close().unwrap();
    let result =
        haven_journal::Journal::open(
            cfg,
            |lsn, _| if lsn == 2 { Err("no".into()) } else { Ok(()) },
        );
    assert!(matches!(result, Err(haven_journal::JournalError::Replay(m)) if m == "no"));
}
