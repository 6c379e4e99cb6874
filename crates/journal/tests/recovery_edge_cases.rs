//! Recovery of the states a crash can leave besides a torn record.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::*;
use haven_journal::{Journal, JournalConfig, JournalError};

#[test]
fn empty_dir_is_created_and_starts_at_lsn_1() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("a/b"), 4096);
    let (mut j, records) = open(&cfg).unwrap();
    assert!(records.is_empty());
    assert_eq!(j.append(b"x"), 1);
    j.close().unwrap();
    assert_eq!(segment_files(&cfg.dir).len(), 1);
}

#[test]
fn leftover_spare_from_a_crash_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 4, 10);
    j.close().unwrap();
    // A spare half-filled, or one that got a header and records but was never renamed.
    std::fs::write(dir.path().join("spare.tmp"), vec![7u8; 1000]).unwrap();
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, 4, 10);
    j.close().unwrap();
    assert!(!dir.path().join("spare.tmp").exists());
}

#[test]
fn last_segment_without_records_keeps_its_base() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 30, 300);
    j.close().unwrap();
    // Zero every record of the last segment: as if the crash came right after rolling over.
    let files = segment_files(dir.path());
    let last = files.last().unwrap();
    let base = j_base(last);
    let f = OpenOptions::new().write(true).open(last).unwrap();
    f.write_all_at(&vec![0u8; 4096 - 24], 24).unwrap();
    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, base, 300);
    assert_eq!(j.next_lsn(), base);
    append_until(&mut j, base + 1, 300);
    j.close().unwrap();
}

#[test]
fn last_segment_entirely_zero_is_an_empty_segment() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 30, 300);
    j.close().unwrap();
    let files = segment_files(dir.path());
    let last = files.last().unwrap();
    let base = j_base(last);
    std::fs::write(last, vec![0u8; 4096]).unwrap();
    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, base, 300);
    append_until(&mut j, base + 2, 300);
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, base + 2, 300);
    j.close().unwrap();
}

#[test]
fn invalid_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = JournalConfig::new(dir.path());
    cfg.segment_bytes = 100;
    assert!(matches!(
        Journal::open(cfg, |_, _| Ok(())),
        Err(JournalError::Config(_))
    ));
}

#[test]
fn fdatasync_probe_reports_each_latency() {
    let dir = tempfile::tempdir().unwrap();
    let latencies = haven_journal::fdatasync_probe(dir.path(), 5, 4096);
    assert_eq!(latencies.len(), 5);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "probe file removed"
    );
}

fn j_base(path: &std::path::Path) -> u64 {
    path.file_stem().unwrap().to_str().unwrap().parse().unwrap()
}
