//! Many appends share one fdatasync; the durable LSN only moves forward.

mod common;

use common::*;

#[test]
fn one_flush_makes_many_appends_durable_with_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 16 * 1024 * 1024)).unwrap();
    let mut rx = j.durable();
    let before = j.stats();
    for _ in 0..1000 {
        let lsn = j.next_lsn();
        j.append(&payload(lsn, 64));
    }
    assert_eq!(j.durable_lsn(), Ok(0), "append does no I/O");
    j.flush();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        rx.changed().await.unwrap();
        assert_eq!(
            *rx.borrow_and_update(),
            Ok(1000),
            "the first notification covers all"
        );
    });
    let after = j.stats();
    assert_eq!(after.batches - before.batches, 1);
    assert_eq!(after.record_bytes - before.record_bytes, 1000 * 80);
    j.close().unwrap();
}

#[test]
fn durable_lsn_is_monotonic_while_producing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = open(&config(dir.path(), 64 * 1024)).unwrap();
    let mut rx = j.durable();
    let producer = std::thread::spawn(move || {
        for _ in 0..200 {
            for _ in 0..10 {
                let lsn = j.next_lsn();
                j.append(&payload(lsn, 50));
            }
            j.flush();
        }
        j.close().unwrap();
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let seen = rt.block_on(async {
        let mut seen = Vec::new();
        while rx.changed().await.is_ok() {
            seen.push(rx.borrow_and_update().clone().unwrap());
        }
        seen.push(rx.borrow().clone().unwrap());
        seen
    });
    producer.join().unwrap();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(*seen.last().unwrap(), 2000);
}
