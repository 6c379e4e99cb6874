//! Connections that once carried a large frame give back the buffer it needed.
//!
//! A connection's buffers grow to its largest frame: the codec reserves room for a whole body
//! when reading, and a MESSAGE is encoded whole into the write buffer. Before
//! `haven_stomp::release_large_read_buffer` and `is_empty_and_larger_than`, nothing shrank
//! them again: 20 idle connections that had each sent one 8 MiB message held about 195 MiB of
//! the broker's memory after the messages were consumed, and 20 idle consumers that had each
//! received one held 193 MiB. Here the connections carry their message and stay connected,
//! and the broker's resident set must then be well under what the 20 buffers alone would
//! hold. The broker runs as a real process so `VmRSS` is its own.

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

/// The broker's RSS with the `SENDERS` connections idle after carrying their large frames
/// must be under half of what their buffers would hold on top of where it started.
fn assert_buffers_given_back(broker: &mut BrokerProcess, rss_at_start: u64, who: &str) {
    let rss = broker.rss_bytes().expect("broker RSS");
    let retained_if_kept = (SENDERS * BODY_BYTES) as u64;
    eprintln!(
        "broker RSS: {} MiB at start, {} MiB with {SENDERS} idle {who} \
         ({} MiB more if each kept its buffer)",
        rss_at_start / MIB,
        rss / MIB,
        retained_if_kept / MIB
    );
    assert!(
        rss < rss_at_start + retained_if_kept / 2,
        "the broker holds {} MiB with {SENDERS} idle {who}, started at {} MiB: their \
         buffers kept the room of their {} MiB frames",
        rss / MIB,
        rss_at_start / MIB,
        BODY_BYTES as u64 / MIB
    );
}

fn start_broker(dir: &tempfile::TempDir) -> BrokerProcess {
    let opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("data"),
        free_addr(),
    );
    BrokerProcess::start(opts).unwrap_or_else(|e| panic!("broker starts: {e}"))
}

/// Connects over a plain socket, subscribes to `queue` with `ack:auto` and reads until one
/// whole MESSAGE of `BODY_BYTES` has arrived. Returns the open socket.
async fn raw_consume_one(addr: std::net::SocketAddr, queue: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let hello = format!(
        "CONNECT\naccept-version:1.2\nhost:/\n\n\0SUBSCRIBE\nid:1\ndestination:{queue}\nack:auto\n\n\0"
    );
    sock.write_all(hello.as_bytes())
        .await
        .expect("CONNECT and SUBSCRIBE");
    let mut seen: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    // CONNECTED, then a MESSAGE whose body alone is BODY_BYTES, ending in its NUL.
    while !(seen.len() > BODY_BYTES && seen.last() == Some(&0)) {
        let n = sock.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the broker closed the consumer's connection");
        seen.extend_from_slice(&chunk[..n]);
    }
    assert!(
        seen.windows(8).any(|w| w == b"MESSAGE\n"),
        "a MESSAGE arrived"
    );
    sock
}

/// Sends message `n`, a `BODY_BYTES` body, to `queue` and waits for its RECEIPT.
async fn send_large(conn: &Connection, queue: &str, n: usize) {
    let body = Bytes::from(vec![b'0' + (n % 10) as u8; BODY_BYTES]);
    let sent = conn.send_receipted(queue, &[("persistent", "false")], body);
    tokio::time::timeout(Duration::from_millis(WAIT_MS), sent)
        .await
        .unwrap_or_else(|_| panic!("SEND {n}: no RECEIPT within {WAIT_MS} ms"))
        .unwrap_or_else(|e| panic!("SEND {n}: {e}"));
}

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectOptions::default())
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_keep_the_buffers_of_their_large_frames() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut broker = start_broker(&dir);
    let url = broker.stomp_url();
    let rss_at_start = broker.rss_bytes().expect("broker RSS at start");

    let mut senders = Vec::new();
    for n in 0..SENDERS {
        let conn = connect(&url).await;
        send_large(&conn, "/queue/large", n).await;
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

    assert_buffers_given_back(&mut broker, rss_at_start, "senders");
    for conn in senders {
        conn.disconnect().await.expect("sender DISCONNECT");
    }
    broker.stop().expect("broker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_consumers_do_not_keep_the_buffers_of_their_large_messages() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut broker = start_broker(&dir);
    let url = broker.stomp_url();
    let rss_at_start = broker.rss_bytes().expect("broker RSS at start");

    // One message on each consumer's own queue, so that each consumer gets exactly one.
    let producer = connect(&url).await;
    for n in 0..SENDERS {
        send_large(&producer, &format!("/queue/large-{n}"), n).await;
    }
    producer.disconnect().await.expect("producer DISCONNECT");

    // Raw sockets that SUBSCRIBE without a receipt and read until the MESSAGE's closing NUL.
    // With `haven_client` consumers, which ask a RECEIPT for their SUBSCRIBE, the retention
    // did not show (most likely the small RECEIPT written after the MESSAGE moved the
    // buffer's start back, so the old check saw the whole allocation); these held 193 MiB.
    let mut consumers = Vec::new();
    for n in 0..SENDERS {
        let queue = format!("/queue/large-{n}");
        let sock = tokio::time::timeout(
            Duration::from_millis(WAIT_MS),
            raw_consume_one(broker.addr(), &queue),
        )
        .await
        .unwrap_or_else(|_| panic!("message {n}: not delivered within {WAIT_MS} ms"));
        // Kept open and idle: what it holds on the broker is what this test measures.
        consumers.push(sock);
    }
    tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;
    assert_buffers_given_back(&mut broker, rss_at_start, "consumers");

    drop(consumers);
    broker.stop().expect("broker stops");
}
