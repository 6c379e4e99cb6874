//! One bridge: this broker's connection to one remote broker (or to whichever broker of an HA
//! group serves), carrying messages toward the consumers the other side announces.
//!
//! A bridge has two ends (`link.rs`): a STOMP connection to the remote broker made with
//! `haven-client`, and a connection to this broker in process (`local.rs`). Each
//! *direction* — local → remote always, remote → local too with `duplex` — reads the
//! consumer advisories of the side it forwards to (its *sink*),
//! keeps one subscription on the other side (its *source*) for each demand it follows
//! (`demand.rs`), and forwards what those subscriptions receive:
//!
//! 1. the source delivers a message;
//! 2. the bridge SENDs it to the sink, naming it by its origin (`haven-net-origin`: the
//!    source's store and message id) and its broker path. The messages that arrived together
//!    go out as one *batch* whose last SEND asks for a RECEIPT: a Haven broker answers a
//!    RECEIPT only once everything the connection sent before it is on disk;
//! 3. only on that RECEIPT does the bridge acknowledge the batch on the source (cumulatively,
//!    per subscription, up to the newest message whose batch and every earlier one are
//!    confirmed), and the source removes those messages.
//!
//! A session ends at the first error on either connection. Nothing is kept across sessions:
//! the source still holds every message it was not told to remove and delivers it again to the
//! next session, which sends it again; the sink recognises the origin and answers without
//! storing it twice. So a bridge that breaks anywhere loses nothing and doubles nothing.
//!
//! The session's loop never waits for a RECEIPT itself: subscribing, unsubscribing and
//! receipts run in tasks that report back, so a connection whose reader waits for the loop
//! cannot deadlock it.

use super::filter::{self, Filter};
use super::headers::*;
use super::link::{Delivered, ForwardScratch, Link};
use super::local::LocalConn;
use super::{demand, path};
use crate::config::NetworkConnector;
use crate::connection::Shared;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use haven_client::{AckMode, ClientError, ConnectOptions, Connection};
use haven_engine::Destination;
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Heart-beats on both connections, so a remote broker that stops answering (SIGSTOP, a
/// black-holed network) ends the session instead of stalling it.
const HEARTBEAT_MS: u64 = 2_000;

/// A session that lasted this long resets the reconnect back-off.
const HEALTHY_SESSION_MS: u64 = 10_000;

/// Events from subscription tasks queued for the loop before they wait.
const EVENTS_QUEUED_MAX: usize = 1024;

/// Messages sent as one batch (one RECEIPT) at most.
const BATCH_MESSAGES_MAX: usize = 1024;

/// Batches sent and not yet confirmed, at most. While this many wait for their RECEIPT, what
/// arrives is staged and goes out as one batch when the next RECEIPT comes: under light load a
/// message goes out at once; under heavy load batches grow with the sink's sync time, so the
/// sink syncs, the source removes, and both sides wake once per batch rather than per few
/// messages (measured: batches of about 50 messages without this limit). Four rather than two:
/// with two, the sink sat idle while the source turned a confirmed batch's acknowledgement into
/// new deliveries (scenario (c) A → B: 79k–81k msg/s with two, 84k–90k with four; a backlog
/// drained at 95k msg/s against 110k).
const BATCHES_IN_FLIGHT_MAX: usize = 4;

/// How often a bridge logs its counters, when they changed.
const REPORT_INTERVAL_MS: u64 = 10_000;

/// What one bridge is to do.
pub(crate) struct Spec {
    /// `connector → remote` for log lines.
    pub label: String,
    /// `tcp://host:port` of the remote broker, or of every broker of its HA group.
    pub remote: Vec<String>,
    /// This broker.
    pub here: Arc<Shared>,
    pub cfg: NetworkConnector,
}

/// A bridge's counters across its sessions, for its log lines.
#[derive(Debug, Default)]
struct Stats {
    /// Messages sent to the remote broker and acknowledged here.
    forwarded_out: AtomicU64,
    /// Messages brought from the remote broker (duplex) and acknowledged there.
    forwarded_in: AtomicU64,
    /// Topic copies not forwarded (the remote broker has had them, or the hop limit).
    skipped: AtomicU64,
    /// Batches sent (each one RECEIPT): forwarded / batches is the mean batch size.
    batches: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("{side}: {source}")]
    Client {
        side: &'static str,
        source: ClientError,
    },
    #[error("no broker of {0:?} accepted the connection: {1}")]
    Unreachable(Vec<String>, String),
    #[error("the remote broker is also named '{0}': every broker in a network needs its own name")]
    SameName(String),
    #[error("the remote broker's name '{0}' is not a valid broker name")]
    BadName(String),
}

/// Runs the bridge until the task is aborted (the broker stopping), reconnecting after every
/// failure with back-off.
pub(crate) async fn run(spec: Spec) {
    let stats = Stats::default();
    let mut delay_ms = spec.cfg.reconnect_delay_ms;
    loop {
        let started = Instant::now();
        let err = session(&spec, &stats).await;
        if started.elapsed() >= Duration::from_millis(HEALTHY_SESSION_MS) {
            delay_ms = spec.cfg.reconnect_delay_ms;
        }
        tracing::warn!(bridge = %spec.label, retry_ms = delay_ms, "bridge down: {err}");
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        delay_ms = (delay_ms * 2).min(spec.cfg.reconnect_delay_max_ms);
    }
}

/// One broker's end of a session.
struct Side {
    link: Link,
    /// Broker name (paths and demand).
    name: String,
    /// Store id (origins); the name for a broker that does not announce one.
    store: String,
    /// For errors.
    role: &'static str,
}

async fn session(spec: &Spec, stats: &Stats) -> SessionError {
    match session_inner(spec, stats).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn session_inner(
    spec: &Spec,
    stats: &Stats,
) -> Result<std::convert::Infallible, SessionError> {
    let cfg = &spec.cfg;
    let mut remote_opts = ConnectOptions {
        login: cfg.login.clone(),
        passcode: cfg.passcode.clone(),
        heartbeat_ms: (HEARTBEAT_MS, HEARTBEAT_MS),
        ..ConnectOptions::default()
    };
    // Room for a whole prefetch window, so a reader never waits for the loop (see above).
    remote_opts.subscription_buffer_messages_max = cfg.prefetch_size as usize + 64;
    let (remote_conn, remote_addr) = connect_any(&spec.remote, remote_opts).await?;
    let remote_name = remote_conn
        .connected_header(BROKER_HEADER)
        .unwrap_or("")
        .to_string();
    if !path::valid_name(&remote_name) {
        return Err(SessionError::BadName(remote_name));
    }
    let local_conn = LocalConn::connect(spec.here.clone())
        .await
        .map_err(|source| SessionError::Client {
            side: "this broker",
            source,
        })?;
    if remote_name == local_conn.broker_name() {
        return Err(SessionError::SameName(remote_name));
    }
    let local = Arc::new(Side {
        store: local_conn.store_id().to_string(),
        name: local_conn.broker_name().to_string(),
        link: Link::Local(local_conn),
        role: "this broker",
    });
    let remote = Arc::new(Side {
        store: remote_conn
            .connected_header("haven-store")
            .unwrap_or(&remote_name)
            .to_string(),
        link: Link::Remote(remote_conn),
        name: remote_name.clone(),
        role: "remote broker",
    });
    tracing::info!(
        bridge = %spec.label,
        remote = %remote_name,
        addr = %remote_addr,
        duplex = cfg.duplex,
        "bridge up"
    );
    let filter = Filter::new(
        &cfg.statically_included_destinations,
        &cfg.dynamically_included_destinations,
        &cfg.excluded_destinations,
    );
    let out = Direction::new(spec, &filter, local.clone(), remote.clone(), stats, true);
    let result = if cfg.duplex {
        let inbound = Direction::new(spec, &filter, remote.clone(), local.clone(), stats, false);
        tokio::select! {
            r = out.run() => r,
            r = inbound.run() => r,
        }
    } else {
        out.run().await
    };
    // Whatever was not acknowledged is delivered again to the next session.
    local.link.close_now();
    remote.link.close_now();
    result
}

/// The first broker of `addrs` that accepts a STOMP connection (a standby broker of an HA
/// group has no listener open, or refuses).
async fn connect_any(
    addrs: &[String],
    opts: ConnectOptions,
) -> Result<(Connection, String), SessionError> {
    let mut last = String::new();
    for addr in addrs {
        match Connection::connect(addr, opts.clone()).await {
            Ok(c) => return Ok((c, addr.clone())),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(SessionError::Unreachable(addrs.to_vec(), last))
}

/// What subscription tasks tell a direction's loop.
enum Event {
    /// The SUBSCRIBE was receipted: messages may come, and UNSUBSCRIBE may be sent.
    Opened(String),
    /// A message of the subscription named first (shared: one allocation per subscription).
    Message(Arc<str>, Delivered),
    Failed(SessionError),
}

#[derive(Debug, PartialEq, Eq)]
enum SubState {
    Opening,
    Open,
    /// No longer wanted: its messages are left unacknowledged (the source delivers them
    /// elsewhere once it is gone) and it is unsubscribed when nothing of it is in flight.
    Closing,
}

struct DemandSub {
    destination: String,
    demand_path: Vec<String>,
    /// Statically included: kept for the whole session.
    fixed: bool,
    state: SubState,
    /// Delivered and handled (forwarded, or skipped), not yet acknowledged, in delivery
    /// order, each with the batch whose RECEIPT it waits for (0: none) and whether it was
    /// sent (not skipped).
    pending: VecDeque<(Delivered, u64, bool)>,
    _task: Task,
}

/// Aborts its task when dropped, so a session's tasks end with it.
struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Confirming = Pin<Box<dyn Future<Output = (u64, Result<(), ClientError>)> + Send>>;

/// One message read from a subscription and what to do with it.
struct Staged {
    sub_id: Arc<str>,
    message: Delivered,
    /// Where to send it on the sink; None: acknowledged without sending.
    send: Option<Forward>,
}

/// A staged message's SEND to the sink, encoded only as the batch goes out.
struct Forward {
    /// Shared by consecutive messages of one destination (`Direction::destination_of`).
    destination: Arc<str>,
    /// Its broker path on (`haven-net-path`); shared by the messages that had none
    /// (`Direction::routes_from_here`).
    path: Arc<[String]>,
}

/// Messages from `source` to consumers on `sink`.
struct Direction<'a> {
    spec: &'a Spec,
    filter: &'a Filter,
    source: Arc<Side>,
    sink: Arc<Side>,
    stats: &'a Stats,
    /// True for local → remote.
    outbound: bool,
    /// Per destination: the demand entries of the sink's latest advisory.
    demand: BTreeMap<String, Vec<Vec<String>>>,
    subs: HashMap<String, DemandSub>,
    next_sub: u64,
    events_tx: mpsc::Sender<Event>,
    events_rx: mpsc::Receiver<Event>,
    /// Batch numbers: the last one sent, and those sent but not yet receipted.
    last_batch: u64,
    unconfirmed: BTreeSet<u64>,
    receipts: FuturesUnordered<Confirming>,
    /// Handled and waiting to go out as the next batch.
    staged: Vec<Staged>,
    scratch: ForwardScratch,
    /// The last local destination named and its STOMP name: a subscription's messages mostly
    /// share one, and naming it per message was 6% of the bridges' thread.
    last_destination: Option<(Destination, Arc<str>)>,
    /// Where a message with no path goes (as a queue message, as a topic message), worked
    /// out once: most messages a bridge takes were sent to this broker by its clients.
    routes_from_here: [OnceCell<Option<Arc<[String]>>>; 2],
}

impl<'a> Direction<'a> {
    fn new(
        spec: &'a Spec,
        filter: &'a Filter,
        source: Arc<Side>,
        sink: Arc<Side>,
        stats: &'a Stats,
        outbound: bool,
    ) -> Direction<'a> {
        let (events_tx, events_rx) = mpsc::channel(EVENTS_QUEUED_MAX);
        Direction {
            spec,
            filter,
            source,
            sink,
            stats,
            outbound,
            demand: BTreeMap::new(),
            subs: HashMap::new(),
            next_sub: 0,
            events_tx,
            events_rx,
            last_batch: 0,
            unconfirmed: BTreeSet::new(),
            receipts: FuturesUnordered::new(),
            staged: Vec::new(),
            scratch: ForwardScratch::default(),
            last_destination: None,
            routes_from_here: [OnceCell::new(), OnceCell::new()],
        }
    }

    fn err(side: &Side, source: ClientError) -> SessionError {
        SessionError::Client {
            side: side.role,
            source,
        }
    }

    async fn run(mut self) -> Result<std::convert::Infallible, SessionError> {
        let sink = self.sink.clone();
        // Queues, topics and temporary queues: the current state first, then every change.
        let mut advisories = sink
            .link
            .subscribe(CONSUMER_ADVISORIES, AckMode::Auto, &[])
            .await
            .map_err(|e| Self::err(&sink, e))?;
        for destination in self.filter.statics().to_vec() {
            self.open(&destination, vec![self.sink.name.clone()], true);
        }
        let mut report = tokio::time::interval(Duration::from_millis(REPORT_INTERVAL_MS));
        let mut reported = (u64::MAX, 0usize);
        loop {
            tokio::select! {
                m = advisories.next() => match m {
                    Some(m) => self.on_advisory(&m),
                    None => return Err(Self::err(&sink, sink.link.closed().await)),
                },
                // A full batch waits for a RECEIPT before more is taken (the subscription tasks
                // then wait on the event queue, and the source on its prefetch window).
                Some(event) = self.events_rx.recv(), if self.staged.len() < BATCH_MESSAGES_MAX => {
                    // Everything that has arrived goes out as one batch.
                    let mut next = Some(event);
                    while let Some(event) = next.take() {
                        match event {
                            Event::Failed(e) => return Err(e),
                            Event::Opened(id) => self.on_opened(&id),
                            Event::Message(id, m) => {
                                if let Some(s) = self.stage(id, m) {
                                    self.staged.push(s);
                                }
                            }
                        }
                        if self.staged.len() < BATCH_MESSAGES_MAX {
                            next = self.events_rx.try_recv().ok();
                        }
                    }
                    self.flush().await?;
                }
                Some((batch, receipt)) = self.receipts.next(), if !self.receipts.is_empty() => {
                    receipt.map_err(|e| Self::err(&self.sink, e))?;
                    self.on_confirmed(batch).await?;
                    self.flush().await?;
                }
                _ = report.tick() => {
                    let now = (self.forwarded().load(Ordering::Relaxed), self.subs.len());
                    if now != reported {
                        reported = now;
                        tracing::info!(
                            bridge = %self.spec.label,
                            from = %self.source.name,
                            to = %self.sink.name,
                            forwarded = now.0,
                            skipped = self.stats.skipped.load(Ordering::Relaxed),
                            batches = self.stats.batches.load(Ordering::Relaxed),
                            subscriptions = now.1,
                            demand = self.demand.len(),
                            "bridge"
                        );
                    }
                }
            }
        }
    }

    fn forwarded(&self) -> &AtomicU64 {
        if self.outbound {
            &self.stats.forwarded_out
        } else {
            &self.stats.forwarded_in
        }
    }

    fn on_advisory(&mut self, m: &Delivered) {
        let (Some(destination), Some(entries)) = (
            m.header(ADVISORY_FOR_HEADER),
            m.header(ADVISORY_DEMAND_HEADER).and_then(demand::parse),
        ) else {
            tracing::warn!(
                bridge = %self.spec.label,
                advisory_for = ?m.header(ADVISORY_FOR_HEADER),
                demand = ?m.header(ADVISORY_DEMAND_HEADER),
                "unreadable consumer advisory ignored"
            );
            return;
        };
        let destination = destination.to_string();
        if entries.is_empty() {
            self.demand.remove(&destination);
        } else {
            self.demand.insert(destination.clone(), entries);
        }
        self.reconcile(&destination);
    }

    /// Opens and closes subscriptions on the source so they match the sink's demand.
    fn reconcile(&mut self, destination: &str) {
        let cfg = &self.spec.cfg;
        let entries = self.demand.get(destination).cloned().unwrap_or_default();
        let follows = if destination.starts_with(filter::TEMP_QUEUE_PREFIX) {
            // Replies to a temporary queue of the sink's (request/reply across the network).
            cfg.bridge_temp_destinations
        } else {
            self.filter.follows_demand(destination)
                // A wildcard queue consumer would take excluded queues' messages too.
                && !(destination.starts_with("/queue/")
                    && haven_engine::is_wildcard(destination)
                    && !cfg.excluded_destinations.is_empty())
                && filter::split(destination).is_some()
        };
        let mut want = if follows {
            demand::wanted(
                &entries,
                &self.source.name,
                &self.sink.name,
                cfg.network_ttl,
                cfg.conduit_subscriptions,
            )
        } else {
            Vec::new()
        };
        let mut extra = Vec::new();
        let mut ids: Vec<&String> = self
            .subs
            .iter()
            .filter(|(_, s)| {
                s.destination == destination && !s.fixed && s.state != SubState::Closing
            })
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        for id in ids {
            let path = &self.subs[id].demand_path;
            match want.iter().position(|w| w == path) {
                Some(i) => {
                    want.swap_remove(i);
                }
                None => extra.push(id.clone()),
            }
        }
        for id in extra {
            self.close(&id);
        }
        for demand_path in want {
            self.open(destination, demand_path, false);
        }
    }

    fn open(&mut self, destination: &str, demand_path: Vec<String>, fixed: bool) {
        self.next_sub += 1;
        let id = format!("net-{}", self.next_sub);
        let cfg = &self.spec.cfg;
        let penalty = if cfg.decrease_network_consumer_priority {
            demand::priority_penalty(&demand_path)
        } else {
            0
        };
        let headers: Vec<(String, String)> = vec![
            ("id".into(), id.clone()),
            (
                "activemq.prefetchSize".into(),
                cfg.prefetch_size.to_string(),
            ),
            (DEMAND_HEADER.into(), path::format(&demand_path)),
            (PENALTY_HEADER.into(), penalty.to_string()),
        ];
        let source = self.source.clone();
        let events = self.events_tx.clone();
        let dest = destination.to_string();
        let sub_id: Arc<str> = Arc::from(id.as_str());
        let task = tokio::spawn(async move {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut sub = match source.link.subscribe(&dest, AckMode::Client, &h).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = events.send(Event::Failed(Self::err(&source, e))).await;
                    return;
                }
            };
            if events
                .send(Event::Opened(sub_id.to_string()))
                .await
                .is_err()
            {
                return;
            }
            while let Some(m) = sub.next().await {
                if events
                    .send(Event::Message(sub_id.clone(), m))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let e = source.link.closed().await;
            let _ = events.send(Event::Failed(Self::err(&source, e))).await;
        });
        tracing::debug!(bridge = %self.spec.label, %destination, demand = %path::format(&demand_path), "demand subscription");
        self.subs.insert(
            id,
            DemandSub {
                destination: destination.to_string(),
                demand_path,
                fixed,
                state: SubState::Opening,
                pending: VecDeque::new(),
                _task: Task(task),
            },
        );
    }

    fn close(&mut self, id: &str) {
        let sub = self.subs.get_mut(id).expect("closing a known subscription");
        let opened = sub.state == SubState::Open;
        sub.state = SubState::Closing;
        // Staged messages are sent and acknowledged first; the last acknowledgement then
        // unsubscribes it (`acknowledge`).
        if opened && sub.pending.is_empty() && !self.staged.iter().any(|s| &*s.sub_id == id) {
            self.unsubscribe(id);
        }
    }

    /// Sends UNSUBSCRIBE; acknowledgements sent before it go first on the connection, so the
    /// source redelivers only what was never forwarded.
    fn unsubscribe(&mut self, id: &str) {
        let sub = self
            .subs
            .remove(id)
            .expect("unsubscribing a known subscription");
        assert!(sub.pending.is_empty(), "unsubscribed with messages pending");
        let source = self.source.clone();
        let events = self.events_tx.clone();
        let id = id.to_string();
        // The subscription's task ends with `sub`; the UNSUBSCRIBE runs on its own.
        tokio::spawn(async move {
            if let Err(e) = source.link.unsubscribe_id(&id).await {
                let _ = events.send(Event::Failed(Self::err(&source, e))).await;
            }
        });
    }

    fn on_opened(&mut self, id: &str) {
        if let Some(sub) = self.subs.get_mut(id) {
            match sub.state {
                SubState::Opening => sub.state = SubState::Open,
                SubState::Closing => self.unsubscribe(id),
                SubState::Open => unreachable!("opened twice"),
            }
        }
    }

    /// What to do with a delivered message; None when its subscription is going away (it is
    /// left unacknowledged, and the source delivers it elsewhere once unsubscribed).
    fn stage(&mut self, sub_id: Arc<str>, m: Delivered) -> Option<Staged> {
        let sub = self.subs.get(&*sub_id)?;
        if sub.state == SubState::Closing {
            return None;
        }
        let destination = self.destination_of(&m);
        let topic = destination.starts_with("/topic/");
        let path = if topic && self.filter.is_excluded(&destination) {
            None
        } else {
            match m.header(PATH_HEADER).and_then(path::parse) {
                Some(msg_path) if !msg_path.is_empty() => self.route(&msg_path, topic),
                _ => self.routes_from_here[usize::from(topic)]
                    .get_or_init(|| self.route(&[], topic))
                    .clone(),
            }
        };
        let send = path.map(|path| Forward { destination, path });
        Some(Staged {
            sub_id,
            message: m,
            send,
        })
    }

    /// `path::route` from this broker to the sink: the path a message goes on with, or None
    /// when it is not sent.
    fn route(&self, msg_path: &[String], topic: bool) -> Option<Arc<[String]>> {
        match path::route(
            msg_path,
            &self.source.name,
            &self.sink.name,
            topic,
            self.spec.cfg.network_ttl,
        ) {
            path::Route::Skip => None,
            path::Route::Forward(path) => Some(path.into()),
        }
    }

    /// The destination `m` was delivered from, as STOMP names it.
    fn destination_of(&mut self, m: &Delivered) -> Arc<str> {
        let Some(d) = m.local_destination() else {
            return Arc::from(&*m.destination());
        };
        if let Some((last, name)) = &self.last_destination {
            if last == d {
                return name.clone();
            }
        }
        let name: Arc<str> = Arc::from(d.to_string());
        self.last_destination = Some((d.clone(), name.clone()));
        name
    }

    /// Sends the staged messages as a batch, unless `BATCHES_IN_FLIGHT_MAX` batches wait for
    /// their RECEIPT already: then they go when the next one comes.
    async fn flush(&mut self) -> Result<(), SessionError> {
        if self.unconfirmed.len() >= BATCHES_IN_FLIGHT_MAX {
            return Ok(());
        }
        let mut staged = std::mem::take(&mut self.staged);
        let result = self.send_batch(&mut staged).await;
        // Whatever was not sent (an error ends the session) is dropped with it.
        self.staged = staged;
        result
    }

    /// Sends the staged messages, the last SEND asking for the batch's RECEIPT.
    async fn send_batch(&mut self, staged: &mut Vec<Staged>) -> Result<(), SessionError> {
        if staged.is_empty() {
            return Ok(());
        }
        let sends = staged.iter().filter(|s| s.send.is_some()).count();
        let batch = if sends > 0 {
            self.last_batch += 1;
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            self.last_batch
        } else {
            // Only skipped messages: they are done once everything before them is.
            self.last_batch
        };
        if sends > 0 {
            let forwards: Vec<(&Delivered, &str, &[String])> = staged
                .iter()
                .filter_map(|s| {
                    let f = s.send.as_ref()?;
                    Some((&s.message, &*f.destination, &*f.path))
                })
                .collect();
            let receipt = self
                .sink
                .link
                .forward_batch(&forwards, &self.source.store, &mut self.scratch)
                .await
                .map_err(|e| Self::err(&self.sink, e))?;
            self.unconfirmed.insert(batch);
            self.receipts
                .push(Box::pin(async move { (batch, receipt.await) }));
        }
        for s in staged.drain(..) {
            let was_sent = s.send.is_some();
            if !was_sent {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            }
            let sub = self
                .subs
                .get_mut(&*s.sub_id)
                .expect("staged messages' subscriptions are kept until acknowledged");
            sub.pending.push_back((s.message, batch, was_sent));
        }
        if sends == 0 {
            // Nothing to wait for if every earlier batch is confirmed already.
            self.acknowledge().await?;
        }
        Ok(())
    }

    async fn on_confirmed(&mut self, batch: u64) -> Result<(), SessionError> {
        let was = self.unconfirmed.remove(&batch);
        assert!(was, "a RECEIPT for batch {batch} that was not waited for");
        self.acknowledge().await
    }

    /// Acknowledges, per subscription, everything up to the newest message whose batch and
    /// every earlier batch are confirmed; unsubscribes closing subscriptions left with
    /// nothing pending.
    async fn acknowledge(&mut self) -> Result<(), SessionError> {
        let confirmed = match self.unconfirmed.first() {
            Some(&oldest) => oldest - 1,
            None => self.last_batch,
        };
        let mut drained = Vec::new();
        let mut forwarded = 0u64;
        for (id, sub) in self.subs.iter_mut() {
            let mut last = None;
            while sub.pending.front().is_some_and(|(_, b, _)| *b <= confirmed) {
                let (m, _, sent) = sub.pending.pop_front().expect("checked");
                forwarded += u64::from(sent);
                last = Some(m);
            }
            if let Some(m) = last {
                // Cumulative: every earlier message of the subscription with it.
                self.source
                    .link
                    .ack(&m)
                    .await
                    .map_err(|e| Self::err(&self.source, e))?;
                if sub.state == SubState::Closing && sub.pending.is_empty() {
                    drained.push(id.clone());
                }
            }
        }
        self.forwarded().fetch_add(forwarded, Ordering::Relaxed);
        for id in drained {
            self.unsubscribe(&id);
        }
        Ok(())
    }
}
