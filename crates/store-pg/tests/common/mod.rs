//! Shared by the store's integration tests: a throwaway cluster, short lease settings, and
//! helpers that wait for conditions with generous deadlines (timing never decides a test).

#![allow(dead_code)]

use haven_journal::Lsn;
use haven_server::{DurableLog, HaConfig, HaMode, Mastership, SharedStore};
use haven_store_pg::PgSharedStore;
use haven_testkit::PgCluster;
use std::time::Duration;

/// How long any awaited condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);
pub const RECORD_BYTES_MAX: usize = 1 << 20;

/// A running cluster, or `None` (with the reason printed) where PostgreSQL is not installed
/// and the run is not CI.
pub fn cluster() -> Option<PgCluster> {
    if let Some(reason) = PgCluster::skip_reason() {
        eprintln!("skipped: {reason}");
        return None;
    }
    Some(PgCluster::start().expect("start a PostgreSQL cluster"))
}

/// Short leases: 2 s, renewed every 200 ms, trusted for 1.4 s, slaves poll every 100 ms.
pub fn short(url: &str) -> HaConfig {
    HaConfig {
        mode: HaMode::SharedDb,
        db_url: url.to_string(),
        lease_ms: 2_000,
        renew_ms: 200,
        lease_margin_ms: 600,
        poll_ms: 100,
        db_timeout_ms: 3_000,
        ..HaConfig::default()
    }
}

/// A lease the test must take away by hand: 60 s, renewed every 29.999 s. Its holder behaves
/// like a master that was paused: it believes in its lease long after the database stopped.
pub fn long(url: &str) -> HaConfig {
    HaConfig {
        lease_ms: 60_000,
        renew_ms: 29_999,
        lease_margin_ms: 1,
        ..short(url)
    }
}

pub fn store(ha: &HaConfig, name: &str) -> PgSharedStore {
    PgSharedStore::new(ha, name, RECORD_BYTES_MAX).expect("store settings")
}

pub async fn acquire(store: &PgSharedStore) -> Mastership {
    tokio::time::timeout(DEADLINE, store.acquire())
        .await
        .expect("acquire within the deadline")
        .expect("acquire")
}

/// Opens the mastership's log; returns it and every (lsn, payload) replayed.
/// Every (lsn, payload) a recovery replayed, in order.
pub type Replayed = Vec<(Lsn, Vec<u8>)>;

pub fn open(m: &mut Mastership) -> (Box<dyn DurableLog>, Replayed) {
    let log = std::mem::replace(&mut m.log, Box::new(Taken));
    let mut seen = Vec::new();
    let opened = tokio::task::block_in_place(|| {
        log.open(&mut |lsn, payload| {
            seen.push((lsn, payload.to_vec()));
            Ok(())
        })
    })
    .expect("open the log");
    (opened, seen)
}

/// Waits until `lsn` is durable; panics on a log failure.
pub async fn durable(log: &dyn DurableLog, lsn: Lsn) {
    let mut rx = log.durable();
    tokio::time::timeout(DEADLINE, async {
        loop {
            match rx.borrow_and_update().clone() {
                Ok(d) if d >= lsn => return,
                Ok(_) => {}
                Err(f) => panic!("log failed waiting for {lsn}: {f}"),
            }
            rx.changed().await.expect("writer alive");
        }
    })
    .await
    .expect("durable within the deadline");
}

/// Waits until the log reports a failure; returns it.
pub async fn failed(log: &dyn DurableLog) -> String {
    let mut rx = log.durable();
    tokio::time::timeout(DEADLINE, async {
        loop {
            if let Err(f) = rx.borrow_and_update().clone() {
                return f.to_string();
            }
            if rx.changed().await.is_err() {
                return "writer gone".to_string();
            }
        }
    })
    .await
    .expect("the log fails within the deadline")
}

/// Waits until `lost` fires; returns the reason.
pub async fn lost(m: &Mastership) -> String {
    let mut rx = m.lost.clone();
    let reason = tokio::time::timeout(DEADLINE, async {
        rx.wait_for(|l| l.is_some())
            .await
            .expect("lost sender alive")
            .clone()
    })
    .await
    .expect("lost within the deadline");
    reason.expect("some")
}

pub fn payload(i: u64, bytes: usize) -> Vec<u8> {
    let mut p = i.to_le_bytes().to_vec();
    p.resize(bytes.max(8), (i % 251) as u8);
    p
}

/// Stands in for the log after `open` took it.
pub struct Taken;

impl haven_server::LogStore for Taken {
    fn loader(&self) -> Box<dyn haven_engine::MessageLoader> {
        unreachable!("the log was opened")
    }
    fn record_bytes_max(&self) -> usize {
        unreachable!("the log was opened")
    }
    fn open(
        self: Box<Self>,
        _: haven_server::OnRecord<'_>,
    ) -> Result<Box<dyn DurableLog>, haven_journal::JournalError> {
        unreachable!("the log was opened")
    }
    fn describe(&self) -> String {
        "opened".into()
    }
}
