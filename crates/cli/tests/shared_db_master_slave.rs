//! PostgreSQL master/slave with real `haven` processes and a real (throwaway) PostgreSQL:
//! brokers share one database (`[ha] mode = "shared-db"`); the holder of the lease serves.
//!
//! 1. The master is killed with `kill -9` again and again under load. Its database session
//!    ends with it, so a slave takes the lease at once (no lease expiry to wait for), and the
//!    killed broker rejoins as a slave. Exactly once holds across every takeover.
//! 2. Three brokers, the master killed twice in a row, then both old masters rejoin.
//! 3. A master frozen (SIGSTOP) past its lease: a slave takes over once the lease expires by the
//!    database's clock; when the old master wakes it must not store a single record (asserted
//!    on the table) and must step down.
//! 4. The database restarted under load: the master stops rather than accept what it cannot
//!    store, a broker becomes master again when the database is back, nothing receipted is
//!    lost and nothing is stored twice.
//!
//! Under `CI=true` a missing PostgreSQL fails these tests (scripts/test.sh installs it);
//! elsewhere they print why they skip.

#[path = "support/group.rs"]
mod group;
#[path = "support/traffic.rs"]
mod traffic;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use group::*;
use haven_client::{ConnectOptions, Connection};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess, PgCluster};
use tokio::sync::Mutex;
use traffic::*;

const QUEUE: &str = "/queue/shared-db";
/// Bounds on how long the master serves between kills.
const KILL_AFTER_MS: std::ops::Range<u64> = 200..800;
/// Short leases for the frozen-master test: expiry after 3 s, renewal every 500 ms, and the
/// master distrusts its lease after 2 s without renewal.
const SHORT_LEASE: &str =
    "lease_ms = 3000\nrenew_ms = 500\nlease_margin_ms = 1000\npoll_ms = 200\n";

fn cluster_or_skip(test: &str) -> Option<PgCluster> {
    if let Some(reason) = PgCluster::skip_reason() {
        eprintln!("SKIPPED {test}: {reason}");
        return None;
    }
    Some(PgCluster::start().expect("PostgreSQL test cluster starts"))
}

fn db_config(name: &str, url: &str, extra_ha: &str) -> String {
    format!(
        "[broker]\nname = \"{name}\"\n\n[ha]\nmode = \"shared-db\"\ndb_url = \"{url}\"\n{extra_ha}"
    )
}

/// `n` brokers on one database: the first is master when this returns, the others are
/// started as slaves. Each has its own (unused) data directory.
fn start_group(dir: &std::path::Path, n: usize, url: &str, extra_ha: &str) -> Vec<BrokerProcess> {
    (0..n)
        .map(|i| {
            let name = format!("b{i}");
            let mut opts =
                BrokerOpts::new(env!("CARGO_BIN_EXE_haven"), dir.join(&name), free_addr());
            opts.config_toml = Some(db_config(&name, url, extra_ha));
            if i == 0 {
                BrokerProcess::start(opts).expect("first broker becomes master")
            } else {
                BrokerProcess::spawn(opts).expect("slave starts")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn db_master_killed_repeatedly_under_load_slaves_take_over_exactly_once() {
    const KILLS: usize = 4;
    let Some(pg) = cluster_or_skip("db_master_killed_repeatedly") else {
        return;
    };
    let seed = seed("HAVEN_SHARED_SEED");
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_group(dir.path(), 2, &pg.url(), "");
    let (report, mut b) = kill_masters_under_load(brokers, QUEUE, KILLS, KILL_AFTER_MS, seed).await;
    eprintln!("shared-db, {KILLS} master kills: {report}");
    assert!(report.receipted > 0, "{report}");
    assert_eq!(report.unknown, 0, "{report}");
    assert!(report.is_ok(), "seed {seed}: {report}\n{}", logs(&b));
    for broker in b.iter() {
        assert!(terms(broker) >= 2, "{}", logs(&b));
    }
    for broker in b.iter_mut() {
        broker.stop().expect("broker stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_db_brokers_master_killed_twice_in_a_row_then_old_masters_rejoin() {
    let Some(pg) = cluster_or_skip("three_db_brokers") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_group(dir.path(), 3, &pg.url(), "");
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let brokers = Arc::new(Mutex::new(brokers));
    let t = Traffic::start(&uri, QUEUE).await;
    let receipts = t.receipts.clone();
    wait_progress(&receipts, 0, 20).await;
    let (first, second) = {
        let brokers = brokers.clone();
        blocking(move || kill_two_masters_in_a_row(&mut brokers.blocking_lock())).await
    };
    let before = receipts.load(Ordering::Relaxed);
    wait_progress(&receipts, before, 20).await;
    {
        let brokers = brokers.clone();
        blocking(move || {
            rejoin_both_then_kill_the_third(&mut brokers.blocking_lock(), first, second)
        })
        .await;
    }
    let report = t.finish_exactly_once(Vec::new()).await;
    eprintln!("shared-db, three brokers: {report}");
    let mut b = brokers.lock().await;
    assert!(report.receipted > 0, "{report}");
    assert!(report.is_ok(), "{report}\n{}", logs(&b));
    for broker in b.iter_mut() {
        if broker.is_running() {
            broker.stop().expect("broker stops");
        }
    }
}

/// (rows, highest LSN) the table holds for one epoch.
fn rows_of_epoch(pg: &PgCluster, epoch: u64) -> String {
    pg.psql(&format!(
        "SELECT count(*), coalesce(max(lsn), 0) FROM haven_log WHERE epoch = {epoch}"
    ))
    .expect("psql")
    .trim()
    .to_string()
}

fn lease_epoch(pg: &PgCluster) -> u64 {
    pg.psql("SELECT epoch FROM haven_lease WHERE id = 1")
        .expect("psql")
        .trim()
        .parse()
        .expect("an epoch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_frozen_past_its_lease_stores_nothing_after_and_steps_down() {
    const STORED: usize = 20;
    let Some(pg) = cluster_or_skip("a_master_frozen_past_its_lease") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut brokers = start_group(dir.path(), 2, &pg.url(), SHORT_LEASE);
    let conn = Connection::connect(&brokers[0].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the master");
    for i in 0..STORED {
        conn.send_receipted(QUEUE, &[], format!("before-{i}"))
            .await
            .expect("stored");
    }
    let old_epoch = lease_epoch(&pg);
    brokers[0].sigstop().expect("SIGSTOP");
    // A statement the master sent just before it froze may still be committing in the
    // database: what it stored *before* losing the lease is legitimate. Look once that settled.
    // (sigstop returns once every thread is stopped, so nothing new is on its way.)
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rows_of_epoch(&pg, old_epoch);
    eprintln!("old epoch {old_epoch} before: {before}");
    // Sent while it is frozen: waits in its socket.
    let pending = conn
        .send_with_receipt_future(QUEUE, &[], "sent-to-the-frozen-master")
        .await
        .expect("queued");
    // The slave takes over once the lease has expired by the database's clock.
    let b1 = wait_master_async(&mut brokers).await;
    assert_eq!(b1, 1);
    assert!(lease_epoch(&pg) > old_epoch);
    brokers[0].sigcont().expect("SIGCONT");
    let answer = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the old master answers or closes");
    assert!(answer.is_err(), "a deposed master receipted a SEND");
    // Give it every chance to write, then look at the table.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(brokers[0].log_path()).unwrap();
        if log.contains("stepping down to slave") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old master never stepped down:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        rows_of_epoch(&pg, old_epoch),
        before,
        "the deposed master stored a record after losing its lease"
    );
    // Every message stored before the freeze is there, and the refused one is not.
    let c = Connection::connect(&brokers[1].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the new master");
    let (mut sub, got) = receive_bodies(&c, QUEUE, STORED).await;
    assert_eq!(
        got,
        (0..STORED)
            .map(|i| format!("before-{i}"))
            .collect::<Vec<_>>()
    );
    assert!(
        nothing_more(&mut sub).await,
        "a message the deposed master refused was stored"
    );
    c.disconnect().await.unwrap();
    assert!(serving(&mut brokers) == vec![1], "{}", logs(&brokers));
    for b in brokers.iter_mut() {
        b.stop().expect("broker stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_restart_under_load_loses_nothing_and_stores_nothing_twice() {
    let Some(pg) = cluster_or_skip("a_database_restart_under_load") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_group(dir.path(), 2, &pg.url(), "");
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let brokers = Arc::new(Mutex::new(brokers));
    let t = Traffic::start(&uri, QUEUE).await;
    let pipelined = t.spawn_pipelined(QUEUE, 2);
    let receipts = t.receipts.clone();
    wait_progress(&receipts, 0, 50).await;
    let pg = Arc::new(std::sync::Mutex::new(pg));
    {
        let pg = pg.clone();
        blocking(move || pg.lock().unwrap().restart().expect("database restarts")).await;
    }
    // Serving resumes once the database is back.
    let before = receipts.load(Ordering::Relaxed);
    wait_progress(&receipts, before, 50).await;
    let report = t.finish_exactly_once(pipelined).await;
    eprintln!("shared-db, database restart: {report}");
    let mut b = brokers.lock().await;
    assert!(report.receipted > 0, "{report}");
    assert!(report.is_ok(), "{report}\n{}", logs(&b));
    // The master noticed: it stopped rather than accept what it could not store.
    let all_logs: String = b
        .iter()
        .map(|x| std::fs::read_to_string(x.log_path()).unwrap_or_default())
        .collect();
    assert!(all_logs.contains("stepping down to slave"), "{}", logs(&b));
    for broker in b.iter_mut() {
        broker.stop().expect("broker stops");
    }
}
