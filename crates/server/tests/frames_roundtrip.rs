//! What a producer sends is what a consumer gets: bodies byte for byte, escaped headers,
//! user headers; MESSAGE frames carry the broker's headers; every frame that asks for a
//! RECEIPT gets one.

mod common;

use common::{frame, Broker, Client, Read};
use haven_stomp::{Command, Frame};

#[tokio::test(flavor = "multi_thread")]
async fn binary_body_with_nuls_arrives_byte_identical() {
    let broker = Broker::start().await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/bin", &[]).await;
    let body: Vec<u8> = (0..4096u32).map(|i| (i % 256) as u8).collect();
    assert!(body.contains(&0));
    // Raw bytes, so the test controls content-length exactly.
    let mut wire = format!(
        "SEND\ndestination:/queue/bin\ncontent-length:{}\n\n",
        body.len()
    )
    .into_bytes();
    wire.extend_from_slice(&body);
    wire.push(0);
    c.write_raw(&wire).await;
    let m = c.message().await;
    assert_eq!(m.body.len(), body.len());
    assert!(m.body[..] == body[..], "body changed in transit");
    assert_eq!(
        m.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn escaped_header_values_round_trip_in_1_1_and_1_2() {
    let broker = Broker::start().await;
    let tricky = "a:b\nc\\d";
    for version in ["1.1", "1.2"] {
        let mut c = Client::connect(broker.addr(), &[("accept-version", version)]).await;
        let dest = format!("/queue/esc-{version}");
        c.subscribe("1", &dest, &[]).await;
        // On the wire: tricky:a\cb\nc\\d
        let mut wire = format!("SEND\ndestination:{dest}\n").into_bytes();
        wire.extend_from_slice(b"tricky:a\\cb\\nc\\\\d\n\nx\0");
        c.write_raw(&wire).await;
        let m = c.message().await;
        assert_eq!(m.header("tricky"), Some(tricky), "STOMP {version}: {m:?}");
        c.disconnect().await;
    }
    // A 1.2 producer and a 1.1 consumer agree too (the broker re-escapes per connection).
    let mut consumer = Client::connect(broker.addr(), &[("accept-version", "1.1")]).await;
    consumer.subscribe("1", "/queue/esc-mixed", &[]).await;
    let mut producer = broker.client().await;
    producer
        .put("/queue/esc-mixed", "x", &[("tricky", tricky)])
        .await;
    let m = consumer.message().await;
    assert_eq!(m.header("tricky"), Some(tricky), "{m:?}");
    producer.disconnect().await;
    consumer.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_of_repeated_headers_wins() {
    let broker = Broker::start().await;
    let mut c = broker.client().await;
    c.subscribe("a", "/queue/rep-a", &[]).await;
    c.subscribe("b", "/queue/rep-b", &[]).await;
    c.write_raw(
        b"SEND\ndestination:/queue/rep-a\ndestination:/queue/rep-b\ncolour:red\ncolour:blue\nreceipt:r\n\nx\0",
    )
    .await;
    c.receipt("r").await;
    let m = c.message().await;
    assert_eq!(m.header("destination"), Some("/queue/rep-a"), "{m:?}");
    assert_eq!(m.header("subscription"), Some("a"));
    assert_eq!(m.header("colour"), Some("red"), "{m:?}");
    // And nothing went to the second destination.
    c.put("/queue/rep-b", "marker", &[]).await;
    let m = c.message().await;
    assert_eq!(&m.body[..], b"marker");
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn message_carries_broker_headers_and_the_senders_own() {
    let broker = Broker::start().await;
    let mut c = broker.client().await;
    c.subscribe("sub-7", "/queue/hdrs", &[("ack", "client-individual")])
        .await;
    let expires = "4102444800000"; // 2100-01-01
    c.put(
        "/queue/hdrs",
        "hello",
        &[
            ("priority", "7"),
            ("expires", expires),
            ("persistent", "true"),
            ("correlation-id", "corr-1"),
            ("reply-to", "/queue/replies"),
            ("content-type", "text/plain"),
            ("x-app", "value with spaces"),
        ],
    )
    .await;
    let m = c.message().await;
    let h = |name: &str| {
        m.header(name)
            .unwrap_or_else(|| panic!("MESSAGE lacks {name}: {m:?}"))
    };
    assert!(!h("message-id").is_empty());
    assert_eq!(h("destination"), "/queue/hdrs");
    assert_eq!(h("subscription"), "sub-7");
    assert!(!h("ack").is_empty());
    assert!(h("timestamp").parse::<u64>().is_ok_and(|t| t > 0), "{m:?}");
    assert_eq!(h("redelivered"), "false");
    assert_eq!(h("priority"), "7");
    assert_eq!(h("expires"), expires);
    assert_eq!(h("persistent"), "true");
    assert_eq!(h("correlation-id"), "corr-1");
    assert_eq!(h("reply-to"), "/queue/replies");
    assert_eq!(h("content-type"), "text/plain");
    assert_eq!(h("x-app"), "value with spaces");
    assert_eq!(&m.body[..], b"hello");
    // The SEND's own receipt header is the broker's business, not the consumer's.
    assert_eq!(m.header("receipt"), None, "{m:?}");
    let ack = h("ack").to_string();
    c.send_receipted(frame(Command::Ack, &[("id", &ack)], ""), "acked")
        .await;
    c.disconnect().await;

    // STOMP 1.0 and 1.1 consumers get no `ack` header and ACK by message-id.
    for version in ["1.0", "1.1"] {
        let mut c = Client::connect(broker.addr(), &[("accept-version", version)]).await;
        c.subscribe("s", "/queue/hdrs-old", &[("ack", "client")])
            .await;
        c.put("/queue/hdrs-old", version, &[]).await;
        let m = c.message().await;
        assert_eq!(m.header("ack"), None, "STOMP {version}: {m:?}");
        let id = m.header("message-id").expect("message-id").to_string();
        let ack = frame(
            Command::Ack,
            &[("message-id", &id), ("subscription", "s")],
            "",
        );
        c.send_receipted(ack, "acked").await;
        c.disconnect().await;
    }
    broker.stop().await;
}

/// Reads frames until a RECEIPT for `id`, returning the MESSAGEs seen first.
async fn messages_then_receipt(c: &mut Client, id: &str) -> Vec<Frame> {
    let mut messages = Vec::new();
    loop {
        let f = c.frame().await;
        match f.command {
            Command::Message => messages.push(f),
            Command::Receipt => {
                assert_eq!(f.header("receipt-id"), Some(id), "{f:?}");
                return messages;
            }
            _ => panic!("waiting for RECEIPT {id}: {f:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_frame_that_asks_gets_a_receipt() {
    let broker = Broker::start().await;
    let mut c = broker.client().await;
    let r = |name: &str| ("receipt", name.to_string());
    let send = |f: Frame, (k, v): (&str, String)| f.with_header(k, v);

    c.send(&send(
        frame(
            Command::Subscribe,
            &[
                ("id", "1"),
                ("destination", "/queue/rcpt"),
                ("ack", "client-individual"),
            ],
            "",
        ),
        r("subscribe"),
    ))
    .await;
    assert!(messages_then_receipt(&mut c, "subscribe").await.is_empty());

    c.send(&send(
        frame(Command::Send, &[("destination", "/queue/rcpt")], "one"),
        r("send"),
    ))
    .await;
    let mut got = messages_then_receipt(&mut c, "send").await;
    if got.is_empty() {
        got.push(c.message().await);
    }
    let ack = got[0].header("ack").expect("ack").to_string();

    c.send(&send(frame(Command::Nack, &[("id", &ack)], ""), r("nack")))
        .await;
    let mut got = messages_then_receipt(&mut c, "nack").await;
    if got.is_empty() {
        got.push(c.message().await);
    }
    assert_eq!(got[0].header("redelivered"), Some("true"));
    let ack = got[0].header("ack").expect("ack").to_string();

    c.send(&send(frame(Command::Ack, &[("id", &ack)], ""), r("ack")))
        .await;
    assert!(messages_then_receipt(&mut c, "ack").await.is_empty());

    for (cmd, tx, receipt) in [
        (Command::Begin, "t1", "begin"),
        (Command::Commit, "t1", "commit"),
        (Command::Begin, "t2", "begin-2"),
        (Command::Abort, "t2", "abort"),
    ] {
        c.send(&send(frame(cmd, &[("transaction", tx)], ""), r(receipt)))
            .await;
        assert!(messages_then_receipt(&mut c, receipt).await.is_empty());
    }

    c.send(&send(
        frame(Command::Unsubscribe, &[("id", "1")], ""),
        r("unsubscribe"),
    ))
    .await;
    assert!(messages_then_receipt(&mut c, "unsubscribe")
        .await
        .is_empty());

    // DISCONNECT: the RECEIPT, then the broker closes the connection.
    c.send(&send(frame(Command::Disconnect, &[], ""), r("disconnect")))
        .await;
    assert!(messages_then_receipt(&mut c, "disconnect").await.is_empty());
    c.closed().await;
    broker.stop().await;
}

/// STOMP 1.0 cannot carry a newline or a colon in a header name and 1.1 cannot carry a
/// value ending in CR. A message sent by a 1.2 producer with such a header must still reach
/// a 1.0/1.1 consumer (the header adapted or dropped), not silently kill its connection.
///
/// Fails today for 1.1: `connection.rs` sanitises headers only for 1.0 (`render_message`),
/// so encoding the MESSAGE fails and the connection closes without an ERROR.
#[tokio::test(flavor = "multi_thread")]
async fn a_header_an_older_consumer_cannot_carry_does_not_cut_it_off() {
    let broker = Broker::start().await;
    for (version, name, value) in [
        ("1.0", "note", "two\nlines"),
        ("1.0", "a:b", "colon in the name"),
        ("1.1", "note", "ends in CR\r"),
    ] {
        let dest = format!("/queue/old-consumer-{version}-{}", name.len());
        let mut consumer = Client::connect(broker.addr(), &[("accept-version", version)]).await;
        // ack:auto, the default: a consumer cut off here would also lose the message, as
        // the broker counts an auto-ack delivery as written even when encoding it failed.
        consumer.subscribe("1", &dest, &[]).await;
        let mut producer = broker.client().await;
        producer.put(&dest, "payload", &[(name, value)]).await;
        let m = consumer.message().await;
        assert_eq!(&m.body[..], b"payload", "STOMP {version}");
        // The connection is still usable.
        consumer.put(&dest, "second", &[]).await;
        assert_eq!(consumer.message_body().await, "second");
        producer.disconnect().await;
        consumer.disconnect().await;
    }
    broker.stop().await;
}

/// Whatever happens to a consumer that cannot be sent a MESSAGE, the message is not lost: it
/// reaches that consumer or, after it is gone, the next one.
///
/// Fails today: an auto-ack delivery is counted as written (`Command::Credit`) before its
/// encoding is attempted, so when encoding fails the engine consumes a message that never
/// left the broker.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_that_cannot_be_written_to_an_auto_ack_consumer_is_not_lost() {
    let broker = Broker::start().await;
    let mut old = Client::connect(broker.addr(), &[("accept-version", "1.1")]).await;
    old.subscribe("1", "/queue/unwritable", &[]).await;
    let mut producer = broker.client().await;
    producer
        .put("/queue/unwritable", "precious", &[("note", "ends in CR\r")])
        .await;
    let delivered_to_old = match old.read().await {
        Read::Frame(f) => f.command == Command::Message && &f.body[..] == b"precious",
        Read::Heartbeat | Read::Closed(_) => false,
    };
    if !delivered_to_old {
        let mut next = broker.client().await;
        next.subscribe("1", "/queue/unwritable", &[]).await;
        next.put("/queue/unwritable", "marker", &[]).await;
        assert_eq!(
            next.message_body().await,
            "precious",
            "a receipted persistent message was lost"
        );
        next.disconnect().await;
    }
    producer.disconnect().await;
    broker.stop().await;
}
