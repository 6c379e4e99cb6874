//! The broker state machine. See the crate docs for the contract with the caller.
//!
//! Ownership: every queue lives in `queues` (an arena indexed by `QueueId`); connections hold
//! subscriptions that point at queues by id; `stored` tracks, for each persistent message held
//! by a durable queue, which durable queues hold it and the LSN of the record describing it.
//! `advisories` counts each destination's active consumers for consumer advisories
//! (`advisory.rs`); it changes only with subscriptions, so replay never touches it.
//!
//! A temporary queue (`QueueKey::Temp`) is owned by the connection that created it, listed in
//! that connection's `temp_queues` and deleted when it closes; only it may consume the queue.
//! A temporary queue whose owner is not a connection of this engine (another broker's, whose
//! replies a network bridge carries back: ActiveMQ's `bridgeTempDestinations`) is *foreign*:
//! owned by no connection, any connection may consume it, it is created by its first
//! subscription and deleted, with what it holds, when its last consumer leaves
//! (`drop_subscription`). A SEND never creates one, so nothing piles up where nobody reads.

use crate::advisory::{self, ConsumerAdvisories, CONSUMER_ADVISORY_PREFIX};
use crate::command::{AckRef, Command, NetworkConsumer, NewMessage, ProducerSeq, SubscribeOptions};
use crate::config::{DlqPolicy, EngineConfig, RedeliveryPolicy};
use crate::effect::{Delivery, Effect, Output};
use crate::error::EngineError;
use crate::hash::{HashMap, IdMap};
use crate::live::{LiveObject, LiveSet};
use crate::message::Message;
use crate::origins::{OriginStats, Origins};
use crate::producers::{is_network_origin, MarkTable, ProducerStats, Producers, Released};
use crate::queue::{ColdRef, ConsumerKind, Entry, InFlight, Queue, QueueId};
use crate::record::{ProducerMark, Record};
use crate::selector::{message_lookup, Selector};
use crate::types::{
    is_wildcard, virtual_topic_of, wildcard_matches, AckMode, ConnId, Destination, QueueKey,
};
use haven_headers::{Decimal, Headers};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

#[path = "paging.rs"]
mod paging;
#[path = "scheduler.rs"]
mod scheduler;
pub use paging::{MemoryStats, MessageLoader};
use scheduler::Scheduled;

/// Slack kept below `record_bytes_max` for what the estimate does not count (a DLQ key added
/// by a later move, encoding overhead).
const RECORD_OVERHEAD_BYTES: usize = 4096;

/// Delay before redelivery after the `failures`-th failed delivery: the initial delay,
/// multiplied by the back-off for each further failure, capped.
fn redelivery_delay_ms(policy: &RedeliveryPolicy, failures: u32) -> u64 {
    if policy.delay_initial_ms == 0 {
        return 0;
    }
    let factor = policy
        .backoff_multiplier
        .max(1.0)
        .powi(failures.saturating_sub(1) as i32);
    (policy.delay_initial_ms as f64 * factor).min(policy.delay_max_ms as f64) as u64
}

/// Dispatch rounds per call: the first, plus one for DLQs that expired messages moved into.
const DISPATCH_ROUNDS_MAX: usize = 4;

/// Waiting messages one dispatch looks at when consumers have selectors: bounds the work a
/// backlog nobody selects can cost each call.
const SELECTOR_SCAN_MAX: usize = 10_000;

/// Inputs the engine may not take from the world itself.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// Milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// The LSN the log will give the next record appended.
    pub next_lsn: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueStats {
    pub key: QueueKey,
    pub ready: usize,
    pub inflight: usize,
    pub consumers: usize,
}

#[derive(Debug)]
struct Sub {
    /// The queues it consumes from: one, or for a wildcard queue consumer (`/queue/a.>`) every
    /// named queue the pattern matches, including ones created later.
    queues: Vec<QueueId>,
    /// The pattern of a wildcard queue consumer.
    queue_pattern: Option<String>,
    /// `activemq.exclusive`: sole consumer of its queue while subscribed.
    exclusive: bool,
    /// `activemq.priority`: higher is served first.
    priority: u8,
    /// A network bridge's subscription on behalf of consumers elsewhere: ranks
    /// `priority_penalty` below its `priority`, and takes no message back to a broker it was
    /// on while the queue has a local consumer (see `choose_consumer`).
    network: Option<NetworkConsumer>,
    /// The destination consumer advisories count it under, as it was subscribed; None for
    /// browsers, temporary topics and advisory topics.
    advertised_as: Option<Destination>,
    /// Queue consumers only (a topic subscription's selector sits on its queue).
    selector: Option<Selector>,
    ack: AckMode,
    prefetch: u32,
    /// Dispatched and not yet acknowledged (for auto-ack: not yet written to the socket).
    inflight: u32,
    /// The `size_bytes` of those deliveries, for `prefetch_bytes_max`.
    inflight_bytes: u64,
    /// Unacknowledged deliveries in order: tag → message seq (not used for auto-ack).
    tags: BTreeMap<u64, u64>,
    /// seq → tag, for STOMP 1.0/1.1 ACKs that name a message-id.
    seq_tags: IdMap<u64>,
    durable: Option<(String, String)>,
    /// Private buffer of a non-durable topic subscription, deleted with it.
    private_queue: bool,
    topic: Option<Destination>,
}

impl Sub {
    /// What its queues count about it (`Queue::add_consumer`); fixed at subscribe.
    fn consumer_kind(&self) -> ConsumerKind {
        ConsumerKind {
            network: self.network.is_some(),
            selector: self.selector.is_some(),
        }
    }

    /// The priority it competes with: a network consumer's is lowered by its penalty, so
    /// local consumers with room are served first.
    fn effective_priority(&self) -> i16 {
        let penalty = self.network.as_ref().map_or(0, |n| n.priority_penalty);
        i16::from(self.priority) - i16::from(penalty)
    }
}

#[derive(Debug, Default)]
struct Tx {
    sends: Vec<(Destination, NewMessage)>,
    send_bytes: usize,
    /// Deliveries acknowledged (true) or refused (false) inside the transaction.
    acks: Vec<(u64, bool)>,
    acked_tags: BTreeSet<u64>,
    /// SENDs among `sends` that are scheduled (`AMQ_SCHEDULED_*`).
    scheduled: usize,
}

#[derive(Debug)]
struct Conn {
    client_id: Option<String>,
    subs: HashMap<String, Sub>,
    /// tag → (subscription id, seq)
    deliveries: IdMap<(String, u64, QueueId)>,
    next_tag: u64,
    txs: HashMap<String, Tx>,
    /// The temporary queues it owns (`QueueKey::Temp { owner: this connection, .. }`), deleted
    /// when it closes. Foreign temporary queues are in no connection's list.
    temp_queues: Vec<QueueId>,
    /// `haven-producer` claimed at CONNECT: this session is fenced once a newer one claims it.
    producer: Option<String>,
}

#[derive(Debug)]
struct Stored {
    msg: Arc<Message>,
    lsn: u64,
    holders: Vec<QueueKey>,
}

pub struct Engine {
    cfg: EngineConfig,
    queues: Vec<Option<Queue>>,
    free_queue_ids: Vec<QueueId>,
    queue_ids: HashMap<QueueKey, QueueId>,
    /// Topic (or temporary topic) → the queues its messages are copied into.
    topics: HashMap<Destination, Vec<QueueId>>,
    /// Topic subscriptions whose name holds `*` or `>` segments, matched at send time.
    wildcard_topics: HashMap<Destination, Vec<QueueId>>,
    /// `VirtualTopic.X` → the queues `Consumer.<group>.VirtualTopic.X` (ActiveMQ's virtual
    /// topics: each consumer group load-balances its own copy of the topic).
    virtual_queues: HashMap<String, Vec<QueueId>>,
    /// Wildcard queue consumers: (pattern, connection, subscription), attached to every named
    /// queue the pattern matches, including queues created after they subscribed.
    wildcard_queue_subs: Vec<(String, ConnId, String)>,
    conns: IdMap<Conn>,
    client_ids: HashMap<String, ConnId>,
    stored: IdMap<Stored>,
    live: LiveSet,
    next_seq: u64,
    /// Output of the call in progress.
    out: Vec<Output>,
    /// LSN the next record emitted in this call gets.
    lsn: u64,
    now_ms: u64,
    /// Durable removes gathered during one call, logged together at its end.
    removes: BTreeMap<QueueKey, Vec<u64>>,
    /// Queues holding delayed redeliveries.
    delayed_queues: BTreeSet<QueueId>,
    /// Queues that may be able to dispatch at the end of the call.
    to_dispatch: BTreeSet<QueueId>,
    /// Bytes of waiting messages in memory over all queues (shared with every queue).
    hot_bytes_total: Arc<AtomicU64>,
    /// Reads paged-out messages back; no paging without it.
    loader: Option<Box<dyn MessageLoader>>,
    /// Every record below this LSN is durable, so may be read back.
    durable_lsn: u64,
    /// Queues with paged (cold or tail) messages.
    paging_queues: BTreeSet<QueueId>,
    /// Paging queues whose page-in stopped at a message compaction re-logged, whose new
    /// record (this LSN) was not durable yet: nothing else may come to dispatch them (the
    /// consumers have emptied the window, the producers may have stopped), so once it is
    /// durable `set_durable_lsn` asks the caller for `resume_page_ins`.
    page_ins_waiting: BTreeMap<QueueId, u64>,
    paged_in_total: u64,
    /// A paging failure the caller must stop for.
    fatal: Option<String>,
    /// Inside `replay`: queues created here are not declared again.
    replaying: bool,
    /// Scheduled messages by seq, and their firing order.
    schedules: IdMap<Scheduled>,
    schedule_due: BTreeSet<(u64, u64)>,
    /// Per-producer sequence marks (exactly-once sends) and who owns each producer:
    /// applications' producers only.
    producers: Producers,
    /// The same marks for network origins (ids starting with `NETWORK_ORIGIN_PREFIX`: one per
    /// message a bridge forwarded here, `seq` 1): own limits, no owners. Every use of a mark
    /// goes through `table`, which picks the table by the id's prefix; live objects and
    /// records name the id, so both tables share them.
    origins: Origins,
    /// Active consumers per destination, for consumer advisories.
    advisories: ConsumerAdvisories,
    /// Topic messages dead-lettered while running (seq → priority): one DLQ copy per message,
    /// even when another subscription's copy fails after the DLQ copy was consumed and the
    /// message's record is gone (a non-durable subscriber's copy outlives both; a restart
    /// does not, so memory suffices). Bounded by the copies still held: `prune_dead_letters`
    /// drops a seq once no queue but a DLQ holds it.
    dead_lettered_topic_seqs: IdMap<u8>,
    /// `dead_lettered_topic_seqs` is pruned when it reaches this many (doubling what survived
    /// a pruning, so the scans cost amortized O(queues) per dead-lettered message).
    dead_letter_prune_at_count: usize,
    /// `ID:haven-<boot id in hex>-`: the ids of messages that are not logged (`number`).
    transient_id_prefix: String,
}

/// The id of a logged message is this and its number: stable across restarts.
const LOGGED_ID_PREFIX: &str = "ID:haven-";

/// The smallest `Engine::dead_letter_prune_at_count`.
const DEAD_LETTER_PRUNE_AT_COUNT_MIN: usize = 64;

impl Engine {
    pub fn new(cfg: EngineConfig) -> Engine {
        let producers = Producers::new(cfg.producer_idle_ms_max, cfg.producers_max);
        let origins = Origins::new(cfg.network_origin_idle_ms_max, cfg.network_origins_max);
        Engine {
            producers,
            origins,
            advisories: ConsumerAdvisories::default(),
            dead_lettered_topic_seqs: IdMap::default(),
            dead_letter_prune_at_count: DEAD_LETTER_PRUNE_AT_COUNT_MIN,
            transient_id_prefix: format!("{LOGGED_ID_PREFIX}{:x}-", cfg.boot_id),
            cfg,
            queues: Vec::new(),
            free_queue_ids: Vec::new(),
            queue_ids: HashMap::default(),
            topics: HashMap::default(),
            wildcard_topics: HashMap::default(),
            virtual_queues: HashMap::default(),
            wildcard_queue_subs: Vec::new(),
            conns: IdMap::default(),
            client_ids: HashMap::default(),
            stored: IdMap::default(),
            live: LiveSet::default(),
            next_seq: 1,
            out: Vec::new(),
            lsn: 0,
            now_ms: 0,
            removes: BTreeMap::new(),
            to_dispatch: BTreeSet::new(),
            delayed_queues: BTreeSet::new(),
            hot_bytes_total: Arc::new(AtomicU64::new(0)),
            loader: None,
            durable_lsn: 0,
            paging_queues: BTreeSet::new(),
            page_ins_waiting: BTreeMap::new(),
            paged_in_total: 0,
            fatal: None,
            replaying: false,
            schedules: IdMap::default(),
            schedule_due: BTreeSet::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    // ----------------------------------------------------------------------------------------
    // Commands

    /// Applies one command. On `Err` nothing changed and nothing was output; the caller reports
    /// the error to the client.
    pub fn handle(
        &mut self,
        cmd: Command,
        ctx: Ctx,
        out: &mut Vec<Output>,
    ) -> Result<(), EngineError> {
        assert!(self.out.is_empty() && self.removes.is_empty() && self.to_dispatch.is_empty());
        assert!(
            !self.advisories.has_changes(),
            "advisories published by the last call"
        );
        self.lsn = ctx.next_lsn;
        self.now_ms = ctx.now_ms;
        let conn = cmd.conn();
        if !matches!(cmd, Command::Connect { .. } | Command::Close { .. })
            && !self.conns.contains_key(&conn)
        {
            return Err(EngineError::UnknownConnection);
        }
        let receipt = match cmd {
            Command::Connect {
                conn,
                client_id,
                producer,
                session,
            } => {
                self.connect(conn, client_id, producer, session)?;
                None
            }
            Command::Close { conn, receipt } => {
                self.close(conn);
                receipt
            }
            Command::Subscribe {
                conn,
                sub_id,
                destination,
                ack,
                prefetch,
                durable_name,
                options,
                receipt,
            } => {
                self.subscribe(
                    conn,
                    sub_id,
                    destination,
                    ack,
                    prefetch,
                    durable_name,
                    options,
                )?;
                receipt
            }
            Command::Unsubscribe {
                conn,
                sub_id,
                durable_name,
                receipt,
            } => {
                self.unsubscribe(conn, &sub_id, durable_name)?;
                receipt
            }
            Command::Send {
                conn,
                destination,
                message,
                transaction,
                receipt,
                producer,
            } => {
                if let Destination::Queue(name) | Destination::Topic(name) = &destination {
                    if is_wildcard(name) {
                        return Err(EngineError::WildcardSend(destination.to_string()));
                    }
                }
                assert!(
                    transaction.is_none() || producer.is_none(),
                    "producer headers are not interpreted on a transactional SEND"
                );
                if self.is_duplicate(conn, producer.as_ref())? {
                    // Stored before: answered (the receipt below waits, like every effect,
                    // for the records before it, including the one that stored it).
                    self.finish();
                    self.push_receipt(conn, receipt);
                    out.append(&mut self.out);
                    return Ok(());
                }
                let table = scheduler::timetable(&message.headers)?;
                match (transaction, table) {
                    (Some(tx), Some(table)) => {
                        let pending = self.tx_mut(conn, &tx)?.scheduled;
                        self.check_schedulable(&destination, &table, pending + 1)?;
                        self.tx_push_send(conn, &tx, destination, message)?;
                        self.tx_mut(conn, &tx)?.scheduled += 1;
                    }
                    (Some(tx), None) => self.tx_push_send(conn, &tx, destination, message)?,
                    (None, table) => {
                        self.check_record_size(&[(&destination, &message)], 0)?;
                        match table {
                            Some(table) => {
                                // A non-persistent schedule's mark lives in memory only, like
                                // a non-persistent SEND's.
                                let persistent = message.persistent;
                                let mark = producer
                                    .as_ref()
                                    .filter(|_| persistent)
                                    .map(|p| self.mark(p));
                                let lsn = self.schedule(destination, message, table, mark)?;
                                if let Some(p) = producer {
                                    self.accept_producer(&p, persistent.then_some(lsn));
                                }
                            }
                            None => self.send(conn, destination, message, producer),
                        }
                    }
                }
                receipt
            }
            Command::Ack {
                conn,
                ack,
                transaction,
                receipt,
            } => {
                self.ack(conn, &ack, transaction, true)?;
                receipt
            }
            Command::Nack {
                conn,
                ack,
                transaction,
                receipt,
            } => {
                self.ack(conn, &ack, transaction, false)?;
                receipt
            }
            Command::Begin {
                conn,
                transaction,
                receipt,
            } => {
                let c = self.conns.get_mut(&conn).expect("checked");
                if c.txs.contains_key(&transaction) {
                    return Err(EngineError::TransactionExists(transaction));
                }
                if c.txs.len() >= self.cfg.transactions_per_connection_max {
                    return Err(EngineError::TooManyTransactions(
                        self.cfg.transactions_per_connection_max,
                    ));
                }
                c.txs.insert(transaction, Tx::default());
                receipt
            }
            Command::Commit {
                conn,
                transaction,
                receipt,
                producer,
            } => {
                if !self.conns[&conn].txs.contains_key(&transaction) {
                    return Err(EngineError::UnknownTransaction(transaction));
                }
                if self.is_duplicate(conn, producer.as_ref())? {
                    // Committed before: this resend's contents are discarded.
                    self.abort(conn, transaction)?;
                } else {
                    self.commit(conn, &transaction, producer)?;
                }
                receipt
            }
            Command::Abort {
                conn,
                transaction,
                receipt,
            } => {
                self.abort(conn, transaction)?;
                receipt
            }
            Command::Credit {
                conn,
                sub_id,
                up_to_tag,
            } => {
                // Only auto-ack subscriptions take credit; the tag bound keeps credit for an
                // earlier subscription with the same id from touching this one's unwritten
                // deliveries (tags only grow per connection).
                let c = &self.conns[&conn];
                let tags: Vec<u64> = match c.subs.get(&sub_id).filter(|s| s.ack == AckMode::Auto) {
                    Some(sub) => sub.tags.range(..=up_to_tag).map(|(t, _)| *t).collect(),
                    None => Vec::new(),
                };
                for tag in tags {
                    self.consume(conn, tag);
                }
                None
            }
            Command::Receipt { receipt, .. } => Some(receipt),
        };
        self.finish();
        self.push_receipt(conn, receipt);
        out.append(&mut self.out);
        Ok(())
    }

    fn push_receipt(&mut self, conn: ConnId, receipt: Option<String>) {
        if let Some(receipt) = receipt {
            self.out
                .push(Output::Effect(Effect::Receipt { conn, receipt }));
        }
    }

    /// Exactly-once: whether a SEND or COMMIT with `producer` repeats one already accepted
    /// (and is counted as such), or an error if this session no longer owns the producer.
    /// Changes nothing but the counter; checked before anything else a duplicate could fail.
    /// Rolls back and forgets `transaction` of `conn` (ABORT, or a COMMIT already applied).
    fn abort(&mut self, conn: ConnId, transaction: String) -> Result<(), EngineError> {
        let tx = self
            .conns
            .get_mut(&conn)
            .expect("checked")
            .txs
            .remove(&transaction);
        let tx = tx.ok_or(EngineError::UnknownTransaction(transaction))?;
        self.rollback(conn, tx);
        Ok(())
    }

    fn is_duplicate(
        &mut self,
        conn: ConnId,
        producer: Option<&ProducerSeq>,
    ) -> Result<bool, EngineError> {
        let Some(p) = producer else {
            return Ok(false);
        };
        // A network origin has no owner (no CONNECT can claim one): any bridge connection
        // may resend it, and the first copy wins.
        if !is_network_origin(&p.producer) {
            let claimed = self.conns[&conn].producer.as_deref();
            if self.producers.taken_over(&p.producer, conn, claimed) {
                return Err(EngineError::ProducerTakenOver(p.producer.clone()));
            }
        }
        let table = self.table(&p.producer);
        if !table.is_duplicate(&p.producer, p.seq) {
            return Ok(false);
        }
        table.count_duplicate();
        Ok(true)
    }

    /// The table that judges producer `id`: network origins have their own, so a bridge's
    /// traffic neither evicts applications' marks nor is bound by their limits.
    fn table(&mut self, id: &str) -> &mut dyn MarkTable {
        if is_network_origin(id) {
            &mut self.origins
        } else {
            &mut self.producers
        }
    }

    /// `table`, to read.
    fn table_of(&self, id: &str) -> &dyn MarkTable {
        if is_network_origin(id) {
            &self.origins
        } else {
            &self.producers
        }
    }

    /// Raises `p`'s mark: in the record at `lsn` (durable), or in memory only (None: nothing
    /// was logged, so after a restart there is nothing a resend could duplicate).
    fn accept_producer(&mut self, p: &ProducerSeq, lsn: Option<u64>) {
        let now_ms = self.now_ms;
        let (id, released) = self
            .table(&p.producer)
            .accept(&p.producer, p.seq, now_ms, lsn);
        self.release_producers(released);
        if let (Some(lsn), Some(id)) = (lsn, id) {
            self.live.insert(lsn, LiveObject::Producer(id));
        }
    }

    fn release_producers(&mut self, released: Released) {
        for lsn in released {
            self.live.remove_producer_at(lsn);
        }
    }

    fn mark(&self, p: &ProducerSeq) -> ProducerMark {
        ProducerMark {
            producer: p.producer.clone(),
            seq: p.seq,
            seen_ms: self.now_ms,
        }
    }

    /// Publishes the call's consumer advisories, dispatches what became possible and logs the
    /// removes gathered during the call.
    fn finish(&mut self) {
        self.publish_advisories();
        // Dispatching can add removes (expiry) and, when expired messages go to the DLQ, make
        // the DLQ dispatchable: a second round handles it. The DLQ never dead-letters into
        // itself, so rounds are few.
        for _round in 0..DISPATCH_ROUNDS_MAX {
            let queues = std::mem::take(&mut self.to_dispatch);
            if queues.is_empty() {
                break;
            }
            for q in queues {
                if self.queues.get(q).is_some_and(Option::is_some) {
                    self.dispatch(q);
                }
            }
        }
        assert!(self.to_dispatch.is_empty(), "dispatch did not settle");
        let removes = std::mem::take(&mut self.removes);
        for (queue, seqs) in removes {
            self.log(Record::Remove { queue, seqs });
        }
    }

    fn log(&mut self, record: Record) -> u64 {
        let lsn = self.lsn;
        self.lsn += 1;
        self.out.push(Output::Log(record));
        lsn
    }

    fn connect(
        &mut self,
        conn: ConnId,
        client_id: Option<String>,
        producer: Option<String>,
        session: u64,
    ) -> Result<(), EngineError> {
        assert!(
            !self.conns.contains_key(&conn),
            "connection {conn} connected twice"
        );
        if let Some(id) = &client_id {
            if self.client_ids.contains_key(id) {
                return Err(EngineError::ClientIdInUse(id.clone()));
            }
        }
        if let Some(p) = &producer {
            if is_network_origin(p) {
                return Err(EngineError::NetworkOriginClaimed(p.clone()));
            }
            self.producers.claim(p, conn, session)?;
        }
        if let Some(id) = &client_id {
            self.client_ids.insert(id.clone(), conn);
        }
        self.conns.insert(
            conn,
            Conn {
                client_id,
                subs: HashMap::default(),
                deliveries: IdMap::default(),
                next_tag: 1,
                txs: HashMap::default(),
                temp_queues: Vec::new(),
                producer,
            },
        );
        Ok(())
    }

    fn close(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let txs: Vec<Tx> = c.txs.drain().map(|(_, t)| t).collect();
        let sub_ids: Vec<String> = c.subs.keys().cloned().collect();
        for tx in txs {
            self.rollback(conn, tx);
        }
        for sub_id in sub_ids {
            self.drop_subscription(conn, &sub_id);
        }
        let c = self.conns.remove(&conn).expect("present");
        assert!(
            c.deliveries.is_empty(),
            "deliveries left after every subscription was dropped"
        );
        if let Some(id) = c.client_id {
            self.client_ids.remove(&id);
        }
        if let Some(p) = c.producer {
            self.producers.release_claim(&p, conn);
        }
        for q in c.temp_queues {
            let mut queue = self.remove_queue(q);
            assert!(
                queue.consumers.is_empty(),
                "only the owner consumes a temporary queue"
            );
            drop(queue.drain_all().entries);
        }
        self.topics
            .retain(|d, _| !matches!(d, Destination::TempTopic { owner, .. } if *owner == conn));
    }

    #[allow(clippy::too_many_arguments)]
    fn subscribe(
        &mut self,
        conn: ConnId,
        sub_id: String,
        destination: Destination,
        ack: AckMode,
        prefetch: u32,
        durable_name: Option<String>,
        options: SubscribeOptions,
    ) -> Result<(), EngineError> {
        let c = &self.conns[&conn];
        if c.subs.contains_key(&sub_id) {
            return Err(EngineError::DuplicateSubscription(sub_id));
        }
        if c.subs.len() >= self.cfg.subscriptions_per_connection_max {
            return Err(EngineError::TooManySubscriptions(
                self.cfg.subscriptions_per_connection_max,
            ));
        }
        let queue_pattern = match &destination {
            Destination::Queue(name) if is_wildcard(name) => {
                if options.browser || durable_name.is_some() {
                    return Err(EngineError::WildcardQueue(destination.to_string()));
                }
                Some(name.clone())
            }
            _ => None,
        };
        match &destination {
            // Another live connection's: private to it. A foreign one (its owner is not a
            // connection here) is open to any connection, a network bridge above all.
            Destination::TempQueue { owner, .. }
                if *owner != conn && self.conns.contains_key(owner) =>
            {
                return Err(EngineError::NotOwner);
            }
            Destination::TempTopic { owner, .. } if *owner != conn => {
                return Err(EngineError::NotOwner);
            }
            _ => {}
        }
        let prefetch = prefetch.clamp(1, self.cfg.prefetch_max);
        if options.browser {
            return self.browse(conn, sub_id, destination, prefetch, options);
        }
        let mut durable = None;
        let mut private_queue = false;
        let mut topic = None;
        let queue = match (&destination, durable_name) {
            (Destination::Topic(name), Some(dname)) => {
                let client_id = c
                    .client_id
                    .clone()
                    .ok_or(EngineError::DurableNeedsClientId)?;
                let key = QueueKey::Durable {
                    client_id: client_id.clone(),
                    name: dname.clone(),
                };
                if let Some(&q) = self.queue_ids.get(&key) {
                    if !self.queue(q).consumers.is_empty() {
                        return Err(EngineError::DurableInUse(dname));
                    }
                }
                let selector_text = options.selector.as_ref().map(|s| s.text().to_string());
                let unchanged = self.queue_ids.get(&key).is_some_and(|&q| {
                    let queue = self.queue(q);
                    queue.topic.as_deref() == Some(name.as_str())
                        && queue.selector.as_ref().map(|s| s.text()) == selector_text.as_deref()
                });
                if !unchanged && self.queue_ids.contains_key(&key) {
                    // Another topic or selector: JMS starts the subscription afresh. The drop of what it
                    // held is logged explicitly, so replay never depends on the dead record
                    // that named the old topic (segment deletion may have removed it).
                    self.remove_durable(&client_id, &dname);
                }
                if !unchanged {
                    let lsn = self.log(Record::DurableSubscribe {
                        client_id: client_id.clone(),
                        name: dname.clone(),
                        topic: name.clone(),
                        selector: selector_text,
                    });
                    let selector = options.selector.clone();
                    self.apply_durable_subscribe(&client_id, &dname, name, selector, lsn);
                }
                durable = Some((client_id, dname));
                self.queue_ids[&key]
            }
            (d, Some(_)) if !d.is_topic() => {
                return Err(EngineError::DurableNotTopic(d.to_string()))
            }
            (Destination::TempTopic { .. }, Some(_)) => {
                return Err(EngineError::DurableNotTopic(destination.to_string()))
            }
            (Destination::Topic(_) | Destination::TempTopic { .. }, None) => {
                let q = self.add_queue(QueueKey::TopicSub {
                    conn,
                    sub_id: sub_id.clone(),
                });
                self.queue_mut(q).selector = options.selector.clone();
                self.attach_topic(destination.clone(), q);
                private_queue = true;
                topic = Some(destination.clone());
                q
            }
            (Destination::Queue(_), _) if queue_pattern.is_some() => usize::MAX,
            (Destination::Queue(name), _) => self.queue_for(QueueKey::Queue(name.clone())),
            (Destination::TempQueue { owner, name }, _) => self.temp_queue(*owner, name),
        };
        let queues: Vec<QueueId> = match &queue_pattern {
            Some(pattern) => {
                let mut qs: Vec<QueueId> = self
                    .queue_ids
                    .iter()
                    .filter(
                        |(k, _)| matches!(k, QueueKey::Queue(n) if wildcard_matches(pattern, n)),
                    )
                    .map(|(_, &q)| q)
                    .collect();
                qs.sort_unstable();
                self.wildcard_queue_subs
                    .push((pattern.clone(), conn, sub_id.clone()));
                qs
            }
            None => vec![queue],
        };
        let queue_selector = if durable.is_none() && !private_queue {
            options.selector
        } else {
            None
        };
        let advertised_as = advisory::advertised(&destination).then(|| destination.clone());
        if let Some(d) = &advertised_as {
            self.advisories
                .add(d, conn, &sub_id, options.network.as_ref());
        }
        let sub = Sub {
            queues: queues.clone(),
            queue_pattern,
            ack,
            prefetch,
            inflight: 0,
            inflight_bytes: 0,
            tags: BTreeMap::new(),
            seq_tags: IdMap::default(),
            durable,
            private_queue,
            topic,
            exclusive: options.exclusive,
            priority: options.priority,
            network: options.network,
            advertised_as,
            selector: queue_selector,
        };
        for &q in &queues {
            self.queue_mut(q)
                .add_consumer(conn, sub_id.clone(), sub.consumer_kind());
        }
        self.conns
            .get_mut(&conn)
            .expect("checked")
            .subs
            .insert(sub_id, sub);
        if let Destination::Topic(name) = &destination {
            if name.starts_with(CONSUMER_ADVISORY_PREFIX) {
                self.advisory_snapshot(queue, name);
            }
        }
        self.to_dispatch.extend(queues);
        Ok(())
    }

    /// A browsing subscription: copies of what the queue holds, in delivery order, then the
    /// end-of-browse marker. It consumes nothing and is registered only so that UNSUBSCRIBE
    /// finds it.
    fn browse(
        &mut self,
        conn: ConnId,
        sub_id: String,
        destination: Destination,
        prefetch: u32,
        options: SubscribeOptions,
    ) -> Result<(), EngineError> {
        let key = match &destination {
            Destination::Queue(name) => QueueKey::Queue(name.clone()),
            Destination::TempQueue { owner, name } => QueueKey::Temp {
                owner: *owner,
                name: name.clone(),
            },
            _ => return Err(EngineError::BrowseNotQueue(destination.to_string())),
        };
        let waiting = match self.queue_ids.get(&key) {
            Some(&q) => self.queue(q).ready_head(self.cfg.browse_messages_max),
            None => Vec::new(),
        };
        let c = self.conns.get_mut(&conn).expect("checked");
        for msg in waiting {
            if msg.is_expired(self.now_ms) {
                continue;
            }
            if let Some(selector) = &options.selector {
                let lookup = message_lookup(&msg);
                if !selector.matches(&lookup) {
                    continue;
                }
            }
            let tag = c.next_tag;
            c.next_tag += 1;
            let delivery = Delivery {
                sub_id: sub_id.clone(),
                ack_tag: tag,
                message: msg,
                redelivered: false,
                delivery_count: 0,
                auto_ack: false,
            };
            self.out
                .push(Output::Effect(Effect::Deliver { conn, delivery }));
        }
        let end = Arc::new(Message {
            seq: 0,
            id: format!("ID:haven-browse-end-{conn}-{sub_id}"),
            destination: destination.clone(),
            headers: Headers::from_pairs(&[("browser", "end")]),
            body: bytes::Bytes::new(),
            persistent: false,
            priority: 0,
            expires_ms: 0,
            timestamp_ms: self.now_ms,
            dead_lettered: false,
        });
        let tag = c.next_tag;
        c.next_tag += 1;
        let delivery = Delivery {
            sub_id: sub_id.clone(),
            ack_tag: tag,
            message: end,
            redelivered: false,
            delivery_count: 0,
            auto_ack: false,
        };
        self.out
            .push(Output::Effect(Effect::Deliver { conn, delivery }));
        // A placeholder queue nobody sends to keeps UNSUBSCRIBE and close uniform.
        let q = self.add_queue(QueueKey::TopicSub {
            conn,
            sub_id: sub_id.clone(),
        });
        let sub = Sub {
            queues: vec![q],
            queue_pattern: None,
            ack: AckMode::Auto,
            prefetch,
            inflight: 0,
            inflight_bytes: 0,
            tags: BTreeMap::new(),
            seq_tags: IdMap::default(),
            durable: None,
            private_queue: true,
            topic: Some(Destination::TempTopic {
                owner: conn,
                name: format!("browse-{sub_id}"),
            }),
            exclusive: false,
            priority: 0,
            network: None,
            advertised_as: None,
            selector: None,
        };
        self.queue_mut(q)
            .add_consumer(conn, sub_id.clone(), sub.consumer_kind());
        self.conns
            .get_mut(&conn)
            .expect("checked")
            .subs
            .insert(sub_id, sub);
        Ok(())
    }

    fn unsubscribe(
        &mut self,
        conn: ConnId,
        sub_id: &str,
        durable_name: Option<String>,
    ) -> Result<(), EngineError> {
        let c = &self.conns[&conn];
        let sub_durable = c.subs.get(sub_id).map(|s| s.durable.clone());
        match (sub_durable, durable_name) {
            (None, None) => return Err(EngineError::UnknownSubscription(sub_id.to_string())),
            (None, Some(dname)) => {
                // Removing an inactive durable subscription by name.
                let client_id = c
                    .client_id
                    .clone()
                    .ok_or(EngineError::DurableNeedsClientId)?;
                let key = QueueKey::Durable {
                    client_id: client_id.clone(),
                    name: dname.clone(),
                };
                let Some(&q) = self.queue_ids.get(&key) else {
                    return Err(EngineError::UnknownDurable(dname));
                };
                if !self.queue(q).consumers.is_empty() {
                    return Err(EngineError::DurableInUse(dname));
                }
                self.remove_durable(&client_id, &dname);
            }
            (Some(durable), dname) => {
                self.drop_subscription(conn, sub_id);
                if let (Some((client_id, name)), Some(_)) = (durable, dname) {
                    self.remove_durable(&client_id, &name);
                }
            }
        }
        Ok(())
    }

    /// Detaches a subscription: its unacknowledged messages go back for redelivery and a
    /// non-durable topic subscriber's buffer is discarded.
    fn drop_subscription(&mut self, conn: ConnId, sub_id: &str) {
        let c = self.conns.get_mut(&conn).expect("known connection");
        let tags: Vec<u64> = c.subs[sub_id].tags.keys().copied().collect();
        // A bridge that goes away has not failed its messages (its remote consumers never saw
        // them): they must not count toward the dead-letter queue, or a flapping network link
        // would dead-letter healthy messages.
        let failed = c.subs[sub_id].network.is_none();
        for tag in tags {
            if failed {
                self.release(conn, tag);
            } else {
                self.give_back(conn, tag);
            }
        }
        let c = self.conns.get_mut(&conn).expect("known connection");
        let sub = c.subs.remove(sub_id).expect("known subscription");
        assert!(sub.tags.is_empty() && sub.seq_tags.is_empty());
        if sub.queue_pattern.is_some() {
            self.wildcard_queue_subs
                .retain(|(_, cc, s)| !(*cc == conn && s == sub_id));
        }
        let kind = sub.consumer_kind();
        for &q in &sub.queues {
            self.queue_mut(q).remove_consumer(conn, sub_id, kind);
        }
        if let Some(d) = &sub.advertised_as {
            self.advisories.remove(d, conn, sub_id);
        }
        if let [q] = sub.queues[..] {
            if self.is_foreign_temp(q) && self.queue(q).consumers.is_empty() {
                // Nobody can read it any more: volatile, so what it holds goes with it.
                let mut queue = self.remove_queue(q);
                drop(queue.drain_all().entries);
                return;
            }
        }
        if sub.private_queue {
            let q = sub.queues[0];
            let topic = sub.topic.expect("private queues belong to topics");
            self.detach_topic(&topic, q);
            let mut queue = self.remove_queue(q);
            drop(queue.drain_all().entries);
        } else {
            // Also when the last local consumer left: what the return rule held back may now
            // go to network consumers.
            self.to_dispatch.extend(sub.queues);
        }
    }

    /// Refuses what would make a log record larger than the log takes: a message's size plus
    /// one queue key per durable holder (a topic with many durable subscriptions multiplies it).
    fn check_record_size(
        &self,
        sends: &[(&Destination, &NewMessage)],
        extra_bytes: usize,
    ) -> Result<(), EngineError> {
        let mut bytes = extra_bytes + RECORD_OVERHEAD_BYTES;
        for (destination, m) in sends {
            if !m.persistent {
                continue;
            }
            let holders: usize = match destination {
                Destination::Queue(name) => name.len() + 8,
                Destination::Topic(_) => self
                    .topic_targets(destination)
                    .iter()
                    .map(|&q| match &self.queue(q).key {
                        QueueKey::Queue(n) => n.len() + 8,
                        QueueKey::Durable { client_id, name } => client_id.len() + name.len() + 12,
                        QueueKey::TopicSub { .. } | QueueKey::Temp { .. } => 0,
                    })
                    .sum(),
                Destination::TempQueue { .. } | Destination::TempTopic { .. } => continue,
            };
            if holders == 0 {
                continue; // not logged: no durable holder
            }
            bytes += m.body.len()
                + m.headers
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 8)
                    .sum::<usize>()
                + 128;
            bytes += holders;
        }
        let max = self
            .cfg
            .record_bytes_max
            .saturating_sub(RECORD_OVERHEAD_BYTES);
        if bytes > max {
            return Err(EngineError::RecordTooLarge { bytes, max });
        }
        Ok(())
    }

    fn send(
        &mut self,
        sender: ConnId,
        destination: Destination,
        message: NewMessage,
        producer: Option<ProducerSeq>,
    ) {
        self.declare_before_route(&destination);
        let msg = self.number(&destination, message);
        let lsn = self.lsn;
        let holders = self.route(sender, &destination, msg.clone(), lsn, true);
        let logged = !holders.is_empty();
        if logged {
            let logged = self.log(Record::Store {
                message: msg,
                holders,
                producer: producer.as_ref().map(|p| self.mark(p)),
            });
            assert_eq!(logged, lsn);
        }
        if let Some(p) = producer {
            self.accept_producer(&p, logged.then_some(lsn));
        }
    }

    /// Gives a SEND its broker identity.
    fn number(&mut self, destination: &Destination, m: NewMessage) -> Arc<Message> {
        let seq = self.next_seq;
        self.next_seq += 1;
        // Only a message that will be logged keeps its number across a restart, so only it
        // gets the restart-stable id; the rest carry this boot's id so that no message-id is
        // ever reused (clients de-duplicate by it).
        let logged = m.persistent && self.will_be_logged(destination);
        let prefix = if logged {
            LOGGED_ID_PREFIX
        } else {
            &self.transient_id_prefix
        };
        // Not `format!`, which was 1% of a broker's instructions here.
        let seq_text = Decimal::new(seq);
        let mut id = String::with_capacity(prefix.len() + seq_text.as_bytes().len());
        id.push_str(prefix);
        seq_text.push_to(&mut id);
        Arc::new(Message {
            seq,
            id,
            destination: destination.clone(),
            headers: m.headers,
            body: m.body,
            persistent: m.persistent,
            priority: m.priority.min(9),
            expires_ms: m.expires_ms,
            timestamp_ms: self.now_ms,
            dead_lettered: false,
        })
    }

    /// Whether a persistent message to `destination` is written to the log: queues always,
    /// topics when a durable subscription listens, temporary destinations never.
    fn will_be_logged(&self, destination: &Destination) -> bool {
        match destination {
            Destination::Queue(_) => true,
            Destination::Topic(_) => self
                .topic_targets(destination)
                .iter()
                .any(|&q| self.queue(q).key.is_durable_kind()),
            Destination::TempQueue { .. } | Destination::TempTopic { .. } => false,
        }
    }

    /// Puts a numbered message into every queue its destination reaches; returns the durable
    /// queues holding it (to be logged at `lsn` by the caller). With `may_spill`, a
    /// non-persistent message for a queue that pages is written to the log as a `Spill` record
    /// (it has no holders, so the caller logs nothing at `lsn` for it).
    fn route(
        &mut self,
        sender: ConnId,
        destination: &Destination,
        msg: Arc<Message>,
        lsn: u64,
        may_spill: bool,
    ) -> Vec<QueueKey> {
        let targets: Vec<QueueId> = match destination {
            Destination::Queue(name) => vec![self.queue_for(QueueKey::Queue(name.clone()))],
            Destination::TempQueue { owner, name } => {
                let key = QueueKey::Temp {
                    owner: *owner,
                    name: name.clone(),
                };
                match self.queue_ids.get(&key) {
                    Some(&q) => vec![q],
                    // The owner may use its own temporary queue before subscribing to it.
                    None if *owner == sender && self.conns.contains_key(owner) => {
                        vec![self.temp_queue(*owner, name)]
                    }
                    // Its owner is gone or never made it, or it is another broker's and no
                    // bridge subscribed to it: nobody can ever read it, so the message has
                    // nowhere to go (and must not pile up unread).
                    None => return Vec::new(),
                }
            }
            Destination::Topic(_) | Destination::TempTopic { .. } => {
                self.topic_targets(destination)
            }
        };
        let durable_msg = msg.persistent && !destination.is_temporary();
        let mut holders = Vec::new();
        let pending_max = self.cfg.topic_subscriber_pending_max;
        let size_bytes = msg.size_bytes() as u64;
        for q in targets {
            if let Some(selector) = &self.queue(q).selector {
                // A topic subscription keeps only what its selector selects.
                let lookup = message_lookup(&msg);
                if !selector.matches(&lookup) {
                    continue;
                }
            }
            let entry = Entry::sized(msg.clone(), size_bytes, false);
            let key = self.queue(q).key.clone();
            let durable_here = durable_msg && key.is_durable_kind();
            if (durable_here || may_spill) && self.should_page(q, size_bytes) {
                // A non-persistent message has no holders, so the caller logs nothing for it:
                // each queue it pages into gets its own spill record (their lifetimes differ).
                let spill = (!durable_here).then(|| {
                    self.log(Record::Spill {
                        message: msg.clone(),
                    })
                });
                self.push_tail(q, entry, spill);
                if durable_here {
                    holders.push(key);
                }
                self.to_dispatch.insert(q);
                continue;
            }
            if self.queue(q).is_paging() {
                // Behind paged-out messages, in memory (not spillable here: a transaction's
                // commit, or held by several durable subscriptions).
                self.push_tail(q, entry, None);
                if durable_msg && key.is_durable_kind() {
                    holders.push(key);
                }
                self.to_dispatch.insert(q);
                continue;
            }
            let queue = self.queue_mut(q);
            queue.push(entry);
            if let QueueKey::TopicSub { .. } = key {
                if queue.ready_len() > pending_max {
                    queue.pop();
                }
            }
            if durable_msg && key.is_durable_kind() {
                holders.push(key);
            }
            self.to_dispatch.insert(q);
        }
        if !holders.is_empty() {
            self.track_store(msg, holders.clone(), lsn);
        }
        holders
    }

    fn tx_push_send(
        &mut self,
        conn: ConnId,
        tx: &str,
        destination: Destination,
        message: NewMessage,
    ) -> Result<(), EngineError> {
        let max = self.cfg.transaction_ops_max;
        let bytes_max = self.cfg.transaction_bytes_max;
        let t = self.tx_mut(conn, tx)?;
        if t.sends.len() + t.acks.len() >= max {
            return Err(EngineError::TransactionTooLarge(tx.to_string(), max));
        }
        let bytes = message.body.len()
            + message
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 16)
                .sum::<usize>()
            + 128;
        if t.send_bytes + bytes > bytes_max {
            return Err(EngineError::TransactionBytesTooLarge(
                tx.to_string(),
                bytes_max,
            ));
        }
        t.send_bytes += bytes;
        t.sends.push((destination, message));
        Ok(())
    }

    fn tx_mut(&mut self, conn: ConnId, tx: &str) -> Result<&mut Tx, EngineError> {
        self.conns
            .get_mut(&conn)
            .expect("checked")
            .txs
            .get_mut(tx)
            .ok_or_else(|| EngineError::UnknownTransaction(tx.to_string()))
    }

    /// Resolves an ACK/NACK to the delivery tags it covers (cumulative for `client` mode).
    fn resolve_ack(&self, conn: ConnId, ack: &AckRef) -> Result<Vec<u64>, EngineError> {
        let c = &self.conns[&conn];
        let unknown = || EngineError::UnknownAck(ack.to_string());
        let (sub_id, tag) = match ack {
            AckRef::Tag(tag) => {
                let (sub_id, _, _) = c.deliveries.get(tag).ok_or_else(unknown)?;
                (sub_id.clone(), *tag)
            }
            AckRef::MessageId {
                message_id,
                subscription,
            } => {
                let seq = message_id
                    .rsplit('-')
                    .next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(unknown)?;
                let found = c
                    .subs
                    .iter()
                    .filter(|(id, _)| subscription.as_ref().is_none_or(|s| s == *id))
                    .find_map(|(id, sub)| {
                        // The whole id must match, not just its number: non-persistent numbers
                        // are reused after a restart, their ids never are.
                        let tag = *sub.seq_tags.get(&seq)?;
                        let q = c.deliveries.get(&tag)?.2;
                        let held = &self.queue(q).inflight.get(&seq)?.entry.msg.id;
                        (held == message_id).then(|| (id.clone(), tag))
                    });
                found.ok_or_else(unknown)?
            }
        };
        let sub = &c.subs[&sub_id];
        if sub.ack == AckMode::Auto {
            return Err(EngineError::UnknownAck(format!(
                "{ack} (subscription '{sub_id}' uses ack:auto; there is nothing to acknowledge)"
            )));
        }
        Ok(match sub.ack {
            AckMode::Client => sub.tags.range(..=tag).map(|(t, _)| *t).collect(),
            _ => vec![tag],
        })
    }

    fn ack(
        &mut self,
        conn: ConnId,
        ack: &AckRef,
        transaction: Option<String>,
        positive: bool,
    ) -> Result<(), EngineError> {
        let tags = self.resolve_ack(conn, ack)?;
        if let Some(tx) = transaction {
            let max = self.cfg.transaction_ops_max;
            let bytes_max = self.cfg.transaction_bytes_max;
            let ack_key_bytes = tags.first().map_or(0, |tag| {
                let (_, _, q) = &self.conns[&conn].deliveries[tag];
                match &self.queue(*q).key {
                    QueueKey::Queue(n) => n.len(),
                    QueueKey::Durable { client_id, name } => client_id.len() + name.len(),
                    QueueKey::TopicSub { .. } | QueueKey::Temp { .. } => 0,
                }
            });
            let t = self.tx_mut(conn, &tx)?;
            let fresh: Vec<u64> = tags
                .into_iter()
                .filter(|t2| !t.acked_tags.contains(t2))
                .collect();
            if fresh.is_empty() {
                return Err(EngineError::UnknownAck(format!(
                    "{ack} (already acknowledged in transaction '{tx}')"
                )));
            }
            if t.sends.len() + t.acks.len() + fresh.len() > max {
                return Err(EngineError::TransactionTooLarge(tx, max));
            }
            // Each ack becomes a (queue, seq) entry of the commit record.
            let bytes = fresh.len() * (ack_key_bytes + 16);
            if t.send_bytes + bytes > bytes_max {
                return Err(EngineError::TransactionBytesTooLarge(tx, bytes_max));
            }
            t.send_bytes += bytes;
            for tag in fresh {
                t.acked_tags.insert(tag);
                t.acks.push((tag, positive));
            }
            return Ok(());
        }
        for tag in tags {
            if positive {
                self.consume(conn, tag);
            } else {
                self.release(conn, tag);
            }
        }
        Ok(())
    }

    fn commit(
        &mut self,
        conn: ConnId,
        tx_name: &str,
        producer: Option<ProducerSeq>,
    ) -> Result<(), EngineError> {
        if let Some(tx) = self.conns[&conn].txs.get(tx_name) {
            // The commit is one record: refuse it (the transaction stays open, the client may
            // ABORT) rather than emit a record the log cannot take.
            let sends: Vec<(&Destination, &NewMessage)> =
                tx.sends.iter().map(|(d, m)| (d, m)).collect();
            self.check_record_size(&sends, tx.acks.len() * 64)?;
            if self.schedules.len() + tx.scheduled > self.cfg.scheduled_messages_max {
                return Err(EngineError::TooManyScheduled(
                    self.cfg.scheduled_messages_max,
                ));
            }
        }
        let tx = self
            .conns
            .get_mut(&conn)
            .expect("checked")
            .txs
            .remove(tx_name);
        let tx = tx.ok_or_else(|| EngineError::UnknownTransaction(tx_name.to_string()))?;
        // Acks first, as the client issued them before COMMIT. Their removes join this
        // transaction's record rather than a separate one, so the commit is atomic.
        let before = std::mem::take(&mut self.removes);
        for (tag, positive) in tx.acks {
            if !self.conns[&conn].deliveries.contains_key(&tag) {
                continue; // released meanwhile (its subscription was dropped)
            }
            if positive {
                self.consume(conn, tag);
            } else {
                self.release(conn, tag);
            }
        }
        let tx_removes = std::mem::replace(&mut self.removes, before);
        for (destination, _) in &tx.sends {
            self.declare_before_route(destination);
        }
        // A NACK above may have dead-lettered (and logged) a message; the commit record is next.
        let lsn = self.lsn;
        let mut stores = Vec::new();
        let mut schedules = Vec::new();
        for (destination, message) in tx.sends {
            if let Ok(Some(table)) = scheduler::timetable(&message.headers) {
                schedules.push(self.new_schedule(destination, message, &table));
                continue;
            }
            let msg = self.number(&destination, message);
            let holders = self.route(conn, &destination, msg.clone(), lsn, false);
            if !holders.is_empty() {
                stores.push((msg, holders));
            }
        }
        let removes: Vec<(QueueKey, u64)> = tx_removes
            .into_iter()
            .flat_map(|(q, seqs)| seqs.into_iter().map(move |s| (q.clone(), s)))
            .collect();
        // A commit that logs nothing (only non-persistent SENDs) raises the mark in memory
        // only, like a non-persistent SEND.
        let logged = !stores.is_empty() || !removes.is_empty() || !schedules.is_empty();
        if logged {
            let logged = self.log(Record::Commit {
                stores,
                removes,
                schedules: schedules.clone(),
                producer: producer.as_ref().map(|p| self.mark(p)),
            });
            assert_eq!(logged, lsn);
        }
        if let Some(p) = producer {
            self.accept_producer(&p, logged.then_some(lsn));
        }
        for (msg, state) in schedules {
            self.apply_schedule(msg, state, lsn);
        }
        Ok(())
    }

    /// ABORT: messages acknowledged in the transaction become available again.
    fn rollback(&mut self, conn: ConnId, tx: Tx) {
        for (tag, _) in tx.acks {
            if self.conns[&conn].deliveries.contains_key(&tag) {
                self.release(conn, tag);
            }
        }
    }

    /// Forgets a delivery tag on its connection and subscription; returns (queue, seq).
    fn take_delivery(&mut self, conn: ConnId, tag: u64) -> (QueueId, u64) {
        let c = self.conns.get_mut(&conn).expect("known connection");
        let (sub_id, seq, q) = c.deliveries.remove(&tag).expect("known delivery");
        let sub = c
            .subs
            .get_mut(&sub_id)
            .expect("delivery of a live subscription");
        sub.tags
            .remove(&tag)
            .expect("tag tracked by its subscription");
        sub.seq_tags.remove(&seq);
        sub.inflight -= 1;
        let queue = self.queues[q].as_ref().expect("live queue");
        let bytes = queue.inflight[&seq].entry.size_bytes;
        sub.inflight_bytes = sub
            .inflight_bytes
            .checked_sub(bytes)
            .expect("in-flight bytes count every delivery");
        // Credit freed: every queue of the subscription may dispatch again.
        self.to_dispatch.extend(sub.queues.iter().copied());
        for tx in c.txs.values_mut() {
            tx.acked_tags.remove(&tag);
        }
        (q, seq)
    }

    /// A positive acknowledgement: the queue no longer holds the message.
    fn consume(&mut self, conn: ConnId, tag: u64) {
        let (q, seq) = self.take_delivery(conn, tag);
        let flight = self.queue_mut(q).inflight.remove(&seq).expect("in flight");
        assert_eq!((flight.conn, flight.tag), (conn, tag));
        self.removed(q, &flight.entry.msg);
    }

    /// A failed delivery (NACK, rollback, lost consumer): redeliver, or dead-letter it once it
    /// has failed too often.
    fn release(&mut self, conn: ConnId, tag: u64) {
        let (q, entry) = self.take_back(conn, tag);
        let dlq = self.dlq_for(q, &entry.msg);
        let policy = self.redelivery_policy(&entry.msg.destination);
        match dlq {
            Some(dlq) if entry.deliveries > policy.redeliveries_max => {
                self.dead_letter(q, entry, dlq, false)
            }
            _ => {
                let delay_ms = redelivery_delay_ms(&policy, entry.deliveries);
                if delay_ms == 0 {
                    self.queue_mut(q).push(entry);
                } else {
                    let due_ms = self.now_ms.saturating_add(delay_ms);
                    self.queue_mut(q).delay(entry, due_ms);
                    self.delayed_queues.insert(q);
                }
            }
        }
    }

    /// A delivery returned unconsumed through no fault of the message (a network bridge's
    /// subscription ending): waiting again at once, redelivered, its failure count unchanged.
    fn give_back(&mut self, conn: ConnId, tag: u64) {
        let (q, mut entry) = self.take_back(conn, tag);
        entry.deliveries = entry.deliveries.saturating_sub(1);
        self.queue_mut(q).push(entry);
    }

    /// An unacknowledged delivery taken back from its consumer, marked redelivered.
    fn take_back(&mut self, conn: ConnId, tag: u64) -> (QueueId, Entry) {
        let (q, seq) = self.take_delivery(conn, tag);
        let mut entry = self
            .queue_mut(q)
            .inflight
            .remove(&seq)
            .expect("in flight")
            .entry;
        entry.redelivered = true;
        (q, entry)
    }

    /// The redelivery settings for messages sent to `destination`.
    fn redelivery_policy(&self, destination: &Destination) -> RedeliveryPolicy {
        let found =
            self.cfg
                .redelivery_policies
                .iter()
                .find(|p| match (&p.destination, destination) {
                    (Destination::Queue(pattern), Destination::Queue(name))
                    | (Destination::Topic(pattern), Destination::Topic(name)) => {
                        wildcard_matches(pattern, name)
                    }
                    _ => false,
                });
        match found {
            Some(p) => p.clone(),
            None => RedeliveryPolicy {
                destination: destination.clone(),
                redeliveries_max: self.cfg.redeliveries_max,
                delay_initial_ms: self.cfg.redelivery_delay_initial_ms,
                backoff_multiplier: self.cfg.redelivery_backoff_multiplier,
                delay_max_ms: self.cfg.redelivery_delay_max_ms,
            },
        }
    }

    /// Time passes: delayed redeliveries that are due become deliverable. The caller calls this
    /// periodically (see [`Engine::has_delayed`]).
    pub fn tick(&mut self, ctx: Ctx, out: &mut Vec<Output>) {
        assert!(self.out.is_empty() && self.removes.is_empty() && self.to_dispatch.is_empty());
        self.lsn = ctx.next_lsn;
        self.now_ms = ctx.now_ms;
        let queues: Vec<QueueId> = self.delayed_queues.iter().copied().collect();
        for q in queues {
            let Some(queue) = self.queues[q].as_mut() else {
                self.delayed_queues.remove(&q);
                continue;
            };
            if queue.release_due(ctx.now_ms) > 0 {
                self.to_dispatch.insert(q);
            }
            if !queue.has_delayed() {
                self.delayed_queues.remove(&q);
            }
        }
        self.fire_due();
        let released = self.producers.forget_idle(ctx.now_ms);
        self.release_producers(released);
        let released = self.origins.forget_idle(ctx.now_ms);
        self.release_producers(released);
        self.finish();
        out.append(&mut self.out);
    }

    /// Whether any redelivery is waiting for its delay, or a scheduled message for its time:
    /// the caller should `tick` soon.
    pub fn has_delayed(&self) -> bool {
        !self.delayed_queues.is_empty() || !self.schedule_due.is_empty()
    }

    /// An expired message leaves its queue: dropped, or moved to the DLQ when configured (a
    /// message that expires in the DLQ itself is dropped).
    fn expire(&mut self, q: QueueId, entry: Entry) {
        if self.cfg.expired_to_dlq {
            if let Some(dlq) = self.dlq_for(q, &entry.msg) {
                return self.dead_letter(q, entry, dlq, true);
            }
        }
        self.removed(q, &entry.msg);
    }

    fn dlq_for(&self, q: QueueId, msg: &Message) -> Option<QueueKey> {
        let name = match &self.cfg.dlq {
            DlqPolicy::Shared(name) => name.clone(),
            DlqPolicy::PerDestination { prefix } => match &msg.destination {
                Destination::Queue(n) | Destination::Topic(n) => format!("{prefix}{n}"),
                Destination::TempQueue { name, .. } | Destination::TempTopic { name, .. } => {
                    format!("{prefix}{name}")
                }
            },
        };
        let key = QueueKey::Queue(name);
        // A message that keeps failing in the DLQ itself stays there.
        (self.queue(q).key != key).then_some(key)
    }

    /// `expired`: moved because it expired (not because deliveries failed).
    fn dead_letter(&mut self, from: QueueId, entry: Entry, dlq: QueueKey, expired: bool) {
        if entry.msg.persistent && !self.stored.contains_key(&entry.msg.seq) {
            // A non-durable topic subscription's copy whose durable copy is paged out.
            self.unpage(&entry.msg);
        }
        // The message as last logged: a holder keeps the copy it got when the message arrived,
        // and only the newest record (kept in `stored`) says whether it was dead-lettered.
        let newest = self
            .stored
            .get(&entry.msg.seq)
            .map_or_else(|| entry.msg.clone(), |s| s.msg.clone());
        let to = self.queue_for(dlq.clone());
        if newest.dead_lettered
            || self.dead_lettered_topic_seqs.contains_key(&entry.msg.seq)
            || self.queue(to).contains(&entry.msg)
        {
            // Already dead-lettered through another holder (a topic message that failed on two
            // subscriptions), even if that copy was consumed from the DLQ since: this holder
            // just lets go of it. One DLQ copy per message.
            let msg = entry.msg.clone();
            self.removed(from, &msg);
            return;
        }
        if entry.msg.destination.is_topic() {
            self.remember_dead_lettered(&entry.msg);
        }
        let msg = Arc::new(Message {
            // Dead-lettered because it expired: in the DLQ it no longer expires, or it would
            // vanish from there unread.
            expires_ms: if expired { 0 } else { newest.expires_ms },
            dead_lettered: true,
            ..(*newest).clone()
        });
        let from_key = self.queue(from).key.clone();
        self.enqueue(to, Entry::new(msg.clone(), true));
        self.to_dispatch.insert(to);
        if let Some(stored) = self.stored.get(&msg.seq) {
            // One record moves it: its holders become the others plus the DLQ.
            let mut holders: Vec<QueueKey> = stored
                .holders
                .iter()
                .filter(|h| **h != from_key)
                .cloned()
                .collect();
            holders.push(dlq);
            let lsn = self.log(Record::Store {
                message: msg.clone(),
                holders: holders.clone(),
                producer: None,
            });
            self.track_store(msg, holders, lsn);
        } else if msg.persistent && !msg.destination.is_temporary() {
            // A persistent topic message only non-durable subscribers got: never logged, as no
            // holder outlived a restart. Its DLQ copy does, as ActiveMQ's would.
            assert!(
                !from_key.is_durable_kind(),
                "persistent message in a durable queue is tracked"
            );
            let holders = vec![dlq];
            let lsn = self.log(Record::Store {
                message: msg.clone(),
                holders: holders.clone(),
                producer: None,
            });
            self.track_store(msg, holders, lsn);
        }
    }

    /// Notes that a topic message went to the DLQ, so that its other copies do not follow.
    fn remember_dead_lettered(&mut self, msg: &Message) {
        self.dead_lettered_topic_seqs.insert(msg.seq, msg.priority);
        if self.dead_lettered_topic_seqs.len() >= self.dead_letter_prune_at_count {
            self.prune_dead_letters();
            self.dead_letter_prune_at_count =
                (2 * self.dead_lettered_topic_seqs.len()).max(DEAD_LETTER_PRUNE_AT_COUNT_MIN);
        }
    }

    /// Forgets the dead-lettered topic messages no queue holds a copy of any more, except a
    /// DLQ (whose copy is never dead-lettered again).
    fn prune_dead_letters(&mut self) {
        let holders: Vec<&Queue> = self
            .queues
            .iter()
            .flatten()
            .filter(|q| !self.is_dlq(&q.key))
            .collect();
        self.dead_lettered_topic_seqs
            .retain(|seq, priority| holders.iter().any(|q| q.holds(*seq, *priority)));
    }

    /// Whether `key` is a dead-letter queue under the configured policy.
    fn is_dlq(&self, key: &QueueKey) -> bool {
        match (&self.cfg.dlq, key) {
            (DlqPolicy::Shared(name), QueueKey::Queue(n)) => n == name,
            (DlqPolicy::PerDestination { prefix }, QueueKey::Queue(n)) => n.starts_with(prefix),
            _ => false,
        }
    }

    /// `q` stops holding `msg`; durable bookkeeping follows.
    fn removed(&mut self, q: QueueId, msg: &Arc<Message>) {
        let Some(stored) = self.stored.get_mut(&msg.seq) else {
            return;
        };
        let key = &self.queues[q].as_ref().expect("live queue id").key;
        let Some(pos) = stored.holders.iter().position(|h| h == key) else {
            return;
        };
        // Reuse the holder's key: no allocation on the per-message path.
        let key = stored.holders.swap_remove(pos);
        self.removes.entry(key).or_default().push(msg.seq);
        if stored.holders.is_empty() {
            let lsn = stored.lsn;
            self.stored.remove(&msg.seq);
            self.live.remove(lsn, &LiveObject::Message(msg.seq));
        }
    }
}

impl Engine {
    // ----------------------------------------------------------------------------------------
    // Dispatch

    /// Hands ready messages to consumers with prefetch credit, round-robin.
    fn dispatch(&mut self, q: QueueId) {
        if self.queue(q).consumers.is_empty() {
            return;
        }
        self.page_in(q);
        let queue = self.queues[q].as_ref().expect("live queue");
        // The return rule (see `choose_consumer`) looks at each message, so it needs this
        // path, but only while network and local consumers share the queue.
        let selective = queue.grouped_waiting > 0
            || (queue.network_consumers() > 0 && queue.has_local_consumer())
            || queue.has_selector_consumer();
        if selective {
            return self.dispatch_selective(q);
        }
        loop {
            let queue = self.queues[q].as_ref().expect("live queue");
            if queue.is_ready_empty() && queue.is_paging() && !queue.consumers.is_empty() {
                self.page_in(q);
            }
            let queue = self.queues[q].as_ref().expect("live queue");
            if queue.is_ready_empty() || queue.consumers.is_empty() {
                return;
            }
            let Some(i) = self.choose_consumer(queue, None) else {
                return;
            };
            let n = queue.consumers.len();
            let queue = self.queues[q].as_mut().expect("live queue");
            queue.next_consumer = (i + 1) % n;
            let (conn, sub_id) = queue.consumers[i].clone();
            let entry = queue.pop().expect("not empty");
            if entry.msg.is_expired(self.now_ms) {
                // An expired message is never delivered.
                self.expire(q, entry);
                continue;
            }
            self.deliver(q, conn, &sub_id, entry);
        }
    }

    /// Dispatch when some consumer has a selector, messages have groups, or network and local
    /// consumers share the queue: each waiting message, in order, goes to a consumer that
    /// takes it; messages nobody takes wait (they do not block later ones). At most
    /// `SELECTOR_SCAN_MAX` waiting messages are looked at per call.
    fn dispatch_selective(&mut self, q: QueueId) {
        // Nobody has room: the loop below would stop at the first message that has not
        // expired, so stop before copying the head. The only difference: expired messages at
        // the head stay until a consumer has room, as on the fast path (`dispatch`).
        if self.choose_consumer(self.queue(q), None).is_none() {
            return;
        }
        let head = self.queue(q).ready_head(SELECTOR_SCAN_MAX);
        for msg in head {
            if msg.is_expired(self.now_ms) {
                let entry = self.queue_mut(q).remove_ready(&msg).expect("waiting");
                self.expire(q, entry);
                continue;
            }
            let queue = self.queue(q);
            if self.choose_consumer(queue, None).is_none() {
                return; // nobody has prefetch room
            }
            let Some(i) = self.choose_consumer(queue, Some(&msg)) else {
                continue;
            };
            let queue = self.queue_mut(q);
            queue.next_consumer = (i + 1) % queue.consumers.len();
            let (conn, sub_id) = queue.consumers[i].clone();
            if let Some(group) = msg.group() {
                if msg.group_seq() == Some(-1) {
                    // The last message of the group: it closes the group.
                    queue.groups.remove(group);
                } else {
                    queue
                        .groups
                        .entry(group.to_string())
                        .or_insert_with(|| (conn, sub_id.clone()));
                }
            }
            let entry = queue.remove_ready(&msg).expect("waiting");
            self.deliver(q, conn, &sub_id, entry);
        }
    }

    /// Which consumer gets the next message: the first exclusive consumer if there is one (it
    /// alone, even when its prefetch is full); otherwise, among consumers with prefetch room,
    /// the highest effective priority (a network consumer's lowered by its penalty),
    /// round-robin within it.
    ///
    /// With `msg`, only consumers that take it count: their selector (if any) selects it, and
    /// the return rule (ActiveMQ's `replayWhenNoConsumers`): a network consumer does not take
    /// a message back to a broker it was on (its `haven-net-path` names the consumer's `to`)
    /// while the queue has a local consumer — it waits for that one, however slow, so
    /// messages do not bounce between brokers. With no local consumer left, the consumers
    /// have moved, and it may go back. (A topic subscription's queue has one consumer, so the
    /// rule never applies there: a bridge filters topic copies itself.)
    fn choose_consumer(&self, queue: &Queue, msg: Option<&Message>) -> Option<usize> {
        let sub = |i: usize| {
            let (conn, sub_id) = &queue.consumers[i];
            &self.conns[conn].subs[sub_id]
        };
        let has_local = queue.has_local_consumer();
        let window_bytes = self.cfg.prefetch_bytes_max;
        let has_room = |s: &Sub| {
            s.inflight < s.prefetch && (s.inflight == 0 || s.inflight_bytes < window_bytes)
        };
        let takes = |s: &Sub| {
            let Some(m) = msg else {
                return true;
            };
            if let Some(selector) = &s.selector {
                if !selector.matches(&message_lookup(m)) {
                    return false;
                }
            }
            !(has_local && s.network.as_ref().is_some_and(|n| m.has_been_on(n.to())))
        };
        let n = queue.consumers.len();
        if let Some(owner) = msg.and_then(|m| queue.groups.get(m.group()?)) {
            // A group's messages go to its owner only, in order: if it has no room, they wait.
            let i = queue
                .consumers
                .iter()
                .position(|c| c == owner)
                .expect("group owners are consumers");
            let s = sub(i);
            return (has_room(s) && takes(s)).then_some(i);
        }
        // One pass in index order, looking each subscription up once (two hashed lookups of
        // its id: these were a tenth of a broker's instructions in (c) when done twice): the
        // first exclusive consumer decides alone; otherwise the highest priority with room
        // that takes the message, ties going to the first from `next_consumer` on (round
        // robin).
        let start = queue.next_consumer % n.max(1);
        let mut best: Option<(i16, usize, usize)> = None;
        for i in 0..n {
            let s = sub(i);
            if s.exclusive {
                return (has_room(s) && takes(s)).then_some(i);
            }
            if !has_room(s) {
                continue;
            }
            let priority = s.effective_priority();
            let turn = (i + n - start) % n;
            if best.is_none_or(|(p, t, _)| priority > p || (priority == p && turn < t)) && takes(s)
            {
                best = Some((priority, turn, i));
            }
        }
        best.map(|(_, _, i)| i)
    }

    // ----------------------------------------------------------------------------------------
    // Consumer advisories (bookkeeping in `advisory.rs`)

    /// Publishes one advisory for each destination whose consumers changed during this call,
    /// on its advisory topic, if that topic has a subscriber (otherwise nothing is built). The
    /// message is non-persistent and routed without spilling, so no record is written.
    fn publish_advisories(&mut self) {
        if !self.advisories.has_changes() {
            return;
        }
        assert!(!self.replaying, "replay makes no advisories");
        for about in self.advisories.take_changed() {
            let topic = advisory::advisory_topic(&about);
            if self.topic_targets(&topic).is_empty() {
                continue;
            }
            let msg = self.advisory_message(&topic, &about);
            let lsn = self.lsn;
            // The sender only matters for temporary queues; an advisory goes to a topic.
            let holders = self.route(0, &topic, msg, lsn, false);
            assert!(
                holders.is_empty() && self.lsn == lsn,
                "an advisory is never logged"
            );
        }
    }

    /// A new subscription to the consumer advisory topic(s) `pattern`, buffered in queue `q`:
    /// it alone gets one advisory per destination that has consumers now and whose advisory
    /// topic the pattern matches, in a fixed order (destination kind, then name).
    fn advisory_snapshot(&mut self, q: QueueId, pattern: &str) {
        let pending_max = self.cfg.topic_subscriber_pending_max;
        for about in self.advisories.matching(pattern) {
            let topic = advisory::advisory_topic(&about);
            let msg = self.advisory_message(&topic, &about);
            if let Some(selector) = &self.queue(q).selector {
                if !selector.matches(&message_lookup(&msg)) {
                    continue;
                }
            }
            self.enqueue(q, Entry::new(msg, false));
            // The bound of a topic subscriber's buffer, as in `route`.
            let queue = self.queue_mut(q);
            if matches!(queue.key, QueueKey::TopicSub { .. }) && queue.ready_len() > pending_max {
                queue.pop();
            }
        }
        self.to_dispatch.insert(q);
    }

    /// The advisory about `about`'s consumers as they are now, numbered for `topic`.
    fn advisory_message(&mut self, topic: &Destination, about: &Destination) -> Arc<Message> {
        let message = NewMessage {
            headers: self.advisories.headers(about),
            body: bytes::Bytes::new(),
            persistent: false,
            priority: crate::message::PRIORITY_DEFAULT,
            expires_ms: 0,
        };
        self.number(topic, message)
    }

    fn deliver(&mut self, q: QueueId, conn: ConnId, sub_id: &str, mut entry: Entry) {
        entry.deliveries += 1;
        let c = self.conns.get_mut(&conn).expect("consumer's connection");
        let tag = c.next_tag;
        c.next_tag += 1;
        let sub = c.subs.get_mut(sub_id).expect("consumer's subscription");
        sub.inflight += 1;
        sub.inflight_bytes += entry.size_bytes;
        let auto_ack = sub.ack == AckMode::Auto;
        let delivery = Delivery {
            sub_id: sub_id.to_string(),
            ack_tag: tag,
            message: entry.msg.clone(),
            redelivered: entry.redelivered || entry.deliveries > 1,
            delivery_count: entry.deliveries,
            auto_ack,
        };
        self.out
            .push(Output::Effect(Effect::Deliver { conn, delivery }));
        // Auto-ack deliveries are tracked like the others until the connection reports them
        // written to its socket (`Command::Credit`): a connection that dies before that gets
        // them redelivered, and their remove is logged only after the write.
        let seq = entry.msg.seq;
        sub.tags.insert(tag, seq);
        sub.seq_tags.insert(seq, tag);
        c.deliveries.insert(tag, (sub_id.to_string(), seq, q));
        let old = self
            .queue_mut(q)
            .inflight
            .insert(seq, InFlight { entry, conn, tag });
        assert!(
            old.is_none(),
            "message delivered twice at once from one queue"
        );
    }

    // ----------------------------------------------------------------------------------------
    // Queues

    /// Creates (and so declares) a virtual topic consumer queue a SEND names before the SEND's
    /// own record takes its log position.
    fn declare_before_route(&mut self, destination: &Destination) {
        if let Destination::Queue(name) = destination {
            if virtual_topic_of(name).is_some() {
                self.queue_for(QueueKey::Queue(name.clone()));
            }
        }
    }

    /// Puts a message in a queue's waiting line: behind its paged-out messages if it has any.
    fn enqueue(&mut self, q: QueueId, entry: Entry) {
        if self.queue(q).is_paging() {
            self.push_tail(q, entry, None);
        } else {
            self.queue_mut(q).push(entry);
        }
    }

    fn queue(&self, q: QueueId) -> &Queue {
        self.queues[q].as_ref().expect("live queue id")
    }

    fn queue_mut(&mut self, q: QueueId) -> &mut Queue {
        self.queues[q].as_mut().expect("live queue id")
    }

    fn add_queue(&mut self, key: QueueKey) -> QueueId {
        assert!(!self.queue_ids.contains_key(&key), "queue {key:?} exists");
        let queue = Queue::new(key.clone(), self.hot_bytes_total.clone());
        let q = match self.free_queue_ids.pop() {
            Some(q) => {
                self.queues[q] = Some(queue);
                q
            }
            None => {
                self.queues.push(Some(queue));
                self.queues.len() - 1
            }
        };
        if let QueueKey::Queue(name) = &key {
            if let Some(topic) = virtual_topic_of(name) {
                self.virtual_queues
                    .entry(topic.to_string())
                    .or_default()
                    .push(q);
                if !self.replaying {
                    // It must exist after a restart even if empty, or the topic's messages
                    // would not be copied for its group until a consumer comes back.
                    let lsn = self.log(Record::DeclareQueue { name: name.clone() });
                    self.queues[q].as_mut().expect("just added").record_lsn = lsn;
                    self.live.insert(lsn, LiveObject::Queue(name.clone()));
                }
            }
            // A new queue joins the wildcard consumers that match it.
            let joining: Vec<(ConnId, String)> = self
                .wildcard_queue_subs
                .iter()
                .filter(|(pattern, _, _)| wildcard_matches(pattern, name))
                .map(|(_, conn, sub_id)| (*conn, sub_id.clone()))
                .collect();
            for (conn, sub_id) in joining {
                let sub = self
                    .conns
                    .get_mut(&conn)
                    .and_then(|c| c.subs.get_mut(&sub_id))
                    .expect("wildcard consumers are live subscriptions");
                sub.queues.push(q);
                let kind = sub.consumer_kind();
                self.queues[q]
                    .as_mut()
                    .expect("just added")
                    .add_consumer(conn, sub_id, kind);
            }
        }
        self.queue_ids.insert(key, q);
        q
    }

    fn queue_for(&mut self, key: QueueKey) -> QueueId {
        match self.queue_ids.get(&key) {
            Some(&q) => q,
            None => self.add_queue(key),
        }
    }

    fn remove_queue(&mut self, q: QueueId) -> Queue {
        let queue = self.queues[q].take().expect("live queue");
        self.queue_ids.remove(&queue.key);
        self.free_queue_ids.push(q);
        self.to_dispatch.remove(&q);
        self.paging_queues.remove(&q);
        self.page_ins_waiting.remove(&q);
        queue
    }

    /// The temporary queue `name` of `owner`, created if needed: owned by `owner` when it is a
    /// connection here, else foreign (the caller is subscribing to it, so it has a consumer at
    /// once and is deleted with its last one).
    fn temp_queue(&mut self, owner: ConnId, name: &str) -> QueueId {
        let key = QueueKey::Temp {
            owner,
            name: name.to_string(),
        };
        if let Some(&q) = self.queue_ids.get(&key) {
            return q;
        }
        let q = self.add_queue(key);
        if let Some(c) = self.conns.get_mut(&owner) {
            c.temp_queues.push(q);
        }
        q
    }

    /// Whether `q` is a temporary queue no connection owns (see the module docs).
    fn is_foreign_temp(&self, q: QueueId) -> bool {
        match &self.queue(q).key {
            QueueKey::Temp { owner, .. } => self
                .conns
                .get(owner)
                .is_none_or(|c| !c.temp_queues.contains(&q)),
            _ => false,
        }
    }

    // ----------------------------------------------------------------------------------------
    // Durable state shared by live handling and replay

    /// Records that `msg` is held by exactly `holders`, described by the record at `lsn`.
    fn track_store(&mut self, msg: Arc<Message>, holders: Vec<QueueKey>, lsn: u64) {
        if let Some(old) = self.stored.remove(&msg.seq) {
            self.live.remove(old.lsn, &LiveObject::Message(msg.seq));
        }
        if holders.is_empty() {
            return;
        }
        self.live.insert(lsn, LiveObject::Message(msg.seq));
        self.stored.insert(msg.seq, Stored { msg, lsn, holders });
    }

    fn apply_durable_subscribe(
        &mut self,
        client_id: &str,
        name: &str,
        topic: &str,
        selector: Option<Selector>,
        lsn: u64,
    ) {
        let key = QueueKey::Durable {
            client_id: client_id.to_string(),
            name: name.to_string(),
        };
        let live = LiveObject::DurableSub {
            client_id: client_id.to_string(),
            name: name.to_string(),
        };
        let q = match self.queue_ids.get(&key) {
            Some(&q) => {
                let queue = self.queue(q);
                match queue.topic.clone() {
                    Some(old) if old == topic => {}
                    Some(old) => {
                        // Re-subscribing to another topic starts afresh (JMS semantics).
                        self.detach_topic(&Destination::Topic(old), q);
                        self.drop_durable_messages(q);
                    }
                    None => {}
                }
                if self.queue(q).topic.is_some() {
                    self.live.remove(self.queue(q).record_lsn, &live);
                }
                q
            }
            None => self.add_queue(key),
        };
        let queue = self.queue_mut(q);
        let attach = queue.topic.as_deref() != Some(topic);
        queue.topic = Some(topic.to_string());
        queue.record_lsn = lsn;
        queue.selector = selector;
        if attach {
            self.attach_topic(Destination::Topic(topic.to_string()), q);
        }
        self.live.insert(lsn, live);
    }

    /// A declared queue exists, described by the record at `lsn` (replay, compaction).
    fn apply_declare_queue(&mut self, name: String, lsn: u64) {
        let q = self.queue_for(QueueKey::Queue(name.clone()));
        let old = std::mem::replace(&mut self.queue_mut(q).record_lsn, lsn);
        if old != 0 {
            self.live.remove(old, &LiveObject::Queue(name.clone()));
        }
        self.live.insert(lsn, LiveObject::Queue(name));
    }

    /// Removes a durable subscription for good: logged, then applied.
    fn remove_durable(&mut self, client_id: &str, name: &str) {
        self.log(Record::DurableUnsubscribe {
            client_id: client_id.to_string(),
            name: name.to_string(),
        });
        self.apply_durable_unsubscribe(client_id, name);
    }

    fn apply_durable_unsubscribe(&mut self, client_id: &str, name: &str) {
        let key = QueueKey::Durable {
            client_id: client_id.to_string(),
            name: name.to_string(),
        };
        let Some(&q) = self.queue_ids.get(&key) else {
            return;
        };
        if let Some(topic) = self.queue(q).topic.clone() {
            self.detach_topic(&Destination::Topic(topic), q);
            let lsn = self.queue(q).record_lsn;
            self.live.remove(
                lsn,
                &LiveObject::DurableSub {
                    client_id: client_id.to_string(),
                    name: name.to_string(),
                },
            );
        }
        self.drop_durable_messages(q);
        let queue = self.remove_queue(q);
        assert!(
            queue.consumers.is_empty(),
            "removing an active durable subscription"
        );
    }

    /// Subscribes queue `q` to a topic name or wildcard pattern.
    fn attach_topic(&mut self, topic: Destination, q: QueueId) {
        let map = match &topic {
            Destination::Topic(name) if is_wildcard(name) => &mut self.wildcard_topics,
            _ => &mut self.topics,
        };
        map.entry(topic).or_default().push(q);
    }

    fn detach_topic(&mut self, topic: &Destination, q: QueueId) {
        let map = match topic {
            Destination::Topic(name) if is_wildcard(name) => &mut self.wildcard_topics,
            _ => &mut self.topics,
        };
        if let Some(list) = map.get_mut(topic) {
            list.retain(|&x| x != q);
            if list.is_empty() {
                map.remove(topic);
            }
        }
    }

    /// Every queue a message sent to `topic` is copied into: subscribers of that exact name,
    /// of matching wildcard patterns, and for `VirtualTopic.*` names the consumer queues
    /// `Consumer.<group>.VirtualTopic.*`.
    fn topic_targets(&self, topic: &Destination) -> Vec<QueueId> {
        let mut targets = self.topics.get(topic).cloned().unwrap_or_default();
        if let Destination::Topic(name) = topic {
            for (pattern, qs) in &self.wildcard_topics {
                if let Destination::Topic(p) = pattern {
                    if wildcard_matches(p, name) {
                        targets.extend(qs.iter().copied());
                    }
                }
            }
            if let Some(qs) = self.virtual_queues.get(name) {
                targets.extend(qs.iter().copied());
            }
        }
        // A queue subscribed through two patterns gets one copy.
        targets.sort_unstable();
        targets.dedup();
        targets
    }

    /// Everything a durable queue holds is released from it (no remove records: the caller's
    /// own record says the queue is gone).
    fn drop_durable_messages(&mut self, q: QueueId) {
        let drained = self.queue_mut(q).drain_all();
        for (lsn, seq) in drained.spilled {
            self.live.remove(lsn, &LiveObject::Message(seq));
        }
        // Paged-out messages are in no other structure: dropping them is enough.
        drop(drained.cold);
        let key = self.queue(q).key.clone();
        for e in drained.entries {
            if let Some(stored) = self.stored.get_mut(&e.msg.seq) {
                stored.holders.retain(|h| *h != key);
                if stored.holders.is_empty() {
                    let lsn = stored.lsn;
                    self.stored.remove(&e.msg.seq);
                    self.live.remove(lsn, &LiveObject::Message(e.msg.seq));
                }
            }
        }
    }

    // ----------------------------------------------------------------------------------------
    // Recovery and log maintenance

    /// Rebuilds durable state from one log record, in log order, before any connection.
    pub fn replay(&mut self, lsn: u64, record: Record) -> Result<(), String> {
        assert!(self.conns.is_empty(), "replay happens before serving");
        self.replaying = true;
        let r = self.replay_record(lsn, record);
        self.replaying = false;
        r
    }

    fn replay_record(&mut self, lsn: u64, record: Record) -> Result<(), String> {
        match record {
            Record::Store {
                message,
                holders,
                producer,
            } => {
                self.replay_store(message, holders, lsn);
                if let Some(mark) = producer {
                    self.replay_producer(&mark, lsn);
                }
            }
            Record::Remove { queue, seqs } => {
                for seq in seqs {
                    self.replay_remove(&queue, seq);
                }
            }
            Record::Commit {
                stores,
                removes,
                schedules,
                producer,
            } => {
                for (q, seq) in removes {
                    self.replay_remove(&q, seq);
                }
                for (m, h) in stores {
                    self.replay_store(m, h, lsn);
                }
                for (m, state) in schedules {
                    self.replay_schedule(m, state, lsn);
                }
                if let Some(mark) = producer {
                    self.replay_producer(&mark, lsn);
                }
            }
            Record::ProducerState { mark } => self.replay_producer(&mark, lsn),
            Record::DurableSubscribe {
                client_id,
                name,
                topic,
                selector,
            } => {
                let selector = match selector {
                    None => None,
                    Some(text) => Some(
                        Selector::parse(&text)
                            .map_err(|e| format!("durable subscription {client_id}/{name}: {e}"))?,
                    ),
                };
                self.apply_durable_subscribe(&client_id, &name, &topic, selector, lsn)
            }
            Record::DurableUnsubscribe { client_id, name } => {
                self.apply_durable_unsubscribe(&client_id, &name)
            }
            Record::Checkpoint { next_seq } => self.next_seq = self.next_seq.max(next_seq),
            Record::DeclareQueue { name } => self.apply_declare_queue(name, lsn),
            // Non-persistent messages do not survive a restart.
            Record::Spill { message } => self.next_seq = self.next_seq.max(message.seq + 1),
            Record::Schedule {
                message,
                state,
                producer,
            } => {
                self.replay_schedule(message, state, lsn);
                if let Some(mark) = producer {
                    self.replay_producer(&mark, lsn);
                }
            }
            Record::Fire {
                schedule,
                message,
                holders,
                next,
            } => {
                self.replay_fire(schedule, next, lsn);
                self.replay_store(message, holders, lsn);
            }
        }
        Ok(())
    }

    fn replay_store(&mut self, msg: Arc<Message>, holders: Vec<QueueKey>, lsn: u64) {
        self.next_seq = self.next_seq.max(msg.seq + 1);
        if !self.stored.contains_key(&msg.seq) {
            // Paged out earlier in the replay? Compaction re-logs with the same holder; a move
            // to the DLQ names the new one, so look where it was sent too.
            let mut hint: Vec<QueueId> = holders
                .iter()
                .filter_map(|k| self.queue_ids.get(k).copied())
                .collect();
            if let Destination::Queue(name) = &msg.destination {
                if let Some(&q) = self.queue_ids.get(&QueueKey::Queue(name.clone())) {
                    hint.push(q);
                }
            }
            if let Some(q) = self.find_paged(msg.seq, &hint) {
                let cref = self
                    .queue_mut(q)
                    .cold
                    .remove(msg.seq)
                    .expect("replay pages to cold");
                let key = self.queue(q).key.clone();
                if holders == [key.clone()] {
                    // Re-logged in place: still paged out, described by the new record.
                    self.queue_mut(q).cold.insert(
                        msg.seq,
                        ColdRef::new(lsn, msg.size_bytes() as u64, false, true),
                    );
                    return;
                }
                // Moved on: bring it back as held by `q` and let the general path move it.
                self.queue_mut(q).push(Entry::new(msg.clone(), false));
                self.track_store(msg.clone(), vec![key], cref.lsn);
            }
        }
        if holders.len() == 1 && !self.stored.contains_key(&msg.seq) {
            let q = self.queue_for(holders[0].clone());
            if self.replay_page_out(q, &msg, lsn) {
                return;
            }
        }
        let old: Vec<QueueKey> = self
            .stored
            .get(&msg.seq)
            .map(|s| s.holders.clone())
            .unwrap_or_default();
        for key in old.iter().filter(|k| !holders.contains(k)) {
            if let Some(&q) = self.queue_ids.get(key) {
                self.queue_mut(q).remove_waiting(&msg);
            }
        }
        for key in holders.iter().filter(|k| !old.contains(k)) {
            // A durable subscription's own record may come later (compaction re-logs it):
            // the queue exists from now on and adopts its topic then.
            let q = self.queue_for(key.clone());
            if !self.queue(q).contains(&msg) {
                self.enqueue(q, Entry::new(msg.clone(), false));
            }
        }
        self.track_store(msg, holders, lsn);
    }

    /// The record at `lsn` sets a producer's mark (the newest record wins; eviction beyond
    /// `producers_max` applies as live, idle forgetting at the first tick).
    fn replay_producer(&mut self, mark: &ProducerMark, lsn: u64) {
        let (id, released) = self.table(&mark.producer).replay(mark, lsn);
        self.release_producers(released);
        self.live.insert(lsn, LiveObject::Producer(id));
    }

    fn replay_remove(&mut self, key: &QueueKey, seq: u64) {
        let Some(stored) = self.stored.get(&seq) else {
            if let Some(&q) = self.queue_ids.get(key) {
                self.queue_mut(q).cold.remove(seq);
            }
            return;
        };
        let msg = stored.msg.clone();
        if let Some(&q) = self.queue_ids.get(key) {
            self.queue_mut(q).remove_waiting(&msg);
            self.removed(q, &msg);
        }
        // Replay logs nothing: drop what `removed` gathered.
        self.removes.clear();
    }

    /// Ends recovery: every recovered message may have been delivered before the crash, so
    /// its next delivery says `redelivered:true`. Returns an error if the log was inconsistent.
    pub fn finish_recovery(&mut self) -> Result<(), String> {
        for queue in self.queues.iter_mut().flatten() {
            if let QueueKey::Durable { client_id, name } = &queue.key {
                if queue.topic.is_none() {
                    return Err(format!("messages held by durable subscription {client_id}/{name}, which the log never creates"));
                }
            }
            for e in queue.ready_entries_mut() {
                e.redelivered = true;
            }
            // Replay puts messages behind paged-out ones in the tail (and pages out the rest
            // marked recovered).
            for t in queue.tail.values_mut() {
                t.entry.redelivered = true;
            }
        }
        Ok(())
    }

    /// The next message number; the caller logs it in a `Checkpoint` before deleting segments.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Lowest LSN the log must keep for durable state, if any is held.
    pub fn min_live_lsn(&self) -> Option<u64> {
        match (self.live.min_lsn(), self.cold_lsn_min()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Durable objects (messages, durable subscriptions) currently held.
    pub fn live_count(&self) -> usize {
        self.live.len() + self.memory_stats().paged_out as usize
    }

    pub fn live_count_in(&self, lo: u64, hi: u64) -> usize {
        self.live.count_in(lo, hi) + self.cold_count_in(lo, hi)
    }

    /// Compaction: re-logs up to `max` live objects described below `lsn`, so the segments
    /// there can be deleted, and stops once the messages re-logged reach `message_bytes_max`
    /// (the next call goes on from there). Returns how many were re-logged.
    ///
    /// The byte bound is what keeps one call's records (and the paged-out messages it reads
    /// back to re-log them) small: counted in records alone, a sparse segment of 64 KiB
    /// messages had tens of megabytes re-logged at once, outside every other memory bound.
    pub fn relocate_below(
        &mut self,
        lsn_limit: u64,
        max: usize,
        message_bytes_max: u64,
        ctx: Ctx,
        out: &mut Vec<Output>,
    ) -> usize {
        assert!(self.out.is_empty());
        self.lsn = ctx.next_lsn;
        let mut objects = self.live.below(lsn_limit, max);
        let room = max.saturating_sub(objects.len());
        if room > 0 {
            let cold = self.cold_below(lsn_limit, room);
            objects.extend(cold.into_iter().map(|(l, s)| (l, LiveObject::Message(s))));
        }
        let mut n = 0;
        let mut message_bytes = 0u64;
        for (lsn, object) in objects {
            if message_bytes >= message_bytes_max {
                break;
            }
            n += 1;
            match object {
                LiveObject::Queue(name) => {
                    let lsn = self.log(Record::DeclareQueue { name: name.clone() });
                    self.apply_declare_queue(name, lsn);
                }
                LiveObject::Message(seq) if self.schedules.contains_key(&seq) => {
                    message_bytes += self.schedules[&seq].msg.size_bytes() as u64;
                    self.relocate_schedule(seq);
                }
                LiveObject::Message(seq) if !self.stored.contains_key(&seq) => {
                    message_bytes += self.relocate_paged(seq, lsn);
                }
                LiveObject::Message(seq) => {
                    let stored = &self.stored[&seq];
                    let (msg, holders) = (stored.msg.clone(), stored.holders.clone());
                    message_bytes += msg.size_bytes() as u64;
                    // No producer: a re-log must not move the producer's mark back.
                    let lsn = self.log(Record::Store {
                        message: msg.clone(),
                        holders: holders.clone(),
                        producer: None,
                    });
                    self.track_store(msg, holders, lsn);
                }
                LiveObject::Producer(id) => {
                    let mark = self
                        .table_of(&id)
                        .durable_mark(&id)
                        .expect("live producer has a durable mark");
                    let new = self.log(Record::ProducerState { mark });
                    let old = self.table(&id).relogged(&id, new);
                    assert_eq!(old, lsn, "live set and producer table disagree");
                    self.live.remove(old, &LiveObject::Producer(id.clone()));
                    self.live.insert(new, LiveObject::Producer(id));
                }
                LiveObject::DurableSub { client_id, name } => {
                    let q = self.queue_ids[&QueueKey::Durable {
                        client_id: client_id.clone(),
                        name: name.clone(),
                    }];
                    let topic = self
                        .queue(q)
                        .topic
                        .clone()
                        .expect("live durable subscription has a topic");
                    let selector = self.queue(q).selector.clone();
                    let lsn = self.log(Record::DurableSubscribe {
                        client_id: client_id.clone(),
                        name: name.clone(),
                        topic: topic.clone(),
                        selector: selector.as_ref().map(|s| s.text().to_string()),
                    });
                    self.apply_durable_subscribe(&client_id, &name, &topic, selector, lsn);
                }
            }
        }
        out.append(&mut self.out);
        n
    }

    /// Every queue that holds messages or has consumers (named queues and durable
    /// subscriptions; the volatile ones too).
    pub fn queue_stats(&self) -> Vec<QueueStats> {
        let mut v: Vec<QueueStats> = self
            .queues
            .iter()
            .flatten()
            .map(|q| QueueStats {
                key: q.key.clone(),
                ready: q.waiting_len(),
                inflight: q.inflight.len(),
                consumers: q.consumers.len(),
            })
            .collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    /// Durable state: which durable queue holds which message seqs. Equal before a crash and
    /// after replaying the log — the property recovery must keep.
    pub fn durable_contents(&self) -> BTreeMap<QueueKey, BTreeSet<u64>> {
        let mut m: BTreeMap<QueueKey, BTreeSet<u64>> = BTreeMap::new();
        for q in self.queues.iter().flatten() {
            if let QueueKey::Durable { .. } = q.key {
                m.entry(q.key.clone()).or_default();
            }
        }
        for (seq, s) in &self.stored {
            for h in &s.holders {
                m.entry(h.clone()).or_default().insert(*seq);
            }
        }
        for q in self.queues.iter().flatten() {
            for (seq, cref) in q.cold.iter() {
                if !cref.spilled {
                    m.entry(q.key.clone()).or_default().insert(seq);
                }
            }
        }
        m
    }

    fn declared_queue_count(&self) -> usize {
        self.queues
            .iter()
            .flatten()
            .filter(|q| matches!(q.key, QueueKey::Queue(_)) && q.record_lsn != 0)
            .count()
    }

    /// Producer → (seq, seen_ms) as the log has it, applications' producers and network
    /// origins alike (their ids differ by prefix): equal before a crash and after replay
    /// (with the same forgetting applied), like [`Engine::durable_contents`].
    pub fn durable_producers(&self) -> BTreeMap<String, (u64, u64)> {
        let mut marks = self.producers.durable_marks();
        marks.extend(self.origins.durable_marks());
        marks
    }

    /// The high-water mark of `producer` (0 if unknown), from the table its id belongs to (a
    /// network origin's is 1 once seen). For an application's producer, what CONNECTED
    /// reports in `haven-seq`: the caller must not report it before every record appended so
    /// far is durable (the record that raised it may be among them).
    pub fn producer_hwm(&self, producer: &str) -> u64 {
        self.table_of(producer).hwm(producer)
    }

    /// Applications' producers (`haven-producer`); network origins are counted apart, in
    /// [`Engine::origin_stats`].
    pub fn producer_stats(&self) -> ProducerStats {
        self.producers.stats()
    }

    /// Network origins (`haven-net-origin` of forwarded messages): how many are remembered,
    /// from how many sources, the forwarded SENDs answered as duplicates, and what was
    /// forgotten.
    pub fn origin_stats(&self) -> OriginStats {
        self.origins.stats()
    }

    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Checks cross-structure invariants; for tests and simulation (O(state)).
    pub fn check_invariants(&self) {
        let mut advertised = 0;
        for (conn, c) in &self.conns {
            let mut tags = 0;
            for (sub_id, sub) in &c.subs {
                advertised += usize::from(sub.advertised_as.is_some());
                for &q in &sub.queues {
                    assert!(
                        self.queue(q)
                            .consumers
                            .iter()
                            .any(|(cc, s)| cc == conn && s == sub_id),
                        "subscription not attached to its queue"
                    );
                }
                for (tag, seq) in &sub.tags {
                    let (d_sub, d_seq, q) = &c.deliveries[tag];
                    assert_eq!((d_sub, d_seq), (sub_id, seq));
                    assert!(
                        sub.queues.contains(q),
                        "delivery from a queue it does not consume"
                    );
                    let f = &self.queue(*q).inflight[seq];
                    assert_eq!((f.conn, f.tag), (*conn, *tag));
                }
                assert_eq!(sub.inflight as usize, sub.tags.len());
                let bytes: u64 = sub
                    .tags
                    .iter()
                    .map(|(tag, seq)| {
                        let q = c.deliveries[tag].2;
                        self.queue(q).inflight[seq].entry.size_bytes
                    })
                    .sum();
                assert_eq!(sub.inflight_bytes, bytes);
                tags += sub.tags.len();
            }
            assert_eq!(tags, c.deliveries.len());
        }
        assert_eq!(
            advertised,
            self.advisories.consumer_count(),
            "advisories count other consumers than the subscriptions"
        );
        let mut owned_temp = 0;
        for (conn, c) in &self.conns {
            for &q in &c.temp_queues {
                let queue = self.queue(q);
                assert!(
                    matches!(&queue.key, QueueKey::Temp { owner, .. } if owner == conn),
                    "connection {conn} owns {:?}",
                    queue.key
                );
                assert!(
                    queue.consumers.iter().all(|(cc, _)| cc == conn),
                    "only the owner consumes its temporary queue"
                );
                owned_temp += 1;
            }
        }
        for (q, queue) in self.queues.iter().enumerate() {
            let Some(queue) = queue else { continue };
            if !matches!(queue.key, QueueKey::Temp { .. }) {
                continue;
            }
            if self.is_foreign_temp(q) {
                assert!(
                    !queue.consumers.is_empty(),
                    "foreign {} outlived its last consumer",
                    queue.key
                );
            } else {
                owned_temp -= 1;
            }
        }
        assert_eq!(
            owned_temp, 0,
            "an owned temporary queue listed twice or gone"
        );
        for queue in self.queues.iter().flatten() {
            let network = queue
                .consumers
                .iter()
                .filter(|(c, s)| self.conns[c].subs[s].network.is_some())
                .count();
            assert_eq!(
                network,
                queue.network_consumers(),
                "network consumers miscounted"
            );
        }
        for (seq, s) in &self.stored {
            assert!(!s.holders.is_empty());
            for h in &s.holders {
                let q = self.queue(self.queue_ids[h]);
                assert!(
                    q.contains(&s.msg),
                    "stored message {seq} missing from holder {h:?}"
                );
            }
        }
        let subs = self
            .queues
            .iter()
            .flatten()
            .filter(|q| matches!(q.key, QueueKey::Durable { .. }))
            .count();
        assert_eq!(
            self.live.len(),
            self.stored.len()
                + subs
                + self.paged_live_count()
                + self.schedules.len()
                + self.declared_queue_count()
                + self.producers.durable_count()
                + self.origins.durable_count()
        );
        self.producers.check_invariants();
        self.origins.check_invariants();
        let origins = self.origins.durable_lsns();
        let marks: BTreeSet<(u64, String)> = self
            .producers
            .durable_lsns()
            .map(|(lsn, id)| (lsn, id.to_string()))
            .chain(origins.iter().cloned())
            .collect();
        assert!(
            self.producers
                .durable_lsns()
                .all(|(_, id)| !is_network_origin(id))
                && origins.iter().all(|(_, id)| is_network_origin(id)),
            "a mark in the wrong producer table"
        );
        assert_eq!(marks, self.live.producers(), "producer marks not live");
        for (q, queue) in self.queues.iter().enumerate() {
            if queue.as_ref().is_some_and(|queue| queue.is_paging()) {
                assert!(self.paging_queues.contains(&q), "paging queue not tracked");
            }
        }
    }
}
