//! Failover traffic for tests against real broker processes: receipted and pipelined producer
//! tasks and a client-individual consumer on one `failover:(...)` URI, all recording into one
//! [`History`] (the no-loss / no-duplicate checker). Shared by the failover and shared-store
//! tests; include with `#[path = "support/traffic.rs"] mod traffic;`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use haven_client::{AckMode, Client, ClientError, ConnectOptions};
use haven_testkit::{BrokerProcess, Duplicates, History, Report, SendOutcome};

/// Concurrent receipted producer tasks, each sending its own numbered ids.
pub const PRODUCERS: usize = 4;
/// After the last fault, producers must confirm this many more messages (liveness).
pub const HEALING_RECEIPTS_MIN: u64 = 50;
/// Bound on waiting for that progress; a broken client hangs here, it does not pass.
pub const HEALING_WAIT_MS: u64 = 30_000;
/// A drain ends when nothing arrived for this long (and nothing is missing).
pub const DRAIN_QUIET_MS: u64 = 1_500;
/// Bound on a drain while receipted ids are still missing.
pub const DRAIN_MISSING_WAIT_MS: u64 = 20_000;

/// The seed of a randomized schedule: `$var` when set (to replay one), else random; printed.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed: {seed} ({var}={seed} replays the schedule)");
    seed
}

pub fn url_of(b: &BrokerProcess) -> String {
    format!("tcp://{}", b.addr())
}

/// A failover URI that retries fast and in order.
pub fn quick_failover(brokers: &[String]) -> String {
    format!(
        "failover:({})?initialReconnectDelay=10&maxReconnectDelay=200&randomize=false",
        brokers.join(",")
    )
}

/// Producer task `p`: sends ids `p<p>-<n>` with a RECEIPT each until `stop`.
pub fn spawn_producer(
    client: Client,
    queue: &'static str,
    p: usize,
    history: Arc<History>,
    receipts: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let id = format!("p{p}-{n}");
            history.attempted(&id);
            match client.send_receipted(queue, &[], id.clone()).await {
                Ok(()) => {
                    history.outcome(&id, SendOutcome::Receipted);
                    receipts.fetch_add(1, Ordering::Relaxed);
                }
                Err(ClientError::Server { .. }) => history.outcome(&id, SendOutcome::Failed),
                Err(e) => {
                    history.outcome(&id, SendOutcome::Unknown);
                    panic!("producer {p}: send {id} failed: {e}");
                }
            }
        }
    })
}

/// Pipelined producer task `p`: sends ids `q<p>-<n>` without waiting for receipts, until
/// `stop`. Outcomes are known only when `disconnect` confirms everything; the ids are returned.
pub fn spawn_pipelined_producer(
    client: Client,
    queue: &'static str,
    p: usize,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let id = format!("q{p}-{n}");
            history.attempted(&id);
            client
                .send(queue, &[], id.clone())
                .await
                .expect("pipelined send");
            ids.push(id);
            if n.is_multiple_of(64) {
                // Leave the core some room: these tests are about failover, not throughput.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        ids
    })
}

/// The consumer: records every delivery and acks it, until `stop` and quiet.
pub fn spawn_consumer(
    client: Client,
    queue: &'static str,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Client> {
    tokio::spawn(async move {
        let mut sub = client
            .subscribe(
                queue,
                AckMode::ClientIndividual,
                &[("id", "failover-consumer"), ("activemq.prefetchSize", "64")],
            )
            .await
            .expect("subscribe");
        drain(&client, &mut sub, &history, &stop, DRAIN_MISSING_WAIT_MS).await;
        client
    })
}

/// Reads until `stop` is set and then either nothing is missing and nothing arrived for
/// `DRAIN_QUIET_MS`, or nothing arrived for `give_up_ms` (what is missing is elsewhere, or
/// lost).
pub async fn drain(
    client: &Client,
    sub: &mut haven_client::Subscription,
    history: &History,
    stop: &AtomicBool,
    give_up_ms: u64,
) {
    let mut last = tokio::time::Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_millis(DRAIN_QUIET_MS), sub.next()).await {
            Ok(Some(msg)) => {
                last = tokio::time::Instant::now();
                let id = String::from_utf8_lossy(&msg.body).into_owned();
                history.delivered(&id, msg.redelivered);
                client.ack(&msg).await.expect("ack");
                history.acked(&id);
            }
            Ok(None) => panic!("subscription ended: {:?}", client.close_reason()),
            Err(_) if stop.load(Ordering::Relaxed) => {
                let silent = last.elapsed() >= Duration::from_millis(give_up_ms);
                if history.missing() == 0 || silent {
                    if silent && give_up_ms == DRAIN_MISSING_WAIT_MS {
                        eprintln!(
                            "drain gave up: {} missing; consumer on {:?}, {:?}, subscription {}",
                            history.missing(),
                            client.broker(),
                            client.stats(),
                            sub.id()
                        );
                    }
                    return;
                }
            }
            Err(_) => {}
        }
    }
}

/// A producer client with `PRODUCERS` receipted producer tasks and a consumer client with its
/// consumer task, all recording into one history.
pub struct Traffic {
    pub producer: Client,
    pub consumer: Client,
    pub history: Arc<History>,
    pub receipts: Arc<AtomicU64>,
    pub stop_producers: Arc<AtomicBool>,
    pub stop_consumer: Arc<AtomicBool>,
    pub producers: Vec<tokio::task::JoinHandle<()>>,
    pub consumer_task: tokio::task::JoinHandle<Client>,
}

impl Traffic {
    pub async fn start(uri: &str, queue: &'static str) -> Traffic {
        let history = Arc::new(History::new());
        let receipts = Arc::new(AtomicU64::new(0));
        let stop_producers = Arc::new(AtomicBool::new(false));
        let stop_consumer = Arc::new(AtomicBool::new(false));
        let producer = Client::connect(uri, ConnectOptions::default())
            .await
            .expect("producer connects");
        let consumer = Client::connect(uri, ConnectOptions::default())
            .await
            .expect("consumer connects");
        let consumer_task = spawn_consumer(
            consumer.clone(),
            queue,
            history.clone(),
            stop_consumer.clone(),
        );
        let producers = (0..PRODUCERS)
            .map(|p| {
                spawn_producer(
                    producer.clone(),
                    queue,
                    p,
                    history.clone(),
                    receipts.clone(),
                    stop_producers.clone(),
                )
            })
            .collect();
        Traffic {
            producer,
            consumer,
            history,
            receipts,
            stop_producers,
            stop_consumer,
            producers,
            consumer_task,
        }
    }

    /// Waits for progress after the last fault (liveness), then stops the producer tasks.
    pub async fn stop_producers(&mut self) {
        let before = self.receipts.load(Ordering::Relaxed);
        wait_progress(&self.receipts, before, HEALING_RECEIPTS_MIN).await;
        self.stop_producers.store(true, Ordering::Relaxed);
        for p in self.producers.drain(..) {
            p.await.expect("producer task");
        }
    }

    /// `n` pipelined producer tasks on the producer client (ids `q<p>-<n>`).
    pub fn spawn_pipelined(
        &self,
        queue: &'static str,
        n: usize,
    ) -> Vec<tokio::task::JoinHandle<Vec<String>>> {
        (0..n)
            .map(|p| {
                spawn_pipelined_producer(
                    self.producer.clone(),
                    queue,
                    p,
                    self.history.clone(),
                    self.stop_producers.clone(),
                )
            })
            .collect()
    }

    /// Stops every producer (the pipelined ones of `spawn_pipelined` too), confirms every SEND
    /// with `disconnect`, drains the consumer, and checks exactly once, in order.
    pub async fn finish_exactly_once(
        mut self,
        pipelined: Vec<tokio::task::JoinHandle<Vec<String>>>,
    ) -> Report {
        self.stop_producers().await;
        let mut pipelined_ids = Vec::new();
        for p in pipelined {
            pipelined_ids.extend(p.await.expect("pipelined producer task"));
        }
        let (producer, history) = (self.producer.clone(), self.history.clone());
        let stats = producer.stats();
        producer
            .disconnect()
            .await
            .expect("every pipelined SEND is confirmed before disconnect returns");
        for id in &pipelined_ids {
            history.outcome(id, SendOutcome::Receipted);
        }
        eprintln!("producer client: {stats:?}");
        self.finish_consumer().await;
        history.check(Duplicates::Forbidden, true)
    }

    /// Lets the consumer drain what is owed, then disconnects it.
    pub async fn finish_consumer(self) {
        self.stop_consumer.store(true, Ordering::Relaxed);
        let consumer = self.consumer_task.await.expect("consumer task");
        eprintln!("consumer client: {:?}", consumer.stats());
        consumer.disconnect().await.expect("consumer disconnect");
    }
}

pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// Waits until producers confirmed `more` receipts beyond `from`.
pub async fn wait_progress(receipts: &AtomicU64, from: u64, more: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(HEALING_WAIT_MS);
    while receipts.load(Ordering::Relaxed) < from + more {
        assert!(
            tokio::time::Instant::now() < deadline,
            "producers made no progress after the last fault ({} receipts)",
            receipts.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
