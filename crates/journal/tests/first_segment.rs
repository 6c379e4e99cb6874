//! A new journal's first segment is short (`FIRST_SEGMENT_BYTES_MAX`), so a broker on an empty
//! store serves without zero-filling a whole segment first. It fills and rolls over like any
//! other, keeps its length across restarts, and a record too large for it goes to the next.

mod common;

use common::*;
use haven_journal::FIRST_SEGMENT_BYTES_MAX;

const SEGMENT_BYTES: u64 = 4 * FIRST_SEGMENT_BYTES_MAX;
const RECORD_BYTES: usize = 1000;

fn file_sizes(dir: &std::path::Path) -> Vec<u64> {
    segment_files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect()
}

/// Records of `RECORD_BYTES` that fill `bytes` of segment space, headers included.
fn records_for(bytes: u64) -> u64 {
    bytes / (RECORD_BYTES as u64 + haven_journal::RECORD_HEADER_BYTES as u64)
}

#[test]
fn the_first_segment_is_short_and_rolls_over_to_full_size_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SEGMENT_BYTES);
    let (mut j, records) = open(&cfg).unwrap();
    assert!(records.is_empty());
    assert_eq!(file_sizes(dir.path()), vec![FIRST_SEGMENT_BYTES_MAX]);

    // Half the first segment, then a restart: it keeps its length and its records.
    let half = records_for(FIRST_SEGMENT_BYTES_MAX / 2);
    append_until(&mut j, half, RECORD_BYTES);
    j.close().unwrap();
    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, half, RECORD_BYTES);
    assert_eq!(file_sizes(dir.path()), vec![FIRST_SEGMENT_BYTES_MAX]);

    // Past its end: the next segment is full size, and nothing is lost at the boundary.
    let past = records_for(FIRST_SEGMENT_BYTES_MAX * 3 / 2);
    append_until(&mut j, past, RECORD_BYTES);
    j.close().unwrap();
    assert_eq!(
        file_sizes(dir.path()),
        vec![FIRST_SEGMENT_BYTES_MAX, SEGMENT_BYTES]
    );
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, past, RECORD_BYTES);
    let segments = j.segments();
    assert!(segments[0].sealed && !segments[1].sealed, "{segments:?}");
    assert_eq!(segments[0].end_lsn, segments[1].base_lsn);
    j.close().unwrap();
}

#[test]
fn a_record_larger_than_the_first_segment_goes_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SEGMENT_BYTES);
    let big = FIRST_SEGMENT_BYTES_MAX as usize + 1000;
    assert!(big <= cfg.record_bytes_max(), "the journal accepts it");
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 3, 100);
    assert_eq!(j.append(&payload(3, big)), 3);
    append_until(&mut j, 5, 100);
    j.close().unwrap();
    assert_eq!(
        file_sizes(dir.path()),
        vec![FIRST_SEGMENT_BYTES_MAX, SEGMENT_BYTES]
    );
    let (j, records) = open(&cfg).unwrap();
    let lsns: Vec<_> = records.iter().map(|r| r.0).collect();
    assert_eq!(lsns, vec![1, 2, 3, 4]);
    assert_eq!(records[2].1, payload(3, big));
    assert_eq!(records[3].1, payload(4, 100));
    assert_eq!(
        j.segments()[1].base_lsn,
        3,
        "the big record starts the second segment"
    );
    j.close().unwrap();
}

/// The very first record too large for the first segment: the writer rolls over from a
/// segment that holds nothing to one with the same base LSN, hence the same file name, which
/// replaces it. Before the fix the empty one stayed listed as sealed, so the first release
/// deleted the new active segment's file: a broker whose first message was over 4 MiB
/// crashed ("never delete the active segment") about two seconds later.
#[test]
fn a_first_record_larger_than_the_first_segment_replaces_the_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SEGMENT_BYTES);
    let big = FIRST_SEGMENT_BYTES_MAX as usize + 1000;
    let (mut j, _) = open(&cfg).unwrap();
    assert_eq!(j.append(&payload(1, big)), 1);
    append_until(&mut j, 3, 100);
    wait_durable(&j, 2);
    let segments = j.segments();
    assert_eq!(
        segments.len(),
        1,
        "one segment, not an empty one before it: {segments:?}"
    );
    assert!(!segments[0].sealed);
    assert_eq!(file_sizes(dir.path()), vec![SEGMENT_BYTES]);
    // Nothing sealed, so nothing to release, whatever is no longer needed.
    assert_eq!(j.release_before(3), 0);
    append_until(&mut j, 4, 100);
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap();
    let lsns: Vec<_> = records.iter().map(|r| r.0).collect();
    assert_eq!(lsns, vec![1, 2, 3]);
    assert_eq!(records[0].1, payload(1, big));
    j.close().unwrap();
}
