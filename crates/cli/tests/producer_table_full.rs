//! A producer table that forgets producers to make room (`limits.producers_max`) shortens the
//! exactly-once window below `producer_idle_ms_max`, and until 2026-12-05 nothing showed it:
//! the client that came back forgotten got `haven-seq:0`, and its resend was stored again.
//! The broker now warns, with how many it forgot and how long the last one had been away, and
//! a failover client that comes back to a store that forgot it says so
//! (`ConnectionEvent::ProducerForgotten`). The real binary, its log and the Rust client.

use std::time::{Duration, Instant};

use haven_client::{AckMode, Client, ClientError, ConnectOptions, Connection, ConnectionEvent};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess, Fault, Proxy};
use tokio::sync::broadcast;

/// Bound on every wait for the broker (a log line, a message).
const WAIT_MS: u64 = 10_000;
const WARNING: &str = "producer table full";

async fn connect(broker: &BrokerProcess, producer: Option<&str>) -> Connection {
    let mut opts = ConnectOptions::default();
    if let Some(p) = producer {
        opts.headers.push(("haven-producer".into(), p.into()));
    }
    Connection::connect(&broker.stomp_url(), opts)
        .await
        .unwrap_or_else(|e| panic!("client connects: {e}"))
}

async fn send(c: &Connection, producer: &str, seq: &str, body: &str) {
    c.send_receipted(
        "/queue/orders",
        &[("haven-producer", producer), ("haven-seq", seq)],
        body.to_string(),
    )
    .await
    .unwrap_or_else(|e| panic!("SEND {producer}/{seq}: {e}"));
}

fn log(broker: &BrokerProcess) -> String {
    std::fs::read_to_string(broker.log_path()).unwrap_or_default()
}

async fn wait_for_log(broker: &BrokerProcess, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        let log = log(broker);
        if let Some(line) = log.lines().find(|l| l.contains(needle)) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the broker log within {WAIT_MS} ms; log tail:\n{}",
            broker.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_forgets_for_room_says_so_and_how_short_its_window_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = broker_with(
        dir.path(),
        "[limits]\nproducers_max = 2\n[journal]\nmaintenance_interval_ms = 50\n",
    );
    let c = connect(&broker, None).await;

    // Two producers fit: nothing is forgotten, nothing is said.
    send(&c, "alpha", "1", "a1").await;
    send(&c, "beta", "1", "b1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !log(&broker).contains(WARNING),
        "warned with room left:\n{}",
        broker.log_tail()
    );

    // A third forgets alpha, which is well within its idle window (7 days by default).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    send(&c, "gamma", "1", "g1").await;
    let line = wait_for_log(&broker, WARNING).await;
    assert!(line.contains("forgotten_for_room_total=1"), "{line}");
    assert!(line.contains("producers=2"), "{line}");
    // alpha had last raised its mark more than a second before it was forgotten.
    let window_s: u64 = line
        .split("window_s=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no window_s in {line}"));
    assert!(window_s >= 1, "{line}");

    // What the warning is about: alpha comes back, is told it is unknown, and its resend of
    // seq 1 is stored a second time.
    let again = connect(&broker, Some("alpha")).await;
    assert_eq!(again.connected_header("haven-seq"), Some("0"));
    send(&again, "alpha", "1", "a1").await;
    let mut sub = c
        .subscribe("/queue/orders", AckMode::Auto, &[])
        .await
        .expect("subscribes");
    let mut bodies = Vec::new();
    while bodies.len() < 4 {
        let m = tokio::time::timeout(Duration::from_millis(WAIT_MS), sub.next())
            .await
            .expect("a message within the wait")
            .expect("subscription open");
        bodies.push(String::from_utf8(m.body.to_vec()).expect("text"));
    }
    assert_eq!(bodies, ["a1", "b1", "g1", "a1"]);

    again.disconnect().await.unwrap();
    c.disconnect().await.unwrap();
    broker.stop().expect("broker stops");
}

fn broker_with(dir: &std::path::Path, config_toml: &str) -> BrokerProcess {
    let mut opts = BrokerOpts::new(env!("CARGO_BIN_EXE_haven"), dir.join("broker"), free_addr());
    opts.config_toml = Some(config_toml.to_string());
    BrokerProcess::start(opts).expect("broker starts")
}

/// A failover client of the broker (or proxy) at `addr`, and its events.
async fn failover_client(
    addr: std::net::SocketAddr,
) -> (Client, broadcast::Receiver<ConnectionEvent>) {
    failover_client_with(addr, ConnectOptions::default()).await
}

async fn failover_client_with(
    addr: std::net::SocketAddr,
    opts: ConnectOptions,
) -> (Client, broadcast::Receiver<ConnectionEvent>) {
    let uri = format!("failover:(tcp://{addr})?initialReconnectDelay=10&maxReconnectDelay=100");
    let client = Client::connect(&uri, opts).await.expect("connects");
    let events = client.events();
    (client, events)
}

/// Waits for the next `Resumed`, collecting what came before it.
async fn until_resumed(events: &mut broadcast::Receiver<ConnectionEvent>) -> Vec<ConnectionEvent> {
    let mut seen = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_millis(WAIT_MS), events.recv())
            .await
            .expect("an event within the wait")
            .expect("events open");
        let resumed = matches!(e, ConnectionEvent::Resumed { .. });
        seen.push(e);
        if resumed {
            return seen;
        }
    }
}

/// (mark, confirmed, resent, unknown) of each `ProducerForgotten` among `events`.
fn forgotten(events: &[ConnectionEvent]) -> Vec<(u64, u64, usize, usize)> {
    events
        .iter()
        .filter_map(|e| match e {
            ConnectionEvent::ProducerForgotten {
                mark,
                confirmed,
                resent,
                unknown,
                ..
            } => Some((*mark, *confirmed, *resent, *unknown)),
            _ => None,
        })
        .collect()
}

async fn cut(proxy: &Proxy) {
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set(Fault::Pass);
}

/// A broker with room for one producer, behind a proxy, and a failover client through it
/// whose "m1" the store has receipted.
struct OneProducerStore {
    _dir: tempfile::TempDir,
    broker: BrokerProcess,
    proxy: Proxy,
    client: Client,
    events: broadcast::Receiver<ConnectionEvent>,
}

async fn one_producer_store(opts: ConnectOptions) -> OneProducerStore {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker_with(dir.path(), "[limits]\nproducers_max = 1\n");
    let proxy = Proxy::start(broker.addr()).expect("proxy starts");
    let (client, events) = failover_client_with(proxy.addr(), opts).await;
    // No `persistent` header: the broker's default (persistent), which CONNECTED announces.
    client
        .send_receipted("/queue/x", &[], "m1")
        .await
        .expect("m1");
    OneProducerStore {
        _dir: dir,
        broker,
        proxy,
        client,
        events,
    }
}

impl OneProducerStore {
    /// Runs `op` into a link that stalls, lets another producer take the table's only place
    /// meanwhile, then resets the link: the broker never sees what `op` wrote (a black hole
    /// holds the bytes, a reset drops them), but the client cannot know. Returns the client's
    /// events up to its resume, what `op` returned, and the other producer's connection.
    async fn lose_while_forgotten<T: Send + 'static>(
        &mut self,
        op: impl std::future::Future<Output = T> + Send + 'static,
    ) -> (Vec<ConnectionEvent>, T, Connection) {
        self.proxy.set(Fault::BlackHole);
        let op = tokio::spawn(op);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let other = connect(&self.broker, None).await;
        send(&other, "other", "1", "o1").await;
        cut(&self.proxy).await;
        let seen = until_resumed(&mut self.events).await;
        let outcome = tokio::time::timeout(Duration::from_millis(WAIT_MS), op)
            .await
            .expect("settled within the wait")
            .expect("task");
        (seen, outcome, other)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_client_is_told_when_the_store_forgot_its_producer() {
    let OneProducerStore {
        _dir,
        mut broker,
        proxy,
        client,
        mut events,
    } = one_producer_store(ConnectOptions::default()).await;
    // As m1: the broker's default persistence.
    let persistent = [];

    // Remembered: a reconnect is an ordinary resume.
    cut(&proxy).await;
    assert_eq!(forgotten(&until_resumed(&mut events).await), []);
    client
        .send_receipted("/queue/x", &persistent, "m2")
        .await
        .expect("m2");

    // Another producer takes the only place in the table; the client's next CONNECTED says 0
    // where the store had confirmed 2.
    let other = connect(&broker, None).await;
    send(&other, "other", "1", "o1").await;
    cut(&proxy).await;
    assert_eq!(forgotten(&until_resumed(&mut events).await), [(0, 2, 0, 0)]);
    assert_eq!(client.stats().producer_forgotten, 1);

    // Said once: reconnecting again before the next SEND is not a second loss.
    cut(&proxy).await;
    assert_eq!(forgotten(&until_resumed(&mut events).await), []);
    // The store knows the producer again from its next SEND on.
    client
        .send_receipted("/queue/x", &persistent, "m3")
        .await
        .expect("m3");
    cut(&proxy).await;
    assert_eq!(forgotten(&until_resumed(&mut events).await), []);

    other.disconnect().await.unwrap();
    client.disconnect().await.unwrap();
    broker.stop().expect("broker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_drops_non_persistent_marks_is_not_taken_for_forgetting() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = broker_with(dir.path(), "");
    let (client, mut events) = failover_client(broker.addr()).await;
    client
        .send_receipted("/queue/x", &[], "p1")
        .await
        .expect("p1");
    // Raises the broker's mark to 2 in memory only: a restart forgets it, and the mark in
    // the next CONNECTED is 1, below what the client had confirmed (2), yet nothing of the
    // store's was forgotten.
    client
        .send_receipted("/queue/x", &[("persistent", "false")], "n2")
        .await
        .expect("n2");
    broker.restart().expect("broker restarts");
    let seen = until_resumed(&mut events).await;
    assert_eq!(forgotten(&seen), [], "{seen:?}");
    assert_eq!(client.stats().producer_forgotten, 0);
    client.disconnect().await.unwrap();
    broker.stop().expect("broker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_may_not_resend_to_a_forgetful_store_reports_the_send_unknown() {
    let mut store = one_producer_store(ConnectOptions {
        resend_when_producer_forgotten: false,
        ..ConnectOptions::default()
    })
    .await;
    let client = store.client.clone();
    let (seen, outcome, other) = store
        .lose_while_forgotten(async move { client.send_receipted("/queue/x", &[], "m2").await })
        .await;
    assert_eq!(forgotten(&seen), [(0, 1, 0, 1)], "{seen:?}");
    assert!(
        matches!(outcome, Err(ClientError::OutcomeUnknown { .. })),
        "{outcome:?}"
    );

    // Nothing was sent again behind the application's back: m2 is not on the queue.
    let mut sub = other
        .subscribe("/queue/x", AckMode::Auto, &[])
        .await
        .expect("subscribes");
    let mut bodies = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        bodies.push(String::from_utf8(m.body.to_vec()).expect("text"));
    }
    assert_eq!(bodies, ["m1"]);

    other.disconnect().await.unwrap();
    store.client.disconnect().await.unwrap();
    store.broker.stop().expect("broker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_flight_to_a_forgetful_store_is_unknown_not_rolled_back() {
    let mut store = one_producer_store(ConnectOptions::default()).await;
    let client = store.client.clone();
    client.begin("t1").await.expect("BEGIN");
    client
        .send("/queue/x", &[("transaction", "t1")], "t1-m")
        .await
        .expect("SEND in t1");

    // The store's mark of 0 cannot say whether the lost COMMIT was applied.
    let (seen, outcome, other) = store
        .lose_while_forgotten(async move { client.commit("t1").await })
        .await;
    assert_eq!(forgotten(&seen), [(0, 1, 0, 1)], "{seen:?}");
    // Before: TransactionRolledBack, which would invite the application to run the
    // transaction again even when the COMMIT had been applied.
    assert!(
        matches!(outcome, Err(ClientError::OutcomeUnknown { .. })),
        "{outcome:?}"
    );

    other.disconnect().await.unwrap();
    store.client.disconnect().await.unwrap();
    store.broker.stop().expect("broker stops");
}
