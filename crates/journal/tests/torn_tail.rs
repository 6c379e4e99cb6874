//! A crash in the middle of the last write leaves a torn last record: recovery must return
//! exactly the records before it, accept new appends, and keep them across another restart.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;

const SEGMENT_BYTES: u64 = 64 * 1024;
const PAYLOAD_BYTES: usize = 40;
const RECORDS: u64 = 10;

/// Writes RECORDS records and returns (segment path, pristine bytes, last record range).
fn prepare(dir: &Path) -> (std::path::PathBuf, Vec<u8>, u64, u64) {
    let cfg = config(dir, SEGMENT_BYTES);
    let (mut j, records) = open(&cfg).unwrap();
    assert!(records.is_empty());
    append_until(&mut j, RECORDS + 1, PAYLOAD_BYTES);
    j.close().unwrap();
    let files = segment_files(dir);
    assert_eq!(files.len(), 1);
    let offsets = record_offsets(&files[0]);
    assert_eq!(offsets.len() as u64, RECORDS);
    let (start, total, lsn) = *offsets.last().unwrap();
    assert_eq!(lsn, RECORDS);
    let pristine = std::fs::read(&files[0]).unwrap();
    (files[0].clone(), pristine, start, start + total)
}

fn restore(dir: &Path, seg: &Path, pristine: &[u8]) {
    for e in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    std::fs::write(seg, pristine).unwrap();
}

/// Reopen after damage: exactly LSNs 1..RECORDS come back; new appends work and survive.
fn check_recovers_earlier_records(dir: &Path, what: &str) {
    let cfg = config(dir, SEGMENT_BYTES);
    let (mut j, records) = open(&cfg).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
    assert_records(&records, 1, RECORDS, PAYLOAD_BYTES);
    assert_eq!(j.next_lsn(), RECORDS, "{what}");
    append_until(&mut j, RECORDS + 3, PAYLOAD_BYTES);
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap_or_else(|e| panic!("{what}: second open failed: {e}"));
    assert_records(&records, 1, RECORDS + 3, PAYLOAD_BYTES);
    assert_eq!(j.next_lsn(), RECORDS + 3);
    j.close().unwrap();
}

#[test]
fn truncation_anywhere_in_the_last_record_loses_only_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, pristine, start, end) = prepare(dir.path());
    for offset in start..end {
        restore(dir.path(), &seg, &pristine);
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(offset)
            .unwrap();
        check_recovers_earlier_records(dir.path(), &format!("truncate at {offset}"));
    }
}

#[test]
fn flipped_byte_anywhere_in_the_last_record_loses_only_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, pristine, start, end) = prepare(dir.path());
    for offset in start..end {
        restore(dir.path(), &seg, &pristine);
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&[pristine[offset as usize] ^ 0xFF], offset)
            .unwrap();
        check_recovers_earlier_records(dir.path(), &format!("flip at {offset}"));
    }
}

#[test]
fn zeroed_tail_from_anywhere_in_the_last_record_loses_only_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, pristine, start, end) = prepare(dir.path());
    for offset in start..end {
        restore(dir.path(), &seg, &pristine);
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        let zeros = vec![0u8; (pristine.len() as u64 - offset) as usize];
        f.write_all_at(&zeros, offset).unwrap();
        check_recovers_earlier_records(dir.path(), &format!("zero from {offset}"));
    }
}

#[test]
fn garbage_after_the_end_of_the_log_is_ended_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, pristine, _start, end) = prepare(dir.path());
    restore(dir.path(), &seg, &pristine);
    let f = OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(&[0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef], end)
        .unwrap();
    f.write_all_at(&[0xab; 8], end + 4).unwrap();
    let cfg = config(dir.path(), SEGMENT_BYTES);
    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, RECORDS + 1, PAYLOAD_BYTES);
    // Appends go over the garbage, and each batch ends the log again.
    j.append(&payload(RECORDS + 1, 2));
    j.flush();
    j.close().unwrap();
    let bytes = std::fs::read(&seg).unwrap();
    let after = end as usize + 16 + 2;
    assert_eq!(
        bytes[after..after + 4],
        [0, 0, 0, 0],
        "an end-of-log marker"
    );
    let (j, records) = open(&cfg).unwrap();
    assert_eq!(records.len() as u64, RECORDS + 1);
    assert_eq!(
        records.last().unwrap(),
        &(RECORDS + 1, payload(RECORDS + 1, 2))
    );
    j.close().unwrap();
}
