//! The journal times its own fdatasyncs: `stats().sync` counts them, reports their
//! quantiles, and counts the slow ones, which a slow disk (an injected delay) shows.

mod common;

use std::time::Duration;

use common::*;
use haven_journal::{Faults, Journal, JournalConfig, Lsn, SyncStats};

fn wait_durable(j: &Journal, lsn: Lsn) {
    let mut rx = j.durable();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(rx.wait_for(|d| *d == Ok(lsn))).unwrap();
}

/// Appends and waits for each record alone, `n` times: `n` batches, `n` syncs.
fn one_at_a_time(j: &mut Journal, n: usize) {
    for _ in 0..n {
        let lsn = j.next_lsn();
        j.append(&payload(lsn, 100));
        j.flush();
        wait_durable(j, lsn);
    }
}

fn slow_config(dir: &std::path::Path) -> JournalConfig {
    JournalConfig {
        slow_sync_warn_ms: 40,
        ..config(dir, 1 << 20)
    }
}

#[test]
fn every_batch_sync_is_counted_and_a_slow_disk_shows_in_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::new();
    let mut j =
        Journal::open_with_faults(slow_config(dir.path()), faults.clone(), |_, _| Ok(())).unwrap();
    let before = j.stats().sync;
    one_at_a_time(&mut j, 20);
    let fast = j.stats().sync;
    assert_eq!(
        fast.syncs - before.syncs,
        20,
        "one sync per batch: {fast:?}"
    );
    assert!(
        fast.p50_us <= fast.p99_us && fast.p99_us <= fast.max_us,
        "{fast:?}"
    );
    assert!(fast.max_us > 0, "a real fdatasync takes some µs: {fast:?}");

    // A disk that takes 50 ms more per sync: 3 of 23 syncs are slow, so p99 and the max
    // read at least 50 ms, and each is counted as slow (the threshold is 40 ms).
    faults.delay_syncs(Duration::from_millis(50));
    one_at_a_time(&mut j, 3);
    faults.delay_syncs(Duration::ZERO);
    let slow = j.stats().sync;
    assert_eq!(slow.syncs - fast.syncs, 3, "{slow:?}");
    assert!(slow.slow_syncs - fast.slow_syncs >= 3, "{slow:?}");
    assert!(slow.max_us >= 50_000, "{slow:?}");
    assert!(
        slow.p99_us >= 50_000,
        "the slow syncs are above p99's rank: {slow:?}"
    );
    j.close().unwrap();
}

#[test]
fn a_journal_that_does_not_sync_reports_no_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = JournalConfig {
        sync_writes: false,
        ..config(dir.path(), 1 << 20)
    };
    let (mut j, _) = open(&cfg).unwrap();
    one_at_a_time(&mut j, 5);
    let stats = j.stats();
    assert_eq!(stats.batches, 5);
    assert_eq!(stats.sync, SyncStats::default());
    j.close().unwrap();
}
