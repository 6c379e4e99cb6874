//! Deep queue backlogs with a bounded broker memory (`[limits] memory_bytes_max`): a queue far
//! deeper than the memory budget must drain completely, every message exactly once with its own
//! body, while the broker's resident memory stays bounded — also when the backlog is recovered
//! from the journal after a restart. What a user would notice, checked here:
//!
//! 1. every message sent (receipted) arrives, once, with the body and header it was sent with —
//!    a body paged out and read back from the wrong place shows up as a mismatch, not as a
//!    silently different payload;
//! 2. nothing arrives that was not sent;
//! 3. the broker's peak resident set (`VmHWM`, read just before it is stopped) stays under a
//!    bound far below the backlog's size: the bodies of a deep backlog stay on disk.
//!
//! Fill and drain times are printed, never asserted (debug build, shared CI machine).
//!
//! Every message's body is a function of its number `n` (the number in decimal, then a pattern
//! seeded by `n`) and `n` is also sent as a header, so the consumer checks each delivery
//! completely from `n` alone and records arrivals in a bit set. The two tests run one at a time
//! (a process-wide lock) so that each one's printed timings are its own on a 2-core machine.

use std::path::Path;
use std::time::{Duration, Instant};

use haven_client::{AckMode, ConnectOptions, Connection, Message, Receipt};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};

const MIB: u64 = 1024 * 1024;

/// Messages in the backlog of the single-run test.
const DEEP_MESSAGES: u64 = 500_000;
const DEEP_MEMORY_BYTES_MAX: u64 = 32 * MIB;
const DEEP_RSS_PEAK_BYTES_MAX: u64 = 256 * MIB;
/// Messages in the backlog of the restart test.
const RESTART_MESSAGES: u64 = 100_000;
const RESTART_MEMORY_BYTES_MAX: u64 = 8 * MIB;
const RESTART_RSS_PEAK_BYTES_MAX: u64 = 128 * MIB;

const BODY_BYTES: usize = 1024;
/// Header carrying the message's number (the body carries it too).
const N_HEADER: &str = "deep-backlog-n";
/// The producer asks a RECEIPT every this many SENDs (and on the last one)...
const RECEIPT_EVERY: u64 = 1_000;
/// ...and keeps at most this many of them outstanding, so the fill is not latency-bound.
const RECEIPTS_OUTSTANDING_MAX: usize = 8;
/// The consumer (`ack:client`, cumulative) ACKs every this many deliveries and the last one.
const ACK_EVERY: u64 = 500;
/// The consumer's prefetch; larger than [`ACK_EVERY`] so deliveries never wait for an ACK.
const CONSUMER_PREFETCH: &str = "1000";
/// Bound on one RECEIPT (the broker fsyncs a batch of 1 KiB messages per receipt).
const RECEIPT_WAIT_MS: u64 = 60_000;
/// Bound on the wait for the next delivery while messages are still missing.
const DELIVERY_WAIT_MS: u64 = 30_000;
/// After the last expected message, deliveries are watched this long for anything extra.
const QUIET_AFTER_DRAIN_MS: u64 = 1_000;
/// Problems listed per kind in a failure message.
const PROBLEMS_SHOWN_MAX: usize = 20;

/// The tests in this file run one at a time (see the module comment).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config_toml(memory_bytes_max: u64) -> String {
    format!("[limits]\nmemory_bytes_max = {memory_bytes_max}\n")
}

/// The body of message `n`: `n` in ten decimal digits, `:`, then letters seeded by `n`.
fn body(n: u64) -> Vec<u8> {
    let mut body = format!("{n:010}:").into_bytes();
    assert!(body.len() < BODY_BYTES);
    let seed = n.wrapping_mul(7);
    body.extend((body.len()..BODY_BYTES).map(|i| b'a' + ((seed + i as u64) % 26) as u8));
    assert_eq!(body.len(), BODY_BYTES);
    body
}

/// The number a delivered body claims to be, if it is shaped like one of [`body`]'s.
fn body_number(body: &[u8]) -> Option<u64> {
    let digits = body.get(..10)?;
    if body.get(10) != Some(&b':') || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectOptions::default())
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

async fn await_receipt(receipt: Receipt, what: &str) {
    match tokio::time::timeout(Duration::from_millis(RECEIPT_WAIT_MS), receipt).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{what}: no RECEIPT, connection failed: {e}"),
        Err(_) => panic!("{what}: no RECEIPT within {RECEIPT_WAIT_MS} ms"),
    }
}

/// Sends messages `0..count` (persistent, one producer, pipelined receipts) and returns once
/// every one of them is receipted, i.e. stored.
async fn fill(url: &str, queue: &str, count: u64) -> Duration {
    assert!(count > 0);
    let started = Instant::now();
    let conn = connect(url).await;
    let mut pending: std::collections::VecDeque<(u64, Receipt)> = Default::default();
    for n in 0..count {
        let n_text = n.to_string();
        let headers = [("persistent", "true"), (N_HEADER, n_text.as_str())];
        let last = n + 1 == count;
        if last || (n + 1) % RECEIPT_EVERY == 0 {
            let receipt = conn
                .send_with_receipt_future(queue, &headers, body(n))
                .await
                .unwrap_or_else(|e| panic!("SEND {n}: {e}"));
            pending.push_back((n, receipt));
            if pending.len() > RECEIPTS_OUTSTANDING_MAX {
                let (upto, receipt) = pending.pop_front().expect("non-empty");
                await_receipt(receipt, &format!("SEND {upto}")).await;
            }
        } else {
            conn.send(queue, &headers, body(n))
                .await
                .unwrap_or_else(|e| panic!("SEND {n}: {e}"));
        }
    }
    for (upto, receipt) in pending {
        await_receipt(receipt, &format!("SEND {upto}")).await;
    }
    conn.disconnect().await.expect("producer DISCONNECT");
    started.elapsed()
}

/// What the tally looks at in a delivery. `haven_client::Message` cannot be built outside the
/// client crate (it carries the delivering connection), so the checker's self-test builds these.
struct Delivered {
    n_header: Option<String>,
    body: bytes::Bytes,
    destination: String,
    message_id: String,
    redelivered: bool,
}

impl From<&Message> for Delivered {
    fn from(msg: &Message) -> Delivered {
        Delivered {
            n_header: msg.header(N_HEADER).map(str::to_string),
            body: msg.body.clone(),
            destination: msg.destination.clone(),
            message_id: msg.message_id.clone(),
            redelivered: msg.redelivered,
        }
    }
}

/// What the consumer saw: arrivals of `0..expected` in a bit set, and every problem.
struct Tally {
    expected: u64,
    seen: Vec<u64>,
    distinct: u64,
    deliveries: u64,
    redelivered: u64,
    /// A number delivered a second time.
    duplicates: Vec<String>,
    /// A delivery that is not one of the messages sent (bad number, body or header).
    foreign: Vec<String>,
}

impl Tally {
    fn new(expected: u64) -> Tally {
        Tally {
            expected,
            seen: vec![0; expected.div_ceil(64) as usize],
            distinct: 0,
            deliveries: 0,
            redelivered: 0,
            duplicates: Vec::new(),
            foreign: Vec::new(),
        }
    }

    fn record(&mut self, msg: &Delivered, queue: &str) {
        self.deliveries += 1;
        if msg.redelivered {
            self.redelivered += 1;
        }
        let Some(n) = body_number(&msg.body) else {
            let shown = &msg.body[..msg.body.len().min(40)];
            self.foreign.push(format!(
                "message-id {}: body of {} bytes does not start with a number: {:?}",
                msg.message_id,
                msg.body.len(),
                String::from_utf8_lossy(shown)
            ));
            return;
        };
        if n >= self.expected {
            self.foreign.push(format!(
                "message-id {}: number {n} was never sent",
                msg.message_id
            ));
            return;
        }
        if msg.body[..] != body(n)[..] {
            self.foreign.push(format!(
                "{n} (message-id {}): body of {} bytes differs from the one sent",
                msg.message_id,
                msg.body.len()
            ));
            return;
        }
        let header = msg.n_header.as_deref();
        if header != Some(n.to_string().as_str()) || msg.destination != queue {
            self.foreign.push(format!(
                "{n} (message-id {}): header {N_HEADER}={header:?}, destination {} (sent \
                 {N_HEADER}={n} to {queue})",
                msg.message_id, msg.destination
            ));
            return;
        }
        let (word, bit) = ((n / 64) as usize, n % 64);
        if self.seen[word] & (1 << bit) != 0 {
            self.duplicates.push(format!(
                "{n} (message-id {}, redelivered:{})",
                msg.message_id, msg.redelivered
            ));
            return;
        }
        self.seen[word] |= 1 << bit;
        self.distinct += 1;
    }

    fn complete(&self) -> bool {
        self.distinct == self.expected
    }

    fn missing(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.expected).filter(|n| self.seen[(n / 64) as usize] & (1 << (n % 64)) == 0)
    }

    /// Panics with every kind of problem found, and the broker's log tail.
    fn assert_exactly_once(&self, test: &str, log_tail: &str) {
        assert!(self.distinct <= self.expected);
        let missing = self.expected - self.distinct;
        if missing == 0 && self.duplicates.is_empty() && self.foreign.is_empty() {
            return;
        }
        let first_missing: Vec<u64> = self.missing().take(PROBLEMS_SHOWN_MAX).collect();
        panic!(
            "{test}: expected 0..{} exactly once; deliveries {}, distinct {}\n\
             (1) {missing} never delivered, first: {first_missing:?}\n\
             (1) {} delivered again, first: {:#?}\n\
             (2) {} not among those sent, first: {:#?}\n\
             broker log tail:\n{log_tail}",
            self.expected,
            self.deliveries,
            self.distinct,
            self.duplicates.len(),
            first(&self.duplicates),
            self.foreign.len(),
            first(&self.foreign),
        );
    }
}

fn first<T>(items: &[T]) -> &[T] {
    &items[..items.len().min(PROBLEMS_SHOWN_MAX)]
}

/// One `ack:client` consumer reads until every expected number arrived (or no delivery came for
/// [`DELIVERY_WAIT_MS`]), ACKs cumulatively every [`ACK_EVERY`] messages and the last one with a
/// receipt, then watches [`QUIET_AFTER_DRAIN_MS`] more for extra deliveries.
async fn drain(url: &str, queue: &str, tally: &mut Tally) -> Duration {
    let started = Instant::now();
    let conn = connect(url).await;
    let mut sub = conn
        .subscribe(
            queue,
            AckMode::Client,
            &[("activemq.prefetchSize", CONSUMER_PREFETCH)],
        )
        .await
        .expect("SUBSCRIBE");
    let mut unacked: u64 = 0;
    while !tally.complete() {
        let wait = Duration::from_millis(DELIVERY_WAIT_MS);
        let msg = match tokio::time::timeout(wait, sub.next()).await {
            Ok(Some(msg)) => msg,
            Ok(None) => {
                eprintln!(
                    "deep_backlog: consumer connection closed after {} deliveries: {:?}",
                    tally.deliveries,
                    conn.close_reason()
                );
                return started.elapsed();
            }
            Err(_) => {
                eprintln!(
                    "deep_backlog: no delivery for {DELIVERY_WAIT_MS} ms after {} deliveries \
                     ({} distinct)",
                    tally.deliveries, tally.distinct
                );
                return started.elapsed();
            }
        };
        tally.record(&Delivered::from(&msg), queue);
        unacked += 1;
        if tally.complete() {
            conn.ack_receipted(&msg).await.expect("final ACK receipted");
        } else if unacked >= ACK_EVERY {
            conn.ack(&msg).await.expect("ACK");
            unacked = 0;
        }
    }
    let elapsed = started.elapsed();
    let quiet = Duration::from_millis(QUIET_AFTER_DRAIN_MS);
    while let Ok(Some(msg)) = tokio::time::timeout(quiet, sub.next()).await {
        tally.record(&Delivered::from(&msg), queue);
    }
    conn.disconnect().await.expect("consumer DISCONNECT");
    elapsed
}

/// Bytes the files under `dir` occupy on disk (allocated blocks, like `du`).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

fn rate(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn start_broker(dir: &Path, memory_bytes_max: u64) -> BrokerProcess {
    let mut opts = BrokerOpts::new(env!("CARGO_BIN_EXE_haven"), dir.join("data"), free_addr());
    opts.config_toml = Some(config_toml(memory_bytes_max));
    BrokerProcess::start(opts).unwrap_or_else(|e| panic!("broker starts: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_backlog_drains_exactly_once_in_bounded_memory() {
    let _serial = SERIAL.lock().await;
    let queue = "/queue/deep-backlog";
    let dir = tempfile::tempdir().unwrap();
    let mut broker = start_broker(dir.path(), DEEP_MEMORY_BYTES_MAX);
    let url = broker.stomp_url();

    let fill_time = fill(&url, queue, DEEP_MESSAGES).await;
    let rss_after_fill = broker.rss_bytes().expect("broker RSS after the fill");
    let data_bytes = disk_bytes(broker.data_dir());
    let mut tally = Tally::new(DEEP_MESSAGES);
    let drain_time = drain(&url, queue, &mut tally).await;
    let rss_peak = broker.rss_peak_bytes().expect("broker peak RSS");
    let log_tail = broker.log_tail();
    broker.stop().expect("broker stops");

    eprintln!(
        "deep_backlog: {DEEP_MESSAGES} x {BODY_BYTES} B persistent, memory_bytes_max {:.0} MiB: \
         fill {fill_time:.2?} ({:.0} msg/s), data dir {:.0} MiB on disk, RSS after fill \
         {:.1} MiB; drain {drain_time:.2?} ({:.0} msg/s), deliveries {} (redelivered {}); \
         peak RSS {:.1} MiB (bound {:.0} MiB)",
        mib(DEEP_MEMORY_BYTES_MAX),
        rate(DEEP_MESSAGES, fill_time),
        mib(data_bytes),
        mib(rss_after_fill),
        rate(tally.deliveries, drain_time),
        tally.deliveries,
        tally.redelivered,
        mib(rss_peak),
        mib(DEEP_RSS_PEAK_BYTES_MAX),
    );
    tally.assert_exactly_once("deep_backlog", &log_tail);
    assert!(
        rss_peak < DEEP_RSS_PEAK_BYTES_MAX,
        "broker peak RSS {:.1} MiB >= {:.0} MiB with a {:.0} MiB backlog and memory_bytes_max \
         {:.0} MiB: message bodies were held in memory",
        mib(rss_peak),
        mib(DEEP_RSS_PEAK_BYTES_MAX),
        mib(DEEP_MESSAGES * BODY_BYTES as u64),
        mib(DEEP_MEMORY_BYTES_MAX),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_backlog_recovered_after_restart_drains_in_bounded_memory() {
    let _serial = SERIAL.lock().await;
    let queue = "/queue/deep-backlog-restart";
    let dir = tempfile::tempdir().unwrap();
    let mut broker = start_broker(dir.path(), RESTART_MEMORY_BYTES_MAX);
    let url = broker.stomp_url();

    let fill_time = fill(&url, queue, RESTART_MESSAGES).await;
    let rss_peak_before = broker
        .rss_peak_bytes()
        .expect("broker peak RSS before restart");
    let stopping = Instant::now();
    let status = broker.stop().expect("broker stops");
    let stop_time = stopping.elapsed();
    assert!(
        status.success(),
        "graceful stop ended with {status} after {stop_time:.2?} (SIGKILL after {} ms)\n\
         broker log tail:\n{}",
        haven_testkit::STOP_TIMEOUT_MS,
        broker.log_tail()
    );
    let restarting = Instant::now();
    broker
        .restart()
        .unwrap_or_else(|e| panic!("broker restarts on the backlog: {e}"));
    let restart_time = restarting.elapsed();
    let rss_after_recovery = broker.rss_bytes().expect("broker RSS after recovery");

    let mut tally = Tally::new(RESTART_MESSAGES);
    let drain_time = drain(&url, queue, &mut tally).await;
    let rss_peak = broker
        .rss_peak_bytes()
        .expect("broker peak RSS after restart");
    let log_tail = broker.log_tail();
    broker.stop().expect("broker stops");

    eprintln!(
        "deep_backlog_restart: {RESTART_MESSAGES} x {BODY_BYTES} B persistent, \
         memory_bytes_max {:.0} MiB: fill {fill_time:.2?} ({:.0} msg/s), peak RSS before \
         restart {:.1} MiB; graceful stop {stop_time:.2?}, restart to CONNECTED \
         {restart_time:.2?}, RSS after recovery {:.1} MiB; drain {drain_time:.2?} ({:.0} msg/s), \
         deliveries {} (redelivered {}); peak RSS after restart {:.1} MiB (bound {:.0} MiB)",
        mib(RESTART_MEMORY_BYTES_MAX),
        rate(RESTART_MESSAGES, fill_time),
        mib(rss_peak_before),
        mib(rss_after_recovery),
        rate(tally.deliveries, drain_time),
        tally.deliveries,
        tally.redelivered,
        mib(rss_peak),
        mib(RESTART_RSS_PEAK_BYTES_MAX),
    );
    tally.assert_exactly_once("deep_backlog_restart", &log_tail);
    assert!(
        rss_peak < RESTART_RSS_PEAK_BYTES_MAX,
        "broker peak RSS after restart {:.1} MiB >= {:.0} MiB with a {:.0} MiB backlog and \
         memory_bytes_max {:.0} MiB: recovery or the drain held message bodies in memory",
        mib(rss_peak),
        mib(RESTART_RSS_PEAK_BYTES_MAX),
        mib(RESTART_MESSAGES * BODY_BYTES as u64),
        mib(RESTART_MEMORY_BYTES_MAX),
    );
}

/// The checker itself: a missing number, a repeat, a wrong body, a wrong header and a number
/// never sent are each caught, so a green run above means what it says.
#[test]
fn tally_catches_missing_repeated_and_foreign_deliveries() {
    let queue = "/queue/q";
    let msg = |id: &str, n_header: &str, body: Vec<u8>| Delivered {
        n_header: Some(n_header.to_string()),
        body: body.into(),
        destination: queue.to_string(),
        message_id: id.to_string(),
        redelivered: false,
    };
    let mut tally = Tally::new(4);
    tally.record(&msg("m0", "0", body(0)), queue);
    tally.record(&msg("m1", "1", body(1)), queue);
    assert!(tally.duplicates.is_empty() && tally.foreign.is_empty());
    tally.record(&msg("m1-again", "1", body(1)), queue);
    assert_eq!(tally.duplicates.len(), 1);
    let mut torn = body(2);
    torn[BODY_BYTES - 1] ^= 1;
    tally.record(&msg("m2-torn", "2", torn), queue);
    tally.record(&msg("m2-header", "3", body(2)), queue);
    tally.record(&msg("m9", "9", body(9)), queue);
    tally.record(&msg("junk", "0", b"junk".to_vec()), queue);
    assert_eq!(tally.foreign.len(), 4, "{:#?}", tally.foreign);
    assert!(!tally.complete());
    assert_eq!(tally.missing().collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(body_number(&body(123_456)), Some(123_456));
    let caught = std::panic::catch_unwind(|| tally.assert_exactly_once("self-test", ""));
    assert!(caught.is_err());
}
