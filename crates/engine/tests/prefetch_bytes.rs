//! `prefetch_bytes_max`: a subscription's unacknowledged messages are bounded in bytes as
//! well as in count, so large messages cannot pin prefetch × size of memory per consumer.

mod support;

use bytes::Bytes;
use haven_engine::*;
use support::*;

const BODY_BYTES: usize = 10_000;

fn send_big(h: &mut Harness, n: usize) {
    for i in 0..n {
        h.ok(Command::Send {
            conn: 1,
            destination: Destination::Queue("big".into()),
            message: NewMessage {
                headers: Default::default(),
                body: Bytes::from(vec![b'x'; BODY_BYTES]),
                persistent: true,
                priority: 4,
                expires_ms: 0,
            },
            transaction: None,
            receipt: Some(format!("r{i}")),
            producer: None,
        });
    }
}

fn harness(window_bytes: u64) -> Harness {
    let mut h = Harness::new(EngineConfig {
        prefetch_bytes_max: window_bytes,
        ..EngineConfig::default()
    });
    h.connect(1, None);
    h.connect(2, None);
    h
}

#[test]
fn a_subscription_gets_no_more_once_its_bytes_in_flight_reach_the_window() {
    // Room for two whole messages and part of a third: three go (the third starts below the
    // window), then nothing until an acknowledgement frees bytes.
    let mut h = harness(2 * BODY_BYTES as u64 + BODY_BYTES as u64 / 2);
    send_big(&mut h, 10);
    let got = deliveries(&h.subscribe(2, "s", "/queue/big", AckMode::ClientIndividual, 1000));
    assert_eq!(
        got.len(),
        3,
        "the count (1000) allows all ten; the bytes three"
    );
    let more = deliveries(&h.ack(2, got[0].1.ack_tag));
    assert_eq!(more.len(), 1, "one acknowledged, one more");
    assert!(
        deliveries(&h.ack(2, got[1].1.ack_tag)).len() == 1,
        "and so on, message by message"
    );
}

#[test]
fn one_message_always_goes_however_large() {
    let mut h = harness(1);
    send_big(&mut h, 3);
    let got = deliveries(&h.subscribe(2, "s", "/queue/big", AckMode::ClientIndividual, 1000));
    assert_eq!(
        got.len(),
        1,
        "a window smaller than a message still lets one through"
    );
    assert_eq!(deliveries(&h.ack(2, got[0].1.ack_tag)).len(), 1);
}

#[test]
fn the_count_still_bounds_small_messages() {
    let mut h = harness(64 << 20);
    send_big(&mut h, 10);
    let got = deliveries(&h.subscribe(2, "s", "/queue/big", AckMode::ClientIndividual, 4));
    assert_eq!(got.len(), 4);
}

#[test]
fn failed_deliveries_give_their_bytes_back() {
    let mut h = harness(2 * BODY_BYTES as u64);
    send_big(&mut h, 4);
    let got = deliveries(&h.subscribe(2, "s", "/queue/big", AckMode::ClientIndividual, 1000));
    assert_eq!(got.len(), 2);
    // A NACK redelivers the message to the same subscription: the window it took is freed
    // first, so exactly that one comes again (bytes are counted per delivery, not leaked).
    let again = deliveries(&h.nack(2, got[0].1.ack_tag));
    assert_eq!(again.len(), 1);
    h.close(2);
    h.connect(3, None);
    let after = deliveries(&h.subscribe(3, "s", "/queue/big", AckMode::ClientIndividual, 1000));
    assert_eq!(after.len(), 2, "a new consumer starts with an empty window");
}
