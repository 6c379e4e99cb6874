//! The failover client against real broker processes that are killed with `kill -9`.
//!
//! 1. Several standalone brokers (own processes, own data directories, no shared storage):
//!    producers and a consumer on one `failover:(...)` URI keep running while the broker they
//!    use is killed again and again. Every receipted message is delivered (during the run, or
//!    by draining each broker at the end). Duplicates are counted, not forbidden: a SEND the
//!    first broker stored just before it died without a RECEIPT is sent again to another
//!    broker, which has no way to know it — at least once is the honest guarantee across
//!    brokers that do not share a store.
//! 2. One broker restarted (`kill -9`) under steady producers: exactly once. The producer
//!    sequence makes the broker drop resends it already stored, and the client's duplicate
//!    filter drops redeliveries of messages the application already acked; per-producer order
//!    holds.
//!
//! Kill intervals are random but seeded (printed; HAVEN_FAILOVER_SEED replays them).

#[path = "support/traffic.rs"]
mod traffic;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use haven_client::{AckMode, Client, ConnectOptions};
use haven_testkit::{
    free_addr, BrokerOpts, BrokerProcess, Duplicates, Fault, History, Proxy, SendOutcome,
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio::sync::Mutex;
use traffic::*;

const QUEUE: &str = "/queue/failover";
/// Bounds on how long the brokers run between kills.
const KILL_AFTER_MS: std::ops::Range<u64> = 150..700;
/// How long a killed broker stays down before it is restarted.
const DOWN_MS: u64 = 200;
/// A drain of one of several brokers (the missing ids may wait on another) ends after this
/// long without a message.
const DRAIN_BROKER_QUIET_MS: u64 = 3_000;

fn start_brokers(dir: &std::path::Path, n: usize) -> Vec<BrokerProcess> {
    (0..n)
        .map(|i| {
            let opts = BrokerOpts::new(
                env!("CARGO_BIN_EXE_haven"),
                dir.join(format!("broker-{i}")),
                free_addr(),
            );
            BrokerProcess::start(opts).expect("broker starts")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_brokers_kill9_repeatedly_nothing_receipted_is_lost() {
    const KILLS: usize = 6;
    let seed = seed("HAVEN_FAILOVER_SEED");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_brokers(dir.path(), 3);
    let urls: Vec<String> = brokers.iter().map(url_of).collect();
    let brokers = Arc::new(Mutex::new(brokers));
    let uri = quick_failover(&urls);
    let mut t = Traffic::start(&uri, QUEUE).await;
    let (producer, consumer, history) = (t.producer.clone(), t.consumer.clone(), t.history.clone());
    let mut events = producer.events();

    for kill in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(KILL_AFTER_MS))).await;
        // Alternate between the producer's and the consumer's broker, so both fail over.
        let target = if kill % 2 == 0 {
            producer.broker()
        } else {
            consumer.broker()
        };
        let Some(target) = target else { continue };
        let index = urls
            .iter()
            .position(|u| *u == target)
            .expect("known broker");
        let brokers = brokers.clone();
        blocking(move || {
            let mut brokers = brokers.blocking_lock();
            brokers[index].kill9().expect("kill -9");
            std::thread::sleep(Duration::from_millis(DOWN_MS));
            brokers[index].restart().expect("restart");
        })
        .await;
    }
    t.stop_producers().await;
    assert!(producer.reconnects() >= 1, "the producer never failed over");
    producer.disconnect().await.expect("producer disconnect");
    let mut saw_interrupted = false;
    while let Ok(event) = events.try_recv() {
        saw_interrupted |= matches!(event, haven_client::ConnectionEvent::Interrupted { .. });
    }
    assert!(saw_interrupted, "no Interrupted event was published");

    t.finish_consumer().await;

    // Messages stored on brokers the consumer was not on at the end wait there: drain each.
    for url in &urls {
        let client = Client::connect(url, ConnectOptions::default())
            .await
            .expect("drain connects");
        let mut sub = client
            .subscribe(QUEUE, AckMode::ClientIndividual, &[])
            .await
            .expect("drain subscribes");
        drain(
            &client,
            &mut sub,
            &history,
            &AtomicBool::new(true),
            DRAIN_BROKER_QUIET_MS,
        )
        .await;
        client.disconnect().await.expect("drain disconnect");
    }

    let report = history.check(Duplicates::Counted, false);
    eprintln!("standalone brokers: {report}");
    assert!(report.receipted > 0, "{report}");
    assert!(report.is_ok(), "seed {seed}: {report}");
    let mut brokers = brokers.lock().await;
    for b in brokers.iter_mut() {
        b.stop().expect("broker stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_broker_restarted_under_steady_producers_is_exactly_once() {
    const KILLS: usize = 5;
    let seed = seed("HAVEN_FAILOVER_SEED");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let broker = start_brokers(dir.path(), 1).pop().unwrap();
    let uri = quick_failover(&[url_of(&broker)]);
    let broker = Arc::new(Mutex::new(broker));
    let mut t = Traffic::start(&uri, QUEUE).await;
    let (producer, history) = (t.producer.clone(), t.history.clone());
    let pipelined: Vec<_> = (0..2)
        .map(|p| {
            spawn_pipelined_producer(
                producer.clone(),
                QUEUE,
                p,
                history.clone(),
                t.stop_producers.clone(),
            )
        })
        .collect();
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(KILL_AFTER_MS))).await;
        let broker = broker.clone();
        blocking(move || {
            let mut b = broker.blocking_lock();
            b.kill9().expect("kill -9");
            std::thread::sleep(Duration::from_millis(DOWN_MS));
            b.restart().expect("restart");
        })
        .await;
    }
    t.stop_producers().await;
    let mut pipelined_ids = Vec::new();
    for p in pipelined {
        pipelined_ids.extend(p.await.expect("pipelined producer task"));
    }
    // A kill that lands while the client is still reconnecting from the previous one is
    // absorbed by that reconnect, so under load there can be fewer reconnects than kills.
    let reconnects = producer.reconnects();
    assert!(
        (1..=KILLS as u64).contains(&reconnects),
        "{reconnects} reconnects for {KILLS} kills"
    );
    let stats = producer.stats();
    producer
        .disconnect()
        .await
        .expect("every pipelined SEND is confirmed before disconnect returns");
    for id in &pipelined_ids {
        history.outcome(id, SendOutcome::Receipted);
    }
    eprintln!("producer client: {stats:?}");
    assert!(
        stats.sends_resent > 0,
        "no kill caught a SEND in flight: {stats:?}"
    );
    t.finish_consumer().await;

    let report = history.check(Duplicates::Forbidden, true);
    eprintln!("one broker, {KILLS} kills: {report}");
    if !report.is_ok() {
        eprintln!("broker log tail:\n{}", broker.lock().await.log_tail());
    }
    assert!(report.receipted > 0, "{report}");
    assert_eq!(report.unknown, 0, "every SEND was confirmed: {report}");
    assert!(report.is_ok(), "seed {seed}: {report}");
    broker.lock().await.stop().expect("broker stops");
}

/// Brokers that offer heart-beats every 500 ms (default 10 s), so silence is noticed in about
/// a second instead of twenty.
fn start_brokers_with_heartbeats(dir: &std::path::Path, n: usize) -> Vec<BrokerProcess> {
    (0..n)
        .map(|i| {
            let mut opts = BrokerOpts::new(
                env!("CARGO_BIN_EXE_haven"),
                dir.join(format!("broker-{i}")),
                free_addr(),
            );
            opts.config_toml =
                Some("[stomp]\nheartbeat_send_ms = 500\nheartbeat_receive_ms = 500\n".into());
            BrokerProcess::start(opts).expect("broker starts")
        })
        .collect()
}

fn heartbeat_options() -> ConnectOptions {
    ConnectOptions {
        heartbeat_ms: (500, 500),
        ..ConnectOptions::default()
    }
}

/// One receipted producer task on a client, for the heart-beat and scenario tests.
struct OneProducer {
    client: Client,
    history: Arc<History>,
    receipts: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl OneProducer {
    fn start(client: Client) -> OneProducer {
        let history = Arc::new(History::new());
        let receipts = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = spawn_producer(
            client.clone(),
            QUEUE,
            0,
            history.clone(),
            receipts.clone(),
            stop.clone(),
        );
        OneProducer {
            client,
            history,
            receipts,
            stop,
            task,
        }
    }

    /// Waits until more than `HEALING_RECEIPTS_MIN` SENDs are receipted from now on.
    async fn progress(&self) {
        let before = self.receipts.load(Ordering::Relaxed);
        wait_progress(&self.receipts, before + 1, HEALING_RECEIPTS_MIN).await;
    }

    /// Stops the task, disconnects the client and returns the history.
    async fn finish(self) -> Arc<History> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("producer task");
        self.client.disconnect().await.expect("disconnect");
        self.history
    }
}

/// Drains `QUEUE` on each of `urls` with a plain client into `history`.
async fn drain_each(urls: &[String], history: &History) {
    for url in urls {
        let drainer = Client::connect(url, ConnectOptions::default())
            .await
            .expect("drain connects");
        let mut sub = drainer
            .subscribe(QUEUE, AckMode::ClientIndividual, &[])
            .await
            .expect("drain subscribes");
        drain(
            &drainer,
            &mut sub,
            history,
            &AtomicBool::new(true),
            DRAIN_BROKER_QUIET_MS,
        )
        .await;
        drainer.disconnect().await.expect("drain disconnect");
    }
}

/// A link that silently drops everything (a fault-injecting proxy between the client and
/// its broker, black-holed): only heart-beats reveal it. The client moves to the other broker
/// and carries on; once the link heals, both brokers together hold every receipted message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_black_holed_link_is_left_through_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut brokers = start_brokers_with_heartbeats(dir.path(), 2);
    let proxy = Proxy::start(brokers[0].addr()).expect("proxy starts");
    let via_proxy = format!("tcp://{}", proxy.addr());
    let uri = quick_failover(&[via_proxy.clone(), url_of(&brokers[1])]);
    let client = Client::connect(&uri, heartbeat_options())
        .await
        .expect("connects");
    assert_eq!(client.broker(), Some(via_proxy.clone()));
    let producing = OneProducer::start(client.clone());
    producing.progress().await;
    proxy.set(Fault::BlackHole);
    producing.progress().await;
    assert_eq!(
        client.broker(),
        Some(url_of(&brokers[1])),
        "moved off the silent link"
    );
    let history = producing.finish().await;
    proxy.set(Fault::Pass);

    let urls: Vec<String> = brokers.iter().map(url_of).collect();
    drain_each(&urls, &history).await;
    let report = history.check(Duplicates::Counted, false);
    eprintln!("black-holed link: {report}; proxy {:?}", proxy.stats());
    assert!(report.is_ok(), "{report}");
    for b in &mut brokers {
        b.stop().expect("broker stops");
    }
}

/// A paused broker (SIGSTOP: a hung process or a machine that stopped answering) keeps its
/// sockets open, so only heart-beats reveal it: the client must move to another broker and
/// carry on, and nothing it had receipted is lost once the paused broker resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_broker_is_left_through_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut brokers = start_brokers_with_heartbeats(dir.path(), 2);
    let urls: Vec<String> = brokers.iter().map(url_of).collect();
    let uri = quick_failover(&urls);
    let client = Client::connect(&uri, heartbeat_options())
        .await
        .expect("connects");
    let producing = OneProducer::start(client.clone());
    producing.progress().await;
    let paused = client.broker().expect("connected");
    let index = urls.iter().position(|u| *u == paused).unwrap();
    brokers[index].sigstop().expect("SIGSTOP");
    // Progress now can only come from the other broker, once heart-beats gave up on this one.
    producing.progress().await;
    assert_ne!(
        client.broker(),
        Some(paused.clone()),
        "still on the paused broker"
    );
    let history = producing.finish().await;
    brokers[index].sigcont().expect("SIGCONT");
    drain_each(&urls, &history).await;
    let report = history.check(Duplicates::Counted, false);
    eprintln!("paused broker: {report}");
    assert!(report.is_ok(), "{report}");
    for b in &mut brokers {
        b.stop().expect("broker stops");
    }
}

/// A scenario written as data (`haven_testkit::Step`): the link to broker 0 goes silent, heals,
/// then broker 1 is killed and restarted, all under a producer and a consumer on one failover
/// URI. Nothing receipted is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timed_fault_scenario_loses_nothing() {
    use haven_testkit::{run_scenario, Action, Step};
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_brokers_with_heartbeats(dir.path(), 2);
    let proxies = vec![Proxy::start(brokers[0].addr()).expect("proxy starts")];
    let uri = quick_failover(&[format!("tcp://{}", proxies[0].addr()), url_of(&brokers[1])]);
    let urls: Vec<String> = brokers.iter().map(url_of).collect();
    let client = Client::connect(&uri, heartbeat_options())
        .await
        .expect("connects");
    let producing = OneProducer::start(client.clone());
    let steps = [
        Step::at(300, Action::Proxy(0, Fault::BlackHole)),
        Step::at(2_500, Action::Proxy(0, Fault::Pass)),
        Step::at(3_000, Action::Kill9(1)),
        Step::at(3_300, Action::Restart(1)),
    ];
    let (brokers, proxies, ran) = tokio::task::spawn_blocking(move || {
        let mut brokers = brokers;
        let ran = run_scenario(&steps, &mut brokers, &proxies).expect("scenario runs");
        (brokers, proxies, ran)
    })
    .await
    .expect("scenario thread");
    eprintln!("scenario ran: {:?}", ran.steps);
    producing.progress().await;
    let history = producing.finish().await;
    drain_each(&urls, &history).await;
    let report = history.check(Duplicates::Counted, false);
    eprintln!("timed scenario: {report}; proxy {:?}", proxies[0].stats());
    assert!(report.is_ok(), "{report}");
    let mut brokers = brokers;
    for b in &mut brokers {
        b.stop().expect("broker stops");
    }
}
