//! A failed write or fdatasync stops the journal for good: durable() turns Err and nothing
//! appended afterwards is ever reported durable, even if the disk "recovers".

mod common;

use std::time::Duration;

use common::*;
use haven_journal::{Faults, Journal, JournalError};

fn wait_for_err(j: &Journal) -> haven_journal::JournalFailure {
    let mut rx = j.durable();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|d| d.is_err()))
            .await
            .expect("durable turns Err")
            .unwrap()
            .clone()
            .unwrap_err()
    })
}

fn fails_for_good(fail: impl Fn(&Faults, bool), ops: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64 * 1024);
    let faults = Faults::new();
    let mut j = Journal::open_with_faults(cfg.clone(), faults.clone(), |_, _| Ok(())).unwrap();
    append_until(&mut j, 11, 32);
    let mut rx = j.durable();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(rx.wait_for(|d| *d == Ok(10))).unwrap();

    fail(&faults, true);
    append_until(&mut j, 16, 32);
    let failure = wait_for_err(&j);
    // The spare segment being prepared may be the first to hit the fault.
    assert!(ops.contains(&failure.op), "{failure}");
    assert!(failure.to_string().contains("injected"), "{failure}");

    // The disk "recovers": the journal must not.
    fail(&faults, false);
    append_until(&mut j, 21, 32);
    std::thread::sleep(Duration::from_millis(200));
    assert!(j.durable_lsn().is_err());
    assert!(matches!(j.close(), Err(JournalError::Failed(_))));

    // Whatever reached the file is replayed in order; nothing after the failure was written.
    let (j, records) = open(&cfg).unwrap();
    let last = records.last().map_or(0, |r| r.0);
    assert!((10..=15).contains(&last), "last replayed LSN {last}");
    assert_records(&records, 1, last + 1, 32);
    j.close().unwrap();
}

#[test]
fn failed_fdatasync_is_sticky() {
    fails_for_good(|f, on| f.fail_syncs(on), &["fdatasync", "fsync"]);
}

#[test]
fn failed_write_is_sticky() {
    fails_for_good(|f, on| f.fail_writes(on), &["write"]);
}
