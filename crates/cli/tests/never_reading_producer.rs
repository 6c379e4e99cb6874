//! A producer that writes persistent SENDs with `receipt` headers as fast as it can and never
//! reads its socket, so the broker's RECEIPTs pile up towards it, next to a well-behaved
//! producer and consumer.
//!
//! What bounds the broker's memory: a connection's task writes its outbound frames before it
//! reads the next inbound frame (`connection.rs`, a `biased` select), so once the RECEIPTs
//! fill the socket buffers the write blocks, the task stops reading, and TCP pushes back on
//! the producer: it stalls. The broker holds at most the socket buffers and the few frames
//! already read. After `stomp.write_timeout_ms` without write progress the broker closes the
//! connection and the producer's next write fails.
//!
//! A sink consumer (auto ack) empties the non-readers' queues as they fill, so the broker's
//! memory is not dominated by the hundreds of thousands of messages they store (that cost is
//! `deep_backlog.rs`'s subject) and the peak RSS shows what the unread RECEIPTs cost. The
//! broker runs as a real process so its peak RSS (`VmHWM`) is the kernel's figure.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use haven_client::{AckMode, Client, ConnectOptions, Connection};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};

/// Never-reading connections at once.
const NON_READERS: usize = 4;
/// The broker's write timeout in this test (default 60 s, shortened so the test is short).
const WRITE_TIMEOUT_MS: u64 = 2_000;
/// Bytes of waiting messages the broker keeps in memory before paging to the journal; small,
/// so the unread producers' stored messages do not hide what their RECEIPTs cost.
const MEMORY_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Body of each hostile SEND.
const BODY_BYTES: usize = 256;
/// SENDs per `write_all`.
const BATCH_FRAMES: usize = 64;
/// A write that makes no progress for this long counts as a stall (the client's own timeout).
const CLIENT_WRITE_TIMEOUT_MS: u64 = 500;
/// Bound on how long a non-reader may keep writing before the broker must have closed it:
/// its write timeout plus room for a loaded machine. Not a timing assertion on the broker's
/// speed: a broker that never closes it fails, one that closes it late does not.
const CLOSE_WAIT_MS: u64 = 60_000;
/// Peak RSS bound for the broker. Measured on the 2-core machine (debug build, 2026-11-30):
/// 120 MiB peak with 4 non-readers, each closed after ~165,000 SENDs (~5 MB of unread
/// RECEIPTs: what loopback socket buffers hold, `tcp_wmem` max 4 MiB, before the broker's
/// write blocks). A control run in which the same 4 producers *do* read their RECEIPTs and send
/// the same 660,000 messages peaked at 124 MiB: the figure is the cost of the message rate
/// (journal batches, allocator caches), not of the unread RECEIPTs. The bound is ~2x that, for
/// a loaded CI machine; a broker that queued RECEIPTs in memory instead of stalling the
/// producer would also fail the stall and close checks below.
const RSS_PEAK_BYTES_MAX: u64 = 256 * 1024 * 1024;
/// The well-behaved producer sends this many messages while the non-readers run.
const POLITE_MESSAGES: u64 = 300;

const MIB: u64 = 1024 * 1024;

/// What happened to one never-reading connection.
#[derive(Debug, Default, Clone, Copy)]
struct NonReader {
    frames_written: u64,
    /// Writes that made no progress for `CLIENT_WRITE_TIMEOUT_MS`.
    stalls: u64,
    /// The broker closed the connection (a write failed), and when.
    closed_after_ms: Option<u64>,
}

fn hostile_send_batch(conn: usize, first: u64) -> Vec<u8> {
    let body = "h".repeat(BODY_BYTES);
    let mut out = Vec::new();
    for n in first..first + BATCH_FRAMES as u64 {
        out.extend_from_slice(
            format!(
                "SEND\ndestination:/queue/unread-{conn}\npersistent:true\nreceipt:r-{n}\n\n{body}\0"
            )
            .as_bytes(),
        );
    }
    out
}

/// Connects, reads the CONNECTED frame (the last read it ever does), then writes SENDs until
/// the broker closes the connection or `CLOSE_WAIT_MS` passes.
fn never_read(addr: SocketAddr, conn: usize) -> NonReader {
    let mut stream = TcpStream::connect(addr).expect("non-reader connects");
    stream
        .write_all(b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\0")
        .expect("CONNECT");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut connected = Vec::new();
    let mut byte = [0u8; 1];
    while !connected.ends_with(b"\0") {
        let n = stream.read(&mut byte).expect("read CONNECTED");
        assert_eq!(n, 1, "broker closed before CONNECTED");
        connected.push(byte[0]);
    }
    assert!(connected.starts_with(b"CONNECTED"), "{connected:?}");
    stream
        .set_write_timeout(Some(Duration::from_millis(CLIENT_WRITE_TIMEOUT_MS)))
        .unwrap();
    let start = Instant::now();
    let mut r = NonReader::default();
    let mut pending: Vec<u8> = Vec::new();
    while start.elapsed() < Duration::from_millis(CLOSE_WAIT_MS) {
        if pending.is_empty() {
            pending = hostile_send_batch(conn, r.frames_written);
            r.frames_written += BATCH_FRAMES as u64;
        }
        match stream.write(&pending) {
            Ok(0) => break,
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                r.stalls += 1;
            }
            Err(_) => {
                r.closed_after_ms = Some(start.elapsed().as_millis() as u64);
                break;
            }
        }
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_producer_that_never_reads_its_receipts_is_bounded_and_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("broker"),
        free_addr(),
    );
    opts.config_toml = Some(format!(
        "[stomp]\nwrite_timeout_ms = {WRITE_TIMEOUT_MS}\n[limits]\nmemory_bytes_max = {MEMORY_BYTES_MAX}\n"
    ));
    let mut broker = BrokerProcess::start(opts).expect("broker starts");
    let addr = broker.addr();
    let rss_start = broker.rss_bytes().expect("RSS at start");

    let polite = Client::connect(&broker.stomp_url(), ConnectOptions::default())
        .await
        .expect("polite client connects");
    let mut sub = polite
        .subscribe("/queue/polite", AckMode::ClientIndividual, &[])
        .await
        .expect("subscribe");

    // The sink: empties the non-readers' queues (auto ack), counting what it got.
    let sink = Connection::connect(&addr.to_string(), ConnectOptions::default())
        .await
        .expect("sink connects");
    let mut sink_tasks = Vec::new();
    for c in 0..NON_READERS {
        let mut s = sink
            .subscribe(&format!("/queue/unread-{c}"), AckMode::Auto, &[])
            .await
            .expect("sink subscribes");
        sink_tasks.push(tokio::spawn(async move {
            let mut got = 0u64;
            while s.next().await.is_some() {
                got += 1;
            }
            got
        }));
    }

    let non_readers: Vec<_> = (0..NON_READERS)
        .map(|c| tokio::task::spawn_blocking(move || never_read(addr, c)))
        .collect();

    // The well-behaved pair keeps working while the non-readers hammer the broker.
    let polite_started = Instant::now();
    for n in 0..POLITE_MESSAGES {
        tokio::time::timeout(
            Duration::from_secs(30),
            polite.send_receipted("/queue/polite", &[], n.to_string()),
        )
        .await
        .expect("the polite producer is served within 30 s")
        .expect("polite send");
        let m = tokio::time::timeout(Duration::from_secs(30), sub.next())
            .await
            .expect("the polite consumer is served within 30 s")
            .expect("subscription open");
        assert_eq!(&m.body[..], n.to_string().as_bytes());
        polite.ack(&m).await.expect("ack");
    }
    let polite_ms = polite_started.elapsed().as_millis();

    let mut results = Vec::new();
    for task in non_readers {
        results.push(task.await.expect("non-reader thread"));
    }
    let rss_peak = broker.rss_peak_bytes().expect("broker peak RSS");
    let rss_end = broker.rss_bytes().expect("broker RSS at the end");
    sink.disconnect().await.expect("sink disconnects");
    let mut sunk = 0;
    for t in sink_tasks {
        sunk += t.await.expect("sink task");
    }
    eprintln!(
        "never-reading producers: {results:?}; sink consumed {sunk}; polite round trips: \
         {POLITE_MESSAGES} in {polite_ms} ms; broker RSS at start {} MiB, peak {} MiB, at the end {} MiB",
        rss_start / MIB,
        rss_peak / MIB,
        rss_end / MIB
    );
    for r in &results {
        assert!(
            r.closed_after_ms.is_some(),
            "the broker never closed a producer that does not read: {r:?}"
        );
        assert!(
            r.stalls > 0,
            "the producer was never held back (no write stalled): {r:?}"
        );
    }
    assert!(
        rss_peak < RSS_PEAK_BYTES_MAX,
        "broker peak RSS {} MiB over the {} MiB bound",
        rss_peak / MIB,
        RSS_PEAK_BYTES_MAX / MIB
    );

    // Still serving after the non-readers were cut off.
    polite
        .send_receipted("/queue/polite", &[], "after")
        .await
        .expect("send after");
    let m = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("served after the non-readers were closed")
        .expect("subscription open");
    assert_eq!(&m.body[..], b"after");
    polite.ack(&m).await.expect("ack");
    polite.disconnect().await.expect("disconnect");
    broker.stop().expect("broker stops");
}
