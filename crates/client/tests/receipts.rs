//! SEND with and without receipts, pipelining, concurrency, and how a dying connection fails
//! every waiter instead of leaving it hanging.

mod support;

use std::time::Duration;

use haven_client::{ClientError, Command, ConnectOptions, Connection, Frame};
use support::{FakeServer, Peer};

async fn connected(version: &str) -> (Connection, Peer, FakeServer) {
    let server = FakeServer::bind().await;
    let addr = server.addr.clone();
    let client =
        tokio::spawn(async move { Connection::connect(&addr, ConnectOptions::default()).await });
    let mut peer = server.accept().await;
    peer.handshake(version, "0,0").await;
    (client.await.unwrap().expect("connect"), peer, server)
}

#[tokio::test]
async fn send_carries_destination_headers_and_binary_body() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let body: Vec<u8> = vec![0, 1, 2, 0, 255];
    conn.send(
        "/queue/a",
        &[("persistent", "true"), ("x-id", "7")],
        body.clone(),
    )
    .await
    .unwrap();
    let f = peer.expect(Command::Send).await;
    assert_eq!(f.header("destination"), Some("/queue/a"));
    assert_eq!(f.header("persistent"), Some("true"));
    assert_eq!(f.header("x-id"), Some("7"));
    assert_eq!(f.header("receipt"), None);
    assert_eq!(&f.body[..], &body[..]);
}

#[tokio::test]
async fn send_receipted_returns_only_after_the_receipt() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let sender = tokio::spawn(async move { conn.send_receipted("/queue/a", &[], "hello").await });
    let f = peer.expect(Command::Send).await;
    assert!(f.header("receipt").is_some());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !sender.is_finished(),
        "send_receipted returned before its RECEIPT"
    );
    // A RECEIPT for some other id must not complete it.
    peer.send(Frame::new(Command::Receipt).with_header("receipt-id", "someone-else"))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!sender.is_finished());
    peer.receipt(&f).await;
    sender.await.unwrap().expect("receipted");
}

#[tokio::test]
async fn pipelined_receipts_complete_in_any_order() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let mut pending = Vec::new();
    for i in 0..50 {
        pending.push(
            conn.send_with_receipt_future("/queue/p", &[], format!("m{i}"))
                .await
                .unwrap(),
        );
    }
    let mut frames = Vec::new();
    for _ in 0..50 {
        frames.push(peer.expect(Command::Send).await);
    }
    let ids: std::collections::HashSet<_> = frames
        .iter()
        .map(|f| f.header("receipt").unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 50, "receipt ids must be unique");
    for f in frames.iter().rev() {
        peer.receipt(f).await;
    }
    for r in pending {
        r.await.expect("receipt");
    }
}

#[tokio::test]
async fn many_tasks_send_concurrently_on_one_connection() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                conn.send("/queue/c", &[], format!("{t}-{i}"))
                    .await
                    .unwrap();
            }
        }));
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..800 {
        let f = peer.expect(Command::Send).await;
        assert!(
            seen.insert(String::from_utf8(f.body.to_vec()).unwrap()),
            "frame duplicated"
        );
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(seen.len(), 800);
}

#[tokio::test]
async fn error_frame_fails_every_waiter_with_the_brokers_message() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let mut sub = {
        let c = conn.clone();
        let s = tokio::spawn(async move {
            c.subscribe("/queue/e", haven_client::AckMode::Auto, &[])
                .await
        });
        peer.expect_receipted(Command::Subscribe).await;
        s.await.unwrap().unwrap()
    };
    let r1 = conn
        .send_with_receipt_future("/queue/e", &[], "1")
        .await
        .unwrap();
    let r2 = conn
        .send_with_receipt_future("/queue/e", &[], "2")
        .await
        .unwrap();
    peer.expect(Command::Send).await;
    peer.send(
        Frame::new(Command::Error)
            .with_header("message", "disk full")
            .with_body("details"),
    )
    .await;
    for r in [r1, r2] {
        match r.await {
            Err(ClientError::Server { message, .. }) => assert_eq!(message, "disk full"),
            other => panic!("expected Server error, got {other:?}"),
        }
    }
    assert!(
        sub.next().await.is_none(),
        "subscription must end when the connection does"
    );
    match conn.send("/queue/e", &[], "3").await {
        Err(ClientError::Server { message, .. }) => assert_eq!(message, "disk full"),
        other => panic!("send after ERROR must fail with its cause, got {other:?}"),
    }
    assert!(conn.is_closed());
}

#[tokio::test]
async fn broker_closing_the_socket_fails_outstanding_receipts() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let r = conn
        .send_with_receipt_future("/queue/x", &[], "1")
        .await
        .unwrap();
    peer.expect(Command::Send).await;
    drop(peer);
    let out = tokio::time::timeout(Duration::from_secs(5), r)
        .await
        .expect("receipt wait must not hang");
    assert!(matches!(out, Err(ClientError::Closed)), "got {out:?}");
    assert!(conn.send_receipted("/queue/x", &[], "2").await.is_err());
}

#[tokio::test]
async fn raw_frames_and_bytes_go_out_unchanged() {
    let (conn, mut peer, _s) = connected("1.2").await;
    conn.raw_send_frame(
        Frame::new(Command::Send)
            .with_header("destination", "/queue/raw")
            .with_header("odd", "1"),
    )
    .await
    .unwrap();
    let f = peer.expect(Command::Send).await;
    assert_eq!(f.header("odd"), Some("1"));
    assert_eq!(f.header("receipt"), None);
    conn.raw_send_bytes(&b"BEGIN\ntransaction:t\n\n\0"[..])
        .await
        .unwrap();
    let f = peer.expect(Command::Begin).await;
    assert_eq!(f.header("transaction"), Some("t"));
}
