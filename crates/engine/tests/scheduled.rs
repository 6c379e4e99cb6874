//! Scheduled delivery (`AMQ_SCHEDULED_*`): timetables, durability across crashes and
//! compaction, and the errors a bad schedule gets.

mod support;

use bytes::Bytes;
use haven_engine::*;
use support::*;

fn scheduled_send(
    h: &mut Harness,
    conn: ConnId,
    dest: &str,
    body: &str,
    headers: &[(&str, &str)],
    tx: Option<&str>,
) -> Result<Vec<Effect>, EngineError> {
    h.cmd(Command::Send {
        conn,
        destination: Destination::parse(dest, conn).unwrap(),
        message: NewMessage {
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: Bytes::from(body.to_string()),
            persistent: true,
            priority: 4,
            expires_ms: 0,
        },
        transaction: tx.map(str::to_string),
        receipt: None,
        producer: None,
    })
}

/// A consumer on `/queue/s` (auto ack, big prefetch) on connection 2.
fn consumer(h: &mut Harness) {
    h.connect(2, None);
    h.subscribe(2, "s", "/queue/s", AckMode::Auto, 1000);
}

#[test]
fn delay_holds_the_message_until_due() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    consumer(&mut h);
    let fx = scheduled_send(
        &mut h,
        1,
        "/queue/s",
        "later",
        &[("AMQ_SCHEDULED_DELAY", "5000")],
        None,
    )
    .unwrap();
    assert!(bodies(&fx).is_empty());
    assert_eq!(h.engine.scheduled_count(), 1);
    assert!(bodies(&h.tick(4_999)).is_empty());
    let fx = h.tick(1);
    assert_eq!(bodies(&fx), vec!["later"]);
    assert_eq!(h.engine.scheduled_count(), 0);
    assert!(bodies(&h.tick(100_000)).is_empty(), "fires once");
}

#[test]
fn period_and_repeat_deliver_repeat_plus_one_copies_with_fresh_ids() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    consumer(&mut h);
    let headers = [
        ("AMQ_SCHEDULED_DELAY", "1000"),
        ("AMQ_SCHEDULED_PERIOD", "500"),
        ("AMQ_SCHEDULED_REPEAT", "3"),
    ];
    scheduled_send(&mut h, 1, "/queue/s", "r", &headers, None).unwrap();
    let mut ids = Vec::new();
    let mut times = Vec::new();
    for _ in 0..100 {
        for (_, d) in deliveries(&h.tick(100)) {
            ids.push(d.message.id.clone());
            times.push(h.now_ms);
        }
    }
    let start = 1_000; // the harness clock at the send
    assert_eq!(
        times,
        vec![start + 1000, start + 1500, start + 2000, start + 2500]
    );
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), 4, "every firing is a new message: {ids:?}");
}

#[test]
fn cron_fires_on_each_matching_minute() {
    let mut h = Harness::new(EngineConfig::default());
    // 2026-01-01T00:00:30Z
    h.now_ms = 1_767_225_630_000;
    h.connect(1, None);
    consumer(&mut h);
    scheduled_send(
        &mut h,
        1,
        "/queue/s",
        "c",
        &[("AMQ_SCHEDULED_CRON", "*/2 * * * *")],
        None,
    )
    .unwrap();
    let mut times = Vec::new();
    for _ in 0..(5 * 60) {
        for _ in deliveries(&h.tick(1_000)) {
            times.push(h.now_ms);
        }
    }
    // Minutes 2 and 4 after midnight (ticks are 1 s apart, starting at :30).
    assert_eq!(times, vec![1_767_225_720_000, 1_767_225_840_000]);
    assert_eq!(h.engine.scheduled_count(), 1, "a cron schedule runs on");
}

#[test]
fn schedules_survive_a_crash_and_keep_counting() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    let headers = [
        ("AMQ_SCHEDULED_PERIOD", "1000"),
        ("AMQ_SCHEDULED_REPEAT", "4"),
    ];
    scheduled_send(&mut h, 1, "/queue/s", "p", &headers, None).unwrap();
    h.tick(0); // first firing (delay 0)
    h.tick(1_000); // second
    h.crash_and_recover();
    assert_eq!(h.engine.scheduled_count(), 1);
    h.connect(2, None);
    // The two fired copies are in the queue; three more firings remain.
    let mut n = bodies(&h.subscribe(2, "s", "/queue/s", AckMode::Auto, 1000)).len();
    assert_eq!(n, 2);
    n += bodies(&h.tick(0)).len();
    for _ in 0..20 {
        n += bodies(&h.tick(1_000)).len();
    }
    assert_eq!(n, 5);
    assert_eq!(h.engine.scheduled_count(), 0);
}

#[test]
fn compaction_relogs_a_schedule_with_its_progress() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    let headers = [
        ("AMQ_SCHEDULED_DELAY", "10"),
        ("AMQ_SCHEDULED_PERIOD", "1000"),
        ("AMQ_SCHEDULED_REPEAT", "2"),
    ];
    scheduled_send(&mut h, 1, "/queue/s", "p", &headers, None).unwrap();
    consumer(&mut h);
    assert_eq!(bodies(&h.tick(10)).len(), 1);
    let end = h.next_lsn;
    while h.relocate(end, 16) > 0 {}
    h.checkpoint_and_truncate();
    h.crash_and_recover();
    consumer(&mut h);
    let mut n = 0;
    for _ in 0..10 {
        n += bodies(&h.tick(1_000)).len();
    }
    assert_eq!(n, 2, "exactly the remaining firings");
}

#[test]
fn bad_schedules_are_refused() {
    let mut h = Harness::new(EngineConfig {
        scheduled_messages_max: 1,
        ..EngineConfig::default()
    });
    h.connect(1, None);
    for headers in [
        vec![("AMQ_SCHEDULED_DELAY", "soon")],
        vec![("AMQ_SCHEDULED_REPEAT", "3")],
        vec![("AMQ_SCHEDULED_CRON", "61 * * * *")],
        vec![("AMQ_SCHEDULED_CRON", "0 0 30 2 *")],
    ] {
        let e = scheduled_send(&mut h, 1, "/queue/s", "x", &headers, None).unwrap_err();
        assert!(matches!(e, EngineError::BadSchedule(_)), "{headers:?}: {e}");
    }
    scheduled_send(
        &mut h,
        1,
        "/queue/s",
        "x",
        &[("AMQ_SCHEDULED_DELAY", "5")],
        None,
    )
    .unwrap();
    let e = scheduled_send(
        &mut h,
        1,
        "/queue/s",
        "y",
        &[("AMQ_SCHEDULED_DELAY", "5")],
        None,
    );
    assert_eq!(e.unwrap_err(), EngineError::TooManyScheduled(1));
    // Delay 0 and nothing else is an ordinary send.
    scheduled_send(
        &mut h,
        1,
        "/queue/s",
        "now",
        &[("AMQ_SCHEDULED_DELAY", "0")],
        None,
    )
    .unwrap();
    consumer(&mut h);
    assert_eq!(h.engine.scheduled_count(), 1);
}

#[test]
fn scheduled_to_temporary_destinations_is_refused() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    let e = scheduled_send(
        &mut h,
        1,
        "/temp-queue/r",
        "x",
        &[("AMQ_SCHEDULED_DELAY", "5")],
        None,
    );
    assert!(matches!(e.unwrap_err(), EngineError::BadSchedule(_)));
}

#[test]
fn scheduled_sends_in_a_transaction_are_held_from_its_commit_and_survive_a_crash() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    for tx in ["keep", "drop"] {
        h.ok(Command::Begin {
            conn: 1,
            transaction: tx.into(),
            receipt: None,
        });
        scheduled_send(
            &mut h,
            1,
            "/queue/s",
            tx,
            &[("AMQ_SCHEDULED_DELAY", "1000")],
            Some(tx),
        )
        .unwrap();
    }
    assert_eq!(h.engine.scheduled_count(), 0, "nothing before COMMIT");
    h.ok(Command::Abort {
        conn: 1,
        transaction: "drop".into(),
        receipt: None,
    });
    h.ok(Command::Commit {
        conn: 1,
        transaction: "keep".into(),
        receipt: None,
        producer: None,
    });
    assert_eq!(h.engine.scheduled_count(), 1);
    h.crash_and_recover();
    assert_eq!(
        h.engine.scheduled_count(),
        1,
        "the commit record holds the schedule"
    );
    consumer(&mut h);
    let mut got = Vec::new();
    for _ in 0..20 {
        got.extend(bodies(&h.tick(100)));
    }
    assert_eq!(got, vec!["keep"]);
}
