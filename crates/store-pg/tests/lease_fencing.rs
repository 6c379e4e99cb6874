//! The lease between two brokers on one database: a valid lease is never taken, a released
//! one is taken at once, a dead master's is taken without waiting for expiry, and a master
//! whose lease was taken can never write again.

mod common;

use common::*;
use haven_server::SharedStore;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_lease_fences_the_old_master() {
    let Some(pg) = cluster() else { return };
    // A believes in its lease for a minute: like a paused master, it will not notice in time.
    let a = store(&long(&pg.url()), "a");
    let b = store(&short(&pg.url()), "b");
    let mut ma = acquire(&a).await;
    let (mut log_a, _) = open(&mut ma);
    for i in 1..=10 {
        log_a.append(&payload(i, 100));
    }
    log_a.flush();
    durable(&*log_a, 10).await;
    // The database's clock says A's lease is over (A's process was paused meanwhile).
    pg.psql("UPDATE haven_lease SET expires_at = now()")
        .expect("psql");
    let mut mb = acquire(&b).await;
    assert!(mb.epoch > ma.epoch);
    assert!(ma.lost.borrow().is_none(), "A has not noticed yet");
    // A wakes up believing it is master and writes: the database refuses.
    for i in 11..=20 {
        log_a.append(&payload(i, 100));
    }
    log_a.flush();
    let failure = failed(&*log_a).await;
    assert!(failure.contains("refused a write"), "{failure}");
    let reason = lost(&ma).await;
    assert!(reason.contains("refused a write"), "{reason}");
    // Sticky: nothing more is written.
    log_a.append(&payload(21, 100));
    log_a.flush();
    // B recovered A's durable records and continues after them.
    let (mut log_b, seen) = open(&mut mb);
    assert_eq!(seen.len(), 10);
    assert_eq!(log_b.next_lsn(), 11);
    log_b.append(b"b");
    log_b.flush();
    durable(&*log_b, 11).await;
    let (ea, eb) = (ma.epoch, mb.epoch);
    let rows = pg
        .psql(&format!(
            "SELECT count(*) FILTER (WHERE epoch = {ea}), count(*) FILTER (WHERE epoch = {eb}), \
             count(*) FILTER (WHERE epoch = {ea} AND lsn > 10) FROM haven_log"
        ))
        .expect("psql");
    assert_eq!(rows, "10|1|0", "no record of A's epoch after B's began");
    tokio::task::block_in_place(|| log_b.close()).expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_masters_lease_is_taken_without_waiting_for_expiry() {
    let Some(pg) = cluster() else { return };
    // A 60 s lease: if B waited for expiry, the deadline below would fail the test.
    let a = store(&long(&pg.url()), "a");
    let b = store(&long(&pg.url()), "b");
    let ma = acquire(&a).await;
    let waiting = tokio::spawn(async move {
        let m = b.acquire().await.expect("acquire");
        (m, Instant::now(), b)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "B must wait while A's session lives"
    );
    // A's process dies: its sessions end (as when the kernel closes a killed process's sockets).
    let killed = Instant::now();
    pg.psql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'haven a'",
    )
    .expect("psql");
    let (mb, took_at, _b) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("B takes over long before the 60 s lease expires")
        .expect("join");
    assert!(mb.epoch > ma.epoch);
    eprintln!(
        "takeover after A's sessions ended: {} ms",
        took_at.duration_since(killed).as_millis()
    );
    let reason = lost(&ma).await;
    assert!(reason.contains("lease connection closed"), "{reason}");
    let holder = pg
        .psql("SELECT holder, epoch, holder_has_lock FROM haven_lease")
        .expect("psql");
    assert_eq!(holder, format!("b|{}|t", mb.epoch));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_is_not_taken_and_a_released_one_is() {
    let Some(pg) = cluster() else { return };
    // A trusts its lease for 2.5 s after each renewal sent every 200 ms: only a stall of
    // seconds on a loaded machine could cost it the lease.
    let ha = haven_server::HaConfig {
        lease_ms: 4_000,
        lease_margin_ms: 1_500,
        ..short(&pg.url())
    };
    let a = store(&ha, "a");
    let b = store(&ha, "b");
    let ma = acquire(&a).await;
    let waiting = tokio::spawn(async move {
        let m = b.acquire().await.expect("acquire");
        (m, b)
    });
    // Over two lease lengths: A renews, so B stays a slave throughout.
    tokio::time::sleep(Duration::from_millis(9_000)).await;
    assert!(!waiting.is_finished(), "B took a lease A kept renewing");
    assert!(ma.lost.borrow().is_none(), "A lost a lease it renewed");
    // A steps down cleanly: B takes over without waiting for expiry.
    let epoch_a = ma.epoch;
    drop(ma);
    let (mb, _b) = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("B takes over after the release")
        .expect("join");
    assert_eq!(mb.epoch, epoch_a + 1);
    assert!(mb.lost.borrow().is_none());
}

/// A master's renewal does not wait for its own writes: a write held inside its statement for
/// twice the lease leaves the lease renewed and the master serving. (Under a `FOR SHARE`
/// fence the renewal waited for the write, and the master gave its lease up after 1.4 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_does_not_hold_up_the_renewal() {
    let Some(pg) = cluster() else { return };
    let a = store(
        &haven_server::HaConfig {
            db_timeout_ms: 20_000,
            ..short(&pg.url())
        },
        "a",
    );
    let mut ma = acquire(&a).await;
    let (mut log_a, _) = open(&mut ma);
    slow_first_insert(&pg, 4);
    for i in 1..=10 {
        log_a.append(&payload(i, 100));
    }
    log_a.flush();
    write_in_flight(&pg).await;
    let renewed = || {
        pg.psql("SELECT renewed_at::text FROM haven_lease")
            .expect("psql")
    };
    let before = renewed();
    tokio::time::timeout(DEADLINE, async {
        while renewed() == before {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the lease is renewed while the write is in flight");
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            .expect("psql"),
        "1",
        "the write was still in flight when the lease was renewed"
    );
    durable(&*log_a, 10).await;
    assert!(
        ma.lost.borrow().is_none(),
        "the master gave up its lease: {:?}",
        ma.lost.borrow()
    );
}

/// Makes the insert of record 1 sleep `seconds` inside its statement, after its fence took
/// the lock on the lease row.
fn slow_first_insert(pg: &haven_testkit::PgCluster, seconds: u32) {
    pg.psql(&format!(
        "CREATE FUNCTION haven_test_slow() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN IF NEW.lsn = 1 THEN PERFORM pg_sleep({seconds}); END IF; RETURN NEW; END $$; \
         CREATE TRIGGER haven_test_slow BEFORE INSERT ON haven_log \
         FOR EACH ROW EXECUTE FUNCTION haven_test_slow()"
    ))
    .expect("psql");
}

/// Waits until a write sleeps inside its statement (`slow_first_insert`).
async fn write_in_flight(pg: &haven_testkit::PgCluster) {
    tokio::time::timeout(DEADLINE, async {
        while pg
            .psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            .expect("psql")
            != "1"
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("A's write is in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_the_write_in_flight_and_replays_it() {
    let Some(pg) = cluster() else { return };
    let a = store(
        &haven_server::HaConfig {
            db_timeout_ms: 20_000,
            ..long(&pg.url())
        },
        "a",
    );
    let b = store(&short(&pg.url()), "b");
    let mut ma = acquire(&a).await;
    let (mut log_a, _) = open(&mut ma);
    // A's first write takes 2 s inside its statement, after its fence took the lock.
    slow_first_insert(&pg, 2);
    for i in 1..=10 {
        log_a.append(&payload(i, 100));
    }
    log_a.flush();
    write_in_flight(&pg).await;
    // While it is: the lease expires (by hand: A is "paused") and B competes.
    let mut expire = pg
        .psql_spawn("UPDATE haven_lease SET expires_at = now()")
        .expect("psql");
    let waiting = tokio::spawn(async move {
        let m = b.acquire().await.expect("acquire");
        (m, b)
    });
    // The write began under A's epoch and holds the lease row: the lease can move only
    // once it has committed, so B, recovering as soon as it is master, replays it.
    let (mut mb, _b) = tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("B takes over")
        .expect("join");
    assert!(mb.epoch > ma.epoch);
    let (log_b, seen) = open(&mut mb);
    assert_eq!(seen.len(), 10, "B replays the write that was in flight");
    assert_eq!(log_b.next_lsn(), 11);
    durable(&*log_a, 10).await;
    let _ = expire.wait();
}
