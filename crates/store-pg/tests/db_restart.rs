//! The database goes away under a master: it stops (lost + a failed log), and `acquire`
//! waits for the database and makes it master again, with what was durable intact.

mod common;

use common::*;
use haven_server::SharedStore;
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
enum Outage {
    /// A clean (fast) shutdown.
    Stop,
    /// SIGKILL of the postmaster: the server recovers from its WAL on start.
    Crash,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_stops_the_master_and_acquire_waits_for_the_database() {
    outage(Outage::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_stops_the_master_and_keeps_every_durable_record() {
    outage(Outage::Crash).await;
}

async fn outage(outage: Outage) {
    let Some(mut pg) = cluster() else { return };
    let a = store(&short(&pg.url()), "a");
    let mut m = acquire(&a).await;
    let (mut log, _) = open(&mut m);
    for i in 1..=100 {
        log.append(&payload(i, 200));
    }
    log.flush();
    durable(&*log, 100).await;
    // Appends keep coming while the database stops.
    tokio::task::block_in_place(|| match outage {
        Outage::Stop => pg.stop(),
        Outage::Crash => pg.kill(),
    })
    .expect("stop the database");
    for i in 101..=200 {
        log.append(&payload(i, 200));
    }
    log.flush();
    let failure = failed(&*log).await;
    let reason = lost(&m).await;
    eprintln!("{outage:?}: log failure: {failure}; lost: {reason}");
    let epoch = m.epoch;
    drop(log);
    drop(m);
    // The broker competes again while the database is still down: acquire keeps retrying.
    let waiting = tokio::spawn(async move {
        let m = a.acquire().await.expect("acquire");
        (m, a)
    });
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(!waiting.is_finished(), "no lease without a database");
    tokio::task::block_in_place(|| pg.start_again()).expect("start the database again");
    let (mut m, _a) = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("master again once the database is back")
        .expect("join");
    assert!(m.epoch > epoch);
    let (log, seen) = open(&mut m);
    assert!(seen.len() >= 100, "every durable record survives");
    let lsns: Vec<u64> = seen.iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, (1..=seen.len() as u64).collect::<Vec<_>>());
    assert_eq!(log.next_lsn(), seen.len() as u64 + 1);
}
