//! The standalone broker: listeners, connections and the core task that ties the engine to
//! the journal. `Server::start` recovers the journal, then serves STOMP until `shutdown`.

mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
mod connection;
mod core;
mod error;
pub mod ha;
mod idle;
mod loader;
mod lock;
pub mod log;
pub mod net;
pub mod network;
mod send_window;
mod shared_fs;
mod store_id;

pub use clock::{Clock, SystemClock};
pub use cluster::{ClusterChange, ClusterError, ClusterHandle};
pub use config::{ClusterConfig, Config, HaConfig, HaMember, HaMode};
pub use loader::JournalLoader;

/// Takes the data directory's lock without waiting, for a mode that runs its own store in it
/// (replication): one broker process per data directory. Held while the value lives.
pub fn lock_data_dir(dir: &std::path::Path) -> Result<Box<dyn Send + Sync>, ServerError> {
    std::fs::create_dir_all(dir).map_err(|e| ServerError::DataDir {
        dir: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(Box::new(lock::DirLock::acquire(dir)?))
}
pub use error::ServerError;
pub use ha::{run_shared, run_shared_with, Edges, Mastership, Role, SharedStore};
pub use idle::set_idle_hook;
pub use log::{DurableLog, LeadershipCheck, LogStore, OnRecord};
pub use net::{Accepted, Listener, Network, TcpNetwork};
pub use shared_fs::SharedFsStore;

use crate::connection::Shared;
use crate::core::Core;
use haven_engine::{
    Destination, DestinationLimits, DlqPolicy, Engine, EngineConfig, Record, RedeliveryPolicy,
};
use haven_journal::JournalConfig;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Commands queued to the core before connections wait (backpressure on producers).
const CORE_QUEUE_COMMANDS_MAX: usize = 16_384;

/// How long an orderly shutdown waits for connections to write their last answers.
const SHUTDOWN_DRAIN_MAX: Duration = Duration::from_secs(5);

pub struct Server {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    core: JoinHandle<Result<(), ServerError>>,
    accept: JoinHandle<()>,
    /// Connections being served; shutdown waits for them to write their last answers.
    open: Arc<AtomicUsize>,
    cluster: ClusterHandle,
    /// The network connectors' bridges; they stop when the broker does.
    network: network::Network,
    /// What connections share (the in-process tests of `network::local` connect through it).
    #[cfg_attr(not(test), allow(dead_code))]
    shared: Arc<Shared>,
    /// Held while the broker runs on a local data directory.
    _lock: Option<lock::DirLock>,
}

/// The edges a broker runs over (see `Server::start_with`).
pub struct Env {
    pub network: Arc<dyn Network>,
    pub clock: Arc<dyn Clock>,
    pub log: Box<dyn LogStore>,
    /// Announced as `haven-store` in CONNECTED: names the store message ids are unique in.
    pub store_id: String,
    /// Shared-store modes: becomes `Some(reason)` when this broker may no longer write to the
    /// store (lock lost, newer epoch, lease expired); the broker stops at once.
    pub lost: Option<watch::Receiver<Option<String>>>,
}

fn engine_config(c: &Config, boot_id: u64, record_bytes_max: usize) -> EngineConfig {
    let d = &c.delivery;
    EngineConfig {
        redeliveries_max: d.redeliveries_max,
        dlq: match d.dlq {
            config::DlqMode::Shared => DlqPolicy::Shared(d.dlq_name.clone()),
            config::DlqMode::PerDestination => DlqPolicy::PerDestination {
                prefix: d.dlq_prefix.clone(),
            },
        },
        expired_to_dlq: d.expired_to_dlq,
        redelivery_delay_initial_ms: d.redelivery_delay_initial_ms,
        redelivery_backoff_multiplier: d.redelivery_backoff_multiplier,
        redelivery_delay_max_ms: d.redelivery_delay_max_ms,
        redelivery_policies: d
            .redelivery_policy
            .iter()
            .map(|p| RedeliveryPolicy {
                destination: pattern_destination(&p.destination),
                redeliveries_max: p.redeliveries_max.unwrap_or(d.redeliveries_max),
                delay_initial_ms: p
                    .redelivery_delay_initial_ms
                    .unwrap_or(d.redelivery_delay_initial_ms),
                backoff_multiplier: p
                    .redelivery_backoff_multiplier
                    .unwrap_or(d.redelivery_backoff_multiplier),
                delay_max_ms: p
                    .redelivery_delay_max_ms
                    .unwrap_or(d.redelivery_delay_max_ms),
            })
            .collect(),
        prefetch_default: d.prefetch_default,
        prefetch_max: d.prefetch_max,
        prefetch_bytes_max: d.prefetch_bytes_max,
        transaction_ops_max: c.limits.transaction_ops_max,
        // A commit is one record: it must fit in a journal record.
        transaction_bytes_max: record_bytes_max.saturating_sub(64 * 1024).max(1024),
        transactions_per_connection_max: c.limits.transactions_per_connection_max,
        subscriptions_per_connection_max: c.limits.subscriptions_per_connection_max,
        topic_subscriber_pending_max: d.topic_subscriber_pending_max,
        record_bytes_max,
        browse_messages_max: d.browse_messages_max,
        boot_id,
        memory_bytes_max: c.limits.memory_bytes_max,
        destination_limits: c
            .limits
            .destination
            .iter()
            .map(|l| DestinationLimits {
                destination: pattern_destination(&l.destination),
                memory_bytes_max: l.memory_bytes_max,
                messages_max: l.messages_max,
                bytes_max: l.bytes_max,
            })
            .collect(),
        scheduled_messages_max: c.limits.scheduled_messages_max,
        producer_idle_ms_max: c.limits.producer_idle_ms_max,
        producers_max: c.limits.producers_max,
        network_origins_max: c.limits.network_origins_max,
        network_origin_idle_ms_max: c.limits.network_origin_idle_ms_max,
    }
}

/// A validated `/queue/...` or `/topic/...` pattern from the config file.
fn pattern_destination(text: &str) -> Destination {
    match text.strip_prefix("/queue/") {
        Some(name) => Destination::Queue(name.to_string()),
        None => Destination::Topic(text.trim_start_matches("/topic/").to_string()),
    }
}

impl Server {
    /// Recovers the journal and starts listening. Returns once clients can connect.
    pub async fn start(config: Config) -> Result<Server, ServerError> {
        Server::start_inner(config, None).await
    }

    /// Like `start`, with a journal whose writes and fsyncs a test can make fail.
    #[cfg(feature = "fault-injection")]
    pub async fn start_with_faults(
        config: Config,
        faults: Arc<haven_journal::Faults>,
    ) -> Result<Server, ServerError> {
        Server::start_inner(config, Some(faults)).await
    }

    async fn start_inner(
        config: Config,
        faults: Option<Arc<Faults>>,
    ) -> Result<Server, ServerError> {
        config.validate(std::path::Path::new("<flags>"))?;
        let dir = config.journal.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| ServerError::DataDir {
            dir: dir.clone(),
            reason: e.to_string(),
        })?;
        let lock = lock::DirLock::acquire(&dir)?;
        let store_id = store_id::load_or_create(&dir)?;
        let mut jcfg = JournalConfig::new(dir.clone());
        // A directory a shared-fs group used before: carry on at its last epoch (the lock
        // above keeps the group's brokers out while this one runs).
        jcfg.epoch = shared_fs::current_epoch(&dir)?;
        jcfg.segment_bytes = config.journal.segment_bytes;
        jcfg.batch_bytes_max = config.journal.batch_bytes_max;
        jcfg.slow_sync_warn_ms = config.journal.slow_sync_warn_ms;
        let env = Env {
            network: Arc::new(net::TcpNetwork),
            clock: Arc::new(clock::SystemClock),
            log: Box::new(log::JournalStore {
                config: jcfg,
                faults,
            }),
            store_id,
            lost: None,
        };
        let mut server = Server::start_with(config, env).await?;
        server._lock = Some(lock);
        Ok(server)
    }

    /// Starts a broker over the given edges: how it listens, what time it is, and the durable
    /// log it recovers from and appends to. `start` uses TCP, the system clock and the local
    /// journal; the deterministic simulation passes simulated ones. Validates `config` first.
    pub async fn start_with(config: Config, env: Env) -> Result<Server, ServerError> {
        config.validate(std::path::Path::new("<flags>"))?;
        let Env {
            network,
            clock,
            log,
            store_id,
            lost,
        } = env;
        let boot_id = clock.now_ms();
        let record_bytes_max = log.record_bytes_max();
        let leadership = log.leadership_check();
        let mut engine = Engine::new(engine_config(&config, boot_id, record_bytes_max));
        engine.set_loader(log.loader());
        let started = tokio::time::Instant::now();
        let mut records = 0u64;
        let where_ = log.describe();
        let replay = |engine: &mut Engine, records: &mut u64| {
            let mut on_record = |lsn, payload: &[u8]| {
                *records += 1;
                let record = Record::decode(payload).map_err(|e| format!("lsn {lsn}: {e}"))?;
                engine.replay(lsn, record)
            };
            log.open(&mut on_record)
        };
        // Recovery reads files: off the async threads where the runtime has more than one.
        let journal = match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => replay(&mut engine, &mut records),
            _ => tokio::task::block_in_place(|| replay(&mut engine, &mut records)),
        }?;
        engine.finish_recovery().map_err(ServerError::Recovery)?;
        let messages: usize = engine.queue_stats().iter().map(|q| q.ready).sum();
        tracing::info!(
            records,
            messages,
            durable_objects = engine.live_count(),
            producers = engine.producer_stats().producers,
            ms = started.elapsed().as_millis() as u64,
            log = %where_,
            "journal recovered"
        );
        let listener =
            network
                .bind(config.stomp.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: config.stomp.listen,
                    source,
                })?;
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.stomp.listen,
            source,
        })?;
        let (core_tx, core_rx) = mpsc::channel(CORE_QUEUE_COMMANDS_MAX);
        let (stop_tx, stop_rx) = watch::channel(false);
        let maintenance = Duration::from_millis(config.journal.maintenance_interval_ms);
        let limits = core::CoreLimits {
            compaction_records_max: config.journal.compaction_records_max,
            producer_wait_ms_max: config.limits.producer_wait_ms_max,
            disk_bytes_max: config.limits.disk_bytes_max,
            disk_free_bytes_min: config.limits.disk_free_bytes_min,
            memory_bytes_max: config.limits.memory_bytes_max,
        };
        let core = Core::new(engine, journal, limits, clock, lost);
        let core = tokio::spawn(core.run(core_rx, stop_rx.clone(), maintenance));
        let cluster = ClusterHandle::new(config.cluster.clone());
        let shared = Arc::new(Shared {
            users: auth::Users::new(config.users.clone()),
            cluster: cluster.clone(),
            config,
            core: core_tx,
            store_id,
            next_conn: AtomicU64::new(boot_id << 20),
            leadership,
        });
        let network = match network::start(&shared) {
            Ok(n) => n,
            Err(e) => {
                core.abort();
                return Err(ServerError::BridgeThread(e));
            }
        };
        let open = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), stop_rx, open.clone()));
        tracing::info!(stomp = %local_addr, "haven listening");
        Ok(Server {
            local_addr,
            stop: stop_tx,
            core,
            accept,
            open,
            cluster,
            network,
            shared,
            _lock: None,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Runs until the core stops: after `shutdown`, or at once if the journal fails.
    pub async fn wait(self) -> Result<(), ServerError> {
        let result = match self.core.await {
            Ok(r) => r,
            Err(e) => Err(ServerError::JournalFailed(format!(
                "core task panicked: {e}"
            ))),
        };
        self.accept.abort();
        drop(self.network);
        if result.is_ok() {
            // The core has told every connection what completed and to close; give them a
            // bounded time to write it.
            let deadline = tokio::time::Instant::now() + SHUTDOWN_DRAIN_MAX;
            while self.open.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        result
    }

    /// Stops accepting, makes everything appended durable, answers what completed.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        let _ = self.stop.send(true);
        self.wait().await
    }

    /// The cluster settings clients are told about; `set_cluster` on it announces a change to
    /// every connected client that asked for updates (SIGHUP in `haven run`, later Raft).
    pub fn cluster_handle(&self) -> ClusterHandle {
        self.cluster.clone()
    }

    /// A handle that stops the server from elsewhere (signal handlers).
    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }
}

#[cfg(feature = "fault-injection")]
type Faults = haven_journal::Faults;
/// Without the feature there are no faults to inject.
#[cfg(not(feature = "fault-injection"))]
enum Faults {}

async fn accept_loop(
    mut listener: Box<dyn Listener>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    open: Arc<AtomicUsize>,
) {
    let max = shared.config.stomp.connections_max;
    loop {
        // Stop first: a flood of connections must not keep the broker from stopping.
        let accepted = tokio::select! {
            biased;
            _ = stop.changed() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.load(Ordering::Relaxed) >= max {
            tracing::warn!(peer = %stream.peer, max, "connection refused: connections_max reached");
            tokio::spawn(connection::refuse(stream, "too many connections"));
            continue;
        }
        open.fetch_add(1, Ordering::Relaxed);
        let conn = shared.next_conn_id();
        let shared = shared.clone();
        let open = open.clone();
        tokio::spawn(async move {
            connection::serve(stream, conn, shared).await;
            open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}
