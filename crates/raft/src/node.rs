//! One replica: the Raft node, its Raft port, and the `SharedStore` that makes the broker
//! serve while this member leads.

use crate::admin::Admin;
use crate::handover::{Handover, Timing};
use crate::leader::{LeaderStore, Lost};
use crate::log_store::LogStore;
use crate::network::NetworkFactory;
use crate::repair::Repair;
use crate::state::StateMachine;
use crate::types::{Member, NodeId, Raft};
use haven_server::ha::{Acquiring, Mastership};
use haven_server::{Config, ServerError, SharedStore};
use openraft::{ServerState, SnapshotPolicy};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Bound on the previous serving's proposer handing its last entries to Raft.
const EARLIER_PROPOSER_WAIT_MS: u64 = 10_000;

/// How often a fresh cluster's first member asks the others whether they are initialised.
const BOOTSTRAP_POLL_MS: u64 = 200;

/// A member of a replicated group.
pub struct ReplicatedStore {
    raft: Raft,
    sm: StateMachine,
    id: NodeId,
    data_dir: PathBuf,
    store_id: String,
    election_timeout_ms: u64,
    heartbeat_ms: u64,
    handover: Arc<Handover>,
    _dir_lock: Box<dyn Send + Sync>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn dir_err(dir: &std::path::Path, e: impl std::fmt::Display) -> ServerError {
    ServerError::DataDir {
        dir: dir.to_path_buf(),
        reason: e.to_string(),
    }
}

impl ReplicatedStore {
    /// Opens this member's log and state journal, starts Raft and opens the Raft port. A
    /// cluster that was never initialised is initialised by its lowest-numbered member once
    /// every configured member answers and none has a log.
    pub async fn start(config: &Config) -> Result<ReplicatedStore, ServerError> {
        let ha = &config.ha;
        let data_dir = config.journal.dir.clone();
        let dir_lock = haven_server::lock_data_dir(&data_dir)?;
        let segment_bytes = config.journal.segment_bytes;
        let me = ha
            .members
            .iter()
            .find(|m| m.id == ha.node_id)
            .expect("validated: node_id is a member");
        let empty = crate::repair::never_held_state(&data_dir);
        let repair = Arc::new(Repair::resume(&data_dir).map_err(|e| dir_err(&data_dir, e))?);
        if empty {
            repair
                .begin_empty()
                .map_err(|e| dir_err(&data_dir, format!("an empty data directory: {e}")))?;
        }
        let log = match LogStore::open(&data_dir, segment_bytes, me.witness) {
            Ok(log) => log,
            Err(e @ haven_journal::JournalError::Corrupt { .. }) => {
                repair
                    .begin(&e.to_string())
                    .map_err(|e| dir_err(&data_dir, format!("repairing the raft log: {e}")))?;
                LogStore::open(&data_dir, segment_bytes, me.witness)
                    .map_err(|e| dir_err(&data_dir, e))?
            }
            Err(e) => return Err(dir_err(&data_dir, e)),
        };
        let sm = StateMachine::open(&data_dir, segment_bytes, me.witness)
            .map_err(|e| dir_err(&data_dir, e))?;
        let raft_config = openraft::Config {
            // A witness never stands: it holds no records to lead with. A repairing member
            // does not until it has caught up (repair.rs).
            enable_elect: !me.witness && !repair.active(),
            cluster_name: ha.cluster_name.clone(),
            heartbeat_interval: ha.heartbeat_ms,
            election_timeout_min: ha.election_timeout_ms,
            election_timeout_max: 2 * ha.election_timeout_ms,
            install_snapshot_timeout: 10_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(ha.snapshot_entries),
            max_in_snapshot_log_to_keep: ha.snapshot_entries.min(1_000),
            snapshot_max_chunk_size: 4 << 20,
            max_payload_entries: 1_000,
            ..Default::default()
        };
        let raft_config = Arc::new(
            raft_config
                .validate()
                .map_err(|e| dir_err(&data_dir, format!("[ha] raft settings: {e}")))?,
        );
        let metrics = Arc::new(std::sync::OnceLock::new());
        let network = NetworkFactory {
            catchup_bytes_per_sec: ha.catchup_bytes_per_sec,
            metrics: metrics.clone(),
            election_timeout_ms: ha.election_timeout_ms,
        };
        let raft = Raft::new(ha.node_id, raft_config, network, log, sm.clone())
            .await
            .map_err(|e| dir_err(&data_dir, format!("starting raft: {e}")))?;
        metrics
            .set(raft.metrics())
            .expect("set once, right after Raft starts");
        let listener = tokio::net::TcpListener::bind(me.raft)
            .await
            .map_err(|source| ServerError::Bind {
                addr: me.raft,
                source,
            })?;
        let handover = Arc::new(Handover::default());
        let admin = Arc::new(Admin {
            raft: raft.clone(),
            handover: handover.clone(),
            timing: Timing {
                election_timeout_ms: ha.election_timeout_ms,
            },
            witness: me.witness,
            repair: repair.clone(),
            incarnation: rand::random(),
        });
        let mut tasks = vec![tokio::spawn(crate::network::serve(
            listener,
            raft.clone(),
            admin,
        ))];
        let members: BTreeMap<NodeId, Member> = ha
            .members
            .iter()
            .map(|m| {
                (
                    m.id,
                    Member {
                        raft: m.raft.to_string(),
                        stomp: m.stomp.map(|a| a.to_string()).unwrap_or_default(),
                        witness: m.witness,
                    },
                )
            })
            .collect();
        if !me.witness {
            let repair = repair.clone();
            tasks.push(tokio::spawn(crate::split_vote::step_back(
                raft.clone(),
                crate::split_vote::PAUSE_MAX_ELECTION_TIMEOUTS * ha.election_timeout_ms,
                move || !repair.active(),
            )));
        }
        if repair.active() {
            tasks.push(tokio::spawn(crate::repair::watch(
                raft.clone(),
                repair.clone(),
                !me.witness,
            )));
            let peers = members
                .iter()
                .filter(|(id, _)| **id != ha.node_id)
                .map(|(_, m)| m.raft.clone())
                .collect();
            tasks.push(tokio::spawn(crate::repair::unless_new_group(
                raft.clone(),
                repair.clone(),
                peers,
                !me.witness,
            )));
        }
        let first = *members
            .keys()
            .next()
            .expect("validated: at least this member");
        if first == ha.node_id {
            tasks.push(tokio::spawn(bootstrap(
                raft.clone(),
                ha.node_id,
                members,
                repair.clone(),
                !me.witness,
            )));
        }
        tracing::info!(
            id = ha.node_id,
            raft = %me.raft,
            witness = me.witness,
            "replica started"
        );
        Ok(ReplicatedStore {
            raft,
            sm,
            id: ha.node_id,
            data_dir,
            store_id: format!("raft-{}", ha.cluster_name),
            election_timeout_ms: ha.election_timeout_ms,
            heartbeat_ms: ha.heartbeat_ms,
            handover,
            _dir_lock: dir_lock,
            tasks,
        })
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Stops Raft (the broker must have stopped first).
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.raft.shutdown().await;
    }

    /// Waits until this member leads, and returns its term. Fails once Raft has stopped on an
    /// error (a snapshot it could not install, a log it could not write): such a member
    /// would otherwise stay up, never catch up and never lead, looking alive to a
    /// supervisor. Failing stops the broker, so it is restarted and recovers from its disk.
    async fn wait_leader(&self) -> Result<u64, ServerError> {
        let mut metrics = self.raft.metrics();
        loop {
            let (running, leading) = {
                let m = metrics.borrow_and_update();
                let leading = (m.state == ServerState::Leader && m.current_leader == Some(self.id))
                    .then_some(m.current_term);
                (m.running_state.clone(), leading)
            };
            fail_if_stopped(self.id, running).await?;
            if let Some(term) = leading {
                return Ok(term);
            }
            if metrics.changed().await.is_err() {
                // The core has gone; its last word, if any, was read above.
                let running = metrics.borrow().running_state.clone();
                fail_if_stopped(self.id, running).await?;
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits (at most `EARLIER_PROPOSER_WAIT_MS`) for the proposer of this member's previous
    /// serving, if any, to hand its last entries to Raft; stops it after that.
    async fn wait_earlier_proposer(&self) {
        let earlier = self.sm.shared.proposer.lock().unwrap().take();
        if let Some(mut proposer) = earlier {
            let wait = Duration::from_millis(EARLIER_PROPOSER_WAIT_MS);
            if tokio::time::timeout(wait, &mut proposer).await.is_err() {
                // Whatever it still held was never acknowledged: drop it.
                tracing::warn!("the previous serving's proposer did not stop; stopping it");
                proposer.abort();
                let _ = proposer.await;
            }
        }
    }

    /// Waits until this member, still leading `term`, has applied every entry of its log.
    /// `false` once it no longer leads `term`.
    async fn applied_whole_log(&self, term: u64) -> bool {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let m = metrics.borrow_and_update();
                if m.state != ServerState::Leader || m.current_term != term {
                    return false;
                }
                if m.last_applied.map(|l| l.index) >= m.last_log_index {
                    return true;
                }
            }
            if metrics.changed().await.is_err() {
                return false;
            }
        }
    }

    async fn acquire_inner(&self) -> Result<Mastership, ServerError> {
        loop {
            let term = self.wait_leader().await?;
            if self.handover.surrendered(term) {
                // Handing this term's leadership over: serve again only if that fails.
                tokio::time::sleep(Duration::from_millis(self.heartbeat_ms)).await;
                continue;
            }
            // An earlier serving's proposals first: all handed to Raft (its proposer stops once
            // that serving's log is dropped) ...
            self.wait_earlier_proposer().await;
            // ... then leadership is confirmed by a majority and the state machine has applied
            // every entry committed before this term's first (Raft handles requests in order,
            // so the earlier proposals are in its log by now) ...
            if let Err(e) = self.raft.ensure_linearizable().await {
                tracing::info!(term, "won an election but could not confirm it: {e}");
                tokio::time::sleep(Duration::from_millis(self.heartbeat_ms)).await;
                continue;
            }
            // ... and every entry in the log is applied. A leader that lost its majority but
            // kept openraft's leadership serves a second time in the same term; entries its
            // first serving proposed were applied after the second had recovered the state
            // journal, under the LSNs it numbered on from (the replicated soak crashed on it:
            // "the log's next LSN went back"). So the state journal is complete now.
            if !self.applied_whole_log(term).await {
                continue;
            }
            let (lost_tx, lost_rx) = watch::channel(None);
            let lost = Lost(Arc::new(lost_tx));
            let watcher = tokio::spawn(watch_leadership(
                self.raft.clone(),
                term,
                lost.clone(),
                // The soonest followers stand: openraft's lease (the maximum timeout) plus
                // the minimum election timeout.
                3 * self.election_timeout_ms,
                self.heartbeat_ms,
            ));
            self.handover.serving(term, lost.clone());
            tracing::info!(id = self.id, term, "leader: serving clients");
            return Ok(Mastership {
                epoch: term,
                log: Box::new(LeaderStore {
                    sm: self.sm.shared.clone(),
                    raft: self.raft.clone(),
                    term,
                    node_id: self.id,
                    data_dir: self.data_dir.clone(),
                    lost,
                }),
                store_id: self.store_id.clone(),
                lost: lost_rx,
                hold: Box::new(Hold {
                    watcher,
                    sm: self.sm.clone(),
                    handover: self.handover.clone(),
                }),
            });
        }
    }
}

/// Held while the broker serves as leader: stops the watcher and removes the durability tap.
struct Hold {
    watcher: tokio::task::JoinHandle<()>,
    sm: StateMachine,
    handover: Arc<Handover>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.watcher.abort();
        self.handover.stopped_serving();
        self.sm.shared.inner.lock().unwrap().tap = None;
    }
}

/// Fires `lost` when this member is no longer leader of `term`, or has not heard from a
/// majority for `quorum_ms` (a leader cut off with a minority must not go on serving reads of
/// state a new leader is already changing).
async fn watch_leadership(raft: Raft, term: u64, lost: Lost, quorum_ms: u64, heartbeat_ms: u64) {
    let mut metrics = raft.metrics();
    loop {
        {
            let m = metrics.borrow_and_update();
            if m.state != ServerState::Leader || m.current_term != term {
                lost.fire(format!(
                    "now {:?} in term {} (led term {term})",
                    m.state, m.current_term
                ));
                return;
            }
            if let Some(ms) = m.millis_since_quorum_ack {
                if ms > quorum_ms {
                    lost.fire(format!("no majority has answered for {ms} ms"));
                    return;
                }
            }
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() {
                lost.fire("raft stopped".to_string());
                return;
            },
            _ = tokio::time::sleep(Duration::from_millis(heartbeat_ms)) => {}
        }
    }
}

impl SharedStore for ReplicatedStore {
    fn acquire(&self) -> Acquiring<'_> {
        Box::pin(self.acquire_inner())
    }

    fn describe(&self) -> String {
        format!("raft member {} in {}", self.id, self.data_dir.display())
    }
}

/// `Err` if member `id`'s Raft stopped on an error; waits forever if `shutdown` stopped it
/// (the broker is stopping anyway).
async fn fail_if_stopped(
    id: NodeId,
    running: Result<(), openraft::error::Fatal<NodeId>>,
) -> Result<(), ServerError> {
    match running {
        Ok(()) => Ok(()),
        Err(openraft::error::Fatal::Stopped) => std::future::pending().await,
        Err(fatal) => {
            tracing::error!(id, "raft stopped: {fatal}");
            Err(ServerError::ReplicationStopped(fatal.to_string()))
        }
    }
}

/// Initialises a new cluster once every configured member answers and none is initialised:
/// so a member whose data was wiped never starts a second cluster beside the running one.
async fn bootstrap(
    raft: Raft,
    me: NodeId,
    members: BTreeMap<NodeId, Member>,
    repair: Arc<Repair>,
    can_elect: bool,
) {
    let mut logged = false;
    loop {
        match raft.is_initialized().await {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => return,
        }
        let mut all_fresh = true;
        let mut fresh = Vec::new();
        for (id, member) in &members {
            if *id == me {
                continue;
            }
            match crate::client::status(&member.raft).await {
                Ok(s) if s.last_log_index.is_none() && s.voters.is_empty() => {
                    fresh.push((member.raft.clone(), s.incarnation));
                }
                Ok(_) => {
                    // Someone has a log: the cluster exists; wait to be contacted by its leader.
                    if !logged {
                        tracing::info!(peer = id, "the cluster exists; waiting for its leader");
                        logged = true;
                    }
                    all_fresh = false;
                }
                Err(_) => all_fresh = false,
            }
        }
        if all_fresh {
            // Initialising stands for election at once, so this member must vote from now
            // on: no member holds anything, the condition `repair::unless_new_group` waits for.
            if let Err(e) = crate::repair::end_for_new_group(&raft, &repair, can_elect) {
                tracing::error!("repair: cannot remove the marker: {e}");
                tokio::time::sleep(Duration::from_millis(BOOTSTRAP_POLL_MS)).await;
                continue;
            }
            match raft.initialize(members.clone()).await {
                Ok(()) => {
                    tracing::info!(members = members.len(), "initialised a new cluster");
                    for (addr, incarnation) in fresh {
                        tokio::spawn(tell_new_group(addr, incarnation));
                    }
                    return;
                }
                Err(e) => tracing::info!("initialise: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(BOOTSTRAP_POLL_MS)).await;
    }
}

/// How long the member that initialised a group keeps telling another member so.
const NEW_GROUP_TELL_MS: u64 = 30_000;

/// Tells the member at `addr` (found empty as `incarnation`) that the group is new, until it
/// has heard, has restarted since, or `NEW_GROUP_TELL_MS` has passed. Without it, a member
/// that looked at its peers only once the first leader had written would abstain until it
/// caught up, and a group whose first leader went at once could be left unable to elect.
async fn tell_new_group(addr: String, incarnation: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(NEW_GROUP_TELL_MS);
    loop {
        match crate::client::new_group(&addr, incarnation).await {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::Other => {
                tracing::info!(%addr, "not telling it the group is new: {e}");
                return;
            }
            Err(_) if tokio::time::Instant::now() >= deadline => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(BOOTSTRAP_POLL_MS)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fail_if_stopped;
    use haven_server::ServerError;
    use openraft::error::Fatal;
    use std::time::Duration;

    /// A Raft that stopped on an error stops the broker; one stopped by `shutdown` does not
    /// make it fail, and a running one goes on.
    #[tokio::test]
    async fn only_a_raft_stopped_by_an_error_fails_the_broker() {
        assert!(fail_if_stopped(1, Ok(())).await.is_ok());
        let storage = openraft::StorageError::from_io_error(
            openraft::ErrorSubject::Snapshot(None),
            openraft::ErrorVerb::Write,
            std::io::Error::other("received snapshot is of another log id"),
        );
        match fail_if_stopped(1, Err(Fatal::StorageError(storage))).await {
            Err(ServerError::ReplicationStopped(why)) => {
                assert!(why.contains("received snapshot"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let shutdown = fail_if_stopped(1, Err(Fatal::Stopped));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), shutdown)
                .await
                .is_err(),
            "a shut-down Raft leaves the broker to its own stop"
        );
    }
}
