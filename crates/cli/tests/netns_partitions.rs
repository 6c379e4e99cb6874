//! Network partitions made by the kernel, not by a proxy or a signal: each `haven` broker runs
//! in its own network namespace ([`haven_testkit::NetLab`]) and firewall rules inside those
//! namespaces drop the packets, as Jepsen partitions its nodes. The broker process keeps
//! running and its sockets stay open; only heart-beats (or the far side hanging up) reveal the
//! cut.
//!
//! The brokers are standalone (separate stores), so duplicates are counted, not forbidden: a
//! SEND stored on a broker whose RECEIPT the cut swallowed is sent again to another broker.
//! What must hold is that nothing receipted is lost, once the cuts heal and each broker is
//! drained.
//!
//! Needs root, iproute2 and nftables (or iptables). Elsewhere each test prints
//! `SKIPPED: <reason>` and passes, except under `CI=true` as root, where it fails.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use haven_client::{AckMode, Client, ClientError, ConnectOptions, ConnectionEvent};
use haven_testkit::{BrokerProcess, Duplicates, History, NetLab, Peer, SendOutcome};

const QUEUE: &str = "/queue/netns";
/// Heart-beats offered by brokers and client (default 10 s), so silence is noticed in about a
/// second.
const HEARTBEAT_MS: u64 = 500;
/// The client's bound on TCP connect + CONNECTED: a SYN into a cut is dropped, not refused,
/// so without it a reconnect attempt to a cut broker would wait 10 s.
const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// "Progress" means this many more receipts and this many more deliveries.
const PROGRESS_MESSAGES_MIN: u64 = 50;
/// Bound on waiting for progress; a client stuck on a cut broker fails here.
const PROGRESS_WAIT_MS: u64 = 20_000;
/// A drain ends when nothing arrived for this long (and nothing owed is missing).
const DRAIN_QUIET_MS: u64 = 1_500;
/// A drain that still misses receipted ids gives up after this long without a message (what
/// is missing may wait on another broker; the checker decides).
const DRAIN_GIVE_UP_MS: u64 = 3_000;
/// How long a killed broker stays down.
const DOWN_MS: u64 = 200;
/// Bounds of the lab's own reachability probes.
const REACH_MS: u64 = 2_000;
const UNREACH_MS: u64 = 400;

/// `n` standalone brokers, one per new host of `lab`, with fast heart-beats.
fn start_brokers(lab: &mut NetLab, dir: &std::path::Path, n: usize) -> Vec<BrokerProcess> {
    (0..n)
        .map(|i| {
            let host = lab.add_host().expect("lab host");
            let mut opts = lab.broker_opts(
                host,
                env!("CARGO_BIN_EXE_haven"),
                dir.join(format!("broker-{i}")),
            );
            opts.config_toml = Some(format!(
                "[stomp]\nheartbeat_send_ms = {HEARTBEAT_MS}\nheartbeat_receive_ms = {HEARTBEAT_MS}\n"
            ));
            BrokerProcess::start(opts).expect("broker starts in its namespace")
        })
        .collect()
}

fn url_of(b: &BrokerProcess) -> String {
    format!("tcp://{}", b.addr())
}

fn failover_uri(urls: &[String]) -> String {
    format!(
        "failover:({})?initialReconnectDelay=10&maxReconnectDelay=200&randomize=false",
        urls.join(",")
    )
}

fn client_options() -> ConnectOptions {
    ConnectOptions {
        heartbeat_ms: (HEARTBEAT_MS, HEARTBEAT_MS),
        connect_timeout_ms: CONNECT_TIMEOUT_MS,
        ..ConnectOptions::default()
    }
}

/// The lab's commands block for milliseconds; keep them off the async workers' backs.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A receipted producer task and a consumer task on one failover client, recording into one
/// history.
struct Workload {
    client: Client,
    history: Arc<History>,
    receipts: Arc<AtomicU64>,
    deliveries: Arc<AtomicU64>,
    stop_producer: Arc<AtomicBool>,
    stop_consumer: Arc<AtomicBool>,
    producer: tokio::task::JoinHandle<()>,
    consumer: tokio::task::JoinHandle<()>,
}

impl Workload {
    async fn start(client: Client) -> Workload {
        let history = Arc::new(History::new());
        let receipts = Arc::new(AtomicU64::new(0));
        let deliveries = Arc::new(AtomicU64::new(0));
        let stop_producer = Arc::new(AtomicBool::new(false));
        let stop_consumer = Arc::new(AtomicBool::new(false));
        let mut sub = client
            .subscribe(
                QUEUE,
                AckMode::ClientIndividual,
                &[("id", "netns-consumer"), ("activemq.prefetchSize", "64")],
            )
            .await
            .expect("subscribe");
        let consumer = {
            let (client, history, deliveries, stop) = (
                client.clone(),
                history.clone(),
                deliveries.clone(),
                stop_consumer.clone(),
            );
            tokio::spawn(async move {
                drain(&client, &mut sub, &history, &stop, Some(&deliveries)).await;
            })
        };
        let producer = {
            let (client, history, receipts, stop) = (
                client.clone(),
                history.clone(),
                receipts.clone(),
                stop_producer.clone(),
            );
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = format!("p0-{n}");
                    history.attempted(&id);
                    match client.send_receipted(QUEUE, &[], id.clone()).await {
                        Ok(()) => {
                            history.outcome(&id, SendOutcome::Receipted);
                            receipts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(ClientError::Server { .. }) => {
                            history.outcome(&id, SendOutcome::Failed)
                        }
                        Err(e) => {
                            history.outcome(&id, SendOutcome::Unknown);
                            panic!("send {id} failed: {e}");
                        }
                    }
                }
            })
        };
        Workload {
            client,
            history,
            receipts,
            deliveries,
            stop_producer,
            stop_consumer,
            producer,
            consumer,
        }
    }

    /// Waits until both producing and consuming moved on by `PROGRESS_MESSAGES_MIN`.
    async fn progress(&self, after: &str) {
        let (r0, d0) = (
            self.receipts.load(Ordering::Relaxed),
            self.deliveries.load(Ordering::Relaxed),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_millis(PROGRESS_WAIT_MS);
        loop {
            let (r, d) = (
                self.receipts.load(Ordering::Relaxed),
                self.deliveries.load(Ordering::Relaxed),
            );
            if r >= r0 + PROGRESS_MESSAGES_MIN && d >= d0 + PROGRESS_MESSAGES_MIN {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no progress within {PROGRESS_WAIT_MS} ms after {after}: receipts {r0} -> {r}, \
                 deliveries {d0} -> {d}; client on {:?}, {:?}",
                self.client.broker(),
                self.client.stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops producing, lets the consumer read what this broker still owes, disconnects.
    async fn finish(self) -> Arc<History> {
        self.stop_producer.store(true, Ordering::Relaxed);
        self.producer.await.expect("producer task");
        self.stop_consumer.store(true, Ordering::Relaxed);
        self.consumer.await.expect("consumer task");
        eprintln!("client: {:?}", self.client.stats());
        self.client.disconnect().await.expect("disconnect");
        self.history
    }
}

/// Reads, records and acks until `stop` is set and then nothing owed is missing and nothing
/// arrived for `DRAIN_QUIET_MS`, or nothing arrived for `DRAIN_GIVE_UP_MS`.
async fn drain(
    client: &Client,
    sub: &mut haven_client::Subscription,
    history: &History,
    stop: &AtomicBool,
    deliveries: Option<&AtomicU64>,
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
                if let Some(d) = deliveries {
                    d.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(None) => panic!("subscription ended: {:?}", client.close_reason()),
            Err(_) if stop.load(Ordering::Relaxed) => {
                let silent = last.elapsed() >= Duration::from_millis(DRAIN_GIVE_UP_MS);
                if history.missing() == 0 || silent {
                    return;
                }
            }
            Err(_) => {}
        }
    }
}

/// Drains `QUEUE` on each broker directly: messages stored on a broker the client left wait
/// there.
async fn drain_each(urls: &[String], history: &History) {
    for url in urls {
        let client = Client::connect(url, client_options())
            .await
            .expect("drain connects");
        let mut sub = client
            .subscribe(QUEUE, AckMode::ClientIndividual, &[])
            .await
            .expect("drain subscribes");
        drain(&client, &mut sub, history, &AtomicBool::new(true), None).await;
        client.disconnect().await.expect("drain disconnect");
    }
}

/// The `Interrupted` events published so far, as (broker, reason).
fn interruptions(
    events: &mut tokio::sync::broadcast::Receiver<ConnectionEvent>,
) -> Vec<(String, ClientError)> {
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let ConnectionEvent::Interrupted { broker, reason } = event {
            seen.push((broker, reason));
        }
    }
    seen
}

/// Three brokers in three namespaces; the one in use is cut off from the client both ways
/// (packets dropped, the broker still running). The client must notice by heart-beats alone,
/// move on and keep producing and consuming; after the cut heals, the broker it then uses is
/// killed (`kill -9`) and restarted. Every receipted message is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_broker_is_left_by_heartbeats_then_a_kill9_loses_nothing() {
    let Some(mut lab) =
        NetLab::for_test("a_partitioned_broker_is_left_by_heartbeats_then_a_kill9_loses_nothing")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut brokers = start_brokers(&mut lab, dir.path(), 3);
    let urls: Vec<String> = brokers.iter().map(url_of).collect();
    let client = Client::connect(&failover_uri(&urls), client_options())
        .await
        .expect("client connects");
    let mut events = client.events();
    let work = Workload::start(client.clone()).await;
    work.progress("start").await;

    let cut_url = client.broker().expect("connected");
    let cut = urls
        .iter()
        .position(|u| *u == cut_url)
        .expect("known broker");
    let host = lab.hosts()[cut];
    blocking(|| lab.partition(Peer::Host(host), Peer::Tester)).expect("partition");
    work.progress("the partition").await;
    let now = client.broker().expect("connected");
    assert_ne!(now, cut_url, "still on the partitioned broker");
    let seen = interruptions(&mut events);
    assert!(
        seen.iter()
            .any(|(b, r)| *b == cut_url && matches!(r, ClientError::HeartbeatTimeout { .. })),
        "the client did not leave {cut_url} by heart-beat timeout: {seen:?}"
    );
    assert!(brokers[cut].is_running(), "a partition is not a crash");

    blocking(|| lab.heal()).expect("heal");
    work.progress("healing").await;

    let killed_url = client.broker().expect("connected");
    let killed = urls.iter().position(|u| *u == killed_url).unwrap();
    blocking(|| {
        brokers[killed].kill9().expect("kill -9");
        std::thread::sleep(Duration::from_millis(DOWN_MS));
        brokers[killed].restart().expect("restart in its namespace");
    });
    work.progress("the kill").await;
    assert!(
        client.reconnects() >= 2,
        "{} reconnects for a partition and a kill",
        client.reconnects()
    );
    let history = work.finish().await;
    drain_each(&urls, &history).await;

    let report = history.check(Duplicates::Counted, false);
    eprintln!("partition {cut_url}, then kill -9 {killed_url}: {report}");
    assert!(report.receipted > 0, "{report}");
    assert!(report.is_ok(), "{report}");
    for b in &mut brokers {
        b.stop().expect("broker stops");
    }
}

/// One-way cuts. First the broker in use can still hear the client but the client cannot
/// hear it: SENDs arrive and are stored, but RECEIPTs, MESSAGEs and heart-beats are dropped,
/// so the client leaves by heart-beat timeout and sends again elsewhere what it could not
/// confirm. Then, healed, the other way round on the broker then in use: nothing the client
/// sends arrives, its ACKs of the broker's segments included, so the broker's TCP soon only
/// retransmits its oldest unacknowledged segment and sends nothing new; the broker's
/// heart-beat check closes its end, but that FIN waits behind the same segment. Either way
/// the client must move on (in runs so far, by its own heart-beat timeout; the test accepts
/// any interruption, since which comes first is TCP's business). Nothing receipted is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_way_cuts_either_way_lose_nothing() {
    let Some(mut lab) = NetLab::for_test("one_way_cuts_either_way_lose_nothing") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut brokers = start_brokers(&mut lab, dir.path(), 2);
    let urls: Vec<String> = brokers.iter().map(url_of).collect();
    let client = Client::connect(&failover_uri(&urls), client_options())
        .await
        .expect("client connects");
    let mut events = client.events();
    let work = Workload::start(client.clone()).await;
    work.progress("start").await;

    // Broker -> client dropped.
    let first_url = client.broker().expect("connected");
    let first = urls.iter().position(|u| *u == first_url).unwrap();
    let first_host = lab.hosts()[first];
    blocking(|| lab.cut(Peer::Host(first_host), Peer::Tester)).expect("cut");
    work.progress("cutting broker -> client").await;
    assert_ne!(
        client.broker(),
        Some(first_url.clone()),
        "still on {first_url}"
    );
    let seen = interruptions(&mut events);
    assert!(
        seen.iter()
            .any(|(b, r)| *b == first_url && matches!(r, ClientError::HeartbeatTimeout { .. })),
        "the client did not leave {first_url} by heart-beat timeout: {seen:?}"
    );
    blocking(|| lab.heal()).expect("heal");
    work.progress("healing").await;

    // Client -> broker dropped.
    let second_url = client.broker().expect("connected");
    let second = urls.iter().position(|u| *u == second_url).unwrap();
    let second_host = lab.hosts()[second];
    blocking(|| lab.cut(Peer::Tester, Peer::Host(second_host))).expect("cut");
    work.progress("cutting client -> broker").await;
    assert_ne!(
        client.broker(),
        Some(second_url.clone()),
        "still on {second_url}"
    );
    let seen = interruptions(&mut events);
    eprintln!("client -> broker cut: interruptions {seen:?}");
    assert!(
        seen.iter().any(|(b, _)| *b == second_url),
        "no interruption from {second_url}: {seen:?}"
    );
    blocking(|| lab.heal()).expect("heal");

    let history = work.finish().await;
    drain_each(&urls, &history).await;
    let report = history.check(Duplicates::Counted, false);
    eprintln!("one-way cuts of {first_url} then {second_url}: {report}");
    assert!(report.receipted > 0, "{report}");
    assert!(report.is_ok(), "{report}");
    for b in &mut brokers {
        assert!(b.is_running(), "a cut is not a crash");
        b.stop().expect("broker stops");
    }
}

/// The lab itself: a cut drops exactly the direction it names, a partition both, heal
/// undoes them; a namespace left by a dead process is removed by the next lab; dropping a lab
/// leaves no namespace with its prefix and no link in the tester's namespace.
#[test]
fn a_lab_cuts_what_it_names_and_leaves_nothing_behind() {
    let Some(mut lab) = NetLab::for_test("a_lab_cuts_what_it_names_and_leaves_nothing_behind")
    else {
        return;
    };
    let (a, b) = (
        Peer::Host(lab.add_host().unwrap()),
        Peer::Host(lab.add_host().unwrap()),
    );
    let t = Peer::Tester;
    let pairs = [(a, b), (b, a), (a, t), (t, a), (b, t), (t, b)];
    let reach = |lab: &NetLab, from, to, expected: bool| {
        let ms = if expected { REACH_MS } else { UNREACH_MS };
        let got = lab.reaches(from, to, ms).expect("probe");
        assert_eq!(got, expected, "{from:?} -> {to:?} (cuts {:?})", lab.cuts());
    };
    for (from, to) in pairs {
        reach(&lab, from, to, true);
    }

    lab.cut(a, b).unwrap();
    lab.cut(b, t).unwrap();
    for (from, to) in pairs {
        let cut = (from, to) == (a, b) || (from, to) == (b, t);
        reach(&lab, from, to, !cut);
    }
    lab.heal().unwrap();
    assert!(lab.cuts().is_empty());
    for (from, to) in pairs {
        reach(&lab, from, to, true);
    }
    lab.partition(a, t).unwrap();
    for (from, to) in pairs {
        let cut = (from, to) == (a, t) || (from, to) == (t, a);
        reach(&lab, from, to, !cut);
    }

    // A namespace named like a lab's of a process that no longer exists (pid beyond any
    // pid_max Linux allows).
    let stale = "hv4194305-1-0";
    let status = std::process::Command::new("ip")
        .args(["netns", "add", stale])
        .status()
        .unwrap();
    assert!(status.success(), "ip netns add {stale}: {status}");
    let second = NetLab::new().expect("second lab");
    assert!(
        !NetLab::existing_namespaces()
            .unwrap()
            .iter()
            .any(|n| n == stale),
        "the stale namespace {stale} survived a new lab"
    );

    for lab in [lab, second] {
        let prefix = format!("{}-", lab.prefix());
        let link = lab.tester_link().to_string();
        let mine = |names: Vec<String>| -> Vec<String> {
            names
                .into_iter()
                .filter(|n| n.starts_with(&prefix))
                .collect()
        };
        assert!(!mine(NetLab::existing_namespaces().unwrap()).is_empty());
        assert!(NetLab::tester_link_exists(&link));
        drop(lab);
        let left = mine(NetLab::existing_namespaces().unwrap());
        assert!(left.is_empty(), "left behind: {left:?}");
        assert!(
            !NetLab::tester_link_exists(&link),
            "link {link} left behind"
        );
    }
}
