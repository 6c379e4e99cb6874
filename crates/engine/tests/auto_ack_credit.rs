//! Auto-ack credit is by delivery tag, so a subscription id reused on one connection cannot
//! have a message acknowledged that was never written (found in review).

mod support;
use haven_engine::*;
use support::*;

#[test]
fn credit_for_a_reused_subscription_id_never_acknowledges_an_unwritten_delivery() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(2, None);
    let e = h.subscribe(2, "s", "/queue/q", AckMode::Auto, 1);
    assert!(e.is_empty());
    h.send(1, "/queue/q", "m1", true); // tag 1 to old "s" (queued to the socket, not written)
    h.send(1, "/queue/q", "m2", true); // waits (prefetch 1)
    h.ok(Command::Unsubscribe {
        conn: 2,
        sub_id: "s".into(),
        durable_name: None,
        receipt: None,
    });
    // m1 goes back; the new "s" gets m1 (tag 2) and m2 (tag 3)
    h.subscribe(2, "s", "/queue/q", AckMode::Auto, 2);
    // The connection writes [old tag1 (m1), new tag2 (m1)] and reports Credit{s, 2}.
    h.ok(Command::Credit {
        conn: 2,
        sub_id: "s".into(),
        up_to_tag: 2,
    });
    // Socket dies before tag 3 (m2) is written.
    h.close(2);
    let c = h.engine.durable_contents();
    let held = c.get(&QueueKey::Queue("q".into())).map_or(0, |s| s.len());
    assert_eq!(
        held, 1,
        "m2 was never written to any socket, so it must still be held"
    );
}
