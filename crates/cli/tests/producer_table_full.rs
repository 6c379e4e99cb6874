//! A producer table that forgets producers to make room (`limits.producers_max`) shortens the
//! exactly-once window below `producer_idle_ms_max`, and until 2026-12-05 nothing showed it:
//! the client that came back forgotten got `haven-seq:0`, and its resend was stored again.
//! The broker now warns, with how many it forgot and how long the last one had been away.
//! The real binary and its log.

use std::time::{Duration, Instant};

use haven_client::{AckMode, ConnectOptions, Connection};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};

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
    let mut opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("broker"),
        free_addr(),
    );
    opts.config_toml =
        Some("[limits]\nproducers_max = 2\n[journal]\nmaintenance_interval_ms = 50\n".to_string());
    let mut broker = BrokerProcess::start(opts).expect("broker starts");
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
