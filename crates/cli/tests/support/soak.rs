//! The chaos soak: real `haven` broker processes, failover clients with several producers and
//! consumers, and seeded random faults for a set duration, then a healing phase and the
//! no-loss / no-duplicate check.
//!
//! One file, included with `#[path]` by two targets, so the bounded CI run and the long
//! documented soak are the same code:
//! - `tests/chaos_bounded.rs`: each mode for a few tens of seconds in the debug build (CI);
//! - `examples/soak.rs`: `cargo run --release -p haven-cli --example soak -- --duration 30m`.
//!
//! It is not a module of `haven-cli` itself (the binary must not carry test code) nor of
//! `haven-testkit` (which stays synchronous and does not depend on the client crate).
//!
//! Three modes:
//! - [`Mode::ExactlyOnce`]: one broker (one store) restarted again and again. Every SEND
//!   carries the client's producer id and sequence, so the checker forbids any second
//!   delivery ([`Duplicates::Forbidden`]) and checks per-producer order.
//! - [`Mode::Replicated`]: three Raft members (`[ha] mode = "replicated"`), one logical store,
//!   checked as strictly as one broker. The faults also wipe a member's data directory
//!   (`kill -9`, delete, restart): it must catch up from a snapshot and not vote before it
//!   has (the group may have to wait for a member that holds what it lost).
//! - [`Mode::Standalone`]: three brokers with separate stores. A SEND one broker stored just
//!   before it failed, without a RECEIPT, is sent again to another, which cannot know: repeats
//!   are counted ([`Duplicates::Counted`]), loss is forbidden.
//!
//! Every broker sits behind a testkit [`Proxy`], so the faults are `kill -9` + restart,
//! SIGSTOP/SIGCONT, and a black-holed, delayed or reset link, each healed after a seeded random
//! time, one fault at a time. The faults run for the duration, then the healing phase: every
//! fault is undone, each producer must get [`HEALING_RECEIPTS_MIN`] more SENDs receipted and the
//! consumers must receive everything owed, each within a bound (liveness: a stuck client fails
//! the run, it does not hang it). Only then does the checker run.
//!
//! Nothing here asserts on timing: throughput depends on the machine. The fault *schedule*
//! (kinds, targets, durations) follows the seed; thread timing does not, so a replay with the
//! same seed attacks the same way but not at the same message.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haven_client::{AckMode, Client, ClientError, ConnectOptions};
use haven_testkit::{
    free_addr, stomp_connect_probe, BrokerOpts, BrokerProcess, Duplicates, Fault, History, Proxy,
    Report, SendOutcome,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Queues; each has exactly one consumer client, so per-producer order is defined.
pub const QUEUES: usize = 2;
/// Producer clients (each its own producer id); each runs one sender task per queue.
pub const PRODUCER_CLIENTS: usize = 3;
/// Brokers in standalone mode.
const STANDALONE_BROKERS: usize = 3;
/// Members of the replicated group.
const REPLICATED_MEMBERS: usize = 3;
/// Replicated mode: Raft timing, and a snapshot (with a purge of the Raft log) every this
/// many entries, so a wiped member catches up from a snapshot, not the log.
const REPLICATED_HA: &str =
    "heartbeat_ms = 100\nelection_timeout_ms = 500\nsnapshot_entries = 500\n";
/// Bound on a replicated group electing its first leader.
const FIRST_LEADER_WAIT_MS: u64 = 60_000;
/// Heart-beats both ways: a silent link or a frozen broker is noticed in about a second.
const HEARTBEAT_MS: u64 = 500;
/// Bound on TCP connect + CONNECT/CONNECTED: a black-holed proxy accepts and then says nothing.
const CLIENT_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Time between the end of one fault and the start of the next.
const FAULT_GAP_MS: std::ops::Range<u64> = 100..1_500;
/// How long a killed broker stays down before it is restarted.
const KILL_DOWN_MS: std::ops::Range<u64> = 50..1_000;
/// How long a broker stays frozen (SIGSTOP) or a link black-holed.
const SILENCE_MS: std::ops::Range<u64> = 200..3_000;
/// How long a link delays each chunk, and for how long the delay stays.
const DELAY_EACH_MS: std::ops::Range<u64> = 20..300;
const DELAY_HOLD_MS: std::ops::Range<u64> = 500..5_000;
/// How long a link resets every connection (and refuses new ones).
const RESET_HOLD_MS: std::ops::Range<u64> = 50..1_000;
/// Bodies carry the id, then `|` and up to this much padding (seeded), so records vary in size.
const PAD_BYTES_MAX: usize = 512;
/// After the faults stop, each sender task must get this many more SENDs receipted ...
pub const HEALING_RECEIPTS_MIN: u64 = 20;
/// ... within this bound.
const HEALING_WAIT_MS: u64 = 60_000;
/// Bound on the consumers receiving everything owed after the producers stopped: a drain
/// gives up after this long without a message. It ends early once nothing is missing and
/// nothing arrived for `DRAIN_QUIET_MS`. One store: everything owed must come, so wait long.
/// Separate stores: what is owed may wait on a broker the consumer is not on (drained
/// directly afterwards), so do not wait long.
const DRAIN_WAIT_MS: u64 = 60_000;
const DRAIN_WAIT_STANDALONE_MS: u64 = 5_000;
const DRAIN_QUIET_MS: u64 = 1_000;
/// Standalone mode: a direct drain of one broker ends after this long without a message.
const DRAIN_BROKER_QUIET_MS: u64 = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    ExactlyOnce,
    Standalone,
    Replicated,
}

impl Mode {
    /// For the example's `--mode` (the CI test names its modes directly).
    #[allow(dead_code)]
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "exactly-once" => Some(Mode::ExactlyOnce),
            "standalone" => Some(Mode::Standalone),
            "replicated" => Some(Mode::Replicated),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Mode::ExactlyOnce => "exactly-once",
            Mode::Standalone => "standalone",
            Mode::Replicated => "replicated",
        }
    }

    /// One logical store: nothing may be delivered twice, and per-producer order holds.
    fn one_store(self) -> bool {
        self != Mode::Standalone
    }

    /// The faults of this mode.
    fn faults(self) -> &'static [FaultKind] {
        match self {
            Mode::Replicated => &FaultKind::ALL,
            Mode::ExactlyOnce | Mode::Standalone => &FaultKind::ALL[..5],
        }
    }
}

#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The `haven` binary.
    pub bin: PathBuf,
    /// Broker data directories and logs go here.
    pub dir: PathBuf,
    pub mode: Mode,
    /// Length of the fault phase (healing and the check come after it).
    pub duration: Duration,
    pub seed: u64,
}

/// Fault kinds, as counted in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    Kill9,
    Pause,
    BlackHole,
    Delay,
    Reset,
    /// Replicated mode only: `kill -9`, the data directory deleted, restarted empty.
    Wipe,
}

impl FaultKind {
    const ALL: [FaultKind; 6] = [
        FaultKind::Kill9,
        FaultKind::Pause,
        FaultKind::BlackHole,
        FaultKind::Delay,
        FaultKind::Reset,
        FaultKind::Wipe,
    ];

    fn name(self) -> &'static str {
        match self {
            FaultKind::Kill9 => "kill -9 + restart",
            FaultKind::Pause => "SIGSTOP/SIGCONT",
            FaultKind::BlackHole => "black hole",
            FaultKind::Delay => "delay",
            FaultKind::Reset => "reset",
            FaultKind::Wipe => "kill -9 + wipe + restart",
        }
    }
}

/// What a run did and found. [`Summary::ok`] is the verdict.
pub struct Summary {
    pub seed: u64,
    pub mode: Mode,
    pub fault_phase: Duration,
    pub elapsed: Duration,
    faults: BTreeMap<FaultKind, u64>,
    pub report: Report,
    pub reconnects: u64,
    pub sends_resent: u64,
    pub duplicates_dropped: u64,
    /// Reconnects on which a store had forgotten a producer it had receipted for
    /// (`ConnectionEvent::ProducerForgotten`). No broker here is near its table's limits, so
    /// each is a failure: a store that lost marks, or a client that misjudged one.
    pub producer_forgotten: u64,
    /// Errors a client returned that it should have hidden (each is a failure).
    pub client_errors: Vec<String>,
    /// SENDs a broker refused (ERROR naming the SEND), with the reason: the application was
    /// told and nothing was stored, so not a failure, but each is listed.
    pub refusals: Vec<String>,
    /// A liveness failure of the healing phase, if any.
    pub stuck: Option<String>,
    /// Peak RSS of each broker's current process at the end, in bytes.
    pub broker_rss_peak_bytes: Vec<u64>,
}

impl Summary {
    pub fn ok(&self) -> bool {
        self.report.is_ok()
            && self.client_errors.is_empty()
            && self.stuck.is_none()
            && self.producer_forgotten == 0
    }

    pub fn faults_total(&self) -> u64 {
        self.faults.values().sum()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.report;
        writeln!(
            f,
            "soak {}: seed {} | faults for {:.0} s, {:.0} s in all",
            self.mode.as_str(),
            self.seed,
            self.fault_phase.as_secs_f64(),
            self.elapsed.as_secs_f64()
        )?;
        write!(f, "  faults injected: {}", self.faults_total())?;
        for &kind in self.mode.faults() {
            write!(
                f,
                ", {} {}",
                kind.name(),
                self.faults.get(&kind).copied().unwrap_or(0)
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  messages: sent {} receipted {} refused {} unknown {} | delivered {} ids in {} deliveries | checked {}",
            r.attempted, r.receipted, r.failed, r.unknown, r.delivered, r.deliveries, r.attempted
        )?;
        let order = if self.mode.one_store() {
            r.order_violations.len().to_string()
        } else {
            "not checked (separate stores)".to_string()
        };
        writeln!(
            f,
            "  lost {} | duplicated {} (forbidden) / delivered more than once {} | order violations {order} | unexpected {}",
            r.lost.len(),
            r.duplicated.len(),
            r.repeated,
            r.unexpected.len()
        )?;
        writeln!(
            f,
            "  clients: reconnects {}, SENDs resent {}, redeliveries dropped by the client {}, producers forgotten by a store {}, errors {}",
            self.reconnects,
            self.sends_resent,
            self.duplicates_dropped,
            self.producer_forgotten,
            self.client_errors.len()
        )?;
        let rss: Vec<String> = self
            .broker_rss_peak_bytes
            .iter()
            .map(|b| format!("{} MiB", b / (1024 * 1024)))
            .collect();
        writeln!(
            f,
            "  broker peak RSS (last process of each): {}",
            rss.join(", ")
        )?;
        writeln!(f, "  checker: {r}")?;
        for e in self.client_errors.iter().take(10) {
            writeln!(f, "  client error: {e}")?;
        }
        for e in self.refusals.iter().take(10) {
            writeln!(f, "  refused: {e}")?;
        }
        if let Some(stuck) = &self.stuck {
            writeln!(f, "  STUCK: {stuck}")?;
        }
        if self.ok() {
            write!(f, "  verdict: OK")
        } else {
            write!(
                f,
                "  verdict: FAILED (replay the fault schedule with seed {})",
                self.seed
            )
        }
    }
}

fn queue(q: usize) -> String {
    format!("/queue/soak-{q}")
}

fn broker_config() -> String {
    format!("[stomp]\nheartbeat_send_ms = {HEARTBEAT_MS}\nheartbeat_receive_ms = {HEARTBEAT_MS}\n")
}

/// Member `i` of a replicated group whose members listen on `rafts` and `stomps`.
fn replicated_config(i: usize, rafts: &[SocketAddr], stomps: &[SocketAddr]) -> String {
    let mut c = format!(
        "[broker]\nname = \"soak-{i}\"\n\n{}\n[ha]\nmode = \"replicated\"\nnode_id = {}\n\
         cluster_name = \"soak\"\n{REPLICATED_HA}\n",
        broker_config(),
        i + 1
    );
    for (j, (raft, stomp)) in rafts.iter().zip(stomps).enumerate() {
        c += &format!(
            "[[ha.members]]\nid = {}\nraft = \"{raft}\"\nstomp = \"{stomp}\"\n\n",
            j + 1
        );
    }
    c
}

/// Bound on a wiped member catching up before the next disk is wiped.
const REPAIRED_WAIT_MS: u64 = 120_000;

/// Waits until every member at `rafts` answers and none is catching up after a lost disk.
async fn wait_none_repairing(rafts: &[SocketAddr]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_millis(REPAIRED_WAIT_MS);
    loop {
        let mut whole = true;
        let mut seen = Vec::new();
        for raft in rafts {
            match haven_raft::client::status(&raft.to_string()).await {
                Ok(s) if !s.repairing => {}
                Ok(_) => {
                    whole = false;
                    seen.push(format!("{raft}: repairing"));
                }
                Err(e) => {
                    whole = false;
                    seen.push(format!("{raft}: {e}"));
                }
            }
        }
        if whole {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "a wiped member did not catch up in {REPAIRED_WAIT_MS} ms: {}",
                seen.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until one of `brokers` serves STOMP (a replicated group's leader).
fn wait_serving(brokers: &[BrokerProcess]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_millis(FIRST_LEADER_WAIT_MS);
    loop {
        for b in brokers {
            let probe = stomp_connect_probe(b.addr(), Duration::from_millis(500));
            if probe.is_ok_and(|command| command == "CONNECTED") {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no member of the replicated group served in {FIRST_LEADER_WAIT_MS} ms"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn client_options() -> ConnectOptions {
    ConnectOptions {
        heartbeat_ms: (HEARTBEAT_MS, HEARTBEAT_MS),
        connect_timeout_ms: CLIENT_CONNECT_TIMEOUT_MS,
        ..ConnectOptions::default()
    }
}

/// The brokers and the proxy in front of each. Broker operations block (they wait for
/// readiness), so they run under `spawn_blocking`; the mutex is held only by the one fault in
/// progress, or by the healing and the final drain.
struct Cluster {
    brokers: Arc<Mutex<Vec<BrokerProcess>>>,
    proxies: Arc<Vec<Proxy>>,
    /// Client-facing URIs: one per proxy, in broker order.
    via_proxy: Vec<String>,
    /// Direct URIs of the brokers, for the final drain.
    direct: Vec<String>,
    /// Replicated mode: each member's Raft port.
    rafts: Vec<SocketAddr>,
}

impl Cluster {
    fn start(cfg: &SoakConfig) -> Result<Cluster, String> {
        let n = match cfg.mode {
            Mode::ExactlyOnce => 1,
            Mode::Standalone => STANDALONE_BROKERS,
            Mode::Replicated => REPLICATED_MEMBERS,
        };
        let rafts: Vec<SocketAddr> = match cfg.mode {
            Mode::Replicated => (0..n).map(|_| free_addr()).collect(),
            Mode::ExactlyOnce | Mode::Standalone => Vec::new(),
        };
        let stomps: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
        let mut brokers = Vec::new();
        let mut proxies = Vec::new();
        for i in 0..n {
            let mut opts =
                BrokerOpts::new(&cfg.bin, cfg.dir.join(format!("broker-{i}")), stomps[i]);
            let broker = if cfg.mode == Mode::Replicated {
                // Only the leader listens for STOMP: start them all, then wait for one.
                opts.config_toml = Some(replicated_config(i, &rafts, &stomps));
                BrokerProcess::spawn(opts)
            } else {
                opts.config_toml = Some(broker_config());
                BrokerProcess::start(opts)
            }
            .map_err(|e| format!("broker {i}: {e}"))?;
            proxies.push(Proxy::start(broker.addr()).map_err(|e| format!("proxy {i}: {e}"))?);
            brokers.push(broker);
        }
        if cfg.mode == Mode::Replicated {
            wait_serving(&brokers)?;
        }
        Ok(Cluster {
            via_proxy: proxies
                .iter()
                .map(|p| format!("tcp://{}", p.addr()))
                .collect(),
            direct: brokers.iter().map(|b| b.stomp_url()).collect(),
            rafts,
            brokers: Arc::new(Mutex::new(brokers)),
            proxies: Arc::new(proxies),
        })
    }

    fn failover_uri(&self, mode: Mode) -> String {
        // Standalone: spread the clients over the brokers; one broker: nothing to spread.
        let randomize = mode == Mode::Standalone;
        format!(
            "failover:({})?initialReconnectDelay=10&maxReconnectDelay=200&randomize={randomize}",
            self.via_proxy.join(",")
        )
    }
}

/// One fault on broker/proxy `target`, applied, held and healed before it returns. Returns an
/// error only for a broker that cannot be signalled or restarted (the run cannot go on).
/// A replicated group's members are restarted without waiting for them to serve (only the
/// leader does).
fn inject(
    cluster_brokers: &Mutex<Vec<BrokerProcess>>,
    proxies: &[Proxy],
    mode: Mode,
    target: usize,
    kind: FaultKind,
    rng: &mut StdRng,
) -> Result<(), String> {
    let sleep = |ms: u64| std::thread::sleep(Duration::from_millis(ms));
    let restart = |b: &mut BrokerProcess| {
        if mode == Mode::Replicated {
            b.respawn()
        } else {
            b.restart()
        }
        .map_err(|e| format!("restart: {e}"))
    };
    match kind {
        FaultKind::Kill9 | FaultKind::Wipe => {
            let down = rng.gen_range(KILL_DOWN_MS);
            let mut brokers = cluster_brokers.lock().expect("brokers poisoned");
            brokers[target]
                .kill9()
                .map_err(|e| format!("kill -9: {e}"))?;
            if kind == FaultKind::Wipe {
                let dir = brokers[target].data_dir().to_path_buf();
                std::fs::remove_dir_all(&dir)
                    .map_err(|e| format!("wiping {}: {e}", dir.display()))?;
            }
            sleep(down);
            restart(&mut brokers[target])?;
        }
        FaultKind::Pause => {
            let hold = rng.gen_range(SILENCE_MS);
            let mut brokers = cluster_brokers.lock().expect("brokers poisoned");
            brokers[target]
                .sigstop()
                .map_err(|e| format!("SIGSTOP: {e}"))?;
            sleep(hold);
            brokers[target]
                .sigcont()
                .map_err(|e| format!("SIGCONT: {e}"))?;
        }
        FaultKind::BlackHole => {
            let hold = rng.gen_range(SILENCE_MS);
            proxies[target].set(Fault::BlackHole);
            sleep(hold);
            proxies[target].set(Fault::Pass);
        }
        FaultKind::Delay => {
            let ms = rng.gen_range(DELAY_EACH_MS);
            let hold = rng.gen_range(DELAY_HOLD_MS);
            proxies[target].set(Fault::Delay { ms });
            sleep(hold);
            proxies[target].set(Fault::Pass);
        }
        FaultKind::Reset => {
            let hold = rng.gen_range(RESET_HOLD_MS);
            proxies[target].set(Fault::Reset);
            sleep(hold);
            proxies[target].set(Fault::Pass);
        }
    }
    Ok(())
}

/// Counters shared by the workload tasks.
struct Workload {
    history: Arc<History>,
    /// Receipts per sender task (index `client * QUEUES + queue`).
    receipts: Arc<Vec<AtomicU64>>,
    stop_producers: Arc<AtomicBool>,
    stop_consumers: Arc<AtomicBool>,
    errors: Arc<Mutex<Vec<String>>>,
    /// SENDs a broker refused with an ERROR, with its reason.
    refusals: Arc<Mutex<Vec<String>>>,
}

fn record_error(errors: &Mutex<Vec<String>>, e: String) {
    errors.lock().expect("errors poisoned").push(e);
}

/// Sender task: ids `p<client>q<queue>-<n>` to one queue, each waiting for its RECEIPT.
fn spawn_sender(
    client: Client,
    c: usize,
    q: usize,
    pad_len: usize,
    w: &Workload,
) -> tokio::task::JoinHandle<()> {
    let (history, receipts, stop, errors, refusals) = (
        w.history.clone(),
        w.receipts.clone(),
        w.stop_producers.clone(),
        w.errors.clone(),
        w.refusals.clone(),
    );
    tokio::spawn(async move {
        let dest = queue(q);
        let pad = "x".repeat(pad_len);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let id = format!("p{c}q{q}-{n}");
            history.attempted(&id);
            match client
                .send_receipted(&dest, &[], format!("{id}|{pad}"))
                .await
            {
                Ok(()) => {
                    history.outcome(&id, SendOutcome::Receipted);
                    receipts[c * QUEUES + q].fetch_add(1, Ordering::Relaxed);
                }
                Err(e @ ClientError::Server { .. }) => {
                    // Not stored, and the application is told: not a loss, but shown.
                    history.outcome(&id, SendOutcome::Failed);
                    record_error(&refusals, format!("send {id}: {e}"));
                }
                Err(e) => {
                    history.outcome(&id, SendOutcome::Unknown);
                    record_error(&errors, format!("send {id}: {e}"));
                    // Do not spin on a client that keeps failing.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

fn id_of(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split('|').next().unwrap_or("").to_string()
}

/// Receives from `sub`, recording and acking each message, until `stop` is set and then
/// nothing is missing and nothing arrived for `quiet_ms`, or nothing arrived for `give_up_ms`.
async fn drain(
    client: &Client,
    sub: &mut haven_client::Subscription,
    history: &History,
    stop: &AtomicBool,
    quiet_ms: u64,
    give_up_ms: u64,
    errors: &Mutex<Vec<String>>,
) {
    let mut last = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_millis(quiet_ms), sub.next()).await {
            Ok(Some(msg)) => {
                last = Instant::now();
                let id = id_of(&msg.body);
                history.delivered(&id, msg.redelivered);
                if let Err(e) = client.ack(&msg).await {
                    record_error(errors, format!("ack {id}: {e}"));
                    return;
                }
                history.acked(&id);
            }
            Ok(None) => {
                record_error(
                    errors,
                    format!("subscription ended: {:?}", client.close_reason()),
                );
                return;
            }
            Err(_) if stop.load(Ordering::Relaxed) => {
                if history.missing() == 0 || last.elapsed() >= Duration::from_millis(give_up_ms) {
                    return;
                }
            }
            Err(_) => {}
        }
    }
}

fn spawn_consumer(
    client: Client,
    q: usize,
    give_up_ms: u64,
    w: &Workload,
) -> tokio::task::JoinHandle<Client> {
    let (history, stop, errors) = (
        w.history.clone(),
        w.stop_consumers.clone(),
        w.errors.clone(),
    );
    tokio::spawn(async move {
        let sub = client
            .subscribe(
                &queue(q),
                AckMode::ClientIndividual,
                &[
                    ("id", &format!("soak-consumer-{q}")),
                    ("activemq.prefetchSize", "64"),
                ],
            )
            .await;
        match sub {
            Ok(mut sub) => {
                drain(
                    &client,
                    &mut sub,
                    &history,
                    &stop,
                    DRAIN_QUIET_MS,
                    give_up_ms,
                    &errors,
                )
                .await
            }
            Err(e) => record_error(&errors, format!("subscribe {}: {e}", queue(q))),
        }
        client
    })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("blocking task panicked")
}

/// Runs one soak. `Err` only when the run could not be set up or a broker could not be
/// restarted; every finding about the broker or the client is in the [`Summary`].
pub async fn run(cfg: &SoakConfig) -> Result<Summary, String> {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    std::fs::create_dir_all(&cfg.dir).map_err(|e| format!("{}: {e}", cfg.dir.display()))?;
    let cluster = {
        let cfg = cfg.clone();
        blocking(move || Cluster::start(&cfg)).await?
    };
    let uri = cluster.failover_uri(cfg.mode);
    let w = Workload {
        history: Arc::new(History::new()),
        receipts: Arc::new(
            (0..PRODUCER_CLIENTS * QUEUES)
                .map(|_| AtomicU64::new(0))
                .collect(),
        ),
        stop_producers: Arc::new(AtomicBool::new(false)),
        stop_consumers: Arc::new(AtomicBool::new(false)),
        errors: Arc::new(Mutex::new(Vec::new())),
        refusals: Arc::new(Mutex::new(Vec::new())),
    };

    let mut consumers = Vec::new();
    let mut consumer_tasks = Vec::new();
    for q in 0..QUEUES {
        let client = Client::connect(&uri, client_options())
            .await
            .map_err(|e| format!("consumer connects: {e}"))?;
        consumers.push(client.clone());
        let give_up_ms = if cfg.mode.one_store() {
            DRAIN_WAIT_MS
        } else {
            DRAIN_WAIT_STANDALONE_MS
        };
        consumer_tasks.push(spawn_consumer(client, q, give_up_ms, &w));
    }
    let mut producers = Vec::new();
    let mut sender_tasks = Vec::new();
    for c in 0..PRODUCER_CLIENTS {
        let client = Client::connect(&uri, client_options())
            .await
            .map_err(|e| format!("producer connects: {e}"))?;
        for q in 0..QUEUES {
            let pad = rng.gen_range(0..=PAD_BYTES_MAX);
            sender_tasks.push(spawn_sender(client.clone(), c, q, pad, &w));
        }
        producers.push(client);
    }

    // Fault phase: one fault at a time, each healed before the next.
    let mut faults: BTreeMap<FaultKind, u64> = BTreeMap::new();
    let fault_start = Instant::now();
    while fault_start.elapsed() < cfg.duration {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(FAULT_GAP_MS))).await;
        let kinds = cfg.mode.faults();
        let kind = kinds[rng.gen_range(0..kinds.len())];
        let target = pick_target(cfg.mode, &cluster, &producers, &consumers, &mut rng);
        let fault_seed = rng.gen::<u64>();
        if kind == FaultKind::Wipe {
            // A lost disk is a failure until its member has caught up: a second one before
            // that is more than three members survive (the group would rightly wait for ever).
            wait_none_repairing(&cluster.rafts).await?;
        }
        let (brokers, proxies) = (cluster.brokers.clone(), cluster.proxies.clone());
        let mode = cfg.mode;
        blocking(move || {
            let mut rng = StdRng::seed_from_u64(fault_seed);
            inject(&brokers, &proxies, mode, target, kind, &mut rng)
        })
        .await?;
        *faults.entry(kind).or_default() += 1;
    }
    let fault_phase = fault_start.elapsed();

    // Healing: every fault was undone by `inject`; now the clients must make progress.
    let mut stuck = None;
    let before: Vec<u64> = w
        .receipts
        .iter()
        .map(|r| r.load(Ordering::Relaxed))
        .collect();
    let deadline = Instant::now() + Duration::from_millis(HEALING_WAIT_MS);
    loop {
        let behind: Vec<usize> = (0..before.len())
            .filter(|&i| w.receipts[i].load(Ordering::Relaxed) < before[i] + HEALING_RECEIPTS_MIN)
            .collect();
        if behind.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            stuck = Some(format!(
                "sender tasks {behind:?} got fewer than {HEALING_RECEIPTS_MIN} receipts in {HEALING_WAIT_MS} ms after the faults stopped"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.stop_producers.store(true, Ordering::Relaxed);
    for task in sender_tasks {
        // A sender stuck in a SEND that never completes would hang here: bound it.
        if tokio::time::timeout(Duration::from_millis(HEALING_WAIT_MS), task)
            .await
            .is_err()
        {
            stuck.get_or_insert_with(|| "a sender task did not finish its last SEND".into());
        }
    }
    let mut reconnects = 0;
    let mut sends_resent = 0;
    let mut duplicates_dropped = 0;
    let mut producer_forgotten = 0;
    for p in &producers {
        let s = p.stats();
        reconnects += s.reconnects;
        sends_resent += s.sends_resent;
        producer_forgotten += s.producer_forgotten;
        if stuck.is_none() {
            if let Err(e) = p.disconnect().await {
                record_error(&w.errors, format!("producer disconnect: {e}"));
            }
        }
    }
    w.stop_consumers.store(true, Ordering::Relaxed);
    for task in consumer_tasks {
        match tokio::time::timeout(Duration::from_millis(2 * DRAIN_WAIT_MS), task).await {
            Ok(Ok(client)) => {
                let s = client.stats();
                reconnects += s.reconnects;
                duplicates_dropped += s.duplicates_dropped;
                if let Err(e) = client.disconnect().await {
                    record_error(&w.errors, format!("consumer disconnect: {e}"));
                }
            }
            Ok(Err(e)) => record_error(&w.errors, format!("consumer task: {e}")),
            Err(_) => {
                stuck.get_or_insert_with(|| "a consumer did not finish draining".into());
            }
        }
    }

    // Standalone brokers keep what was sent to them while the consumers were elsewhere.
    if cfg.mode == Mode::Standalone {
        for url in &cluster.direct {
            for q in 0..QUEUES {
                drain_broker(url, q, &w).await;
            }
        }
    }

    let (duplicates, check_order) = if cfg.mode.one_store() {
        (Duplicates::Forbidden, true)
    } else {
        (Duplicates::Counted, false)
    };
    let report = w.history.check(duplicates, check_order);
    let brokers = cluster.brokers.clone();
    let broker_rss_peak_bytes = blocking(move || {
        let mut brokers = brokers.lock().expect("brokers poisoned");
        let peaks = brokers
            .iter_mut()
            .map(|b| b.rss_peak_bytes().unwrap_or(0))
            .collect();
        for b in brokers.iter_mut() {
            let _ = b.stop();
        }
        peaks
    })
    .await;
    let client_errors = std::mem::take(&mut *w.errors.lock().expect("errors poisoned"));
    let refusals = std::mem::take(&mut *w.refusals.lock().expect("refusals poisoned"));
    Ok(Summary {
        seed: cfg.seed,
        mode: cfg.mode,
        fault_phase,
        elapsed: started.elapsed(),
        faults,
        report,
        reconnects,
        sends_resent,
        duplicates_dropped,
        producer_forgotten,
        client_errors,
        refusals,
        stuck,
        broker_rss_peak_bytes,
    })
}

/// Several brokers (standalone or replicated): usually the broker a producer or consumer is
/// on right now (so the fault hits traffic: a replicated group's leader), sometimes any.
fn pick_target(
    mode: Mode,
    cluster: &Cluster,
    producers: &[Client],
    consumers: &[Client],
    rng: &mut StdRng,
) -> usize {
    if mode == Mode::ExactlyOnce {
        return 0;
    }
    let n = cluster.via_proxy.len();
    let in_use: Vec<usize> = producers
        .iter()
        .chain(consumers)
        .filter_map(|c| c.broker())
        .filter_map(|b| cluster.via_proxy.iter().position(|u| *u == b))
        .collect();
    if in_use.is_empty() || rng.gen_bool(0.25) {
        rng.gen_range(0..n)
    } else {
        in_use[rng.gen_range(0..in_use.len())]
    }
}

/// Drains queue `q` of one broker directly (no proxy, no failover) into the history.
async fn drain_broker(url: &str, q: usize, w: &Workload) {
    let client = match Client::connect(url, ConnectOptions::default()).await {
        Ok(c) => c,
        Err(e) => {
            record_error(&w.errors, format!("drain {url}: {e}"));
            return;
        }
    };
    match client
        .subscribe(&queue(q), AckMode::ClientIndividual, &[])
        .await
    {
        Ok(mut sub) => {
            drain(
                &client,
                &mut sub,
                &w.history,
                &AtomicBool::new(true),
                DRAIN_BROKER_QUIET_MS,
                DRAIN_BROKER_QUIET_MS,
                &w.errors,
            )
            .await;
        }
        Err(e) => record_error(&w.errors, format!("drain subscribe {url}: {e}")),
    }
    if let Err(e) = client.disconnect().await {
        record_error(&w.errors, format!("drain disconnect {url}: {e}"));
    }
}

/// `90s`, `10m`, `2h`, or a bare number of seconds (the example's `--duration`).
#[allow(dead_code)]
pub fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}
