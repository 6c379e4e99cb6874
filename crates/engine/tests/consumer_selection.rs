//! Exclusive consumers and consumer priority (ActiveMQ's `activemq.exclusive`,
//! `activemq.priority`).

mod support;

use haven_engine::*;
use support::*;

fn subscribe_with(
    h: &mut Harness,
    conn: ConnId,
    sub: &str,
    options: SubscribeOptions,
) -> Vec<Effect> {
    h.ok(Command::Subscribe {
        conn,
        sub_id: sub.into(),
        destination: Destination::Queue("work".into()),
        ack: AckMode::ClientIndividual,
        prefetch: 100,
        durable_name: None,
        options,
        receipt: None,
    })
}

#[test]
fn exclusive_consumer_gets_everything_and_hands_over_when_it_leaves() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=4 {
        h.connect(c, None);
    }
    subscribe_with(&mut h, 2, "s", SubscribeOptions::default());
    subscribe_with(
        &mut h,
        3,
        "s",
        SubscribeOptions {
            exclusive: true,
            ..Default::default()
        },
    );
    subscribe_with(
        &mut h,
        4,
        "s",
        SubscribeOptions {
            exclusive: true,
            ..Default::default()
        },
    );
    let mut to = Vec::new();
    for n in 0..5 {
        to.extend(
            deliveries(&h.send(1, "/queue/work", &format!("m{n}"), true))
                .iter()
                .map(|(c, _)| *c),
        );
    }
    assert_eq!(to, vec![3; 5], "the first exclusive consumer alone");
    // It leaves: its unacknowledged messages and new ones go to the next exclusive consumer.
    let e = h.close(3);
    let d = deliveries(&e);
    assert_eq!(d.len(), 5);
    assert!(d.iter().all(|(c, d)| *c == 4 && d.redelivered));
    let e = h.send(1, "/queue/work", "after", true);
    assert_eq!(deliveries(&e)[0].0, 4);
    // No exclusive consumer left: back to sharing.
    h.close(4);
    let e = h.send(1, "/queue/work", "shared", true);
    assert_eq!(deliveries(&e).last().unwrap().0, 2);
}

#[test]
fn higher_priority_consumers_are_served_first_while_they_have_room() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    let sub = |prefetch: u32, priority: u8| Command::Subscribe {
        conn: 0,
        sub_id: "s".into(),
        destination: Destination::Queue("work".into()),
        ack: AckMode::ClientIndividual,
        prefetch,
        durable_name: None,
        options: SubscribeOptions {
            priority,
            ..Default::default()
        },
        receipt: None,
    };
    let with_conn = |c: Command, conn: ConnId| match c {
        Command::Subscribe {
            sub_id,
            destination,
            ack,
            prefetch,
            durable_name,
            options,
            receipt,
            ..
        } => Command::Subscribe {
            conn,
            sub_id,
            destination,
            ack,
            prefetch,
            durable_name,
            options,
            receipt,
        },
        _ => unreachable!(),
    };
    h.ok(with_conn(sub(10, 0), 2));
    h.ok(with_conn(sub(2, 9), 3));
    let mut to = Vec::new();
    for n in 0..4 {
        to.extend(
            deliveries(&h.send(1, "/queue/work", &format!("m{n}"), true))
                .iter()
                .map(|(c, _)| *c),
        );
    }
    assert_eq!(
        to,
        vec![3, 3, 2, 2],
        "priority 9 until its prefetch (2) is full, then priority 0"
    );
}

#[test]
fn browsing_copies_the_queue_without_consuming_then_marks_the_end() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(2, None);
    for n in 0..3 {
        h.send(1, "/queue/work", &format!("m{n}"), true);
    }
    let browse = Command::Subscribe {
        conn: 2,
        sub_id: "b".into(),
        destination: Destination::Queue("work".into()),
        ack: AckMode::Auto,
        prefetch: 100,
        durable_name: None,
        options: SubscribeOptions {
            browser: true,
            ..Default::default()
        },
        receipt: None,
    };
    let e = h.ok(browse);
    let d = deliveries(&e);
    let shown: Vec<String> = d
        .iter()
        .map(|(_, d)| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect();
    assert_eq!(shown, vec!["m0", "m1", "m2", ""]);
    assert_eq!(
        d.last().unwrap().1.message.headers,
        haven_engine::Headers::from_pairs(&[("browser", "end")])
    );
    // Nothing was consumed: a real consumer still gets all three; the browser gets no more.
    h.ok(Command::Unsubscribe {
        conn: 2,
        sub_id: "b".into(),
        durable_name: None,
        receipt: None,
    });
    let e = h.subscribe(2, "c", "/queue/work", AckMode::ClientIndividual, 100);
    assert_eq!(bodies(&e), vec!["m0", "m1", "m2"]);
}
