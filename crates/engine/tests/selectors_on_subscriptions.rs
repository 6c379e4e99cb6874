//! JMS selectors on SUBSCRIBE: queue consumers, topic subscribers, durable subscriptions.

mod support;

use bytes::Bytes;
use haven_engine::selector::Selector;
use haven_engine::*;
use support::*;

fn sub(conn: ConnId, id: &str, dest: &str, selector: &str, durable: Option<&str>) -> Command {
    Command::Subscribe {
        conn,
        sub_id: id.into(),
        destination: Destination::parse(dest, conn).unwrap(),
        ack: AckMode::ClientIndividual,
        prefetch: 100,
        durable_name: durable.map(str::to_string),
        options: SubscribeOptions {
            selector: Some(Selector::parse(selector).unwrap()),
            ..Default::default()
        },
        receipt: None,
    }
}

fn send(h: &mut Harness, dest: &str, body: &str, color: &str) -> Vec<Effect> {
    h.ok(Command::Send {
        conn: 1,
        destination: Destination::parse(dest, 1).unwrap(),
        message: NewMessage {
            headers: haven_engine::Headers::from_pairs(&[("color", color)]),
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

#[test]
fn queue_consumers_receive_only_what_their_selector_takes_and_the_rest_waits() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(2, None);
    h.ok(sub(2, "red", "/queue/q", "color = 'red'", None));
    assert_eq!(
        bodies(&send(&mut h, "/queue/q", "b1", "blue")),
        Vec::<String>::new()
    );
    assert_eq!(
        bodies(&send(&mut h, "/queue/q", "r1", "red")),
        vec!["r1"],
        "not blocked by the blue one ahead"
    );
    // A consumer for blue arrives: the waiting blue message goes to it.
    h.connect(3, None);
    let e = h.ok(sub(3, "blue", "/queue/q", "color = 'blue'", None));
    assert_eq!(bodies(&e), vec!["b1"]);
}

#[test]
fn topic_and_durable_subscriptions_keep_only_selected_messages() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    h.connect(2, Some("app"));
    h.ok(sub(
        2,
        "live",
        "/topic/t",
        "color IN ('red', 'green')",
        None,
    ));
    h.ok(sub(2, "d", "/topic/t", "color = 'green'", Some("greens")));
    let e = send(&mut h, "/topic/t", "red", "red");
    assert_eq!(bodies(&e), vec!["red"]);
    let e = send(&mut h, "/topic/t", "green", "green");
    assert_eq!(bodies(&e).len(), 2);
    send(&mut h, "/topic/t", "blue", "blue");
    // The durable subscription's selector is durable too.
    h.close(2);
    send(&mut h, "/topic/t", "green2", "green");
    send(&mut h, "/topic/t", "red2", "red");
    h.crash_and_recover();
    h.connect(2, Some("app"));
    let e = h.ok(sub(2, "d", "/topic/t", "color = 'green'", Some("greens")));
    assert_eq!(bodies(&e), vec!["green", "green2"]);
    // Changing the selector starts the subscription afresh (JMS semantics).
    h.ok(Command::Unsubscribe {
        conn: 2,
        sub_id: "d".into(),
        durable_name: None,
        receipt: None,
    });
    let e = h.ok(sub(2, "d", "/topic/t", "color = 'red'", Some("greens")));
    assert!(bodies(&e).is_empty());
}
