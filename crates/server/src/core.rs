//! The broker core: one task owns the engine and the journal.
//!
//! Connections send it commands; it applies each to the engine, appends the records the engine
//! emits to the journal, and holds every effect (MESSAGE, RECEIPT, ERROR) until the journal
//! reports durable every record appended before it. Effects are released strictly in the
//! order they were produced, so a RECEIPT never overtakes the sync it depends on and a client
//! sees its own frames answered in order. Many commands share one `fdatasync`: the journal's
//! writer thread syncs whatever accumulated while the previous sync ran (group commit).
//!
//! Ownership: only this task touches `Engine` and `Journal`. Connection tasks own their
//! sockets and hear from the core through an unbounded channel whose growth is bounded by
//! prefetch credit (deliveries) and by each client's own requests (receipts).

use crate::error::ServerError;
use crate::send_window::{send_body_bytes, SendCredit};
use haven_engine::hash::IdMap;
use haven_engine::{
    Command, ConnId, Ctx, Delivery, Effect, Engine, EngineError, OriginStats, Output, Record,
};
use haven_journal::{JournalFailure, Lsn, SegmentInfo};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::log::DurableLog;
use tokio::sync::{mpsc, oneshot, watch};

/// What a connection receives from the core.
#[derive(Debug)]
pub(crate) enum Outbound {
    Deliver(Delivery),
    Receipt(String),
    /// Send ERROR, then close.
    Error {
        message: String,
        receipt: Option<String>,
    },
    /// Close after writing everything before this.
    Close,
    /// Producer flow control: stop reading the socket (TCP pushes back on the client) until
    /// `Resume`.
    Pause,
    Resume,
}

/// The answer to a CONNECT: the claimed producer's mark (0 if none), or why it was refused.
pub(crate) type ConnectReply = oneshot::Sender<Result<u64, EngineError>>;

pub(crate) enum CoreMsg {
    Connect {
        conn: ConnId,
        client_id: Option<String>,
        /// `haven-producer`: the reply carries its mark (0 if unknown or not given), sent only
        /// once every record appended so far — the one that raised the mark among them — is
        /// durable, so the client may treat every seq up to it as stored.
        producer: Option<String>,
        /// `haven-session` (0 when absent), see `Command::Connect`.
        session: u64,
        outbound: mpsc::UnboundedSender<Outbound>,
        reply: ConnectReply,
    },
    Command(Command),
    /// A client connection's SEND with its bytes in the connection's window
    /// (`send_window.rs`), given back as the core takes it off the queue.
    Send(Command, SendCredit),
    /// The connection broke a protocol rule: ERROR (after what is already queued for it),
    /// then close.
    Fail {
        conn: ConnId,
        message: String,
        receipt: Option<String>,
    },
}

/// Commands drained from the channel per wake-up before the journal is kicked: bounds the
/// latency one busy burst can add to the next sync.
const COMMANDS_PER_BATCH_MAX: usize = 4096;

/// How often delayed redeliveries are checked for being due: the delay's resolution.
const REDELIVERY_TICK_MS: u64 = 20;

/// How often a busy core looks for journal segments to delete between maintenance rounds.
/// A deletion takes two looks (a checkpoint record, then the deletion once it is durable), and
/// at 100 ms a segment is released well within the time the next one takes to fill (a busy
/// broker fills 64 MiB in about 250 ms), so the writer recycles it instead of zero-filling a
/// new one. A look that finds nothing to do costs a lock and a short list.
const SEGMENT_RELEASE_INTERVAL: Duration = Duration::from_millis(100);

/// Unsynced records that nothing waits for, beyond which they are synced anyway.
const LAZY_RECORDS_MAX: u64 = 1_000;

/// Records appended but not yet durable beyond which the core stops taking commands.
const UNSYNCED_RECORDS_MAX: u64 = 50_000;

/// Record bytes appended but not yet durable beyond which the core stops taking commands:
/// bounds the journal's buffers and the messages held in memory until their record is durable
/// (a deep backlog's new arrivals), whatever the message size. 8 MiB (was 16): with 64 KiB
/// messages the producer is held to the disk's pace before its backlog pages out, and
/// scenario (f) ran 15–20% faster on a quarter less CPU; 1 KiB scenarios within their spread
/// (docs/PERFORMANCE.md, "Memory with large messages").
const UNSYNCED_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// Message bytes one maintenance round re-logs at most when it compacts (the next round goes
/// on): as many as the unsynced records the core lets wait for a sync. Bounded in records
/// alone (`journal.compaction_records_max`), a sparse segment of 64 KiB messages had 30 MiB
/// and more re-logged at once, each paged-out one read back for it: the journal's buffer then
/// peaked at 50 MiB (heaptrack of scenario (f), BENCHMARKS.md), outside every memory bound.
const COMPACTION_BYTES_MAX: u64 = UNSYNCED_BYTES_MAX;

/// Commands of one held-back connection queued behind its waiting SEND, beyond which its
/// socket is no longer read (the client then blocks on TCP).
const PARKED_COMMANDS_MAX: usize = 1_000;

/// The same bound in message body bytes: 4 MiB. Counted in commands alone, a producer of
/// 64 KiB messages with many RECEIPTs outstanding had 1,000 SENDs (64 MiB) parked before its
/// socket stopped being read, outside every memory bound (scenario (f), BENCHMARKS.md).
const PARKED_BYTES_MAX: usize = 4 * 1024 * 1024;

/// At most one "SEND held back" line per this long (the rest are counted in the next).
const HELD_BACK_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// At most one line about the network-origin table per this long, and only when it changed
/// (as the bridges report theirs).
const ORIGINS_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// At most one warning about producers forgotten for room per this long, and only when more
/// were.
const PRODUCERS_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Counts events and says when to log them: the first at once, then at most once per
/// `interval`, with how many happened since the last line.
#[derive(Debug)]
struct LogThrottle {
    interval: Duration,
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl LogThrottle {
    fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            interval,
            unlogged: 0,
            logged_at: None,
        }
    }

    /// One event at `now`: Some(events since the last line, this one included) if a line is
    /// due.
    fn note(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        let due = self
            .logged_at
            .is_none_or(|at| now.duration_since(at) >= self.interval);
        if !due {
            return None;
        }
        self.logged_at = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// Body bytes `cmd` holds while parked.
fn parked_bytes(cmd: &Command) -> usize {
    send_body_bytes(cmd).unwrap_or(0)
}

/// Limits the core enforces itself (the engine enforces the per-destination ones).
#[derive(Clone, Debug)]
pub(crate) struct CoreLimits {
    pub compaction_records_max: usize,
    /// A SEND held back longer than this is refused with an ERROR naming the limit.
    pub producer_wait_ms_max: u64,
    /// Journal bytes at which persistent SENDs are held back (0 = none).
    pub disk_bytes_max: u64,
    /// Free bytes on the journal's file system below which persistent SENDs are held back.
    pub disk_free_bytes_min: u64,
    /// For the log line when paging starts.
    pub memory_bytes_max: u64,
}

/// A connection whose SEND waits for a limit, with every later command it sent (in order).
struct Parked {
    cmds: VecDeque<Command>,
    /// Body bytes of `cmds` (`parked_bytes`).
    bytes: usize,
    /// When the SEND at the front was first held back.
    since: Instant,
    paused: bool,
}
pub(crate) struct Core {
    engine: Engine,
    journal: Box<dyn DurableLog>,
    clock: Arc<dyn Clock>,
    /// Keyed by the ids the broker assigns, so not hashed with a secret (`IdMap`).
    conns: IdMap<mpsc::UnboundedSender<Outbound>>,
    /// Effects waiting for the journal: (LSN that must be durable, connection, effect).
    gated: VecDeque<(Lsn, ConnId, Outbound)>,
    /// CONNECT answers carrying a producer's mark, waiting for the journal like `gated`
    /// (kept apart: the connection is not served until it has its answer, so nothing else
    /// for it is queued and order with `gated` does not matter).
    gated_replies: VecDeque<(Lsn, ConnectReply, u64)>,
    durable: Lsn,
    out: Vec<Output>,
    buf: Vec<u8>,
    limits: CoreLimits,
    /// A checkpoint appended for segment deletion; segments are deleted once it is durable.
    checkpoint: Option<Lsn>,
    /// Connections held back by producer flow control.
    parked: BTreeMap<ConnId, Parked>,
    /// Why persistent SENDs are held back now (a disk limit), if they are.
    disk_block: Option<String>,
    /// Whether messages were paged out at the last maintenance (to log changes once).
    paging: bool,
    /// Producer flow control's log line (a held-back producer is held again at every batch it
    /// sends, so the line is throttled).
    held_back_log: LogThrottle,
    /// The network-origin table as last logged, and its line's throttle (a line per change).
    origins_logged: OriginStats,
    origins_log: LogThrottle,
    /// Producers forgotten for room as of the last warning, and its throttle.
    producers_room_logged: u64,
    producers_log: LogThrottle,
    /// A failure the engine met (a paged-out message could not be read back): stop.
    fatal: Option<String>,
    /// The last LSN appended as of the previous loop turn (see the assertion in `run`).
    appended_last: Lsn,
    /// Shared-store modes: set when mastership is lost (see `crate::ha`).
    lost: Option<watch::Receiver<Option<String>>>,
    /// Record bytes appended since start, and (last LSN, total then) per loop round not yet
    /// durable: what `UNSYNCED_BYTES_MAX` measures.
    appended_bytes: u64,
    appended_marks: VecDeque<(Lsn, u64)>,
    synced_bytes: u64,
}

/// Commands a held-back connection may still have applied at once: acknowledgements nobody
/// awaits an answer to (a connection that consumes what it produces must be able to drain),
/// and internal credit.
fn bypasses_parking(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Credit { .. }
            | Command::Ack {
                transaction: None,
                receipt: None,
                ..
            }
            | Command::Nack {
                transaction: None,
                receipt: None,
                ..
            }
    )
}

fn receipt_of(cmd: &Command) -> Option<String> {
    match cmd {
        Command::Close { receipt, .. }
        | Command::Subscribe { receipt, .. }
        | Command::Unsubscribe { receipt, .. }
        | Command::Send { receipt, .. }
        | Command::Ack { receipt, .. }
        | Command::Nack { receipt, .. }
        | Command::Begin { receipt, .. }
        | Command::Commit { receipt, .. }
        | Command::Abort { receipt, .. } => receipt.clone(),
        Command::Receipt { receipt, .. } => Some(receipt.clone()),
        Command::Connect { .. } | Command::Credit { .. } => None,
    }
}

/// Resolves with the reason once mastership is lost; never, outside the shared-store modes
/// (or once the sender is gone, which only happens as the broker stops anyway).
async fn lost_mastership(lost: &mut Option<watch::Receiver<Option<String>>>) -> String {
    let Some(rx) = lost else {
        return std::future::pending().await;
    };
    let reason = match rx.wait_for(|l| l.is_some()).await {
        Ok(reason) => reason.clone(),
        Err(_) => None,
    };
    match reason {
        Some(reason) => reason,
        None => std::future::pending().await,
    }
}

impl Core {
    pub fn new(
        mut engine: Engine,
        journal: Box<dyn DurableLog>,
        limits: CoreLimits,
        clock: Arc<dyn Clock>,
        lost: Option<watch::Receiver<Option<String>>>,
    ) -> Core {
        let durable = journal.durable_lsn().unwrap_or(0);
        let resume = engine.set_durable_lsn(durable + 1);
        assert!(!resume, "no page-in waits before anyone consumed");
        Core {
            engine,
            journal,
            clock,
            conns: IdMap::default(),
            gated: VecDeque::new(),
            gated_replies: VecDeque::new(),
            durable,
            out: Vec::new(),
            buf: Vec::with_capacity(64 * 1024),
            limits,
            checkpoint: None,
            parked: BTreeMap::new(),
            disk_block: None,
            paging: false,
            held_back_log: LogThrottle::new(HELD_BACK_LOG_INTERVAL),
            origins_logged: OriginStats::default(),
            origins_log: LogThrottle::new(ORIGINS_LOG_INTERVAL),
            producers_room_logged: 0,
            producers_log: LogThrottle::new(PRODUCERS_LOG_INTERVAL),
            fatal: None,
            appended_last: durable,
            lost,
            appended_bytes: 0,
            appended_marks: VecDeque::new(),
            synced_bytes: 0,
        }
    }

    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<CoreMsg>,
        mut stop: watch::Receiver<bool>,
        maintenance: Duration,
    ) -> Result<(), ServerError> {
        let mut durable_rx = self.journal.durable();
        let mut tick = tokio::time::interval(maintenance);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut redelivery = tokio::time::interval(Duration::from_millis(REDELIVERY_TICK_MS));
        redelivery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lost = self.lost.take();
        let mut spell = crate::idle::IdleSpell::default();
        // The select below is biased toward work: under sustained load the timers' branches
        // are rarely reached (measured: one segment deletion in 3 s of scenario (c), so every
        // new segment was zero-filled and disk limits were checked as rarely). Timed work is
        // done on these deadlines, checked after every turn; the timers only make it due at
        // once, so an idle core does it on time.
        let mut maintenance_due = Instant::now() + maintenance;
        let mut release_due = Instant::now() + SEGMENT_RELEASE_INTERVAL;
        let mut delayed_due = Instant::now();
        // The tick saw a whole maintenance interval without a command.
        let mut spell_began = false;
        let result = loop {
            tokio::select! {
                biased;
                // First: a broker that is no longer master must not write another record.
                reason = lost_mastership(&mut lost) => break Err(ServerError::Fenced(reason)),
                // Before work, or a busy broker would not stop until its producers did.
                _ = stop.changed() => break Ok(()),
                changed = durable_rx.changed() => {
                    if changed.is_err() {
                        break Err(ServerError::JournalFailed("journal writer stopped".into()));
                    }
                    let state: Result<Lsn, JournalFailure> = durable_rx.borrow_and_update().clone();
                    match state {
                        Ok(lsn) => self.durable_advanced(lsn),
                        Err(f) => break Err(ServerError::JournalFailed(f.to_string())),
                    }
                }
                // Producers outrunning the disk wait here instead of growing the journal's
                // buffer without bound.
                msg = rx.recv(), if self.accepting() => {
                    let Some(msg) = msg else { break Ok(()) };
                    spell.busy();
                    self.on_msg(msg);
                    for _ in 0..COMMANDS_PER_BATCH_MAX {
                        if !self.accepting() {
                            break;
                        }
                        match rx.try_recv() {
                            Ok(msg) => self.on_msg(msg),
                            Err(_) => break,
                        }
                    }
                }
                // Delayed redeliveries and scheduled messages become due as time passes (the
                // work is done below, after every turn).
                _ = redelivery.tick(), if self.engine.has_delayed() => delayed_due = Instant::now(),
                _ = tick.tick() => {
                    spell_began = spell.tick();
                    maintenance_due = Instant::now();
                }
            }
            let now = Instant::now();
            if self.engine.has_delayed() && now >= delayed_due {
                let ctx = self.ctx();
                self.engine.tick(ctx, &mut self.out);
                self.absorb();
                delayed_due = now + Duration::from_millis(REDELIVERY_TICK_MS);
            }
            if now >= maintenance_due {
                self.maintain();
                // Bounds how long a lazy record waits for a sync.
                self.journal.flush();
                maintenance_due = now + maintenance;
                release_due = now + SEGMENT_RELEASE_INTERVAL;
                if spell.is_quiet() {
                    // On every quiet tick, after `maintain`: compaction re-logs records
                    // while the broker is quiet and grows the buffers again.
                    self.journal.release_idle_buffers();
                }
                if std::mem::take(&mut spell_began) {
                    // No command for a whole maintenance interval.
                    crate::idle::idle();
                }
            } else if now >= release_due || self.checkpoint.is_some_and(|cp| self.durable >= cp) {
                self.release_segments_now();
                release_due = now + SEGMENT_RELEASE_INTERVAL;
            }
            if !self.parked.is_empty() {
                self.retry_parked();
            }
            if let Some(f) = self.fatal.take() {
                break Err(ServerError::JournalFailed(f));
            }
            let last = self.journal.next_lsn() - 1;
            // A log numbers on from its own appends, whatever another writer did to the store:
            // gates (RECEIPTs, CONNECT marks) rely on it.
            assert!(
                last >= self.appended_last,
                "the log's next LSN went back from {} to {}",
                self.appended_last + 1,
                last + 1
            );
            self.appended_last = last;
            if last <= self.durable {
                // Everything appended is durable already.
                self.appended_marks.clear();
                self.synced_bytes = self.appended_bytes;
            } else if self.appended_marks.back().is_none_or(|m| m.0 < last) {
                self.appended_marks.push_back((last, self.appended_bytes));
            }
            self.kick_journal();
        };
        if let Err(e) = &result {
            // fsync errors cannot be retried safely: stop serving at once.
            tracing::error!("stopping: {e}");
            return result;
        }
        // Orderly stop: make everything appended durable and tell clients what completed.
        self.journal.flush();
        let journal = self.journal;
        let closed = tokio::task::spawn_blocking(move || journal.close())
            .await
            .expect("journal close task");
        closed.map_err(|e| ServerError::JournalFailed(e.to_string()))?;
        let gated = std::mem::take(&mut self.gated);
        for (_, conn, ob) in gated {
            if let Some(tx) = self.conns.get(&conn) {
                let _ = tx.send(ob);
            }
        }
        for (_, reply, hwm) in self.gated_replies.drain(..) {
            let _ = reply.send(Ok(hwm));
        }
        for (_, tx) in self.conns.drain() {
            let _ = tx.send(Outbound::Close);
        }
        Ok(())
    }

    /// Hands appended records to the journal writer when something waits for them: a gated
    /// answer, or a large unsynced backlog. Records nobody waits for (the removes of auto-ack
    /// deliveries) ride along with the next sync instead of costing one of their own — a
    /// crash before then redelivers those messages, which `ack:auto` allows.
    ///
    /// A core that stopped accepting commands until its unsynced records are synced flushes
    /// too, whoever waits: otherwise nothing would until the next timed flush (the segment
    /// release's, every 100 ms). Producers that ask no RECEIPT met that: 8 MiB of their
    /// 64 KiB SENDs (fewer than `LAZY_RECORDS_MAX` records) stopped the core for up to 100 ms.
    fn kick_journal(&mut self) {
        let unsynced = self.journal.next_lsn() - 1 - self.durable;
        if !self.gated.is_empty()
            || !self.gated_replies.is_empty()
            || unsynced >= LAZY_RECORDS_MAX
            || !self.accepting()
        {
            self.journal.flush();
        }
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            now_ms: self.clock.now_ms(),
            next_lsn: self.journal.next_lsn(),
        }
    }

    fn on_msg(&mut self, msg: CoreMsg) {
        match msg {
            CoreMsg::Send(cmd, credit) => {
                // Off the queue: from here the core's own bounds hold it (parked bytes,
                // unsynced bytes, memory).
                drop(credit);
                self.on_msg(CoreMsg::Command(cmd));
            }
            CoreMsg::Connect {
                conn,
                client_id,
                producer,
                session,
                outbound,
                reply,
            } => {
                let ctx = self.ctx();
                let r = self.engine.handle(
                    Command::Connect {
                        conn,
                        client_id,
                        producer: producer.clone(),
                        session,
                    },
                    ctx,
                    &mut self.out,
                );
                if r.is_ok() {
                    self.conns.insert(conn, outbound);
                }
                self.absorb();
                match (r, producer) {
                    (Ok(()), Some(p)) => {
                        let hwm = self.engine.producer_hwm(&p);
                        let gate = self.journal.next_lsn() - 1;
                        if gate <= self.durable {
                            let _ = reply.send(Ok(hwm));
                        } else {
                            self.gated_replies.push_back((gate, reply, hwm));
                        }
                    }
                    (r, _) => {
                        let _ = reply.send(r.map(|()| 0));
                    }
                }
            }
            CoreMsg::Command(cmd) => {
                let conn = cmd.conn();
                if let Some(p) = self.parked.get_mut(&conn) {
                    if !bypasses_parking(&cmd) {
                        if matches!(cmd, Command::Close { receipt: None, .. }) {
                            // The socket is gone: what it was waiting to send was never
                            // receipted. (A DISCONNECT with a receipt waits its turn: its
                            // RECEIPT says every earlier frame was handled.)
                            self.parked.remove(&conn);
                        } else {
                            p.bytes += parked_bytes(&cmd);
                            p.cmds.push_back(cmd);
                            let full =
                                p.cmds.len() >= PARKED_COMMANDS_MAX || p.bytes >= PARKED_BYTES_MAX;
                            if full && !p.paused {
                                p.paused = true;
                                self.send(conn, Outbound::Pause);
                            }
                            return;
                        }
                    }
                } else if let Some(reason) = self.held_back(&cmd) {
                    self.log_held_back(conn, &reason);
                    let parked = Parked {
                        bytes: parked_bytes(&cmd),
                        cmds: VecDeque::from([cmd]),
                        since: Instant::now(),
                        paused: false,
                    };
                    self.parked.insert(conn, parked);
                    return;
                }
                self.apply(cmd);
            }
            CoreMsg::Fail {
                conn,
                message,
                receipt,
            } => self.fail(conn, message, receipt),
        }
    }

    /// Logs that `conn` is held back: at once the first time, then at most once per
    /// `HELD_BACK_LOG_INTERVAL` with the count since the last line, so a producer held at
    /// every batch for minutes writes a line every few seconds, not hundreds.
    fn log_held_back(&mut self, conn: ConnId, reason: &str) {
        if let Some(held_back) = self.held_back_log.note(Instant::now()) {
            tracing::warn!(
                conn,
                %reason,
                held_back,
                "producer flow control: SEND held back (held_back: times since the last such line)"
            );
        }
    }

    /// Why `cmd` must wait now, if it must: a SEND to a destination at its limit, or a
    /// persistent SEND while the disk is at its limit.
    fn held_back(&self, cmd: &Command) -> Option<String> {
        let Command::Send {
            destination,
            message,
            ..
        } = cmd
        else {
            return None;
        };
        if message.persistent {
            if let Some(reason) = &self.disk_block {
                return Some(reason.clone());
            }
        }
        self.engine.admission(destination).err()
    }

    /// Lets held-back connections go on as far as the limits now allow; refuses a SEND that
    /// waited longer than `producer_wait_ms_max`.
    fn retry_parked(&mut self) {
        let wait_max = Duration::from_millis(self.limits.producer_wait_ms_max);
        let conns: Vec<ConnId> = self.parked.keys().copied().collect();
        for conn in conns {
            while let Some(p) = self.parked.get(&conn) {
                if !self.accepting() {
                    // The rest waits for the sync, like commands still in the channel.
                    return;
                }
                let Some(cmd) = p.cmds.front() else {
                    let p = self.parked.remove(&conn).expect("present");
                    if p.paused {
                        self.send(conn, Outbound::Resume);
                    }
                    break;
                };
                if let Some(reason) = self.held_back(cmd) {
                    if p.since.elapsed() >= wait_max {
                        let receipt = receipt_of(cmd);
                        let waited = p.since.elapsed().as_millis();
                        self.parked.remove(&conn);
                        let message = format!(
                            "flow control: {reason}; the SEND waited {waited} ms \
                             (limits.producer_wait_ms_max = {})",
                            self.limits.producer_wait_ms_max
                        );
                        tracing::warn!(conn, %message, "producer refused");
                        self.fail(conn, message, receipt);
                    }
                    break;
                }
                let p = self.parked.get_mut(&conn).expect("present");
                let cmd = p.cmds.pop_front().expect("front exists");
                p.bytes -= parked_bytes(&cmd);
                p.since = Instant::now();
                self.apply(cmd);
            }
        }
    }

    /// Whether the core takes another command now: producers outrunning the disk wait (in
    /// the channel, or parked) instead of growing the journal's buffers without bound. Checked
    /// before every command, not once per wake-up: 4,096 commands of 64 KiB SENDs had put
    /// 256 MiB into the buffers at once, and the buffers keep their size.
    fn accepting(&self) -> bool {
        self.journal.next_lsn() - 1 - self.durable < UNSYNCED_RECORDS_MAX
            && self.appended_bytes - self.synced_bytes < UNSYNCED_BYTES_MAX
    }

    /// Runs one command through the engine and queues what it produced.
    fn apply(&mut self, cmd: Command) {
        let conn = cmd.conn();
        let is_close = matches!(cmd, Command::Close { .. });
        let receipt = receipt_of(&cmd);
        let ctx = self.ctx();
        let duplicates = self.engine.producer_stats().duplicates_dropped_total;
        match self.engine.handle(cmd, ctx, &mut self.out) {
            Ok(()) => {
                if self.engine.producer_stats().duplicates_dropped_total > duplicates {
                    tracing::debug!(
                        conn,
                        "duplicate SEND/COMMIT (producer sequence): answered, not stored"
                    );
                }
                self.absorb();
                if is_close {
                    self.emit(conn, Outbound::Close);
                }
            }
            // Already closed (an error or DISCONNECT raced with frames in flight).
            Err(EngineError::UnknownConnection) => {}
            Err(e) => self.fail(conn, e.to_string(), receipt),
        }
    }

    fn fail(&mut self, conn: ConnId, message: String, receipt: Option<String>) {
        self.parked.remove(&conn);
        if !self.conns.contains_key(&conn) {
            return;
        }
        tracing::debug!(conn, %message, "closing connection with ERROR");
        self.emit(conn, Outbound::Error { message, receipt });
        let ctx = self.ctx();
        self.engine
            .handle(
                Command::Close {
                    conn,
                    receipt: None,
                },
                ctx,
                &mut self.out,
            )
            .expect("close never fails");
        self.absorb();
        self.emit(conn, Outbound::Close);
    }

    /// Appends the engine's records and queues its effects behind them.
    fn absorb(&mut self) {
        if let Some(f) = self.engine.take_fatal() {
            tracing::error!("{f}");
            self.fatal = Some(f);
        }
        let mut out = std::mem::take(&mut self.out);
        for o in out.drain(..) {
            match o {
                Output::Log(record) => {
                    self.buf.clear();
                    record.encode(&mut self.buf);
                    let expected = self.journal.next_lsn();
                    self.appended_bytes += self.buf.len() as u64;
                    let lsn = self.journal.append(&self.buf);
                    assert_eq!(lsn, expected, "journal LSNs are consecutive");
                }
                Output::Effect(Effect::Deliver { conn, delivery }) => {
                    self.emit(conn, Outbound::Deliver(delivery))
                }
                Output::Effect(Effect::Receipt { conn, receipt }) => {
                    self.emit(conn, Outbound::Receipt(receipt))
                }
            }
        }
        self.out = out;
    }

    fn emit(&mut self, conn: ConnId, ob: Outbound) {
        let gate = self.journal.next_lsn() - 1;
        if gate <= self.durable && self.gated.is_empty() {
            self.send(conn, ob);
        } else {
            self.gated.push_back((gate, conn, ob));
        }
    }

    fn send(&mut self, conn: ConnId, ob: Outbound) {
        let close = matches!(ob, Outbound::Close);
        if let Some(tx) = self.conns.get(&conn) {
            // A connection task that already exited drops its receiver; its Close is on the way.
            let _ = tx.send(ob);
        }
        if close {
            self.conns.remove(&conn);
        }
    }

    /// The journal made everything up to `durable` durable.
    fn durable_advanced(&mut self, durable: Lsn) {
        if self.release(durable) {
            let ctx = self.ctx();
            self.engine.resume_page_ins(ctx, &mut self.out);
            self.absorb();
        }
    }

    /// Everything up to `durable` is on disk: answers what waited for it. Returns whether a
    /// page-in waited for it too (the caller resumes them: `Engine::resume_page_ins`).
    #[must_use]
    fn release(&mut self, durable: Lsn) -> bool {
        assert!(durable >= self.durable, "durable LSN went backwards");
        self.durable = durable;
        let resume = self.engine.set_durable_lsn(durable + 1);
        while let Some(&(lsn, bytes)) = self.appended_marks.front() {
            if lsn > durable {
                break;
            }
            self.synced_bytes = bytes;
            self.appended_marks.pop_front();
        }
        while self
            .gated
            .front()
            .is_some_and(|(gate, _, _)| *gate <= durable)
        {
            let (_, conn, ob) = self.gated.pop_front().expect("front exists");
            self.send(conn, ob);
        }
        while self
            .gated_replies
            .front()
            .is_some_and(|(gate, _, _)| *gate <= durable)
        {
            let (_, reply, hwm) = self.gated_replies.pop_front().expect("front exists");
            let _ = reply.send(Ok(hwm));
        }
        resume
    }

    /// Sets `disk_block` from the journal's size and the file system's free space; logs when
    /// it changes.
    fn check_disk(&mut self, segments: u64) {
        let used = segments * self.journal.segment_bytes();
        let l = &self.limits;
        let block = if l.disk_bytes_max > 0 && used >= l.disk_bytes_max {
            Some(format!(
                "the journal uses {used} bytes (limits.disk_bytes_max = {})",
                l.disk_bytes_max
            ))
        } else {
            match self.journal.free_bytes() {
                Some(free) if free < l.disk_free_bytes_min => Some(format!(
                    "{free} bytes free on the journal's file system \
                     (limits.disk_free_bytes_min = {})",
                    l.disk_free_bytes_min
                )),
                _ => None,
            }
        };
        match (&self.disk_block, &block) {
            (None, Some(reason)) => {
                tracing::warn!(%reason, "disk limit reached: persistent SENDs are held back")
            }
            (Some(_), None) => tracing::info!("disk back under its limits: SENDs flow again"),
            _ => {}
        }
        self.disk_block = block;
    }

    fn log_paging(&mut self) {
        let stats = self.engine.memory_stats();
        let paging = stats.paged_out > 0;
        if paging && !self.paging {
            tracing::info!(
                paged_out = stats.paged_out,
                memory_bytes = stats.hot_bytes,
                limit = self.limits.memory_bytes_max,
                "memory limit reached: waiting messages beyond it stay in the journal only"
            );
        } else if !paging && self.paging {
            tracing::info!(
                paged_in_total = stats.paged_in_total,
                "no messages paged out any more"
            );
        }
        self.paging = paging;
    }

    /// On a broker that others forward to: what its memory of forwarded messages holds, how
    /// many resends it recognised, and how many origins it forgot to make room (growing fast
    /// against a source's in-flight batches means `network_origins_max` is small for the
    /// traffic; docs/NETWORK.md).
    fn log_origins(&mut self) {
        let stats = self.engine.origin_stats();
        if stats == self.origins_logged || self.origins_log.note(Instant::now()).is_none() {
            return;
        }
        tracing::info!(
            remembered = stats.remembered,
            sources = stats.sources,
            resends_dropped_total = stats.duplicates_dropped_total,
            forgotten_total = stats.forgotten_total,
            forgotten_for_room_total = stats.forgotten_for_room_total,
            "network origins"
        );
        self.origins_logged = stats;
    }

    /// Warns while the producer table forgets producers to make room (`limits.producers_max`)
    /// rather than for idleness: the exactly-once window is then shorter than
    /// `producer_idle_ms_max`, and `window_s` says how short. Nothing else shows it: a client
    /// that comes back forgotten gets `haven-seq:0` and its resends are stored again.
    fn log_producers_forgotten_for_room(&mut self) {
        let stats = self.engine.producer_stats();
        let total = stats.forgotten_for_room_total;
        if total == self.producers_room_logged || self.producers_log.note(Instant::now()).is_none()
        {
            return;
        }
        tracing::warn!(
            producers = stats.producers,
            forgotten_for_room = total - self.producers_room_logged,
            forgotten_for_room_total = total,
            window_s = stats.room_window_ms.unwrap_or(0) / 1000,
            "producer table full (limits.producers_max): producers are forgotten to make room; \
             a client away longer than window_s that resends has its message stored again"
        );
        self.producers_room_logged = total;
    }

    /// Frees disk: deletes segments nothing live needs, and re-logs the few live records of
    /// a sparse oldest segment so it can be deleted next time.
    fn maintain(&mut self) {
        // Hand every appended record to the writer before any deletion: the engine's live
        // watermark already counts records not yet durable (a DLQ move, a durable
        // unsubscribe), which may supersede records in the segments about to go. The writer
        // writes and syncs a batch before the deletions queued with or after it, so such a
        // record is on disk before what it supersedes is deleted.
        self.journal.flush();
        let segments = self.journal.segments();
        self.check_disk(segments.len() as u64);
        self.log_paging();
        self.log_origins();
        self.log_producers_forgotten_for_room();
        // Idle producers are forgotten by the engine's clock (also when no redelivery or
        // schedule makes the core tick more often).
        let ctx = self.ctx();
        self.engine.tick(ctx, &mut self.out);
        self.absorb();
        self.release_segments(&segments);
        let sealed: Vec<_> = segments.iter().filter(|s| s.sealed).collect();
        if let Some(oldest) = sealed.first() {
            let records = oldest.end_lsn - oldest.base_lsn;
            let live = self.engine.live_count_in(oldest.base_lsn, oldest.end_lsn) as u64;
            // Compact only when most of the segment is garbage: copying is cheap then.
            if live > 0 && live * 4 < records {
                let ctx = self.ctx();
                let n = self.engine.relocate_below(
                    oldest.end_lsn,
                    self.limits.compaction_records_max,
                    COMPACTION_BYTES_MAX,
                    ctx,
                    &mut self.out,
                );
                self.absorb();
                tracing::debug!(
                    n,
                    segment = oldest.base_lsn,
                    "compacted live records out of a sparse segment"
                );
            }
        }
    }

    /// Between maintenance rounds: the part of [`Core::maintain`] that frees disk. A busy
    /// broker fills a 64 MiB segment every quarter of a second or so; released promptly, a
    /// segment is recycled as the next spare instead of a new one being zero-filled
    /// (measured before: about 40% of what a busy broker's journal wrote was zeros).
    fn release_segments_now(&mut self) {
        // As in `maintain`: every appended record goes to the writer before any deletion.
        self.journal.flush();
        let segments = self.journal.segments();
        self.release_segments(&segments);
    }

    /// Deletes the segments nothing live needs, in two steps so that message numbering
    /// survives: first a checkpoint record (where numbering stands), then, once it is durable,
    /// the deletion of every segment wholly below both it and the oldest live record.
    /// The caller has flushed the journal.
    fn release_segments(&mut self, segments: &[SegmentInfo]) {
        let next = self.journal.next_lsn();
        let min_live = self.engine.min_live_lsn().unwrap_or(next);
        if let Some(cp) = self.checkpoint {
            if self.durable >= cp {
                let deleted = self.journal.release_before(min_live.min(cp));
                if deleted > 0 {
                    tracing::info!(
                        deleted,
                        "deleted journal segments holding only acknowledged data"
                    );
                }
                self.checkpoint = None;
            }
        } else if segments.iter().any(|s| s.sealed && s.end_lsn <= min_live) {
            // Message numbering must survive the deletion: record where it stands first.
            self.buf.clear();
            Record::Checkpoint {
                next_seq: self.engine.next_seq(),
            }
            .encode(&mut self.buf);
            self.checkpoint = Some(self.journal.append(&self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haven_engine::{AckMode, AckRef, Destination, EngineConfig, NewMessage, QueueKey};
    use haven_journal::JournalConfig;

    #[test]
    fn a_throttled_log_line_is_written_at_once_then_once_per_interval_with_the_count() {
        let mut t = LogThrottle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(t.note(start), Some(1), "the first event is logged at once");
        for ms in [1, 500, 9_999] {
            assert_eq!(t.note(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(t.note(start + Duration::from_secs(10)), Some(4));
        assert_eq!(t.note(start + Duration::from_secs(11)), None);
        assert_eq!(t.note(start + Duration::from_secs(25)), Some(2));
    }

    fn open(dir: &std::path::Path) -> (Engine, Box<dyn DurableLog>) {
        open_with(dir, 4096)
    }

    fn open_with(dir: &std::path::Path, segment_bytes: u64) -> (Engine, Box<dyn DurableLog>) {
        let cfg = EngineConfig {
            redeliveries_max: 0,
            ..Default::default()
        };
        let mut engine = Engine::new(cfg);
        let mut jc = JournalConfig::new(dir);
        jc.segment_bytes = segment_bytes;
        let store = Box::new(crate::log::JournalStore {
            config: jc,
            faults: None,
        });
        let journal = crate::log::LogStore::open(store, &mut |lsn, p| {
            engine.replay(lsn, Record::decode(p).unwrap())
        })
        .unwrap();
        engine.finish_recovery().unwrap();
        (engine, journal)
    }

    /// A core over `open`'s journal, with no limits that these tests reach.
    fn open_core(dir: &std::path::Path) -> Core {
        open_core_with(dir, 4096)
    }

    fn open_core_with(dir: &std::path::Path, segment_bytes: u64) -> Core {
        let (engine, journal) = open_with(dir, segment_bytes);
        let limits = CoreLimits {
            compaction_records_max: 1000,
            producer_wait_ms_max: 30_000,
            disk_bytes_max: 0,
            disk_free_bytes_min: 0,
            memory_bytes_max: u64::MAX,
        };
        Core::new(
            engine,
            journal,
            limits,
            Arc::new(crate::clock::SystemClock),
            None,
        )
    }

    fn sync(core: &mut Core) {
        core.journal.flush();
        let want = core.journal.next_lsn() - 1;
        loop {
            let d = core.journal.durable_lsn().unwrap();
            if d >= want {
                core.durable_advanced(d);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn send(core: &mut Core, q: &str, body: usize) {
        core.on_msg(CoreMsg::Command(send_command(q, body, Some("r"))));
        sync(core);
    }

    /// Connection 1's persistent SEND of `body` bytes to queue `q`.
    fn send_command(q: &str, body: usize, receipt: Option<&str>) -> Command {
        Command::Send {
            conn: 1,
            destination: Destination::Queue(q.into()),
            message: NewMessage {
                headers: Default::default(),
                body: vec![b'x'; body].into(),
                persistent: true,
                priority: 4,
                expires_ms: 0,
            },
            transaction: None,
            receipt: receipt.map(Into::into),
            producer: None,
        }
    }

    /// Connects connection 1, its effects going to `outbound`.
    fn connect_1(outbound: mpsc::UnboundedSender<Outbound>) -> CoreMsg {
        let (reply, _) = oneshot::channel();
        CoreMsg::Connect {
            conn: 1,
            client_id: None,
            producer: None,
            session: 0,
            outbound,
            reply,
        }
    }

    /// Connection 1's auto-ack subscription to /queue/F, which `filler` fills.
    fn subscribe_f() -> Command {
        Command::Subscribe {
            conn: 1,
            sub_id: "f".into(),
            destination: Destination::Queue("F".into()),
            ack: AckMode::Auto,
            prefetch: 1000,
            durable_name: None,
            options: Default::default(),
            receipt: None,
        }
    }

    /// Filler: persistent messages to /queue/F, consumed at once by an auto-ack subscriber.
    fn filler(core: &mut Core, n: usize) {
        for _ in 0..n {
            send(core, "F", 900);
            core.on_msg(CoreMsg::Command(Command::Credit {
                conn: 1,
                sub_id: "f".into(),
                up_to_tag: u64::MAX,
            }));
            sync(core);
        }
    }

    /// Segment files on disk in `dir`.
    fn segment_files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".seg")
            })
            .count()
    }

    /// A core that is never idle never reaches its tick's branch (the select is biased toward
    /// work). Its maintenance interval here is an hour, so only the deadlines checked after
    /// every turn can delete anything: before them, every segment of this run stayed on disk.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_busy_core_deletes_acknowledged_segments_without_waiting_for_its_tick() {
        let dir = tempfile::tempdir().unwrap();
        let core = open_core(dir.path());
        let (core_tx, core_rx) = mpsc::channel(64);
        let (stop_tx, stop_rx) = watch::channel(false);
        let running = tokio::spawn(core.run(core_rx, stop_rx, Duration::from_secs(3600)));
        let (out_tx, mut out_rx) = mpsc::unbounded_channel();
        core_tx.send(connect_1(out_tx)).await.unwrap();
        core_tx.send(CoreMsg::Command(subscribe_f())).await.unwrap();
        // 900-byte messages in 4 KiB segments: a new segment every few messages, each
        // message consumed (auto-ack) as it arrives.
        let (mut sent, mut most_files) = (0u64, 0);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while sent < 200 || segment_files(dir.path()) > 8 {
            assert!(
                std::time::Instant::now() < deadline,
                "{sent} messages sent and consumed, {} segments still on disk",
                segment_files(dir.path())
            );
            let send = send_command("F", 900, Some(&format!("r{sent}")));
            core_tx.send(CoreMsg::Command(send)).await.unwrap();
            sent += 1;
            // Its delivery and RECEIPT: the core turned at least once more.
            let mut receipted = false;
            while !receipted {
                match out_rx.recv().await.expect("the core answers") {
                    Outbound::Receipt(_) => receipted = true,
                    Outbound::Deliver(d) => {
                        // What a connection does for an auto-acknowledged delivery.
                        let credit = Command::Credit {
                            conn: 1,
                            sub_id: d.sub_id,
                            up_to_tag: d.ack_tag,
                        };
                        core_tx.send(CoreMsg::Command(credit)).await.unwrap();
                    }
                    _ => {}
                }
            }
            most_files = most_files.max(segment_files(dir.path()));
        }
        assert!(sent < 10_000, "took {sent} messages to delete segments");
        stop_tx.send(true).unwrap();
        running.await.unwrap().unwrap();
        println!("{sent} messages; at most {most_files} segment files at once");
    }

    /// SENDs nobody waits for (no RECEIPT) until the core's unsynced bytes are full: the core
    /// then takes no command until a sync, so it must ask for one itself. Without that, nothing
    /// reached the writer here (the loop's timed flushes do not run in this test).
    #[test]
    fn a_core_full_of_unsynced_bytes_hands_them_to_the_writer_whoever_waits() {
        let dir = tempfile::tempdir().unwrap();
        // Segments that hold 64 KiB records.
        let mut core = open_core_with(dir.path(), 1 << 20);
        let (tx, _rx) = mpsc::unbounded_channel();
        core.on_msg(connect_1(tx));
        let mut sent = 0u64;
        while core.accepting() {
            assert!(sent < 1_000, "1,000 SENDs of 64 KiB never filled the core");
            core.on_msg(CoreMsg::Command(send_command(
                "nobody-waits",
                64 * 1024,
                None,
            )));
            core.kick_journal();
            sent += 1;
        }
        assert!(
            sent < LAZY_RECORDS_MAX,
            "the byte bound, not the record count, stopped the core"
        );
        let want = core.journal.next_lsn() - 1;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while core.journal.durable_lsn().unwrap() < want {
            assert!(
                std::time::Instant::now() < deadline,
                "{sent} SENDs stopped the core and none of them reached the disk"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_lazy_dlq_move_reaches_disk_before_the_segment_it_supersedes_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        {
            let mut core = open_core(dir.path());
            core.on_msg(connect_1(tx));
            core.on_msg(CoreMsg::Command(subscribe_f()));
            filler(&mut core, 8); // a few dead segments
            send(&mut core, "A", 10); // M: the message that must survive
            filler(&mut core, 8); // M's segment gets sealed
                                  // Tick N: some sealed segment is dead -> checkpoint appended; flushed by the tick.
            core.maintain();
            assert!(core.checkpoint.is_some());
            sync(&mut core);
            while rx.try_recv().is_ok() {}
            // Consumer NACKs M (no receipt): it moves to the DLQ (no consumer there): lazy Store.
            core.on_msg(CoreMsg::Command(Command::Subscribe {
                conn: 1,
                sub_id: "a".into(),
                destination: Destination::Queue("A".into()),
                ack: AckMode::ClientIndividual,
                prefetch: 10,
                durable_name: None,
                options: Default::default(),
                receipt: None,
            }));
            sync(&mut core);
            let tag = loop {
                match rx.try_recv() {
                    Ok(Outbound::Deliver(d)) if d.sub_id == "a" => break d.ack_tag,
                    Ok(_) => continue,
                    Err(_) => panic!("no delivery"),
                }
            };
            core.on_msg(CoreMsg::Command(Command::Nack {
                conn: 1,
                ack: AckRef::Tag(tag),
                transaction: None,
                receipt: None,
            }));
            core.kick_journal();
            assert!(core.gated.is_empty(), "nothing waits for the DLQ store");
            // Tick N+1: checkpoint durable -> segments below it are released. Before the fix the
            // writer could take the deletions before the lazy DLQ store; then the process dies.
            core.maintain();
            std::thread::sleep(Duration::from_millis(300));
            let before = core.engine.durable_contents();
            println!("before crash: {before:?}");
            // crash: Journal's Drop discards what was appended but not flushed
        }
        let (engine, _journal) = open(dir.path());
        let after = engine.durable_contents();
        println!("after restart: {after:?}");
        let dlq = QueueKey::Queue("ActiveMQ.DLQ".into());
        let a = QueueKey::Queue("A".into());
        let held = after.get(&dlq).map_or(0, |s| s.len()) + after.get(&a).map_or(0, |s| s.len());
        assert_eq!(held, 1, "the receipted message M is gone after the crash");
    }
}
