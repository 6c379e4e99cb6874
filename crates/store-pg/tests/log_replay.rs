//! The log in the table: what was made durable replays exactly, also after segments were
//! released; recovery refuses interleaved epochs and holes; paged-out messages read back.

mod common;

use bytes::Bytes;
use common::*;
use haven_engine::{Destination, Message, Record};
use haven_server::{DurableLog, SharedStore};
use haven_store_pg::SEGMENT_RECORDS;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appended_records_replay_exactly_after_reopen_and_release() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    let mut m = acquire(&store).await;
    let (mut log, seen) = open(&mut m);
    assert!(seen.is_empty());
    assert_eq!(log.next_lsn(), 1);
    // Several flushes of uneven sizes: group commit must keep order and numbering.
    let total = 2 * SEGMENT_RECORDS + 100;
    let mut want = Vec::new();
    for i in 1..=total {
        let p = payload(i, (i % 700) as usize);
        assert_eq!(log.append(&p), i);
        want.push((i, p));
        if i % 997 == 0 {
            log.flush();
        }
    }
    log.flush();
    durable(&*log, total).await;
    let segs = log.segments();
    assert_eq!(segs.len(), 3);
    assert!(segs[0].sealed && segs[1].sealed && !segs[2].sealed);
    tokio::task::block_in_place(|| log.close()).expect("close");
    let first_epoch = m.epoch;
    drop(m);

    let mut m = acquire(&store).await;
    assert!(m.epoch > first_epoch, "a new mastership has a new epoch");
    let (mut log, seen) = open(&mut m);
    assert_eq!(seen, want, "replay is exactly what was made durable");
    assert_eq!(log.next_lsn(), total + 1);
    // Release the first two segments behind one more record (as the core's checkpoint).
    let cp = log.append(b"checkpoint");
    assert_eq!(log.release_before(cp), 2);
    log.flush();
    durable(&*log, cp).await;
    tokio::task::block_in_place(|| log.close()).expect("close");
    drop(m);
    let rows = pg
        .psql("SELECT min(lsn), max(lsn), count(*) FROM haven_log")
        .expect("psql");
    assert_eq!(
        rows,
        format!(
            "{}|{cp}|{}",
            2 * SEGMENT_RECORDS + 1,
            cp - 2 * SEGMENT_RECORDS
        )
    );

    let mut m = acquire(&store).await;
    let (log, seen) = open(&mut m);
    want.push((cp, b"checkpoint".to_vec()));
    assert_eq!(seen, want[2 * SEGMENT_RECORDS as usize..].to_vec());
    assert_eq!(log.next_lsn(), cp + 1);
    assert_eq!(log.segments()[0].base_lsn, 2 * SEGMENT_RECORDS + 1);
}

/// A release larger than one deletion statement (two segments: two statements) is deleted
/// whole while the log stays open and goes on writing, and the records written between the
/// statements are all there, in order: deletion runs between writes, never in their way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_release_is_deleted_in_steps_between_writes() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    let mut m = acquire(&store).await;
    let (mut log, _) = open(&mut m);
    let mut want = Vec::new();
    for i in 1..=2 * SEGMENT_RECORDS + 10 {
        let p = payload(i, 100);
        log.append(&p);
        want.push((i, p));
    }
    log.flush();
    let cp = log.append(b"checkpoint");
    want.push((cp, b"checkpoint".to_vec()));
    assert_eq!(log.release_before(cp), 2);
    // Keep writing while the deletion runs, until it is done.
    let gone = format!("{}", 2 * SEGMENT_RECORDS + 1);
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let p = payload(log.next_lsn(), 50);
        want.push((log.append(&p), p));
        log.flush();
        durable(&*log, log.next_lsn() - 1).await;
        if pg.psql("SELECT min(lsn) FROM haven_log").expect("psql") == gone {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the release was not deleted"
        );
    }
    let last = log.next_lsn() - 1;
    let rows = pg
        .psql("SELECT min(lsn), max(lsn), count(*) FROM haven_log")
        .expect("psql");
    assert_eq!(
        rows,
        format!("{gone}|{last}|{}", last - 2 * SEGMENT_RECORDS)
    );
    tokio::task::block_in_place(|| log.close()).expect("close");
    drop(m);
    let mut m = acquire(&store).await;
    let (_log, seen) = open(&mut m);
    assert_eq!(seen, want[2 * SEGMENT_RECORDS as usize..].to_vec());
}

fn message(seq: u64) -> Arc<Message> {
    Arc::new(Message {
        seq,
        id: format!("m-{seq}"),
        destination: Destination::Queue("work".into()),
        headers: haven_engine::Headers::from_pairs(&[("k", "v")]),
        body: Bytes::from(vec![seq as u8; 300]),
        persistent: true,
        priority: 4,
        expires_ms: 0,
        timestamp_ms: 1,
        dead_lettered: false,
    })
}

/// Stores messages 1..=n, one record each, and waits until they are durable; returns their LSNs.
async fn store_messages(log: &mut dyn DurableLog, n: u64) -> Vec<u64> {
    let lsns: Vec<u64> = (1..=n)
        .map(|seq| {
            let record = Record::Store {
                message: message(seq),
                holders: Vec::new(),
                producer: None,
            };
            log.append(&record.to_bytes())
        })
        .collect();
    log.flush();
    durable(log, n).await;
    lsns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_out_message_is_read_back() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    let mut m = acquire(&store).await;
    let mut loader = m.log.loader();
    let (mut log, _) = open(&mut m);
    let lsns = store_messages(&mut *log, 20).await;
    tokio::task::block_in_place(|| {
        let got = loader.load(lsns[4], 5).expect("load");
        assert_eq!(*got, *message(5));
        let wrong = loader
            .load(lsns[4], 6)
            .expect_err("record 5 carries message 5 only");
        assert!(wrong.contains("does not carry"), "{wrong}");
        let missing = loader.load(999, 1).expect_err("no such record");
        assert!(missing.contains("not in the store"), "{missing}");
        // Read ahead, then load: same messages.
        let next: Vec<(u64, u64)> = (10..20).map(|i| (lsns[i], i as u64 + 1)).collect();
        loader.prefetch(&next);
        for (lsn, seq) in next {
            assert_eq!(*loader.load(lsn, seq).expect("load"), *message(seq));
        }
    });
}

/// Stores messages 1..=`n`, hints them all to a loader in `hints` consecutive hints sent back
/// to back, waits until `ahead` of them were read ahead, then loads every one in order
/// (checking each); returns how many read-ahead copies were left behind in the loader's map.
/// None without PostgreSQL (outside CI).
async fn hint_then_load_all(n: u64, hints: usize, ahead: usize) -> Option<usize> {
    let pg = cluster()?;
    let store = store(&short(&pg.url()), "a");
    let mut m = acquire(&store).await;
    let mut loader = m.log.loader();
    let (mut log, _) = open(&mut m);
    let lsns = store_messages(&mut *log, n).await;
    let next: Vec<(u64, u64)> = lsns.into_iter().zip(1..=n).collect();
    tokio::task::block_in_place(|| {
        for hint in next.chunks(next.len().div_ceil(hints)) {
            loader.prefetch(hint);
        }
    });
    // Not a timing check: the deadline only ends a failed test.
    let deadline = std::time::Instant::now() + DEADLINE;
    while loader.prefetched_len() < ahead {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {n} hinted messages were read ahead, waiting for {ahead}",
            loader.prefetched_len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    tokio::task::block_in_place(|| {
        for (lsn, seq) in next {
            assert_eq!(*loader.load(lsn, seq).expect("load"), *message(seq));
        }
    });
    Some(loader.prefetched_len())
}

/// `hint_then_load_all`, then checks that every load took its read-ahead copy (`why` says
/// what a copy left behind would mean).
async fn every_read_ahead_copy_is_taken(n: u64, hints: usize, ahead: usize, why: &str) {
    if let Some(left) = hint_then_load_all(n, hints, ahead).await {
        assert_eq!(left, 0, "{why}");
    }
}

/// A hint of a whole page-in (the engine asks up to 4,000 messages ahead) is read whole, in
/// several queries, not cut to one query's worth: the rest would each be read by a blocking
/// query while the broker's core waits (multi-second stalls on a paging master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prefetch_hint_is_read_whole() {
    every_read_ahead_copy_is_taken(2_500, 1, 2_500, "a read-ahead copy was left behind").await;
}

/// Hints sent one after another are all read ahead: each names messages after the last
/// one's (the engine's contract), so none may replace another. (The reader once kept only the
/// newest hint not yet started, which was enough while each hint named a whole window.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_sent_back_to_back_are_all_read_ahead() {
    every_read_ahead_copy_is_taken(3_000, 6, 3_000, "a read-ahead copy was left behind").await;
}

/// A `load` made while a long read-ahead is still reading is answered between its queries
/// from what it read, not by a query of its own after the whole hint: nothing is read twice,
/// so no read-ahead copy is left behind in the map. (Before, the reader served a `load` only
/// once the whole hint was read, then read the record again, and the read-ahead's copy of
/// every such message stayed in the map until it was cleared at 16,384.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_during_a_read_ahead_takes_what_it_read() {
    // Loading starts once the first query's records are in: the rest of the hint is still
    // being read (two more queries) while the loads reach it.
    let why = "a message was read twice and its read-ahead copy left behind";
    every_read_ahead_copy_is_taken(3_000, 1, 1, why).await;
}

/// Writes records 1..=3 in one mastership and 4..=5 in the next; returns both epochs.
async fn two_terms(store: &haven_store_pg::PgSharedStore) -> (u64, u64) {
    let mut epochs = Vec::new();
    for n in [3u64, 2] {
        let mut m = acquire(store).await;
        let (mut log, _) = open(&mut m);
        for _ in 0..n {
            log.append(b"r");
        }
        log.flush();
        durable(&*log, log.next_lsn() - 1).await;
        tokio::task::block_in_place(|| log.close()).expect("close");
        epochs.push(m.epoch);
    }
    (epochs[0], epochs[1])
}

fn open_error(m: &mut haven_server::Mastership) -> String {
    let log = std::mem::replace(&mut m.log, Box::new(Taken));
    match tokio::task::block_in_place(|| log.open(&mut |_, _| Ok(()))) {
        Ok(_) => panic!("recovery must refuse this store"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_refuses_an_older_epoch_after_a_newer_one() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    let (e1, e2) = two_terms(&store).await;
    assert!(e2 > e1);
    // Record 5 as if a deposed master of epoch e1 had written it after e2 began.
    pg.psql(&format!("UPDATE haven_log SET epoch = {e1} WHERE lsn = 5"))
        .expect("psql");
    let mut m = acquire(&store).await;
    let err = open_error(&mut m);
    assert!(
        err.contains(&format!("epoch {e1} after record 4 of epoch {e2}")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_refuses_a_hole_in_the_log() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    two_terms(&store).await;
    pg.psql("DELETE FROM haven_log WHERE lsn = 3")
        .expect("psql");
    let mut m = acquire(&store).await;
    let err = open_error(&mut m);
    assert!(err.contains("record 2 is followed by record 4"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_newer_than_the_broker_is_refused() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    drop(acquire(&store).await);
    pg.psql("UPDATE haven_meta SET value = '99' WHERE key = 'schema_version'")
        .expect("psql");
    let err = refused(&store).await;
    assert!(err.contains("schema version is 99"), "{err}");
}

/// Writes are fenced by a key-share lock that a takeover must wait for only because `epoch`
/// has a unique index: without one (here an index of the same name that is not unique), the
/// broker refuses the store rather than write unfenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_table_without_its_epoch_key_is_refused() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    drop(acquire(&store).await);
    pg.psql(
        "DROP INDEX haven_lease_epoch_key; \
         CREATE INDEX haven_lease_epoch_key ON haven_lease (epoch)",
    )
    .expect("psql");
    let err = refused(&store).await;
    assert!(err.contains("unique index on epoch"), "{err}");
    // Dropped altogether, it is created again at the next start.
    pg.psql("DROP INDEX haven_lease_epoch_key").expect("psql");
    drop(acquire(&store).await);
    let unique = pg
        .psql(
            "SELECT indisunique FROM pg_index WHERE indexrelid = 'haven_lease_epoch_key'::regclass",
        )
        .expect("psql");
    assert_eq!(unique, "t");
}

/// The error of an `acquire` that must fail at once, not be retried.
async fn refused(store: &haven_store_pg::PgSharedStore) -> String {
    tokio::time::timeout(DEADLINE, store.acquire())
        .await
        .expect("refused at once, not retried")
        .err()
        .expect("refused")
        .to_string()
}

#[test]
fn a_bad_url_is_refused_before_connecting() {
    let ha = short("postgres://a:b@[::1:5432/x?sslmode=nonsense");
    let err = haven_store_pg::PgSharedStore::new(&ha, "a", RECORD_BYTES_MAX)
        .err()
        .expect("refused");
    assert!(err.is_fatal(), "{err}");
    let tls = short("postgres://u@127.0.0.1/x?sslmode=require");
    let err = haven_store_pg::PgSharedStore::new(&tls, "a", RECORD_BYTES_MAX)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("TLS"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_row_is_recreated_above_every_epoch_in_the_log() {
    let Some(pg) = cluster() else { return };
    let store = store(&short(&pg.url()), "a");
    let (_, e2) = two_terms(&store).await;
    pg.psql("DELETE FROM haven_lease").expect("psql");
    let mut m = acquire(&store).await;
    assert!(m.epoch > e2, "epoch {} after {e2}", m.epoch);
    let (log, seen) = open(&mut m);
    assert_eq!(seen.len(), 5);
    assert_eq!(log.next_lsn(), 6);
}

#[test]
fn lease_timings_that_could_expire_before_renewal_are_refused() {
    let ha = haven_server::HaConfig {
        lease_ms: 1_000,
        renew_ms: 500,
        lease_margin_ms: 100,
        ..short("postgres://u@127.0.0.1/x")
    };
    let err = haven_store_pg::PgSharedStore::new(&ha, "a", RECORD_BYTES_MAX)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("twice renew_ms"), "{err}");
}
