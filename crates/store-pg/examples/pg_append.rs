//! Throughput of the PostgreSQL log: records/s appended and made durable, with group commit
//! (the core's pattern: append, flush, keep going while earlier batches commit, at most
//! `--in-flight` records not yet durable) versus one transaction per record (append, flush,
//! wait for it, repeat). Not run in CI.
//!
//! ```text
//! cargo run --release -p haven-store-pg --example pg_append -- [records] [payload_bytes] [in_flight]
//! ```
//!
//! Starts a throwaway cluster (as the tests do) unless `HAVEN_PG_URL` names a server.

use haven_server::{DurableLog, HaConfig, HaMode, LogStore, SharedStore};
use haven_store_pg::PgSharedStore;
use std::time::{Duration, Instant};

/// Records the one-transaction-per-record run writes (it is slow by design).
const SINGLE_RECORDS: u64 = 2_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let records = args.first().copied().unwrap_or(100_000);
    let payload_bytes = args.get(1).copied().unwrap_or(1024) as usize;
    let in_flight = args.get(2).copied().unwrap_or(50_000);
    let _cluster;
    let url = match std::env::var("HAVEN_PG_URL") {
        Ok(url) => url,
        Err(_) => {
            let c = haven_testkit::PgCluster::start().expect("start a throwaway cluster");
            let url = c.url();
            _cluster = c;
            url
        }
    };
    let ha = HaConfig {
        mode: HaMode::SharedDb,
        db_url: url,
        db_timeout_ms: 30_000,
        ..HaConfig::default()
    };
    let store = PgSharedStore::new(&ha, "bench", 1 << 20).expect("store");
    let payload = vec![0x5a; payload_bytes];

    let (mut log, hold) = open(&store).await;
    let started = Instant::now();
    let mut rx = log.durable();
    let mut durable = log.durable_lsn().expect("durable");
    let base = log.next_lsn() - 1;
    let target = base + records;
    while durable < target {
        // Append while fewer than `in_flight` records wait, as the core does.
        while log.next_lsn() - 1 < target && log.next_lsn() - 1 - durable < in_flight {
            log.append(&payload);
            log.flush();
        }
        rx.changed().await.expect("writer alive");
        durable = rx.borrow_and_update().clone().expect("log failed");
    }
    let group = started.elapsed();
    tokio::task::block_in_place(|| log.close()).expect("close");
    report("group commit", records, payload_bytes, group);
    drop(hold);

    let (mut log, _hold) = open(&store).await;
    let mut rx = log.durable();
    let started = Instant::now();
    for _ in 0..SINGLE_RECORDS {
        let lsn = log.append(&payload);
        log.flush();
        while rx.borrow_and_update().clone().expect("log failed") < lsn {
            rx.changed().await.expect("writer alive");
        }
    }
    let single = started.elapsed();
    tokio::task::block_in_place(|| log.close()).expect("close");
    report(
        "one transaction per record",
        SINGLE_RECORDS,
        payload_bytes,
        single,
    );
}

/// The log of a new mastership, and the hold that keeps its lease.
async fn open(store: &PgSharedStore) -> (Box<dyn DurableLog>, Box<dyn Send>) {
    let m = store.acquire().await.expect("acquire");
    let log: Box<dyn LogStore> = m.log;
    let started = Instant::now();
    let mut replayed = 0u64;
    let opened = tokio::task::block_in_place(|| {
        log.open(&mut |_, _| {
            replayed += 1;
            Ok(())
        })
    })
    .expect("open");
    if replayed > 0 {
        report("recovery (replay)", replayed, 0, started.elapsed());
    }
    (opened, m.hold)
}

fn report(what: &str, records: u64, payload_bytes: usize, took: Duration) {
    let secs = took.as_secs_f64();
    println!(
        "{what}: {records} records of {payload_bytes} B in {:.2} s = {:.0} records/s ({:.1} MiB/s)",
        secs,
        records as f64 / secs,
        records as f64 * payload_bytes as f64 / secs / (1024.0 * 1024.0)
    );
}
