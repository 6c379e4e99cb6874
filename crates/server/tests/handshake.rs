//! CONNECT/STOMP: version negotiation, logins, the CONNECTED frame, the connect timeout and
//! client-id uniqueness.

mod common;

use common::{Broker, Client, Read};
use haven_server::config::User;
use haven_stomp::Command;

#[tokio::test(flavor = "multi_thread")]
async fn the_highest_common_version_is_chosen() {
    let broker = Broker::start().await;
    let table: &[(Option<&str>, &str)] = &[
        (Some("1.0"), "1.0"),
        (Some("1.1"), "1.1"),
        (Some("1.2"), "1.2"),
        (Some("1.1,1.2"), "1.2"),
        (Some("1.0,1.1"), "1.1"),
        (Some("2.0,1.1"), "1.1"),
        (None, "1.0"),
    ];
    for (accept, expected) in table {
        let mut c = Client::open(broker.addr()).await;
        let headers: Vec<(&str, &str)> = accept.iter().map(|v| ("accept-version", *v)).collect();
        let reply = c.handshake(Command::Connect, &headers).await;
        assert_eq!(reply.command, Command::Connected, "{accept:?}: {reply:?}");
        assert_eq!(reply.header("version"), Some(*expected), "{accept:?}");
        assert!(
            reply
                .header("server")
                .is_some_and(|s| s.starts_with("Haven/")),
            "{reply:?}"
        );
        assert!(reply.header("session").is_some(), "{reply:?}");
        // The negotiated session works.
        c.subscribe("1", "/queue/hs", &[]).await;
        c.put("/queue/hs", expected, &[]).await;
        assert_eq!(c.message_body().await, *expected);
        c.disconnect().await;
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_common_version_gets_an_error_and_close() {
    let broker = Broker::start().await;
    let mut c = Client::open(broker.addr()).await;
    c.write_raw(b"CONNECT\naccept-version:2.0\n\n\0").await;
    let e = c.error_then_close("version").await;
    let text = e.header("message").unwrap_or_default();
    assert!(
        text.contains("1.2"),
        "the ERROR lists what is supported: {text}"
    );
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stomp_command_is_accepted_like_connect() {
    let broker = Broker::start().await;
    let mut c = Client::open(broker.addr()).await;
    let reply = c
        .handshake(
            Command::Stomp,
            &[("accept-version", "1.2"), ("host", "localhost")],
        )
        .await;
    assert_eq!(reply.command, Command::Connected, "{reply:?}");
    assert_eq!(reply.header("version"), Some("1.2"));
    c.put("/queue/stomp-cmd", "hello", &[]).await;
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn configured_users_must_log_in_with_the_right_passcode() {
    let broker = Broker::start_with(|c| {
        c.users = vec![User {
            login: "alice".into(),
            passcode: "s3cret".into(),
        }];
    })
    .await;
    let refused: &[&[(&str, &str)]] = &[
        &[("login", "alice"), ("passcode", "wrong")],
        &[("login", "mallory"), ("passcode", "s3cret")],
        &[("login", "alice")],
        &[],
    ];
    for creds in refused {
        let mut c = Client::open(broker.addr()).await;
        let mut headers = vec![("accept-version", "1.2")];
        headers.extend_from_slice(creds);
        c.send(&common::frame(Command::Connect, &headers, "")).await;
        c.error_then_close("login failed").await;
    }
    let c = Client::connect(
        broker.addr(),
        &[
            ("accept-version", "1.2"),
            ("login", "alice"),
            ("passcode", "s3cret"),
        ],
    )
    .await;
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn without_users_any_login_is_accepted() {
    let broker = Broker::start().await;
    for creds in [
        vec![("login", "anyone"), ("passcode", "anything")],
        vec![("login", "guest")],
        vec![],
    ] {
        let mut headers = vec![("accept-version", "1.2")];
        headers.extend(creds);
        Client::connect(broker.addr(), &headers)
            .await
            .disconnect()
            .await;
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connected_offers_the_configured_heart_beats() {
    let broker = Broker::start_with(|c| {
        c.stomp.heartbeat_send_ms = 7_000;
        c.stomp.heartbeat_receive_ms = 9_000;
    })
    .await;
    let mut c = Client::open(broker.addr()).await;
    let reply = c
        .handshake(
            Command::Connect,
            &[("accept-version", "1.2"), ("heart-beat", "0,0")],
        )
        .await;
    assert_eq!(reply.header("heart-beat"), Some("7000,9000"), "{reply:?}");
    c.disconnect().await;
    // STOMP 1.0 has no heart-beats: the header is not offered.
    let mut c = Client::open(broker.addr()).await;
    let reply = c.handshake(Command::Connect, &[]).await;
    assert_eq!(reply.header("version"), Some("1.0"));
    assert_eq!(reply.header("heart-beat"), None, "{reply:?}");
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_heart_beat_header_gets_an_error() {
    let broker = Broker::start().await;
    let mut c = Client::open(broker.addr()).await;
    c.write_raw(b"CONNECT\naccept-version:1.2\nheart-beat:soon\n\n\0")
        .await;
    c.error_then_close("heart-beat").await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_never_sends_connect_is_closed() {
    let broker = Broker::start_with(|c| c.stomp.connect_timeout_ms = 200).await;
    let mut c = Client::open(broker.addr()).await;
    c.error_then_close("CONNECT").await;
    // Heart-beat EOLs alone do not count as connecting.
    let mut c = Client::open(broker.addr()).await;
    c.write_raw(b"\n\n").await;
    c.error_then_close("CONNECT").await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn first_frame_must_be_connect() {
    let broker = Broker::start().await;
    let mut c = Client::open(broker.addr()).await;
    c.write_raw(b"SEND\ndestination:/queue/a\n\nsneaky\0").await;
    c.error_then_close("CONNECT").await;
    // Garbage before CONNECT is a decode error, answered the same way.
    let mut c = Client::open(broker.addr()).await;
    c.write_raw(b"HELLO\n\n\0").await;
    c.error_then_close("unknown command").await;
    // And the message was not accepted.
    let mut c = broker.client().await;
    c.put("/queue/a", "marker", &[]).await;
    c.subscribe("1", "/queue/a", &[]).await;
    assert_eq!(c.message_body().await, "marker");
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_id_can_be_connected_only_once() {
    let broker = Broker::start().await;
    let headers = [("accept-version", "1.2"), ("client-id", "app-1")];
    let mut first = Client::connect(broker.addr(), &headers).await;
    let mut second = Client::open(broker.addr()).await;
    second
        .send(&common::frame(Command::Connect, &headers, ""))
        .await;
    second.error_then_close("app-1").await;
    // The first connection is unaffected.
    first.subscribe("1", "/queue/cid", &[]).await;
    first.put("/queue/cid", "still here", &[]).await;
    assert_eq!(first.message_body().await, "still here");
    first.disconnect().await;
    // Once it is gone, the id is free again.
    Client::connect(broker.addr(), &headers)
        .await
        .disconnect()
        .await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_limit_are_refused_with_an_error() {
    let broker = Broker::start_with(|c| c.stomp.connections_max = 1).await;
    let first = broker.client().await;
    let mut second = Client::open(broker.addr()).await;
    second.error_then_close("too many connections").await;
    first.disconnect().await;
    // The slot is free again once the first has gone (its task ends shortly after close).
    let deadline = tokio::time::Instant::now() + common::WAIT;
    loop {
        let mut c = Client::open(broker.addr()).await;
        // A refused connection may already be closed: the write is allowed to fail.
        c.write_raw_lenient(b"CONNECT\naccept-version:1.2\n\n\0")
            .await;
        match c.read().await {
            Read::Frame(f) if f.command == Command::Connected => break,
            Read::Frame(f) => assert_eq!(f.command, Command::Error, "{f:?}"),
            Read::Heartbeat | Read::Closed(_) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the freed slot was never reused"
        );
        tokio::task::yield_now().await;
    }
    broker.stop().await;
}

/// `haven-store` names the data directory's store: the same across restarts, different for
/// another directory (failover clients key their duplicate filter by it).
#[tokio::test(flavor = "multi_thread")]
async fn connected_names_the_store_and_it_survives_a_restart() {
    let mut a = common::Broker::start().await;
    let b = common::Broker::start().await;
    async fn store(addr: std::net::SocketAddr) -> Option<String> {
        let conn = haven_client::Connection::connect(
            &addr.to_string(),
            haven_client::ConnectOptions::default(),
        )
        .await
        .expect("connects");
        let id = conn.connected_header("haven-store").map(str::to_string);
        conn.disconnect().await.expect("disconnects");
        id
    }
    let before = store(a.addr()).await.expect("haven-store");
    assert_eq!(before.len(), 32);
    a.restart().await;
    let after = store(a.addr()).await;
    assert_eq!(after.as_deref(), Some(before.as_str()));
    let other = store(b.addr()).await;
    assert_ne!(other.as_deref(), Some(before.as_str()));
    a.stop().await;
    b.stop().await;
}
