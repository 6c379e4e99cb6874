//! What a network of brokers needs from one broker's engine: consumer advisories that say
//! where consumers are (ActiveMQ's `ActiveMQ.Advisory.Consumer.*` topics, with each consumer's
//! demand path), network consumers that rank below local ones and do not send a message back
//! to a broker it came through while a local consumer is there, and de-duplication of
//! forwarded messages by their network origin; and, for request/reply across brokers,
//! temporary queues advertised under their remote name and open to a bridge on a broker where
//! their owner is not a connection ("foreign" there).

mod support;

use bytes::Bytes;
use haven_engine::*;
use support::*;

const QUEUE_ADVISORIES: &str = "/topic/ActiveMQ.Advisory.Consumer.Queue.>";
const TOPIC_ADVISORIES: &str = "/topic/ActiveMQ.Advisory.Consumer.Topic.>";

fn network(path: &[&str], priority_penalty: u8) -> Option<NetworkConsumer> {
    Some(NetworkConsumer {
        demand_path: path.iter().map(|b| b.to_string()).collect(),
        priority_penalty,
    })
}

fn subscribe_with(
    h: &mut Harness,
    conn: ConnId,
    sub: &str,
    dest: &str,
    prefetch: u32,
    options: SubscribeOptions,
) -> Vec<Effect> {
    h.ok(Command::Subscribe {
        conn,
        sub_id: sub.into(),
        destination: Destination::parse(dest, conn).unwrap(),
        ack: AckMode::ClientIndividual,
        prefetch,
        durable_name: None,
        options,
        receipt: None,
    })
}

/// A bridge's subscription on behalf of consumers at the end of `path`.
fn subscribe_network(
    h: &mut Harness,
    conn: ConnId,
    sub: &str,
    dest: &str,
    prefetch: u32,
    path: &[&str],
    priority_penalty: u8,
) -> Vec<Effect> {
    let options = SubscribeOptions {
        network: network(path, priority_penalty),
        ..Default::default()
    };
    subscribe_with(h, conn, sub, dest, prefetch, options)
}

fn unsubscribe(h: &mut Harness, conn: ConnId, sub: &str) -> Vec<Effect> {
    h.ok(Command::Unsubscribe {
        conn,
        sub_id: sub.into(),
        durable_name: None,
        receipt: None,
    })
}

/// A SEND as a bridge forwards it: it was on the brokers of `path` before this one.
fn send_forwarded(
    h: &mut Harness,
    conn: ConnId,
    dest: &str,
    body: &str,
    path: &str,
) -> Vec<Effect> {
    let headers = match path {
        "" => Vec::new(),
        _ => vec![("haven-net-path".to_string(), path.to_string())],
    };
    h.ok(Command::Send {
        conn,
        destination: Destination::parse(dest, conn).unwrap(),
        message: NewMessage {
            headers: headers.into_iter().collect(),
            body: Bytes::from(body.to_string()),
            persistent: true,
            priority: 4,
            expires_ms: 0,
        },
        transaction: None,
        receipt: None,
        producer: None,
    })
}

/// One advisory as a subscriber reads it.
#[derive(Debug, PartialEq, Eq)]
struct Advisory {
    topic: String,
    about: String,
    count: String,
    demand: String,
}

/// The advisories delivered to `conn`, in order.
fn advisories(effects: &[Effect], conn: ConnId) -> Vec<Advisory> {
    deliveries(effects)
        .into_iter()
        .filter(|(c, _)| *c == conn)
        .map(|(_, d)| {
            let m = &d.message;
            assert!(!m.persistent && m.body.is_empty(), "an advisory: {m:?}");
            let header = |name: &str| m.header(name).unwrap_or("<missing>").to_string();
            Advisory {
                topic: m.destination.to_string(),
                about: header("haven-advisory-for"),
                count: header("consumerCount"),
                demand: header("haven-demand"),
            }
        })
        .collect()
}

fn advisory(topic: &str, about: &str, count: usize, demand: &str) -> Advisory {
    Advisory {
        topic: format!("/topic/ActiveMQ.Advisory.Consumer.{topic}"),
        about: about.to_string(),
        count: count.to_string(),
        demand: demand.to_string(),
    }
}

fn to_conn(effects: &[Effect], conn: ConnId) -> Vec<String> {
    deliveries(effects)
        .iter()
        .filter(|(c, _)| *c == conn)
        .map(|(_, d)| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect()
}

// ------------------------------------------------------------------------------------------
// Consumer advisories

#[test]
fn a_queue_advisory_follows_subscribe_unsubscribe_and_close() {
    let mut h = Harness::new(EngineConfig::default());
    for c in [1, 2, 3, 9] {
        h.connect(c, None);
    }
    let e = h.subscribe(9, "adv", QUEUE_ADVISORIES, AckMode::Auto, 100);
    assert!(
        advisories(&e, 9).is_empty(),
        "no consumers yet: empty snapshot"
    );
    let log_len = h.log.len();

    let e = h.subscribe(1, "s", "/queue/orders", AckMode::Auto, 10);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders", "/queue/orders", 1, "-")]
    );
    let e = subscribe_network(&mut h, 2, "s", "/queue/orders", 10, &["C", "B"], 0);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders", "/queue/orders", 2, "-;C,B")]
    );
    let e = h.subscribe(3, "s", "/queue/orders", AckMode::Auto, 10);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders", "/queue/orders", 3, "-;C,B;-")]
    );
    let e = unsubscribe(&mut h, 1, "s");
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders", "/queue/orders", 2, "C,B;-")]
    );
    let e = h.close(2);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders", "/queue/orders", 1, "-")]
    );
    let e = h.close(3);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders", "/queue/orders", 0, "")]
    );
    assert_eq!(h.log.len(), log_len, "advisories write no record");
}

#[test]
fn closing_a_connection_advises_each_destination_once() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(9, None);
    h.subscribe(9, "adv", QUEUE_ADVISORIES, AckMode::Auto, 100);
    for (sub, dest) in [("a1", "/queue/a"), ("a2", "/queue/a"), ("b", "/queue/b")] {
        h.subscribe(1, sub, dest, AckMode::Auto, 10);
    }
    let e = h.close(1);
    assert_eq!(
        advisories(&e, 9),
        [
            advisory("Queue.a", "/queue/a", 0, ""),
            advisory("Queue.b", "/queue/b", 0, "")
        ]
    );
}

#[test]
fn no_advisory_is_built_while_nobody_subscribes_to_its_topic() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(9, None);
    // Someone listens to topic advisories only.
    h.subscribe(9, "adv", TOPIC_ADVISORIES, AckMode::Auto, 100);
    let seq = h.engine.next_seq();
    let e = h.subscribe(1, "s", "/queue/orders", AckMode::Auto, 10);
    assert!(deliveries(&e).is_empty());
    let e = h.close(1);
    assert!(deliveries(&e).is_empty());
    assert_eq!(
        h.engine.next_seq(),
        seq,
        "no advisory message was even numbered"
    );
}

#[test]
fn topic_advisories_name_the_topic_or_pattern_as_subscribed_durable_or_not() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, Some("app"));
    h.connect(2, None);
    h.connect(9, None);
    h.subscribe(
        9,
        "adv",
        "/topic/ActiveMQ.Advisory.Consumer.>",
        AckMode::Auto,
        100,
    );
    let e = h.subscribe(2, "w", "/topic/prices.>", AckMode::Auto, 10);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Topic.prices.>", "/topic/prices.>", 1, "-")]
    );
    let e = h.subscribe(2, "wq", "/queue/orders.>", AckMode::Auto, 10);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders.>", "/queue/orders.>", 1, "-")]
    );
    let durable = Command::Subscribe {
        conn: 1,
        sub_id: "d".into(),
        destination: Destination::Topic("prices.eu".into()),
        ack: AckMode::ClientIndividual,
        prefetch: 10,
        durable_name: Some("eu".into()),
        options: SubscribeOptions {
            network: network(&["C"], 1),
            ..Default::default()
        },
        receipt: None,
    };
    let e = h.ok(durable.clone());
    assert_eq!(
        advisories(&e, 9),
        [advisory("Topic.prices.eu", "/topic/prices.eu", 1, "C")]
    );
    // The durable subscriber goes offline, then comes back online.
    let e = h.close(1);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Topic.prices.eu", "/topic/prices.eu", 0, "")]
    );
    h.connect(1, Some("app"));
    let e = h.ok(durable);
    assert_eq!(
        advisories(&e, 9),
        [advisory("Topic.prices.eu", "/topic/prices.eu", 1, "C")]
    );
}

#[test]
fn browsers_temporary_topics_and_advisory_subscribers_are_not_advertised() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(9, None);
    h.subscribe(
        9,
        "adv",
        "/topic/ActiveMQ.Advisory.Consumer.>",
        AckMode::Auto,
        100,
    );
    let browse = SubscribeOptions {
        browser: true,
        ..Default::default()
    };
    let e = subscribe_with(&mut h, 1, "b", "/queue/orders", 10, browse);
    assert!(advisories(&e, 9).is_empty());
    let e = h.subscribe(1, "t", "/temp-topic/events", AckMode::Auto, 10);
    assert!(advisories(&e, 9).is_empty());
    let e = h.subscribe(1, "a", QUEUE_ADVISORIES, AckMode::Auto, 10);
    assert!(advisories(&e, 9).is_empty());
    let e = h.close(1);
    assert!(advisories(&e, 9).is_empty());
}

#[test]
fn a_new_advisory_subscriber_alone_gets_a_snapshot_matching_its_pattern() {
    let mut h = Harness::new(EngineConfig::default());
    for c in [1, 2, 8, 9] {
        h.connect(c, None);
    }
    h.subscribe(8, "adv", QUEUE_ADVISORIES, AckMode::Auto, 100);
    h.subscribe(1, "o", "/queue/orders", AckMode::Auto, 10);
    subscribe_network(&mut h, 2, "o", "/queue/orders", 10, &["C", "B"], 0);
    h.subscribe(1, "a", "/queue/audit", AckMode::Auto, 10);
    h.subscribe(1, "gone", "/queue/gone", AckMode::Auto, 10);
    unsubscribe(&mut h, 1, "gone");
    h.subscribe(1, "p", "/topic/prices", AckMode::Auto, 10);

    let e = h.subscribe(9, "adv", QUEUE_ADVISORIES, AckMode::Auto, 100);
    assert_eq!(
        advisories(&e, 9),
        [
            advisory("Queue.audit", "/queue/audit", 1, "-"),
            advisory("Queue.orders", "/queue/orders", 2, "-;C,B"),
        ],
        "queues with consumers now, sorted; not the topic, not the queue left empty"
    );
    assert!(
        advisories(&e, 8).is_empty(),
        "the earlier subscriber gets none"
    );

    let e = h.subscribe(
        9,
        "one",
        "/topic/ActiveMQ.Advisory.Consumer.Topic.prices",
        AckMode::Auto,
        100,
    );
    assert_eq!(
        advisories(&e, 9),
        [advisory("Topic.prices", "/topic/prices", 1, "-")]
    );
    let e = h.subscribe(
        9,
        "star",
        "/topic/ActiveMQ.Advisory.Consumer.*.orders",
        AckMode::Auto,
        100,
    );
    assert_eq!(
        advisories(&e, 9),
        [advisory("Queue.orders", "/queue/orders", 2, "-;C,B")]
    );
}

// ------------------------------------------------------------------------------------------
// Network consumers in dispatch

#[test]
fn a_message_does_not_go_back_to_a_broker_it_was_on_while_a_local_consumer_remains() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    subscribe_with(
        &mut h,
        2,
        "local",
        "/queue/work",
        1,
        SubscribeOptions::default(),
    );
    subscribe_network(&mut h, 3, "to-b", "/queue/work", 10, &["B"], 0);

    let e = send_forwarded(&mut h, 1, "/queue/work", "from-b-1", "A,B");
    assert_eq!(to_conn(&e, 2), ["from-b-1"], "the local consumer has room");
    let e = send_forwarded(&mut h, 1, "/queue/work", "from-b-2", "B");
    assert!(
        deliveries(&e).is_empty(),
        "the local consumer is full, and B must not get its message back: it waits"
    );
    let e = send_forwarded(&mut h, 1, "/queue/work", "from-a", "A");
    assert_eq!(to_conn(&e, 3), ["from-a"], "B was not on its path");

    // The local consumer leaves: its consumers moved, so the messages may go back.
    let e = unsubscribe(&mut h, 2, "local");
    assert_eq!(to_conn(&e, 3), ["from-b-1", "from-b-2"]);
}

#[test]
fn the_last_local_consumer_closing_lets_waiting_messages_go_back() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    subscribe_network(&mut h, 3, "to-b", "/queue/work", 10, &["C", "B"], 0);
    subscribe_with(
        &mut h,
        2,
        "local",
        "/queue/work",
        1,
        SubscribeOptions::default(),
    );
    let held = deliveries(&send_forwarded(&mut h, 1, "/queue/work", "x", ""));
    assert_eq!(held[0].0, 3, "round-robin: the bridge first");
    h.ack(3, held[0].1.ack_tag);
    send_forwarded(&mut h, 1, "/queue/work", "m1", "B");
    let e = send_forwarded(&mut h, 1, "/queue/work", "m2", "B");
    assert!(
        deliveries(&e).is_empty(),
        "m1 went to the local consumer, m2 waits"
    );
    let e = h.close(2);
    assert_eq!(to_conn(&e, 3), ["m1", "m2"]);
}

#[test]
fn with_only_network_consumers_a_message_may_go_back() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(3, None);
    subscribe_network(&mut h, 3, "to-b", "/queue/work", 10, &["B"], 0);
    let e = send_forwarded(&mut h, 1, "/queue/work", "m", "A,B");
    assert_eq!(to_conn(&e, 3), ["m"]);
}

#[test]
fn a_message_not_from_the_bridges_broker_goes_to_either_consumer() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    subscribe_with(
        &mut h,
        2,
        "local",
        "/queue/work",
        10,
        SubscribeOptions::default(),
    );
    subscribe_network(&mut h, 3, "to-b", "/queue/work", 10, &["B"], 0);
    let mut to = Vec::new();
    for n in 0..4 {
        let e = send_forwarded(&mut h, 1, "/queue/work", &format!("m{n}"), "A,BB");
        to.extend(deliveries(&e).iter().map(|(c, _)| *c));
    }
    assert_eq!(to, [2, 3, 2, 3], "equal priority: round-robin");
}

#[test]
fn a_network_consumer_ranks_below_local_consumers_by_its_penalty() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=4 {
        h.connect(c, None);
    }
    subscribe_network(&mut h, 3, "to-b", "/queue/work", 10, &["B"], 1);
    subscribe_with(
        &mut h,
        2,
        "local",
        "/queue/work",
        2,
        SubscribeOptions::default(),
    );
    let mut to = Vec::new();
    for n in 0..4 {
        let e = h.send(1, "/queue/work", &format!("m{n}"), true);
        to.extend(deliveries(&e).iter().map(|(c, _)| *c));
    }
    assert_eq!(to, [2, 2, 3, 3], "the local consumer while it has room");

    // The penalty lowers the bridge's own priority; it does not put it below everyone.
    let options = SubscribeOptions {
        priority: 5,
        network: network(&["C"], 1),
        ..Default::default()
    };
    subscribe_with(&mut h, 4, "to-c", "/queue/other", 10, options);
    subscribe_with(
        &mut h,
        2,
        "other",
        "/queue/other",
        10,
        SubscribeOptions::default(),
    );
    let e = h.send(1, "/queue/other", "o", true);
    assert_eq!(to_conn(&e, 4), ["o"], "priority 5 - 1 still beats 0");
}

// ------------------------------------------------------------------------------------------
// De-duplication by network origin

fn origin(id: &str) -> Option<ProducerSeq> {
    Some(ProducerSeq {
        producer: format!("{NETWORK_ORIGIN_PREFIX}{id}"),
        seq: 1,
    })
}

fn send_with(
    h: &mut Harness,
    conn: ConnId,
    body: &str,
    producer: Option<ProducerSeq>,
) -> Result<Vec<Effect>, EngineError> {
    h.cmd(Command::Send {
        conn,
        destination: Destination::Queue("q".into()),
        message: NewMessage {
            headers: Default::default(),
            body: Bytes::from(body.to_string()),
            persistent: true,
            priority: 4,
            expires_ms: 0,
        },
        transaction: None,
        receipt: Some(format!("r-{body}")),
        producer,
    })
}

fn stored(h: &Harness) -> usize {
    h.engine
        .durable_contents()
        .get(&QueueKey::Queue("q".into()))
        .map_or(0, |s| s.len())
}

#[test]
fn a_resent_network_origin_is_receipted_and_not_stored() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send_with(&mut h, 1, "m", origin("store-a/ID:haven-7")).unwrap();
    let log_len = h.log.len();
    let e = send_with(&mut h, 1, "m", origin("store-a/ID:haven-7")).unwrap();
    assert_eq!(receipts(&e), ["r-m"]);
    assert_eq!(h.log.len(), log_len, "a duplicate writes nothing");
    assert_eq!(stored(&h), 1);
    assert_eq!(h.engine.origin_stats().duplicates_dropped_total, 1);
    assert_eq!(h.engine.producer_stats().duplicates_dropped_total, 0);
    // Another message of the same store is not a duplicate.
    send_with(&mut h, 1, "n", origin("store-a/ID:haven-8")).unwrap();
    assert_eq!(stored(&h), 2);
}

#[test]
fn network_origins_survive_replay() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send_with(&mut h, 1, "m", origin("store-a/ID:haven-7")).unwrap();
    h.crash_and_recover();
    assert_eq!(
        h.engine.origin_stats().remembered,
        1,
        "replayed into the origin table"
    );
    assert_eq!(h.engine.producer_stats().producers, 0);
    h.connect(2, None);
    let e = send_with(&mut h, 2, "m", origin("store-a/ID:haven-7")).unwrap();
    assert_eq!(receipts(&e), ["r-m"]);
    assert_eq!(stored(&h), 1);
}

#[test]
fn a_compacted_origin_mark_replays_into_the_origin_table() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send_with(&mut h, 1, "m", origin("store-a/ID:haven-7")).unwrap();
    let got = h.subscribe(1, "s", "/queue/q", AckMode::ClientIndividual, 10);
    h.ack(1, deliveries(&got)[0].1.ack_tag);
    let limit = h.next_lsn;
    assert_eq!(h.relocate(limit, 100), 1, "only the origin's mark is live");
    h.checkpoint_and_truncate();
    h.crash_and_recover();
    assert_eq!(h.engine.origin_stats().remembered, 1);
    assert_eq!(h.engine.producer_stats().producers, 0);
    h.connect(2, None);
    send_with(&mut h, 2, "m", origin("store-a/ID:haven-7")).unwrap();
    assert_eq!(stored(&h), 0, "still a duplicate: not stored again");
}

#[test]
fn network_origins_are_not_fenced_across_connections() {
    let mut h = Harness::new(EngineConfig::default());
    // Bridge connections: one claims an application producer, the other nothing.
    h.ok(Command::Connect {
        conn: 1,
        client_id: None,
        producer: Some("bridge".into()),
        session: 0,
    });
    h.connect(2, None);
    send_with(&mut h, 1, "m", origin("store-a/ID:haven-7")).unwrap();
    let e = send_with(&mut h, 2, "m", origin("store-a/ID:haven-7")).unwrap();
    assert_eq!(receipts(&e), ["r-m"], "a duplicate, not an error");
    send_with(&mut h, 2, "n", origin("store-a/ID:haven-8")).unwrap();
    h.close(2);
    let e = send_with(&mut h, 1, "n", origin("store-a/ID:haven-8")).unwrap();
    assert_eq!(receipts(&e), ["r-n"]);
    assert_eq!(stored(&h), 2);
}

#[test]
fn a_connect_cannot_claim_a_network_origin() {
    let mut h = Harness::new(EngineConfig::default());
    let id = format!("{NETWORK_ORIGIN_PREFIX}store-a/ID:haven-7");
    let err = h
        .cmd(Command::Connect {
            conn: 1,
            client_id: None,
            producer: Some(id.clone()),
            session: 0,
        })
        .unwrap_err();
    assert_eq!(err, EngineError::NetworkOriginClaimed(id));
    assert!(err.to_string().contains("haven-net:"), "{err}");
    assert_eq!(h.engine.connection_count(), 0, "the connection was refused");
}

#[test]
fn origins_and_application_producers_have_separate_limits() {
    let cfg = EngineConfig {
        network_origins_max: 2,
        network_origin_idle_ms_max: 1_000,
        ..EngineConfig::default()
    };
    let mut h = Harness::new(cfg);
    h.connect(1, None);
    let app = Some(ProducerSeq {
        producer: "app".into(),
        seq: 1,
    });
    send_with(&mut h, 1, "a", app.clone()).unwrap();
    for n in 1..=3 {
        h.now_ms += 1;
        send_with(&mut h, 1, &format!("o{n}"), origin(&format!("s/ID:{n}"))).unwrap();
    }
    let origins = h.engine.origin_stats();
    assert_eq!((origins.remembered, origins.forgotten_total), (2, 1));
    let apps = h.engine.producer_stats();
    assert_eq!(
        (apps.producers, apps.forgotten_total),
        (1, 0),
        "origins never evict it"
    );
    // The forgotten origin is stored again; the application's producer still deduplicates.
    send_with(&mut h, 1, "o1", origin("s/ID:1")).unwrap();
    assert_eq!(stored(&h), 5);
    send_with(&mut h, 1, "a", app.clone()).unwrap();
    assert_eq!(stored(&h), 5);
    // Origins go idle after their own limit; the application's producer is kept.
    h.tick(1_000);
    assert_eq!(h.engine.origin_stats().remembered, 0);
    assert_eq!(h.engine.producer_hwm("app"), 1);
    assert_eq!(
        h.engine.durable_producers().keys().collect::<Vec<_>>(),
        ["app"]
    );
}

#[test]
fn a_bridge_going_away_does_not_count_toward_the_dead_letter_queue() {
    let mut h = Harness::new(EngineConfig {
        redeliveries_max: 1,
        ..EngineConfig::default()
    });
    h.connect(1, None);
    h.send(1, "/queue/work", "m", true);
    // A bridge whose link keeps failing: subscribed, handed the message, gone, five times.
    for round in 0..5 {
        let conn = 10 + round;
        h.connect(conn, None);
        let e = subscribe_network(&mut h, conn, "to-b", "/queue/work", 10, &["B"], 0);
        let d = deliveries(&e);
        assert_eq!(d.len(), 1, "round {round}: the message is offered again");
        assert_eq!(
            d[0].1.delivery_count, 1,
            "round {round}: no failure counted"
        );
        assert_eq!(d[0].1.redelivered, round > 0);
        h.close(conn);
    }
    // An application consumer that fails it twice dead-letters it, as before.
    h.connect(2, None);
    let e = subscribe_with(
        &mut h,
        2,
        "app",
        "/queue/work",
        10,
        SubscribeOptions::default(),
    );
    let tag = deliveries(&e)[0].1.ack_tag;
    let e = h.nack(2, tag);
    let tag = deliveries(&e)[0].1.ack_tag;
    h.nack(2, tag);
    h.connect(3, None);
    let e = subscribe_with(
        &mut h,
        3,
        "dlq",
        "/queue/ActiveMQ.DLQ",
        10,
        SubscribeOptions::default(),
    );
    assert_eq!(bodies(&e), ["m"]);
}

// ------------------------------------------------------------------------------------------
// Temporary queues across the network (`bridgeTempDestinations`)

const TEMP_QUEUE_ADVISORIES: &str = "/topic/ActiveMQ.Advisory.Consumer.TempQueue.>";

/// The temporary queues this engine has now.
fn temp_queues(h: &Harness) -> Vec<QueueStats> {
    h.engine
        .queue_stats()
        .into_iter()
        .filter(|s| matches!(s.key, QueueKey::Temp { .. }))
        .collect()
}

fn subscribe_network_cmd(conn: ConnId, sub: &str, dest: &str) -> Command {
    Command::Subscribe {
        conn,
        sub_id: sub.into(),
        destination: Destination::parse(dest, conn).unwrap(),
        ack: AckMode::ClientIndividual,
        prefetch: 10,
        durable_name: None,
        options: SubscribeOptions {
            network: network(&["A"], 0),
            ..Default::default()
        },
        receipt: None,
    }
}

#[test]
fn an_owners_temporary_queue_consumer_is_advertised_under_its_remote_name() {
    let mut h = Harness::new(EngineConfig::default());
    for c in [1, 8, 9] {
        h.connect(c, None);
    }
    let remote = Destination::parse("/temp-queue/r", 1).unwrap().to_string();
    assert_eq!(remote, "/remote-temp-queue/haven-1-r");
    let tq = |count, demand| advisory("TempQueue.haven-1-r", &remote, count, demand);
    h.subscribe(9, "adv", TEMP_QUEUE_ADVISORIES, AckMode::Auto, 100);
    h.subscribe(9, "q-adv", QUEUE_ADVISORIES, AckMode::Auto, 100);
    let e = h.subscribe(1, "r", "/temp-queue/r", AckMode::Auto, 10);
    assert_eq!(
        advisories(&e, 9),
        [tq(1, "-")],
        "once, on the TempQueue topic only"
    );

    // A bridge connecting later learns of it from the snapshot, by either pattern.
    let e = h.subscribe(8, "adv", TEMP_QUEUE_ADVISORIES, AckMode::Auto, 100);
    assert_eq!(advisories(&e, 8), [tq(1, "-")]);
    let everything = "/topic/ActiveMQ.Advisory.Consumer.>";
    let e = h.subscribe(8, "all", everything, AckMode::Auto, 100);
    assert_eq!(advisories(&e, 8), [tq(1, "-")]);

    let e = h.close(1);
    assert_eq!(advisories(&e, 9), [tq(0, "")]);
    assert_eq!(
        advisories(&e, 8),
        [tq(0, ""), tq(0, "")],
        "one per subscription of 8"
    );
    assert!(
        h.log.is_empty(),
        "advisories and temporary queues write no record"
    );
    let e = h.subscribe(8, "late", TEMP_QUEUE_ADVISORIES, AckMode::Auto, 100);
    assert!(
        advisories(&e, 8).is_empty(),
        "no consumers: not in a snapshot"
    );
}

#[test]
fn a_bridge_may_consume_a_foreign_temporary_queue_until_its_last_consumer_leaves() {
    // Broker B: the temporary queue is broker A's connection 999's, not a connection here.
    let mut b = Harness::new(EngineConfig::default());
    for c in [1, 2, 3, 9] {
        b.connect(c, None);
    }
    let reply_to = "/remote-temp-queue/haven-999-r";
    b.subscribe(9, "adv", TEMP_QUEUE_ADVISORIES, AckMode::Auto, 100);
    let e = subscribe_network(&mut b, 1, "to-a", reply_to, 10, &["A"], 0);
    assert_eq!(
        advisories(&e, 9),
        [advisory("TempQueue.haven-999-r", reply_to, 1, "A")]
    );
    let foreign = QueueKey::Temp {
        owner: 999,
        name: "r".into(),
    };
    let stats = temp_queues(&b);
    assert_eq!(stats.len(), 1);
    assert_eq!((&stats[0].key, stats[0].consumers), (&foreign, 1));

    // A replier here sends to the name it read in reply-to: the bridge gets it.
    let e = b.send(2, reply_to, "reply-1", true);
    assert_eq!(to_conn(&e, 1), ["reply-1"]);
    assert_eq!(receipts(&e), ["r-reply-1"]);
    // A second bridge joins the queue; the first one leaves, the queue stays.
    subscribe_network(&mut b, 3, "to-a", reply_to, 10, &["A"], 0);
    let e = unsubscribe(&mut b, 1, "to-a");
    assert_eq!(
        advisories(&e, 9),
        [advisory("TempQueue.haven-999-r", reply_to, 1, "A")]
    );
    assert_eq!(
        to_conn(&e, 3),
        ["reply-1"],
        "what the first bridge held goes to the other"
    );
    assert_eq!(temp_queues(&b).len(), 1);
    // Unacknowledged when the last consumer leaves: dropped with the queue.
    let e = b.send(2, reply_to, "reply-2", true);
    assert_eq!(to_conn(&e, 3), ["reply-2"]);
    let e = b.close(3);
    assert_eq!(
        advisories(&e, 9),
        [advisory("TempQueue.haven-999-r", reply_to, 0, "")]
    );
    assert!(temp_queues(&b).is_empty(), "deleted with its last consumer");

    // Now a reply has nowhere to go: dropped, not stored, not an error.
    let e = b.send(2, reply_to, "late", true);
    assert_eq!(receipts(&e), ["r-late"]);
    assert!(deliveries(&e).is_empty());
    assert!(
        temp_queues(&b).is_empty(),
        "a SEND creates no foreign queue"
    );
    assert!(b.engine.durable_contents().is_empty());
    assert!(b.log.is_empty(), "temporary queues are never logged");
    // A bridge subscribing again starts empty: nothing was kept for it.
    b.connect(4, None);
    let e = subscribe_network(&mut b, 4, "to-a", reply_to, 10, &["A"], 0);
    assert!(to_conn(&e, 4).is_empty(), "{:?}", bodies(&e));
    assert_eq!(temp_queues(&b).len(), 1);
}

#[test]
fn a_reply_sent_on_another_broker_comes_back_to_the_owners_temporary_queue() {
    // Connection ids differ between brokers, as the server's (boot time based) do.
    let (x, bridge_a) = (101, 109);
    let (y, bridge_b) = (201, 209);
    let mut a = Harness::new(EngineConfig::default());
    let mut b = Harness::new(EngineConfig::default());
    a.connect(x, None);
    a.connect(bridge_a, None);
    b.connect(y, None);
    b.connect(bridge_b, None);

    // X listens on its temporary queue; the bridge on A learns of it from the snapshot.
    a.subscribe(x, "replies", "/temp-queue/r", AckMode::Auto, 10);
    let e = a.subscribe(bridge_a, "adv", TEMP_QUEUE_ADVISORIES, AckMode::Auto, 100);
    let learned = advisories(&e, bridge_a);
    assert_eq!(learned.len(), 1);
    let reply_to = learned[0].about.clone();
    assert_eq!(reply_to, "/remote-temp-queue/haven-101-r");

    // The bridge subscribes to that name on B for A's consumer.
    subscribe_network(&mut b, bridge_b, "to-a", &reply_to, 10, &["A"], 0);
    // Y on B replies to the reply-to it read in the forwarded request.
    let e = b.send(y, &reply_to, "answer", false);
    let got = deliveries(&e);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, bridge_b);
    // The bridge forwards it to A under its destination's name; X receives it.
    let forwarded = got[0].1.message.destination.to_string();
    assert_eq!(forwarded, reply_to);
    let e = a.send(bridge_a, &forwarded, "answer", false);
    assert_eq!(to_conn(&e, x), ["answer"]);
}

#[test]
fn a_live_connections_temporary_queue_is_still_refused_to_others() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(2, None);
    // Whether or not the owner made the queue yet, and a network consumer too.
    for subscribed in [false, true] {
        if subscribed {
            h.subscribe(1, "r", "/temp-queue/r", AckMode::Auto, 10);
        }
        let e = h.cmd(subscribe_network_cmd(
            2,
            "x",
            "/remote-temp-queue/haven-1-r",
        ));
        assert_eq!(e.unwrap_err(), EngineError::NotOwner);
    }
    // A foreign temporary topic stays private too.
    let e = h.cmd(subscribe_network_cmd(
        2,
        "t",
        "/remote-temp-topic/haven-999-t",
    ));
    assert_eq!(e.unwrap_err(), EngineError::NotOwner);
    // Once the owner is gone the queue is foreign: open, and empty.
    h.send(2, "/remote-temp-queue/haven-1-r", "before-close", true);
    h.close(1);
    let e = h.ok(subscribe_network_cmd(
        2,
        "x",
        "/remote-temp-queue/haven-1-r",
    ));
    assert!(
        deliveries(&e).is_empty(),
        "the owner's queue went with it: {:?}",
        bodies(&e)
    );
    assert_eq!(temp_queues(&h)[0].consumers, 1);
}

#[test]
fn a_send_to_a_foreign_temporary_queue_nobody_subscribed_is_dropped() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(2, None);
    let e = h.send(2, "/remote-temp-queue/haven-999-r", "nobody", true);
    assert_eq!(receipts(&e), ["r-nobody"]);
    assert!(deliveries(&e).is_empty());
    assert!(temp_queues(&h).is_empty(), "nothing piles up");
    assert!(h.engine.queue_stats().is_empty());
    assert!(h.log.is_empty());
    let e = h.ok(subscribe_network_cmd(
        2,
        "x",
        "/remote-temp-queue/haven-999-r",
    ));
    assert!(
        deliveries(&e).is_empty(),
        "it was not kept: {:?}",
        bodies(&e)
    );
}

#[test]
fn origins_relogged_by_compaction_survive_a_crash_in_the_order_they_are_forgotten() {
    let cfg = EngineConfig {
        network_origins_max: 3,
        ..EngineConfig::default()
    };
    let mut h = Harness::new(cfg);
    h.connect(1, None);
    let first_lsn = h.next_lsn;
    for n in 1..=3 {
        h.now_ms += 1;
        send_with(&mut h, 1, &format!("o{n}"), origin(&format!("s/ID:{n}"))).unwrap();
    }
    // Compaction re-logs what the oldest record describes: o1's message and its origin, which
    // now has the newest record and goes to the back of the table (o2 is the oldest).
    assert_eq!(h.relocate(first_lsn + 1, 10), 2);
    h.truncate_dead_prefix();
    let live = h.engine.durable_producers();
    h.crash_and_recover();
    assert_eq!(h.engine.durable_producers(), live);
    h.connect(1, None);
    // A fourth origin forgets the oldest, o2, and not o1, as the running broker would have.
    send_with(&mut h, 1, "o4", origin("s/ID:4")).unwrap();
    assert_eq!(stored(&h), 4);
    send_with(&mut h, 1, "o1", origin("s/ID:1")).unwrap();
    assert_eq!(stored(&h), 4, "o1 is still remembered");
    send_with(&mut h, 1, "o2", origin("s/ID:2")).unwrap();
    assert_eq!(stored(&h), 5, "o2 was forgotten, so it is stored again");
    assert_eq!(h.engine.origin_stats().forgotten_total, 2);
}

/// A hub that several brokers forward to: while one source's bridge is down, the others'
/// traffic must not push out what it will resend. Forgetting by count takes from the source
/// holding the most origins, so the quiet one keeps its own, live and after a crash.
#[test]
fn a_busy_source_cannot_push_out_the_origins_a_quiet_source_will_resend() {
    let cfg = EngineConfig {
        network_origins_max: 6,
        ..EngineConfig::default()
    };
    let mut h = Harness::new(cfg);
    h.connect(1, None);
    for n in 1..=2 {
        send_with(
            &mut h,
            1,
            &format!("q{n}"),
            origin(&format!("quiet/ID:{n}")),
        )
        .unwrap();
    }
    // The busy source sends five times the table's room while the quiet one is away.
    for n in 1..=30 {
        h.now_ms += 1;
        send_with(&mut h, 1, &format!("b{n}"), origin(&format!("busy/ID:{n}"))).unwrap();
    }
    assert_eq!(stored(&h), 32);
    let stats = h.engine.origin_stats();
    assert_eq!(
        (
            stats.sources,
            stats.forgotten_total,
            stats.forgotten_for_room_total
        ),
        (2, 26, 26),
        "all from the busy source, for room"
    );
    let live = h.engine.durable_producers();
    h.crash_and_recover();
    assert_eq!(
        h.engine.durable_producers(),
        live,
        "replay forgets the same ones"
    );
    h.connect(1, None);
    // The quiet source comes back and resends what it had in flight: both are known.
    for n in 1..=2 {
        let e = send_with(
            &mut h,
            1,
            &format!("q{n}"),
            origin(&format!("quiet/ID:{n}")),
        )
        .unwrap();
        assert_eq!(receipts(&e), [format!("r-q{n}")]);
    }
    assert_eq!(stored(&h), 32, "the resends were duplicates");
    // The busy source kept its newest four; its older ones went first.
    send_with(&mut h, 1, "b30", origin("busy/ID:30")).unwrap();
    assert_eq!(stored(&h), 32);
    send_with(&mut h, 1, "b26", origin("busy/ID:26")).unwrap();
    assert_eq!(stored(&h), 33, "busy/ID:26 was forgotten");
    // The table is full: the busy source (four, then five with b26) still gives way first.
    assert_eq!(h.engine.origin_stats().remembered, 6);
    let e = send_with(&mut h, 1, "q1", origin("quiet/ID:1")).unwrap();
    assert_eq!(receipts(&e), ["r-q1"]);
    assert_eq!(stored(&h), 33);
}
