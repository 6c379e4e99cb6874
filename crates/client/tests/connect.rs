//! CONNECT/CONNECTED: what the client asks for and how it treats the broker's answer.

mod support;

use std::time::Duration;

use haven_client::{ClientError, Command, ConnectOptions, Connection, Frame, Version};
use support::FakeServer;

#[tokio::test]
async fn connect_sends_options_and_adopts_the_brokers_version() {
    let server = FakeServer::bind().await;
    let addr = format!("tcp://{}", server.addr);
    let client = tokio::spawn(async move {
        let opts = ConnectOptions {
            login: Some("alice".into()),
            passcode: Some("secret".into()),
            client_id: Some("app-1".into()),
            headers: vec![("x-extra".into(), "yes".into())],
            ..ConnectOptions::default()
        };
        Connection::connect(&addr, opts).await
    });
    let mut peer = server.accept().await;
    let connect = peer.handshake("1.1", "0,0").await;
    assert_eq!(connect.header("accept-version"), Some("1.2,1.1,1.0"));
    assert_eq!(connect.header("host"), Some("127.0.0.1"));
    assert_eq!(connect.header("login"), Some("alice"));
    assert_eq!(connect.header("passcode"), Some("secret"));
    assert_eq!(connect.header("client-id"), Some("app-1"));
    assert_eq!(connect.header("heart-beat"), Some("0,0"));
    assert_eq!(connect.header("x-extra"), Some("yes"));

    let conn = client.await.unwrap().expect("connected");
    assert_eq!(conn.version(), Version::V1_1);
    assert_eq!(conn.connected_header("session"), Some("fake-session-1"));
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn error_answer_to_connect_is_refused_with_the_brokers_message() {
    let server = FakeServer::bind().await;
    let addr = server.addr.clone();
    let client =
        tokio::spawn(async move { Connection::connect(&addr, ConnectOptions::default()).await });
    let mut peer = server.accept().await;
    peer.expect(Command::Connect).await;
    peer.send(
        Frame::new(Command::Error)
            .with_header("message", "bad login")
            .with_body("user alice: wrong passcode"),
    )
    .await;
    match client.await.unwrap() {
        Err(ClientError::Refused { message }) => assert_eq!(message, "bad login"),
        other => panic!("expected Refused, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn silent_broker_during_connect_times_out() {
    let server = FakeServer::bind().await;
    let addr = server.addr.clone();
    let client = tokio::spawn(async move {
        let opts = ConnectOptions {
            connect_timeout_ms: 300,
            ..ConnectOptions::default()
        };
        Connection::connect(&addr, opts).await
    });
    let mut peer = server.accept().await;
    peer.expect(Command::Connect).await;
    match client.await.unwrap() {
        Err(ClientError::Timeout { ms: 300, .. }) => {}
        other => panic!("expected Timeout, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn broker_closing_during_connect_is_an_error_not_a_hang() {
    let server = FakeServer::bind().await;
    let addr = server.addr.clone();
    let client =
        tokio::spawn(async move { Connection::connect(&addr, ConnectOptions::default()).await });
    let mut peer = server.accept().await;
    peer.expect(Command::Connect).await;
    drop(peer);
    let r = tokio::time::timeout(Duration::from_secs(5), client)
        .await
        .expect("no hang");
    assert!(r.unwrap().is_err());
}

#[tokio::test]
async fn failover_uri_is_rejected_until_the_failover_transport_exists() {
    let r = Connection::connect("failover:(tcp://127.0.0.1:1)", ConnectOptions::default()).await;
    assert!(matches!(r, Err(ClientError::BadAddress { .. })));
}
