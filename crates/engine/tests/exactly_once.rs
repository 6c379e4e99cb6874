//! Exactly-once sends in the engine: a SEND or COMMIT whose producer sequence is at or below
//! the producer's mark is answered and not stored; the mark survives replay and compaction,
//! is bounded by idle time and count, and only the newest session of a producer may use it.

mod support;

use bytes::Bytes;
use haven_engine::*;
use support::{bodies, receipts, Harness};

fn seq(producer: &str, seq: u64) -> Option<ProducerSeq> {
    Some(ProducerSeq {
        producer: producer.into(),
        seq,
    })
}

fn send(
    h: &mut Harness,
    conn: ConnId,
    body: &str,
    persistent: bool,
    producer: Option<ProducerSeq>,
) -> Result<Vec<Effect>, EngineError> {
    h.cmd(Command::Send {
        conn,
        destination: Destination::Queue("q".into()),
        message: NewMessage {
            headers: Default::default(),
            body: Bytes::from(body.to_string()),
            persistent,
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

fn connect_as(h: &mut Harness, conn: ConnId, producer: &str) {
    h.ok(Command::Connect {
        conn,
        client_id: None,
        producer: Some(producer.into()),
        session: 0,
    });
}

#[test]
fn a_duplicate_send_is_receipted_and_not_stored() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send(&mut h, 1, "a", true, seq("p", 1)).unwrap();
    let log_len = h.log.len();
    let effects = send(&mut h, 1, "a", true, seq("p", 1)).unwrap();
    assert_eq!(receipts(&effects), ["r-a"]);
    assert_eq!(h.log.len(), log_len, "a duplicate writes nothing");
    assert_eq!(stored(&h), 1);
    assert_eq!(h.engine.producer_stats().duplicates_dropped_total, 1);
    // Nor is it routed.
    let got = h.subscribe(1, "s", "/queue/q", AckMode::Auto, 10);
    assert_eq!(bodies(&got), ["a"]);
}

#[test]
fn a_gap_is_accepted_and_lower_seqs_are_duplicates_after_it() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send(&mut h, 1, "a", true, seq("p", 1)).unwrap();
    send(&mut h, 1, "e", true, seq("p", 5)).unwrap();
    send(&mut h, 1, "c", true, seq("p", 3)).unwrap();
    assert_eq!(stored(&h), 2);
    assert_eq!(h.engine.producer_hwm("p"), 5);
    // Another producer has its own numbering.
    send(&mut h, 1, "b", true, seq("other", 1)).unwrap();
    assert_eq!(stored(&h), 3);
}

#[test]
fn the_mark_survives_replay() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send(&mut h, 1, "a", true, seq("p", 4)).unwrap();
    h.crash_and_recover();
    h.connect(2, None);
    assert_eq!(h.engine.producer_hwm("p"), 4);
    send(&mut h, 2, "a", true, seq("p", 4)).unwrap();
    assert_eq!(stored(&h), 1);
}

#[test]
fn non_persistent_marks_live_in_memory_only() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send(&mut h, 1, "a", true, seq("p", 1)).unwrap();
    send(&mut h, 1, "n", false, seq("p", 2)).unwrap();
    let effects = send(&mut h, 1, "n", false, seq("p", 2)).unwrap();
    assert_eq!(receipts(&effects), ["r-n"], "a duplicate while running");
    assert_eq!(h.engine.producer_hwm("p"), 2);
    assert_eq!(h.engine.durable_producers()["p"].0, 1);
    // After a restart the non-persistent message is gone: resending it is not a duplicate.
    h.crash_and_recover();
    h.connect(2, None);
    assert_eq!(h.engine.producer_hwm("p"), 1);
    let got = h.subscribe(2, "s", "/queue/q", AckMode::Auto, 10);
    assert_eq!(bodies(&got), ["a"]);
    send(&mut h, 2, "n", false, seq("p", 2)).unwrap();
    assert_eq!(h.engine.producer_stats().duplicates_dropped_total, 0);
}

#[test]
fn transactional_send_headers_are_not_interpreted_and_a_resent_commit_is_discarded() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    for round in 0..2 {
        h.ok(Command::Begin {
            conn: 1,
            transaction: "t".into(),
            receipt: None,
        });
        let headers =
            haven_engine::Headers::from_pairs(&[("haven-producer", "p"), ("haven-seq", "1")]);
        h.ok(Command::Send {
            conn: 1,
            destination: Destination::Queue("q".into()),
            message: NewMessage {
                headers,
                body: Bytes::from(format!("t{round}")),
                persistent: true,
                priority: 4,
                expires_ms: 0,
            },
            transaction: Some("t".into()),
            receipt: None,
            producer: None,
        });
        let effects = h.ok(Command::Commit {
            conn: 1,
            transaction: "t".into(),
            receipt: Some(format!("c{round}")),
            producer: seq("batch", 9),
        });
        assert_eq!(receipts(&effects), [format!("c{round}")]);
    }
    assert_eq!(stored(&h), 1, "the second COMMIT repeated the first");
    // The SEND's own headers set no mark.
    assert_eq!(h.engine.producer_hwm("p"), 0);
    h.crash_and_recover();
    assert_eq!(h.engine.producer_hwm("batch"), 9, "durable with the commit");
}

#[test]
fn compaction_keeps_the_mark_after_the_message_records_are_gone() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    send(&mut h, 1, "a", true, seq("p", 3)).unwrap();
    let got = h.subscribe(1, "s", "/queue/q", AckMode::ClientIndividual, 10);
    let tag = support::deliveries(&got)[0].1.ack_tag;
    h.ack(1, tag);
    assert_eq!(stored(&h), 0);
    // The message is gone but its record is still live: it holds the producer's mark.
    let limit = h.next_lsn;
    assert_eq!(h.relocate(limit, 100), 1, "the mark is re-logged");
    h.checkpoint_and_truncate();
    assert!(h
        .log
        .iter()
        .all(|(_, b)| !matches!(Record::decode(b).unwrap(), Record::Store { .. })));
    h.crash_and_recover();
    assert_eq!(h.engine.producer_hwm("p"), 3);
}

#[test]
fn idle_producers_are_forgotten_and_replay_then_the_same_rule_agrees() {
    let cfg = EngineConfig {
        producer_idle_ms_max: 1_000,
        ..EngineConfig::default()
    };
    let mut h = Harness::new(cfg);
    h.connect(1, None);
    send(&mut h, 1, "a", true, seq("old", 1)).unwrap();
    h.now_ms += 600;
    send(&mut h, 1, "b", true, seq("young", 1)).unwrap();
    h.tick(500); // "old" was raised 1,100 ms ago
    assert_eq!(h.engine.producer_hwm("old"), 0);
    assert_eq!(h.engine.producer_hwm("young"), 1);
    let live = h.engine.durable_producers();
    // Its record is still in the log: replay brings it back, the same rule forgets it again.
    h.crash_and_recover();
    assert_eq!(h.engine.producer_hwm("old"), 1);
    h.tick(0);
    assert_eq!(h.engine.durable_producers(), live);
    // Forgotten: a resend is stored again.
    h.connect(2, None);
    send(&mut h, 2, "a", true, seq("old", 1)).unwrap();
    assert_eq!(stored(&h), 3);
}

#[test]
fn a_new_producer_beyond_the_limit_forgets_the_least_recently_seen() {
    let cfg = EngineConfig {
        producers_max: 2,
        ..EngineConfig::default()
    };
    let mut h = Harness::new(cfg);
    h.connect(1, None);
    send(&mut h, 1, "a1", true, seq("a", 1)).unwrap();
    h.now_ms += 1;
    send(&mut h, 1, "b1", true, seq("b", 1)).unwrap();
    h.now_ms += 1;
    send(&mut h, 1, "a2", true, seq("a", 2)).unwrap();
    h.now_ms += 1;
    send(&mut h, 1, "c1", true, seq("c", 1)).unwrap();
    assert_eq!(
        (
            h.engine.producer_hwm("a"),
            h.engine.producer_hwm("b"),
            h.engine.producer_hwm("c")
        ),
        (2, 0, 1)
    );
    let live = h.engine.durable_producers();
    h.crash_and_recover();
    assert_eq!(h.engine.durable_producers(), live, "replay evicts alike");
}

#[test]
fn an_older_session_of_a_producer_is_refused() {
    let mut h = Harness::new(EngineConfig::default());
    connect_as(&mut h, 1, "p");
    send(&mut h, 1, "a", true, seq("p", 1)).unwrap();
    connect_as(&mut h, 2, "p");
    assert_eq!(h.engine.producer_hwm("p"), 1);
    let err = send(&mut h, 1, "late", true, seq("p", 2)).unwrap_err();
    assert_eq!(err, EngineError::ProducerTakenOver("p".into()));
    assert!(err.to_string().contains("'p'") && err.to_string().contains("newer connection"));
    send(&mut h, 2, "b", true, seq("p", 2)).unwrap();
    // Still refused after the new owner left; a connection that never claimed it just
    // deduplicates.
    h.close(2);
    assert!(send(&mut h, 1, "late", true, seq("p", 3)).is_err());
    h.connect(3, None);
    send(&mut h, 3, "c", true, seq("p", 3)).unwrap();
    assert_eq!(stored(&h), 3);
}

/// A scheduled SEND's producer mark is in the schedule's own record (one record, tag 15), so a
/// crash cannot keep the schedule and lose the mark: a resend after recovery is a duplicate.
#[test]
fn a_scheduled_send_and_its_mark_are_one_record() {
    let mut h = Harness::new(EngineConfig::default());
    h.connect(1, None);
    let log_len = h.log.len();
    h.cmd(Command::Send {
        conn: 1,
        destination: Destination::Queue("q".into()),
        message: NewMessage {
            headers: haven_engine::Headers::from_pairs(&[("AMQ_SCHEDULED_DELAY", "60000")]),
            body: Bytes::from_static(b"later"),
            persistent: true,
            priority: 4,
            expires_ms: 0,
        },
        transaction: None,
        receipt: Some("r-later".into()),
        producer: seq("p", 7),
    })
    .unwrap();
    assert_eq!(h.log.len(), log_len + 1, "schedule and mark in one record");
    let (_, bytes) = h.log.last().unwrap();
    match Record::decode(bytes).unwrap() {
        Record::Schedule { producer, .. } => {
            assert_eq!(producer.map(|m| (m.producer, m.seq)), Some(("p".into(), 7)))
        }
        other => panic!("expected a Schedule record, got {other:?}"),
    }
    h.crash_and_recover();
    assert_eq!(h.engine.producer_hwm("p"), 7);
    assert_eq!(h.engine.scheduled_count(), 1);
    h.connect(2, None);
    let effects = h
        .cmd(Command::Send {
            conn: 2,
            destination: Destination::Queue("q".into()),
            message: NewMessage {
                headers: haven_engine::Headers::from_pairs(&[("AMQ_SCHEDULED_DELAY", "60000")]),
                body: Bytes::from_static(b"later"),
                persistent: true,
                priority: 4,
                expires_ms: 0,
            },
            transaction: None,
            receipt: Some("r-again".into()),
            producer: seq("p", 7),
        })
        .unwrap();
    assert_eq!(receipts(&effects), ["r-again"]);
    assert_eq!(
        h.engine.scheduled_count(),
        1,
        "the resend is not scheduled again"
    );
}
