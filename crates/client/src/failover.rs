//! `Client`: a STOMP session that survives the loss of its broker (ActiveMQ's failover
//! transport, made exact with Haven's producer sequences).
//!
//! Ownership and tasks:
//! - A *supervisor* task owns the current [`Connection`]. It waits for it to close, then
//!   reconnects over the broker list with back-off (`backoff.rs`), restores the session on the
//!   new connection and publishes it through a `watch` channel (`Link`). It also follows
//!   cluster announcements (`haven-cluster`), `priorityBackup` and the warm `backup`.
//! - A *confirmer* task receives the RECEIPT ids of tracked frames (through the connections'
//!   receipt sink) and retires them from the pending table.
//! - Application calls take `&self` and run in the caller's task.
//!
//! Every non-transacted SEND gets the client's producer id, the next sequence number and a
//! receipt (`hv-<seq>`), and stays in `State::pending` until its RECEIPT arrives. After a
//! reconnect the broker's CONNECTED says (`haven-seq`) the highest sequence it has stored for
//! this producer; everything up to it is confirmed and the rest is sent again, with the same
//! sequence numbers, so a Haven broker that already stored one answers with a RECEIPT and does
//! not store it twice. Against another broker (no `haven-seq`) every unconfirmed SEND is sent
//! again: at least once.
//!
//! Lock order: `order` (tokio mutex, held across writes so sequence order is wire order, and
//! during a restore so nothing interleaves with it) before `state` (std mutex, never held
//! across an await).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use haven_stomp::{Command, Frame};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::sync::{broadcast, mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::backoff::reconnect;
use crate::connection::{ack_frame, send_frame};
use crate::dedup::{DupWindow, Key};
use crate::shared::Hooks;
use crate::uri::{parse_uri, BrokerUri};
use crate::{AckMode, ClientError, ConnectOptions, Connection, Message, Result, Subscription};

/// The subscription id a Haven broker uses for pushed cluster announcements.
const CLUSTER_SUBSCRIPTION: &str = "haven.cluster";
/// Receipt ids of tracked frames: `hv-<seq>`.
const TRACKED_RECEIPT_PREFIX: &str = "hv-";
/// How often `priorityBackup` retries the priority brokers while connected elsewhere.
const PRIORITY_RETRY_MS: u64 = 1_000;
/// Generations whose store id is remembered (messages older than this cannot be acked anyway).
const GENERATIONS_REMEMBERED_MAX: usize = 64;
/// Transactions of lost connections remembered (to report them rolled back on next use).
const DEAD_TRANSACTIONS_REMEMBERED_MAX: usize = 1024;
/// Events buffered for a slow event listener before it misses some (it is told how many).
const EVENTS_BUFFERED_MAX: usize = 256;

/// What happened to the client's connection, for applications that watch
/// ([`Client::events`]). Each is also logged.
#[derive(Debug, Clone)]
pub enum ConnectionEvent {
    /// The first connection is up.
    Connected { broker: String },
    /// The connection to `broker` was lost; the client is reconnecting.
    Interrupted { broker: String, reason: ClientError },
    /// A new connection is up and the session restored: subscriptions re-made, `resent`
    /// unconfirmed SENDs sent again, `confirmed` found already stored by the broker.
    Resumed {
        broker: String,
        resent: usize,
        confirmed: usize,
    },
    /// The broker refused a SEND the application did not wait for (no receipt requested).
    SendRefused {
        destination: String,
        reason: ClientError,
    },
    /// The broker list grew or changed from a cluster announcement.
    ClusterUpdated { brokers: Vec<String> },
    /// The store behind `broker` had confirmed persistent SENDs of this client up to sequence
    /// `confirmed`, but its CONNECTED now says `mark`: it forgot this producer (its table
    /// forgot it for room or idleness: `limits.producers_max`, `limits.producer_idle_ms_max`).
    /// The `resent` SENDs written again may be stored twice; nothing is lost. `unknown` frames
    /// written before were failed with `OutcomeUnknown` instead: in-flight COMMITs always, and
    /// SENDs when `ConnectOptions::resend_when_producer_forgotten` is false.
    ProducerForgotten {
        broker: String,
        mark: u64,
        confirmed: u64,
        resent: usize,
        unknown: usize,
    },
    /// Reconnecting gave up (`maxReconnectAttempts`): the client is closed.
    Failed { reason: ClientError },
}

/// The connection the client currently uses.
#[derive(Clone)]
enum Link {
    Connecting,
    Up {
        generation: u64,
        conn: Connection,
        broker: String,
    },
    /// Closed for good (`disconnect`, or reconnecting gave up).
    Down(ClientError),
}

enum PendingKind {
    Send { destination: String },
    Commit { transaction: String },
}

struct Pending {
    frame: Frame,
    kind: PendingKind,
    /// The generation it was last written on; `None` while it never left the client.
    written_on: Option<u64>,
    waiter: Option<oneshot::Sender<Result<()>>>,
    _permit: Option<OwnedSemaphorePermit>,
}

struct Tx {
    generation: u64,
    /// Acks made inside the transaction: they count for duplicate filtering only once it
    /// commits.
    acks: Vec<(Arc<SubTracker>, Message)>,
}

struct State {
    brokers: Vec<String>,
    next_seq: u64,
    next_generation: u64,
    pending: BTreeMap<u64, Pending>,
    subs: BTreeMap<String, Arc<SubTracker>>,
    txs: BTreeMap<String, Tx>,
    /// Store id per connection generation (for duplicate-filter keys), and whether that
    /// broker stores a SEND without a `persistent` header (`haven-persistent-default`; None
    /// from a broker that does not say).
    stores: VecDeque<(u64, Arc<str>, Option<bool>)>,
    /// Per store, the highest sequence of a persistent SEND it confirmed: a later CONNECTED
    /// from that store with a lower mark means it forgot this producer. At most
    /// `GENERATIONS_REMEMBERED_MAX` stores, the first one seen dropped first.
    confirmed_persistent: VecDeque<(Arc<str>, u64)>,
    stats: ClientStats,
    /// The connection being restored: it delivers messages (and must take their ACKs) before
    /// it becomes the published `Link::Up`.
    restoring: Option<(u64, Connection, String)>,
}

/// Counters of a client's life, for tools and monitoring ([`Client::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// SENDs a broker confirmed (RECEIPT, or `haven-seq` after a reconnect).
    pub sends_confirmed: u64,
    /// SENDs a broker refused with an ERROR.
    pub sends_refused: u64,
    /// SENDs given up without a broker's answer (`timeout`, or reconnecting gave up).
    pub sends_abandoned: u64,
    /// SENDs written again on a new connection.
    pub sends_resent: u64,
    /// Redeliveries of already-acked messages dropped before the application saw them.
    pub duplicates_dropped: u64,
    /// Connections re-established after a loss.
    pub reconnects: u64,
    /// Reconnects on which the store had forgotten this producer
    /// (`ConnectionEvent::ProducerForgotten`).
    pub producer_forgotten: u64,
}

impl State {
    fn store_of(&self, generation: u64) -> Option<Arc<str>> {
        self.stores
            .iter()
            .find(|(g, _, _)| *g == generation)
            .map(|(_, s, _)| s.clone())
    }

    /// The highest persistent SEND `store` confirmed, if it confirmed any.
    fn confirmed_mut(&mut self, store: &str) -> Option<&mut u64> {
        self.confirmed_persistent
            .iter_mut()
            .find(|(s, _)| &**s == store)
            .map(|(_, seq)| seq)
    }

    /// A RECEIPT for tracked frame `seq` arrived: if it is a persistent SEND, the store of the
    /// connection it was written on has it (`confirmed_mut`). Confirmations by a CONNECTED's
    /// mark do not count: the mark also covers non-persistent SENDs, which a restart forgets.
    fn credit_receipt(&mut self, seq: u64) {
        let Some(p) = self.pending.get(&seq) else {
            return;
        };
        if !matches!(p.kind, PendingKind::Send { .. }) {
            return;
        }
        let Some((_, store, default)) = p
            .written_on
            .and_then(|g| self.stores.iter().find(|(sg, _, _)| *sg == g))
        else {
            return;
        };
        let persistent = match p.frame.header("persistent") {
            Some(v) => v == "true",
            None => *default == Some(true),
        };
        if !persistent {
            return;
        }
        // Field by field (not `confirmed_mut`), so `store` is cloned only for a new entry.
        match self
            .confirmed_persistent
            .iter_mut()
            .find(|(s, _)| s == store)
        {
            Some((_, c)) => *c = (*c).max(seq),
            None => {
                self.confirmed_persistent.push_back((store.clone(), seq));
                while self.confirmed_persistent.len() > GENERATIONS_REMEMBERED_MAX {
                    self.confirmed_persistent.pop_front();
                }
            }
        }
    }
}

struct Inner {
    uri: BrokerUri,
    opts: ConnectOptions,
    producer_id: String,
    state: Mutex<State>,
    order: tokio::sync::Mutex<()>,
    link: watch::Sender<Link>,
    events: broadcast::Sender<ConnectionEvent>,
    /// Subscribed before the first connection, handed to the first `events()` call so that it
    /// sees `Connected` too.
    first_events: Mutex<Option<broadcast::Receiver<ConnectionEvent>>>,
    window: Arc<Semaphore>,
    /// Notified whenever the pending table becomes empty (`disconnect` waits on it).
    drained: tokio::sync::Notify,
    receipts: mpsc::UnboundedSender<String>,
    cluster: mpsc::Sender<Message>,
    stop: watch::Sender<bool>,
    /// Every random choice (broker order, back-off jitter, ids): one seed replays them.
    rng: Mutex<StdRng>,
    /// `haven-session` of connection `g` is `session_base + g`: the client's start time in
    /// microseconds, so a restarted client (same producer id) outranks its earlier run.
    session_base: u64,
}

/// A STOMP session over `tcp://` or `failover:(...)` that reconnects, restores its
/// subscriptions and sends every unconfirmed SEND again. Cheap to clone; all methods take
/// `&self`.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// One subscription as the client remembers it across connections.
pub(crate) struct SubTracker {
    id: String,
    destination: String,
    ack: AckMode,
    headers: Vec<(String, String)>,
    /// The application's channel; dropped (`None`) when the client stops, which ends the
    /// `Subscription` stream.
    tx: Mutex<Option<mpsc::Sender<Message>>>,
    client: Weak<Inner>,
    filter: Mutex<SubFilter>,
}

struct SubFilter {
    acked: DupWindow,
    /// `client` (cumulative) mode: delivered and not yet acked, in delivery order.
    unacked: VecDeque<Key>,
    /// Receipt id of the last SUBSCRIBE sent for it (to know which ERROR refused it).
    receipt: String,
}

impl Client {
    /// Parses `uri`, connects to the first broker that answers (within
    /// `startupMaxReconnectAttempts`) and starts the supervisor.
    pub async fn connect(uri: &str, opts: ConnectOptions) -> Result<Client> {
        let uri = parse_uri(uri)?;
        let mut rng = StdRng::seed_from_u64(opts.rng_seed.unwrap_or_else(rand::random));
        let producer_id = opts
            .producer_id
            .clone()
            .unwrap_or_else(|| format!("hv-{:016x}{:016x}", rng.gen::<u64>(), rng.gen::<u64>()));
        let (receipts_tx, receipts_rx) = mpsc::unbounded_channel();
        let (cluster_tx, cluster_rx) = mpsc::channel(16);
        let (events_tx, first_events) = broadcast::channel(EVENTS_BUFFERED_MAX);
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                brokers: uri.brokers.clone(),
                next_seq: 1,
                next_generation: 1,
                pending: BTreeMap::new(),
                subs: BTreeMap::new(),
                txs: BTreeMap::new(),
                stores: VecDeque::new(),
                confirmed_persistent: VecDeque::new(),
                stats: ClientStats::default(),
                restoring: None,
            }),
            window: Arc::new(Semaphore::new(opts.unconfirmed_sends_max.max(1))),
            drained: tokio::sync::Notify::new(),
            uri,
            opts,
            producer_id,
            order: tokio::sync::Mutex::new(()),
            link: watch::channel(Link::Connecting).0,
            events: events_tx,
            first_events: Mutex::new(Some(first_events)),
            receipts: receipts_tx,
            cluster: cluster_tx,
            stop: watch::channel(false).0,
            rng: Mutex::new(rng),
            session_base: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        });
        let (conn, broker, generation) = establish(&inner, true, None).await?;
        let client = Client { inner };
        restore(&client.inner, &conn, generation, &broker).await?;
        client.inner.emit(ConnectionEvent::Connected {
            broker: broker.clone(),
        });
        tokio::spawn(confirm(Arc::downgrade(&client.inner), receipts_rx));
        tokio::spawn(supervise(
            client.inner.clone(),
            conn,
            broker,
            generation,
            cluster_rx,
        ));
        Ok(client)
    }

    /// The id sent as `haven-producer` with every SEND.
    pub fn producer_id(&self) -> &str {
        &self.inner.producer_id
    }

    /// Connection events. The first call's receiver starts at the very beginning, so it sees
    /// the first `Connected` (made before `connect` returned); later calls see events from then
    /// on. A listener that falls more than 256 events behind misses the oldest
    /// (`RecvError::Lagged`).
    pub fn events(&self) -> broadcast::Receiver<ConnectionEvent> {
        let first = self
            .inner
            .first_events
            .lock()
            .expect("events poisoned")
            .take();
        first.unwrap_or_else(|| self.inner.events.subscribe())
    }

    /// The broker currently connected, if any.
    pub fn broker(&self) -> Option<String> {
        match &*self.inner.link.borrow() {
            Link::Up { broker, .. } => Some(broker.clone()),
            _ => None,
        }
    }

    /// The broker list, including addresses a cluster announced.
    pub fn brokers(&self) -> Vec<String> {
        self.inner.lock().brokers.clone()
    }

    /// Connections re-established after a loss.
    pub fn reconnects(&self) -> u64 {
        self.inner.lock().stats.reconnects
    }

    pub fn stats(&self) -> ClientStats {
        self.inner.lock().stats
    }

    /// Why the client stopped (`disconnect`, or reconnecting gave up); `None` while it runs.
    pub fn close_reason(&self) -> Option<ClientError> {
        match &*self.inner.link.borrow() {
            Link::Down(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// SENDs waiting for their RECEIPT.
    pub fn unconfirmed_sends(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// A header of the current connection's CONNECTED frame.
    pub fn connected_header(&self, name: &str) -> Option<String> {
        match &*self.inner.link.borrow() {
            Link::Up { conn, .. } => conn.connected_header(name).map(str::to_string),
            _ => None,
        }
    }

    // ----- sending -----------------------------------------------------------------------

    /// Sends without waiting for the RECEIPT. The client still asks for one and keeps the
    /// SEND until it arrives, sending it again after a failover; this returns once the SEND
    /// is in that table (waiting, up to `timeout`, while `unconfirmed_sends_max` are
    /// outstanding). With a `transaction` header the SEND joins that transaction instead.
    pub async fn send(
        &self,
        destination: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<()> {
        self.send_with(send_frame(destination, headers, body.into()), false)
            .await
    }

    /// Sends and waits until a broker has the message (on Haven, a persistent one is on
    /// disk), across failovers. With `timeout` set, a SEND that is not confirmed in time is
    /// withdrawn: [`ClientError::Timeout`] if it never reached a broker,
    /// [`ClientError::OutcomeUnknown`] if it did.
    pub async fn send_receipted(
        &self,
        destination: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<()> {
        self.send_with(send_frame(destination, headers, body.into()), true)
            .await
    }

    async fn send_with(&self, frame: Frame, wait: bool) -> Result<()> {
        match frame.header("transaction").map(str::to_string) {
            Some(tx) => self.send_in_transaction(&tx, frame).await,
            None => self.track(frame, wait).await,
        }
    }

    async fn track(&self, frame: Frame, wait: bool) -> Result<()> {
        let deadline = self.inner.deadline();
        let permit = match deadline {
            None => self.inner.window.clone().acquire_owned().await,
            Some(d) => tokio::time::timeout_at(d, self.inner.window.clone().acquire_owned())
                .await
                .map_err(|_| self.inner.timeout_error("room among unconfirmed SENDs"))?,
        }
        .expect("the send window semaphore is never closed");
        let destination = frame.header("destination").unwrap_or("").to_string();
        let (tx, rx) = oneshot::channel();
        let seq = self
            .inner
            .submit(
                frame,
                PendingKind::Send { destination },
                wait.then_some(tx),
                Some(permit),
            )
            .await?;
        if !wait {
            return Ok(());
        }
        self.inner.await_tracked(seq, rx, deadline, "SEND").await
    }

    // ----- subscribing -------------------------------------------------------------------

    /// Subscribes (receipted). The subscription is made again, with the same id and headers,
    /// on every new connection; messages the application already acked that a broker
    /// redelivers after a failover are dropped (and acked again) before they reach it.
    pub async fn subscribe(
        &self,
        destination: &str,
        ack: AckMode,
        headers: &[(&str, &str)],
    ) -> Result<Subscription> {
        let id = match headers.iter().find(|(k, _)| *k == "id") {
            Some((_, v)) => v.to_string(),
            None => format!("sub-{}", self.inner.random::<u32>()),
        };
        if id == CLUSTER_SUBSCRIPTION {
            return Err(ClientError::Protocol(format!(
                "subscription id {id:?} is reserved for cluster announcements"
            )));
        }
        let headers: Vec<(String, String)> = headers
            .iter()
            .filter(|(k, _)| !matches!(*k, "id" | "destination" | "ack" | "receipt"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (tx, rx) = mpsc::channel(self.inner.opts.subscription_buffer_messages_max.max(1));
        let tracker = Arc::new(SubTracker {
            id: id.clone(),
            destination: destination.to_string(),
            ack,
            headers,
            tx: Mutex::new(Some(tx)),
            client: Arc::downgrade(&self.inner),
            filter: Mutex::new(SubFilter {
                acked: DupWindow::new(self.inner.opts.dedup_window_messages.max(1)),
                unacked: VecDeque::new(),
                receipt: String::new(),
            }),
        });
        let deadline = self.inner.deadline();
        loop {
            let (generation, conn, _) = self.inner.wait_up(0, deadline).await?;
            let receipt = {
                let _order = self.inner.order.lock().await;
                if self.inner.current_generation() != Some(generation) {
                    continue;
                }
                {
                    let mut st = self.inner.lock();
                    if st.subs.contains_key(&id) {
                        return Err(ClientError::Protocol(format!(
                            "subscription id {id:?} is already in use on this client"
                        )));
                    }
                    st.subs.insert(id.clone(), tracker.clone());
                }
                let Some(tx) = tracker.sender() else {
                    return Err(ClientError::Closed);
                };
                match conn.subscribe_raw(&id, tracker.subscribe_frame(), tx).await {
                    Ok(r) => {
                        tracker.lock().receipt = r.id().to_string();
                        r
                    }
                    Err(_) => {
                        // The connection is going: the restore on the next one includes it.
                        return self
                            .subscribed_after_restore(tracker, rx, generation, deadline)
                            .await;
                    }
                }
            };
            let receipt_id = receipt.id().to_string();
            return match receipt.await {
                Ok(()) => Ok(tracker.subscription(rx)),
                // A waiter fails with the connection's close reason: an ERROR naming this
                // SUBSCRIBE's receipt means the broker refused it. It is not restored
                // anywhere (the supervisor drops it too, see `on_lost`).
                Err(e @ ClientError::Server { .. }) if matches!(&e, ClientError::Server { receipt_id: Some(r), .. } if *r == receipt_id) =>
                {
                    self.inner.lock().subs.remove(&id);
                    Err(e)
                }
                Err(_) => {
                    self.subscribed_after_restore(tracker, rx, generation, deadline)
                        .await
                }
            };
        }
    }

    async fn subscribed_after_restore(
        &self,
        tracker: Arc<SubTracker>,
        rx: mpsc::Receiver<Message>,
        generation: u64,
        deadline: Option<Instant>,
    ) -> Result<Subscription> {
        self.inner.wait_up(generation + 1, deadline).await?;
        if self.inner.lock().subs.contains_key(&tracker.id) {
            Ok(tracker.subscription(rx))
        } else {
            Err(ClientError::Protocol(format!(
                "subscription {:?} was refused by the broker",
                tracker.id
            )))
        }
    }

    /// UNSUBSCRIBE. A durable subscription (`activemq.subscriptionName` in `headers`) is
    /// removed from the broker even if the connection fails meanwhile: the client retries on
    /// the next one.
    pub async fn unsubscribe(&self, sub: Subscription, headers: &[(&str, &str)]) -> Result<()> {
        let id = sub.id.clone();
        drop(sub);
        self.inner.lock().subs.remove(&id);
        // Only an UNSUBSCRIBE naming the durable subscription removes it from the broker;
        // without the name it merely detaches, like the end of a connection.
        let durable = headers
            .iter()
            .any(|(k, _)| *k == "activemq.subscriptionName" || *k == "durable-subscription-name");
        let deadline = self.inner.deadline();
        loop {
            let (generation, conn, _) = self.inner.wait_up(0, deadline).await?;
            match conn.unsubscribe_id(&id, headers).await {
                Ok(()) => return Ok(()),
                Err(e @ ClientError::Server { .. }) if conn.close_reason().is_none() => {
                    return Err(e)
                }
                Err(e) if !durable => {
                    // A plain subscription ends with its connection; nothing to undo.
                    tracing::debug!(error = %e, "UNSUBSCRIBE lost with the connection");
                    return Ok(());
                }
                Err(_) => {
                    self.inner.wait_up(generation + 1, deadline).await?;
                }
            }
        }
    }

    // ----- acknowledging -----------------------------------------------------------------

    /// ACK. A message delivered by a connection that has since been lost cannot be acked on
    /// it; the client remembers the ack instead, and drops (and acks) the redelivery.
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        self.ack_with(msg, None, false).await
    }

    /// ACK and wait for the RECEIPT when the delivering connection is still up.
    pub async fn ack_receipted(&self, msg: &Message) -> Result<()> {
        self.ack_with(msg, None, true).await
    }

    /// ACK inside `transaction` (it counts once the transaction commits) or not, waiting for
    /// a RECEIPT or not.
    pub async fn ack_with(
        &self,
        msg: &Message,
        transaction: Option<&str>,
        receipted: bool,
    ) -> Result<()> {
        let tracker = self.inner.lock().subs.get(&msg.subscription).cloned();
        if let Some(tx) = transaction {
            let conn = self.inner.transaction_connection(tx)?;
            if msg.generation != conn.generation() {
                return Err(ClientError::TransactionRolledBack {
                    transaction: tx.to_string(),
                    reason: "the message was delivered by an earlier connection".into(),
                });
            }
            if let Some(t) = tracker {
                if let Some(state) = self.inner.lock().txs.get_mut(tx) {
                    state.acks.push((t, msg.clone()));
                }
            }
            return conn.ack_with(msg, Some(tx), receipted).await;
        }
        if let Some(t) = &tracker {
            t.record_ack(msg);
        }
        self.acknowledge(Command::Ack, msg, receipted).await
    }

    /// NACK: the broker redelivers it (or moves it to the DLQ). On a lost connection there is
    /// nothing to do: the message will be redelivered anyway.
    pub async fn nack(&self, msg: &Message) -> Result<()> {
        self.acknowledge(Command::Nack, msg, false).await
    }

    async fn acknowledge(&self, command: Command, msg: &Message, receipted: bool) -> Result<()> {
        let Some((conn, _)) = self.inner.connection_of(msg.generation) else {
            return Ok(());
        };
        let frame = ack_frame(command, conn.version(), msg, None);
        let result = if receipted {
            match conn.request(frame).await {
                Ok(r) => r.await,
                Err(e) => Err(e),
            }
        } else {
            conn.enqueue_frame(&frame).await
        };
        match result {
            // The connection died under the ack: it is remembered, the redelivery is dropped.
            Err(e) if conn.close_reason().is_some() && !matches!(e, ClientError::Server { .. }) => {
                Ok(())
            }
            other => other,
        }
    }

    // ----- transactions ------------------------------------------------------------------

    /// BEGIN (receipted). The transaction lives on the current connection: if that connection
    /// is lost before COMMIT, the broker rolls it back and the client reports
    /// [`ClientError::TransactionRolledBack`] on its next use.
    pub async fn begin(&self, transaction: &str) -> Result<()> {
        let (generation, conn, _) = self.inner.wait_up(0, self.inner.deadline()).await?;
        if self.inner.lock().txs.contains_key(transaction) {
            return Err(ClientError::Protocol(format!(
                "transaction {transaction:?} is already open on this client"
            )));
        }
        conn.begin(transaction).await?;
        self.inner.lock().txs.insert(
            transaction.to_string(),
            Tx {
                generation,
                acks: Vec::new(),
            },
        );
        Ok(())
    }

    async fn send_in_transaction(&self, transaction: &str, frame: Frame) -> Result<()> {
        let conn = self.inner.transaction_connection(transaction)?;
        match conn.enqueue_frame(&frame).await {
            Ok(()) => Ok(()),
            Err(e) => Err(ClientError::TransactionRolledBack {
                transaction: transaction.to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// COMMIT, waiting for the broker's answer. It carries a producer sequence number, so if
    /// the connection is lost after sending it, the next broker's CONNECTED tells whether it
    /// took effect: `Ok` if it did, [`ClientError::TransactionRolledBack`] if not, and
    /// [`ClientError::OutcomeUnknown`] from a broker that cannot say (one without marks, one
    /// with another store, or one that forgot this producer:
    /// [`ConnectionEvent::ProducerForgotten`]).
    pub async fn commit(&self, transaction: &str) -> Result<()> {
        self.inner.transaction_connection(transaction)?;
        let frame = Frame::new(Command::Commit).with_header("transaction", transaction);
        let (tx, rx) = oneshot::channel();
        let seq = self
            .inner
            .submit(
                frame,
                PendingKind::Commit {
                    transaction: transaction.to_string(),
                },
                Some(tx),
                // COMMITs do not take room among unconfirmed SENDs: a transaction's own SENDs
                // are not in that table.
                None,
            )
            .await?;
        self.inner
            .await_tracked(seq, rx, None, "COMMIT")
            .await
            .inspect_err(|_| {
                self.inner.lock().txs.remove(transaction);
            })
    }

    /// ABORT. On a lost connection the broker has already rolled the transaction back.
    pub async fn abort(&self, transaction: &str) -> Result<()> {
        let tx = self.inner.lock().txs.remove(transaction);
        let Some(tx) = tx else {
            return Err(ClientError::Protocol(format!(
                "no open transaction {transaction:?}"
            )));
        };
        match self.inner.connection_of(tx.generation) {
            Some((conn, _)) => match conn.abort(transaction).await {
                Err(e) if conn.close_reason().is_some() => {
                    tracing::debug!(error = %e, "ABORT lost with the connection: rolled back");
                    Ok(())
                }
                other => other,
            },
            None => Ok(()),
        }
    }

    // ----- closing -----------------------------------------------------------------------

    /// Waits (up to `connect_timeout_ms`, across reconnects) until every SEND is confirmed,
    /// then DISCONNECTs and stops reconnecting. SENDs still unconfirmed then are reported as
    /// [`ClientError::OutcomeUnknown`]. Otherwise it returns `Ok`, even if the connection ends
    /// during the DISCONNECT itself: every SEND was confirmed, so nothing is in doubt.
    pub async fn disconnect(&self) -> Result<()> {
        let wait_ms = self.inner.opts.connect_timeout_ms;
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let _ = tokio::time::timeout_at(deadline, async {
            loop {
                // Registered before the check, so a settle in between is not missed.
                let drained = self.inner.drained.notified();
                if self.unconfirmed_sends() == 0 {
                    return;
                }
                drained.await;
            }
        })
        .await;
        let _order = self.inner.order.lock().await;
        self.inner.stop.send_replace(true);
        let previous = self
            .inner
            .link
            .send_replace(Link::Down(ClientError::Closed));
        let result = match previous {
            Link::Up { conn, .. } => conn.disconnect().await,
            _ => Ok(()),
        };
        let left: Vec<Pending> = {
            let mut st = self.inner.lock();
            std::mem::take(&mut st.pending).into_values().collect()
        };
        let unconfirmed = left.len();
        self.inner.lock().stats.sends_abandoned += unconfirmed as u64;
        for p in left {
            if let Some(w) = p.waiter {
                let _ = w.send(Err(ClientError::Closed));
            }
        }
        close_subscriptions(&self.inner);
        if unconfirmed > 0 {
            return Err(ClientError::OutcomeUnknown {
                what: format!("{unconfirmed} SENDs never confirmed before disconnect"),
            });
        }
        // Every SEND was confirmed, so nothing is in doubt when the connection ends during the
        // DISCONNECT itself: the broker died (found by the simulation: a master killed as a
        // producer disconnected), or closed it with an ERROR of its own (a heart-beat timeout).
        if let Err(e) = result {
            tracing::debug!(error = %e, "connection ended during DISCONNECT; nothing was unconfirmed");
        }
        Ok(())
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("client state poisoned")
    }

    fn emit(&self, event: ConnectionEvent) {
        match &event {
            ConnectionEvent::Connected { broker } => tracing::info!(broker, "connected"),
            ConnectionEvent::Interrupted { broker, reason } => {
                tracing::warn!(broker, reason = %reason, "connection lost; reconnecting")
            }
            ConnectionEvent::Resumed {
                broker,
                resent,
                confirmed,
            } => tracing::info!(broker, resent, confirmed, "session resumed"),
            ConnectionEvent::SendRefused {
                destination,
                reason,
            } => tracing::warn!(destination, reason = %reason, "SEND refused by the broker"),
            ConnectionEvent::ClusterUpdated { brokers } => {
                tracing::info!(brokers = ?brokers, "broker list updated by the cluster")
            }
            ConnectionEvent::ProducerForgotten {
                broker,
                mark,
                confirmed,
                resent,
                unknown,
            } => tracing::warn!(
                broker,
                mark,
                confirmed,
                resent,
                unknown,
                "the broker forgot this client's producer: the SENDs resent may be stored \
                 twice, and those failed as unknown may or may not be stored"
            ),
            ConnectionEvent::Failed { reason } => {
                tracing::error!(reason = %reason, "giving up reconnecting")
            }
        }
        let _ = self.events.send(event);
    }

    fn deadline(&self) -> Option<Instant> {
        u64::try_from(self.uri.options.timeout_ms)
            .ok()
            .map(|ms| Instant::now() + Duration::from_millis(ms))
    }

    fn timeout_error(&self, what: &'static str) -> ClientError {
        ClientError::Timeout {
            what,
            ms: self.uri.options.timeout_ms.max(0) as u64,
        }
    }

    fn current_generation(&self) -> Option<u64> {
        match &*self.link.borrow() {
            Link::Up { generation, .. } => Some(*generation),
            _ => None,
        }
    }

    /// The connection of `generation` if it is still the current one.
    fn connection_of(&self, generation: u64) -> Option<(Connection, String)> {
        if let Link::Up {
            generation: g,
            conn,
            broker,
        } = &*self.link.borrow()
        {
            if *g == generation && !conn.is_closed() {
                return Some((conn.clone(), broker.clone()));
            }
        }
        match &self.lock().restoring {
            Some((g, conn, broker)) if *g == generation && !conn.is_closed() => {
                Some((conn.clone(), broker.clone()))
            }
            _ => None,
        }
    }

    fn transaction_connection(&self, transaction: &str) -> Result<Connection> {
        let generation = match self.lock().txs.get(transaction) {
            Some(tx) => tx.generation,
            None => {
                return Err(ClientError::Protocol(format!(
                    "no open transaction {transaction:?} (BEGIN it first)"
                )))
            }
        };
        match self.connection_of(generation) {
            Some((conn, _)) => Ok(conn),
            None => {
                self.lock().txs.remove(transaction);
                Err(ClientError::TransactionRolledBack {
                    transaction: transaction.to_string(),
                    reason: "its connection was lost".into(),
                })
            }
        }
    }

    /// Waits for a connection of at least `min_generation`, up to `deadline`.
    async fn wait_up(
        &self,
        min_generation: u64,
        deadline: Option<Instant>,
    ) -> Result<(u64, Connection, String)> {
        let mut rx = self.link.subscribe();
        let wait = rx.wait_for(|l| match l {
            Link::Up { generation, .. } => *generation >= min_generation,
            Link::Down(_) => true,
            Link::Connecting => false,
        });
        let link = match deadline {
            None => wait.await.map(|l| l.clone()),
            Some(d) => match tokio::time::timeout_at(d, wait).await {
                Ok(r) => r.map(|l| l.clone()),
                Err(_) => return Err(self.timeout_error("a broker connection")),
            },
        };
        match link {
            Ok(Link::Up {
                generation,
                conn,
                broker,
            }) => Ok((generation, conn, broker)),
            Ok(Link::Down(e)) => Err(e),
            Ok(Link::Connecting) => unreachable!("wait_for returned a link it rejected"),
            Err(_) => Err(ClientError::Closed),
        }
    }

    /// Numbers `frame` with the next sequence, adds it to the pending table and writes it on
    /// the current connection if there is one (otherwise the next restore sends it).
    async fn submit(
        &self,
        frame: Frame,
        kind: PendingKind,
        waiter: Option<oneshot::Sender<Result<()>>>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<u64> {
        let _order = self.order.lock().await;
        let link = self.link.borrow().clone();
        if let Link::Down(e) = link {
            return Err(e);
        }
        let seq = {
            let mut st = self.lock();
            let seq = st.next_seq;
            st.next_seq += 1;
            let frame = frame
                .with_header("haven-producer", self.producer_id.as_str())
                .with_header("haven-seq", seq.to_string())
                .with_header("receipt", format!("{TRACKED_RECEIPT_PREFIX}{seq}"));
            st.pending.insert(
                seq,
                Pending {
                    frame,
                    kind,
                    written_on: None,
                    waiter,
                    _permit: permit,
                },
            );
            seq
        };
        if let Link::Up {
            generation, conn, ..
        } = link
        {
            self.write_pending(&conn, generation, seq).await;
        }
        Ok(seq)
    }

    /// Writes pending frame `seq` on `conn` (caller holds `order`). A write that fails is
    /// left for the restore on the next connection.
    async fn write_pending(&self, conn: &Connection, generation: u64, seq: u64) -> bool {
        // Encoded under the lock rather than cloning the frame (its headers) per SEND.
        let bytes = match self.lock().pending.get(&seq) {
            Some(p) => conn.encode(&p.frame),
            None => return true,
        };
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                // No connection could carry it: fail it rather than retry it forever.
                self.settle(seq, Err(e));
                return true;
            }
        };
        if conn.push(bytes).await.is_err() {
            return false;
        }
        if let Some(p) = self.lock().pending.get_mut(&seq) {
            p.written_on = Some(generation);
        }
        true
    }

    async fn await_tracked(
        &self,
        seq: u64,
        rx: oneshot::Receiver<Result<()>>,
        deadline: Option<Instant>,
        what: &'static str,
    ) -> Result<()> {
        let outcome = match deadline {
            None => rx.await,
            Some(d) => match tokio::time::timeout_at(d, rx).await {
                Ok(r) => r,
                Err(_) => {
                    // Withdraw it so that it is not sent again behind the application's back.
                    let _order = self.order.lock().await;
                    let withdrawn = {
                        let mut st = self.lock();
                        let withdrawn = st.pending.remove(&seq);
                        if withdrawn.is_some() {
                            st.stats.sends_abandoned += 1;
                        }
                        if st.pending.is_empty() {
                            self.drained.notify_waiters();
                        }
                        withdrawn
                    };
                    return match withdrawn {
                        Some(p) if p.written_on.is_some() => Err(ClientError::OutcomeUnknown {
                            what: format!("{what} with producer sequence {seq}"),
                        }),
                        Some(_) => Err(self.timeout_error(what)),
                        // Confirmed while we took the lock.
                        None => Ok(()),
                    };
                }
            },
        };
        outcome.unwrap_or(Err(ClientError::Closed))
    }

    /// Retires tracked frame `seq` with `outcome`.
    fn settle(&self, seq: u64, outcome: Result<()>) {
        let pending = {
            let mut st = self.lock();
            let pending = st.pending.remove(&seq);
            if let Some(Pending {
                kind: PendingKind::Send { .. },
                ..
            }) = &pending
            {
                match &outcome {
                    Ok(()) => st.stats.sends_confirmed += 1,
                    Err(ClientError::Server { .. }) => st.stats.sends_refused += 1,
                    Err(_) => st.stats.sends_abandoned += 1,
                }
            }
            if st.pending.is_empty() {
                self.drained.notify_waiters();
            }
            pending
        };
        let Some(p) = pending else { return };
        if let PendingKind::Commit { transaction } = &p.kind {
            let tx = self.lock().txs.remove(transaction);
            if let (Some(tx), Ok(())) = (tx, &outcome) {
                for (tracker, msg) in tx.acks {
                    tracker.record_ack(&msg);
                }
            }
        }
        match p.waiter {
            Some(w) => {
                let _ = w.send(outcome);
            }
            None => {
                if let (Err(reason), PendingKind::Send { destination }) = (outcome, p.kind) {
                    self.emit(ConnectionEvent::SendRefused {
                        destination,
                        reason,
                    });
                }
            }
        }
    }

    fn store_key(&self, msg: &Message) -> Key {
        let store = self
            .lock()
            .store_of(msg.generation)
            .unwrap_or_else(|| Arc::from("unknown"));
        (store, msg.message_id.clone())
    }
}

impl std::fmt::Debug for SubTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubTracker")
            .field("id", &self.id)
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}

impl SubTracker {
    fn sender(&self) -> Option<mpsc::Sender<Message>> {
        self.tx
            .lock()
            .expect("subscription sender poisoned")
            .clone()
    }

    /// Ends the application's stream once what was already delivered is read.
    fn close(&self) {
        self.tx.lock().expect("subscription sender poisoned").take();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SubFilter> {
        self.filter.lock().expect("subscription filter poisoned")
    }

    fn subscribe_frame(&self) -> Frame {
        let mut frame = Frame::new(Command::Subscribe)
            .with_header("destination", self.destination.as_str())
            .with_header("id", self.id.as_str())
            .with_header("ack", self.ack.as_str());
        for (k, v) in &self.headers {
            frame = frame.with_header(k.as_str(), v.as_str());
        }
        frame
    }

    fn subscription(self: &Arc<Self>, rx: mpsc::Receiver<Message>) -> Subscription {
        Subscription {
            id: self.id.clone(),
            destination: self.destination.clone(),
            rx,
            tracker: Some(self.clone()),
        }
    }

    /// The application acked `msg`: remember it (and, for cumulative `client` acks, every
    /// message delivered before it).
    fn record_ack(&self, msg: &Message) {
        let Some(client) = self.client.upgrade() else {
            return;
        };
        let key = client.store_key(msg);
        let mut f = self.lock();
        if self.ack == AckMode::Client {
            if let Some(pos) = f.unacked.iter().position(|k| *k == key) {
                let acked: Vec<Key> = f.unacked.drain(..=pos).collect();
                for k in acked {
                    f.acked.insert(k);
                }
            }
        }
        f.acked.insert(key);
    }

    /// Decides whether `msg` reaches the application. A redelivery of a message it already
    /// acked is acked again on the connection that delivered it and dropped.
    pub(crate) async fn admit(&self, msg: &Message) -> bool {
        let Some(client) = self.client.upgrade() else {
            return true;
        };
        if !self.is_duplicate(msg) {
            return true;
        }
        if self.ack != AckMode::Auto {
            if let Some((conn, _)) = client.connection_of(msg.generation) {
                let frame = ack_frame(Command::Ack, conn.version(), msg, None);
                let _ = conn.enqueue_frame(&frame).await;
            }
        }
        false
    }

    /// Whether `msg` is a redelivery of a message the application acked; if not, it is
    /// recorded as delivered.
    pub(crate) fn is_duplicate(&self, msg: &Message) -> bool {
        let Some(client) = self.client.upgrade() else {
            return false;
        };
        let key = client.store_key(msg);
        let duplicate = {
            let mut f = self.lock();
            if f.acked.contains(&key) {
                true
            } else {
                match self.ack {
                    // Delivered is acked: a redelivery of it is a duplicate.
                    AckMode::Auto => f.acked.insert(key),
                    AckMode::Client => {
                        f.unacked.push_back(key);
                        // Bounded like the window: the oldest unacked are forgotten.
                        if f.unacked.len() > client.opts.dedup_window_messages.max(1) {
                            f.unacked.pop_front();
                        }
                    }
                    AckMode::ClientIndividual => {}
                }
                false
            }
        };
        if duplicate {
            // Counted after the filter lock is released: `on_lost` takes the state lock and
            // then filter locks, so taking them the other way round here could deadlock.
            client.lock().stats.duplicates_dropped += 1;
            tracing::debug!(
                subscription = %self.id,
                message_id = %msg.message_id,
                "dropped a redelivery of a message the application already acked"
            );
        }
        duplicate
    }
}

/// Connects to the first broker that answers, passing over the list with back-off until
/// the attempt limit. `avoid` is tried last (the broker just lost).
async fn establish(
    inner: &Arc<Inner>,
    startup: bool,
    avoid: Option<&str>,
) -> Result<(Connection, String, u64)> {
    let options = &inner.uri.options;
    let limit = if startup {
        options.startup_max_reconnect_attempts
    } else {
        options.max_reconnect_attempts
    };
    let ((conn, generation), broker) = reconnect(
        options,
        limit,
        inner.random(),
        || inner.candidates(avoid),
        |broker| async move { inner.open(&broker).await },
        inner.stop.subscribe(),
    )
    .await?;
    Ok((conn, broker, generation))
}

impl Inner {
    fn random<T>(&self) -> T
    where
        rand::distributions::Standard: rand::distributions::Distribution<T>,
    {
        self.rng.lock().expect("rng").gen()
    }

    /// The order in which to try brokers: priority ones first under `priorityBackup`, the rest
    /// shuffled under `randomize`, `avoid` last.
    fn candidates(&self, avoid: Option<&str>) -> Vec<String> {
        let mut list = self.lock().brokers.clone();
        if self.uri.options.randomize {
            list.shuffle(&mut *self.rng.lock().expect("rng"));
        }
        if self.uri.options.priority_backup {
            let priority = self.priority_brokers();
            list.sort_by_key(|b| !priority.contains(b));
        }
        if let Some(avoid) = avoid {
            if list.len() > 1 {
                list.sort_by_key(|b| b == avoid);
            }
        }
        list
    }

    fn priority_brokers(&self) -> Vec<String> {
        if self.uri.options.priority_uris.is_empty() {
            self.uri.brokers.iter().take(1).cloned().collect()
        } else {
            self.uri.options.priority_uris.clone()
        }
    }

    /// Opens one connection with the session's CONNECT headers and a fresh generation.
    async fn open(&self, broker: &str) -> Result<(Connection, u64)> {
        let generation = {
            let mut st = self.lock();
            let g = st.next_generation;
            st.next_generation += 1;
            g
        };
        let mut opts = self.opts.clone();
        opts.headers
            .push(("haven-producer".into(), self.producer_id.clone()));
        // Orders this client's CONNECTs: one held up in the network must not take the
        // producer from a newer session when it finally arrives.
        opts.headers.push((
            "haven-session".into(),
            (self.session_base + generation).to_string(),
        ));
        if self.uri.options.update_uris_supported {
            opts.headers
                .push(("haven-cluster-updates".into(), "true".into()));
        }
        let hooks = Hooks {
            generation,
            receipt_sink: Some(self.receipts.clone()),
        };
        let conn = Connection::connect_hooked(broker, &opts, hooks).await?;
        if self.uri.options.update_uris_supported {
            // Announcements arrive as MESSAGE frames on a reserved subscription id.
            let _ = conn.register_channel(CLUSTER_SUBSCRIPTION, self.cluster.clone());
        }
        Ok((conn, generation))
    }

    /// Merges announced broker addresses into the list; true if it changed.
    fn merge_brokers(&self, announced: &str) -> bool {
        if !self.uri.options.update_uris_supported {
            return false;
        }
        let mut added = false;
        let mut st = self.lock();
        for part in announced
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            match crate::options::parse_address(part) {
                Ok(a) => {
                    let uri = format!("tcp://{}", a.authority);
                    if !st.brokers.contains(&uri) {
                        st.brokers.push(uri);
                        added = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(address = part, error = %e, "bad address in a cluster announcement")
                }
            }
        }
        added
    }
}

/// Restores the session on a new connection: confirms what the broker already stored,
/// settles transactions, re-subscribes and sends every unconfirmed SEND again, then makes the
/// connection current. Returns `(resent, confirmed)`.
async fn restore(
    inner: &Arc<Inner>,
    conn: &Connection,
    generation: u64,
    broker: &str,
) -> Result<(usize, usize)> {
    let _order = inner.order.lock().await;
    // Messages for the restored subscriptions arrive before the RECEIPTs this waits for; the
    // application must be able to ack them on this connection already.
    inner.lock().restoring = Some((generation, conn.clone(), broker.to_string()));
    let restored = restore_locked(inner, conn, generation, broker).await;
    inner.lock().restoring = None;
    restored
}

/// `restore` with the `order` lock held.
async fn restore_locked(
    inner: &Arc<Inner>,
    conn: &Connection,
    generation: u64,
    broker: &str,
) -> Result<(usize, usize)> {
    let store: Arc<str> = Arc::from(conn.connected_header("haven-store").unwrap_or(broker));
    let hwm: Option<u64> = conn
        .connected_header("haven-seq")
        .and_then(|v| v.parse().ok());
    let persistent_default = conn
        .connected_header("haven-persistent-default")
        .map(|v| v == "true");
    if let Some(list) = conn.connected_header("haven-cluster") {
        if inner.merge_brokers(list) {
            inner.emit(ConnectionEvent::ClusterUpdated {
                brokers: inner.lock().brokers.clone(),
            });
        }
    }
    let mut confirmed = Vec::new();
    let mut failed = Vec::new();
    let mut resend = Vec::new();
    // Frames failed as `OutcomeUnknown` because the store forgot this producer.
    let mut unknown = 0;
    let subs: Vec<Arc<SubTracker>>;
    let forgotten;
    {
        let mut st = inner.lock();
        // A store that confirmed persistent SENDs beyond its mark has forgotten us: its
        // duplicate filter no longer covers what is resent below. Warned once: from here on
        // the mark is what this store is known to hold.
        forgotten = match (hwm, st.confirmed_mut(&store)) {
            (Some(mark), Some(c)) if mark < *c => Some((mark, std::mem::replace(c, mark))),
            _ => None,
        };
        st.stores
            .push_back((generation, store.clone(), persistent_default));
        while st.stores.len() > GENERATIONS_REMEMBERED_MAX {
            st.stores.pop_front();
        }
        let resend_forgotten = inner.opts.resend_when_producer_forgotten;
        for (seq, p) in &st.pending {
            let stored = hwm.is_some_and(|h| *seq <= h);
            // Written before, to a store that no longer knows this producer: it may be there.
            let maybe_stored = forgotten.is_some() && p.written_on.is_some();
            match &p.kind {
                _ if stored => confirmed.push(*seq),
                PendingKind::Send { .. } if maybe_stored && !resend_forgotten => {
                    unknown += 1;
                    failed.push((
                        *seq,
                        ClientError::OutcomeUnknown {
                            what: format!(
                                "SEND with producer sequence {seq} (the broker forgot this \
                                 producer, so a resend could be stored twice)"
                            ),
                        },
                    ));
                }
                PendingKind::Send { .. } => resend.push(*seq),
                PendingKind::Commit { transaction } => {
                    let reason = match (p.written_on, hwm) {
                        (None, _) => ClientError::TransactionRolledBack {
                            transaction: transaction.clone(),
                            reason: "its connection was lost before COMMIT was sent".into(),
                        },
                        // A mark of 0 from a store that forgot us says nothing about it.
                        (Some(_), _) if maybe_stored => {
                            unknown += 1;
                            ClientError::OutcomeUnknown {
                                what: format!(
                                    "COMMIT of transaction {transaction:?} (the broker forgot \
                                     this producer)"
                                ),
                            }
                        }
                        // The mark speaks only for its own store: a COMMIT written to a
                        // broker with another store may have been applied there (found by
                        // the simulation: three standalone brokers, a link cut just after a
                        // COMMIT was applied).
                        (Some(g), Some(_))
                            if st.stores.iter().any(|(sg, s, _)| *sg == g && *s == store) =>
                        {
                            ClientError::TransactionRolledBack {
                                transaction: transaction.clone(),
                                reason: "the broker never applied the COMMIT".into(),
                            }
                        }
                        (Some(_), Some(_)) => ClientError::OutcomeUnknown {
                            what: format!(
                                "COMMIT of transaction {transaction:?} (sent to another store)"
                            ),
                        },
                        (Some(_), None) => ClientError::OutcomeUnknown {
                            what: format!("COMMIT of transaction {transaction:?}"),
                        },
                    };
                    failed.push((*seq, reason));
                }
            }
        }
        // Transactions of earlier connections were rolled back by their broker; they stay in
        // `txs` so that their next use reports that (`transaction_connection`), unless an
        // application abandons so many that remembering them would grow without bound.
        if st.txs.len() > DEAD_TRANSACTIONS_REMEMBERED_MAX {
            st.txs.clear();
        }
        subs = st.subs.values().cloned().collect();
    }
    let confirmed_count = confirmed.len();
    for seq in confirmed {
        inner.settle(seq, Ok(()));
    }
    for (seq, reason) in failed {
        inner.settle(seq, Err(reason));
    }
    let mut receipts = Vec::new();
    for sub in &subs {
        let Some(tx) = sub.sender() else { continue };
        let receipt = conn
            .subscribe_raw(&sub.id, sub.subscribe_frame(), tx)
            .await?;
        sub.lock().receipt = receipt.id().to_string();
        receipts.push(receipt);
    }
    for seq in &resend {
        if !inner.write_pending(conn, generation, *seq).await {
            return Err(conn.close_reason().unwrap_or(ClientError::Closed));
        }
    }
    inner.lock().stats.sends_resent += resend.len() as u64;
    if let Some((mark, confirmed)) = forgotten {
        inner.lock().stats.producer_forgotten += 1;
        inner.emit(ConnectionEvent::ProducerForgotten {
            broker: broker.to_string(),
            mark,
            confirmed,
            resent: resend.len(),
            unknown,
        });
    }
    let wait_ms = inner.opts.connect_timeout_ms;
    for receipt in receipts {
        match tokio::time::timeout(Duration::from_millis(wait_ms), receipt).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(ClientError::Timeout {
                    what: "RECEIPT of a restored SUBSCRIBE",
                    ms: wait_ms,
                })
            }
        }
    }
    inner.link.send_replace(Link::Up {
        generation,
        conn: conn.clone(),
        broker: broker.to_string(),
    });
    Ok((resend.len(), confirmed_count))
}

/// Retires tracked frames as their RECEIPTs arrive, from any connection.
async fn confirm(inner: Weak<Inner>, mut receipts: mpsc::UnboundedReceiver<String>) {
    while let Some(id) = receipts.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        match id
            .strip_prefix(TRACKED_RECEIPT_PREFIX)
            .and_then(|s| s.parse::<u64>().ok())
        {
            Some(seq) => {
                inner.lock().credit_receipt(seq);
                inner.settle(seq, Ok(()))
            }
            None => tracing::debug!(receipt_id = %id, "RECEIPT nobody waits for"),
        }
    }
}

/// Reacts to the end of a connection that closed with `reason`: a broker ERROR that names a
/// tracked frame or a subscription fails just that (so it is not sent again forever).
fn on_lost(inner: &Inner, reason: &ClientError) {
    let ClientError::Server {
        receipt_id: Some(receipt_id),
        ..
    } = reason
    else {
        return;
    };
    if let Some(seq) = receipt_id
        .strip_prefix(TRACKED_RECEIPT_PREFIX)
        .and_then(|s| s.parse::<u64>().ok())
    {
        inner.settle(seq, Err(reason.clone()));
        return;
    }
    let refused: Option<String> = inner
        .lock()
        .subs
        .values()
        .find(|s| s.lock().receipt == *receipt_id)
        .map(|s| s.id.clone());
    if let Some(id) = refused {
        tracing::warn!(subscription = %id, reason = %reason, "broker refused a SUBSCRIBE; not restored");
        inner.lock().subs.remove(&id);
    }
}

/// Why the supervisor leaves the current connection.
enum Leave {
    Lost(ClientError),
    Stop,
    /// Move to this broker (priority broker back, or a rebalance).
    Switch(Connection, String, u64),
    Rebalance,
}

async fn supervise(
    inner: Arc<Inner>,
    mut conn: Connection,
    mut broker: String,
    mut generation: u64,
    mut cluster: mpsc::Receiver<Message>,
) {
    let mut stop = inner.stop.subscribe();
    let mut spare: Option<Spare> = None;
    loop {
        if inner.uri.options.backup && spare.as_ref().is_none_or(Spare::is_dead) {
            if let Some(old) = spare.take() {
                old.discard();
            }
            spare = Some(Spare::open(inner.clone(), broker.clone()));
        }
        let on_priority =
            !inner.uri.options.priority_backup || inner.priority_brokers().contains(&broker);
        // `biased` (here and in every select! of the client and the broker): branch order is
        // fixed rather than random, so a simulated run replays exactly. Stop comes first.
        let leave = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => Leave::Stop,
            reason = conn.closed() => Leave::Lost(reason),
            Some(msg) = cluster.recv() => {
                let changed = msg.header("haven-cluster").is_some_and(|l| inner.merge_brokers(l));
                if changed {
                    inner.emit(ConnectionEvent::ClusterUpdated { brokers: inner.lock().brokers.clone() });
                }
                if msg.header("haven-rebalance") == Some("true") { Leave::Rebalance } else { continue }
            }
            found = try_priority(&inner), if !on_priority => match found {
                Some((c, b, g)) => Leave::Switch(c, b, g),
                None => continue,
            },
        };
        let next = match leave {
            Leave::Stop => {
                if let Some(s) = spare {
                    s.discard();
                }
                return;
            }
            Leave::Lost(reason) => {
                on_lost(&inner, &reason);
                if *stop.borrow() {
                    return;
                }
                inner.link.send_replace(Link::Connecting);
                inner.emit(ConnectionEvent::Interrupted {
                    broker: broker.clone(),
                    reason: reason.clone(),
                });
                if !inner.uri.failover {
                    inner.link.send_replace(Link::Down(reason.clone()));
                    inner.emit(ConnectionEvent::Failed { reason });
                    fail_all(&inner);
                    return;
                }
                match spare.take().and_then(|s| s.take_ready(generation)) {
                    Some(ready) => Ok(ready),
                    None => establish(&inner, false, Some(&broker)).await,
                }
            }
            Leave::Switch(c, b, g) => {
                tracing::info!(from = %broker, to = %b, "moving back to a priority broker");
                leave_gracefully(&inner, &conn).await;
                Ok((c, b, g))
            }
            Leave::Rebalance => {
                let target = inner
                    .lock()
                    .brokers
                    .choose(&mut *inner.rng.lock().expect("rng"))
                    .cloned();
                match target {
                    Some(t) if t != broker => match inner.open(&t).await {
                        Ok((c, g)) => {
                            tracing::info!(from = %broker, to = %t, "rebalancing at the cluster's request");
                            leave_gracefully(&inner, &conn).await;
                            Ok((c, t, g))
                        }
                        Err(e) => {
                            tracing::info!(broker = %t, error = %e, "rebalance target unreachable; staying");
                            continue;
                        }
                    },
                    _ => continue,
                }
            }
        };
        match next {
            Ok((c, b, g)) => match restore(&inner, &c, g, &b).await {
                Ok((resent, confirmed)) => {
                    conn = c;
                    broker = b;
                    generation = g;
                    inner.lock().stats.reconnects += 1;
                    inner.emit(ConnectionEvent::Resumed {
                        broker: broker.clone(),
                        resent,
                        confirmed,
                    });
                }
                Err(e) => {
                    // The new connection failed during the restore: treat it as lost and go
                    // round again (its close wakes the select at once).
                    tracing::debug!(broker = %b, error = %e, "restore failed");
                    c.abandon(e);
                    conn = c;
                    broker = b;
                }
            },
            Err(e) => {
                if *stop.borrow() {
                    return;
                }
                inner.link.send_replace(Link::Down(e.clone()));
                inner.emit(ConnectionEvent::Failed { reason: e });
                fail_all(&inner);
                return;
            }
        }
    }
}

type Opened = (Connection, String, u64);

/// The warm spare connection of `backup=true`, opened by its own task so that a slow or dead
/// broker never delays the supervisor's reaction to a loss.
struct Spare {
    slot: Arc<Mutex<Option<Opened>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Spare {
    fn open(inner: Arc<Inner>, current: String) -> Spare {
        let slot = Arc::new(Mutex::new(None));
        let filled = slot.clone();
        let task = tokio::spawn(async move {
            let opened = open_spare(&inner, &current).await;
            *filled.lock().expect("spare slot poisoned") = opened;
        });
        Spare { slot, task }
    }

    /// Finished without a connection, or its connection closed since: open another.
    fn is_dead(&self) -> bool {
        self.task.is_finished()
            && self
                .slot
                .lock()
                .expect("spare slot poisoned")
                .as_ref()
                .is_none_or(|(c, _, _)| c.is_closed())
    }

    /// The spare, if it is open and newer than the connection just lost (an older one would
    /// break the rule that generations only grow).
    fn take_ready(self, lost_generation: u64) -> Option<Opened> {
        self.task.abort();
        let opened = self.slot.lock().expect("spare slot poisoned").take()?;
        if opened.0.is_closed() || opened.2 <= lost_generation {
            opened.0.abandon(ClientError::Closed);
            return None;
        }
        Some(opened)
    }

    fn discard(self) {
        self.task.abort();
        if let Some((c, _, _)) = self.slot.lock().expect("spare slot poisoned").take() {
            c.abandon(ClientError::Closed);
        }
    }
}

/// Stops using `conn` in an orderly way: the receipted DISCONNECT makes the broker process
/// (and confirm) everything sent before it.
async fn leave_gracefully(inner: &Inner, conn: &Connection) {
    inner.link.send_replace(Link::Connecting);
    if let Err(e) = conn.disconnect().await {
        tracing::debug!(error = %e, "DISCONNECT from the previous broker failed");
    }
}

/// Tries the priority brokers once, after `PRIORITY_RETRY_MS`.
async fn try_priority(inner: &Arc<Inner>) -> Option<(Connection, String, u64)> {
    tokio::time::sleep(Duration::from_millis(PRIORITY_RETRY_MS)).await;
    for b in inner.priority_brokers() {
        if let Ok((c, g)) = inner.open(&b).await {
            return Some((c, b, g));
        }
    }
    None
}

/// Opens the warm spare connection to a broker other than `current`.
async fn open_spare(inner: &Arc<Inner>, current: &str) -> Option<(Connection, String, u64)> {
    for b in inner.candidates(None) {
        if b == current {
            continue;
        }
        match inner.open(&b).await {
            Ok((c, g)) => {
                tracing::debug!(broker = %b, "backup connection ready");
                return Some((c, b, g));
            }
            Err(e) => tracing::debug!(broker = %b, error = %e, "backup connection failed"),
        }
    }
    None
}

/// The client gave up: every waiter learns it.
fn fail_all(inner: &Inner) {
    let reason = match &*inner.link.borrow() {
        Link::Down(e) => e.clone(),
        _ => ClientError::Closed,
    };
    let seqs: Vec<u64> = inner.lock().pending.keys().copied().collect();
    for seq in seqs {
        let outcome = match inner.lock().pending.get(&seq).map(|p| p.written_on) {
            Some(Some(_)) => ClientError::OutcomeUnknown {
                what: format!("frame with producer sequence {seq}: {reason}"),
            },
            _ => reason.clone(),
        };
        inner.settle(seq, Err(outcome));
    }
    close_subscriptions(inner);
}

/// The client stopped: every subscription stream ends.
fn close_subscriptions(inner: &Inner) {
    let subs = std::mem::take(&mut inner.lock().subs);
    for sub in subs.into_values() {
        sub.close();
    }
}
