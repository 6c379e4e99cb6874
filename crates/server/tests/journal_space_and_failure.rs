//! The journal seen from a user's side: disk use follows the live backlog (acknowledged data
//! is deleted, a sparse old segment is compacted away), and a failed fsync stops the broker
//! without acknowledging anything it could not store.

mod common;

use common::connect_client as connect;

use haven_client::AckMode;
use haven_server::{Config, Server, ServerError};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

fn small_journal(dir: &Path) -> Config {
    let mut c = Config::default();
    c.stomp.listen = "127.0.0.1:0".parse().unwrap();
    c.stomp.frame_bytes_max = 128 * 1024;
    c.journal.dir = dir.to_path_buf();
    c.journal.segment_bytes = 1024 * 1024;
    c.journal.maintenance_interval_ms = 20;
    c
}

fn segments(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".seg")
        })
        .count()
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_data_leaves_the_disk_and_one_old_message_does_not_pin_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(small_journal(dir.path())).await.unwrap();
    let conn = connect(&server).await;
    let body = vec![b'x'; 4096];
    // ~6 MiB of persistent messages: several 1 MiB segments.
    let total = 1500;
    for i in 0..total {
        conn.send_receipted("/queue/space", &[("n", &i.to_string())], body.clone())
            .await
            .unwrap();
    }
    let full = segments(dir.path());
    assert!(
        full >= 5,
        "expected the backlog to span several segments, got {full}"
    );
    // Consume everything except the very first message, which stays unacknowledged: it sits in
    // the oldest segment, which compaction must re-log so the segment can go.
    let sub = conn.subscribe(
        "/queue/space",
        AckMode::ClientIndividual,
        &[("activemq.prefetchSize", "2000")],
    );
    let mut sub = sub.await.unwrap();
    let first = sub.next().await.unwrap();
    assert_eq!(first.header("n"), Some("0"));
    for i in 1..total {
        let m = sub.next().await.unwrap();
        assert_eq!(m.header("n"), Some(i.to_string().as_str()));
        conn.ack_receipted(&m).await.unwrap();
    }
    eventually(
        "acknowledged segments deleted and the sparse one compacted",
        || segments(dir.path()) <= 2,
    )
    .await;
    // The one unacknowledged message survives all of that, and a restart.
    drop(sub);
    conn.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
    let server = Server::start(small_journal(dir.path())).await.unwrap();
    let conn = connect(&server).await;
    let mut sub = conn
        .subscribe("/queue/space", AckMode::ClientIndividual, &[])
        .await
        .unwrap();
    let again = tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.header("n"), Some("0"));
    assert!(again.redelivered);
    assert_eq!(again.body.len(), 4096);
    conn.ack_receipted(&again).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), sub.next())
            .await
            .is_err(),
        "nothing else was left"
    );
    conn.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_fsync_stops_the_broker_and_acknowledges_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let faults = haven_journal::Faults::new();
    let server = Server::start_with_faults(small_journal(dir.path()), Arc::clone(&faults))
        .await
        .unwrap();
    let conn = connect(&server).await;
    conn.send_receipted("/queue/f", &[], "stored")
        .await
        .unwrap();
    faults.fail_syncs(true);
    let lost = tokio::time::timeout(
        WAIT,
        conn.send_receipted("/queue/f", &[], "never acknowledged"),
    )
    .await;
    assert!(
        matches!(lost, Ok(Err(_))),
        "no RECEIPT for a message that could not be synced: {lost:?}"
    );
    let stopped = tokio::time::timeout(WAIT, server.wait())
        .await
        .expect("broker stops by itself");
    assert!(
        matches!(stopped, Err(ServerError::JournalFailed(_))),
        "{stopped:?}"
    );
    // A restart on the same journal (disk healthy again) still has the acknowledged message.
    faults.fail_syncs(false);
    let server = Server::start(small_journal(dir.path())).await.unwrap();
    let conn = connect(&server).await;
    let mut sub = conn
        .subscribe("/queue/f", AckMode::ClientIndividual, &[])
        .await
        .unwrap();
    let m = tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.body[..], b"stored");
    conn.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}
