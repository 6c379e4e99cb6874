//! Reading durable records back by LSN: every record comes back whole and checked, in any
//! order, across segments, while the writer appends and rolls over, and released or damaged
//! records are errors, never wrong data.
//!
//! Most tests run twice: with the default limits (1 MiB chunk, so small segments fit in one
//! chunk) and with tiny ones (records straddle chunk edges, most records are "larger than the
//! chunk", the index is dense and only two files stay open).

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use haven_journal::{Journal, JournalError, Lsn, Reader, ReaderLimits};

fn tiny_limits() -> ReaderLimits {
    ReaderLimits {
        chunk_bytes: 100,
        index_stride_records: 3,
        segments_open_max: 2,
    }
}

fn both_limits() -> [ReaderLimits; 2] {
    [ReaderLimits::default(), tiny_limits()]
}

/// Payload sizes vary with the LSN (0 to 299 bytes) so records straddle chunk edges everywhere.
fn size_of(lsn: Lsn) -> usize {
    (lsn as usize * 37) % 300
}

/// Appends `payload(lsn, size_of(lsn))` until next_lsn reaches `until` (exclusive), flushes.
fn append_varied_until(j: &mut Journal, until: Lsn) {
    while j.next_lsn() < until {
        let lsn = j.next_lsn();
        assert_eq!(j.append(&payload(lsn, size_of(lsn))), lsn);
    }
    j.flush();
}

fn wait_durable(j: &Journal, lsn: Lsn) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while j.durable_lsn().expect("writer healthy") < lsn {
        assert!(Instant::now() < deadline, "LSN {lsn} never became durable");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn assert_reads(reader: &mut Reader, lsn: Lsn, what: &str) {
    match reader.read(lsn) {
        Ok(p) => assert!(
            p == payload(lsn, size_of(lsn)),
            "{what}: wrong payload for LSN {lsn} ({} bytes)",
            p.len()
        ),
        Err(e) => panic!("{what}: reading LSN {lsn}: {e}"),
    }
}

fn assert_not_found(result: Result<Vec<u8>, JournalError>, lsn: Lsn) {
    match result {
        Err(JournalError::NotFound { lsn: l }) => assert_eq!(l, lsn),
        Err(e) => panic!("LSN {lsn}: expected NotFound, got {e}"),
        Ok(p) => panic!("LSN {lsn}: expected NotFound, read {} bytes", p.len()),
    }
}

fn expect_corrupt_read(result: Result<Vec<u8>, JournalError>) -> (std::path::PathBuf, u64, String) {
    match result {
        Err(JournalError::Corrupt {
            segment,
            offset,
            reason,
        }) => (segment, offset, reason),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(p) => panic!("expected Corrupt, read {} bytes", p.len()),
    }
}

/// A deterministic permutation (xorshift Fisher-Yates); the seed is in every failure message.
fn shuffled(mut v: Vec<Lsn>, seed: u64) -> Vec<Lsn> {
    let mut x = seed;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn flip(path: &Path, offset: u64) {
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
fn every_record_reads_back_in_order_and_at_random_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 4096)).unwrap();
    append_varied_until(&mut j, 601);
    j.close().unwrap();
    assert!(segment_files(dir.path()).len() >= 10);
    let all: Vec<Lsn> = (1..=600).collect();
    for limits in both_limits() {
        let what = format!("{limits:?}");
        let mut reader = Reader::open_with_limits(dir.path(), limits.clone()).unwrap();
        for &lsn in &all {
            assert_reads(&mut reader, lsn, &what);
        }
        // Every segment was listed at open: an ascending run never lists the directory again.
        assert_eq!(reader.stats().dir_listings, 1, "{what}");
        for seed in [1, 0x9e37_79b9_7f4a_7c15] {
            let what = format!("{limits:?} seed {seed:#x}");
            for lsn in shuffled(all.clone(), seed) {
                assert_reads(&mut reader, lsn, &what);
            }
            let mut fresh = Reader::open_with_limits(dir.path(), limits.clone()).unwrap();
            for lsn in shuffled(all.clone(), seed) {
                assert_reads(&mut fresh, lsn, &what);
            }
        }
        for &lsn in all.iter().rev() {
            assert_reads(&mut reader, lsn, &what);
        }
    }
}

#[test]
fn ascending_reads_cost_one_pread_per_chunk() {
    const PAYLOAD_BYTES: usize = 1000;
    const RECORDS: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 8 * 1024 * 1024)).unwrap();
    append_until(&mut j, RECORDS + 1, PAYLOAD_BYTES);
    j.close().unwrap();
    assert_eq!(segment_files(dir.path()).len(), 1);
    let mut reader = Reader::open(dir.path()).unwrap();
    for lsn in 1..=RECORDS {
        assert_eq!(reader.read(lsn).unwrap(), payload(lsn, PAYLOAD_BYTES));
    }
    // Each fill starts at a record boundary, so it brings at least a chunk minus one record of
    // new bytes.
    let record_bytes = (16 + PAYLOAD_BYTES) as u64;
    let chunk_bytes = ReaderLimits::default().chunk_bytes as u64;
    let fills_max = RECORDS * record_bytes / (chunk_bytes - record_bytes) + 1;
    let stats = reader.stats();
    assert!(
        stats.chunk_reads <= fills_max,
        "{stats:?}, expected at most {fills_max} chunk reads"
    );
    assert_eq!(stats.large_record_reads, 0);
    assert_eq!(stats.dir_listings, 1);
}

#[test]
fn records_larger_than_the_read_chunk_come_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 8 * 1024 * 1024)).unwrap();
    let max = j.record_bytes_max();
    let chunk = ReaderLimits::default().chunk_bytes;
    assert!(max > 3 * chunk, "record_bytes_max {max}");
    let sizes = [
        10,
        3 * chunk,
        chunk + 7,
        0,
        chunk,
        chunk - 16, // exactly one chunk with its header
        chunk - 15, // one byte more than a chunk with its header
        max,
        20,
        2 * chunk + 1,
    ];
    let mut expected = Vec::new();
    for &size in &sizes {
        let lsn = j.next_lsn();
        j.append(&payload(lsn, size));
        expected.push((lsn, size));
    }
    j.flush();
    wait_durable(&j, expected.last().unwrap().0);
    assert!(j.segments().len() >= 2, "the largest records roll over");
    for limits in both_limits() {
        let what = format!("{limits:?}");
        let mut reader = Reader::open_with_limits(dir.path(), limits.clone()).unwrap();
        let order: Vec<_> = expected
            .iter()
            .chain(expected.iter().rev())
            .chain(
                shuffled((0..expected.len() as u64).collect(), 7)
                    .iter()
                    .map(|&i| &expected[i as usize]),
            )
            .collect();
        for &&(lsn, size) in &order {
            let p = reader
                .read(lsn)
                .unwrap_or_else(|e| panic!("{what}: LSN {lsn}: {e}"));
            assert!(p == payload(lsn, size), "{what}: LSN {lsn} of {size} bytes");
        }
        assert!(reader.stats().large_record_reads > 0, "{what}");
    }
    j.close().unwrap();
}

#[test]
fn reader_follows_the_writer_into_new_segments() {
    for limits in both_limits() {
        let what = format!("{limits:?}");
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = open(&config(dir.path(), 4096)).unwrap();
        append_varied_until(&mut j, 6);
        wait_durable(&j, 5);
        assert_eq!(j.segments().len(), 1);
        let mut reader = Reader::open_with_limits(dir.path(), limits).unwrap();
        for lsn in 1..=5 {
            assert_reads(&mut reader, lsn, &what);
        }
        append_varied_until(&mut j, 121);
        wait_durable(&j, 120);
        let segments = j.segments();
        assert!(segments.len() >= 5, "{segments:?}");
        for lsn in 6..=120 {
            assert_reads(&mut reader, lsn, &what);
        }
        // Each rolled segment is found by one listing at most, not one per read.
        let listings = reader.stats().dir_listings;
        assert!(
            listings <= segments.len() as u64,
            "{what}: {listings} listings"
        );
        for s in &segments {
            assert_reads(&mut reader, s.base_lsn, &what);
            assert_reads(&mut reader, s.end_lsn - 1, &what);
        }
        assert_not_found(reader.read(121), 121);
        j.close().unwrap();
    }
}

#[test]
fn released_lsns_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 4096)).unwrap();
    append_until(&mut j, 61, 300);
    wait_durable(&j, 60);
    let mut old_reader = j.reader().unwrap();
    assert_eq!(old_reader.read(1).unwrap(), payload(1, 300));
    let segments = j.segments();
    assert!(segments.len() >= 4, "{segments:?}");
    let kept = segments[2].base_lsn;
    assert_eq!(j.release_before(kept), 2);
    // The writer thread deletes the files.
    let deadline = Instant::now() + Duration::from_secs(30);
    while segment_files(dir.path()).len() != segments.len() - 2 {
        assert!(Instant::now() < deadline, "released segments never deleted");
        std::thread::sleep(Duration::from_millis(1));
    }

    let mut reader = j.reader().unwrap();
    for lsn in [1, segments[1].base_lsn, kept - 1] {
        assert_not_found(reader.read(lsn), lsn);
    }
    assert_not_found(reader.read(0), 0);
    assert_eq!(reader.read(kept).unwrap(), payload(kept, 300));
    assert_eq!(reader.read(60).unwrap(), payload(60, 300));

    // A reader that still has a released file open may serve it until it lists the directory
    // again, on a miss: here a new segment it has not seen.
    append_until(&mut j, 81, 300);
    wait_durable(&j, 80);
    assert!(j.segments().last().unwrap().base_lsn > segments.last().unwrap().base_lsn);
    assert_eq!(old_reader.read(80).unwrap(), payload(80, 300));
    assert_not_found(old_reader.read(1), 1);
    assert_eq!(old_reader.read(kept).unwrap(), payload(kept, 300));
    j.close().unwrap();
}

#[test]
fn damaged_payload_is_reported_corrupt_not_returned() {
    for limits in both_limits() {
        let what = format!("{limits:?}");
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = open(&config(dir.path(), 64 * 1024)).unwrap();
        append_varied_until(&mut j, 21);
        j.close().unwrap();
        let seg = &segment_files(dir.path())[0];
        let (offset, total, lsn) = record_offsets(seg)[6];
        assert_eq!(lsn, 7);
        assert!(total > 20);
        flip(seg, offset + total - 3); // in the payload

        let mut reader = Reader::open_with_limits(dir.path(), limits).unwrap();
        let (segment, at, reason) = expect_corrupt_read(reader.read(7));
        assert_eq!((&segment, at), (seg, offset), "{what}");
        assert!(reason.contains("CRC mismatch"), "{what}: {reason}");
        // Its neighbours are intact, and the damage is reported again, not cached away.
        for lsn in [6, 8, 20, 1] {
            assert_reads(&mut reader, lsn, &what);
        }
        expect_corrupt_read(reader.read(7));
    }
}

#[test]
fn damaged_framing_is_reported_corrupt_on_the_way_to_a_later_record() {
    for limits in both_limits() {
        let what = format!("{limits:?}");
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = open(&config(dir.path(), 64 * 1024)).unwrap();
        append_varied_until(&mut j, 21);
        j.close().unwrap();
        let seg = &segment_files(dir.path())[0];
        let (offset, _, _) = record_offsets(seg)[6];
        flip(seg, offset + 8); // the LSN in record 7's header

        let mut reader = Reader::open_with_limits(dir.path(), limits).unwrap();
        assert_reads(&mut reader, 6, &what);
        let (segment, at, reason) = expect_corrupt_read(reader.read(15));
        assert_eq!((&segment, at), (seg, offset), "{what}");
        assert!(reason.contains("LSN gap"), "{what}: {reason}");
    }
}

#[test]
fn damaged_segment_header_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 4096)).unwrap();
    append_until(&mut j, 3, 100);
    j.close().unwrap();
    let seg = &segment_files(dir.path())[0];
    flip(seg, 9);
    let mut reader = Reader::open(dir.path()).unwrap();
    let (segment, at, _) = expect_corrupt_read(reader.read(1));
    assert_eq!((&segment, at), (seg, 0));
}

#[test]
fn missing_records_of_a_sealed_segment_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 4096)).unwrap();
    append_until(&mut j, 101, 300);
    j.close().unwrap();
    let files = segment_files(dir.path());
    assert!(files.len() >= 3);
    let first = record_offsets(&files[0]);
    let second = record_offsets(&files[1]);
    std::fs::remove_file(&files[1]).unwrap();
    let mut reader = Reader::open(dir.path()).unwrap();
    let in_the_gap = second[0].2;
    let (segment, at, reason) = expect_corrupt_read(reader.read(in_the_gap));
    let (last_offset, last_total, _) = *first.last().unwrap();
    assert_eq!((&segment, at), (&files[0], last_offset + last_total));
    assert!(reason.contains("is missing"), "{reason}");
    assert_eq!(reader.read(1).unwrap(), payload(1, 300));
}

#[test]
fn active_segment_reads_back_while_it_grows() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 1024 * 1024)).unwrap();
    let mut readers = [
        j.reader().unwrap(),
        Reader::open_with_limits(dir.path(), tiny_limits()).unwrap(),
    ];
    let mut seed = 3u64;
    for round in 1..=60u64 {
        let until = round * 7 + 1;
        append_varied_until(&mut j, until);
        wait_durable(&j, until - 1);
        // More appends in flight while reading: bytes past the durable LSN may be torn.
        append_varied_until(&mut j, until + 3);
        for (i, reader) in readers.iter_mut().enumerate() {
            let what = format!("reader {i} round {round}");
            for lsn in until - 7..until {
                assert_reads(reader, lsn, &what);
            }
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let older = 1 + (seed >> 33) % (until - 1);
            assert_reads(reader, older, &what);
        }
        wait_durable(&j, until + 2);
    }
    assert_eq!(j.segments().len(), 1, "stayed in the active segment");
    j.close().unwrap();
}

#[test]
fn concurrent_reader_keeps_up_with_a_writer_that_rolls_over() {
    const LAST: Lsn = 3000;
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 16 * 1024)).unwrap();
    let durable = j.durable();
    let mut readers = [
        j.reader().unwrap(),
        Reader::open_with_limits(dir.path(), tiny_limits()).unwrap(),
    ];
    let writer = std::thread::spawn(move || {
        while j.next_lsn() <= LAST {
            let until = (j.next_lsn() + 13).min(LAST + 1);
            append_varied_until(&mut j, until);
        }
        j.close().unwrap();
    });
    let mut next = 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while next <= LAST {
        let d = durable.borrow().clone().expect("writer healthy");
        for lsn in next..=d {
            for (i, reader) in readers.iter_mut().enumerate() {
                assert_reads(reader, lsn, &format!("reader {i}"));
            }
        }
        next = next.max(d + 1);
        assert!(Instant::now() < deadline, "stuck at LSN {next}");
        std::thread::yield_now();
    }
    writer.join().unwrap();
    let segments = segment_files(dir.path()).len();
    assert!(segments >= 10, "{segments} segments");
}

/// Simulates the race with a writer by editing the file: a reader fills its chunk while the
/// record after the durable end is torn (here: the low byte of its length not yet written, so
/// it frames as a shorter record with the right LSN). Once the write completes and the record
/// is durable, the reader must read it again rather than trust what it buffered.
#[test]
fn torn_record_buffered_past_the_durable_end_is_read_again_once_complete() {
    const PAYLOAD_BYTES: usize = 400; // length 408 = 0x198: a torn low byte leaves 0x100
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 64 * 1024)).unwrap();
    append_until(&mut j, 9, PAYLOAD_BYTES);
    j.close().unwrap();
    let seg = &segment_files(dir.path())[0];
    let offsets = record_offsets(seg);
    let (start, _, lsn) = offsets[5];
    assert_eq!(lsn, 6);
    let (last, last_total, _) = offsets[7];
    let file = OpenOptions::new().read(true).write(true).open(seg).unwrap();
    let mut complete = vec![0u8; (last + last_total - start) as usize];
    file.read_exact_at(&mut complete, start).unwrap();
    // Durable up to LSN 5; record 6 being written, its first byte not there yet.
    file.write_all_at(&vec![0u8; complete.len()], start)
        .unwrap();
    let mut torn = complete[..16 + PAYLOAD_BYTES].to_vec();
    torn[0] = 0;
    file.write_all_at(&torn, start).unwrap();

    let mut target_reader = Reader::open(dir.path()).unwrap();
    let mut stepping_reader = Reader::open(dir.path()).unwrap();
    for reader in [&mut target_reader, &mut stepping_reader] {
        assert_eq!(reader.read(5).unwrap(), payload(5, PAYLOAD_BYTES));
    }
    // The write completes: 6, 7 and 8 are durable.
    file.write_all_at(&complete, start).unwrap();
    assert_eq!(target_reader.read(6).unwrap(), payload(6, PAYLOAD_BYTES));
    assert_eq!(stepping_reader.read(8).unwrap(), payload(8, PAYLOAD_BYTES));
    for lsn in 1..=8 {
        assert_eq!(
            target_reader.read(lsn).unwrap(),
            payload(lsn, PAYLOAD_BYTES)
        );
        assert_eq!(
            stepping_reader.read(lsn).unwrap(),
            payload(lsn, PAYLOAD_BYTES)
        );
    }
}
