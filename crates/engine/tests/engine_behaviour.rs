//! Broker semantics a STOMP user would notice, driven through the engine alone.

mod support;

use haven_engine::*;
use support::*;

fn held(
    contents: &std::collections::BTreeMap<QueueKey, std::collections::BTreeSet<u64>>,
    queue: &str,
) -> usize {
    contents
        .get(&QueueKey::Queue(queue.into()))
        .map_or(0, |s| s.len())
}

fn cfg() -> EngineConfig {
    EngineConfig::default()
}

#[test]
fn queue_round_robins_over_consumers_with_credit() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.connect(2, None);
    h.connect(3, None);
    h.subscribe(2, "a", "/queue/q", AckMode::ClientIndividual, 1);
    h.subscribe(3, "b", "/queue/q", AckMode::ClientIndividual, 1);
    let e1 = h.send(1, "/queue/q", "m1", true);
    let e2 = h.send(1, "/queue/q", "m2", true);
    let e3 = h.send(1, "/queue/q", "m3", true);
    let d1 = deliveries(&e1);
    let d2 = deliveries(&e2);
    assert_eq!(d1.len(), 1);
    assert_eq!(d2.len(), 1);
    assert_ne!(
        d1[0].0, d2[0].0,
        "second message goes to the other consumer"
    );
    assert!(deliveries(&e3).is_empty(), "no consumer has credit left");
    assert_eq!(receipts(&e3), vec!["r-m3"]);
    // Acking frees credit and the waiting message flows.
    let more = h.ack(d1[0].0, d1[0].1.ack_tag);
    assert_eq!(bodies(&more), vec!["m3"]);
}

#[test]
fn topic_reaches_every_subscriber_present_at_send_time() {
    let mut h = Harness::new(cfg());
    for c in 1..=3 {
        h.connect(c, None);
    }
    h.subscribe(2, "s", "/topic/t", AckMode::Auto, 100);
    let e = h.send(1, "/topic/t", "early", true);
    assert_eq!(bodies(&e), vec!["early"]);
    h.subscribe(3, "s", "/topic/t", AckMode::Auto, 100);
    let e = h.send(1, "/topic/t", "late", true);
    let mut to: Vec<_> = deliveries(&e).iter().map(|(c, _)| *c).collect();
    to.sort();
    assert_eq!(to, vec![2, 3]);
    // No durable subscription: a topic send writes nothing to the log.
    assert!(h.log.is_empty());
}

#[test]
fn persistent_queue_messages_survive_a_crash_and_come_back_redelivered() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.connect(2, None);
    h.subscribe(2, "s", "/queue/q", AckMode::ClientIndividual, 10);
    let e = h.send(1, "/queue/q", "a", true);
    h.send(1, "/queue/q", "b", true);
    h.send(1, "/queue/q", "np", false);
    let tag = deliveries(&e)[0].1.ack_tag;
    h.ack(2, tag);
    let before = h.engine.durable_contents();
    h.crash_and_recover();
    assert_eq!(h.engine.durable_contents(), before);
    h.connect(3, None);
    let e = h.subscribe(3, "s", "/queue/q", AckMode::ClientIndividual, 10);
    let d = deliveries(&e);
    assert_eq!(
        bodies(&e),
        vec!["b"],
        "acked message stays gone; non-persistent is lost by design"
    );
    assert!(
        d[0].1.redelivered,
        "may have been delivered before the crash"
    );
}

#[test]
fn client_ack_is_cumulative_and_individual_is_not() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.subscribe(1, "c", "/queue/c", AckMode::Client, 10);
    h.subscribe(1, "i", "/queue/i", AckMode::ClientIndividual, 10);
    let mut ctags = vec![];
    let mut itags = vec![];
    for n in 0..3 {
        ctags.push(
            deliveries(&h.send(1, "/queue/c", &format!("c{n}"), true))[0]
                .1
                .ack_tag,
        );
        itags.push(
            deliveries(&h.send(1, "/queue/i", &format!("i{n}"), true))[0]
                .1
                .ack_tag,
        );
    }
    h.ack(1, ctags[1]);
    h.ack(1, itags[1]);
    let before = h.engine.durable_contents();
    assert_eq!(held(&before, "c"), 1, "c0 and c1 acked together");
    assert_eq!(held(&before, "i"), 2, "only i1 acked");
    // An ack of something already acked is an error and changes nothing.
    let err = h
        .cmd(Command::Ack {
            conn: 1,
            ack: AckRef::Tag(ctags[0]),
            transaction: None,
            receipt: None,
        })
        .unwrap_err();
    assert!(matches!(err, EngineError::UnknownAck(_)));
}

#[test]
fn stomp_1_0_acks_by_message_id() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.subscribe(1, "s", "/queue/q", AckMode::ClientIndividual, 10);
    let d = deliveries(&h.send(1, "/queue/q", "x", true));
    let id = d[0].1.message.id.clone();
    h.ok(Command::Ack {
        conn: 1,
        ack: AckRef::MessageId {
            message_id: id,
            subscription: None,
        },
        transaction: None,
        receipt: None,
    });
    assert_eq!(held(&h.engine.durable_contents(), "q"), 0);
}

#[test]
fn nack_redelivers_then_dead_letters_after_the_limit() {
    let mut h = Harness::new(EngineConfig {
        redeliveries_max: 2,
        ..cfg()
    });
    h.connect(1, None);
    h.subscribe(1, "s", "/queue/work", AckMode::ClientIndividual, 1);
    let mut e = h.send(1, "/queue/work", "poison", true);
    for attempt in 1..=3 {
        let d = deliveries(&e);
        assert_eq!(d.len(), 1, "attempt {attempt}");
        assert_eq!(d[0].1.delivery_count, attempt);
        assert_eq!(d[0].1.redelivered, attempt > 1);
        e = h.nack(1, d[0].1.ack_tag);
    }
    assert!(deliveries(&e).is_empty());
    let contents = h.engine.durable_contents();
    assert_eq!(held(&contents, "work"), 0);
    assert_eq!(held(&contents, "ActiveMQ.DLQ"), 1);
    // The move is durable.
    h.crash_and_recover();
    assert_eq!(h.engine.durable_contents(), contents);
    h.connect(2, None);
    let e = h.subscribe(2, "d", "/queue/ActiveMQ.DLQ", AckMode::Auto, 10);
    assert_eq!(bodies(&e), vec!["poison"]);
}

#[test]
fn per_destination_dlq() {
    let mut h = Harness::new(EngineConfig {
        redeliveries_max: 0,
        dlq: DlqPolicy::PerDestination {
            prefix: "DLQ.".into(),
        },
        ..cfg()
    });
    h.connect(1, None);
    h.subscribe(1, "s", "/queue/orders", AckMode::ClientIndividual, 1);
    let d = deliveries(&h.send(1, "/queue/orders", "x", true));
    h.nack(1, d[0].1.ack_tag);
    assert_eq!(held(&h.engine.durable_contents(), "DLQ.orders"), 1);
}

#[test]
fn closing_a_connection_redelivers_its_unacked_messages() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.connect(2, None);
    h.subscribe(1, "s", "/queue/q", AckMode::Client, 10);
    h.send(2, "/queue/q", "a", true);
    h.send(2, "/queue/q", "b", true);
    h.close(1);
    h.connect(3, None);
    let e = h.subscribe(3, "s", "/queue/q", AckMode::Client, 10);
    let d = deliveries(&e);
    assert_eq!(bodies(&e), vec!["a", "b"]);
    assert!(d
        .iter()
        .all(|(_, d)| d.redelivered && d.delivery_count == 2));
}

#[test]
fn transaction_commit_is_one_record_and_abort_makes_acked_messages_available() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.connect(2, None);
    h.subscribe(2, "s", "/queue/out", AckMode::ClientIndividual, 10);
    h.ok(Command::Begin {
        conn: 1,
        transaction: "t1".into(),
        receipt: None,
    });
    assert!(deliveries(&h.send_tx(1, "/queue/out", "x", true, Some("t1"))).is_empty());
    h.send_tx(1, "/queue/out", "y", true, Some("t1"));
    let log_before = h.log.len();
    let e = h.ok(Command::Commit {
        conn: 1,
        transaction: "t1".into(),
        receipt: Some("c".into()),
        producer: None,
    });
    assert_eq!(bodies(&e), vec!["x", "y"]);
    assert_eq!(
        h.log.len(),
        log_before + 1,
        "one atomic record for the commit"
    );
    // Ack both inside a transaction, then abort: both come back.
    let tags: Vec<u64> = deliveries(&e).iter().map(|(_, d)| d.ack_tag).collect();
    h.ok(Command::Begin {
        conn: 2,
        transaction: "t2".into(),
        receipt: None,
    });
    for t in &tags {
        h.ok(Command::Ack {
            conn: 2,
            ack: AckRef::Tag(*t),
            transaction: Some("t2".into()),
            receipt: None,
        });
    }
    let e = h.ok(Command::Abort {
        conn: 2,
        transaction: "t2".into(),
        receipt: None,
    });
    let d = deliveries(&e);
    assert_eq!(bodies(&e), vec!["x", "y"]);
    assert!(d.iter().all(|(_, d)| d.redelivered));
    // Ack inside a committed transaction removes them.
    h.ok(Command::Begin {
        conn: 2,
        transaction: "t3".into(),
        receipt: None,
    });
    for (_, dd) in &d {
        h.ok(Command::Ack {
            conn: 2,
            ack: AckRef::Tag(dd.ack_tag),
            transaction: Some("t3".into()),
            receipt: None,
        });
    }
    h.ok(Command::Commit {
        conn: 2,
        transaction: "t3".into(),
        receipt: None,
        producer: None,
    });
    assert_eq!(held(&h.engine.durable_contents(), "out"), 0);
    assert!(matches!(
        h.cmd(Command::Commit {
            conn: 2,
            transaction: "t3".into(),
            receipt: None,
            producer: None
        }),
        Err(EngineError::UnknownTransaction(_))
    ));
}

#[test]
fn durable_subscription_keeps_messages_offline_and_across_restart() {
    let mut h = Harness::new(cfg());
    h.connect(1, Some("app"));
    h.connect(2, None);
    let sub = |conn| Command::Subscribe {
        conn,
        sub_id: "d".into(),
        destination: Destination::Topic("news".into()),
        ack: AckMode::ClientIndividual,
        prefetch: 10,
        durable_name: Some("feed".into()),
        options: Default::default(),
        receipt: None,
    };
    h.ok(sub(1));
    h.send(2, "/topic/news", "one", true);
    h.close(1);
    h.send(2, "/topic/news", "two", true);
    h.crash_and_recover();
    h.connect(1, Some("app"));
    let e = h.ok(sub(1));
    assert_eq!(bodies(&e), vec!["one", "two"]);
    // Removing it by name drops what it held.
    h.ok(Command::Unsubscribe {
        conn: 1,
        sub_id: "d".into(),
        durable_name: Some("feed".into()),
        receipt: None,
    });
    assert!(h.engine.durable_contents().is_empty());
    h.crash_and_recover();
    assert!(h.engine.durable_contents().is_empty());
}

#[test]
fn durable_subscription_rules() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    let durable = |conn, dest: &str| Command::Subscribe {
        conn,
        sub_id: "d".into(),
        destination: Destination::parse(dest, conn).unwrap(),
        ack: AckMode::Auto,
        prefetch: 10,
        durable_name: Some("n".into()),
        options: Default::default(),
        receipt: None,
    };
    assert_eq!(
        h.cmd(durable(1, "/topic/t")).unwrap_err(),
        EngineError::DurableNeedsClientId
    );
    h.connect(2, Some("c"));
    assert!(matches!(
        h.cmd(durable(2, "/queue/q")),
        Err(EngineError::DurableNotTopic(_))
    ));
    h.ok(durable(2, "/topic/t"));
    assert!(matches!(
        h.cmd(Command::Connect {
            conn: 3,
            client_id: Some("c".into()),
            producer: None,
            session: 0,
        }),
        Err(EngineError::ClientIdInUse(_))
    ));
}

#[test]
fn priority_orders_higher_first_and_fifo_within_a_priority() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    for (body, p) in [("low1", 1), ("high1", 8), ("low2", 1), ("high2", 8)] {
        h.ok(Command::Send {
            conn: 1,
            destination: Destination::Queue("p".into()),
            message: NewMessage {
                headers: Default::default(),
                body: body.to_string().into(),
                persistent: true,
                priority: p,
                expires_ms: 0,
            },
            transaction: None,
            receipt: None,
            producer: None,
        });
    }
    let e = h.subscribe(1, "s", "/queue/p", AckMode::Auto, 100);
    assert_eq!(bodies(&e), vec!["high1", "high2", "low1", "low2"]);
}

#[test]
fn expired_messages_are_never_delivered() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.ok(Command::Send {
        conn: 1,
        destination: Destination::Queue("e".into()),
        message: NewMessage {
            headers: Default::default(),
            body: "old".into(),
            persistent: true,
            priority: 4,
            expires_ms: 2_000,
        },
        transaction: None,
        receipt: None,
        producer: None,
    });
    h.now_ms = 3_000;
    let e = h.subscribe(1, "s", "/queue/e", AckMode::Auto, 100);
    assert!(deliveries(&e).is_empty());
    assert_eq!(
        held(&h.engine.durable_contents(), "e"),
        0,
        "dropped durably"
    );
}

#[test]
fn temp_queue_request_reply_and_cleanup() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.connect(2, None);
    h.subscribe(1, "r", "/temp-queue/replies", AckMode::Auto, 10);
    let reply_to = Destination::parse("/temp-queue/replies", 1)
        .unwrap()
        .to_string();
    // The responder sends to the name it read in reply-to.
    let e = h.send(2, &reply_to, "answer", true);
    assert_eq!(deliveries(&e)[0].0, 1);
    assert_eq!(bodies(&e), vec!["answer"]);
    assert!(h.log.is_empty(), "temporary destinations are never logged");
    // Someone else cannot consume it.
    let other = Command::Subscribe {
        conn: 2,
        sub_id: "x".into(),
        destination: Destination::parse(&reply_to, 2).unwrap(),
        ack: AckMode::Auto,
        prefetch: 1,
        durable_name: None,
        options: Default::default(),
        receipt: None,
    };
    assert_eq!(h.cmd(other).unwrap_err(), EngineError::NotOwner);
    h.close(1);
    // The owner is gone: a late reply is dropped, not an error.
    let e = h.send(2, &reply_to, "late", true);
    assert!(deliveries(&e).is_empty());
    assert_eq!(h.engine.connection_count(), 1);
}

#[test]
fn auto_ack_needs_written_credit_before_more_flow() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    h.subscribe(1, "s", "/queue/q", AckMode::Auto, 2);
    for n in 0..5 {
        h.send(1, "/queue/q", &format!("m{n}"), true);
    }
    // The first two deliveries (tags 1 and 2) were written.
    let e = h.ok(Command::Credit {
        conn: 1,
        sub_id: "s".into(),
        up_to_tag: 2,
    });
    assert_eq!(bodies(&e), vec!["m2", "m3"]);
    // Credit naming tags already credited changes nothing.
    let e = h.ok(Command::Credit {
        conn: 1,
        sub_id: "s".into(),
        up_to_tag: 2,
    });
    assert!(deliveries(&e).is_empty());
}

#[test]
fn compaction_relogs_live_state_so_old_records_can_go() {
    let mut h = Harness::new(cfg());
    h.connect(1, Some("c"));
    h.ok(Command::Subscribe {
        conn: 1,
        sub_id: "d".into(),
        destination: Destination::Topic("t".into()),
        ack: AckMode::ClientIndividual,
        prefetch: 1,
        durable_name: Some("n".into()),
        options: Default::default(),
        receipt: None,
    });
    h.send(1, "/topic/t", "keep", true);
    h.subscribe(1, "q", "/queue/q", AckMode::ClientIndividual, 1000);
    for n in 0..50 {
        let d = deliveries(&h.send(1, "/queue/q", &format!("x{n}"), true));
        h.ack(1, d[0].1.ack_tag);
    }
    h.send(1, "/queue/q", "keep2", true);
    let before = h.engine.durable_contents();
    let limit = h.next_lsn;
    let mut out = Vec::new();
    let ctx = h.ctx();
    let n = h
        .engine
        .relocate_below(limit, 1000, u64::MAX, ctx, &mut out);
    assert_eq!(n, 3, "the durable subscription, its message and keep2");
    for o in out {
        if let Output::Log(r) = o {
            h.log.push((h.next_lsn, r.to_bytes()));
            h.next_lsn += 1;
        }
    }
    assert!(h.engine.min_live_lsn().unwrap() >= limit);
    h.truncate_dead_prefix();
    assert_eq!(h.log.len(), 3);
    h.crash_and_recover();
    assert_eq!(h.engine.durable_contents(), before);
}

/// A compaction call stops once the messages it re-logged reach its byte bound, and the next
/// goes on from there: a sparse segment of large messages is not re-logged (and its paged-out
/// messages not read back) all at once.
#[test]
fn compaction_relogs_at_most_its_bytes_per_call_and_the_next_call_goes_on() {
    let mut h = Harness::new(cfg());
    h.connect(1, None);
    let body = "x".repeat(10 * 1024);
    for _ in 0..10 {
        h.send(1, "/queue/big", &body, true);
    }
    let before = h.engine.durable_contents();
    let limit = h.next_lsn;
    let bytes_max = 25 * 1024;
    let mut calls = 0;
    while h.engine.min_live_lsn().is_some_and(|l| l < limit) {
        calls += 1;
        assert!(calls <= 10, "compaction made no progress");
        let mut out = Vec::new();
        let ctx = h.ctx();
        let n = h
            .engine
            .relocate_below(limit, 1000, bytes_max, ctx, &mut out);
        assert!(
            n > 0,
            "a call re-logs something while anything is below the limit"
        );
        let mut stored = 0;
        for o in out {
            if let Output::Log(r) = o {
                if matches!(r, Record::Store { .. }) {
                    stored += 1;
                }
                h.log.push((h.next_lsn, r.to_bytes()));
                h.next_lsn += 1;
            }
        }
        // Three 10 KiB messages reach 25 KiB: the bound stops the call after the third.
        assert!(stored <= 3, "{stored} messages re-logged in one call");
        h.engine.check_invariants();
    }
    assert!(
        calls >= 4,
        "10 messages of 10 KiB took {calls} calls at 25 KiB each"
    );
    h.truncate_dead_prefix();
    h.crash_and_recover();
    assert_eq!(h.engine.durable_contents(), before);
}

#[test]
fn redelivery_waits_for_its_delay_with_exponential_back_off() {
    let mut h = Harness::new(EngineConfig {
        redelivery_delay_initial_ms: 100,
        redelivery_backoff_multiplier: 5.0,
        redelivery_delay_max_ms: 1_000,
        ..cfg()
    });
    h.connect(1, None);
    h.subscribe(1, "s", "/queue/slow", AckMode::ClientIndividual, 10);
    let e = h.send(1, "/queue/slow", "x", true);
    let tick = |h: &mut Harness| {
        let mut out = Vec::new();
        let ctx = h.ctx();
        h.engine.tick(ctx, &mut out);
        h.engine.check_invariants();
        deliveries(
            &out.into_iter()
                .filter_map(|o| match o {
                    Output::Effect(e) => Some(e),
                    _ => None,
                })
                .collect::<Vec<_>>(),
        )
    };
    let start = h.now_ms;
    let mut tag = deliveries(&e)[0].1.ack_tag;
    // Waits after failures 1, 2, 3: 100 ms, 500 ms, then capped at 1,000 ms.
    for wait in [100u64, 500, 1_000] {
        assert!(
            deliveries(&h.nack(1, tag)).is_empty(),
            "not redelivered at once"
        );
        assert!(h.engine.has_delayed());
        h.now_ms += wait - 1;
        assert!(tick(&mut h).is_empty(), "not before {wait} ms");
        h.now_ms += 1;
        let d = tick(&mut h);
        assert_eq!(d.len(), 1, "due after {wait} ms");
        assert!(d[0].1.redelivered);
        tag = d[0].1.ack_tag;
    }
    assert_eq!(h.now_ms - start, 1_600);
    // A delayed message is still held durably: a crash makes it available at once.
    h.nack(1, tag);
    let before = h.engine.durable_contents();
    h.crash_and_recover();
    assert_eq!(h.engine.durable_contents(), before);
}

#[test]
fn expired_messages_can_go_to_the_dlq_instead() {
    let mut h = Harness::new(EngineConfig {
        expired_to_dlq: true,
        ..cfg()
    });
    h.connect(1, None);
    h.ok(Command::Send {
        conn: 1,
        destination: Destination::Queue("e".into()),
        message: NewMessage {
            headers: Default::default(),
            body: "late".into(),
            persistent: true,
            priority: 4,
            expires_ms: 2_000,
        },
        transaction: None,
        receipt: None,
        producer: None,
    });
    h.now_ms = 3_000;
    assert!(deliveries(&h.subscribe(1, "s", "/queue/e", AckMode::Auto, 100)).is_empty());
    let contents = h.engine.durable_contents();
    assert_eq!(held(&contents, "e"), 0);
    assert_eq!(held(&contents, "ActiveMQ.DLQ"), 1);
    h.crash_and_recover();
    assert_eq!(h.engine.durable_contents(), contents);
    h.connect(2, None);
    let e = h.subscribe(2, "d", "/queue/ActiveMQ.DLQ", AckMode::Auto, 10);
    let d = deliveries(&e);
    assert_eq!(bodies(&e), vec!["late"]);
    assert_eq!(d[0].1.message.expires_ms, 0, "no longer expires in the DLQ");
}

#[test]
fn redelivery_policy_follows_the_destination_pattern() {
    let mut h = Harness::new(EngineConfig {
        redeliveries_max: 6,
        redelivery_policies: vec![RedeliveryPolicy {
            destination: Destination::Queue("orders.>".into()),
            redeliveries_max: 1,
            delay_initial_ms: 0,
            backoff_multiplier: 1.0,
            delay_max_ms: 0,
        }],
        ..cfg()
    });
    h.connect(1, None);
    h.subscribe(1, "o", "/queue/orders.eu", AckMode::ClientIndividual, 1);
    h.subscribe(1, "x", "/queue/other", AckMode::ClientIndividual, 1);
    let mut o = deliveries(&h.send(1, "/queue/orders.eu", "order", true))[0]
        .1
        .ack_tag;
    let mut x = deliveries(&h.send(1, "/queue/other", "other", true))[0]
        .1
        .ack_tag;
    // orders.> allows one redelivery: the second failure dead-letters it.
    o = deliveries(&h.nack(1, o))[0].1.ack_tag;
    assert!(deliveries(&h.nack(1, o)).is_empty());
    assert_eq!(held(&h.engine.durable_contents(), "ActiveMQ.DLQ"), 1);
    // Other destinations keep the broker-wide six.
    for _ in 0..6 {
        x = deliveries(&h.nack(1, x))[0].1.ack_tag;
    }
    assert!(deliveries(&h.nack(1, x)).is_empty());
    assert_eq!(held(&h.engine.durable_contents(), "ActiveMQ.DLQ"), 2);
}
