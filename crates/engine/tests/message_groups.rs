//! Message groups (`JMSXGroupID`): one consumer at a time per group, in order; the group moves
//! when its consumer leaves; `JMSXGroupSeq:-1` closes it; no fixed cap on groups.

mod support;

use bytes::Bytes;
use haven_engine::*;
use support::*;

fn send(h: &mut Harness, group: &str, body: &str, seq: Option<i64>) -> Vec<Effect> {
    let mut headers = vec![("JMSXGroupID".to_string(), group.to_string())];
    if let Some(s) = seq {
        headers.push(("JMSXGroupSeq".into(), s.to_string()));
    }
    h.ok(Command::Send {
        conn: 1,
        destination: Destination::Queue("g".into()),
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

fn owner_of(effects: &[Effect]) -> ConnId {
    let d = deliveries(effects);
    assert_eq!(d.len(), 1, "{d:?}");
    d[0].0
}

#[test]
fn a_group_sticks_to_one_consumer_in_order_and_moves_when_it_leaves() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    h.subscribe(2, "s", "/queue/g", AckMode::ClientIndividual, 100);
    h.subscribe(3, "s", "/queue/g", AckMode::ClientIndividual, 100);
    let a = owner_of(&send(&mut h, "A", "a1", None));
    let b = owner_of(&send(&mut h, "B", "b1", None));
    assert_ne!(a, b, "round-robin assigns new groups");
    for n in 2..6 {
        assert_eq!(
            owner_of(&send(&mut h, "A", &format!("a{n}"), None)),
            a,
            "group A stays on its consumer"
        );
        assert_eq!(owner_of(&send(&mut h, "B", &format!("b{n}"), None)), b);
    }
    // A's consumer leaves: its unacknowledged A messages and the group move to the other, in order.
    let e = h.close(a);
    let moved: Vec<String> = deliveries(&e)
        .iter()
        .map(|(_, d)| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect();
    assert_eq!(moved, vec!["a1", "a2", "a3", "a4", "a5"]);
    assert!(deliveries(&e).iter().all(|(c, _)| *c == b));
    assert_eq!(owner_of(&send(&mut h, "A", "a6", None)), b);
}

#[test]
fn a_full_owner_holds_its_group_back_without_blocking_other_groups() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    h.subscribe(2, "s", "/queue/g", AckMode::ClientIndividual, 1);
    h.subscribe(3, "s", "/queue/g", AckMode::ClientIndividual, 10);
    let e = send(&mut h, "A", "a1", None);
    let (owner, d) = deliveries(&e)[0].clone();
    assert_eq!(owner, 2);
    // The owner's prefetch (1) is full: a2 waits for it rather than going elsewhere.
    assert!(deliveries(&send(&mut h, "A", "a2", None)).is_empty());
    assert_eq!(
        owner_of(&send(&mut h, "B", "b1", None)),
        3,
        "other groups still flow"
    );
    let e = h.ack(2, d.ack_tag);
    assert_eq!(bodies(&e), vec!["a2"]);
}

#[test]
fn group_seq_minus_one_closes_the_group() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    h.subscribe(2, "s", "/queue/g", AckMode::ClientIndividual, 100);
    h.subscribe(3, "s", "/queue/g", AckMode::ClientIndividual, 100);
    let first = owner_of(&send(&mut h, "A", "a1", Some(1)));
    assert_eq!(owner_of(&send(&mut h, "A", "a-last", Some(-1))), first);
    // Closed: the next message of A is assigned afresh (round-robin moves on).
    let next = owner_of(&send(&mut h, "A", "a-new", Some(1)));
    assert_ne!(next, first);
}

#[test]
fn many_groups_never_merge() {
    let mut h = Harness::new(EngineConfig::default());
    for c in 1..=3 {
        h.connect(c, None);
    }
    h.subscribe(2, "s", "/queue/g", AckMode::Auto, 100_000);
    h.subscribe(3, "s", "/queue/g", AckMode::Auto, 100_000);
    let mut owners = std::collections::HashMap::new();
    for round in 0..2 {
        for g in 0..1_500 {
            let o = owner_of(&send(
                &mut h,
                &format!("group-{g}"),
                &format!("{round}"),
                None,
            ));
            assert_eq!(
                *owners.entry(g).or_insert(o),
                o,
                "group {g} changed consumer"
            );
        }
    }
}
