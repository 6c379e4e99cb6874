//! Hostile clients against one broker while a well-behaved client keeps working: many
//! slowloris connections, connection churn, and a subscription flood. Each abuse meets a limit
//! (connect timeout, connection slots freed on close, subscriptions per connection) and the
//! broker keeps serving. No timing is asserted; every wait is bounded so a hang fails.

mod common;

use std::time::Duration;

use common::{Broker, Client, WAIT};
use haven_client::{AckMode, ConnectOptions, Connection};
use tokio::io::AsyncWriteExt;

/// A send/receive round trip on a fresh connection: the broker still serves.
async fn still_serves(broker: &Broker, queue: &str) {
    let conn = tokio::time::timeout(
        WAIT,
        Connection::connect(&broker.addr().to_string(), ConnectOptions::default()),
    )
    .await
    .expect("connect within the wait")
    .expect("connects");
    let mut sub = conn
        .subscribe(queue, AckMode::Auto, &[])
        .await
        .expect("subscribe");
    conn.send_receipted(queue, &[], "ping").await.expect("send");
    let m = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a message within the wait")
        .expect("subscription open");
    assert_eq!(&m.body[..], b"ping");
    conn.disconnect().await.expect("disconnect");
}

#[tokio::test(flavor = "multi_thread")]
async fn slowloris_connections_are_closed_while_others_are_served() {
    const SLOW: usize = 200;
    let broker = Broker::start_with(|c| c.stomp.connect_timeout_ms = 500).await;
    let mut slow = Vec::new();
    for _ in 0..SLOW {
        let mut s = tokio::net::TcpStream::connect(broker.addr()).await.unwrap();
        // Half a CONNECT frame, never finished.
        s.write_all(b"CONNECT\naccept-version:1.2\nhost:")
            .await
            .unwrap();
        slow.push(s);
    }
    still_serves(&broker, "/queue/slowloris").await;
    for mut s in slow {
        let mut buf = [0u8; 4096];
        // The broker answers with an ERROR (connect timeout) and closes: read to EOF.
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            use tokio::io::AsyncReadExt;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "a slowloris connection was kept open");
    }
    still_serves(&broker, "/queue/slowloris").await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_connections_opened_and_dropped_leave_the_broker_serving() {
    const CHURN: usize = 10_000;
    // Fewer slots than the churn: slots must be given back as connections close.
    let broker = Broker::start_with(|c| c.stomp.connections_max = 1_000).await;
    let addr = broker.addr();
    let churned = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut done = 0;
        for i in 0..CHURN {
            let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                continue;
            };
            // Every other one says CONNECT first; all go away without a word.
            if i % 2 == 0 {
                let _ = s.write_all(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0");
            }
            done += 1;
        }
        done
    })
    .await
    .unwrap();
    assert!(
        churned > CHURN * 9 / 10,
        "only {churned} connects succeeded"
    );
    // Slots come back as the broker notices the closes; a new client gets one within the wait.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match Connection::connect(&addr.to_string(), ConnectOptions::default()).await {
            Ok(conn) => {
                conn.disconnect().await.expect("disconnect");
                break;
            }
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no connection slot came back: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    still_serves(&broker, "/queue/churn").await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscription_flood_meets_the_per_connection_limit() {
    const LIMIT: usize = 100;
    let broker = Broker::start_with(|c| c.limits.subscriptions_per_connection_max = LIMIT).await;
    let mut flood = Client::connect(broker.addr(), &[("accept-version", "1.2")]).await;
    // Pipelined without receipts, as a flood would come.
    for i in 0..=LIMIT {
        let id = format!("s{i}");
        let dest = format!("/queue/flood-{i}");
        let f = common::frame(
            haven_stomp::Command::Subscribe,
            &[("id", id.as_str()), ("destination", dest.as_str())],
            bytes::Bytes::new(),
        );
        flood.send(&f).await;
    }
    flood.error_then_close("subscriptions").await;
    still_serves(&broker, "/queue/flood-ok").await;
    broker.stop().await;
}
