//! Deep backlogs: waiting messages beyond the memory budget live only in the log and come back
//! in order, exactly once — across consumers, crashes, compaction and segment deletion.

mod support;

use haven_engine::*;
use std::sync::{Arc, Mutex};
use support::*;

/// Budget for waiting messages: a handful of the small test messages.
const MEMORY_BYTES_MAX: u64 = 1_000;

fn paging_harness() -> Harness {
    Harness::with_paging(EngineConfig {
        memory_bytes_max: MEMORY_BYTES_MAX,
        ..EngineConfig::default()
    })
}

/// Drains `dest` with one client-ack consumer, acking each delivery; returns the bodies.
fn drain(h: &mut Harness, conn: ConnId, dest: &str) -> Vec<String> {
    let mut got = Vec::new();
    let mut pending = deliveries(&h.subscribe(conn, "drain", dest, AckMode::ClientIndividual, 10));
    while let Some((_, d)) = pending.first().cloned() {
        pending.remove(0);
        got.push(String::from_utf8(d.message.body.to_vec()).unwrap());
        pending.extend(deliveries(&h.ack(conn, d.ack_tag)));
    }
    got
}

/// Takes deliveries from `pending` in order, records each body in `got` and acks it (the ack
/// may deliver the next): `n` of them, or with None until nothing is pending.
fn consume(
    h: &mut Harness,
    conn: ConnId,
    pending: &mut Vec<(ConnId, Delivery)>,
    got: &mut Vec<String>,
    n: Option<usize>,
) {
    let mut taken = 0;
    while n.is_none_or(|n| taken < n) {
        let Some((_, d)) = pending.first().cloned() else {
            assert!(n.is_none(), "{taken} deliveries where {n:?} were expected");
            return;
        };
        pending.remove(0);
        got.push(String::from_utf8(d.message.body.to_vec()).unwrap());
        pending.extend(deliveries(&h.ack(conn, d.ack_tag)));
        taken += 1;
    }
}

fn numbered(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i:04}")).collect()
}

#[test]
fn backlog_beyond_memory_is_paged_out_and_delivered_in_order_once() {
    let mut h = paging_harness();
    h.connect(1, None);
    for body in numbered(500) {
        h.send(1, "/queue/deep", &body, true);
    }
    let stats = h.engine.memory_stats();
    assert!(
        stats.paged_out > 400,
        "most of the backlog is paged out: {stats:?}"
    );
    assert!(
        stats.hot_bytes <= MEMORY_BYTES_MAX,
        "memory budget kept: {stats:?}"
    );
    h.connect(2, None);
    assert_eq!(drain(&mut h, 2, "/queue/deep"), numbered(500));
    let stats = h.engine.memory_stats();
    assert_eq!(stats.paged_out, 0);
    assert!(stats.paged_in_total > 400);
}

#[test]
fn recovery_keeps_a_paged_backlog_paged_out() {
    let mut h = paging_harness();
    h.connect(1, None);
    for body in numbered(300) {
        h.send(1, "/queue/deep", &body, true);
    }
    h.crash_and_recover();
    let stats = h.engine.memory_stats();
    assert!(stats.paged_out > 250, "replay pages out: {stats:?}");
    assert!(stats.hot_bytes <= MEMORY_BYTES_MAX, "{stats:?}");
    h.connect(2, None);
    let mut pending =
        deliveries(&h.subscribe(2, "s", "/queue/deep", AckMode::ClientIndividual, 10));
    let mut got = Vec::new();
    while let Some((_, d)) = pending.first().cloned() {
        pending.remove(0);
        assert!(
            d.redelivered,
            "recovered messages may have been delivered before"
        );
        got.push(String::from_utf8(d.message.body.to_vec()).unwrap());
        pending.extend(deliveries(&h.ack(2, d.ack_tag)));
    }
    assert_eq!(got, numbered(300));
}

#[test]
fn compaction_and_segment_deletion_move_paged_messages_safely() {
    let mut h = paging_harness();
    h.connect(1, None);
    for body in numbered(200) {
        h.send(1, "/queue/deep", &body, true);
    }
    // Consume half, so the old records are sparse; compact everything below the end of the
    // log, then delete the dead prefix (the loader fails if a needed record is gone).
    h.connect(2, None);
    let mut pending = deliveries(&h.subscribe(2, "s", "/queue/deep", AckMode::ClientIndividual, 1));
    let mut got = Vec::new();
    consume(&mut h, 2, &mut pending, &mut got, Some(100));
    h.close(2);
    let end = h.next_lsn;
    while h.relocate(end, 64) > 0 {}
    h.checkpoint_and_truncate();
    h.crash_and_recover();
    h.connect(3, None);
    got.extend(drain(&mut h, 3, "/queue/deep"));
    assert_eq!(got, numbered(200));
}

/// Compaction re-logs paged-out messages while the consumer works through the in-memory
/// window. When the window is empty, the next message's new record may not be durable yet,
/// so the page-in stops there; the producers have stopped, so no other command comes to
/// dispatch the queue. The sync that makes the record durable must resume it (found while
/// chasing a failure of the network test of a bridge killed under load, in which confirmed
/// messages sat paged out on the receiving broker when the test gave up).
#[test]
fn a_page_in_that_waited_for_a_relocated_record_resumes_when_it_is_durable() {
    let mut h = paging_harness();
    h.connect(1, None);
    for body in numbered(200) {
        h.send(1, "/queue/deep", &body, true);
    }
    assert!(
        h.engine.memory_stats().paged_out > 150,
        "most of it is paged out"
    );
    h.connect(2, None);
    let mut pending = deliveries(&h.subscribe(2, "s", "/queue/deep", AckMode::ClientIndividual, 1));
    let mut got = Vec::new();
    consume(&mut h, 2, &mut pending, &mut got, Some(50));
    // Compaction of everything so far; its records are appended but not yet synced.
    h.hold_durability();
    let end = h.next_lsn;
    while h.relocate(end, 64) > 0 {}
    // The consumer empties what is in memory, then the queue must wait for the sync.
    consume(&mut h, 2, &mut pending, &mut got, None);
    assert!(
        got.len() < 200,
        "the relocated backlog waits for its records"
    );
    // The sync: nothing else happens, and the next message must come.
    pending = deliveries(&h.release_durability());
    assert_eq!(pending.len(), 1, "the sync resumed the page-in");
    consume(&mut h, 2, &mut pending, &mut got, None);
    assert_eq!(got, numbered(200));
}

/// A store whose syncs lag the producers (PostgreSQL's group commit): arrivals wait in the
/// tail until durable, so a page-in's hint often finds the next window only partly paged out.
/// Every message must be hinted before a page-in loads it, and hinted once. The engine used
/// to hint only at a page-in, naming what was paged out then; what became durable after it was
/// read by the next page-in one message at a time, which on a shared-db master meant runs of
/// 1,300-1,700 blocking queries and RECEIPTs held for up to a second (docs/POSTGRES.md).
#[test]
fn every_paged_in_message_was_hinted_once_before_it_was_loaded() {
    let (mut h, hints) = Harness::with_paging_hints(EngineConfig {
        // Windows of a few thousand test messages, as 1 KiB ones have at the default budget.
        memory_bytes_max: 100_000,
        ..EngineConfig::default()
    });
    h.connect(1, None);
    h.connect(2, None);
    let mut pending = deliveries(&h.subscribe(2, "s", "/queue/lag", AckMode::ClientIndividual, 1));
    let mut got = Vec::new();
    let bodies: Vec<String> = (0..10_000).map(|i| format!("m{i:05}")).collect();
    for (i, round) in bodies.chunks(175).enumerate() {
        h.hold_durability();
        for body in round {
            pending.extend(deliveries(&h.send(1, "/queue/lag", body, true)));
        }
        // The consumer takes less than arrives for a while, then more.
        let take = if i < 30 { 100 } else { 300 };
        for _ in 0..take {
            if pending.is_empty() {
                break;
            }
            consume(&mut h, 2, &mut pending, &mut got, Some(1));
        }
        pending.extend(deliveries(&h.release_durability()));
    }
    consume(&mut h, 2, &mut pending, &mut got, None);
    assert_eq!(got, bodies);
    let hints = hints.lock().unwrap();
    assert_every_load_was_hinted(&hints, 2_500);
    assert_eq!(hints.named_again, 0, "messages hinted again");
}

/// A backlog filled while nobody consumed, and one left by its last consumer, is hinted
/// from its front before the first page-in reads it: read one message at a time, a PostgreSQL
/// store's first page-in is thousands of blocking queries.
#[test]
fn a_consumer_arriving_at_a_paged_backlog_is_read_ahead_from_the_start() {
    let mut b = PartlyRead::new("/queue/filled");
    // The consumer leaves; its unacknowledged message goes back. Another comes later.
    b.h.close(2);
    b.h.connect(3, None);
    let mut pending =
        deliveries(&b.h.subscribe(3, "b", "/queue/filled", AckMode::ClientIndividual, 1));
    consume(&mut b.h, 3, &mut pending, &mut b.got, None);
    assert_eq!(b.got, b.bodies);
    assert_every_load_was_hinted(&b.hints.lock().unwrap(), 4_000);
}

/// A loader that drops its read-ahead (the journal's does after a second without a hint, as
/// when consumers pause) is told the window again, so the next page-in does not read what it
/// had been named one message at a time.
#[test]
fn a_loader_that_forgot_its_read_ahead_is_named_the_window_again() {
    let mut b = PartlyRead::new("/queue/paused");
    // The consumer pauses; the loader drops what it read ahead.
    b.hints.lock().unwrap().forget = true;
    consume(&mut b.h, 2, &mut b.pending, &mut b.got, None);
    assert_eq!(b.got, b.bodies);
    assert!(!b.hints.lock().unwrap().forget, "the engine asked");
    assert_every_load_was_hinted(&b.hints.lock().unwrap(), 3_000);
}

/// A backlog of 6,000 paged messages filled with no consumer, then 2,000 of them read by
/// connection 2 (one unacknowledged at a time, its next delivery in `pending`).
struct PartlyRead {
    h: Harness,
    hints: Arc<Mutex<Hints>>,
    bodies: Vec<String>,
    pending: Vec<(ConnId, Delivery)>,
    got: Vec<String>,
}

impl PartlyRead {
    fn new(queue: &str) -> PartlyRead {
        let (mut h, hints) = Harness::with_paging_hints(EngineConfig {
            memory_bytes_max: 100_000,
            ..EngineConfig::default()
        });
        h.connect(1, None);
        let bodies: Vec<String> = (0..6_000).map(|i| format!("m{i:05}")).collect();
        for body in &bodies {
            h.send(1, queue, body, true);
        }
        h.connect(2, None);
        let mut pending = deliveries(&h.subscribe(2, "a", queue, AckMode::ClientIndividual, 1));
        let mut got = Vec::new();
        consume(&mut h, 2, &mut pending, &mut got, Some(2_000));
        PartlyRead {
            h,
            hints,
            bodies,
            pending,
            got,
        }
    }
}

/// More than `loads_min` paged-out messages were read back, each named in a hint first.
fn assert_every_load_was_hinted(hints: &Hints, loads_min: usize) {
    assert!(
        hints.loads > loads_min,
        "the backlog was paged: {} loads",
        hints.loads
    );
    assert_eq!(
        hints.unhinted_loads.len(),
        0,
        "of {} loads, these were not hinted first: {:?}",
        hints.loads,
        &hints.unhinted_loads[..hints.unhinted_loads.len().min(10)]
    );
}

#[test]
fn non_persistent_messages_spill_to_the_log_and_do_not_survive_a_restart() {
    let mut h = paging_harness();
    h.connect(1, None);
    for body in numbered(200) {
        h.send(1, "/queue/volatile", &body, false);
    }
    let spills = h
        .log
        .iter()
        .filter(|(_, b)| matches!(Record::decode(b).unwrap(), Record::Spill { .. }))
        .count();
    assert!(spills > 150, "beyond the budget they spill: {spills}");
    assert!(h.engine.memory_stats().hot_bytes <= MEMORY_BYTES_MAX);
    // Read back in order while running, and the spill records become dead.
    h.connect(2, None);
    assert_eq!(drain(&mut h, 2, "/queue/volatile"), numbered(200));
    assert_eq!(
        h.engine.min_live_lsn(),
        None,
        "nothing keeps the spilled records alive"
    );
    // Spilled, then restarted: gone, like every non-persistent message.
    for body in numbered(50) {
        h.send(1, "/queue/volatile", &body, false);
    }
    h.crash_and_recover();
    h.connect(3, None);
    assert!(drain(&mut h, 3, "/queue/volatile").is_empty());
}

#[test]
fn arrivals_behind_a_paged_backlog_keep_fifo_with_a_live_consumer() {
    let mut h = paging_harness();
    h.connect(1, None);
    for body in numbered(100) {
        h.send(1, "/queue/q", &body, true);
    }
    h.connect(2, None);
    let mut pending = deliveries(&h.subscribe(2, "s", "/queue/q", AckMode::ClientIndividual, 3));
    let mut got = Vec::new();
    let mut next = 100;
    // Interleave: every ack, one more message arrives (while the queue is paging).
    while let Some((_, d)) = pending.first().cloned() {
        pending.remove(0);
        got.push(String::from_utf8(d.message.body.to_vec()).unwrap());
        if next < 200 {
            pending.extend(deliveries(&h.send(
                1,
                "/queue/q",
                &format!("m{next:04}"),
                true,
            )));
            next += 1;
        }
        pending.extend(deliveries(&h.ack(2, d.ack_tag)));
    }
    assert_eq!(got, numbered(200));
}

#[test]
fn durable_subscription_backlog_pages_too() {
    let mut h = paging_harness();
    h.connect(1, Some("c1"));
    h.ok(Command::Subscribe {
        conn: 1,
        sub_id: "d".into(),
        destination: Destination::parse("/topic/t", 1).unwrap(),
        ack: AckMode::ClientIndividual,
        prefetch: 10,
        durable_name: Some("d".into()),
        options: Default::default(),
        receipt: None,
    });
    h.close(1);
    h.connect(2, None);
    for body in numbered(200) {
        h.send(2, "/topic/t", &body, true);
    }
    assert!(h.engine.memory_stats().paged_out > 150);
    h.crash_and_recover();
    h.connect(3, Some("c1"));
    let mut pending = deliveries(&h.ok(Command::Subscribe {
        conn: 3,
        sub_id: "d".into(),
        destination: Destination::parse("/topic/t", 3).unwrap(),
        ack: AckMode::ClientIndividual,
        prefetch: 10,
        durable_name: Some("d".into()),
        options: Default::default(),
        receipt: None,
    }));
    let mut got = Vec::new();
    while let Some((_, d)) = pending.first().cloned() {
        pending.remove(0);
        got.push(String::from_utf8(d.message.body.to_vec()).unwrap());
        pending.extend(deliveries(&h.ack(3, d.ack_tag)));
    }
    assert_eq!(got, numbered(200));
}

#[test]
fn memory_that_paging_cannot_free_holds_producers_back() {
    // Two durable subscriptions share every message: such messages stay in memory, so past
    // twice the budget the engine asks the caller to hold SENDs back.
    let mut h = paging_harness();
    for (conn, client) in [(1, "c1"), (2, "c2")] {
        h.connect(conn, Some(client));
        h.ok(Command::Subscribe {
            conn,
            sub_id: "d".into(),
            destination: Destination::parse("/topic/shared", conn).unwrap(),
            ack: AckMode::ClientIndividual,
            prefetch: 1,
            durable_name: Some("d".into()),
            options: Default::default(),
            receipt: None,
        });
        h.close(conn);
    }
    h.connect(3, None);
    let topic = Destination::Topic("shared".into());
    let mut sent = 0;
    while h.engine.admission(&topic).is_ok() {
        h.send(3, "/topic/shared", &format!("m{sent}"), true);
        sent += 1;
        assert!(
            sent < 1_000,
            "memory grows without the admission check biting"
        );
    }
    let reason = h.engine.admission(&topic).unwrap_err();
    assert!(reason.contains("memory_bytes_max"), "{reason}");
    // Other destinations are held back too: memory is the broker's.
    assert!(h.engine.admission(&Destination::Queue("q".into())).is_err());
}
