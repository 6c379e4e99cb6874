//! Connections that once sent a large frame give back the read buffer it needed.
//!
//! The codec reserves room for a whole body at once, so a connection's read buffer grows to
//! its largest frame. Before `haven_stomp::release_large_read_buffer`, nothing shrank it: 20
//! idle connections that had each sent one 8 MiB message held about 195 MiB of the broker's
//! memory after the messages were consumed. Here they send and stay connected, a consumer
//! takes every message, and the broker's resident set must then be well under what the 20
//! buffers alone would hold. The broker runs as a real process so `VmRSS` is its own.

use std::time::Duration;

use bytes::Bytes;
use haven_client::{AckMode, ConnectOptions, Connection};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};

/// Producer connections, each sending one large message and then staying idle.
const SENDERS: usize = 20;
/// Body of each large message: under the default `stomp.frame_bytes_max` (10 MiB).
const BODY_BYTES: usize = 8 * 1024 * 1024;
/// How long a RECEIPT or a delivery may take on a loaded machine (a hang, not a speed bound).
const WAIT_MS: u64 = 60_000;
/// Time for the allocator to return freed memory to the kernel (its purge delay is 100 ms).
const SETTLE_MS: u64 = 1_000;
const MIB: u64 = 1024 * 1024;

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectOptions::default())
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_keep_the_buffers_of_their_large_frames() {
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("data"),
        free_addr(),
    );
    let mut broker = BrokerProcess::start(opts).unwrap_or_else(|e| panic!("broker starts: {e}"));
    let url = broker.stomp_url();
    let rss_at_start = broker.rss_bytes().expect("broker RSS at start");

    let mut senders = Vec::new();
    for n in 0..SENDERS {
        let conn = connect(&url).await;
        let body = Bytes::from(vec![b'0' + (n % 10) as u8; BODY_BYTES]);
        let sent = conn.send_receipted("/queue/large", &[("persistent", "false")], body);
        tokio::time::timeout(Duration::from_millis(WAIT_MS), sent)
            .await
            .unwrap_or_else(|_| panic!("SEND {n}: no RECEIPT within {WAIT_MS} ms"))
            .unwrap_or_else(|e| panic!("SEND {n}: {e}"));
        // Kept open and idle: what it holds on the broker is what this test measures.
        senders.push(conn);
    }

    let consumer = connect(&url).await;
    let mut sub = consumer
        .subscribe("/queue/large", AckMode::Auto, &[])
        .await
        .expect("SUBSCRIBE");
    for n in 0..SENDERS {
        let msg = tokio::time::timeout(Duration::from_millis(WAIT_MS), sub.next())
            .await
            .unwrap_or_else(|_| panic!("message {n}: not delivered within {WAIT_MS} ms"))
            .unwrap_or_else(|| panic!("message {n}: the consumer's connection closed"));
        assert_eq!(msg.body.len(), BODY_BYTES, "message {n} arrived whole");
    }
    consumer.disconnect().await.expect("consumer DISCONNECT");
    tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;

    let rss = broker.rss_bytes().expect("broker RSS after the drain");
    let retained_if_kept = (SENDERS * BODY_BYTES) as u64;
    eprintln!(
        "broker RSS: {} MiB at start, {} MiB with {SENDERS} idle senders after the drain \
         ({} MiB if each kept its buffer)",
        rss_at_start / MIB,
        rss / MIB,
        retained_if_kept / MIB
    );
    assert!(
        rss < rss_at_start + retained_if_kept / 2,
        "the broker holds {} MiB with {SENDERS} idle connections, started at {} MiB: their \
         read buffers kept the room of their {} MiB frames",
        rss / MIB,
        rss_at_start / MIB,
        BODY_BYTES as u64 / MIB
    );

    for conn in senders {
        conn.disconnect().await.expect("sender DISCONNECT");
    }
    broker.stop().expect("broker stops");
}
