//! Heart-beats: the client sends them when negotiated and notices a silent broker.

mod support;

use std::time::{Duration, Instant};

use haven_client::{AckMode, ClientError, Command, ConnectOptions, Connection};
use haven_stomp::Item;
use support::{FakeServer, Peer};

async fn connected(
    heartbeat_ms: (u64, u64),
    server_heart_beat: &str,
) -> (Connection, Peer, FakeServer) {
    let server = FakeServer::bind().await;
    let addr = server.addr.clone();
    let client = tokio::spawn(async move {
        Connection::connect(
            &addr,
            ConnectOptions {
                heartbeat_ms,
                ..ConnectOptions::default()
            },
        )
        .await
    });
    let mut peer = server.accept().await;
    let connect = peer.handshake("1.2", server_heart_beat).await;
    assert_eq!(
        connect.header("heart-beat"),
        Some(format!("{},{}", heartbeat_ms.0, heartbeat_ms.1).as_str())
    );
    (client.await.unwrap().expect("connect"), peer, server)
}

#[tokio::test]
async fn client_sends_heartbeats_at_the_negotiated_interval() {
    // Client can send every 50 ms, broker wants one every 100 ms: negotiated 100 ms.
    let (_conn, mut peer, _s) = connected((50, 0), "0,100").await;
    let start = Instant::now();
    let mut beats = 0;
    while beats < 5 {
        match peer.recv_item().await {
            Some(Item::Heartbeat) => beats += 1,
            other => panic!("expected only heart-beats, got {other:?}"),
        }
    }
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(350),
        "heart-beats too fast: 5 in {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(3000),
        "heart-beats too slow: 5 in {elapsed:?}"
    );
}

#[tokio::test]
async fn no_heartbeats_when_the_broker_declines() {
    let (conn, mut peer, _s) = connected((50, 0), "0,0").await;
    conn.send("/queue/h", &[], "x").await.unwrap();
    let start = Instant::now();
    // The only thing the broker sees within 400 ms is the SEND, never an EOL.
    let f = peer.recv_item().await;
    assert!(
        matches!(f, Some(Item::Frame(ref f)) if f.command == Command::Send),
        "{f:?}"
    );
    let next = tokio::time::timeout(Duration::from_millis(400), peer.recv_item()).await;
    assert!(
        next.is_err(),
        "unexpected traffic after {:?}: {next:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_silent_broker_is_detected_and_fails_everything() {
    // Broker promises a beat every 100 ms and then says nothing.
    let (conn, mut peer, _s) = connected((0, 100), "100,0").await;
    let c = conn.clone();
    let sub = tokio::spawn(async move { c.subscribe("/queue/s", AckMode::Auto, &[]).await });
    peer.expect_receipted(Command::Subscribe).await;
    let mut sub = sub.await.unwrap().unwrap();
    let pending = conn
        .send_with_receipt_future("/queue/s", &[], "x")
        .await
        .unwrap();
    let start = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("must not hang");
    assert!(
        matches!(out, Err(ClientError::HeartbeatTimeout { .. })),
        "got {out:?}"
    );
    assert!(start.elapsed() < Duration::from_millis(3000));
    assert!(sub.next().await.is_none());
    assert!(matches!(
        conn.close_reason(),
        Some(ClientError::HeartbeatTimeout { .. })
    ));
}

#[tokio::test]
async fn broker_heartbeats_keep_the_connection_open() {
    let (conn, mut peer, _s) = connected((0, 100), "100,0").await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peer.send_raw(b"\n").await;
    }
    assert!(!conn.is_closed(), "closed: {:?}", conn.close_reason());
    let c = conn.clone();
    let t = tokio::spawn(async move { c.send_receipted("/queue/k", &[], "alive").await });
    peer.expect_receipted(Command::Send).await;
    t.await.unwrap().unwrap();
}
