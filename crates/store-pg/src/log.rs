//! The broker's log in the `haven_log` table: recovery, group-committed fenced writes, and
//! virtual segments for compaction.
//!
//! **Writes.** `append` numbers a record and buffers it; `flush` hands the buffer to the
//! writer task (on the store's thread), which writes everything handed to it since its last
//! write in one statement, while the next batch accumulates (group commit). The statement is
//! fenced — it takes a key-share lock on the lease row and inserts only if the epoch is still
//! this master's:
//!
//! ```sql
//! WITH fence AS (SELECT epoch FROM haven_lease WHERE id = 1 AND epoch = $1 FOR KEY SHARE),
//!      ins AS (INSERT INTO haven_log SELECT ... FROM unnest($2::bigint[], $3::bytea[])
//!              WHERE EXISTS (SELECT 1 FROM fence) RETURNING 1)
//! SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM ins)
//! ```
//!
//! `FOR KEY SHARE` conflicts with the `UPDATE` that takes the lease over, because that update
//! changes `epoch`, a key column (it has a unique index of its own, checked at start by
//! `schema.rs`). So the two serialise: either this write commits first (and the new master,
//! which recovers only after its takeover committed, replays it), or the takeover commits
//! first (and the lock, re-checked on the new row version, finds another epoch: nothing is
//! inserted). One statement is its own transaction, so a paused broker cannot hold the lock
//! between statements. A renewal changes no key column, so it does not wait for the writes in
//! flight. Under the `FOR SHARE` this used before, it did: a renewal waited 334 ms behind one
//! statement, and a statement longer than the lease would have made the master give up a
//! lease nobody else could take. The durable LSN is published on the watch after the
//! statement (its commit) returns. Any failure — an SQL error, a fencing refusal, a lost
//! connection, a write that outlasts `db_timeout_ms` — is sticky: the watch carries `Err` and
//! nothing more is written.
//!
//! **Recovery** reads the table in LSN order by keyset pagination (never the whole table in
//! memory), checking that LSNs are contiguous from the first row on and that epochs never go
//! down: a record of an older epoch after a newer one means two masters interleaved, and is
//! refused, naming both.
//!
//! **Segments** are virtual: `SEGMENT_RECORDS` consecutive LSNs each, aligned. Deletion
//! (`release_before`) removes whole segments from the start of the table, so the table is
//! always one contiguous run of LSNs and recovery needs no notion of holes. It is queued to
//! the writer behind the records appended before it, so what supersedes a deleted record is
//! committed before the deletion, and it is fenced like a write. The writer deletes at most
//! `DELETE_ROWS_MAX` rows per statement, oldest first, and writes records handed to it
//! meanwhile before it deletes more: a deletion only has to come after the records queued
//! before it, and one statement deleting a whole release (about 45,000 rows, 124-515 ms) held
//! every RECEIPT queued behind it.

use crate::db::{self, Conn};
use crate::lease::{self, Lost};
use crate::runtime::PgRuntime;
use crate::settings::Settings;
use haven_engine::MessageLoader;
use haven_journal::{JournalError, JournalFailure, Lsn, SegmentInfo};
use haven_server::{DurableLog, LogStore, OnRecord};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_postgres::Statement;

/// Records per virtual segment.
pub const SEGMENT_RECORDS: u64 = 4096;
/// What one virtual segment counts for in the core's `limits.disk_bytes_max`: as if records
/// averaged 1 KiB. The table's real size depends on PostgreSQL (TOAST, vacuum); watch the
/// database's own disk.
pub const SEGMENT_BYTES_NOMINAL: u64 = SEGMENT_RECORDS * 1024;
/// Bytes a row costs beyond its payload (tuple header, two bigints, index entry), roughly: for
/// `SegmentInfo::bytes`.
const ROW_OVERHEAD_BYTES: u64 = 64;
/// Rows per recovery read at most, and the size one read aims at: the row count halves after
/// a read above the target and doubles after one far below it, so large records do not make
/// a read of `RECOVERY_ROWS_PER_FETCH_MAX` rows hold gigabytes.
const RECOVERY_ROWS_PER_FETCH_MAX: i64 = 1_000;
const RECOVERY_FETCH_BYTES_TARGET: usize = 8 * 1024 * 1024;
/// Recovery reads handed to the replaying thread but not replayed yet, at most.
const RECOVERY_CHUNKS_IN_FLIGHT: usize = 2;
/// One write statement carries at most this many records and bytes; a larger flush becomes
/// several statements (each published durable as it commits).
pub const BATCH_RECORDS_MAX: usize = 8_192;
pub const BATCH_BYTES_MAX: usize = 16 * 1024 * 1024;

const RECOVER_SQL: &str =
    "SELECT lsn, epoch, payload FROM haven_log WHERE lsn > $1 ORDER BY lsn LIMIT $2";

const INSERT_SQL: &str = "
WITH fence AS (SELECT epoch FROM haven_lease WHERE id = 1 AND epoch = $1::bigint FOR KEY SHARE),
     ins AS (INSERT INTO haven_log (lsn, epoch, payload)
             SELECT r.lsn, $1::bigint, r.payload
               FROM unnest($2::bigint[], $3::bytea[]) AS r(lsn, payload)
              WHERE EXISTS (SELECT 1 FROM fence)
             RETURNING 1)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM ins)";

/// Rows one deletion statement removes at most: one virtual segment.
const DELETE_ROWS_MAX: i64 = SEGMENT_RECORDS as i64;

/// The oldest `$3` records below `$2`.
const DELETE_SQL: &str = "
WITH fence AS (SELECT epoch FROM haven_lease WHERE id = 1 AND epoch = $1::bigint FOR KEY SHARE),
     del AS (DELETE FROM haven_log
              WHERE lsn IN (SELECT lsn FROM haven_log WHERE lsn < $2::bigint
                            ORDER BY lsn LIMIT $3::bigint)
                AND EXISTS (SELECT 1 FROM fence)
             RETURNING 1)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM del)";

/// The log of one mastership (one epoch). Given to the broker in `Mastership::log`.
pub(crate) struct PgLogStore {
    pub s: Arc<Settings>,
    pub rt: Arc<PgRuntime>,
    pub epoch: u64,
    pub lost: Lost,
}

enum Op {
    Records(Vec<(i64, Vec<u8>)>),
    /// Delete every record below this LSN.
    Release(Lsn),
    /// Reply once everything queued before is durable.
    Close(std::sync::mpsc::Sender<()>),
}

enum Replay {
    Chunk(Vec<(Lsn, Vec<u8>)>),
    Done,
}

fn failure(s: &Settings, op: &'static str, message: impl std::fmt::Display) -> JournalFailure {
    JournalFailure {
        op,
        path: PathBuf::from(&s.describe),
        message: message.to_string(),
    }
}

fn corrupt(lsn: i64, reason: String) -> JournalError {
    JournalError::Corrupt {
        segment: PathBuf::from("haven_log"),
        offset: lsn as u64,
        reason,
    }
}

impl LogStore for PgLogStore {
    fn loader(&self) -> Box<dyn MessageLoader> {
        Box::new(crate::loader::PgLoader::new(
            self.s.clone(),
            self.rt.clone(),
        ))
    }

    fn record_bytes_max(&self) -> usize {
        self.s.record_bytes_max
    }

    fn open(self: Box<Self>, on_record: OnRecord<'_>) -> Result<Box<dyn DurableLog>, JournalError> {
        let (chunks_tx, mut chunks_rx) = mpsc::channel(RECOVERY_CHUNKS_IN_FLIGHT);
        let (ops_tx, ops_rx) = mpsc::unbounded_channel();
        let (durable_tx, durable_rx) = watch::channel(Ok(0));
        self.rt.spawn(run(
            self.s.clone(),
            self.epoch,
            self.lost.clone(),
            chunks_tx,
            ops_rx,
            durable_tx,
        ));
        let mut segs: Option<Segments> = None;
        let mut last: Lsn = 0;
        loop {
            // Not tokio's blocking_recv: `open` may run on a current-thread runtime's thread.
            let msg = futures::executor::block_on(chunks_rx.recv());
            match msg {
                None => {
                    return Err(JournalError::Failed(failure(
                        &self.s,
                        "recovery",
                        "the database thread stopped",
                    )))
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(Replay::Done)) => break,
                Some(Ok(Replay::Chunk(rows))) => {
                    for (lsn, payload) in rows {
                        on_record(lsn, &payload).map_err(JournalError::Replay)?;
                        segs.get_or_insert_with(|| Segments::new(lsn))
                            .add(lsn, payload.len());
                        last = lsn;
                    }
                }
            }
        }
        assert_eq!(
            *durable_rx.borrow(),
            Ok(last),
            "recovery publishes the last record as durable"
        );
        tracing::info!(epoch = self.epoch, last_lsn = last, store = %self.s.describe, "store recovered");
        Ok(Box::new(PgLog {
            s: self.s.clone(),
            ops: ops_tx,
            buf: Vec::new(),
            next_lsn: last + 1,
            durable_rx,
            segs: segs.unwrap_or_else(|| Segments::new(last + 1)),
            _rt: self.rt,
        }))
    }

    fn describe(&self) -> String {
        format!("{} (epoch {})", self.s.describe, self.epoch)
    }
}

/// Recovery, then the writer, on one connection of the store's thread.
async fn run(
    s: Arc<Settings>,
    epoch: u64,
    lost: Lost,
    chunks: mpsc::Sender<Result<Replay, JournalError>>,
    ops: mpsc::UnboundedReceiver<Op>,
    durable: watch::Sender<Result<Lsn, JournalFailure>>,
) {
    let conn = match recover(&s, epoch, &chunks, &durable).await {
        Ok(Some(conn)) => conn,
        // The replaying side gave up (its callback refused a record).
        Ok(None) => return,
        Err(e) => {
            let _ = chunks.send(Err(e)).await;
            return;
        }
    };
    drop(chunks);
    let mut w = Writer {
        s,
        epoch,
        lost,
        conn,
        durable,
        statements: None,
    };
    if let Err(f) = w.run(ops).await {
        tracing::error!(epoch, "store writer stopped: {f}");
    }
}

async fn recover(
    s: &Settings,
    epoch: u64,
    chunks: &mpsc::Sender<Result<Replay, JournalError>>,
    durable: &watch::Sender<Result<Lsn, JournalFailure>>,
) -> Result<Option<Conn>, JournalError> {
    let db_err = |e: crate::PgError| JournalError::Failed(failure(s, "recovery", e));
    let conn = db::connect(s, db::Role::Log).await.map_err(db_err)?;
    let stmt = db::timed(s.db_timeout(), "prepare", conn.client.prepare(RECOVER_SQL))
        .await
        .map_err(db_err)?;
    let epoch_i = epoch as i64;
    let mut rows_per_fetch = RECOVERY_ROWS_PER_FETCH_MAX;
    let mut prev: Option<(i64, i64)> = None;
    loop {
        let after = prev.map_or(0, |(lsn, _)| lsn);
        let rows = db::timed(
            s.db_timeout(),
            "recovery read",
            conn.client.query(&stmt, &[&after, &rows_per_fetch]),
        )
        .await
        .map_err(db_err)?;
        if rows.is_empty() {
            break;
        }
        let mut chunk = Vec::with_capacity(rows.len());
        let mut bytes = 0usize;
        for row in rows {
            let lsn: i64 = row.get(0);
            let ep: i64 = row.get(1);
            let payload: Vec<u8> = row.get(2);
            if let Some((p_lsn, p_ep)) = prev {
                if lsn != p_lsn + 1 {
                    return Err(corrupt(
                        lsn,
                        format!("record {p_lsn} is followed by record {lsn}: records are missing"),
                    ));
                }
                if ep < p_ep {
                    return Err(corrupt(
                        lsn,
                        format!(
                            "record {lsn} was written in epoch {ep} after record {p_lsn} of \
                             epoch {p_ep}: two masters wrote to the store; refusing to recover"
                        ),
                    ));
                }
            }
            if ep > epoch_i {
                return Err(corrupt(
                    lsn,
                    format!(
                        "record {lsn} was written in epoch {ep}, newer than this master's \
                         epoch {epoch}: another broker is master"
                    ),
                ));
            }
            if payload.len() > s.record_bytes_max {
                return Err(corrupt(
                    lsn,
                    format!(
                        "record {lsn} holds {} bytes, more than record_bytes_max ({})",
                        payload.len(),
                        s.record_bytes_max
                    ),
                ));
            }
            bytes += payload.len();
            prev = Some((lsn, ep));
            chunk.push((lsn as Lsn, payload));
        }
        if bytes > RECOVERY_FETCH_BYTES_TARGET {
            rows_per_fetch = (rows_per_fetch / 2).max(1);
        } else if bytes < RECOVERY_FETCH_BYTES_TARGET / 4 {
            rows_per_fetch = (rows_per_fetch * 2).min(RECOVERY_ROWS_PER_FETCH_MAX);
        }
        if chunks.send(Ok(Replay::Chunk(chunk))).await.is_err() {
            return Ok(None);
        }
    }
    let last = prev.map_or(0, |(lsn, _)| lsn as Lsn);
    let _ = durable.send_replace(Ok(last));
    if chunks.send(Ok(Replay::Done)).await.is_err() {
        return Ok(None);
    }
    Ok(Some(conn))
}

struct Writer {
    s: Arc<Settings>,
    epoch: u64,
    lost: Lost,
    conn: Conn,
    durable: watch::Sender<Result<Lsn, JournalFailure>>,
    statements: Option<(Statement, Statement)>,
}

impl Writer {
    /// Until the log is dropped or closed (`Ok`) or a write fails (`Err`, never retried).
    async fn run(&mut self, mut ops: mpsc::UnboundedReceiver<Op>) -> Result<(), JournalFailure> {
        let mut queue: VecDeque<Op> = VecDeque::new();
        let result = self.drain(&mut ops, &mut queue).await;
        if let Err(f) = &result {
            // Before `queue` (and a `Close` waiting in it) is dropped: `close` then reads
            // this failure.
            let _ = self.durable.send_replace(Err(f.clone()));
        }
        result
    }

    async fn drain(
        &mut self,
        ops: &mut mpsc::UnboundedReceiver<Op>,
        queue: &mut VecDeque<Op>,
    ) -> Result<(), JournalFailure> {
        // Released and not deleted yet: every record below it. Released after the records
        // queued before it were written, so deleting it later is always allowed.
        let mut release: Option<Lsn> = None;
        loop {
            if release.is_none() {
                let Some(op) = ops.recv().await else {
                    return Ok(()); // the log was dropped: nothing more to write
                };
                queue.push_back(op);
            }
            // Group commit: everything handed over while the last write ran goes together.
            while let Ok(op) = ops.try_recv() {
                queue.push_back(op);
            }
            if queue.is_empty() {
                // Nothing to write: delete a little of what was released.
                let below = release.expect("waited for an op otherwise");
                self.check_master()?;
                if self.delete(below, Some(DELETE_ROWS_MAX)).await? < DELETE_ROWS_MAX {
                    release = None;
                }
                continue;
            }
            while let Some(op) = queue.pop_front() {
                self.check_master()?;
                match op {
                    Op::Records(mut batch) => {
                        while let Some(Op::Records(_)) = queue.front() {
                            let Some(Op::Records(more)) = queue.pop_front() else {
                                unreachable!("just matched")
                            };
                            batch.extend(more);
                        }
                        self.write(batch).await?;
                    }
                    Op::Release(below) => {
                        assert!(
                            release.is_none_or(|r| r <= below),
                            "released below {below} after {release:?}"
                        );
                        release = Some(below);
                    }
                    Op::Close(reply) => {
                        // All of it in one statement: the log is closing, nobody waits behind.
                        if let Some(below) = release.take() {
                            self.delete(below, None).await?;
                        }
                        let _ = reply.send(());
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A deposed master writes nothing more (the statements' fence is the guarantee; this
    /// stops it early).
    fn check_master(&self) -> Result<(), JournalFailure> {
        match self.lost.borrow().clone() {
            Some(reason) => Err(failure(
                &self.s,
                "write",
                format!("no longer master: {reason}"),
            )),
            None => Ok(()),
        }
    }

    async fn statements(&mut self) -> Result<(Statement, Statement), JournalFailure> {
        if let Some(st) = &self.statements {
            return Ok(st.clone());
        }
        let client = &self.conn.client;
        let prepare = async {
            Ok::<_, tokio_postgres::Error>((
                client.prepare(INSERT_SQL).await?,
                client.prepare(DELETE_SQL).await?,
            ))
        };
        let st = db::timed(self.s.db_timeout(), "prepare", prepare)
            .await
            .map_err(|e| failure(&self.s, "prepare", e))?;
        self.statements = Some(st.clone());
        Ok(st)
    }

    /// Writes `batch` (consecutive LSNs) in statements of at most `BATCH_*_MAX`.
    async fn write(&mut self, batch: Vec<(i64, Vec<u8>)>) -> Result<(), JournalFailure> {
        let (insert, _) = self.statements().await?;
        let mut start = 0;
        while start < batch.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < batch.len()
                && end - start < BATCH_RECORDS_MAX
                && (end == start || bytes + batch[end].1.len() <= BATCH_BYTES_MAX)
            {
                bytes += batch[end].1.len();
                end += 1;
            }
            let part = &batch[start..end];
            let lsns: Vec<i64> = part.iter().map(|(l, _)| *l).collect();
            let payloads: Vec<&[u8]> = part.iter().map(|(_, p)| p.as_slice()).collect();
            let epoch = self.epoch as i64;
            let (fence, written) = self
                .fenced(&insert, &[&epoch, &lsns, &payloads], "insert")
                .await?;
            if fence == 0 {
                return Err(self.fenced_out("insert"));
            }
            assert_eq!(
                written,
                part.len() as i64,
                "a fenced insert wrote some of its rows"
            );
            let last = *lsns.last().expect("non-empty part") as Lsn;
            self.durable.send_modify(|d| {
                let before = *d.as_ref().expect("a failed log writes nothing");
                assert!(last > before, "durable LSN must grow: {before} -> {last}");
                *d = Ok(last);
            });
            start = end;
        }
        Ok(())
    }

    /// Deletes the oldest `rows_max` records below `below` (all of them with `None`); returns
    /// how many it deleted.
    async fn delete(&mut self, below: Lsn, rows_max: Option<i64>) -> Result<i64, JournalFailure> {
        let (_, delete) = self.statements().await?;
        let epoch = self.epoch as i64;
        let below_i = below as i64;
        let rows_max = rows_max.unwrap_or(i64::MAX);
        let (fence, deleted) = self
            .fenced(&delete, &[&epoch, &below_i, &rows_max], "delete")
            .await?;
        if fence == 0 {
            return Err(self.fenced_out("delete"));
        }
        tracing::debug!(below, deleted, "store: released records");
        Ok(deleted)
    }

    /// Runs one fenced statement within `db_timeout_ms`; returns (fence rows, rows changed).
    async fn fenced(
        &self,
        stmt: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        op: &'static str,
    ) -> Result<(i64, i64), JournalFailure> {
        let client = &self.conn.client;
        match db::timed(self.s.db_timeout(), op, client.query_one(stmt, params)).await {
            Ok(row) => Ok((row.get(0), row.get(1))),
            Err(e) => {
                if matches!(e, crate::PgError::Timeout { .. }) {
                    // The server gives up on it too (statement_timeout); ask it to now.
                    let token = client.cancel_token();
                    tokio::spawn(async move {
                        let _ = token.cancel_query(tokio_postgres::NoTls).await;
                    });
                }
                Err(failure(&self.s, op, e))
            }
        }
    }

    fn fenced_out(&self, op: &'static str) -> JournalFailure {
        let reason = format!(
            "the database refused a write of epoch {}: another broker took the lease",
            self.epoch
        );
        lease::lose(&self.lost, self.epoch, reason.clone());
        failure(&self.s, op, reason)
    }
}

/// Byte counts of the virtual segments from the first retained record on.
struct Segments {
    first: Lsn,
    /// `bytes[i]`: the segment based at `base(first) + i * SEGMENT_RECORDS`.
    bytes: VecDeque<u64>,
}

fn segment_base(lsn: Lsn) -> Lsn {
    assert!(lsn > 0, "LSNs start at 1");
    (lsn - 1) / SEGMENT_RECORDS * SEGMENT_RECORDS + 1
}

impl Segments {
    fn new(first: Lsn) -> Segments {
        Segments {
            first,
            bytes: VecDeque::new(),
        }
    }

    fn add(&mut self, lsn: Lsn, payload_bytes: usize) {
        let i = ((segment_base(lsn) - segment_base(self.first)) / SEGMENT_RECORDS) as usize;
        while self.bytes.len() <= i {
            self.bytes.push_back(0);
        }
        self.bytes[i] += payload_bytes as u64 + ROW_OVERHEAD_BYTES;
    }

    fn list(&self, next_lsn: Lsn, durable: Lsn) -> Vec<SegmentInfo> {
        let active = segment_base(next_lsn);
        let mut out = Vec::new();
        let mut aligned = segment_base(self.first);
        let mut i = 0;
        while aligned <= active {
            let base = aligned.max(self.first);
            let full_end = aligned + SEGMENT_RECORDS;
            let end = full_end.min(next_lsn).min(durable + 1).max(base);
            out.push(SegmentInfo {
                base_lsn: base,
                end_lsn: end,
                bytes: self.bytes.get(i).copied().unwrap_or(0),
                sealed: aligned < active && end == full_end,
            });
            aligned = full_end;
            i += 1;
        }
        out
    }

    /// Drops whole segments below `lsn` and below the active one; returns how many.
    fn release_before(&mut self, lsn: Lsn, next_lsn: Lsn) -> usize {
        let active = segment_base(next_lsn);
        let mut released = 0;
        loop {
            let end = segment_base(self.first) + SEGMENT_RECORDS;
            if end > lsn || end > active {
                return released;
            }
            self.first = end;
            self.bytes.pop_front();
            released += 1;
        }
    }
}

/// The open log of one mastership, used by the broker's core task only.
struct PgLog {
    s: Arc<Settings>,
    ops: mpsc::UnboundedSender<Op>,
    /// Appended since the last flush. Bounded by the core, which stops taking commands while
    /// too many records or bytes are not durable yet.
    buf: Vec<(i64, Vec<u8>)>,
    next_lsn: Lsn,
    durable_rx: watch::Receiver<Result<Lsn, JournalFailure>>,
    segs: Segments,
    _rt: Arc<PgRuntime>,
}

impl DurableLog for PgLog {
    fn append(&mut self, payload: &[u8]) -> Lsn {
        assert!(
            payload.len() <= self.s.record_bytes_max,
            "record of {} bytes over record_bytes_max {}",
            payload.len(),
            self.s.record_bytes_max
        );
        let lsn = self.next_lsn;
        assert!(lsn <= i64::MAX as u64, "LSN beyond BIGINT");
        self.buf.push((lsn as i64, payload.to_vec()));
        self.segs.add(lsn, payload.len());
        self.next_lsn += 1;
        lsn
    }

    fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        // A send fails only when the writer stopped; its failure is on the watch already.
        let _ = self.ops.send(Op::Records(std::mem::take(&mut self.buf)));
    }

    fn durable(&self) -> watch::Receiver<Result<Lsn, JournalFailure>> {
        self.durable_rx.clone()
    }

    fn durable_lsn(&self) -> Result<Lsn, JournalFailure> {
        self.durable_rx.borrow().clone()
    }

    fn segments(&self) -> Vec<SegmentInfo> {
        let durable = self.durable_rx.borrow().clone().unwrap_or(0);
        self.segs.list(self.next_lsn, durable)
    }

    fn segment_bytes(&self) -> u64 {
        SEGMENT_BYTES_NOMINAL
    }

    fn release_before(&mut self, lsn: Lsn) -> usize {
        let released = self.segs.release_before(lsn, self.next_lsn);
        if released > 0 {
            // Behind every record appended so far: what supersedes the deleted records is
            // committed first.
            self.flush();
            let _ = self.ops.send(Op::Release(self.segs.first));
        }
        released
    }

    fn free_bytes(&self) -> Option<u64> {
        None
    }

    fn close(mut self: Box<Self>) -> Result<(), JournalError> {
        self.flush();
        let (reply, replied) = std::sync::mpsc::channel();
        let _ = self.ops.send(Op::Close(reply));
        // Each queued write is bounded by db_timeout_ms and the first failure ends the writer
        // (dropping `reply`), so this wait is bounded too; the extra bound is a backstop.
        let backstop = Duration::from_millis(self.s.db_timeout_ms.saturating_mul(4));
        match replied.recv_timeout(backstop) {
            Ok(()) => Ok(()),
            Err(e) => Err(JournalError::Failed(
                match self.durable_rx.borrow().clone() {
                    Err(f) => f,
                    Ok(_) => failure(&self.s, "close", format!("the writer did not finish: {e}")),
                },
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_aligned_and_sealed_only_when_full_and_durable() {
        let mut s = Segments::new(1);
        let n = SEGMENT_RECORDS;
        for lsn in 1..=2 * n + 3 {
            s.add(lsn, 10);
        }
        let list = s.list(2 * n + 4, 2 * n + 3);
        assert_eq!(list.len(), 3);
        assert_eq!((list[0].base_lsn, list[0].end_lsn), (1, n + 1));
        assert!(list[0].sealed && list[1].sealed && !list[2].sealed);
        assert_eq!(list[0].bytes, n * (10 + ROW_OVERHEAD_BYTES));
        // Not durable yet: not sealed.
        let list = s.list(2 * n + 4, n);
        assert!(list[0].sealed && !list[1].sealed);
    }

    #[test]
    fn release_drops_whole_segments_below_the_active_one() {
        let mut s = Segments::new(1);
        let n = SEGMENT_RECORDS;
        for lsn in 1..=2 * n + 3 {
            s.add(lsn, 1);
        }
        assert_eq!(s.release_before(n, 2 * n + 4), 0, "not a whole segment");
        assert_eq!(
            s.release_before(10 * n, 2 * n + 4),
            2,
            "never the active one"
        );
        assert_eq!(s.first, 2 * n + 1);
        let list = s.list(2 * n + 4, 2 * n + 3);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].base_lsn, 2 * n + 1);
    }

    #[test]
    fn a_store_starting_mid_segment_lists_a_partial_first_segment() {
        let mut s = Segments::new(5);
        for lsn in 5..=SEGMENT_RECORDS + 1 {
            s.add(lsn, 1);
        }
        let list = s.list(SEGMENT_RECORDS + 2, SEGMENT_RECORDS + 1);
        assert_eq!(list[0].base_lsn, 5);
        assert!(list[0].sealed);
        assert_eq!(list[1].base_lsn, SEGMENT_RECORDS + 1);
    }
}
