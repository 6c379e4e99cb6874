//! Exactly-once sends over the wire: `haven-producer` + `haven-seq` on SEND (and COMMIT), the
//! producer's mark in CONNECTED, across a restart; bad headers get an ERROR.

mod common;

use bytes::Bytes;
use common::{frame, Broker, Client};
use haven_stomp::Command;
use std::time::Duration;

/// Collects the bodies of everything delivered to `c` until nothing arrives for a while.
async fn drain(c: &mut Client) -> Vec<String> {
    let mut got = Vec::new();
    while let Some(common::Read::Frame(f)) = c.read_within(Duration::from_millis(300)).await {
        assert_eq!(f.command, Command::Message, "{f:?}");
        got.push(String::from_utf8(f.body.to_vec()).expect("text"));
    }
    got
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resent_seq_is_receipted_and_stored_once_also_after_a_restart() {
    let mut broker = Broker::start().await;
    let mut p = broker.client().await;
    let seq = |s: &'static str| [("haven-producer", "orders-1"), ("haven-seq", s)];
    p.put("/queue/eo", "one", &seq("1")).await;
    // The resend (lost RECEIPT, say) is answered and not stored again.
    p.put("/queue/eo", "one", &seq("1")).await;
    // A gap is fine: the client gave up on 2..4.
    p.put("/queue/eo", "five", &seq("5")).await;
    p.put("/queue/eo", "three", &seq("3")).await; // below the mark: a duplicate
    p.disconnect().await;

    broker.restart().await;
    let mut p = broker.client().await;
    p.put("/queue/eo", "five", &seq("5")).await; // still a duplicate after the restart
    p.put("/queue/eo", "six", &seq("6")).await;
    p.disconnect().await;

    let mut c = broker.client().await;
    c.subscribe("1", "/queue/eo", &[]).await;
    let got = drain(&mut c).await;
    assert_eq!(got, ["one", "five", "six"]);
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_headers_stay_on_the_delivered_message() {
    let broker = Broker::start().await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/eo-h", &[]).await;
    c.put(
        "/queue/eo-h",
        "x",
        &[("haven-producer", "p"), ("haven-seq", "7")],
    )
    .await;
    let m = c.message().await;
    assert_eq!(m.header("haven-producer"), Some("p"));
    assert_eq!(m.header("haven-seq"), Some("7"));
    c.disconnect().await;
    broker.stop().await;
}

/// `haven-net-origin` (what a bridge sends) makes a SEND idempotent like a producer sequence,
/// but it only steers the SEND: the broker keeps it as the message's mark, not as a header, so
/// consumers do not get it (and a forwarded message does not carry it twice).
#[tokio::test(flavor = "multi_thread")]
async fn an_origin_dedupes_and_is_not_passed_to_consumers() {
    let mut broker = Broker::start().await;
    let mut p = broker.client().await;
    let origin = [
        ("haven-net-origin", "store-a/ID:haven-1-7"),
        ("kept", "yes"),
    ];
    p.put("/queue/eo-o", "one", &origin).await;
    p.put("/queue/eo-o", "one", &origin).await; // a bridge's resend
    p.disconnect().await;
    broker.restart().await;
    let mut p = broker.client().await;
    p.put("/queue/eo-o", "one", &origin).await; // still known after a restart
    p.disconnect().await;

    let mut c = broker.client().await;
    c.subscribe("1", "/queue/eo-o", &[]).await;
    let m = c.message().await;
    assert_eq!(m.header("kept"), Some("yes"));
    assert_eq!(m.header("haven-net-origin"), None, "{m:?}");
    assert!(
        drain(&mut c).await.is_empty(),
        "the resends were stored again"
    );
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connected_reports_the_producers_mark_across_a_restart() {
    let mut broker = Broker::start().await;
    let hello = [("accept-version", "1.2"), ("haven-producer", "billing")];
    let mut p = Client::open(broker.addr()).await;
    let connected = p.handshake(Command::Connect, &hello).await;
    assert_eq!(connected.header("haven-seq"), Some("0"), "{connected:?}");
    p.put(
        "/queue/eo-c",
        "a",
        &[("haven-producer", "billing"), ("haven-seq", "41")],
    )
    .await;
    p.disconnect().await;
    broker.restart().await;

    let mut p = Client::open(broker.addr()).await;
    let connected = p.handshake(Command::Connect, &hello).await;
    assert_eq!(connected.header("haven-seq"), Some("41"), "{connected:?}");
    // Without the CONNECT header there is no haven-seq.
    let plain = broker.client().await;
    plain.disconnect().await;
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_older_session_of_a_producer_is_fenced() {
    let broker = Broker::start().await;
    let hello = [("accept-version", "1.2"), ("haven-producer", "ingest")];
    let mut old = Client::connect(broker.addr(), &hello).await;
    old.put(
        "/queue/eo-f",
        "a",
        &[("haven-producer", "ingest"), ("haven-seq", "1")],
    )
    .await;
    let mut new = Client::connect(broker.addr(), &hello).await;
    new.put(
        "/queue/eo-f",
        "b",
        &[("haven-producer", "ingest"), ("haven-seq", "2")],
    )
    .await;
    let f = frame(
        Command::Send,
        &[
            ("destination", "/queue/eo-f"),
            ("haven-producer", "ingest"),
            ("haven-seq", "3"),
        ],
        "late",
    );
    old.send(&f).await;
    let error = old.error_then_close("taken over").await;
    assert!(
        error
            .header("message")
            .unwrap_or_default()
            .contains("ingest"),
        "{error:?}"
    );
    new.subscribe("1", "/queue/eo-f", &[]).await;
    assert_eq!(drain(&mut new).await, ["a", "b"]);
    new.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resent_commit_discards_its_transaction() {
    let broker = Broker::start().await;
    let mut p = broker.client().await;
    for round in 0..2 {
        let begin = frame(Command::Begin, &[("transaction", "t")], Bytes::new());
        p.send_receipted(begin, &format!("b{round}")).await;
        let send = frame(
            Command::Send,
            &[("destination", "/queue/eo-t"), ("transaction", "t")],
            "in-tx",
        );
        p.send(&send).await;
        let commit = frame(
            Command::Commit,
            &[
                ("transaction", "t"),
                ("haven-producer", "batcher"),
                ("haven-seq", "1"),
            ],
            Bytes::new(),
        );
        p.send_receipted(commit, &format!("c{round}")).await;
    }
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/eo-t", &[]).await;
    assert_eq!(drain(&mut c).await, ["in-tx"]);
    c.disconnect().await;
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_producer_headers_get_an_error() {
    let broker = Broker::start().await;
    let long = "x".repeat(129);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![("haven-producer", "p")], "both or neither"),
        (vec![("haven-seq", "1")], "both or neither"),
        (
            vec![("haven-producer", ""), ("haven-seq", "1")],
            "haven-producer",
        ),
        (
            vec![("haven-producer", &long), ("haven-seq", "1")],
            "haven-producer",
        ),
        (
            vec![("haven-producer", "p"), ("haven-seq", "0")],
            "haven-seq",
        ),
        (
            vec![("haven-producer", "p"), ("haven-seq", "-3")],
            "haven-seq",
        ),
        (
            vec![("haven-producer", "p"), ("haven-seq", "x")],
            "haven-seq",
        ),
    ];
    for (headers, needle) in cases {
        let mut c = broker.client().await;
        let mut f = frame(Command::Send, &[("destination", "/queue/eo-bad")], "b");
        for (k, v) in &headers {
            f.push_header(*k, *v);
        }
        c.send(&f).await;
        c.error_then_close(needle).await;
    }
    // On CONNECT, a bad id is refused too.
    let mut c = Client::open(broker.addr()).await;
    let reply = c
        .handshake(
            Command::Connect,
            &[("accept-version", "1.2"), ("haven-producer", &long)],
        )
        .await;
    assert_eq!(reply.command, Command::Error, "{reply:?}");
    // Nothing was stored.
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/eo-bad", &[]).await;
    assert!(drain(&mut c).await.is_empty());
    c.disconnect().await;
    broker.stop().await;
}
