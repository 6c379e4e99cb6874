//! One simulated run: brokers and failover clients on turmoil, a seeded fault phase, a healing
//! phase that must make progress, and the no-loss / no-duplicate check at the end.
//!
//! Everything random — the faults, their timing, the network's latencies, the disk's sync
//! times and what a crash keeps of unsynced writes, the clients' choices — comes from the one
//! seed, so a failing seed replays the same run. The run keeps a trace (faults, sends,
//! outcomes, deliveries, acks, each with its simulated time); its digest is how the tests
//! check that a seed does replay exactly.

use crate::disk::{DiskStats, SimDisk};
use crate::edges::{SimClock, SimDialer, SimNetwork};
use crate::lease::{LeaseTimes, SimLease, SimSharedStore};
use crate::shared::{serve_shared, Roles};
use haven_client::{AckMode, Client, ClientError, ConnectOptions, Dialer};
use haven_server::{Config, Env, Server};
use haven_testkit::{Duplicates, History, Report, SendOutcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const QUEUE: &str = "/queue/sim";
const PORT: u16 = 61613;
/// Heart-beats both ways: how a client notices a held or partitioned link.
const HEARTBEAT_MS: u64 = 500;
/// A consumer that heard nothing for this long re-checks whether it is done.
const CONSUMER_QUIET_MS: u64 = 1_000;
/// Producers pause this long between SENDs (receipted) or batches (pipelined): the runs are
/// about faults, not throughput, and every message costs real time to simulate.
const SEND_PAUSE_MS: u64 = 25;
const PIPELINE_BATCH: usize = 4;
/// SENDs per transaction of the transacted producer.
const TX_SENDS: usize = 3;
/// Shared-store mode: how often a fault aims at the master rather than a random host.
const SHARED_FAULTS_AT_MASTER_PERCENT: u32 = 70;
/// Shared-store mode: a pause lasts this long, in ms: from well inside the lease
/// (`LeaseTimes::SIM`, 3 s) to twice past it.
const PAUSE_MS_MIN: u64 = 500;
const PAUSE_MS_MAX: u64 = 6_000;
/// Shared-store mode: how long a host stays cut off from the storage, in ms.
const STORAGE_CUT_MS_MIN: u64 = 500;
const STORAGE_CUT_MS_MAX: u64 = 5_000;
/// Bound on the sim beyond the healing bound, so turmoil's own limit never fires first.
const SIM_SLACK_MS: u64 = 60_000;

/// Which topology a run simulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One broker, crashed and restarted over the same disk: exactly once, in order.
    ExactlyOnce,
    /// Three standalone brokers, each with its own disk: nothing receipted is lost (a message
    /// may be stored on two brokers when a RECEIPT was lost with one of them).
    Standalone,
    /// Three brokers sharing one disk, master/slave through a lease (`crate::lease`): exactly
    /// once, in order, and the store's invariants checked at every step.
    SharedStore,
}

impl Mode {
    pub fn brokers(self) -> usize {
        match self {
            Mode::ExactlyOnce => 1,
            Mode::Standalone | Mode::SharedStore => 3,
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "exactly-once" => Ok(Mode::ExactlyOnce),
            "standalone" => Ok(Mode::Standalone),
            "shared-store" => Ok(Mode::SharedStore),
            other => Err(format!(
                "unknown mode {other:?} (exactly-once | standalone | shared-store)"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::ExactlyOnce => "exactly-once",
            Mode::Standalone => "standalone",
            Mode::SharedStore => "shared-store",
        })
    }
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub mode: Mode,
    pub producers: usize,
    pub messages_per_producer: usize,
    /// Faults are injected during the first `fault_ms` of simulated time.
    pub fault_ms: u64,
    /// After the fault phase everything heals; the run must finish within this (liveness).
    pub heal_ms_max: u64,
    /// A disk that reports syncs it did not do: the run must then find lost messages. Only
    /// for showing that the checker catches a broken log.
    pub lying_disk: bool,
    /// Shared-store mode: the disk refuses writes from a deposed master's epoch. Switched off
    /// only by the negative test, which must then see the invariants fail.
    pub store_fencing: bool,
}

impl SimConfig {
    pub fn new(seed: u64, mode: Mode) -> SimConfig {
        SimConfig {
            seed,
            mode,
            producers: 3,
            messages_per_producer: 200,
            fault_ms: 15_000,
            heal_ms_max: 120_000,
            lying_disk: false,
            store_fencing: true,
        }
    }
}

/// What a run did and whether it held.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub mode: Mode,
    pub report: Report,
    /// Faults injected, by kind: crash, hold, partition, clock jump, disk failure.
    pub faults: FaultCounts,
    /// Empty unless the healing phase failed to finish in time, or a simulated process
    /// failed: then what was still missing.
    pub liveness: Option<String>,
    /// Simulated milliseconds the run took.
    pub sim_ms: u64,
    pub disks: Vec<DiskStats>,
    /// Invariants broken during the run (checked at every step); the run stops at the first.
    pub violations: Vec<String>,
    /// Times a producer's client was told that its store had forgotten it
    /// (`ConnectionEvent::ProducerForgotten`), over the producers that finished. A failure
    /// unless the disk lies (see the producers' check).
    pub producers_forgotten: u64,
    /// Shared-store mode: what the lease and the fence did.
    pub shared: Option<SharedStats>,
    pub trace_digest: u32,
    pub trace: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub crashes: u64,
    pub holds: u64,
    pub partitions: u64,
    pub clock_jumps: u64,
    pub disk_failures: u64,
    /// Shared-store mode: stop-the-world pauses of a host (often the master, often past its
    /// lease).
    pub pauses: u64,
    /// Shared-store mode: a host cut off from the storage (and so from the lease).
    pub storage_cuts: u64,
    /// Shared-store mode: the master killed, then its successor as soon as it serves (each
    /// kill is also counted in `crashes`).
    pub double_kills: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.crashes
            + self.holds
            + self.partitions
            + self.clock_jumps
            + self.disk_failures
            + self.pauses
            + self.storage_cuts
    }
}

/// What the shared store's lease and fence did in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Epochs granted: masters elected.
    pub masters: u64,
    /// Renewals by masters, and expired leases a slave took over.
    pub renewals: u64,
    pub expired_takeovers: u64,
    /// Writes of a deposed master refused by the store.
    pub refused_writes: u64,
    /// Records stored from a deposed master's epoch (must be 0).
    pub stale_records: u64,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.report.is_ok() && self.liveness.is_none() && self.violations.is_empty()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.report;
        writeln!(
            f,
            "seed {} ({}): {} after {} simulated ms, trace digest {:08x}",
            self.seed,
            self.mode,
            if self.ok() { "ok" } else { "FAILED" },
            self.sim_ms,
            self.trace_digest
        )?;
        writeln!(
            f,
            "  faults: {} crashes, {} holds, {} partitions, {} clock jumps, {} disk failures",
            self.faults.crashes,
            self.faults.holds,
            self.faults.partitions,
            self.faults.clock_jumps,
            self.faults.disk_failures
        )?;
        if let Some(s) = &self.shared {
            writeln!(
                f,
                "  shared store: {} pauses, {} storage cuts, {} double kills; {} masters, {} \
                 renewals, {} expired leases taken over, {} stale writes refused, {} stale \
                 records stored",
                self.faults.pauses,
                self.faults.storage_cuts,
                self.faults.double_kills,
                s.masters,
                s.renewals,
                s.expired_takeovers,
                s.refused_writes,
                s.stale_records
            )?;
        }
        writeln!(
            f,
            "  messages: {} attempted, {} receipted, {} unknown, {} delivered ({} deliveries), \
             {} lost, {} duplicated, {} repeated, {} out of order",
            r.attempted,
            r.receipted,
            r.unknown,
            r.delivered,
            r.deliveries,
            r.lost.len(),
            r.duplicated.len(),
            r.repeated,
            r.order_violations.len()
        )?;
        let lost_unsynced: u64 = self.disks.iter().map(|d| d.lost_unsynced).sum();
        let kept_unsynced: u64 = self.disks.iter().map(|d| d.kept_unsynced).sum();
        let released: u64 = self.disks.iter().map(|d| d.segments_released).sum();
        writeln!(
            f,
            "  disks: {lost_unsynced} unsynced records lost and {kept_unsynced} kept by \
             crashes, {released} segments released"
        )?;
        if let Some(l) = &self.liveness {
            writeln!(f, "  liveness: {l}")?;
        }
        for v in &self.violations {
            writeln!(f, "  invariant violated: {v}")?;
        }
        if !r.is_ok() {
            writeln!(f, "  {r}")?;
        }
        if !self.ok() {
            writeln!(
                f,
                "  replay: cargo run -p haven-sim -- --seed {} --mode {} --trace",
                self.seed, self.mode
            )?;
        }
        Ok(())
    }
}

/// The run's event log, shared by every simulated process.
#[derive(Clone, Default)]
struct Trace(Arc<Mutex<Vec<String>>>);

impl Trace {
    /// From inside the simulation (a host or client), at its simulated time.
    fn add(&self, what: impl fmt::Display) {
        let ms = turmoil::sim_elapsed()
            .expect("inside the simulation")
            .as_millis() as u64;
        self.add_at(ms, what);
    }
    fn add_at(&self, ms: u64, what: impl fmt::Display) {
        self.0
            .lock()
            .expect("trace")
            .push(format!("{ms:>7} {what}"));
    }
    fn lines(&self) -> Vec<String> {
        self.0.lock().expect("trace").clone()
    }
}

fn broker_name(i: usize) -> String {
    format!("broker{i}")
}

fn broker_config() -> Config {
    let mut c = Config::default();
    c.stomp.listen = SocketAddr::from(([0, 0, 0, 0], PORT));
    c.stomp.heartbeat_send_ms = HEARTBEAT_MS;
    c.stomp.heartbeat_receive_ms = HEARTBEAT_MS;
    c.journal.maintenance_interval_ms = 200;
    c
}

fn client_options(seed: u64, producer: Option<String>) -> ConnectOptions {
    ConnectOptions {
        dialer: Dialer::new(SimDialer),
        rng_seed: Some(seed),
        producer_id: producer,
        heartbeat_ms: (HEARTBEAT_MS, HEARTBEAT_MS),
        connect_timeout_ms: 2_000,
        ..Default::default()
    }
}

fn failover_uri(brokers: usize) -> String {
    let list: Vec<String> = (0..brokers)
        .map(|i| format!("tcp://{}:{PORT}", broker_name(i)))
        .collect();
    format!(
        "failover:({})?randomize=false&initialReconnectDelay=20&maxReconnectDelay=1000",
        list.join(",")
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BrokerState {
    Up,
    Crashed,
    /// Its disk failed; the broker stopped itself.
    DiskFailed,
}

enum Heal {
    Restart(usize),
    Release(String, String),
    Repair(String, String),
    /// End a host's pause: its client links flow again and it runs its lease check.
    Resume(usize),
    /// A host reaches the storage again.
    Reconnect(usize),
}

type SimResult = Result<(), Box<dyn std::error::Error>>;

/// Runs one simulation.
pub fn run(cfg: &SimConfig) -> Outcome {
    // The engine's maps iterate in an order fixed by this seed (see haven_engine::hash).
    haven_engine::hash::set_seed(cfg.seed);
    crate::panics::watch();
    let brokers = cfg.mode.brokers();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let total_ms = cfg.fault_ms + cfg.heal_ms_max + SIM_SLACK_MS;
    let mut sim = turmoil::Builder::new()
        .rng_seed(cfg.seed)
        // Fixed wall-clock start (2026-01-01): turmoil's default is the real time now, which
        // leaks into broker boot ids, connection ids and so into map iteration order.
        .epoch(std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600))
        .simulation_duration(Duration::from_millis(total_ms))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(10))
        .build();
    let trace = Trace::default();
    let history = Arc::new(History::new());
    let shared = cfg.mode == Mode::SharedStore;
    // One disk per broker, or the one disk all brokers share.
    let disks: Vec<SimDisk> = (0..if shared { 1 } else { brokers })
        .map(|i| {
            let name = if shared {
                "shared".to_string()
            } else {
                broker_name(i)
            };
            let disk = SimDisk::new(&name, cfg.seed.wrapping_add(1 + i as u64));
            if cfg.lying_disk {
                disk.lie_about_syncs();
            }
            if !cfg.store_fencing {
                disk.disable_fencing();
            }
            disk
        })
        .collect();
    let clocks: Vec<SimClock> = (0..brokers).map(|_| SimClock::default()).collect();
    let lease = SimLease::new(disks[0].clone(), brokers, LeaseTimes::SIM);
    let roles = Roles::new(brokers);
    for i in 0..brokers {
        let clock = clocks[i].clone();
        let trace = trace.clone();
        let name = broker_name(i);
        if shared {
            let (disk, lease, roles) = (disks[0].clone(), lease.clone(), roles.clone());
            sim.host(broker_name(i), move || {
                let store = SimSharedStore {
                    lease: lease.clone(),
                    disk: disk.clone(),
                    host: i,
                };
                let (clock, roles) = (clock.clone(), roles.clone());
                async move {
                    serve_shared(broker_config(), store, clock, roles).await?;
                    Ok(())
                }
            });
            continue;
        }
        let disk = disks[i].clone();
        sim.host(broker_name(i), move || {
            let (disk, clock, trace, name) =
                (disk.clone(), clock.clone(), trace.clone(), name.clone());
            async move {
                let env = Env {
                    network: Arc::new(SimNetwork),
                    clock: Arc::new(clock),
                    log: disk.store(),
                    store_id: format!("sim-{name}"),
                    lost: None,
                };
                let server = Server::start_with(broker_config(), env).await?;
                trace.add(format_args!("{name} serving"));
                match server.wait().await {
                    Ok(()) => Ok(()),
                    Err(e) if disk.stats().sync_failures > 0 => {
                        // Expected: an injected fsync failure stops the broker. It stays down
                        // until the run restarts it.
                        trace.add(format_args!("{name} stopped: {e}"));
                        std::future::pending::<()>().await;
                        Ok(())
                    }
                    Err(e) => Err(e.into()),
                }
            }
        });
    }
    let uri = failover_uri(brokers);
    let producers_done = Arc::new(AtomicUsize::new(0));
    let producers_forgotten = Arc::new(AtomicU64::new(0));
    for p in 0..cfg.producers {
        let (history, trace, done, uri) = (
            history.clone(),
            trace.clone(),
            producers_done.clone(),
            uri.clone(),
        );
        let forgotten_total = producers_forgotten.clone();
        let opts = client_options(cfg.seed ^ (0x100 + p as u64), Some(format!("sim-p{p}")));
        let (n, fault_ms) = (cfg.messages_per_producer, cfg.fault_ms);
        // Only a disk that loses synced writes may make a store forget a producer it receipted.
        let honest_disk = !cfg.lying_disk;
        // Producer 0 waits for each RECEIPT; producer 1 pipelines (up to the client's window
        // unconfirmed), so a crash catches many SENDs in flight that must be sent again;
        // producer 2 sends in transactions of `TX_SENDS`, whose COMMIT must be settled
        // across a failover (committed, or reported rolled back and never delivered).
        let kind = p % 3;
        let pipelined = kind == 1;
        sim.client(format!("producer{p}"), async move {
            let client = Client::connect(&uri, opts)
                .await
                .map_err(|e| format!("producer{p} connect: {e}"))?;
            let mut unconfirmed = Vec::new();
            let mut k = 0;
            // At least `n` messages, and on through the whole fault phase.
            while k < n || turmoil::sim_elapsed().is_some_and(|t| t.as_millis() < fault_ms as u128)
            {
                if kind == 2 {
                    let ids: Vec<String> = (k + 1..=k + TX_SENDS)
                        .map(|i| format!("p{p}-{i}"))
                        .collect();
                    k += TX_SENDS;
                    transact(&client, &format!("p{p}-tx{k}"), &ids, &history, &trace).await;
                    tokio::time::sleep(Duration::from_millis(SEND_PAUSE_MS)).await;
                    continue;
                }
                k += 1;
                let id = format!("p{p}-{k}");
                history.attempted(&id);
                if pipelined {
                    client
                        .send(QUEUE, &[], id.clone())
                        .await
                        .map_err(|e| format!("producer{p} send {id}: {e}"))?;
                    unconfirmed.push(id);
                    if k % PIPELINE_BATCH == 0 {
                        tokio::time::sleep(Duration::from_millis(SEND_PAUSE_MS)).await;
                    }
                    continue;
                }
                tokio::time::sleep(Duration::from_millis(SEND_PAUSE_MS)).await;
                match client.send_receipted(QUEUE, &[], id.clone()).await {
                    Ok(()) => {
                        history.outcome(&id, SendOutcome::Receipted);
                        trace.add(format_args!("receipt {id}"));
                    }
                    Err(ClientError::Server { message, .. }) => {
                        history.outcome(&id, SendOutcome::Failed);
                        trace.add(format_args!("refused {id}: {message}"));
                    }
                    Err(e) => {
                        history.outcome(&id, SendOutcome::Unknown);
                        trace.add(format_args!("unknown {id}: {e}"));
                    }
                }
            }
            // Returns once every tracked SEND is confirmed, across failovers.
            client
                .disconnect()
                .await
                .map_err(|e| format!("producer{p} disconnect: {e}"))?;
            let forgotten = client.stats().producer_forgotten;
            forgotten_total.fetch_add(forgotten, Ordering::SeqCst);
            if forgotten > 0 && honest_disk {
                return Err(format!(
                    "producer{p}: a store with an honest disk forgot this producer {forgotten} \
                     time(s) (ConnectionEvent::ProducerForgotten)"
                )
                .into());
            }
            for id in &unconfirmed {
                history.outcome(id, SendOutcome::Receipted);
            }
            trace.add(format_args!(
                "producer{p} confirmed {} pipelined",
                unconfirmed.len()
            ));
            done.fetch_add(1, Ordering::SeqCst);
            trace.add(format_args!("producer{p} done"));
            Ok(())
        });
    }
    {
        let (history, trace, done) = (history.clone(), trace.clone(), producers_done.clone());
        let producers = cfg.producers;
        let opts = client_options(cfg.seed ^ 0x200, None);
        let mode = cfg.mode;
        sim.client("consumer", async move {
            let all_sent = || done.load(Ordering::SeqCst) == producers;
            match mode {
                // One store: exactly once, whichever broker serves it.
                Mode::ExactlyOnce | Mode::SharedStore => {
                    consume(&uri, opts, &history, &trace, || {
                        all_sent() && history.missing() == 0
                    })
                    .await?
                }
                Mode::Standalone => {
                    consume(&uri, opts, &history, &trace, all_sent).await?;
                    // Separate stores: what a broker stored while the consumer was elsewhere
                    // is still there. Drain each one directly until nothing is owed.
                    let mut round = 0u64;
                    while history.missing() > 0 {
                        for i in 0..brokers {
                            let url = format!("tcp://{}:{PORT}", broker_name(i));
                            let opts = client_options(0x300 + round * 16 + i as u64, None);
                            if let Err(e) = consume(&url, opts, &history, &trace, || true).await {
                                trace.add(format_args!("drain of {url} failed: {e}"));
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                        }
                        round += 1;
                    }
                }
            }
            trace.add("consumer done");
            Ok(())
        });
    }

    let mut faults = FaultCounts::default();
    let mut states = vec![BrokerState::Up; brokers];
    let mut heals: Vec<(u64, Heal)> = Vec::new();
    let mut next_fault_ms = rng.gen_range(300..1_500);
    let mut healing = false;
    let mut liveness = None;
    let mut violations = Vec::new();
    // Shared-store mode: the first master of a double kill; its successor dies as it serves.
    let mut kill_next: Option<usize> = None;
    let mut storage_cut = vec![false; brokers];
    let clients: Vec<String> = (0..cfg.producers)
        .map(|p| format!("producer{p}"))
        .chain(std::iter::once("consumer".to_string()))
        .collect();
    let mut step = 0u64;
    let sim_ms = loop {
        let finished = match sim.step() {
            Ok(f) => f,
            Err(e) => {
                liveness = Some(format!("a simulated process failed: {e}"));
                break sim.elapsed().as_millis() as u64;
            }
        };
        step += 1;
        let now = sim.elapsed().as_millis() as u64;
        for line in roles.changes() {
            trace.add_at(now, line);
        }
        // The invariants, after every step.
        if let Some(v) = check_step(&disks, shared.then_some((&roles, &lease))) {
            violations.push(format!("step {step} ({now} simulated ms): {v}"));
            break now;
        }
        if finished {
            break now;
        }
        // Heals that are due (all of them once the fault phase is over).
        let mut i = 0;
        while i < heals.len() {
            if healing || heals[i].0 <= now {
                let (_, heal) = heals.swap_remove(i);
                match heal {
                    Heal::Restart(b) => {
                        trace.add_at(now, format_args!("restart {}", broker_name(b)));
                        sim.bounce(broker_name(b));
                        states[b] = BrokerState::Up;
                    }
                    Heal::Release(a, b) => {
                        trace.add_at(now, format_args!("release {a} <-> {b}"));
                        sim.release(a.as_str(), b.as_str());
                    }
                    Heal::Repair(a, b) => {
                        trace.add_at(now, format_args!("repair {a} <-> {b}"));
                        sim.repair(a.as_str(), b.as_str());
                    }
                    Heal::Resume(b) => {
                        trace.add_at(now, format_args!("resume {}", broker_name(b)));
                        for c in &clients {
                            sim.release(c.as_str(), broker_name(b).as_str());
                        }
                        lease.set_paused(b, false);
                        disks[0].reconnect(b);
                    }
                    Heal::Reconnect(b) => {
                        trace.add_at(now, format_args!("storage reaches {}", broker_name(b)));
                        storage_cut[b] = false;
                        disks[0].reconnect(b);
                    }
                }
            } else {
                i += 1;
            }
        }
        if !healing && now >= cfg.fault_ms {
            healing = true;
            kill_next = None;
            trace.add_at(now, "healing");
        }
        // The second kill of a double kill: the successor, as soon as it serves.
        if let Some(first) = kill_next {
            if let Some((b, epoch)) = newest_master(&roles).filter(|(b, _)| *b != first) {
                kill_next = None;
                if states[b] == BrokerState::Up {
                    faults.crashes += 1;
                    trace.add_at(
                        now,
                        format_args!("crash {} (its successor, epoch {epoch})", broker_name(b)),
                    );
                    crash_shared(&mut sim, &lease, &roles, b);
                    states[b] = BrokerState::Crashed;
                    heals.push((now + rng.gen_range(100..4_000), Heal::Restart(b)));
                }
            }
        }
        if !healing && now >= next_fault_ms {
            next_fault_ms = now + rng.gen_range(200..2_500);
            let client = clients[rng.gen_range(0..clients.len())].clone();
            let heal_at = now + rng.gen_range(100..4_000);
            if shared {
                // Most faults aim at the master, where they matter; else at a random host.
                let b = match newest_master(&roles) {
                    Some((m, _)) if rng.gen_range(0..100) < SHARED_FAULTS_AT_MASTER_PERCENT => m,
                    _ => rng.gen_range(0..brokers),
                };
                let broker = broker_name(b);
                match rng.gen_range(0..100) {
                    0..=29 if states[b] == BrokerState::Up => {
                        faults.crashes += 1;
                        trace.add_at(now, format_args!("crash {broker}"));
                        crash_shared(&mut sim, &lease, &roles, b);
                        states[b] = BrokerState::Crashed;
                        heals.push((heal_at, Heal::Restart(b)));
                    }
                    30..=39 if states[b] == BrokerState::Up && kill_next.is_none() => {
                        faults.crashes += 1;
                        faults.double_kills += 1;
                        trace.add_at(now, format_args!("crash {broker} (double kill)"));
                        crash_shared(&mut sim, &lease, &roles, b);
                        states[b] = BrokerState::Crashed;
                        heals.push((heal_at, Heal::Restart(b)));
                        kill_next = Some(b);
                    }
                    40..=54 if !lease.paused(b) => {
                        faults.pauses += 1;
                        let until = now + rng.gen_range(PAUSE_MS_MIN..PAUSE_MS_MAX);
                        trace.add_at(now, format_args!("pause {broker} until {until}"));
                        for c in &clients {
                            sim.hold(c.as_str(), broker.as_str());
                        }
                        lease.set_paused(b, true);
                        // Its writes in flight stall with it.
                        disks[0].cut_off(b);
                        heals.push((until, Heal::Resume(b)));
                    }
                    55..=66 if !storage_cut[b] => {
                        faults.storage_cuts += 1;
                        let until = now + rng.gen_range(STORAGE_CUT_MS_MIN..STORAGE_CUT_MS_MAX);
                        trace.add_at(now, format_args!("cut {broker} from storage until {until}"));
                        storage_cut[b] = true;
                        disks[0].cut_off(b);
                        heals.push((until, Heal::Reconnect(b)));
                    }
                    67..=77 => {
                        faults.holds += 1;
                        trace.add_at(now, format_args!("hold {client} <-> {broker}"));
                        sim.hold(client.as_str(), broker.as_str());
                        heals.push((heal_at, Heal::Release(client, broker)));
                    }
                    78..=89 => {
                        faults.partitions += 1;
                        trace.add_at(now, format_args!("partition {client} <-> {broker}"));
                        sim.partition(client.as_str(), broker.as_str());
                        heals.push((heal_at, Heal::Repair(client, broker)));
                    }
                    90..=99 => {
                        faults.clock_jumps += 1;
                        let delta = rng.gen_range(-3_600_000i64..=3_600_000);
                        trace.add_at(now, format_args!("clock {broker} {delta:+} ms"));
                        clocks[b].jump(delta);
                    }
                    _ => {}
                }
            } else {
                let b = rng.gen_range(0..brokers);
                let broker = broker_name(b);
                match rng.gen_range(0..100) {
                    0..=34 if states[b] == BrokerState::Up => {
                        faults.crashes += 1;
                        trace.add_at(now, format_args!("crash {broker}"));
                        sim.crash(broker.as_str());
                        states[b] = BrokerState::Crashed;
                        heals.push((heal_at, Heal::Restart(b)));
                    }
                    35..=59 => {
                        faults.holds += 1;
                        trace.add_at(now, format_args!("hold {client} <-> {broker}"));
                        sim.hold(client.as_str(), broker.as_str());
                        heals.push((heal_at, Heal::Release(client, broker)));
                    }
                    60..=79 => {
                        faults.partitions += 1;
                        trace.add_at(now, format_args!("partition {client} <-> {broker}"));
                        sim.partition(client.as_str(), broker.as_str());
                        heals.push((heal_at, Heal::Repair(client, broker)));
                    }
                    80..=91 => {
                        faults.clock_jumps += 1;
                        let delta = rng.gen_range(-3_600_000i64..=3_600_000);
                        trace.add_at(now, format_args!("clock {broker} {delta:+} ms"));
                        clocks[b].jump(delta);
                    }
                    92..=99 if states[b] == BrokerState::Up => {
                        faults.disk_failures += 1;
                        trace.add_at(now, format_args!("disk failure {broker}"));
                        disks[b].fail_syncs();
                        states[b] = BrokerState::DiskFailed;
                        heals.push((heal_at, Heal::Restart(b)));
                    }
                    _ => {}
                }
            }
        }
        if healing && now > cfg.fault_ms + cfg.heal_ms_max {
            liveness = Some(format!(
                "not finished {} ms after healing: {} receipted messages not delivered, {} of {} \
                 producers done",
                cfg.heal_ms_max,
                history.missing(),
                producers_done.load(Ordering::SeqCst),
                cfg.producers
            ));
            break now;
        }
    };
    // Release the simulation (and every task in it) before reading the shared state.
    drop(sim);
    let duplicates = match cfg.mode {
        Mode::ExactlyOnce | Mode::SharedStore => Duplicates::Forbidden,
        Mode::Standalone => Duplicates::Counted,
    };
    let disk_stats: Vec<DiskStats> = disks.iter().map(SimDisk::stats).collect();
    let shared_stats = shared.then(|| {
        let (renewals, expired_takeovers) = lease.counts();
        SharedStats {
            masters: lease.grants().len() as u64,
            renewals,
            expired_takeovers,
            refused_writes: disk_stats[0].refused_writes,
            stale_records: disk_stats[0].stale_records,
        }
    });
    let report = history.check(duplicates, cfg.mode != Mode::Standalone);
    for p in crate::panics::seen() {
        violations.push(format!("a simulated process panicked: {p}"));
    }
    let lines = trace.lines();
    let mut digest = 0u32;
    for l in &lines {
        digest = crc32c::crc32c_append(digest, l.as_bytes());
        digest = crc32c::crc32c_append(digest, b"\n");
    }
    Outcome {
        seed: cfg.seed,
        mode: cfg.mode,
        report,
        faults,
        liveness,
        sim_ms,
        disks: disk_stats,
        violations,
        producers_forgotten: producers_forgotten.load(Ordering::SeqCst),
        shared: shared_stats,
        trace_digest: digest,
        trace: lines,
    }
}

/// The per-step invariants: the store's (record order, fencing, durability; see
/// `SimDisk::check_step`) and, in the shared-store mode, at most one broker serving per
/// epoch, each only an epoch granted to it. The first one broken, if any.
fn check_step(disks: &[SimDisk], shared: Option<(&Roles, &SimLease)>) -> Option<String> {
    for disk in disks {
        if let Some(v) = disk.check_step().into_iter().next() {
            return Some(v);
        }
    }
    let (roles, lease) = shared?;
    let serving = roles.serving();
    for (i, &(host, epoch)) in serving.iter().enumerate() {
        if let Some((other, _)) = serving[i + 1..].iter().find(|(_, e)| *e == epoch) {
            return Some(format!(
                "two brokers serve epoch {epoch}: broker{host} and broker{other}"
            ));
        }
        if lease.granted_to(epoch) != Some(host) {
            return Some(format!(
                "broker{host} serves epoch {epoch}, which was granted to {:?}",
                lease.granted_to(epoch).map(broker_name)
            ));
        }
    }
    None
}

/// The serving broker with the newest epoch: the master, unless a newer one has been granted
/// and not started serving yet (then a deposed one that has not noticed).
fn newest_master(roles: &Roles) -> Option<(usize, u64)> {
    roles.serving().into_iter().max_by_key(|&(_, epoch)| epoch)
}

/// Crashes a shared-store host: its tasks die, its storage session (and lease) ends.
fn crash_shared(sim: &mut turmoil::Sim<'_>, lease: &SimLease, roles: &Roles, host: usize) {
    sim.crash(broker_name(host).as_str());
    lease.host_crashed(host);
    roles.down(host);
}

/// One transaction of `ids`: BEGIN, a SEND each, COMMIT. All receipted if the COMMIT is
/// confirmed; all failed if the client reports it rolled back (a failover took it); unknown
/// otherwise.
async fn transact(client: &Client, tx: &str, ids: &[String], history: &History, trace: &Trace) {
    for id in ids {
        history.attempted(id);
    }
    let settle = |outcome: SendOutcome, why: &str| {
        for id in ids {
            history.outcome(id, outcome);
        }
        trace.add(format_args!("{tx} {outcome:?}: {why}"));
    };
    if let Err(e) = client.begin(tx).await {
        settle(SendOutcome::Failed, &format!("begin: {e}"));
        return;
    }
    for id in ids {
        if let Err(e) = client.send(QUEUE, &[("transaction", tx)], id.clone()).await {
            // The transaction is gone with its connection (or refused): nothing of it commits.
            let _ = client.abort(tx).await;
            settle(SendOutcome::Failed, &format!("send {id}: {e}"));
            return;
        }
    }
    match client.commit(tx).await {
        Ok(()) => settle(SendOutcome::Receipted, "committed"),
        Err(e @ ClientError::TransactionRolledBack { .. }) => {
            settle(SendOutcome::Failed, &e.to_string())
        }
        Err(e) => settle(SendOutcome::Unknown, &e.to_string()),
    }
}

/// Consumes `QUEUE` over `uri` until the queue is quiet and `done()` says so.
async fn consume(
    uri: &str,
    opts: ConnectOptions,
    history: &History,
    trace: &Trace,
    done: impl Fn() -> bool,
) -> SimResult {
    let client = Client::connect(uri, opts)
        .await
        .map_err(|e| format!("consumer connect to {uri}: {e}"))?;
    let mut sub = client
        .subscribe(QUEUE, AckMode::ClientIndividual, &[("id", "sim")])
        .await
        .map_err(|e| format!("consumer subscribe: {e}"))?;
    loop {
        match tokio::time::timeout(Duration::from_millis(CONSUMER_QUIET_MS), sub.next()).await {
            Ok(Some(msg)) => {
                let id = String::from_utf8_lossy(&msg.body).into_owned();
                history.delivered(&id, msg.redelivered);
                trace.add(format_args!("deliver {id} redelivered={}", msg.redelivered));
                client
                    .ack(&msg)
                    .await
                    .map_err(|e| format!("consumer ack of {id}: {e}"))?;
                history.acked(&id);
            }
            Ok(None) => {
                return Err(format!("subscription ended: {:?}", client.close_reason()).into())
            }
            Err(_) if done() => break,
            Err(_) => {}
        }
    }
    // Everything it received is acked; a DISCONNECT that finds the broker gone is harmless.
    if let Err(e) = client.disconnect().await {
        trace.add(format_args!("consumer disconnect: {e}"));
    }
    Ok(())
}
