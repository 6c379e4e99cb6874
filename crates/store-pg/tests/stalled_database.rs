//! A database that stops answering (here: the lease row locked by another session): the
//! master stops trusting its lease before the database would give it away, and a write that
//! outlasts `db_timeout_ms` fails the log without committing later.

mod common;

use common::*;
use haven_server::{HaConfig, SharedStore};
use std::time::Duration;

/// Holds the lease row locked for 30 s from a psql session of its own.
const LOCK_THE_LEASE_ROW: &str = "BEGIN; SELECT 1 FROM haven_lease FOR UPDATE; \
     SELECT pg_sleep(30) AS haven_test_lock_holder; COMMIT";

fn release_the_lease_row(pg: &haven_testkit::PgCluster) {
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query LIKE '%haven_test_lock_holder%' AND pid <> pg_backend_pid()",
    )
    .expect("psql");
}

/// Waits until the psql session holds the row lock.
async fn lock_held(pg: &haven_testkit::PgCluster) {
    tokio::time::timeout(DEADLINE, async {
        while pg
            .psql(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE query LIKE '%haven_test_lock_holder%' AND state = 'active' \
                 AND pid <> pg_backend_pid()",
            )
            .expect("psql")
            != "1"
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the lock holder starts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_cannot_renew_stops_before_its_lease_expires() {
    let Some(pg) = cluster() else { return };
    // Trusted for 1.5 s after a renewal is sent; the database keeps the lease 2.5 s longer.
    let ha = HaConfig {
        lease_ms: 4_000,
        lease_margin_ms: 2_500,
        renew_ms: 200,
        ..short(&pg.url())
    };
    let a = store(&ha, "a");
    let m = acquire(&a).await;
    let mut holder = pg.psql_spawn(LOCK_THE_LEASE_ROW).expect("psql");
    lock_held(&pg).await;
    let reason = lost(&m).await;
    // A plain read does not wait for the row lock: by the database's clock the lease is
    // still valid when the master has already stopped trusting it.
    let still_valid = pg
        .psql("SELECT expires_at > now() FROM haven_lease")
        .expect("psql");
    release_the_lease_row(&pg);
    let _ = holder.wait();
    assert!(reason.contains("not renewed"), "{reason}");
    assert_eq!(
        still_valid, "t",
        "the master must stop before the database can give its lease away"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_outlasts_db_timeout_fails_the_log_and_commits_nothing() {
    let Some(pg) = cluster() else { return };
    // A long lease (no renewal in this test's time) and a 1 s write bound.
    let ha = HaConfig {
        db_timeout_ms: 1_000,
        ..long(&pg.url())
    };
    let a = store(&ha, "a");
    let mut m = acquire(&a).await;
    let (mut log, _) = open(&mut m);
    let mut holder = pg.psql_spawn(LOCK_THE_LEASE_ROW).expect("psql");
    lock_held(&pg).await;
    for i in 1..=10 {
        log.append(&payload(i, 100));
    }
    log.flush();
    // Without the bound the write would wait 30 s for the lock, then commit.
    let failure = failed(&*log).await;
    release_the_lease_row(&pg);
    let _ = holder.wait();
    eprintln!("{failure}");
    assert!(
        failure.contains("did not answer within") || failure.contains("lock timeout"),
        "{failure}"
    );
    // Nothing of the failed write commits after the lock is gone.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        pg.psql("SELECT count(*) FROM haven_log").expect("psql"),
        "0"
    );
    // Sticky: later appends are not written either.
    log.append(&payload(11, 100));
    log.flush();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        pg.psql("SELECT count(*) FROM haven_log").expect("psql"),
        "0"
    );
    assert!(log.durable_lsn().is_err());
}

/// A broker that starts while the master runs takes no lock on the lease table that a renewal
/// would have to wait for (here a session holds the lock a renewal takes, as one in flight
/// does): its start gets through to waiting for the lease. Were its schema check to take one
/// (`CREATE INDEX`, even of an index that exists, takes a share lock until its transaction
/// ends), the running master's renewals would wait for a starting, or paused, broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_broker_takes_no_lock_a_renewal_would_wait_for() {
    let Some(pg) = cluster() else { return };
    let a = store(&short(&pg.url()), "a");
    let _ma = acquire(&a).await;
    let mut holder = pg
        .psql_spawn(
            "BEGIN; LOCK TABLE haven_lease IN ROW EXCLUSIVE MODE; \
             SELECT pg_sleep(300) AS haven_test_lock_holder; COMMIT",
        )
        .expect("psql");
    lock_held(&pg).await;
    let b = store(&short(&pg.url()), "b");
    let starting = tokio::spawn(async move { b.acquire().await.map(|_| ()) });
    let contending = tokio::time::timeout(DEADLINE, async {
        while pg
            .psql(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE query LIKE 'SELECT pg_advisory_lock(%' AND pid <> pg_backend_pid()",
            )
            .expect("psql")
            != "1"
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    release_the_lease_row(&pg);
    starting.abort();
    let _ = holder.wait();
    contending.expect("B's start got through to waiting for the lease");
}
