//! SUBSCRIBE/UNSUBSCRIBE, routing of MESSAGE frames, ACK/NACK per protocol version,
//! transactions and DISCONNECT — checked on the frames a broker receives.

mod support;

use std::time::Duration;

use haven_client::{AckMode, Command, ConnectOptions, Connection};
use support::{message, FakeServer, Peer};

async fn connected(version: &str) -> (Connection, Peer, FakeServer) {
    let server = FakeServer::bind().await;
    let addr = server.addr.clone();
    let client =
        tokio::spawn(async move { Connection::connect(&addr, ConnectOptions::default()).await });
    let mut peer = server.accept().await;
    peer.handshake(version, "0,0").await;
    (client.await.unwrap().expect("connect"), peer, server)
}

/// Subscribes on a task while the fake broker answers the SUBSCRIBE's receipt.
async fn subscribe(
    conn: &Connection,
    peer: &mut Peer,
    dest: &str,
    ack: AckMode,
    headers: &[(&str, &str)],
) -> (haven_client::Subscription, haven_client::Frame) {
    let c = conn.clone();
    let dest_owned = dest.to_string();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let task = tokio::spawn(async move {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        c.subscribe(&dest_owned, ack, &h).await
    });
    let frame = peer.expect_receipted(Command::Subscribe).await;
    (task.await.unwrap().expect("subscribed"), frame)
}

#[tokio::test]
async fn messages_are_routed_to_their_subscription_in_order() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let (mut a, fa) = subscribe(&conn, &mut peer, "/queue/a", AckMode::Auto, &[]).await;
    let (mut b, fb) = subscribe(
        &conn,
        &mut peer,
        "/topic/b",
        AckMode::ClientIndividual,
        &[("activemq.prefetchSize", "10")],
    )
    .await;
    assert_eq!(fa.header("destination"), Some("/queue/a"));
    assert_eq!(fa.header("ack"), Some("auto"));
    assert_eq!(fb.header("ack"), Some("client-individual"));
    assert_eq!(fb.header("activemq.prefetchSize"), Some("10"));
    assert_ne!(fa.header("id"), fb.header("id"));
    assert_eq!(a.id(), fa.header("id").unwrap());

    for i in 0..5 {
        peer.send(message(a.id(), &format!("a{i}"), &format!("A{i}")))
            .await;
        peer.send(
            message(b.id(), &format!("b{i}"), &format!("B{i}")).with_header("redelivered", "true"),
        )
        .await;
    }
    // A message for a subscription the client does not hold is dropped, not misrouted.
    peer.send(message("nobody", "z", "Z")).await;
    for i in 0..5 {
        let m = a.next().await.unwrap();
        assert_eq!(&m.body[..], format!("A{i}").as_bytes());
        assert_eq!(m.message_id, format!("a{i}"));
        assert!(!m.redelivered);
        let m = b.next().await.unwrap();
        assert_eq!(&m.body[..], format!("B{i}").as_bytes());
        assert_eq!(m.ack_id(), format!("ack-b{i}"));
        assert!(m.redelivered);
    }
    assert!(a.try_next().is_none());
}

#[tokio::test]
async fn caller_chosen_subscription_id_is_used() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let (sub, f) = subscribe(
        &conn,
        &mut peer,
        "/topic/d",
        AckMode::Auto,
        &[("id", "durable-1"), ("activemq.subscriptionName", "d1")],
    )
    .await;
    assert_eq!(sub.id(), "durable-1");
    assert_eq!(f.header("id"), Some("durable-1"));
    assert_eq!(f.headers.iter().filter(|(k, _)| *k == "id").count(), 1);
    assert_eq!(f.header("activemq.subscriptionName"), Some("d1"));

    let c = conn.clone();
    let t = tokio::spawn(async move {
        c.unsubscribe(sub, &[("activemq.subscriptionName", "d1")])
            .await
    });
    let u = peer.expect_receipted(Command::Unsubscribe).await;
    t.await.unwrap().unwrap();
    assert_eq!(u.header("id"), Some("durable-1"));
    assert_eq!(u.header("activemq.subscriptionName"), Some("d1"));
}

#[tokio::test]
async fn ack_and_nack_use_the_id_header_in_stomp_1_2() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let (mut sub, _) = subscribe(&conn, &mut peer, "/queue/q", AckMode::Client, &[]).await;
    peer.send(message(sub.id(), "m1", "x")).await;
    let m = sub.next().await.unwrap();

    conn.ack(&m).await.unwrap();
    let f = peer.expect(Command::Ack).await;
    assert_eq!(f.header("id"), Some("ack-m1"));
    assert_eq!(f.header("receipt"), None);

    conn.nack(&m).await.unwrap();
    let f = peer.expect(Command::Nack).await;
    assert_eq!(f.header("id"), Some("ack-m1"));

    let c = conn.clone();
    let m2 = m.clone();
    let t = tokio::spawn(async move { c.ack_with(&m2, Some("tx-9"), true).await });
    let f = peer.expect_receipted(Command::Ack).await;
    t.await.unwrap().unwrap();
    assert_eq!(f.header("transaction"), Some("tx-9"));
}

#[tokio::test]
async fn ack_uses_message_id_and_subscription_in_stomp_1_1() {
    let (conn, mut peer, _s) = connected("1.1").await;
    let (mut sub, _) =
        subscribe(&conn, &mut peer, "/queue/q", AckMode::ClientIndividual, &[]).await;
    peer.send(message(sub.id(), "m1", "x")).await;
    let m = sub.next().await.unwrap();
    let c = conn.clone();
    let t = tokio::spawn(async move { c.nack_receipted(&m).await });
    let f = peer.expect_receipted(Command::Nack).await;
    t.await.unwrap().unwrap();
    assert_eq!(f.header("message-id"), Some("m1"));
    assert_eq!(f.header("subscription"), Some(sub.id()));
    assert_eq!(f.header("id"), None);
}

#[tokio::test]
async fn transactions_are_receipted_frames() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let c = conn.clone();
    let t = tokio::spawn(async move {
        c.begin("tx-1").await?;
        c.send("/queue/t", &[("transaction", "tx-1")], "in-tx")
            .await?;
        c.commit("tx-1").await?;
        c.begin("tx-2").await?;
        c.abort("tx-2").await
    });
    assert_eq!(
        peer.expect_receipted(Command::Begin)
            .await
            .header("transaction"),
        Some("tx-1")
    );
    assert_eq!(
        peer.expect(Command::Send).await.header("transaction"),
        Some("tx-1")
    );
    assert_eq!(
        peer.expect_receipted(Command::Commit)
            .await
            .header("transaction"),
        Some("tx-1")
    );
    assert_eq!(
        peer.expect_receipted(Command::Begin)
            .await
            .header("transaction"),
        Some("tx-2")
    );
    assert_eq!(
        peer.expect_receipted(Command::Abort)
            .await
            .header("transaction"),
        Some("tx-2")
    );
    t.await.unwrap().unwrap();
}

#[tokio::test]
async fn disconnect_waits_for_its_receipt_then_closes_everything() {
    let (conn, mut peer, _s) = connected("1.2").await;
    let (mut sub, _) = subscribe(&conn, &mut peer, "/queue/q", AckMode::Auto, &[]).await;
    let c = conn.clone();
    let t = tokio::spawn(async move { c.disconnect().await });
    peer.expect_receipted(Command::Disconnect).await;
    t.await.unwrap().expect("disconnect receipted");
    assert!(conn.is_closed());
    let end = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("no hang");
    assert!(end.is_none());
    assert!(conn.send("/queue/q", &[], "late").await.is_err());
    // The socket is closed from the client's side too.
    assert!(peer.recv_item().await.is_none());
}

#[tokio::test]
async fn dropping_the_last_handle_flushes_queued_frames_and_closes_the_socket() {
    let (conn, mut peer, _s) = connected("1.2").await;
    for i in 0..10 {
        conn.send("/queue/d", &[], format!("{i}")).await.unwrap();
    }
    drop(conn);
    for i in 0..10 {
        let f = peer.expect(Command::Send).await;
        assert_eq!(&f.body[..], format!("{i}").as_bytes());
    }
    assert!(peer.recv_item().await.is_none());
}
