//! Helpers shared by the journal's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use haven_journal::{
    Journal, JournalConfig, JournalError, Lsn, RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES,
};

/// A reopened journal plus every record replayed by `open`.
pub type Opened = Result<(Journal, Vec<(Lsn, Vec<u8>)>), JournalError>;

pub fn config(dir: &Path, segment_bytes: u64) -> JournalConfig {
    JournalConfig {
        dir: dir.to_path_buf(),
        segment_bytes,
        batch_bytes_max: 1024 * 1024,
        epoch: 0,
        fence: None,
        sparse_segments: false,
        sync_writes: true,
        slow_sync_warn_ms: haven_journal::SLOW_SYNC_WARN_MS_DEFAULT,
    }
}

pub fn payload(lsn: Lsn, bytes: usize) -> Vec<u8> {
    (0..bytes).map(|i| (lsn as usize * 31 + i) as u8).collect()
}

/// Opens and returns the journal plus every replayed record.
pub fn open(config: &JournalConfig) -> Opened {
    let mut records = Vec::new();
    let journal = Journal::open(config.clone(), |lsn, p| {
        records.push((lsn, p.to_vec()));
        Ok(())
    })?;
    Ok((journal, records))
}

/// Appends records with `payload(lsn, bytes)` until next_lsn reaches `until` (exclusive).
pub fn append_until(journal: &mut Journal, until: Lsn, bytes: usize) {
    while journal.next_lsn() < until {
        let lsn = journal.next_lsn();
        assert_eq!(journal.append(&payload(lsn, bytes)), lsn);
    }
    journal.flush();
}

/// Asserts the replayed records are exactly LSNs `1..until` (or `from..until`) with the
/// standard payloads.
pub fn assert_records(records: &[(Lsn, Vec<u8>)], from: Lsn, until: Lsn, bytes: usize) {
    let lsns: Vec<Lsn> = records.iter().map(|r| r.0).collect();
    assert_eq!(lsns, (from..until).collect::<Vec<_>>());
    for (lsn, p) in records {
        assert_eq!(p, &payload(*lsn, bytes), "payload of LSN {lsn}");
    }
}

pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

/// (offset, encoded bytes, lsn) of every record in a healthy segment file.
pub fn record_offsets(path: &Path) -> Vec<(u64, u64, Lsn)> {
    let bytes = std::fs::read(path).unwrap();
    let mut at = SEGMENT_HEADER_BYTES as usize;
    let mut out = Vec::new();
    while at + RECORD_HEADER_BYTES <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        let lsn = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        let total = 8 + len;
        out.push((at as u64, total as u64, lsn));
        at += total;
    }
    out
}

pub fn expect_corrupt(result: Opened) -> (PathBuf, u64, String) {
    match result {
        Err(JournalError::Corrupt {
            segment,
            offset,
            reason,
        }) => (segment, offset, reason),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(_) => panic!("expected Corrupt, open succeeded"),
    }
}

/// Waits until `lsn` is the journal's durable LSN (30 s at most: a hang, not a speed bound).
pub fn wait_durable(j: &Journal, lsn: Lsn) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while j.durable_lsn() != Ok(lsn) {
        assert!(
            std::time::Instant::now() < deadline,
            "LSN {lsn} never durable"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
