//! Every malformed or illegal frame gets an ERROR whose `message` says what was wrong, then
//! the connection closes; the broker, other connections and stored messages are untouched.

mod common;

use common::{frame, Broker, Client};
use haven_stomp::Command;
use std::net::SocketAddr;

/// Small limits so the size cases are cheap to provoke.
const FRAME_BYTES_MAX: usize = 4096;
const HEADER_COUNT_MAX: usize = 16;
const HEADER_BYTES_MAX: usize = 256;

/// What to do on a fresh, connected (STOMP 1.2) connection to provoke the error.
enum Provoke {
    /// Write these bytes.
    Bytes(Vec<u8>),
    /// Write these bytes, then half-close (the broker reads EOF).
    BytesThenEof(Vec<u8>),
}

struct Case {
    name: &'static str,
    provoke: Provoke,
    /// Substring the ERROR's `message` must contain (case-insensitive).
    says: &'static str,
    /// `receipt-id` the ERROR must carry, when the bad frame asked for a receipt.
    receipt: Option<&'static str>,
}

fn cases() -> Vec<Case> {
    use Provoke::*;
    let many_headers: String = (0..HEADER_COUNT_MAX + 4)
        .map(|i| format!("h{i}:v\n"))
        .collect();
    let long_value = "x".repeat(HEADER_BYTES_MAX * 2);
    let big_body = "b".repeat(FRAME_BYTES_MAX * 16);
    vec![
        Case {
            name: "unknown command",
            provoke: Bytes(b"FROB\ndestination:/queue/a\n\n\0".to_vec()),
            says: "unknown command",
            receipt: None,
        },
        Case {
            name: "server frame sent by a client",
            provoke: Bytes(b"MESSAGE\ndestination:/queue/a\n\n\0".to_vec()),
            says: "server frame",
            receipt: None,
        },
        Case {
            name: "bad escape in a 1.2 header",
            provoke: Bytes(b"SEND\ndestination:/queue/a\nodd:tab\\there\n\n\0".to_vec()),
            says: "escape",
            receipt: None,
        },
        Case {
            name: "header without colon",
            provoke: Bytes(b"SEND\ndestination:/queue/a\nno-colon-here\n\n\0".to_vec()),
            says: "without a colon",
            receipt: None,
        },
        Case {
            name: "missing NUL at EOF",
            provoke: BytesThenEof(b"SEND\ndestination:/queue/a\n\nunterminated".to_vec()),
            says: "NUL",
            receipt: None,
        },
        Case {
            name: "content-length beyond the body, then garbage",
            provoke: Bytes(
                b"SEND\ndestination:/queue/a\ncontent-length:10\n\nabc\0garbagegarbage".to_vec(),
            ),
            says: "content-length",
            receipt: None,
        },
        Case {
            name: "content-length not a number",
            provoke: Bytes(b"SEND\ndestination:/queue/a\ncontent-length:ten\n\nabc\0".to_vec()),
            says: "content-length",
            receipt: None,
        },
        Case {
            name: "content-length over frame_bytes_max",
            provoke: Bytes(
                format!(
                    "SEND\ndestination:/queue/a\ncontent-length:{}\n\n",
                    FRAME_BYTES_MAX * 2
                )
                .into_bytes(),
            ),
            says: "too large",
            receipt: None,
        },
        Case {
            name: "body over frame_bytes_max",
            provoke: Bytes(format!("SEND\ndestination:/queue/a\n\n{big_body}\0").into_bytes()),
            says: "too large",
            receipt: None,
        },
        Case {
            name: "too many headers",
            provoke: Bytes(
                format!("SEND\ndestination:/queue/a\n{many_headers}\nbody\0").into_bytes(),
            ),
            says: "too many headers",
            receipt: None,
        },
        Case {
            name: "header too long",
            provoke: Bytes(
                format!("SEND\ndestination:/queue/a\nlong:{long_value}\n\nbody\0").into_bytes(),
            ),
            says: "too long",
            receipt: None,
        },
        Case {
            name: "invalid UTF-8 in a header",
            provoke: Bytes(b"SEND\ndestination:/queue/a\nbad:\xff\xfe\n\nbody\0".to_vec()),
            says: "UTF-8",
            receipt: None,
        },
        Case {
            name: "SEND to an invalid destination",
            provoke: Bytes(b"SEND\ndestination:/bogus/x\nreceipt:r-bogus\n\nbody\0".to_vec()),
            says: "/bogus/x",
            receipt: Some("r-bogus"),
        },
        Case {
            name: "SEND without destination",
            provoke: Bytes(b"SEND\nreceipt:r-nodest\n\nbody\0".to_vec()),
            says: "destination",
            receipt: Some("r-nodest"),
        },
        Case {
            name: "ACK of an unknown id",
            provoke: Bytes(b"ACK\nid:424242\nreceipt:r-ack\n\n\0".to_vec()),
            says: "not awaiting acknowledgement",
            receipt: Some("r-ack"),
        },
        Case {
            name: "a second CONNECT",
            provoke: Bytes(b"CONNECT\naccept-version:1.2\n\n\0".to_vec()),
            says: "already connected",
            receipt: None,
        },
        Case {
            name: "SUBSCRIBE without id in 1.2",
            provoke: Bytes(b"SUBSCRIBE\ndestination:/queue/a\n\n\0".to_vec()),
            says: "'id'",
            receipt: None,
        },
        Case {
            name: "bad ack mode",
            provoke: Bytes(b"SUBSCRIBE\nid:1\ndestination:/queue/a\nack:sometimes\n\n\0".to_vec()),
            says: "sometimes",
            receipt: None,
        },
        Case {
            name: "bad priority",
            provoke: Bytes(b"SEND\ndestination:/queue/a\npriority:high\n\nbody\0".to_vec()),
            says: "priority",
            receipt: None,
        },
        Case {
            name: "priority out of range",
            provoke: Bytes(b"SEND\ndestination:/queue/a\npriority:10\n\nbody\0".to_vec()),
            says: "priority",
            receipt: None,
        },
        Case {
            name: "bad persistent value",
            provoke: Bytes(b"SEND\ndestination:/queue/a\npersistent:maybe\n\nbody\0".to_vec()),
            says: "persistent",
            receipt: None,
        },
        Case {
            name: "bad expires value",
            provoke: Bytes(b"SEND\ndestination:/queue/a\nexpires:tomorrow\n\nbody\0".to_vec()),
            says: "expires",
            receipt: None,
        },
        Case {
            name: "UNSUBSCRIBE of an unknown id",
            provoke: Bytes(b"UNSUBSCRIBE\nid:never\n\n\0".to_vec()),
            says: "never",
            receipt: None,
        },
        Case {
            name: "subscription id used twice",
            provoke: Bytes(
                b"SUBSCRIBE\nid:1\ndestination:/queue/a\n\n\0SUBSCRIBE\nid:1\ndestination:/queue/b\n\n\0"
                    .to_vec(),
            ),
            says: "already in use",
            receipt: None,
        },
        Case {
            name: "durable subscription without client-id",
            provoke: Bytes(
                b"SUBSCRIBE\nid:1\ndestination:/topic/t\nactivemq.subscriptionName:s\n\n\0"
                    .to_vec(),
            ),
            says: "client-id",
            receipt: None,
        },
        Case {
            name: "COMMIT of an unknown transaction",
            provoke: Bytes(b"COMMIT\ntransaction:nope\n\n\0".to_vec()),
            says: "nope",
            receipt: None,
        },
    ]
}

async fn provoke(addr: SocketAddr, case: Case) {
    let mut c = Client::connect(addr, &[("accept-version", "1.2")]).await;
    match &case.provoke {
        Provoke::Bytes(b) => c.write_raw_lenient(b).await,
        Provoke::BytesThenEof(b) => {
            c.write_raw(b).await;
            c.half_close().await;
        }
    }
    let error = c.error_then_close(case.says).await;
    assert_eq!(
        error.header("receipt-id"),
        case.receipt,
        "ERROR names the receipt of the frame that failed: {error:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bad_frame_gets_an_error_that_says_why_and_nothing_else_is_harmed() {
    let broker = Broker::start_with(|c| {
        c.stomp.frame_bytes_max = FRAME_BYTES_MAX;
        c.stomp.header_count_max = HEADER_COUNT_MAX;
        c.stomp.header_bytes_max = HEADER_BYTES_MAX;
    })
    .await;
    let addr = broker.addr();

    // A bystander connected before any bad frame, and a persistent message already stored.
    let mut bystander = broker.client().await;
    bystander.subscribe("b", "/queue/bystander", &[]).await;
    let mut producer = broker.client().await;
    producer
        .put("/queue/stored", "kept", &[("persistent", "true")])
        .await;

    let mut failures = Vec::new();
    for case in cases() {
        let name = case.name;
        // Each case in its own task so one failure does not hide the others.
        if let Err(e) = tokio::spawn(provoke(addr, case)).await {
            failures.push(format!("{name}: {}", panic_text(e)));
        }
        // The bystander still sends and receives after each bad connection.
        producer.put("/queue/bystander", name, &[]).await;
        assert_eq!(
            bystander.message_body().await,
            name,
            "bystander after {name}"
        );
    }

    // The message stored before all that is still delivered.
    let mut consumer = broker.client().await;
    consumer.subscribe("s", "/queue/stored", &[]).await;
    let m = consumer.message().await;
    assert_eq!(&m.body[..], b"kept");
    assert_eq!(m.header("redelivered"), Some("false"));

    consumer.disconnect().await;
    producer.disconnect().await;
    bystander.disconnect().await;
    broker.stop().await;
    assert!(
        failures.is_empty(),
        "bad frames not answered with ERROR + close:\n  {}",
        failures.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_frame_in_a_stomp_1_0_session_gets_an_error_too() {
    let broker = Broker::start().await;
    let mut c = Client::connect(broker.addr(), &[]).await;
    assert_eq!(c.version, haven_stomp::Version::V1_0);
    // 1.0 has no escaping, so a backslash is literal, but a header still needs its colon.
    c.write_raw(b"SEND\ndestination:/queue/a\nno colon\n\n\0")
        .await;
    c.error_then_close("without a colon").await;
    // 1.0 lets SUBSCRIBE omit the id, but not the destination.
    let mut c = Client::connect(broker.addr(), &[]).await;
    c.send(&frame(Command::Subscribe, &[("ack", "auto")], ""))
        .await;
    c.error_then_close("destination").await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn frames_behind_a_bad_frame_are_not_acted_on() {
    let broker = Broker::start().await;
    let mut c = broker.client().await;
    // One write: a bad SEND, then a good one that must not be accepted.
    c.write_raw(
        b"SEND\ndestination:/bogus/x\n\nbad\0SEND\ndestination:/queue/behind\nreceipt:r\n\nbehind\0",
    )
    .await;
    c.error_then_close("/bogus/x").await;
    // Same for a frame the engine refuses (an unknown ACK) rather than the connection.
    let mut c = broker.client().await;
    c.write_raw(b"ACK\nid:77\n\n\0SEND\ndestination:/queue/behind\nreceipt:r\n\nbehind-ack\0")
        .await;
    c.error_then_close("not awaiting acknowledgement").await;
    let mut check = broker.client().await;
    check.subscribe("1", "/queue/behind", &[]).await;
    check.put("/queue/behind", "marker", &[]).await;
    assert_eq!(check.message_body().await, "marker");
    check.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frame_of_exactly_frame_bytes_max_is_accepted_and_one_byte_more_is_not() {
    let broker = Broker::start_with(|c| c.stomp.frame_bytes_max = FRAME_BYTES_MAX).await;
    let head = "SEND\ndestination:/queue/limit\nreceipt:r\n\n";
    let body_len = FRAME_BYTES_MAX - head.len() - 1; // -1: the NUL
    let mut c = broker.client().await;
    c.write_raw(format!("{head}{}\0", "x".repeat(body_len)).as_bytes())
        .await;
    c.receipt("r").await;
    c.write_raw(format!("{head}{}\0", "x".repeat(body_len + 1)).as_bytes())
        .await;
    c.error_then_close("too large").await;
    broker.stop().await;
}

/// A client streaming a frame far over the limit is still told why it was cut off: the
/// broker stops reading at the limit, so it must not reset the connection (discarding its
/// own ERROR) while the client's bytes are still arriving.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_still_writing_an_oversized_frame_gets_the_error() {
    let broker = Broker::start_with(|c| c.stomp.frame_bytes_max = FRAME_BYTES_MAX).await;
    let mut c = broker.client().await;
    let mut wire = b"SEND\ndestination:/queue/huge\n\n".to_vec();
    wire.resize(wire.len() + 8 * 1024 * 1024, b'x');
    wire.push(0);
    let (first, ended) = c.write_and_read_until_closed(&wire).await;
    let error =
        first.unwrap_or_else(|| panic!("connection ended ({ended:?}) without an ERROR frame"));
    assert_eq!(error.command, Command::Error, "{error:?}");
    assert!(
        error
            .header("message")
            .is_some_and(|m| m.contains("too large")),
        "{error:?}"
    );
    let mut other = broker.client().await;
    other.put("/queue/huge", "small", &[]).await;
    other.disconnect().await;
    broker.stop().await;
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into()),
        Err(e) => e.to_string(),
    }
}
