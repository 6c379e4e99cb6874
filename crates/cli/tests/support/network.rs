//! Networks of brokers for tests against real processes: broker configs with `[[network]]`
//! connectors, named brokers on addresses chosen before any of them starts (a connector names
//! its remote broker's address, and bridges retry until it serves), and recorders that log
//! every delivery into a [`History`] so that a test can demand exactly once across brokers.
//!
//! Message bodies start with their id (`<id>` or `<id> <padding>`). Probes (`probe-...`) are
//! what a test sends until a consumer's demand has crossed the network: a queue's probes are
//! owed like any message (they must arrive, once), a topic's are only counted per source
//! broker (a topic copy sent before a bridge subscribed is rightly dropped).
//!
//! Include with `#[path = "support/network.rs"] mod network;`, beside `support/traffic.rs`
//! (as `mod traffic`).
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haven_client::{AckMode, Client, ConnectOptions, Subscription};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess, History, Proxy, SendOutcome};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Bound on a consumer's demand reaching a producer's broker (a probe arrives).
pub const DEMAND_WAIT_MS: u64 = 30_000;
/// A probe that has not arrived within this long is followed by another.
pub const PROBE_EVERY_MS: u64 = 500;
/// Bound on a consumer receiving everything it is owed once the producers stopped.
pub const DRAIN_WAIT_MS: u64 = 45_000;
/// A draining recorder still owed messages gives up when none came for this long. Its bound
/// is progress, not a total: a broker that paged a deep backlog out under the faults drains
/// it at the pace of this test build (about 3,000 messages a second in one such run),
/// and must not fail for that; one that stops delivering must.
pub const DRAIN_STALL_MS: u64 = 15_000;
/// The total bound on a draining recorder (its progress bound comes first in practice).
pub const DRAIN_TOTAL_MS_MAX: u64 = 240_000;
/// Once it has everything it is owed, a draining consumer listens this long more, so that a
/// duplicate still on its way is caught.
pub const QUIET_MS: u64 = 1_500;
/// Bound on a consumer receiving a given number of further messages (progress after a fault).
pub const PROGRESS_WAIT_MS: u64 = 30_000;
/// Connector back-off in tests: a quick first retry and a short cap, so a healed link is used
/// again soon (the defaults are 100 ms and 5 s).
pub const RECONNECT_DELAY_MS: u64 = 100;
pub const RECONNECT_DELAY_MAX_MS: u64 = 1_000;
/// Per-subscription window of the test consumers.
const CONSUMER_PREFETCH: &str = "64";
/// How often a recorder re-checks its mode while no message comes.
const RECORDER_POLL_MS: u64 = 100;

/// `tcp://ADDR`.
pub fn tcp(addr: SocketAddr) -> String {
    format!("tcp://{addr}")
}

/// `failover:(tcp://a,tcp://b)` as a connector names an HA group.
pub fn failover_group(addrs: &[SocketAddr]) -> String {
    let list: Vec<String> = addrs.iter().map(|a| tcp(*a)).collect();
    format!("failover:({})", list.join(","))
}

/// `n` distinct free addresses.
pub fn free_addrs<const N: usize>() -> [SocketAddr; N] {
    let mut out = [free_addr(); N];
    for i in 1..N {
        while out[..i].contains(&out[i]) {
            out[i] = free_addr();
        }
    }
    out
}

/// One `[[network]]` table; `extra` holds further `key = value` lines.
pub fn connector(uri: &str, network_ttl: u32, extra: &str) -> String {
    format!(
        "[[network]]\nuri = \"{uri}\"\nnetwork_ttl = {network_ttl}\n\
         reconnect_delay_ms = {RECONNECT_DELAY_MS}\n\
         reconnect_delay_max_ms = {RECONNECT_DELAY_MAX_MS}\n{extra}\n"
    )
}

/// A broker named `name` (unique in the network) with these connectors and `[ha]` lines.
pub fn broker_config(name: &str, ha: &str, connectors: &[String]) -> String {
    format!(
        "[broker]\nname = \"{name}\"\n\n{ha}\n{}",
        connectors.join("\n")
    )
}

/// Starts broker `name` on `addr` with its own data directory under `dir`.
pub fn start_broker(
    dir: &Path,
    name: &str,
    addr: SocketAddr,
    connectors: &[String],
) -> BrokerProcess {
    start_broker_with(dir, name, addr, "", connectors)
}

/// [`start_broker`] with more configuration (`toml`: whole sections, e.g. `[limits]`).
pub fn start_broker_with(
    dir: &Path,
    name: &str,
    addr: SocketAddr,
    toml: &str,
    connectors: &[String],
) -> BrokerProcess {
    let mut opts = BrokerOpts::new(env!("CARGO_BIN_EXE_haven"), dir.join(name), addr);
    opts.config_toml = Some(broker_config(name, toml, connectors));
    BrokerProcess::start(opts).unwrap_or_else(|e| panic!("broker {name} starts: {e}"))
}

/// A shared-fs HA group that is one broker of the network: every member has the same broker
/// `name` and connectors, one data directory. The first member is master when this returns;
/// the others are started as slaves. Member `i`'s log is `<name>-<i>.log`.
pub fn start_shared_fs_group(
    dir: &Path,
    name: &str,
    addrs: &[SocketAddr],
    connectors: &[String],
) -> Vec<BrokerProcess> {
    let shared = dir.join(format!("{name}-shared"));
    addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let mut opts = BrokerOpts::new(env!("CARGO_BIN_EXE_haven"), &shared, *addr);
            opts.config_toml = Some(broker_config(
                name,
                "[ha]\nmode = \"shared-fs\"\n",
                connectors,
            ));
            opts.name = Some(format!("{name}-{i}"));
            if i == 0 {
                BrokerProcess::start(opts)
                    .unwrap_or_else(|e| panic!("{name}-{i} starts as master: {e}"))
            } else {
                BrokerProcess::spawn(opts)
                    .unwrap_or_else(|e| panic!("{name}-{i} starts as slave: {e}"))
            }
        })
        .collect()
}

/// How often `needle` occurs in the broker's log (every start of it).
pub fn count_in_log(b: &BrokerProcess, needle: &str) -> usize {
    std::fs::read_to_string(b.log_path())
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// Waits (at most `bound_ms`) until `needle` occurs at least `n` times in the broker's log.
pub async fn wait_log_count(b: &BrokerProcess, needle: &str, n: usize, bound_ms: u64) -> bool {
    let deadline = Instant::now() + Duration::from_millis(bound_ms);
    while count_in_log(b, needle) < n {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// The id a body starts with.
pub fn body_id(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split(' ').next().unwrap_or("").to_string()
}

fn body_of(id: &str, pad_bytes: usize) -> String {
    if pad_bytes == 0 {
        id.to_string()
    } else {
        format!("{id} {}", "x".repeat(pad_bytes))
    }
}

/// Sends `<prefix>-1` .. `<prefix>-<count>` receipted on `client`, from `tasks` concurrent
/// tasks, recording each SEND in every history (a topic's subscribers each keep their own).
pub async fn send_all(
    client: &Client,
    destination: &str,
    prefix: &str,
    count: usize,
    pad_bytes: usize,
    histories: &[Arc<History>],
    tasks: usize,
) {
    let handles: Vec<JoinHandle<()>> = (0..tasks)
        .map(|t| {
            let client = client.clone();
            let destination = destination.to_string();
            let prefix = prefix.to_string();
            let histories = histories.to_vec();
            tokio::spawn(async move {
                for i in (1..=count).filter(|i| i % tasks == t) {
                    let id = format!("{prefix}-{i}");
                    for h in &histories {
                        h.attempted(&id);
                    }
                    client
                        .send_receipted(&destination, &[], body_of(&id, pad_bytes))
                        .await
                        .unwrap_or_else(|e| panic!("send {id} to {destination}: {e}"));
                    for h in &histories {
                        h.outcome(&id, SendOutcome::Receipted);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("sender task");
    }
}

/// Sends queue probes (`probe-<n>`, receipted, owed like any message) through `producer`
/// until the consumer recording into `history` has every one of them, i.e. its demand has
/// reached the producer's broker. False if that did not happen within [`DEMAND_WAIT_MS`].
pub async fn wait_queue_demand(producer: &Client, queue: &str, history: &History) -> bool {
    let deadline = Instant::now() + Duration::from_millis(DEMAND_WAIT_MS);
    let mut n = 0u64;
    loop {
        n += 1;
        let id = format!("probe-{n}");
        history.attempted(&id);
        producer
            .send_receipted(queue, &[], id.clone())
            .await
            .unwrap_or_else(|e| panic!("send {id}: {e}"));
        history.outcome(&id, SendOutcome::Receipted);
        let next = Instant::now() + Duration::from_millis(PROBE_EVERY_MS);
        while Instant::now() < next {
            if history.missing() == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// Sends topic probes (`probe-<source>-<n>`) from every `(source, producer)` until every
/// subscriber has seen one from every source: each subscriber's demand has reached every
/// producer's broker. False if that did not happen within [`DEMAND_WAIT_MS`].
pub async fn wait_topic_demand(
    producers: &[(&str, &Client)],
    topic: &str,
    subscribers: &[&Recorder],
) -> bool {
    let deadline = Instant::now() + Duration::from_millis(DEMAND_WAIT_MS);
    let mut n = 0u64;
    loop {
        n += 1;
        for (source, producer) in producers {
            let id = format!("probe-{source}-{n}");
            producer
                .send_receipted(topic, &[], id.clone())
                .await
                .unwrap_or_else(|e| panic!("send {id}: {e}"));
        }
        let next = Instant::now() + Duration::from_millis(PROBE_EVERY_MS);
        while Instant::now() < next {
            let all = subscribers
                .iter()
                .all(|s| producers.iter().all(|(source, _)| s.saw_probe_from(source)));
            if all {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// Waits until, during `window_ms`, fewer than `bytes_max` bytes went through each proxy
/// toward its broker (a bridge's SENDs; its heart-beats are a byte every 2 s). `Err` with
/// each proxy's bytes in the last window if that never happened within `bound_ms`.
pub async fn wait_bridges_quiet(
    proxies: &[&Proxy],
    window_ms: u64,
    bytes_max: u64,
    bound_ms: u64,
) -> Result<(), Vec<u64>> {
    let deadline = Instant::now() + Duration::from_millis(bound_ms);
    loop {
        let before: Vec<u64> = proxies
            .iter()
            .map(|p| p.stats().bytes_to_upstream)
            .collect();
        tokio::time::sleep(Duration::from_millis(window_ms)).await;
        let grown: Vec<u64> = proxies
            .iter()
            .zip(&before)
            .map(|(p, b)| p.stats().bytes_to_upstream - b)
            .collect();
        if grown.iter().all(|g| *g < bytes_max) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(grown);
        }
    }
}

const RUN: u8 = 0;
/// Stop reading and return.
const STOP: u8 = 1;
/// Return once nothing is missing and nothing came for `QUIET_MS`, or nothing came for
/// `DRAIN_STALL_MS` (or after `DRAIN_TOTAL_MS_MAX`).
const DRAIN: u8 = 2;
/// Read `hold` more messages without recording or acknowledging them, then return.
const HOLD: u8 = 3;

/// A consumer on one destination that records every delivery into a history: queues with
/// client-individual acknowledgements (each acked once recorded), topics with auto.
pub struct Recorder {
    pub label: String,
    pub history: Arc<History>,
    client: Client,
    received: Arc<AtomicU64>,
    probes: Arc<Mutex<BTreeSet<String>>>,
    mode: Arc<AtomicU8>,
    hold: Arc<AtomicU64>,
    task: JoinHandle<Outcome>,
}

struct Outcome {
    ids: Vec<String>,
    held: Vec<String>,
    _sub: Subscription,
}

impl Recorder {
    /// Connects to `uri`, subscribes (the SUBSCRIBE is receipted when this returns) and starts
    /// recording. With `record_probes`, probes are recorded like other messages; without,
    /// only which source brokers sent them.
    pub async fn start(
        label: &str,
        uri: &str,
        destination: &str,
        history: Arc<History>,
        record_probes: bool,
    ) -> Recorder {
        let client = Client::connect(uri, ConnectOptions::default())
            .await
            .unwrap_or_else(|e| panic!("consumer {label} connects to {uri}: {e}"));
        let ack = if destination.starts_with("/topic/") {
            AckMode::Auto
        } else {
            AckMode::ClientIndividual
        };
        let mut sub = client
            .subscribe(
                destination,
                ack,
                &[("activemq.prefetchSize", CONSUMER_PREFETCH)],
            )
            .await
            .unwrap_or_else(|e| panic!("consumer {label} subscribes: {e}"));
        let received = Arc::new(AtomicU64::new(0));
        let probes = Arc::new(Mutex::new(BTreeSet::new()));
        let mode = Arc::new(AtomicU8::new(RUN));
        let hold = Arc::new(AtomicU64::new(0));
        let task = {
            let (client, history, received, probes, mode, hold) = (
                client.clone(),
                history.clone(),
                received.clone(),
                probes.clone(),
                mode.clone(),
                hold.clone(),
            );
            let label = label.to_string();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                let mut last = Instant::now();
                let mut drain_started = None;
                loop {
                    match mode.load(Ordering::Relaxed) {
                        STOP => break,
                        HOLD => {
                            let held =
                                hold_unacked(&mut sub, hold.load(Ordering::Relaxed), record_probes)
                                    .await;
                            return Outcome {
                                ids,
                                held,
                                _sub: sub,
                            };
                        }
                        DRAIN => {
                            let started = *drain_started.get_or_insert_with(Instant::now);
                            let quiet =
                                last.max(started).elapsed() >= Duration::from_millis(QUIET_MS);
                            let stalled = last.max(started).elapsed()
                                >= Duration::from_millis(DRAIN_STALL_MS);
                            let capped =
                                started.elapsed() >= Duration::from_millis(DRAIN_TOTAL_MS_MAX);
                            if (history.missing() == 0 && quiet) || stalled || capped {
                                break;
                            }
                        }
                        _ => {}
                    }
                    let msg = match tokio::time::timeout(
                        Duration::from_millis(RECORDER_POLL_MS),
                        sub.next(),
                    )
                    .await
                    {
                        Ok(Some(msg)) => msg,
                        Ok(None) => panic!(
                            "consumer {label}: subscription ended: {:?}",
                            client.close_reason()
                        ),
                        Err(_) => continue,
                    };
                    last = Instant::now();
                    let id = body_id(&msg.body);
                    let probe = id.strip_prefix("probe-");
                    match probe {
                        Some(rest) if !record_probes => {
                            let source = rest.rsplit_once('-').map_or(rest, |(s, _)| s);
                            probes
                                .lock()
                                .expect("probes poisoned")
                                .insert(source.to_string());
                        }
                        _ => {
                            history.delivered(&id, msg.redelivered);
                            received.fetch_add(1, Ordering::Relaxed);
                            ids.push(id.clone());
                        }
                    }
                    if ack == AckMode::ClientIndividual {
                        client
                            .ack(&msg)
                            .await
                            .unwrap_or_else(|e| panic!("consumer {label}: ack {id}: {e}"));
                        history.acked(&id);
                    }
                }
                Outcome {
                    ids,
                    held: Vec::new(),
                    _sub: sub,
                }
            })
        };
        Recorder {
            label: label.to_string(),
            history,
            client,
            received,
            probes,
            mode,
            hold,
            task,
        }
    }

    /// Deliveries recorded so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    pub fn saw_probe_from(&self, source: &str) -> bool {
        self.probes
            .lock()
            .expect("probes poisoned")
            .contains(source)
    }

    /// Waits (at most `bound_ms`) until at least `n` deliveries are recorded.
    pub async fn wait_received(&self, n: u64, bound_ms: u64) -> bool {
        let deadline = Instant::now() + Duration::from_millis(bound_ms);
        while self.received() < n {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Stops at once and disconnects; returns the ids it recorded. Messages it had been sent
    /// but had not read go back to its broker, unacknowledged.
    pub async fn stop(self) -> Vec<String> {
        self.mode.store(STOP, Ordering::Relaxed);
        self.finish().await.0
    }

    /// Receives until nothing its history is owed is missing and nothing more came for
    /// [`QUIET_MS`] (giving up when nothing came for [`DRAIN_STALL_MS`]), then disconnects;
    /// returns the ids it recorded.
    pub async fn drain(self) -> Vec<String> {
        self.mode.store(DRAIN, Ordering::Relaxed);
        self.finish().await.0
    }

    /// Like an application that dies in the middle of its work: reads `n` more messages
    /// (waiting at most [`PROGRESS_WAIT_MS`] for each) without recording or acknowledging
    /// them, then disconnects. Returns (recorded ids, held ids); the broker must deliver the
    /// held ones again, to someone.
    pub async fn stop_holding(self, n: u64) -> (Vec<String>, Vec<String>) {
        self.hold.store(n, Ordering::Relaxed);
        self.mode.store(HOLD, Ordering::Relaxed);
        self.finish().await
    }

    async fn finish(self) -> (Vec<String>, Vec<String>) {
        let outcome = self.task.await.expect("consumer task");
        self.client
            .disconnect()
            .await
            .unwrap_or_else(|e| panic!("consumer {} disconnects: {e}", self.label));
        (outcome.ids, outcome.held)
    }
}

/// Reads up to `n` messages (other than topic probes) without acknowledging them.
async fn hold_unacked(sub: &mut Subscription, n: u64, record_probes: bool) -> Vec<String> {
    let mut held = Vec::new();
    while (held.len() as u64) < n {
        match tokio::time::timeout(Duration::from_millis(PROGRESS_WAIT_MS), sub.next()).await {
            Ok(Some(msg)) => {
                let id = body_id(&msg.body);
                if record_probes || !id.starts_with("probe-") {
                    held.push(id);
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    held
}
