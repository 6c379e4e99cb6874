//! LSNs continue across restarts, rolled segments and released segments.

mod common;

use common::*;

const PAYLOAD_BYTES: usize = 300;

#[test]
fn lsns_continue_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64 * 1024);
    let (mut j, records) = open(&cfg).unwrap();
    assert!(records.is_empty());
    assert_eq!(j.next_lsn(), 1);
    assert_eq!(j.durable_lsn(), Ok(0));
    append_until(&mut j, 6, PAYLOAD_BYTES);
    j.close().unwrap();
    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, 6, PAYLOAD_BYTES);
    assert_eq!(j.durable_lsn(), Ok(5));
    assert_eq!(j.append(&payload(6, PAYLOAD_BYTES)), 6);
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, 7, PAYLOAD_BYTES);
    j.close().unwrap();
}

#[test]
fn lsns_continue_across_rolled_segments() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    // Several flushes so rolling happens inside and between batches.
    for until in [5, 17, 18, 41] {
        append_until(&mut j, until, PAYLOAD_BYTES);
    }
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, 1, 41, PAYLOAD_BYTES);
    let segments = j.segments();
    assert!(segments.len() >= 3, "{segments:?}");
    assert_eq!(segments[0].base_lsn, 1);
    for w in segments.windows(2) {
        assert_eq!(w[0].end_lsn, w[1].base_lsn);
        assert!(w[0].sealed);
    }
    let last = segments.last().unwrap();
    assert!(!last.sealed);
    assert_eq!(last.end_lsn, 41);
    // Each segment's records are in the file named for its base LSN.
    for (s, f) in segments.iter().zip(segment_files(dir.path())) {
        assert_eq!(
            f.file_name().unwrap().to_str().unwrap(),
            haven_journal::segment_file_name(s.base_lsn)
        );
        let lsns: Vec<_> = record_offsets(&f).iter().map(|r| r.2).collect();
        assert_eq!(lsns, (s.base_lsn..s.end_lsn).collect::<Vec<_>>());
    }
    j.close().unwrap();
}

#[test]
fn release_before_deletes_only_whole_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 41, PAYLOAD_BYTES);
    // Wait for durability so the segment list is final.
    j.close().unwrap();
    let (mut j, _) = open(&cfg).unwrap();
    let segments = j.segments();
    assert!(segments.len() >= 4, "{segments:?}");
    // An LSN inside the third segment releases the first two only.
    let inside_third = segments[2].base_lsn + 1;
    assert_eq!(j.release_before(inside_third), 2);
    assert_eq!(j.segments(), segments[2..].to_vec());
    assert_eq!(j.release_before(inside_third), 0);
    j.close().unwrap();
    assert_eq!(segment_files(dir.path()).len(), segments.len() - 2);
    let (j, records) = open(&cfg).unwrap();
    assert_records(&records, segments[2].base_lsn, 41, PAYLOAD_BYTES);
    j.close().unwrap();
}

#[test]
fn lsns_continue_after_everything_is_released_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 4096);
    let (mut j, _) = open(&cfg).unwrap();
    append_until(&mut j, 41, PAYLOAD_BYTES);
    let mut rx = j.durable();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(rx.wait_for(|d| d.as_ref().is_ok_and(|&l| l == 40)))
        .unwrap();
    let segments = j.segments();
    let released = j.release_before(u64::MAX);
    assert_eq!(released, segments.len() - 1, "all but the active segment");
    let active = j.segments();
    assert_eq!(active.len(), 1);
    assert!(!active[0].sealed);
    j.close().unwrap();
    assert_eq!(segment_files(dir.path()).len(), 1);

    let (mut j, records) = open(&cfg).unwrap();
    assert_records(&records, active[0].base_lsn, 41, PAYLOAD_BYTES);
    assert_eq!(j.next_lsn(), 41);
    append_until(&mut j, 60, PAYLOAD_BYTES);
    j.release_before(u64::MAX);
    j.close().unwrap();
    let (j, records) = open(&cfg).unwrap();
    assert_eq!(records.last().unwrap().0, 59);
    assert_eq!(j.next_lsn(), 60);
    j.close().unwrap();
}
