//! The failover `Client` against scripted fake brokers: what it sends again after a reconnect,
//! how it restores subscriptions, drops acked redeliveries, settles transactions, follows
//! cluster announcements, `priorityBackup`, `backup` and `timeout`. Each step is explicit, so
//! these tests pin the wire protocol of failover exactly; real brokers killed with `kill -9`
//! are in crates/cli/tests/failover_clients.rs.

mod support;

use std::time::Duration;

use haven_client::{AckMode, Client, ClientError, Command, ConnectOptions, ConnectionEvent, Frame};
use support::{message, FakeServer, Peer, STEP_MS};

/// Reads CONNECT and answers CONNECTED (STOMP 1.2) with `headers`.
async fn handshake(peer: &mut Peer, headers: &[(&str, &str)]) -> Frame {
    let connect = peer.expect(Command::Connect).await;
    let mut connected = Frame::new(Command::Connected)
        .with_header("version", "1.2")
        .with_header("heart-beat", "0,0");
    for (k, v) in headers {
        connected = connected.with_header(*k, *v);
    }
    peer.send(connected).await;
    connect
}

fn uri(servers: &[&FakeServer], options: &str) -> String {
    let list: Vec<String> = servers
        .iter()
        .map(|s| format!("tcp://{}", s.addr))
        .collect();
    format!(
        "failover:({})?initialReconnectDelay=1&maxReconnectDelay=20&randomize=false{options}",
        list.join(",")
    )
}

/// Connects a `Client` to `server`, playing the handshake with `headers`.
async fn connect(server: &FakeServer, uri: &str, headers: &[(&str, &str)]) -> (Client, Peer) {
    let uri = uri.to_string();
    let client =
        tokio::spawn(async move { Client::connect(&uri, ConnectOptions::default()).await });
    let mut peer = server.accept().await;
    handshake(&mut peer, headers).await;
    (client.await.unwrap().expect("client connects"), peer)
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(STEP_MS);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn seq(f: &Frame) -> u64 {
    f.header("haven-seq")
        .expect("tracked frame has haven-seq")
        .parse()
        .unwrap()
}

#[tokio::test]
async fn connect_claims_the_producer_and_sends_are_numbered() {
    let server = FakeServer::bind().await;
    let uri = uri(&[&server], "");
    let uri2 = uri.clone();
    let task = tokio::spawn(async move { Client::connect(&uri2, ConnectOptions::default()).await });
    let mut peer = server.accept().await;
    let connect = handshake(&mut peer, &[("haven-seq", "0")]).await;
    let client = task.await.unwrap().unwrap();
    assert_eq!(connect.header("haven-producer"), Some(client.producer_id()));
    assert_eq!(connect.header("haven-cluster-updates"), Some("true"));
    client.send("/queue/a", &[("x", "1")], "one").await.unwrap();
    client.send("/queue/a", &[], "two").await.unwrap();
    let a = peer.expect(Command::Send).await;
    let b = peer.expect(Command::Send).await;
    assert_eq!(a.header("haven-producer"), Some(client.producer_id()));
    assert_eq!((seq(&a), seq(&b)), (1, 2));
    assert_eq!(a.header("receipt"), Some("hv-1"));
    assert_eq!(a.header("x"), Some("1"));
    assert_eq!(client.unconfirmed_sends(), 2);
    peer.receipt(&a).await;
    peer.receipt(&b).await;
    wait_until("receipts retire the sends", || {
        client.unconfirmed_sends() == 0
    })
    .await;
}

#[tokio::test]
async fn after_a_reconnect_only_what_the_broker_has_not_stored_is_sent_again() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &[("haven-seq", "0")]).await;
    let mut events = client.events();
    match events.recv().await.unwrap() {
        ConnectionEvent::Connected { broker } => {
            assert_eq!(broker, format!("tcp://{}", server.addr))
        }
        other => panic!("the first listener sees Connected first, got {other:?}"),
    }
    let waiter = {
        let c = client.clone();
        tokio::spawn(async move { c.send_receipted("/queue/a", &[], "3").await })
    };
    client.send("/queue/a", &[], "1").await.unwrap();
    client.send("/queue/a", &[], "2").await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(peer.expect(Command::Send).await);
    }
    seen.sort_by_key(seq);
    peer.receipt(&seen[0]).await;
    wait_until("first receipt", || client.unconfirmed_sends() == 2).await;
    drop(peer); // the broker dies after storing seq 1 and 2, receipting only 1

    let mut peer = server.accept().await;
    handshake(&mut peer, &[("haven-seq", "2")]).await;
    let again = peer.expect(Command::Send).await;
    assert_eq!(seq(&again), 3, "only the unstored SEND is sent again");
    assert_eq!(again.header("receipt"), Some("hv-3"));
    assert_eq!(&again.body[..], &seen[2].body[..]);
    peer.receipt(&again).await;
    waiter
        .await
        .unwrap()
        .expect("send_receipted survives the failover");
    assert_eq!(client.unconfirmed_sends(), 0);
    assert_eq!(client.reconnects(), 1);
    loop {
        match events.recv().await.unwrap() {
            ConnectionEvent::Resumed {
                resent, confirmed, ..
            } => {
                assert_eq!((resent, confirmed), (1, 1));
                break;
            }
            ConnectionEvent::Interrupted { .. } => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_broker_without_producer_sequences_gets_every_unconfirmed_send_again() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &[]).await;
    client.send("/queue/a", &[], "1").await.unwrap();
    client.send("/queue/a", &[], "2").await.unwrap();
    let first = peer.expect(Command::Send).await;
    peer.expect(Command::Send).await;
    peer.receipt(&first).await;
    wait_until("first receipt", || client.unconfirmed_sends() == 1).await;
    drop(peer);
    let mut peer = server.accept().await;
    handshake(&mut peer, &[]).await;
    let again = peer.expect(Command::Send).await;
    assert_eq!(seq(&again), 2);
    peer.receipt(&again).await;
    wait_until("resend confirmed", || client.unconfirmed_sends() == 0).await;
}

#[tokio::test]
async fn subscriptions_are_restored_with_the_same_id_and_headers() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &[]).await;
    let sub_task = {
        let c = client.clone();
        tokio::spawn(async move {
            c.subscribe(
                "/queue/a",
                AckMode::ClientIndividual,
                &[("id", "s1"), ("selector", "x = 1")],
            )
            .await
        })
    };
    let first = peer.expect_receipted(Command::Subscribe).await;
    let mut sub = sub_task.await.unwrap().unwrap();
    drop(peer);
    let mut peer = server.accept().await;
    handshake(&mut peer, &[]).await;
    let again = peer.expect_receipted(Command::Subscribe).await;
    for h in ["id", "destination", "ack", "selector"] {
        assert_eq!(again.header(h), first.header(h), "header {h}");
    }
    peer.send(message("s1", "m1", "after failover")).await;
    let m = tokio::time::timeout(Duration::from_millis(STEP_MS), sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.body[..], b"after failover");
}

#[tokio::test]
async fn a_redelivery_of_an_acked_message_is_dropped_and_acked_again() {
    let server = FakeServer::bind().await;
    let store = [("haven-store", "store-1")];
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &store).await;
    let sub_task = {
        let c = client.clone();
        tokio::spawn(async move {
            c.subscribe("/queue/a", AckMode::ClientIndividual, &[("id", "s1")])
                .await
        })
    };
    peer.expect_receipted(Command::Subscribe).await;
    let mut sub = sub_task.await.unwrap().unwrap();
    peer.send(message("s1", "m1", "one")).await;
    let m1 = sub.next().await.unwrap();
    drop(peer); // lost before the application's ACK could reach it
    wait_until("connection loss noticed", || client.broker().is_none()).await;
    client
        .ack(&m1)
        .await
        .expect("ack of a lost delivery is remembered, not an error");

    let mut peer = server.accept().await;
    handshake(&mut peer, &store).await;
    peer.expect_receipted(Command::Subscribe).await;
    let mut again = message("s1", "m1", "one");
    again.push_header("redelivered", "true");
    peer.send(again).await;
    peer.send(message("s1", "m2", "two")).await;
    let next = sub.next().await.unwrap();
    assert_eq!(
        next.message_id, "m2",
        "the acked m1 must not reach the application again"
    );
    let ack = peer.expect(Command::Ack).await;
    assert_eq!(
        ack.header("id"),
        Some("ack-m1"),
        "the dropped copy is acked on the new connection"
    );
}

#[tokio::test]
async fn same_message_id_from_another_store_is_not_a_duplicate() {
    let server = FakeServer::bind().await;
    let (client, mut peer) =
        connect(&server, &uri(&[&server], ""), &[("haven-store", "store-1")]).await;
    let sub_task = {
        let c = client.clone();
        tokio::spawn(async move {
            c.subscribe("/queue/a", AckMode::Auto, &[("id", "s1")])
                .await
        })
    };
    peer.expect_receipted(Command::Subscribe).await;
    let mut sub = sub_task.await.unwrap().unwrap();
    peer.send(message("s1", "ID:haven-1", "from store 1")).await;
    sub.next().await.unwrap();
    drop(peer);
    let mut peer = server.accept().await;
    handshake(&mut peer, &[("haven-store", "store-2")]).await;
    peer.expect_receipted(Command::Subscribe).await;
    peer.send(message("s1", "ID:haven-1", "from store 2")).await;
    let m = sub.next().await.unwrap();
    assert_eq!(&m.body[..], b"from store 2");
}

/// Plays BEGIN, one transacted SEND and a COMMIT that the connection loses before its
/// RECEIPT; the next CONNECTED answers `haven_seq` (or nothing). Returns `commit`'s result.
async fn commit_lost_in_flight(haven_seq: Option<&str>) -> Result<(), ClientError> {
    commit_lost_in_flight_stores(haven_seq, "s1", "s1").await
}

/// As `commit_lost_in_flight`, with the `haven-store` of the first and the second CONNECTED.
async fn commit_lost_in_flight_stores(
    haven_seq: Option<&str>,
    store_before: &str,
    store_after: &str,
) -> Result<(), ClientError> {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(
        &server,
        &uri(&[&server], ""),
        &[("haven-seq", "0"), ("haven-store", store_before)],
    )
    .await;
    let begin = {
        let c = client.clone();
        tokio::spawn(async move { c.begin("t1").await })
    };
    peer.expect_receipted(Command::Begin).await;
    begin.await.unwrap().unwrap();
    client
        .send("/queue/a", &[("transaction", "t1")], "in tx")
        .await
        .unwrap();
    let send = peer.expect(Command::Send).await;
    assert_eq!(
        send.header("haven-seq"),
        None,
        "transacted SENDs are not numbered"
    );
    let commit = {
        let c = client.clone();
        tokio::spawn(async move { c.commit("t1").await })
    };
    let frame = peer.expect(Command::Commit).await;
    assert_eq!(seq(&frame), 1);
    drop(peer);
    let mut peer = server.accept().await;
    let mut headers: Vec<(&str, &str)> = haven_seq.map(|s| ("haven-seq", s)).into_iter().collect();
    headers.push(("haven-store", store_after));
    handshake(&mut peer, &headers).await;
    commit.await.unwrap()
}

/// Another store's mark says nothing about a COMMIT written to the first one (three standalone
/// brokers: the COMMIT may have been applied where it was sent).
#[tokio::test]
async fn a_commit_lost_in_flight_to_another_store_is_unknown() {
    assert!(matches!(
        commit_lost_in_flight_stores(Some("0"), "s1", "s2").await,
        Err(ClientError::OutcomeUnknown { .. })
    ));
}

#[tokio::test]
async fn a_commit_lost_in_flight_is_settled_by_the_brokers_sequence() {
    assert!(commit_lost_in_flight(Some("1")).await.is_ok());
    assert!(matches!(
        commit_lost_in_flight(Some("0")).await,
        Err(ClientError::TransactionRolledBack { .. })
    ));
    assert!(matches!(
        commit_lost_in_flight(None).await,
        Err(ClientError::OutcomeUnknown { .. })
    ));
}

#[tokio::test]
async fn a_transaction_of_a_lost_connection_is_reported_rolled_back() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &[]).await;
    let begin = {
        let c = client.clone();
        tokio::spawn(async move { c.begin("t1").await })
    };
    peer.expect_receipted(Command::Begin).await;
    begin.await.unwrap().unwrap();
    drop(peer);
    let mut peer = server.accept().await;
    handshake(&mut peer, &[]).await;
    wait_until("reconnected", || client.reconnects() == 1).await;
    let err = client
        .send("/queue/a", &[("transaction", "t1")], "x")
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::TransactionRolledBack { .. }),
        "{err:?}"
    );
    assert!(matches!(
        client.commit("t1").await,
        Err(ClientError::Protocol(_))
    ));
}

#[tokio::test]
async fn a_broker_error_naming_a_send_fails_that_send_and_is_not_resent() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &[]).await;
    let refused = {
        let c = client.clone();
        tokio::spawn(async move { c.send_receipted("/queue/a", &[], "too big").await })
    };
    let f = peer.expect(Command::Send).await;
    peer.send(
        Frame::new(Command::Error)
            .with_header("message", "message too large")
            .with_header("receipt-id", f.header("receipt").unwrap()),
    )
    .await;
    drop(peer);
    match refused.await.unwrap() {
        Err(ClientError::Server { message, .. }) => assert_eq!(message, "message too large"),
        other => panic!("expected the broker's refusal, got {other:?}"),
    }
    let mut peer = server.accept().await;
    handshake(&mut peer, &[]).await;
    client.send("/queue/a", &[], "next").await.unwrap();
    let next = peer.expect(Command::Send).await;
    assert_eq!(
        &next.body[..],
        b"next",
        "the refused SEND was not sent again"
    );
    assert_eq!(seq(&next), 2);
}

#[tokio::test]
async fn cluster_announcements_extend_the_broker_list() {
    let server = FakeServer::bind().await;
    let own = format!("tcp://{}", server.addr);
    let announced = format!("{own},tcp://127.0.0.1:1");
    let (client, mut peer) = connect(
        &server,
        &uri(&[&server], ""),
        &[("haven-cluster", announced.as_str())],
    )
    .await;
    assert_eq!(
        client.brokers(),
        vec![own.clone(), "tcp://127.0.0.1:1".to_string()]
    );
    let mut events = client.events();
    peer.send(
        Frame::new(Command::Message)
            .with_header("subscription", "haven.cluster")
            .with_header("destination", "/topic/haven.cluster")
            .with_header("message-id", "haven-cluster-1")
            .with_header("haven-cluster", "tcp://127.0.0.1:2")
            .with_header("haven-rebalance", "false"),
    )
    .await;
    // The first listener also sees the update from CONNECTED; wait for the pushed one.
    loop {
        match tokio::time::timeout(Duration::from_millis(STEP_MS), events.recv()).await {
            Ok(Ok(ConnectionEvent::ClusterUpdated { brokers }))
                if brokers.contains(&"tcp://127.0.0.1:2".to_string()) =>
            {
                break
            }
            Ok(Ok(_)) => {}
            other => panic!("expected ClusterUpdated, got {other:?}"),
        }
    }
    assert_eq!(
        client.broker(),
        Some(own),
        "no rebalance requested: it stays"
    );
}

#[tokio::test]
async fn updates_are_ignored_when_update_uris_is_off() {
    let server = FakeServer::bind().await;
    let uri = uri(&[&server], "&updateURIsSupported=false");
    let uri2 = uri.clone();
    let task = tokio::spawn(async move { Client::connect(&uri2, ConnectOptions::default()).await });
    let mut peer = server.accept().await;
    let connect = handshake(&mut peer, &[("haven-cluster", "tcp://127.0.0.1:9")]).await;
    let client = task.await.unwrap().unwrap();
    assert_eq!(connect.header("haven-cluster-updates"), None);
    assert_eq!(client.brokers().len(), 1);
}

#[tokio::test]
async fn a_rebalance_request_moves_the_client_to_another_member() {
    let a = FakeServer::bind().await;
    let b = FakeServer::bind().await;
    let list = format!("tcp://{},tcp://{}", a.addr, b.addr);
    let (client, mut peer) =
        connect(&a, &uri(&[&a], ""), &[("haven-cluster", list.as_str())]).await;
    // The target is chosen at random (possibly the current broker, which stays): ask until
    // the client moves. Twenty misses in a row has odds of one in a million.
    let rebalance = Frame::new(Command::Message)
        .with_header("subscription", "haven.cluster")
        .with_header("destination", "/topic/haven.cluster")
        .with_header("message-id", "haven-cluster-2")
        .with_header("haven-cluster", list.as_str())
        .with_header("haven-rebalance", "true");
    let mut moved = None;
    for _ in 0..20 {
        peer.send(rebalance.clone()).await;
        if let Ok(accepted) = tokio::time::timeout(Duration::from_millis(200), b.accept()).await {
            moved = Some(accepted);
            break;
        }
    }
    let mut new_peer = moved.expect("the client moved to the other member");
    handshake(&mut new_peer, &[]).await;
    // It leaves the old broker in order: a receipted DISCONNECT.
    peer.expect_receipted(Command::Disconnect).await;
    wait_until("moved", || {
        client.broker() == Some(format!("tcp://{}", b.addr))
    })
    .await;
}

#[tokio::test]
async fn priority_backup_returns_to_the_priority_broker() {
    let spare = FakeServer::bind().await;
    // The priority broker is down at first: a port with nothing listening.
    let priority_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let uri = format!(
        "failover:(tcp://127.0.0.1:{priority_port},tcp://{})?priorityBackup=true&randomize=false&initialReconnectDelay=1",
        spare.addr
    );
    let (client, mut spare_peer) = connect(&spare, &uri, &[]).await;
    let priority = tokio::net::TcpListener::bind(("127.0.0.1", priority_port))
        .await
        .expect("rebind the priority port");
    let (stream, _) = tokio::time::timeout(Duration::from_millis(STEP_MS), priority.accept())
        .await
        .expect("the client retries the priority broker")
        .unwrap();
    let mut peer = Peer {
        framed: tokio_util::codec::Framed::new(
            stream,
            haven_stomp::StompCodec::new(haven_stomp::Limits::default()),
        ),
    };
    handshake(&mut peer, &[]).await;
    spare_peer.expect_receipted(Command::Disconnect).await;
    let expected = format!("tcp://127.0.0.1:{priority_port}");
    wait_until("back on the priority broker", || {
        client.broker().as_deref() == Some(expected.as_str())
    })
    .await;
}

#[tokio::test]
async fn the_backup_connection_takes_over_at_once() {
    let a = FakeServer::bind().await;
    let b = FakeServer::bind().await;
    let (client, peer_a) = connect(&a, &uri(&[&a, &b], "&backup=true"), &[]).await;
    let mut peer_b = b.accept().await;
    handshake(&mut peer_b, &[]).await;
    drop(peer_a);
    // No new connection: the session is restored on the spare, so a SEND arrives there.
    wait_until("switched to the backup", || {
        client.broker() == Some(format!("tcp://{}", b.addr))
    })
    .await;
    client.send("/queue/a", &[], "via backup").await.unwrap();
    let f = peer_b.expect(Command::Send).await;
    assert_eq!(&f.body[..], b"via backup");
}

#[tokio::test]
async fn timeout_withdraws_a_send_that_never_reached_a_broker() {
    let server = FakeServer::bind().await;
    let (client, peer) = connect(&server, &uri(&[&server], "&timeout=100"), &[]).await;
    drop(peer);
    drop(server); // nothing listens any more: reconnecting goes on, never succeeds
    wait_until("loss noticed", || client.broker().is_none()).await;
    let err = client
        .send_receipted("/queue/a", &[], "x")
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
    assert_eq!(
        client.unconfirmed_sends(),
        0,
        "withdrawn, so never sent later"
    );
}

#[tokio::test]
async fn startup_attempts_run_out_with_a_typed_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let uri = format!(
        "failover:(tcp://127.0.0.1:{port})?startupMaxReconnectAttempts=2&initialReconnectDelay=1"
    );
    match Client::connect(&uri, ConnectOptions::default()).await {
        Err(ClientError::NoBroker {
            passes, brokers, ..
        }) => {
            assert_eq!(passes, 3);
            assert_eq!(brokers, vec![format!("tcp://127.0.0.1:{port}")]);
        }
        Ok(_) => panic!("connected to nothing"),
        Err(e) => panic!("expected NoBroker, got {e:?}"),
    }
    assert!(matches!(
        Client::connect(
            "failover:(tcp://127.0.0.1:1)?bogus=1",
            ConnectOptions::default()
        )
        .await,
        Err(ClientError::BadAddress { .. })
    ));
}

#[tokio::test]
async fn a_plain_tcp_uri_does_not_reconnect() {
    let server = FakeServer::bind().await;
    let (client, peer) = connect(&server, &format!("tcp://{}", server.addr), &[]).await;
    let mut events = client.events();
    drop(peer);
    loop {
        match tokio::time::timeout(Duration::from_millis(STEP_MS), events.recv()).await {
            Ok(Ok(ConnectionEvent::Failed { .. })) => break,
            Ok(Ok(_)) => {}
            other => panic!("expected Failed, got {other:?}"),
        }
    }
    assert!(client.send("/queue/a", &[], "x").await.is_err());
}

/// A broker dispatches to a restored subscription before it answers the SUBSCRIBE's RECEIPT:
/// the application's ACK of such a message must go out on the new connection (if it were
/// dropped, the broker's prefetch window would fill with messages it never hears about).
#[tokio::test]
async fn a_message_delivered_during_the_restore_can_be_acked() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &[]).await;
    let sub_task = {
        let c = client.clone();
        tokio::spawn(async move {
            c.subscribe("/queue/a", AckMode::ClientIndividual, &[("id", "s1")])
                .await
        })
    };
    peer.expect_receipted(Command::Subscribe).await;
    let mut sub = sub_task.await.unwrap().unwrap();
    drop(peer);
    let mut peer = server.accept().await;
    handshake(&mut peer, &[]).await;
    let subscribe = peer.expect(Command::Subscribe).await;
    peer.send(message("s1", "m1", "early")).await;
    let m = tokio::time::timeout(Duration::from_millis(STEP_MS), sub.next())
        .await
        .unwrap()
        .unwrap();
    client.ack(&m).await.unwrap();
    let ack = peer.expect(Command::Ack).await;
    assert_eq!(ack.header("id"), Some("ack-m1"));
    peer.receipt(&subscribe).await;
    wait_until("restored", || client.reconnects() == 1).await;
}

/// A SUBSCRIBE the broker refuses (ERROR naming its receipt) fails `subscribe` with the
/// broker's message and is not made again on the next connection.
#[tokio::test]
async fn a_refused_subscribe_fails_and_is_not_restored() {
    let server = FakeServer::bind().await;
    let (client, mut peer) = connect(&server, &uri(&[&server], ""), &[]).await;
    let sub_task = {
        let c = client.clone();
        tokio::spawn(async move {
            c.subscribe("/queue/a", AckMode::Auto, &[("selector", "bad ((")])
                .await
        })
    };
    let f = peer.expect(Command::Subscribe).await;
    peer.send(
        Frame::new(Command::Error)
            .with_header("message", "bad selector")
            .with_header("receipt-id", f.header("receipt").unwrap()),
    )
    .await;
    drop(peer);
    match sub_task.await.unwrap() {
        Err(ClientError::Server { message, .. }) => assert_eq!(message, "bad selector"),
        other => panic!("expected the broker's refusal, got {other:?}"),
    }
    let mut peer = server.accept().await;
    handshake(&mut peer, &[]).await;
    client.send("/queue/a", &[], "x").await.unwrap();
    let next = peer.expect(Command::Send).await;
    assert_eq!(&next.body[..], b"x", "no SUBSCRIBE was restored before it");
}
