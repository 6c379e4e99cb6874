//! `haven.toml`: every setting has a default, an unknown key or a bad value stops start-up
//! with the file, the key and the reason. The commented example is `examples/haven.toml`.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub broker: BrokerConfig,
    pub stomp: StompConfig,
    pub journal: JournalSettings,
    pub delivery: DeliveryConfig,
    pub limits: LimitsConfig,
    pub users: Vec<User>,
    pub cluster: ClusterConfig,
    pub ha: HaConfig,
    /// `[[network]]`: connectors to other brokers (docs/NETWORK.md).
    pub network: Vec<NetworkConnector>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// In logs, and announced in CONNECTED as `haven-broker`. In a network of brokers it
    /// names this broker (or HA group) in broker paths, so it must be unique there.
    pub name: String,
    /// A SEND without a `persistent` header is persistent. ActiveMQ's default is the opposite;
    /// set false for applications that rely on it.
    pub default_persistent: bool,
    /// Threads that run connections (parsing, encoding, socket I/O) and the broker's core;
    /// 0 = automatic (see `Config::worker_threads_effective`).
    pub worker_threads: usize,
}

/// Most worker threads `broker.worker_threads` may ask for.
pub const WORKER_THREADS_MAX: usize = 1024;

impl Config {
    /// The worker threads to start for `broker.worker_threads` on a machine with `cores`.
    /// The core (the engine) is one task and the journal writer has its own thread, so
    /// workers beyond it buy parallel parsing and encoding at the price of wake-ups between
    /// threads; leaving a core to the writer measured best (docs/PERFORMANCE.md, "Worker
    /// threads"). A replicated member also runs Raft's tasks (appends to and from its peers,
    /// applying the log) beside the core: there one worker per core measured best.
    pub fn worker_threads_effective(&self, cores: usize) -> usize {
        match (self.broker.worker_threads, self.ha.mode) {
            (0, HaMode::Replicated) => cores.max(1),
            (0, _) => cores.saturating_sub(1).max(1),
            (n, _) => n,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StompConfig {
    pub listen: SocketAddr,
    pub connections_max: usize,
    pub frame_bytes_max: usize,
    pub header_count_max: usize,
    pub header_bytes_max: usize,
    /// The shortest interval at which the broker sends heart-beats to a client that asks for
    /// them (0 = never). Low by default: heart-beats cost nothing, and a client (a network
    /// bridge, a failover client) can only notice a silent broker as fast as this allows.
    pub heartbeat_send_ms: u64,
    /// How often the broker asks clients to send heart-beats (0 = never). A client silent for
    /// twice the negotiated interval is disconnected.
    pub heartbeat_receive_ms: u64,
    /// A connection that has not sent CONNECT within this time is closed.
    pub connect_timeout_ms: u64,
    /// A write to a client's socket that makes no progress for this long closes the
    /// connection, so a client that stops reading does not hold its messages for ever.
    pub write_timeout_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalSettings {
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub batch_bytes_max: usize,
    /// How often compaction and segment deletion run.
    pub maintenance_interval_ms: u64,
    /// Live records re-logged per maintenance round at most, so compaction never stalls traffic.
    pub compaction_records_max: usize,
    /// A journal fdatasync this slow or slower is logged as a warning.
    pub slow_sync_warn_ms: u64,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DlqMode {
    Shared,
    PerDestination,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    pub redeliveries_max: u32,
    /// Wait before redelivering a message whose delivery failed (NACK, consumer gone), in ms;
    /// 0 redelivers at once.
    pub redelivery_delay_initial_ms: u64,
    /// Each further failure multiplies the delay (1.0 = constant; ActiveMQ's exponential
    /// back-off uses 5).
    pub redelivery_backoff_multiplier: f64,
    /// Cap on the delay, in ms.
    pub redelivery_delay_max_ms: u64,
    /// Per-destination redelivery settings (`[[delivery.redelivery_policy]]`), first match wins.
    pub redelivery_policy: Vec<RedeliveryPolicyConfig>,
    pub dlq: DlqMode,
    pub dlq_name: String,
    /// Expired messages go to the DLQ (no longer expiring there) instead of being dropped.
    pub expired_to_dlq: bool,
    pub dlq_prefix: String,
    pub prefetch_default: u32,
    pub prefetch_max: u32,
    /// Bytes of unacknowledged messages per subscription, besides the prefetch count (like
    /// Artemis's `consumerWindowSize`, 1 MiB there): large messages fill it before the count
    /// does. 16 MiB by default: a consumer of 64 KiB messages that falls behind leaves more of
    /// its backlog paged out and read back (10–15% of its rate), but a broker's memory per
    /// consumer stays bounded (docs/PERFORMANCE.md, "Memory with large messages").
    pub prefetch_bytes_max: u64,
    pub topic_subscriber_pending_max: usize,
    /// Most messages a browsing subscription (`browser:true`) is sent.
    pub browse_messages_max: usize,
}

/// One `[[delivery.redelivery_policy]]`: settings for the destinations `destination` matches
/// (`/queue/NAME` or `/topic/NAME`, wildcards `*` and `>` allowed). Unset keys take the
/// broker-wide `[delivery]` values.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedeliveryPolicyConfig {
    pub destination: String,
    pub redeliveries_max: Option<u32>,
    pub redelivery_delay_initial_ms: Option<u64>,
    pub redelivery_backoff_multiplier: Option<f64>,
    pub redelivery_delay_max_ms: Option<u64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub transaction_ops_max: usize,
    pub transactions_per_connection_max: usize,
    pub subscriptions_per_connection_max: usize,
    /// Bytes of waiting messages kept in memory over all destinations. Beyond it, persistent
    /// messages stay only in the journal (read back when consumers reach them) and
    /// non-persistent ones spill to it.
    pub memory_bytes_max: u64,
    /// Journal size at which persistent SENDs are held back (0 = no limit of its own).
    pub disk_bytes_max: u64,
    /// Free space on the journal's file system below which persistent SENDs are held back, so
    /// the disk never fills to 100% (acks, checkpoints and compaction still need room).
    pub disk_free_bytes_min: u64,
    /// How long a SEND held back by a limit waits before the producer gets an ERROR naming it.
    pub producer_wait_ms_max: u64,
    /// Scheduled messages (`AMQ_SCHEDULED_*`) held at once; each is kept in memory.
    pub scheduled_messages_max: usize,
    /// Exactly-once sends: a producer (`haven-producer`) whose sequence was last raised this
    /// long ago is forgotten; a later resend of one of its old sequence numbers is stored
    /// again. Default 7 days.
    pub producer_idle_ms_max: u64,
    /// Producers remembered at once; a new one beyond it forgets the least recently seen.
    pub producers_max: usize,
    /// Messages forwarded by network bridges whose origin is remembered, so that a bridge's
    /// resend after a failure is stored once (oldest forgotten first).
    pub network_origins_max: usize,
    /// A remembered origin is forgotten after this long.
    pub network_origin_idle_ms_max: u64,
    /// Per-destination limits (`[[limits.destination]]`), first match wins.
    pub destination: Vec<DestinationLimitsConfig>,
}

/// One `[[limits.destination]]`: limits for the queues (`/queue/...`) or the durable
/// subscriptions of the topics (`/topic/...`) that `destination` matches (`*`, `>` allowed).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationLimitsConfig {
    pub destination: String,
    /// Bytes of waiting messages this destination keeps in memory before paging out.
    pub memory_bytes_max: Option<u64>,
    /// Messages held at which producers are held back.
    pub messages_max: Option<u64>,
    /// Bytes of waiting messages (in memory or paged out) at which producers are held back.
    pub bytes_max: Option<u64>,
}

/// `[cluster]`: the brokers a client may use, announced to clients (ActiveMQ's
/// `updateClusterClients` / `rebalanceClusterClients`). The one table `haven run` re-reads on
/// SIGHUP; checked by [`crate::cluster::check`] (the same rules apply to
/// [`crate::ClusterHandle::set_cluster`]).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Client-facing URIs (`tcp://host:port`) of the brokers in this cluster, in the order they
    /// are announced.
    pub members: Vec<String>,
    /// Announce `members` in CONNECTED (`haven-cluster`) and push changes to clients that ask.
    pub update_cluster_clients: bool,
    /// Pushed announcements ask clients to reconnect to a randomly chosen member, so the load
    /// spreads. Requires `update_cluster_clients`.
    pub rebalance_cluster_clients: bool,
}

/// `[ha]`: how this broker shares its store with others (docs/HA.md).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    pub mode: HaMode,
    /// shared-fs: 0 = slaves block on the lock (take over the instant it is free); above 0 =
    /// slaves try the lock every this many ms (for file systems whose blocking locks are
    /// unreliable).
    pub lock_poll_ms: u64,
    /// shared-fs: how often the master proves it still holds the lock and that no newer
    /// master has bumped the epoch; it stops serving the moment it cannot.
    pub keepalive_ms: u64,
    /// shared-db: `postgres://user:password@host:port/dbname` (libpq key=value also works).
    pub db_url: String,
    /// shared-db: how long a lease lasts, timed by the database's clock.
    pub lease_ms: u64,
    /// shared-db: how often the master renews its lease.
    pub renew_ms: u64,
    /// shared-db: a master that has not renewed for `lease_ms - lease_margin_ms` (by its own
    /// monotonic clock) stops serving, before the database can give the lease to another.
    pub lease_margin_ms: u64,
    /// shared-db: how often a slave checks whether the lease has expired (it takes over at
    /// once, without waiting, when the master's database session ends).
    pub poll_ms: u64,
    /// shared-db: the longest one write to the database may take before the broker stops
    /// (an unreachable database must not hold producers forever).
    pub db_timeout_ms: u64,
    /// replicated: this member's id, one of `members`.
    pub node_id: u64,
    /// replicated: every member at start-up (`[[ha.members]]`). Members added or removed
    /// online (`haven admin cluster`) are kept in the Raft log; this list bootstraps a new
    /// cluster and tells each member its own Raft address.
    pub members: Vec<HaMember>,
    /// replicated: names the cluster; announced to clients as the store (`haven-store`), so it
    /// must be the same on every member and differ between clusters.
    pub cluster_name: String,
    /// replicated: how often the leader sends heartbeats; also how long a follower may take to
    /// answer one AppendEntries (its fsync included) before the leader retries.
    pub heartbeat_ms: u64,
    /// replicated: a follower that hears no leader for twice this plus a random time between
    /// this and twice this (openraft's leader lease, then its election timeout) stands for
    /// election. A leader that has not heard from a majority for three times this (the
    /// soonest another could be elected) stops serving.
    pub election_timeout_ms: u64,
    /// replicated: a snapshot is taken (and the Raft log before it purged) every this many
    /// entries.
    pub snapshot_entries: u64,
    /// replicated: snapshot transfer to a catching-up member is paced to this many bytes per
    /// second (0: unpaced).
    pub catchup_bytes_per_sec: u64,
}

/// `[[ha.members]]`: one replica.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HaMember {
    pub id: u64,
    /// Where its Raft port listens (peers and `haven admin cluster` connect here).
    pub raft: SocketAddr,
    /// Its STOMP address, announced when it leads. A witness has none.
    #[serde(default)]
    pub stomp: Option<SocketAddr>,
    /// A witness votes and acknowledges entries but stores no message bodies and never leads:
    /// the third member of a group with two data brokers (see docs/REPLICATION.md).
    #[serde(default)]
    pub witness: bool,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum HaMode {
    /// One broker on its own local journal (the default).
    #[default]
    Standalone,
    /// The journal directory is on a shared file system, guarded by a lock file and an epoch.
    SharedFs,
    /// The store is PostgreSQL, guarded by a lease row and an epoch.
    SharedDb,
    /// Each member has its own journal; the Raft leader replicates every record to a majority
    /// before acting on it.
    Replicated,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            mode: HaMode::Standalone,
            lock_poll_ms: 0,
            keepalive_ms: 500,
            db_url: String::new(),
            lease_ms: 10_000,
            renew_ms: 1_000,
            lease_margin_ms: 3_000,
            poll_ms: 500,
            db_timeout_ms: 5_000,
            node_id: 0,
            members: Vec::new(),
            cluster_name: "haven".to_string(),
            heartbeat_ms: 50,
            election_timeout_ms: 100,
            snapshot_entries: 20_000,
            catchup_bytes_per_sec: 64 << 20,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub login: String,
    pub passcode: String,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            name: "haven".into(),
            default_persistent: true,
            worker_threads: 0,
        }
    }
}

impl Default for StompConfig {
    fn default() -> Self {
        StompConfig {
            listen: "127.0.0.1:61613".parse().expect("valid"),
            connections_max: 10_000,
            frame_bytes_max: 10 * 1024 * 1024,
            header_count_max: 1_000,
            header_bytes_max: 10 * 1024,
            heartbeat_send_ms: 1_000,
            heartbeat_receive_ms: 10_000,
            connect_timeout_ms: 10_000,
            write_timeout_ms: 60_000,
        }
    }
}

impl Default for JournalSettings {
    fn default() -> Self {
        JournalSettings {
            dir: PathBuf::from("data"),
            segment_bytes: 64 * 1024 * 1024,
            batch_bytes_max: 4 * 1024 * 1024,
            maintenance_interval_ms: 1_000,
            compaction_records_max: 10_000,
            slow_sync_warn_ms: haven_journal::SLOW_SYNC_WARN_MS_DEFAULT,
        }
    }
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            redeliveries_max: 6,
            redelivery_delay_initial_ms: 0,
            redelivery_backoff_multiplier: 1.0,
            redelivery_delay_max_ms: 3_600_000,
            redelivery_policy: Vec::new(),
            dlq: DlqMode::Shared,
            dlq_name: "ActiveMQ.DLQ".into(),
            expired_to_dlq: false,
            dlq_prefix: "DLQ.".into(),
            prefetch_default: 1_000,
            prefetch_max: 65_536,
            prefetch_bytes_max: 16 << 20,
            topic_subscriber_pending_max: 100_000,
            browse_messages_max: 10_000,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            transaction_ops_max: 100_000,
            transactions_per_connection_max: 1_000,
            subscriptions_per_connection_max: 10_000,
            // 32 MiB, not ActiveMQ's 64: a forwarding broker whose producers outran its
            // bridge spent 7-10% less CPU on its worker with the smaller window (messages that
            // sit in memory for long are cold when delivered; one read back just before is
            // not), A -> B ran 6% faster, and (e)'s fill peaked 25 MiB lower; (g) did not
            // change. 16 MiB cost (g) 4% (docs/PERFORMANCE.md, "Networks of brokers").
            memory_bytes_max: 32 * 1024 * 1024,
            disk_bytes_max: 0,
            disk_free_bytes_min: 128 * 1024 * 1024,
            producer_wait_ms_max: 30_000,
            scheduled_messages_max: 100_000,
            producer_idle_ms_max: 7 * 24 * 3_600_000,
            producers_max: 100_000,
            network_origins_max: 100_000,
            network_origin_idle_ms_max: 600_000,
            destination: Vec::new(),
        }
    }
}

/// `[[network]]`: one network connector, with ActiveMQ's options under snake_case names.
/// Messages flow from this broker to the remote one while the remote has consumers for them
/// (and, with `duplex`, the other way over the same connection).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConnector {
    /// For log lines; default `uri`.
    pub name: String,
    /// `static:(tcp://b:61613,tcp://c:61613)`: one bridge to each broker listed;
    /// `failover:(tcp://b1:61613,tcp://b2:61613)`: one bridge to whichever of an HA group
    /// serves; `tcp://b:61613`: one bridge.
    pub uri: String,
    /// CONNECT credentials on the remote broker.
    pub login: Option<String>,
    pub passcode: Option<String>,
    /// `networkTTL`: how many bridges demand and messages may cross (1: neighbours only).
    pub network_ttl: u32,
    /// `duplex`: this connection also carries messages from the remote broker to consumers
    /// here; the remote broker needs no connector of its own.
    pub duplex: bool,
    /// `conduitSubscriptions`: one subscription per destination for all the consumers of a
    /// remote broker, instead of one per remote consumer.
    pub conduit_subscriptions: bool,
    /// `decreaseNetworkConsumerPriority`: consumers on this broker are served before the
    /// bridge (by 5 priority points per hop the demand came).
    pub decrease_network_consumer_priority: bool,
    /// `prefetchSize`: messages in flight per bridge subscription. 4000 by default where
    /// ActiveMQ has 1000: a bridge holds every message until the remote broker's RECEIPT for its
    /// batch, so the window must cover the batches in flight (scenario (c) A → B: 99k msg/s
    /// at 1000, 105k at 4000, median of 5).
    pub prefetch_size: u32,
    /// Always forwarded, consumers on the remote broker or not (`/queue/X`, `/topic/X`,
    /// wildcards allowed).
    pub statically_included_destinations: Vec<String>,
    /// Forwarded on demand; empty means every destination.
    pub dynamically_included_destinations: Vec<String>,
    /// Never forwarded; wins over both include lists.
    pub excluded_destinations: Vec<String>,
    /// `bridgeTempDestinations`: replies to temporary destinations cross the network.
    pub bridge_temp_destinations: bool,
    /// First wait before reconnecting a broken bridge; doubles up to `reconnect_delay_max_ms`.
    pub reconnect_delay_ms: u64,
    pub reconnect_delay_max_ms: u64,
}

impl Default for NetworkConnector {
    fn default() -> Self {
        NetworkConnector {
            name: String::new(),
            uri: String::new(),
            login: None,
            passcode: None,
            network_ttl: 1,
            duplex: false,
            conduit_subscriptions: true,
            decrease_network_consumer_priority: false,
            prefetch_size: 4000,
            statically_included_destinations: Vec::new(),
            dynamically_included_destinations: Vec::new(),
            excluded_destinations: Vec::new(),
            bridge_temp_destinations: true,
            reconnect_delay_ms: 100,
            reconnect_delay_max_ms: 5_000,
        }
    }
}

/// `/queue/NAME` or `/topic/NAME`, NAME non-empty.
pub(crate) fn is_destination_pattern(text: &str) -> bool {
    (text.starts_with("/queue/") || text.starts_with("/topic/")) && text.len() >= 8
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: {reason}")]
    Parse { file: PathBuf, reason: String },
    #[error("{file}: key `{key}`: {reason}")]
    Invalid {
        file: PathBuf,
        key: &'static str,
        reason: String,
    },
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// `file` names the source in errors.
    pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_path_buf(),
            reason: e.to_string().trim_end().replace('\n', " "),
        })?;
        config.validate(file)?;
        Ok(config)
    }

    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, reason: String| {
            Err(ConfigError::Invalid {
                file: file.to_path_buf(),
                key,
                reason,
            })
        };
        if self.broker.worker_threads > WORKER_THREADS_MAX {
            return invalid(
                "broker.worker_threads",
                format!(
                    "{} is above the maximum of {WORKER_THREADS_MAX}",
                    self.broker.worker_threads
                ),
            );
        }
        let s = &self.stomp;
        if s.connections_max == 0 {
            return invalid("stomp.connections_max", "must be at least 1".into());
        }
        if s.frame_bytes_max < 1024 {
            return invalid(
                "stomp.frame_bytes_max",
                format!("{} is below the minimum of 1024", s.frame_bytes_max),
            );
        }
        if s.write_timeout_ms < 100 {
            return invalid(
                "stomp.write_timeout_ms",
                format!("{} is below the minimum of 100", s.write_timeout_ms),
            );
        }
        if s.header_count_max == 0 {
            return invalid("stomp.header_count_max", "must be at least 1".into());
        }
        if s.header_bytes_max < 64 {
            return invalid("stomp.header_bytes_max", "must be at least 64".into());
        }
        let h = &self.ha;
        if h.keepalive_ms == 0 {
            return invalid(
                "ha.keepalive_ms",
                "must be at least 1: a master that never re-checks its lock can corrupt the store"
                    .into(),
            );
        }
        if h.mode == HaMode::SharedDb {
            if h.db_url.is_empty() {
                return invalid("ha.db_url", "required with mode = \"shared-db\"".into());
            }
            if h.renew_ms == 0 || h.poll_ms == 0 || h.db_timeout_ms == 0 {
                return invalid(
                    "ha.renew_ms",
                    "renew_ms, poll_ms and db_timeout_ms must be at least 1".into(),
                );
            }
            // The master must renew at least twice inside the time it trusts its lease, and a
            // write must not outlast it: defaults that expire before renewal are refused.
            let trusted = h.lease_ms.saturating_sub(h.lease_margin_ms);
            if h.lease_margin_ms == 0 || trusted < 2 * h.renew_ms {
                return invalid(
                    "ha.lease_ms",
                    format!(
                        "lease_ms - lease_margin_ms ({trusted}) must be at least twice renew_ms \
                         ({}), and lease_margin_ms above 0",
                        h.renew_ms
                    ),
                );
            }
        }
        if h.mode == HaMode::Replicated {
            if !h.members.iter().any(|m| m.id == h.node_id) {
                return invalid(
                    "ha.node_id",
                    format!("{} is not the id of one of [[ha.members]]", h.node_id),
                );
            }
            let mut ids: Vec<u64> = h.members.iter().map(|m| m.id).collect();
            ids.sort_unstable();
            ids.dedup();
            if ids.len() != h.members.len() {
                return invalid("ha.members", "two members have the same id".into());
            }
            for m in &h.members {
                match (m.witness, m.stomp) {
                    (false, None) => {
                        return invalid(
                            "ha.members",
                            format!("member {} has no stomp address", m.id),
                        )
                    }
                    (true, Some(_)) => {
                        return invalid(
                            "ha.members",
                            format!(
                                "member {} is a witness: it serves no clients, so no stomp",
                                m.id
                            ),
                        )
                    }
                    _ => {}
                }
            }
            // A witness can stand in only for the third copy of a two-broker group: its
            // acknowledgements wait for the other data broker (docs/REPLICATION.md).
            let witnesses = h.members.iter().filter(|m| m.witness).count();
            if witnesses > 0 && (witnesses != 1 || h.members.len() != 3) {
                return invalid(
                    "ha.members",
                    format!(
                        "a witness makes a group of two data brokers and one witness; \
                         this one has {} members, {witnesses} of them witnesses",
                        h.members.len()
                    ),
                );
            }
            // A follower waits 3 to 4 election timeouts (openraft's leader lease, then its
            // election timeout) before it stands: at least 6 heartbeats.
            if h.heartbeat_ms == 0 || h.election_timeout_ms < 2 * h.heartbeat_ms {
                return invalid(
                    "ha.election_timeout_ms",
                    format!(
                        "{} must be at least two heartbeats ({} ms each), and heartbeat_ms above 0",
                        h.election_timeout_ms, h.heartbeat_ms
                    ),
                );
            }
            if h.snapshot_entries == 0 {
                return invalid("ha.snapshot_entries", "must be at least 1".into());
            }
            if h.cluster_name.is_empty() {
                return invalid("ha.cluster_name", "must not be empty".into());
            }
        }
        let j = &self.journal;
        if j.segment_bytes < 1024 * 1024 {
            return invalid(
                "journal.segment_bytes",
                format!(
                    "{} is below the minimum of 1048576 (1 MiB)",
                    j.segment_bytes
                ),
            );
        }
        if (j.segment_bytes as u128) < 2 * s.frame_bytes_max as u128 + 4096 {
            return invalid(
                "journal.segment_bytes",
                "must hold at least two of the largest frames (2 × stomp.frame_bytes_max)".into(),
            );
        }
        if j.batch_bytes_max < 4096 {
            return invalid("journal.batch_bytes_max", "must be at least 4096".into());
        }
        if j.maintenance_interval_ms == 0 {
            return invalid(
                "journal.maintenance_interval_ms",
                "must be at least 1".into(),
            );
        }
        if j.dir.as_os_str().is_empty() {
            return invalid("journal.dir", "must not be empty".into());
        }
        let d = &self.delivery;
        if d.prefetch_default == 0 || d.prefetch_default > d.prefetch_max {
            return invalid(
                "delivery.prefetch_default",
                format!(
                    "must be between 1 and delivery.prefetch_max ({})",
                    d.prefetch_max
                ),
            );
        }
        if !(d.redelivery_backoff_multiplier.is_finite()
            && (1.0..=100.0).contains(&d.redelivery_backoff_multiplier))
        {
            return invalid(
                "delivery.redelivery_backoff_multiplier",
                format!(
                    "{} is not between 1.0 and 100.0",
                    d.redelivery_backoff_multiplier
                ),
            );
        }
        if d.redelivery_delay_max_ms < d.redelivery_delay_initial_ms {
            return invalid(
                "delivery.redelivery_delay_max_ms",
                "must be at least delivery.redelivery_delay_initial_ms".into(),
            );
        }
        let l = &self.limits;
        if l.memory_bytes_max < 1024 * 1024 {
            return invalid("limits.memory_bytes_max", "must be at least 1 MiB".into());
        }
        if l.scheduled_messages_max == 0 {
            return invalid("limits.scheduled_messages_max", "must be at least 1".into());
        }
        if l.producer_idle_ms_max == 0 {
            return invalid("limits.producer_idle_ms_max", "must be at least 1".into());
        }
        if l.producers_max == 0 {
            return invalid("limits.producers_max", "must be at least 1".into());
        }
        if l.network_origins_max == 0 || l.network_origin_idle_ms_max == 0 {
            return invalid(
                "limits.network_origins_max",
                "network_origins_max and network_origin_idle_ms_max must be at least 1".into(),
            );
        }
        for p in &l.destination {
            if !is_destination_pattern(&p.destination) {
                return invalid(
                    "limits.destination.destination",
                    format!(
                        "'{}' must be /queue/NAME or /topic/NAME (wildcards allowed)",
                        p.destination
                    ),
                );
            }
            if p.messages_max == Some(0) || p.bytes_max == Some(0) || p.memory_bytes_max == Some(0)
            {
                return invalid(
                    "limits.destination",
                    format!("'{}': every limit must be at least 1", p.destination),
                );
            }
        }
        for p in &d.redelivery_policy {
            if !is_destination_pattern(&p.destination) {
                return invalid(
                    "delivery.redelivery_policy.destination",
                    format!(
                        "'{}' must be /queue/NAME or /topic/NAME (wildcards allowed)",
                        p.destination
                    ),
                );
            }
            if let Some(m) = p.redelivery_backoff_multiplier {
                if !(m.is_finite() && (1.0..=100.0).contains(&m)) {
                    return invalid(
                        "delivery.redelivery_policy.redelivery_backoff_multiplier",
                        format!("{m} is not between 1.0 and 100.0"),
                    );
                }
            }
        }
        if d.dlq_name.is_empty() {
            return invalid("delivery.dlq_name", "must not be empty".into());
        }
        if d.topic_subscriber_pending_max == 0 {
            return invalid(
                "delivery.topic_subscriber_pending_max",
                "must be at least 1".into(),
            );
        }
        let l = &self.limits;
        if l.transaction_ops_max == 0
            || l.transactions_per_connection_max == 0
            || l.subscriptions_per_connection_max == 0
        {
            return invalid("limits", "every limit must be at least 1".into());
        }
        for u in &self.users {
            if u.login.is_empty() {
                return invalid("users.login", "must not be empty".into());
            }
        }
        if let Err(e) = crate::cluster::check(&self.cluster) {
            return invalid(e.key(), e.to_string());
        }
        for n in &self.network {
            if let Err((key, reason)) = crate::network::check(&self.broker.name, n) {
                return invalid(key, reason);
            }
        }
        Ok(())
    }
}

/// The top-level tables (`stomp`, `limits`, ...) whose contents differ between two config
/// texts, sorted. A reload uses it to say which changes it ignored; both texts must already
/// have parsed (`Config::parse`), so a text that is not TOML counts as empty here.
pub fn tables_changed(old: &str, new: &str) -> Vec<String> {
    let parse = |text: &str| text.parse::<toml::Table>().unwrap_or_default();
    let (old, new) = (parse(old), parse(new));
    let mut names: Vec<String> = old
        .keys()
        .chain(new.keys())
        .filter(|k| old.get(*k) != new.get(*k))
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("haven.toml"))
    }

    #[test]
    fn empty_file_gives_every_default() {
        let c = parse("").unwrap();
        assert_eq!(c.stomp.listen.to_string(), "127.0.0.1:61613");
        assert_eq!(c.journal.dir, PathBuf::from("data"));
        assert!(c.broker.default_persistent);
        assert_eq!(c.delivery.redeliveries_max, 6);
        assert_eq!(c.delivery.prefetch_bytes_max, 16 << 20);
        assert_eq!(c.broker.worker_threads, 0);
        assert_eq!(c.worker_threads_effective(2), 1);
        assert_eq!(c.worker_threads_effective(1), 1);
        assert_eq!(c.worker_threads_effective(8), 7);
        let c = parse("[broker]\nworker_threads = 3\n").unwrap();
        assert_eq!(c.worker_threads_effective(2), 3);
        let mut c = parse("").unwrap();
        c.ha.mode = HaMode::Replicated;
        assert_eq!(c.worker_threads_effective(2), 2);
        let e = parse("[broker]\nworker_threads = 5000\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("broker.worker_threads"), "{e}");
        let c = parse("[delivery]\nprefetch_bytes_max = 1048576\n").unwrap();
        assert_eq!(c.delivery.prefetch_bytes_max, 1 << 20);
    }

    fn replicated(members: &str) -> Result<Config, String> {
        parse(&format!(
            "[ha]\nmode = \"replicated\"\nnode_id = 1\n{members}"
        ))
        .map_err(|e| e.to_string())
    }

    const DATA_1: &str =
        "[[ha.members]]\nid = 1\nraft = \"127.0.0.1:1\"\nstomp = \"127.0.0.1:11\"\n";
    const DATA_2: &str =
        "[[ha.members]]\nid = 2\nraft = \"127.0.0.1:2\"\nstomp = \"127.0.0.1:12\"\n";
    const DATA_4: &str =
        "[[ha.members]]\nid = 4\nraft = \"127.0.0.1:4\"\nstomp = \"127.0.0.1:14\"\n";
    const WITNESS_3: &str = "[[ha.members]]\nid = 3\nraft = \"127.0.0.1:3\"\nwitness = true\n";

    #[test]
    fn a_witness_makes_the_third_member_of_two_data_brokers_only() {
        let c = replicated(&format!("{DATA_1}{DATA_2}{WITNESS_3}")).unwrap();
        assert!(c.ha.members[2].witness && c.ha.members[2].stomp.is_none());
        let e = replicated(&format!("{DATA_1}{DATA_2}{WITNESS_3}{DATA_4}")).unwrap_err();
        assert!(e.contains("4 members, 1 of them witnesses"), "{e}");
        let e = replicated(&format!("{DATA_1}{WITNESS_3}")).unwrap_err();
        assert!(e.contains("2 members"), "{e}");
        let with_stomp = WITNESS_3.replace("witness", "stomp = \"127.0.0.1:13\"\nwitness");
        let e = replicated(&format!("{DATA_1}{DATA_2}{with_stomp}")).unwrap_err();
        assert!(e.contains("member 3 is a witness"), "{e}");
        let no_stomp = "[[ha.members]]\nid = 2\nraft = \"127.0.0.1:2\"\n";
        let e = replicated(&format!("{DATA_1}{no_stomp}{WITNESS_3}")).unwrap_err();
        assert!(e.contains("member 2 has no stomp address"), "{e}");
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let e = parse("[stomp]\nlisten = \"127.0.0.1:1\"\nfram_bytes_max = 5\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("haven.toml") && e.contains("fram_bytes_max"),
            "{e}"
        );
        let e = parse("[nope]\n").unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key_and_reason() {
        let e = parse("[stomp]\nlisten = \"not an address\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen"), "{e}");
        let e = parse("[journal]\nsegment_bytes = 10\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("journal.segment_bytes") && e.contains("minimum"),
            "{e}"
        );
        let e = parse("[delivery]\ndlq = \"sideways\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sideways"), "{e}");
        let e = parse("[delivery]\nredeliveries_max = -1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("redeliveries_max"), "{e}");
    }

    #[test]
    fn redelivery_policies_parse_and_are_checked() {
        let c = parse("[[delivery.redelivery_policy]]\ndestination = \"/queue/orders.>\"\nredeliveries_max = 2\n").unwrap();
        assert_eq!(c.delivery.redelivery_policy[0].redeliveries_max, Some(2));
        let e = parse("[[delivery.redelivery_policy]]\ndestination = \"orders\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("delivery.redelivery_policy.destination"), "{e}");
        let e = parse("[[delivery.redelivery_policy]]\ndestination = \"/queue/a\"\nbogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn producer_limits_parse_and_are_checked() {
        let c = parse("[limits]\nproducer_idle_ms_max = 60000\nproducers_max = 5\n").unwrap();
        assert_eq!(
            (c.limits.producer_idle_ms_max, c.limits.producers_max),
            (60_000, 5)
        );
        let d = parse("").unwrap();
        assert_eq!(d.limits.producer_idle_ms_max, 604_800_000);
        assert_eq!(d.limits.producers_max, 100_000);
        for bad in ["producer_idle_ms_max = 0", "producers_max = 0"] {
            let e = parse(&format!("[limits]\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{e}");
        }
    }

    #[test]
    fn destination_limits_parse_and_are_checked() {
        let c = parse("[limits]\nmemory_bytes_max = 2097152\n[[limits.destination]]\ndestination = \"/queue/big.>\"\nmessages_max = 10\n").unwrap();
        assert_eq!(c.limits.memory_bytes_max, 2 * 1024 * 1024);
        assert_eq!(c.limits.destination[0].messages_max, Some(10));
        let e = parse("[[limits.destination]]\ndestination = \"big\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("limits.destination.destination"), "{e}");
        let e = parse("[[limits.destination]]\ndestination = \"/queue/a\"\nbytes_max = 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1"), "{e}");
        let e = parse("[limits]\nmemory_bytes_max = 5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("limits.memory_bytes_max"), "{e}");
    }

    #[test]
    fn cluster_table_parses_and_is_checked() {
        let c = parse("[cluster]\nmembers = [\"tcp://127.0.0.1:61613\", \"tcp://127.0.0.2:61613\"]\nupdate_cluster_clients = true\nrebalance_cluster_clients = true\n").unwrap();
        assert_eq!(c.cluster.members.len(), 2);
        assert!(c.cluster.update_cluster_clients && c.cluster.rebalance_cluster_clients);
        let e = parse("[cluster]\nmembers = [\"tcp://a:1\", \"b:2\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster.members") && e.contains("'b:2'"), "{e}");
        let e = parse("[cluster]\nrebalance_cluster_clients = true\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cluster.rebalance_cluster_clients") && e.contains("update_cluster_clients"),
            "{e}"
        );
        let e = parse("[cluster]\nupdate_clients = true\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("update_clients"), "{e}");
    }

    #[test]
    fn tables_changed_names_the_tables_that_differ() {
        let old = "[stomp]\nlisten = \"127.0.0.1:1\"\n[cluster]\nmembers = []\n";
        let new = "[stomp]\nlisten = \"127.0.0.1:2\"\n[cluster]\nmembers = [\"tcp://a:1\"]\n[limits]\nmemory_bytes_max = 2097152\n";
        assert_eq!(tables_changed(old, new), ["cluster", "limits", "stomp"]);
        let reformatted = "# comment\n[stomp]\nlisten=\"127.0.0.1:1\"\n\n[cluster]\nmembers=[]\n";
        assert!(tables_changed(old, reformatted).is_empty());
    }

    #[test]
    fn the_shipped_group_examples_parse_and_name_their_own_address() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut seen = 0;
        for group in ["shared-fs-2", "shared-fs-3", "shared-db-2", "shared-db-3"] {
            let dir = root.join(group);
            let mut files: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            files.sort();
            let size: usize = group[group.len() - 1..].parse().unwrap();
            assert_eq!(files.len(), size, "{group}");
            for file in files {
                let c = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
                let want = if group.starts_with("shared-fs") {
                    HaMode::SharedFs
                } else {
                    HaMode::SharedDb
                };
                assert_eq!(c.ha.mode, want, "{}", file.display());
                assert_eq!(c.cluster.members.len(), size);
                let own = format!("tcp://{}", c.stomp.listen);
                assert!(c.cluster.members.contains(&own), "{}", file.display());
                seen += 1;
            }
        }
        assert_eq!(seen, 10);
    }

    #[test]
    fn the_shipped_network_examples_parse_and_connect_to_each_other() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        for (group, connectors) in [("network-line", 2), ("network-mesh", 3)] {
            let configs: Vec<Config> = ["a", "b", "c"]
                .iter()
                .map(|n| {
                    Config::load(&root.join(group).join(format!("{n}.toml")))
                        .unwrap_or_else(|e| panic!("{e}"))
                })
                .collect();
            let mut names: Vec<&str> = configs.iter().map(|c| c.broker.name.as_str()).collect();
            names.sort_unstable();
            assert_eq!(names, ["A", "B", "C"], "{group}");
            let listens: Vec<String> = configs
                .iter()
                .map(|c| format!("tcp://{}", c.stomp.listen))
                .collect();
            let mut bridges = 0;
            for c in &configs {
                for n in &c.network {
                    for target in crate::network::targets(&n.uri).unwrap() {
                        assert!(listens.contains(&target[0]), "{group}: {}", target[0]);
                        bridges += 1;
                    }
                }
            }
            assert_eq!(
                configs.iter().map(|c| c.network.len()).sum::<usize>(),
                connectors
            );
            assert_eq!(
                bridges,
                if group == "network-mesh" { 6 } else { 2 },
                "{group}"
            );
        }
    }

    #[test]
    fn the_shipped_replicated_examples_parse_and_each_names_itself() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        for (group, witnesses) in [("replicated-3", 0), ("replicated-witness", 1)] {
            let files: Vec<_> = std::fs::read_dir(root.join(group))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert_eq!(files.len(), 3, "{group}");
            let mut ids = Vec::new();
            for file in files {
                let c = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(c.ha.mode, HaMode::Replicated, "{}", file.display());
                let me = c.ha.members.iter().find(|m| m.id == c.ha.node_id).unwrap();
                if let Some(stomp) = me.stomp {
                    assert_eq!(stomp, c.stomp.listen, "{}", file.display());
                }
                assert_eq!(
                    c.ha.members.iter().filter(|m| m.witness).count(),
                    witnesses,
                    "{}",
                    file.display()
                );
                ids.push(c.ha.node_id);
            }
            ids.sort_unstable();
            assert_eq!(ids, [1, 2, 3], "{group}");
        }
    }

    #[test]
    fn lease_settings_that_could_expire_before_renewal_are_refused() {
        let base = "[ha]\nmode = \"shared-db\"\ndb_url = \"postgres://x@h/d\"\n";
        assert!(parse(base).is_ok());
        for bad in [
            "lease_ms = 3000\nrenew_ms = 2000\nlease_margin_ms = 500\n",
            "lease_ms = 10000\nrenew_ms = 1000\nlease_margin_ms = 0\n",
            "lease_ms = 2000\nrenew_ms = 1000\nlease_margin_ms = 1000\n",
        ] {
            assert!(parse(&format!("{base}{bad}")).is_err(), "{bad}");
        }
        assert!(
            parse("[ha]\nmode = \"shared-db\"\n").is_err(),
            "db_url required"
        );
        assert!(parse("[ha]\nmode = \"shared-fs\"\nkeepalive_ms = 0\n").is_err());
        assert!(parse("[ha]\nmode = \"raft\"\n").is_err());
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../../examples/haven.toml");
        let c = parse(text).unwrap();
        assert_eq!(c.stomp.listen.to_string(), "127.0.0.1:61613");
    }
}
