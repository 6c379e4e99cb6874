//! `kill -9` loop: persistent SENDs with receipts from two producers, and a client-individual
//! consumer acking with receipts, all while the real broker is killed and restarted at least 20
//! times; then a final drain. What a user would notice, checked over the whole run:
//!
//! 1. every receipted SEND is delivered at least once (during the loop or in the drain);
//! 2. a message whose ACK was receipted is never delivered again (a receipted ACK is durable:
//!    a later delivery means the message was stored twice or resurrected);
//! 3. no message is delivered a second time without `redelivered:true`;
//! 4. nothing arrives that was never sent.
//!
//! A SEND whose RECEIPT never came (the broker died first) may or may not have been stored; an
//! ACK whose RECEIPT never came may or may not have been applied. Those are counted but owe
//! nothing. Producers never resend, so a second delivery of one id can only come from the
//! broker. After a restart Haven marks every recovered message `redelivered:true` (it cannot
//! know whether it was dispatched before the crash), so (3) is mostly about deliveries within
//! one broker run; (2) is what catches a crash resurrecting acked messages.
//!
//! The consumer runs one session (connection + subscription) at a time: when the broker dies it
//! waits for every outstanding ACK to resolve (receipted or failed) before reconnecting, so an
//! ACK receipt is always recorded before any delivery from a later session is looked at.
//!
//! The kill schedule is random but seeded: the seed is printed, and HAVEN_KILL9_SEED=<seed>
//! replays the same intervals (thread timing still differs between runs). On failure the data
//! directory and the broker log are kept and their paths printed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use haven_client::{AckMode, ConnectOptions, Connection, Receipt, Subscription};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};
use rand::{rngs::StdRng, Rng, SeedableRng};

const QUEUE: &str = "/queue/kill9";
/// In-memory budget of the queue under test, in bytes: a few messages.
const MEMORY_BYTES_MAX: u64 = 8 * 1024;
const KILLS: u32 = 20;
const PRODUCERS: usize = 2;
/// Receipts each producer keeps outstanding (pipelining, so group commit has work to batch).
const RECEIPTS_OUTSTANDING_MAX: usize = 16;
/// ACK receipts the consumer keeps outstanding; it stops reading deliveries at this bound.
/// Large enough that the consumer keeps up with the producers: most first deliveries then
/// happen in the broker run that stored the message (`redelivered:false`), so check (3) has
/// something to bite on instead of seeing recovered, flagged messages only.
const ACKS_OUTSTANDING_MAX: usize = 128;
/// The consumer's prefetch (unacked deliveries the broker may have in flight to it).
const CONSUMER_PREFETCH: &str = "256";
/// Bound on one ACK's RECEIPT; a broker kill fails it at once (the connection closes).
const ACK_RECEIPT_WAIT_MS: u64 = 10_000;
/// Bounds on the time between a broker becoming ready and its `kill -9`.
const KILL_AFTER_MS: std::ops::Range<u64> = 100..900;
/// After the last restart, producers run this long; some receipts must arrive in it.
const HEALING_MS: u64 = 1_000;
/// The drain ends once every owed id arrived and the queue stayed quiet this long.
const DRAIN_QUIET_MS: u64 = 1_500;
/// Bound on waiting for a message while owed ids are still missing.
const DRAIN_MISSING_WAIT_MS: u64 = 15_000;
/// How often a consumer session looks at its stop condition while no frame arrives.
const CONSUMER_TICK_MS: u64 = 50;
/// Violations listed per kind in a failure message.
const VIOLATIONS_SHOWN_MAX: usize = 20;

#[derive(Default)]
struct Ledger {
    /// Every id a producer tried to SEND, inserted before the frame is queued.
    attempted: Mutex<HashSet<String>>,
    receipted: Mutex<HashSet<String>>,
}

/// One delivery of an id, as the consumer saw it.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    /// Consumer session (connection) number, from 1; the final drain continues the numbering.
    session: u32,
    /// The broker start (1 = first process) that was current when the delivery was read.
    broker_start: u32,
    redelivered: bool,
}

/// `session 3 (broker start 2, redelivered:true), ...` for failure messages.
fn describe(deliveries: &[Delivery]) -> String {
    deliveries
        .iter()
        .map(|d| {
            format!(
                "session {} (broker start {}, redelivered:{})",
                d.session, d.broker_start, d.redelivered
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Default)]
struct IdHistory {
    deliveries: Vec<Delivery>,
    /// Set when an ACK of this id got its RECEIPT: (session, broker start) at that moment.
    ack_receipted: Option<(u32, u32)>,
}

/// Everything the consumer saw, plus the violations found on the way.
#[derive(Default)]
struct ConsumerLog {
    ids: HashMap<String, IdHistory>,
    deliveries: u64,
    redelivered: u64,
    /// Deliveries of an id seen before, with `redelivered:true` (allowed).
    duplicates_flagged: u64,
    acks_sent: u64,
    acks_receipted: u64,
    acks_failed: u64,
    sessions: u32,
    /// (2) delivered after an ACK of it was receipted.
    after_receipted_ack: Vec<String>,
    /// (3) delivered again without `redelivered:true`.
    unflagged_duplicates: Vec<String>,
    /// (4) never sent (or no/garbled `kill9-id`).
    never_sent: Vec<String>,
}

impl ConsumerLog {
    /// Records one MESSAGE; returns its id when it can be acked (it carries one).
    fn delivered(
        &mut self,
        msg: &haven_client::Message,
        session: u32,
        broker_start: u32,
        ledger: &Ledger,
    ) -> Option<String> {
        self.deliveries += 1;
        if msg.redelivered {
            self.redelivered += 1;
        }
        let Some(id) = msg.header("kill9-id").map(str::to_string) else {
            self.never_sent.push(format!(
                "message-id {} without kill9-id (session {session}, broker start {broker_start})",
                msg.message_id
            ));
            return None;
        };
        if msg.body[..] != *id.as_bytes() || msg.destination != QUEUE {
            self.never_sent.push(format!(
                "{id}: body {:?} / destination {} do not match (session {session}, broker \
                 start {broker_start})",
                String::from_utf8_lossy(&msg.body),
                msg.destination
            ));
        } else if !ledger.attempted.lock().unwrap().contains(&id) {
            self.never_sent.push(format!(
                "{id}: never sent (session {session}, broker start {broker_start})"
            ));
        }
        let history = self.ids.entry(id.clone()).or_default();
        let this = Delivery {
            session,
            broker_start,
            redelivered: msg.redelivered,
        };
        if let Some((ack_session, ack_start)) = history.ack_receipted {
            self.after_receipted_ack.push(format!(
                "{id}: ACK receipted in session {ack_session} (broker start {ack_start}), then \
                 delivered again in session {session} (broker start {broker_start}, \
                 redelivered:{}); earlier deliveries: {}",
                msg.redelivered,
                describe(&history.deliveries)
            ));
        }
        if !history.deliveries.is_empty() {
            if msg.redelivered {
                self.duplicates_flagged += 1;
            } else {
                self.unflagged_duplicates.push(format!(
                    "{id}: delivered again without redelivered:true in session {session} \
                     (broker start {broker_start}); earlier deliveries: {}",
                    describe(&history.deliveries)
                ));
            }
        }
        history.deliveries.push(this);
        Some(id)
    }

    fn ack_resolved(&mut self, id: &str, receipted: bool, session: u32, broker_start: u32) {
        if receipted {
            self.acks_receipted += 1;
            let history = self.ids.get_mut(id).expect("acked ids were delivered");
            history.ack_receipted.get_or_insert((session, broker_start));
        } else {
            self.acks_failed += 1;
        }
    }

    fn violations(&self) -> usize {
        self.after_receipted_ack.len() + self.unflagged_duplicates.len() + self.never_sent.len()
    }
}

/// What ends a consumer session other than the connection closing.
enum StopWhen<'a> {
    /// During the loop: the flag is set once the producers have stopped.
    Flag(&'a AtomicBool),
    /// Final drain: every owed id was delivered (at some point of the run) and nothing arrived
    /// for [`DRAIN_QUIET_MS`], or owed ids are missing and nothing arrived for
    /// [`DRAIN_MISSING_WAIT_MS`].
    Drained(&'a HashSet<String>),
}

#[derive(Debug, PartialEq, Eq)]
enum SessionEnd {
    Closed,
    Stopped,
}

/// Reads deliveries and acks each with a receipt (up to [`ACKS_OUTSTANDING_MAX`] outstanding)
/// until `stop` or the connection closes. Returns only once every ACK it sent has resolved.
async fn consume_session(
    conn: &Connection,
    sub: &mut Subscription,
    session: u32,
    broker_start: &AtomicU32,
    ledger: &Ledger,
    log: &Mutex<ConsumerLog>,
    stop: StopWhen<'_>,
) -> SessionEnd {
    let mut acks: FuturesUnordered<BoxFuture<'static, (String, bool)>> = FuturesUnordered::new();
    let mut last_delivery = Instant::now();
    let end = loop {
        let stopping = match &stop {
            StopWhen::Flag(flag) => flag.load(Ordering::Relaxed),
            StopWhen::Drained(owed) => {
                let log = log.lock().unwrap();
                let missing = owed.iter().any(|id| !log.ids.contains_key(id));
                let quiet_ms = if missing {
                    DRAIN_MISSING_WAIT_MS
                } else {
                    DRAIN_QUIET_MS
                };
                acks.is_empty() && last_delivery.elapsed() >= Duration::from_millis(quiet_ms)
            }
        };
        if stopping {
            break SessionEnd::Stopped;
        }
        tokio::select! {
            Some((id, receipted)) = acks.next(), if !acks.is_empty() => {
                let start = broker_start.load(Ordering::Relaxed);
                log.lock().unwrap().ack_resolved(&id, receipted, session, start);
            }
            next = sub.next(), if acks.len() < ACKS_OUTSTANDING_MAX => {
                let Some(msg) = next else { break SessionEnd::Closed };
                last_delivery = Instant::now();
                let start = broker_start.load(Ordering::Relaxed);
                let id = log.lock().unwrap().delivered(&msg, session, start, ledger);
                if let Some(id) = id {
                    log.lock().unwrap().acks_sent += 1;
                    let conn = conn.clone();
                    acks.push(async move {
                        let wait = Duration::from_millis(ACK_RECEIPT_WAIT_MS);
                        let receipted =
                            matches!(tokio::time::timeout(wait, conn.ack_receipted(&msg)).await,
                                     Ok(Ok(())));
                        (id, receipted)
                    }
                    .boxed());
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(CONSUMER_TICK_MS)) => {}
        }
    };
    // Every ACK of this session resolves before the caller may open the next session.
    while let Some((id, receipted)) = acks.next().await {
        let start = broker_start.load(Ordering::Relaxed);
        log.lock()
            .unwrap()
            .ack_resolved(&id, receipted, session, start);
    }
    end
}

async fn connect_and_subscribe(url: &str) -> Option<(Connection, Subscription)> {
    let opts = ConnectOptions {
        connect_timeout_ms: 2_000,
        ..ConnectOptions::default()
    };
    let conn = Connection::connect(url, opts).await.ok()?;
    let sub = conn
        .subscribe(
            QUEUE,
            AckMode::ClientIndividual,
            &[("activemq.prefetchSize", CONSUMER_PREFETCH)],
        )
        .await
        .ok()?;
    Some((conn, sub))
}

/// The consumer during the kill loop: reconnects after every broker death until `stop`.
async fn consume_during_loop(
    url: String,
    stop: Arc<AtomicBool>,
    broker_start: Arc<AtomicU32>,
    ledger: Arc<Ledger>,
    log: Arc<Mutex<ConsumerLog>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let Some((conn, mut sub)) = connect_and_subscribe(&url).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let session = {
            let mut log = log.lock().unwrap();
            log.sessions += 1;
            log.sessions
        };
        let end = consume_session(
            &conn,
            &mut sub,
            session,
            &broker_start,
            &ledger,
            &log,
            StopWhen::Flag(&stop),
        )
        .await;
        if end == SessionEnd::Stopped {
            // Unacked deliveries go back to the queue (redelivered:true) for the drain.
            let _ = conn.disconnect().await;
        }
    }
}

fn seed() -> u64 {
    match std::env::var("HAVEN_KILL9_SEED") {
        Ok(s) => s.parse().expect("HAVEN_KILL9_SEED must be a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// Sends `p<N>-<seq>` ids until `stop`, reconnecting after every failure. Records an id as
/// receipted only when its RECEIPT arrived.
async fn produce(producer: usize, url: String, stop: Arc<AtomicBool>, ledger: Arc<Ledger>) {
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let opts = ConnectOptions {
            connect_timeout_ms: 2_000,
            ..ConnectOptions::default()
        };
        let conn = match Connection::connect(&url, opts).await {
            Ok(conn) => conn,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let mut pending: VecDeque<(String, Receipt)> = VecDeque::new();
        'session: while !stop.load(Ordering::Relaxed) {
            while pending.len() < RECEIPTS_OUTSTANDING_MAX {
                let id = format!("p{producer}-{seq}");
                seq += 1;
                ledger.attempted.lock().unwrap().insert(id.clone());
                let headers = [("persistent", "true"), ("kill9-id", id.as_str())];
                match conn
                    .send_with_receipt_future(QUEUE, &headers, id.clone())
                    .await
                {
                    Ok(receipt) => pending.push_back((id, receipt)),
                    Err(_) => break 'session,
                }
            }
            let (id, receipt) = pending.pop_front().expect("window is non-empty");
            match receipt.await {
                Ok(()) => {
                    ledger.receipted.lock().unwrap().insert(id);
                }
                Err(_) => break 'session,
            }
        }
        // Receipts that already arrived (or arrive soon, when stopping) still count.
        for (id, receipt) in pending {
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), receipt).await {
                ledger.receipted.lock().unwrap().insert(id);
            }
        }
    }
}

fn first<T>(items: &[T]) -> &[T] {
    &items[..items.len().min(VIOLATIONS_SHOWN_MAX)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipted_messages_survive_repeated_kill9() {
    let seed = seed();
    println!("kill9_loop: seed={seed} (HAVEN_KILL9_SEED={seed} replays the kill schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let mut opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("data"),
        free_addr(),
    );
    // A tiny memory budget for the queue: beyond a couple of waiting messages the backlog is
    // paged out to the journal, so the kills also hit paging, paged recovery and compaction of
    // paged-out messages.
    opts.config_toml = Some(format!(
        "[[limits.destination]]\ndestination = \"{QUEUE}\"\nmemory_bytes_max = {MEMORY_BYTES_MAX}\n"
    ));
    let mut broker = BrokerProcess::start(opts).expect("broker starts");
    let url = broker.stomp_url();

    let stop = Arc::new(AtomicBool::new(false));
    let broker_start = Arc::new(AtomicU32::new(broker.starts()));
    let ledger = Arc::new(Ledger::default());
    let log = Arc::new(Mutex::new(ConsumerLog::default()));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(p, url.clone(), stop.clone(), ledger.clone())))
        .collect();
    let consumer = tokio::spawn(consume_during_loop(
        url.clone(),
        stop.clone(),
        broker_start.clone(),
        ledger.clone(),
        log.clone(),
    ));

    for kill in 1..=KILLS {
        let after_ms = rng.gen_range(KILL_AFTER_MS);
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        broker.kill9().expect("kill -9");
        let receipted = ledger.receipted.lock().unwrap().len();
        let (delivered, acked) = {
            let log = log.lock().unwrap();
            (log.deliveries, log.acks_receipted)
        };
        println!(
            "kill9_loop: kill {kill}/{KILLS} after {after_ms} ms; so far receipted {receipted}, \
             delivered {delivered}, acks receipted {acked}"
        );
        let restart_started = Instant::now();
        broker
            .restart()
            .unwrap_or_else(|e| panic!("restart after kill {kill} failed (seed {seed}): {e}"));
        broker_start.store(broker.starts(), Ordering::Relaxed);
        let restart_ms = restart_started.elapsed().as_millis();
        if restart_ms > 1_000 {
            println!("kill9_loop: restart after kill {kill} took {restart_ms} ms");
        }
    }

    // Healing phase: the broker stays up; producers must make progress.
    let before_healing = ledger.receipted.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(HEALING_MS)).await;
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        tokio::time::timeout(Duration::from_secs(30), p)
            .await
            .expect("producer stops")
            .expect("producer task");
    }
    tokio::time::timeout(Duration::from_secs(30), consumer)
        .await
        .expect("consumer stops")
        .expect("consumer task");
    let receipted = ledger.receipted.lock().unwrap().clone();
    assert!(
        receipted.len() > before_healing,
        "no receipt after the last restart (seed {seed}): the broker did not recover to serve"
    );
    let loop_summary = {
        let log = log.lock().unwrap();
        format!(
            "sessions={} delivered={} acks_receipted={}",
            log.sessions, log.deliveries, log.acks_receipted
        )
    };

    // Final drain on a fresh connection, with the same bookkeeping and checks.
    let (drain_conn, mut drain_sub) = connect_and_subscribe(&url)
        .await
        .expect("drain consumer connects and subscribes");
    let drain_session = {
        let mut log = log.lock().unwrap();
        log.sessions += 1;
        log.sessions
    };
    let end = consume_session(
        &drain_conn,
        &mut drain_sub,
        drain_session,
        &broker_start,
        &ledger,
        &log,
        StopWhen::Drained(&receipted),
    )
    .await;
    assert_eq!(
        end,
        SessionEnd::Stopped,
        "drain connection closed (seed {seed}): {:?}\nbroker log tail:\n{}",
        drain_conn.close_reason(),
        broker.log_tail()
    );
    let _ = drain_conn.disconnect().await;
    let log_tail = broker.log_tail();
    broker.stop().expect("broker stops");
    // How often the backlog outgrew memory (for the record; depends on timing).
    let broker_log = std::fs::read_to_string(dir.path().join("data.log")).unwrap_or_default();
    let paging_starts = broker_log.matches("memory limit reached").count();
    println!("kill9_loop: the backlog was paged out {paging_starts} time(s)");

    let log = log.lock().unwrap();
    let mut missing: Vec<&String> = receipted
        .iter()
        .filter(|id| !log.ids.contains_key(*id))
        .collect();
    missing.sort();
    let delivered_without_receipt = log.ids.keys().filter(|id| !receipted.contains(*id)).count();
    let attempted = ledger.attempted.lock().unwrap().len();
    println!(
        "kill9_loop: seed={seed} kills={KILLS} sent={attempted} receipted={} \
         delivered={} delivered_unique={} delivered_without_receipt={delivered_without_receipt} \
         redelivered_flagged={} duplicates_with_flag={} acks_sent={} acks_receipted={} \
         acks_failed={} consumer_sessions={} (loop: {loop_summary}) missing={} \
         acked_then_redelivered={} duplicates_without_flag={} never_sent={} elapsed={:?}",
        receipted.len(),
        log.deliveries,
        log.ids.len(),
        log.redelivered,
        log.duplicates_flagged,
        log.acks_sent,
        log.acks_receipted,
        log.acks_failed,
        log.sessions,
        missing.len(),
        log.after_receipted_ack.len(),
        log.unflagged_duplicates.len(),
        log.never_sent.len(),
        started.elapsed(),
    );

    if !missing.is_empty() || log.violations() > 0 {
        // Keep the evidence: the data directory as the last run left it, and the broker log.
        let kept = dir.keep();
        panic!(
            "kill9_loop failed (seed {seed}); data and log kept in {}\n\
             (1) {} receipted messages never delivered, first: {:?}\n\
             (2) {} deliveries after a receipted ACK, first: {:#?}\n\
             (3) {} repeat deliveries without redelivered:true, first: {:#?}\n\
             (4) {} deliveries of messages never sent, first: {:#?}\n\
             broker log tail:\n{log_tail}",
            kept.display(),
            missing.len(),
            first(&missing),
            log.after_receipted_ack.len(),
            first(&log.after_receipted_ack),
            log.unflagged_duplicates.len(),
            first(&log.unflagged_duplicates),
            log.never_sent.len(),
            first(&log.never_sent),
        );
    }
}
