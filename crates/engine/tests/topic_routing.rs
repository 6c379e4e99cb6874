//! Wildcard topic subscriptions and virtual topics, as ActiveMQ applications use them.

mod support;

use haven_engine::*;
use support::*;

#[test]
fn wildcard_subscribers_get_matching_topics_once() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(2, None);
    h.subscribe(2, "all", "/topic/PRICE.>", AckMode::Auto, 100);
    h.subscribe(2, "nasdaq", "/topic/PRICE.*.NASDAQ", AckMode::Auto, 100);
    let e = h.send(1, "/topic/PRICE.STOCK.NASDAQ", "orcl", false);
    let mut subs: Vec<String> = deliveries(&e)
        .iter()
        .map(|(_, d)| d.sub_id.clone())
        .collect();
    subs.sort();
    assert_eq!(
        subs,
        vec!["all", "nasdaq"],
        "one copy per matching subscription"
    );
    let e = h.send(1, "/topic/PRICE.STOCK.NYSE", "ibm", false);
    let subs: Vec<String> = deliveries(&e)
        .iter()
        .map(|(_, d)| d.sub_id.clone())
        .collect();
    assert_eq!(subs, vec!["all"]);
    let e = h.send(1, "/topic/OTHER", "x", false);
    assert!(deliveries(&e).is_empty());
    // Unsubscribing stops it.
    h.ok(Command::Unsubscribe {
        conn: 2,
        sub_id: "all".into(),
        durable_name: None,
        receipt: None,
    });
    let e = h.send(1, "/topic/PRICE.STOCK.NYSE", "ibm2", false);
    assert!(deliveries(&e).is_empty());
}

#[test]
fn durable_wildcard_subscription_keeps_messages_across_restart() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, Some("app"));
    h.connect(2, None);
    let sub = |conn| Command::Subscribe {
        conn,
        sub_id: "d".into(),
        destination: Destination::Topic("events.>".into()),
        ack: AckMode::ClientIndividual,
        prefetch: 10,
        durable_name: Some("all-events".into()),
        options: Default::default(),
        receipt: None,
    };
    h.ok(sub(1));
    h.close(1);
    h.send(2, "/topic/events.a", "one", true);
    h.send(2, "/topic/events.b.c", "two", true);
    h.send(2, "/topic/other", "no", true);
    h.crash_and_recover();
    h.connect(1, Some("app"));
    let e = h.ok(sub(1));
    assert_eq!(bodies(&e), vec!["one", "two"]);
}

#[test]
fn sending_to_a_wildcard_or_consuming_a_wildcard_queue_is_refused() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    let send = Command::Send {
        conn: 1,
        destination: Destination::Topic("a.>".into()),
        message: NewMessage {
            headers: Default::default(),
            body: "x".into(),
            persistent: true,
            priority: 4,
            expires_ms: 0,
        },
        transaction: None,
        receipt: None,
        producer: None,
    };
    assert!(matches!(h.cmd(send), Err(EngineError::WildcardSend(_))));
    let browse = Command::Subscribe {
        conn: 1,
        sub_id: "s".into(),
        destination: Destination::Queue("orders.*".into()),
        ack: AckMode::Auto,
        prefetch: 1,
        durable_name: None,
        options: SubscribeOptions {
            browser: true,
            ..Default::default()
        },
        receipt: None,
    };
    assert!(matches!(h.cmd(browse), Err(EngineError::WildcardQueue(_))));
}

#[test]
fn wildcard_queue_consumer_takes_from_every_matching_queue_old_and_new() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(2, None);
    h.send(1, "/queue/orders.eu", "eu-1", true);
    h.send(1, "/queue/other", "other-1", true);
    let fx = h.subscribe(2, "w", "/queue/orders.>", AckMode::ClientIndividual, 10);
    assert_eq!(bodies(&fx), vec!["eu-1"]);
    // A queue created after the SUBSCRIBE joins it.
    let fx = h.send(1, "/queue/orders.us.east", "us-1", true);
    let ds = deliveries(&fx);
    assert_eq!(bodies(&fx), vec!["us-1"]);
    assert_eq!(
        ds[0].1.message.destination.to_string(),
        "/queue/orders.us.east"
    );
    assert!(bodies(&h.send(1, "/queue/ordersX", "no", true)).is_empty());
    // ACK works per message; NACK redelivers from the message's own queue.
    h.nack(2, ds[0].1.ack_tag);
    let again = deliveries(&h.send(1, "/queue/orders.eu", "eu-2", true));
    let got: Vec<String> = again
        .iter()
        .map(|(_, d)| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect();
    assert!(got.contains(&"eu-2".to_string()), "{got:?}");
    // Closing detaches it from every queue; what it held goes back.
    h.close(2);
    // Prefetch is shared: with prefetch 1 only one message is out at a time.
    h.connect(3, None);
    h.send(1, "/queue/orders.a", "a-1", true);
    h.send(1, "/queue/orders.b", "b-1", true);
    let fx = h.subscribe(3, "one", "/queue/orders.>", AckMode::ClientIndividual, 1);
    assert_eq!(deliveries(&fx).len(), 1);
    h.close(3);
    h.connect(4, None);
    let fx = h.subscribe(4, "plain", "/queue/orders.us.east", AckMode::Auto, 100);
    assert_eq!(bodies(&fx), vec!["us-1"]);
}

#[test]
fn virtual_topic_copies_into_each_consumer_group_queue() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=4 {
        h.connect(c, None);
    }
    // Group A has two members (load-balanced), group B one.
    h.subscribe(
        2,
        "a",
        "/queue/Consumer.A.VirtualTopic.Orders",
        AckMode::ClientIndividual,
        1,
    );
    h.subscribe(
        3,
        "a",
        "/queue/Consumer.A.VirtualTopic.Orders",
        AckMode::ClientIndividual,
        1,
    );
    h.subscribe(
        4,
        "b",
        "/queue/Consumer.B.VirtualTopic.Orders",
        AckMode::ClientIndividual,
        10,
    );
    let e1 = h.send(1, "/topic/VirtualTopic.Orders", "o1", true);
    let e2 = h.send(1, "/topic/VirtualTopic.Orders", "o2", true);
    let group_a: Vec<u64> = deliveries(&e1)
        .iter()
        .chain(deliveries(&e2).iter())
        .filter(|(_, d)| d.sub_id == "a")
        .map(|(c, _)| *c)
        .collect();
    let group_b = deliveries(&e1)
        .iter()
        .chain(deliveries(&e2).iter())
        .filter(|(_, d)| d.sub_id == "b")
        .count();
    assert_eq!(group_a.len(), 2, "group A gets each message once");
    assert_ne!(group_a[0], group_a[1], "load-balanced over its members");
    assert_eq!(group_b, 2, "group B gets its own copy of each");
    // Group queues are durable queues: a group member away keeps its messages, across a crash.
    h.close(4);
    h.send(1, "/topic/VirtualTopic.Orders", "o3", true);
    h.crash_and_recover();
    h.connect(5, None);
    let e = h.subscribe(
        5,
        "b",
        "/queue/Consumer.B.VirtualTopic.Orders",
        AckMode::ClientIndividual,
        10,
    );
    assert_eq!(bodies(&e), vec!["o1", "o2", "o3"]);
}

#[test]
fn a_virtual_topic_consumer_queue_keeps_receiving_after_a_restart_while_empty() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.subscribe(
        1,
        "a",
        "/queue/Consumer.A.VirtualTopic.orders",
        AckMode::Auto,
        10,
    );
    h.close(1);
    // Empty, no consumer; then a crash, and compaction of everything old.
    h.crash_and_recover();
    let end = h.next_lsn;
    while h.relocate(end, 16) > 0 {}
    h.checkpoint_and_truncate();
    h.crash_and_recover();
    h.connect(2, None);
    h.send(2, "/topic/VirtualTopic.orders", "while-away", true);
    h.crash_and_recover();
    h.connect(3, None);
    let fx = h.subscribe(
        3,
        "a",
        "/queue/Consumer.A.VirtualTopic.orders",
        AckMode::Auto,
        10,
    );
    assert_eq!(bodies(&fx), vec!["while-away"]);
}
