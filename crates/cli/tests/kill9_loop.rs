//! `kill -9` loop: persistent SENDs with receipts from two producers while the real broker is
//! killed and restarted at least 20 times. Afterwards every receipted message must be
//! delivered, and no message may be delivered twice unless marked `redelivered:true`.
//!
//! A SEND whose RECEIPT never came (the broker died first) may or may not have been stored;
//! the test counts those but only the receipted ones are owed. Producers never resend, so a
//! second delivery of one id can only come from the broker.
//!
//! The kill schedule is random but seeded: the seed is printed, and HAVEN_KILL9_SEED=<seed>
//! replays the same intervals.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haven_client::{AckMode, ConnectOptions, Connection, Receipt};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};
use rand::{rngs::StdRng, Rng, SeedableRng};

const QUEUE: &str = "/queue/kill9";
const KILLS: u32 = 20;
const PRODUCERS: usize = 2;
/// Receipts each producer keeps outstanding (pipelining, so group commit has work to batch).
const RECEIPTS_OUTSTANDING_MAX: usize = 16;
/// Bounds on the time between a broker becoming ready and its `kill -9`.
const KILL_AFTER_MS: std::ops::Range<u64> = 100..900;
/// After the last restart, producers run this long; some receipts must arrive in it.
const HEALING_MS: u64 = 1_000;
/// The drain ends once every owed id arrived and the queue stayed quiet this long.
const DRAIN_QUIET_MS: u64 = 1_500;
/// Bound on waiting for a message while owed ids are still missing.
const DRAIN_MISSING_WAIT_MS: u64 = 15_000;

#[derive(Default)]
struct Ledger {
    attempted: AtomicU64,
    receipted: Mutex<HashSet<String>>,
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
                ledger.attempted.fetch_add(1, Ordering::Relaxed);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipted_messages_survive_repeated_kill9() {
    let seed = seed();
    println!("kill9_loop: seed={seed} (HAVEN_KILL9_SEED={seed} replays the kill schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("data"),
        free_addr(),
    );
    let mut broker = BrokerProcess::start(opts).expect("broker starts");
    let url = broker.stomp_url();

    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Ledger::default());
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(p, url.clone(), stop.clone(), ledger.clone())))
        .collect();

    for kill in 1..=KILLS {
        let after_ms = rng.gen_range(KILL_AFTER_MS);
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        broker.kill9().expect("kill -9");
        let receipted = ledger.receipted.lock().unwrap().len();
        println!(
            "kill9_loop: kill {kill}/{KILLS} after {after_ms} ms; receipted so far {receipted}"
        );
        broker
            .restart()
            .unwrap_or_else(|e| panic!("restart after kill {kill} failed (seed {seed}): {e}"));
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
    let receipted = ledger.receipted.lock().unwrap().clone();
    assert!(
        receipted.len() > before_healing,
        "no receipt after the last restart (seed {seed}): the broker did not recover to serve"
    );

    // Drain: every receipted id must arrive; a repeat must say redelivered:true.
    let consumer = Connection::connect(&url, ConnectOptions::default())
        .await
        .expect("consumer connects");
    let mut sub = consumer
        .subscribe(
            QUEUE,
            AckMode::ClientIndividual,
            &[("activemq.prefetchSize", "1000")],
        )
        .await
        .expect("subscribe");
    let mut delivered: HashMap<String, u32> = HashMap::new();
    let mut bad_duplicates: Vec<String> = Vec::new();
    let mut redelivered_count = 0u64;
    loop {
        let missing = receipted.iter().any(|id| !delivered.contains_key(id));
        let wait_ms = if missing {
            DRAIN_MISSING_WAIT_MS
        } else {
            DRAIN_QUIET_MS
        };
        let msg = match tokio::time::timeout(Duration::from_millis(wait_ms), sub.next()).await {
            Ok(Some(msg)) => msg,
            Ok(None) => panic!("consumer connection closed: {:?}", consumer.close_reason()),
            Err(_) => break,
        };
        let id = msg
            .header("kill9-id")
            .expect("kill9-id header passed through")
            .to_string();
        assert_eq!(&msg.body[..], id.as_bytes(), "body and header id disagree");
        if msg.redelivered {
            redelivered_count += 1;
        }
        let n = delivered.entry(id.clone()).or_insert(0);
        *n += 1;
        if *n > 1 && !msg.redelivered {
            bad_duplicates.push(id);
        }
        consumer.ack(&msg).await.expect("ack");
    }
    let _ = consumer.disconnect().await;
    broker.stop().expect("broker stops");

    let mut missing: Vec<&String> = receipted
        .iter()
        .filter(|id| !delivered.contains_key(*id))
        .collect();
    missing.sort();
    let unreceipted_delivered = delivered
        .keys()
        .filter(|id| !receipted.contains(*id))
        .count();
    let duplicates: u32 = delivered.values().map(|n| n - 1).sum();
    println!(
        "kill9_loop: seed={seed} kills={KILLS} attempted={} receipted={} delivered_unique={} \
         delivered_without_receipt={unreceipted_delivered} redelivered_flagged={redelivered_count} \
         duplicates={duplicates} missing={} bad_duplicates={} elapsed={:?}",
        ledger.attempted.load(Ordering::Relaxed),
        receipted.len(),
        delivered.len(),
        missing.len(),
        bad_duplicates.len(),
        started.elapsed(),
    );
    assert!(
        missing.is_empty(),
        "{} receipted messages lost (seed {seed}), first: {:?}\nbroker log: {}",
        missing.len(),
        &missing[..missing.len().min(20)],
        broker.log_path().display()
    );
    assert!(
        bad_duplicates.is_empty(),
        "{} messages delivered twice without redelivered:true (seed {seed}), first: {:?}",
        bad_duplicates.len(),
        &bad_duplicates[..bad_duplicates.len().min(20)]
    );
}
