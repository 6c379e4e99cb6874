//! ActiveMQ-compatible delivery semantics as a client sees them: queues, topics, priority,
//! expiry, persistence across restarts, durable subscriptions, temporary queues, NACK and the
//! dead-letter queue, transactions.

mod common;

use common::{frame, Broker, Client};
use haven_stomp::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_round_robins_over_its_consumers() {
    let broker = Broker::start().await;
    let mut a = broker.client().await;
    let mut b = broker.client().await;
    a.subscribe("a", "/queue/rr", &[]).await;
    b.subscribe("b", "/queue/rr", &[]).await;
    let mut p = broker.client().await;
    for i in 0..6 {
        p.put("/queue/rr", &i.to_string(), &[]).await;
    }
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    for _ in 0..3 {
        got_a.push(a.message_body().await.parse::<u32>().unwrap());
        got_b.push(b.message_body().await.parse::<u32>().unwrap());
    }
    // Alternating: one consumer has the even messages, the other the odd ones, each in order.
    let (evens, odds) = if got_a[0] == 0 {
        (got_a, got_b)
    } else {
        (got_b, got_a)
    };
    assert_eq!(evens, vec![0, 2, 4]);
    assert_eq!(odds, vec![1, 3, 5]);
    for c in [a, b, p] {
        c.disconnect().await;
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_reaches_only_the_subscribers_present_at_send_time() {
    let broker = Broker::start().await;
    let mut early = broker.client().await;
    early.subscribe("1", "/topic/news", &[]).await;
    let mut p = broker.client().await;
    p.put("/topic/news", "first", &[]).await;
    let mut late = broker.client().await;
    late.subscribe("1", "/topic/news", &[]).await;
    p.put("/topic/news", "second", &[]).await;
    assert_eq!(early.message_body().await, "first");
    assert_eq!(early.message_body().await, "second");
    assert_eq!(late.message_body().await, "second", "late subscriber");
    // A topic message with no subscriber at all is simply gone.
    p.put("/topic/empty", "nobody", &[]).await;
    let mut later = broker.client().await;
    later.subscribe("1", "/topic/empty", &[]).await;
    p.put("/topic/empty", "somebody", &[]).await;
    assert_eq!(later.message_body().await, "somebody");
    for c in [early, late, later, p] {
        c.disconnect().await;
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn higher_priority_first_then_arrival_order() {
    let broker = Broker::start().await;
    let mut p = broker.client().await;
    for (body, priority) in [
        ("low-1", "1"),
        ("high-1", "9"),
        ("mid-1", "4"),
        ("high-2", "9"),
        ("low-2", "1"),
        ("mid-2", "4"),
    ] {
        p.put("/queue/prio", body, &[("priority", priority)]).await;
    }
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/prio", &[]).await;
    let mut order = Vec::new();
    for _ in 0..6 {
        order.push(c.message_body().await);
    }
    assert_eq!(
        order,
        ["high-1", "high-2", "mid-1", "mid-2", "low-1", "low-2"]
    );
    c.disconnect().await;
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_message_is_never_delivered() {
    let broker = Broker::start().await;
    let past = (now_ms() - 1_000).to_string();
    let future = (now_ms() + 3_600_000).to_string();
    let mut p = broker.client().await;
    // Stored while nobody listens.
    p.put("/queue/exp", "stale", &[("expires", &past)]).await;
    p.put("/queue/exp", "fresh", &[("expires", &future)]).await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/exp", &[]).await;
    assert_eq!(c.message_body().await, "fresh");
    // Sent while a consumer waits.
    p.put("/queue/exp", "stale-live", &[("expires", &past)])
        .await;
    p.put("/queue/exp", "marker", &[]).await;
    assert_eq!(c.message_body().await, "marker");
    c.disconnect().await;
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn persistent_messages_survive_a_restart_and_non_persistent_ones_do_not() {
    let mut broker = Broker::start().await;
    let mut p = broker.client().await;
    p.put("/queue/restart", "explicit", &[("persistent", "true")])
        .await;
    p.put("/queue/restart", "transient", &[("persistent", "false")])
        .await;
    p.put("/queue/restart", "by-default", &[]).await;
    p.disconnect().await;
    broker.restart().await;

    let mut c = broker.client().await;
    c.subscribe("1", "/queue/restart", &[]).await;
    assert_eq!(c.message_body().await, "explicit");
    assert_eq!(c.message_body().await, "by-default");
    c.put("/queue/restart", "marker", &[]).await;
    assert_eq!(c.message_body().await, "marker", "transient survived");
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn default_persistence_can_follow_activemq() {
    let mut broker = Broker::start_with(|c| c.broker.default_persistent = false).await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/dp-live", &[]).await;
    c.put("/queue/dp-live", "plain", &[]).await;
    let m = c.message().await;
    assert_eq!(m.header("persistent"), Some("false"), "{m:?}");
    c.put("/queue/dp", "plain", &[]).await;
    c.put("/queue/dp", "asked", &[("persistent", "true")]).await;
    c.disconnect().await;
    broker.restart().await;

    let mut c = broker.client().await;
    c.subscribe("1", "/queue/dp", &[]).await;
    assert_eq!(c.message_body().await, "asked");
    c.put("/queue/dp", "marker", &[]).await;
    assert_eq!(c.message_body().await, "marker", "non-persistent survived");
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_durable_topic_subscription_keeps_messages_across_a_restart() {
    let mut broker = Broker::start().await;
    let who = [("accept-version", "1.2"), ("client-id", "dur-app")];
    let durable = [("activemq.subscriptionName", "orders")];

    let mut c = Client::connect(broker.addr(), &who).await;
    c.subscribe("1", "/topic/orders", &durable).await;
    c.disconnect().await;

    let mut p = broker.client().await;
    p.put("/topic/orders", "while-offline", &[]).await;
    p.disconnect().await;
    broker.restart().await;
    let mut p = broker.client().await;
    p.put("/topic/orders", "after-restart", &[]).await;

    let mut c = Client::connect(broker.addr(), &who).await;
    c.subscribe("1", "/topic/orders", &durable).await;
    assert_eq!(c.message_body().await, "while-offline");
    assert_eq!(c.message_body().await, "after-restart");

    // UNSUBSCRIBE with the name removes it: nothing is kept for it afterwards.
    c.send_receipted(
        frame(
            Command::Unsubscribe,
            &[("id", "1"), ("activemq.subscriptionName", "orders")],
            "",
        ),
        "unsub",
    )
    .await;
    c.disconnect().await;
    p.put("/topic/orders", "after-removal", &[]).await;
    let mut c = Client::connect(broker.addr(), &who).await;
    c.subscribe("1", "/topic/orders", &durable).await;
    p.put("/topic/orders", "fresh", &[]).await;
    assert_eq!(
        c.message_body().await,
        "fresh",
        "removed subscription kept messages"
    );
    c.disconnect().await;
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn temp_queue_request_reply() {
    let broker = Broker::start().await;
    let mut service = broker.client().await;
    service.subscribe("svc", "/queue/service", &[]).await;
    let mut requester = broker.client().await;
    requester
        .subscribe("replies", "/temp-queue/replies", &[])
        .await;
    requester
        .put(
            "/queue/service",
            "ping",
            &[
                ("reply-to", "/temp-queue/replies"),
                ("correlation-id", "42"),
            ],
        )
        .await;

    let request = service.message().await;
    assert_eq!(&request.body[..], b"ping");
    let reply_to = request.header("reply-to").expect("reply-to").to_string();
    assert_ne!(
        reply_to, "/temp-queue/replies",
        "reply-to must name the requester's queue, not the service's own"
    );
    service
        .put(&reply_to, "pong", &[("correlation-id", "42")])
        .await;
    let reply = requester.message().await;
    assert_eq!(&reply.body[..], b"pong");
    assert_eq!(reply.header("correlation-id"), Some("42"));
    assert_eq!(reply.header("subscription"), Some("replies"));

    // Another connection's /temp-queue/replies is its own queue, not the requester's.
    let mut other = broker.client().await;
    other.subscribe("mine", "/temp-queue/replies", &[]).await;
    service
        .put(&reply_to, "second", &[("correlation-id", "43")])
        .await;
    assert_eq!(requester.message_body().await, "second");
    other.put("/temp-queue/replies", "own", &[]).await;
    assert_eq!(other.message_body().await, "own");

    // Once the requester is gone so is its queue: a late reply is dropped, not an error.
    requester.disconnect().await;
    service.put(&reply_to, "too late", &[]).await;
    other.disconnect().await;
    service.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nack_redelivers_then_dead_letters() {
    let broker = Broker::start_with(|c| c.delivery.redeliveries_max = 1).await;
    let mut p = broker.client().await;
    p.put("/queue/work", "poison", &[]).await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/work", &[("ack", "client-individual")])
        .await;

    let first = c.message().await;
    assert_eq!(first.header("redelivered"), Some("false"));
    let ack = first.header("ack").expect("ack").to_string();
    c.send(&frame(Command::Nack, &[("id", &ack)], "")).await;

    let second = c.message().await;
    assert_eq!(&second.body[..], b"poison");
    assert_eq!(second.header("redelivered"), Some("true"), "{second:?}");
    assert_eq!(second.header("message-id"), first.header("message-id"));
    let ack = second.header("ack").expect("ack").to_string();
    c.send_receipted(frame(Command::Nack, &[("id", &ack)], ""), "nack-2")
        .await;

    // Redeliveries exhausted: the message is in the DLQ, not back on the queue.
    let mut dlq = broker.client().await;
    dlq.subscribe("d", "/queue/ActiveMQ.DLQ", &[]).await;
    let dead = dlq.message().await;
    assert_eq!(&dead.body[..], b"poison");
    p.put("/queue/work", "next", &[]).await;
    assert_eq!(
        c.message_body().await,
        "next",
        "poison came back to the queue"
    );
    for x in [c, dlq, p] {
        x.disconnect().await;
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unacked_messages_are_redelivered_when_a_consumer_goes_away() {
    let broker = Broker::start().await;
    let mut p = broker.client().await;
    p.put("/queue/unacked", "m", &[]).await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/unacked", &[("ack", "client")])
        .await;
    let m = c.message().await;
    assert_eq!(m.header("redelivered"), Some("false"));
    drop(c); // no ACK, no DISCONNECT
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/unacked", &[("ack", "client")])
        .await;
    let m = c.message().await;
    assert_eq!(&m.body[..], b"m");
    assert_eq!(m.header("redelivered"), Some("true"), "{m:?}");
    c.disconnect().await;
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_ack_is_cumulative_and_client_individual_is_not() {
    let broker = Broker::start().await;
    let mut p = broker.client().await;
    for body in ["1", "2", "3"] {
        p.put("/queue/cumulative", body, &[]).await;
        p.put("/queue/individual", body, &[]).await;
    }
    for (queue, mode, left) in [
        ("/queue/cumulative", "client", vec!["3"]),
        ("/queue/individual", "client-individual", vec!["1", "3"]),
    ] {
        let mut c = broker.client().await;
        c.subscribe("1", queue, &[("ack", mode)]).await;
        let mut acks = Vec::new();
        for expected in ["1", "2", "3"] {
            let m = c.message().await;
            assert_eq!(String::from_utf8_lossy(&m.body), expected);
            acks.push(m.header("ack").unwrap().to_string());
        }
        // ACK the second only, then leave without acking the rest.
        c.send_receipted(frame(Command::Ack, &[("id", &acks[1])], ""), "ack-2")
            .await;
        drop(c);
        let mut c = broker.client().await;
        c.subscribe("1", queue, &[]).await;
        let mut redelivered = Vec::new();
        for _ in 0..left.len() {
            redelivered.push(c.message_body().await);
        }
        assert_eq!(redelivered, left, "ack:{mode}");
        c.put(queue, "marker", &[]).await;
        assert_eq!(c.message_body().await, "marker", "ack:{mode}");
        c.disconnect().await;
    }
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prefetch_bounds_unacknowledged_deliveries() {
    let broker = Broker::start().await;
    let mut p = broker.client().await;
    for body in ["1", "2", "3"] {
        p.put("/queue/prefetch", body, &[]).await;
    }
    let one = [("ack", "client-individual"), ("activemq.prefetchSize", "1")];
    let mut a = broker.client().await;
    a.subscribe("a", "/queue/prefetch", &one).await;
    let m1 = a.message().await;
    assert_eq!(&m1.body[..], b"1");
    // `a` has no credit left, so a newcomer gets the next message.
    let mut b = broker.client().await;
    b.subscribe("b", "/queue/prefetch", &one).await;
    assert_eq!(b.message_body().await, "2");
    // Acking frees `a`'s credit: it gets the third.
    let ack = m1.header("ack").unwrap().to_string();
    a.send(&frame(Command::Ack, &[("id", &ack)], "")).await;
    assert_eq!(a.message_body().await, "3");
    for c in [a, b, p] {
        c.disconnect().await;
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn transactions_commit_and_abort_sends_and_acks() {
    let broker = Broker::start().await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/tx", &[("ack", "client-individual")])
        .await;
    let mut p = broker.client().await;

    // Sends in a transaction appear only at COMMIT.
    p.send_receipted(frame(Command::Begin, &[("transaction", "t1")], ""), "b1")
        .await;
    for body in ["tx-1", "tx-2"] {
        let send = frame(
            Command::Send,
            &[("destination", "/queue/tx"), ("transaction", "t1")],
            body,
        );
        p.send_receipted(send, body).await;
    }
    p.put("/queue/tx", "outside", &[]).await;
    let m = c.message().await;
    assert_eq!(
        &m.body[..],
        b"outside",
        "a transactional SEND leaked before COMMIT"
    );
    let ack = m.header("ack").unwrap().to_string();
    c.send(&frame(Command::Ack, &[("id", &ack)], "")).await;
    p.send_receipted(frame(Command::Commit, &[("transaction", "t1")], ""), "c1")
        .await;
    let mut acks = Vec::new();
    for expected in ["tx-1", "tx-2"] {
        let m = c.message().await;
        assert_eq!(String::from_utf8_lossy(&m.body), expected);
        acks.push(m.header("ack").unwrap().to_string());
    }

    // Aborted sends never appear.
    p.send_receipted(frame(Command::Begin, &[("transaction", "t2")], ""), "b2")
        .await;
    let send = frame(
        Command::Send,
        &[("destination", "/queue/tx"), ("transaction", "t2")],
        "aborted",
    );
    p.send_receipted(send, "s2").await;
    p.send_receipted(frame(Command::Abort, &[("transaction", "t2")], ""), "a2")
        .await;

    // An ACK in an aborted transaction makes the message available again; one in a committed
    // transaction consumes it.
    c.send_receipted(frame(Command::Begin, &[("transaction", "t3")], ""), "b3")
        .await;
    c.send_receipted(
        frame(Command::Ack, &[("id", &acks[0]), ("transaction", "t3")], ""),
        "ack-in-t3",
    )
    .await;
    c.send_receipted(frame(Command::Abort, &[("transaction", "t3")], ""), "a3")
        .await;
    let again = c.message().await;
    assert_eq!(&again.body[..], b"tx-1", "aborted ACK did not release");
    assert_eq!(again.header("redelivered"), Some("true"));
    let again_ack = again.header("ack").unwrap().to_string();
    c.send_receipted(frame(Command::Begin, &[("transaction", "t4")], ""), "b4")
        .await;
    for (i, ack) in [again_ack, acks[1].clone()].iter().enumerate() {
        c.send_receipted(
            frame(Command::Ack, &[("id", ack), ("transaction", "t4")], ""),
            &format!("ack-in-t4-{i}"),
        )
        .await;
    }
    c.send_receipted(frame(Command::Commit, &[("transaction", "t4")], ""), "c4")
        .await;
    c.disconnect().await;

    // Nothing left: the committed acks consumed both, the aborted send never existed.
    let mut check = broker.client().await;
    check.subscribe("1", "/queue/tx", &[]).await;
    p.put("/queue/tx", "marker", &[]).await;
    assert_eq!(check.message_body().await, "marker");
    check.disconnect().await;
    p.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_owner_consumes_from_its_temp_queue() {
    let broker = Broker::start().await;
    let mut owner = broker.client().await;
    owner.subscribe("r", "/temp-queue/private", &[]).await;
    owner
        .put("/queue/where", "x", &[("reply-to", "/temp-queue/private")])
        .await;
    let mut snoop = broker.client().await;
    snoop.subscribe("w", "/queue/where", &[]).await;
    let reply_to = snoop
        .message()
        .await
        .header("reply-to")
        .unwrap()
        .to_string();
    snoop
        .send(&frame(
            Command::Subscribe,
            &[("id", "steal"), ("destination", &reply_to)],
            "",
        ))
        .await;
    snoop.error_then_close("another connection").await;
    // The owner still gets its replies.
    let mut service = broker.client().await;
    service.put(&reply_to, "for the owner", &[]).await;
    assert_eq!(owner.message_body().await, "for the owner");
    service.disconnect().await;
    owner.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_transaction_is_rolled_back_when_its_connection_closes() {
    let broker = Broker::start().await;
    let mut p = broker.client().await;
    p.send_receipted(frame(Command::Begin, &[("transaction", "t")], ""), "b")
        .await;
    let send = frame(
        Command::Send,
        &[("destination", "/queue/tx-open"), ("transaction", "t")],
        "never committed",
    );
    p.send_receipted(send, "s").await;
    p.disconnect().await;
    let mut c = broker.client().await;
    c.subscribe("1", "/queue/tx-open", &[]).await;
    c.put("/queue/tx-open", "marker", &[]).await;
    assert_eq!(c.message_body().await, "marker");
    c.disconnect().await;
    broker.stop().await;
}
