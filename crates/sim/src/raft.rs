//! Simulation of replicated mode's consensus: openraft (the version and settings Haven pins)
//! on simulated time, a simulated network and simulated disks, under a seeded fault schedule,
//! with the Raft safety invariants checked at every step.
//!
//! What runs is openraft itself, the exact version Haven pins, with Haven's default timing
//! (heartbeat 50 ms, each member's election timeout drawn at start between 100 and 200 ms,
//! openraft's leader lease the largest of them; ticks that fire a little late, as on a real
//! machine: `raft_clock`), the same storage-v2 traits and the `loosen-follower-log-revert`
//! feature Haven enables, and Haven's pause after a split vote (`haven_raft::split_vote`). The
//! broker's journals are replaced by
//! in-memory disks (the Raft log and vote are durable once appended, as Haven's are after their
//! fsync; the state machine is volatile and rebuilt from the snapshot and the log, as Haven's
//! unsynced state journal is). The process tests (`crates/cli/tests/replicated.rs`) run the
//! real storage and network; this runs the algorithm through far more faults than they can.
//!
//! Faults: members crash and restart, links are cut (one way or both; the leader's side is
//! often the minority), messages are delayed and lost. Invariants, checked every
//! [`CHECK_EVERY_MS`] of simulated time:
//! - **one leader per term**: no two members are ever leader of the same term;
//! - **committed entries are never lost**: every write a leader acknowledged to the client is,
//!   at the same index and term, in the log (or the snapshot) of every leader of the term in
//!   which it was committed or a later one. The entry's own term is not that term: a leader
//!   restarted from its disk leads its old term again (openraft restores a committed vote for
//!   itself as leadership) and can commit that term's entries only after winning a later term,
//!   so a leader of a term between the two may rightly lack them;
//! - **state machine safety**: members that applied the same index applied the same entry.
//!
//! After the fault phase every link heals and every member restarts; the group must elect a
//! leader and every member must apply everything (liveness), and then every acknowledged write
//! must be applied exactly once, in order, on every member.
//!
//! Determinism: the fault schedule, delays and losses come from the seed, time is tokio's
//! paused clock on one thread, and the election timeouts and late ticks come from the seed too
//! (`raft_clock`), so a seed replays its run exactly (a test checks it).
//!
//! Haven runs openraft with `single-term-leader` (standard Raft). Without it openraft lets a
//! later candidate with a higher node id be elected in the same term, and "one leader per
//! term" does not hold: this simulation found that, and the feature was turned on for it.

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder, ServerState,
    SnapshotMeta, StorageError, StoredMembership,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};
use std::time::Duration;

openraft::declare_raft_types!(
    /// The simulation's Raft: each entry is one client write, a number.
    pub SimConfig:
        D = u64,
        R = (),
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = crate::raft_clock::SimRuntime,
);

type Raft = openraft::Raft<SimConfig>;
type Entry = openraft::Entry<SimConfig>;
type LogId = openraft::LogId<u64>;
type Vote = openraft::Vote<u64>;
type Err = StorageError<u64>;

/// Simulated time of the fault phase.
pub const FAULT_MS: u64 = 20_000;
/// Concurrent client writers (each waits for its write to commit before the next).
pub const CLIENTS: u64 = 8;
/// How often the invariants are checked.
pub const CHECK_EVERY_MS: u64 = 5;
/// Bound on the group recovering once every fault is healed (liveness).
pub const HEAL_WAIT_MS: u64 = 30_000;
/// One-way message delay range.
const DELAY_MS: std::ops::RangeInclusive<u64> = 1..=8;
/// Share of messages lost, in per mille.
const LOSS_PER_MILLE: u32 = 20;
/// Between faults.
const FAULT_GAP_MS: std::ops::Range<u64> = 50..600;
/// How long a client write may take before the client gives up on it (unknown outcome).
const WRITE_TIMEOUT_MS: u64 = 2_000;
/// Haven's defaults (`[ha]`): heartbeat 50 ms, election timeout 100 ms.
const HEARTBEAT_MS: u64 = 50;
const ELECTION_TIMEOUT_MS: u64 = 100;

/// What one member keeps on its disk. The log and the vote are durable (Haven fsyncs them);
/// `sm` is memory, lost at a crash and rebuilt from `snapshot` and the log.
#[derive(Default)]
struct Disk {
    vote: Option<Vote>,
    log: BTreeMap<u64, Entry>,
    purged: Option<LogId>,
    snapshot: Option<(SnapshotMeta<u64, BasicNode>, Vec<u8>)>,
    sm: Sm,
}

#[derive(Clone, Default)]
struct Sm {
    applied: Option<LogId>,
    membership: StoredMembership<u64, BasicNode>,
    /// `(index, value)` of every write applied, in order.
    writes: Vec<(u64, u64)>,
}

fn encode(writes: &[(u64, u64)]) -> Vec<u8> {
    writes
        .iter()
        .flat_map(|(i, v)| i.to_le_bytes().into_iter().chain(v.to_le_bytes()))
        .collect()
}

fn decode(bytes: &[u8]) -> Vec<(u64, u64)> {
    assert_eq!(
        bytes.len() % 16,
        0,
        "a snapshot is whole (index, value) pairs"
    );
    bytes
        .chunks_exact(16)
        .map(|c| {
            let i = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let v = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            (i, v)
        })
        .collect()
}

impl Disk {
    /// After a crash: memory is gone, the snapshot is what the state machine starts from. A
    /// `lossy` disk also loses the log entries not applied yet: a broken store, to show that
    /// the checker catches one.
    fn crash(&mut self, lossy: bool) {
        if lossy {
            let applied = self.sm.applied.map_or(0, |a| a.index + 1);
            self.log.split_off(&applied);
        }
        self.sm = match &self.snapshot {
            Some((meta, data)) => Sm {
                applied: meta.last_log_id,
                membership: meta.last_membership.clone(),
                writes: decode(data),
            },
            None => Sm::default(),
        };
    }
}

#[derive(Clone)]
struct Store(Arc<Mutex<Disk>>);

impl RaftLogReader<SimConfig> for Store {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, Err> {
        use std::ops::Bound;
        let d = self.0.lock().unwrap();
        // A lossy log (see `run_raft_with`) can be asked for a range whose start is past its
        // end; `BTreeMap::range` panics on that (and poisons the disk's lock), where the run
        // should go on until the checker catches the loss. Such a range holds nothing.
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end_inclusive = match range.end_bound() {
            Bound::Included(&e) => Some(e),
            Bound::Excluded(&e) => e.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        match end_inclusive {
            Some(end) if start <= end => {
                Ok(d.log.range(start..=end).map(|(_, e)| e.clone()).collect())
            }
            _ => Ok(Vec::new()),
        }
    }
}

impl RaftLogStorage<SimConfig> for Store {
    type LogReader = Store;

    async fn get_log_state(&mut self) -> Result<LogState<SimConfig>, Err> {
        let d = self.0.lock().unwrap();
        let last = d.log.values().next_back().map(|e| e.log_id).or(d.purged);
        Ok(LogState {
            last_purged_log_id: d.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Store {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), Err> {
        self.0.lock().unwrap().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, Err> {
        Ok(self.0.lock().unwrap().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<SimConfig>) -> Result<(), Err>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut d = self.0.lock().unwrap();
        for e in entries {
            d.log.insert(e.log_id.index, e);
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), Err> {
        let mut d = self.0.lock().unwrap();
        d.log.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), Err> {
        let mut d = self.0.lock().unwrap();
        let kept = d.log.split_off(&(log_id.index + 1));
        d.log = kept;
        d.purged = Some(log_id);
        Ok(())
    }
}

impl RaftSnapshotBuilder<SimConfig> for Store {
    async fn build_snapshot(&mut self) -> Result<Snapshot<SimConfig>, Err> {
        let mut d = self.0.lock().unwrap();
        let meta = SnapshotMeta {
            last_log_id: d.sm.applied,
            last_membership: d.sm.membership.clone(),
            snapshot_id: format!("{:?}", d.sm.applied),
        };
        let data = encode(&d.sm.writes);
        d.snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<SimConfig> for Store {
    type SnapshotBuilder = Store;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<u64, BasicNode>), Err> {
        let d = self.0.lock().unwrap();
        Ok((d.sm.applied, d.sm.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, Err>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut d = self.0.lock().unwrap();
        let mut out = Vec::new();
        for e in entries {
            assert!(
                d.sm.applied.is_none_or(|a| a.index < e.log_id.index),
                "entry {} applied twice (applied up to {:?})",
                e.log_id,
                d.sm.applied
            );
            match &e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(v) => d.sm.writes.push((e.log_id.index, *v)),
                EntryPayload::Membership(m) => {
                    d.sm.membership = StoredMembership::new(Some(e.log_id), m.clone())
                }
            }
            d.sm.applied = Some(e.log_id);
            out.push(());
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Store {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, Err> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), Err> {
        let mut d = self.0.lock().unwrap();
        let data = snapshot.into_inner();
        d.sm = Sm {
            applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            writes: decode(&data),
        };
        d.snapshot = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<SimConfig>>, Err> {
        let d = self.0.lock().unwrap();
        Ok(d.snapshot.as_ref().map(|(meta, data)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(data.clone())),
        }))
    }
}

/// The members, the links between them and the seeded randomness.
struct World {
    rafts: Mutex<Vec<Option<Raft>>>,
    /// `(from, to)`: messages from `from` to `to` are dropped.
    cuts: Mutex<BTreeSet<(u64, u64)>>,
    rng: Mutex<StdRng>,
    model: Model,
    /// Each running member's `split_vote::step_back` task, when the model has it.
    step_backs: Mutex<Vec<Option<tokio::task::JoinHandle<()>>>>,
}

impl World {
    fn raft(&self, id: u64) -> Option<Raft> {
        self.rafts.lock().unwrap()[id as usize].clone()
    }

    fn cut(&self, from: u64, to: u64) -> bool {
        self.cuts.lock().unwrap().contains(&(from, to))
    }

    fn delay(&self) -> Duration {
        Duration::from_millis(self.rng.lock().unwrap().gen_range(DELAY_MS))
    }

    fn lost(&self) -> bool {
        self.rng.lock().unwrap().gen_ratio(LOSS_PER_MILLE, 1000)
    }
}

struct Link {
    world: Arc<World>,
    from: u64,
    to: u64,
}

struct Links {
    world: Arc<World>,
    from: u64,
}

impl RaftNetworkFactory<SimConfig> for Links {
    type Network = Link;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Link {
        Link {
            world: self.world.clone(),
            from: self.from,
            to: target,
        }
    }
}

type RpcErr<E> = RPCError<u64, BasicNode, E>;

impl Link {
    /// Carries one request and its answer across the simulated network.
    async fn call<T, E, F, Fut>(&self, ask: F) -> Result<T, RpcErr<RaftError<u64, E>>>
    where
        E: std::error::Error,
        F: FnOnce(Raft) -> Fut,
        Fut: std::future::Future<Output = Result<T, RaftError<u64, E>>>,
    {
        tokio::time::sleep(self.world.delay()).await;
        let target = self.world.raft(self.to);
        let Some(target) = target.filter(|_| !self.world.cut(self.from, self.to)) else {
            let e = std::io::Error::other("unreachable");
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        };
        if self.world.lost() {
            let e = std::io::Error::other("request lost");
            return Err(RPCError::Network(NetworkError::new(&e)));
        }
        let answer = ask(target).await;
        tokio::time::sleep(self.world.delay()).await;
        if self.world.cut(self.to, self.from) || self.world.lost() {
            let e = std::io::Error::other("answer lost");
            return Err(RPCError::Network(NetworkError::new(&e)));
        }
        answer.map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.to, e)))
    }
}

impl RaftNetwork<SimConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr<RaftError<u64>>> {
        self.call(|r| async move { r.append_entries(rpc).await })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<SimConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<RaftError<u64, InstallSnapshotError>>> {
        self.call(|r| async move { r.install_snapshot(rpc).await })
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcErr<RaftError<u64>>> {
        self.call(|r| async move { r.vote(rpc).await }).await
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct RaftOutcome {
    pub seed: u64,
    pub members: u64,
    /// Invariant violations, each with the simulated time; empty when the run held.
    pub violations: Vec<String>,
    pub acknowledged: u64,
    pub crashes: u64,
    pub cuts: u64,
    /// Distinct terms that had a leader.
    pub leaders: u64,
    /// From healing to a leader that every member follows and has caught up with, to the
    /// 50 ms the wait polls at; `None` if that did not happen in [`HEAL_WAIT_MS`].
    pub settled_ms: Option<u64>,
}

impl RaftOutcome {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl std::fmt::Display for RaftOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "raft seed {}: {} members, {} writes acknowledged, {} crashes, {} cuts, {} terms \
             with a leader",
            self.seed, self.members, self.acknowledged, self.crashes, self.cuts, self.leaders
        )?;
        if let Some(ms) = self.settled_ms {
            write!(f, ", settled {ms} ms after healing")?;
        }
        for v in &self.violations {
            write!(f, "\n  VIOLATION {v}")?;
        }
        Ok(())
    }
}

/// What the simulated members run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    pub clock: Clock,
    /// Haven's pause after a split vote (`haven_raft::split_vote`).
    pub step_back: bool,
}

impl Model {
    /// What Haven runs on.
    pub const HAVEN: Model = Model {
        clock: Clock::Real,
        step_back: true,
    };
    /// The model before 2026-12-05, kept to replay the seeds found under it.
    pub const FORMER: Model = Model {
        clock: Clock::Exact,
        step_back: false,
    };
}

/// How the members keep time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// As on a real machine (`raft_clock`): each member draws its election timeout from
    /// Haven's range when it starts, and its ticks fire a little late.
    Real,
    /// One fixed election timeout per member (100 + id·100/(n+1) ms) and ticks exactly on
    /// time. Members started at the same instant stand for election in step for ever under it,
    /// unless they step back after a split vote.
    Exact,
}

/// openraft's settings for member `id`: Haven's (`[ha]` defaults). openraft draws the
/// election timeout in `[min, max)` once, at start.
fn config(id: u64, members: u64, clock: Clock) -> Arc<openraft::Config> {
    let (min, max) = match clock {
        Clock::Real => (ELECTION_TIMEOUT_MS, 2 * ELECTION_TIMEOUT_MS),
        Clock::Exact => {
            let min = ELECTION_TIMEOUT_MS + id * ELECTION_TIMEOUT_MS / (members + 1);
            (min, min + 1)
        }
    };
    let c = openraft::Config {
        cluster_name: "sim".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: min,
        election_timeout_max: max,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(200),
        max_in_snapshot_log_to_keep: 20,
        max_payload_entries: 64,
        ..Default::default()
    };
    Arc::new(c.validate().expect("valid raft settings"))
}

async fn start(world: &Arc<World>, disks: &[Arc<Mutex<Disk>>], id: u64) {
    let members = disks.len() as u64;
    let store = Store(disks[id as usize].clone());
    let links = Links {
        world: world.clone(),
        from: id,
    };
    let raft = Raft::new(
        id,
        config(id, members, world.model.clock),
        links,
        store.clone(),
        store,
    )
    .await
    .expect("raft starts");
    if world.model.step_back {
        let task = tokio::spawn(haven_raft::split_vote::step_back(
            raft.clone(),
            haven_raft::split_vote::PAUSE_MAX_ELECTION_TIMEOUTS * ELECTION_TIMEOUT_MS,
            || true,
        ));
        world.step_backs.lock().unwrap()[id as usize] = Some(task);
    }
    world.rafts.lock().unwrap()[id as usize] = Some(raft);
}

async fn crash(world: &Arc<World>, disks: &[Arc<Mutex<Disk>>], id: u64, lossy: bool) {
    if let Some(task) = world.step_backs.lock().unwrap()[id as usize].take() {
        task.abort();
    }
    let raft = world.rafts.lock().unwrap()[id as usize].take();
    if let Some(raft) = raft {
        let _ = raft.shutdown().await;
        disks[id as usize].lock().unwrap().crash(lossy);
    }
}

/// A write a leader acknowledged to its client.
struct Acked {
    value: u64,
    log_id: LogId,
    /// The acknowledging leader's term when it answered: no earlier than the term in which the
    /// entry was committed, so every leader of this term or a later one holds the entry.
    committed_by_term: u64,
}

/// Records leaders per term and checks the invariants against every member's state,
/// incrementally: what was verified once stays verified (a leader never drops an entry of its
/// own log while it leads, and an applied write never changes).
#[derive(Default)]
struct Checker {
    leader_of_term: BTreeMap<u64, u64>,
    /// Every write a leader acknowledged.
    acked: Vec<Acked>,
    /// Per `(leader, term)`: how many of `acked` were found in its log.
    verified: BTreeMap<(u64, u64), usize>,
    /// The write applied at each index, as first seen applied anywhere.
    applied_at: BTreeMap<u64, u64>,
    /// Per member: how many of its applied writes were compared with `applied_at`.
    compared: Vec<usize>,
    violations: Vec<String>,
}

impl Checker {
    fn check(&mut self, world: &World, disks: &[Arc<Mutex<Disk>>], now_ms: u64) {
        let rafts = world.rafts.lock().unwrap().clone();
        for (id, raft) in rafts.iter().enumerate() {
            let Some(raft) = raft else { continue };
            let m = raft.metrics().borrow().clone();
            if m.state != ServerState::Leader {
                continue;
            }
            let id = id as u64;
            let term = m.current_term;
            match self.leader_of_term.insert(term, id) {
                Some(other) if other != id => self.violations.push(format!(
                    "at {now_ms} ms: members {other} and {id} both lead term {term}"
                )),
                _ => {}
            }
            // Leader completeness: every write acknowledged in this term or before is in this
            // leader's log or snapshot. (A deposed leader of an older term may lack newer
            // writes: it can no longer commit anything.)
            let d = disks[id as usize].lock().unwrap();
            let purged = d.purged.map(|p| p.index);
            let snapshot: BTreeMap<u64, u64> = match (&d.snapshot, purged) {
                (Some((_, data)), Some(_)) => decode(data).into_iter().collect(),
                _ => BTreeMap::new(),
            };
            let from = self.verified.get(&(id, term)).copied().unwrap_or(0);
            for Acked {
                value: v,
                log_id,
                committed_by_term,
            } in &self.acked[from..]
            {
                if *committed_by_term > term {
                    continue;
                }
                let held = if purged.is_some_and(|p| log_id.index <= p) {
                    snapshot.get(&log_id.index) == Some(v)
                } else {
                    d.log.get(&log_id.index).is_some_and(|e| {
                        e.log_id == *log_id
                            && matches!(e.payload, EntryPayload::Normal(x) if x == *v)
                    })
                };
                if !held {
                    self.violations.push(format!(
                        "at {now_ms} ms: leader {id} of term {term} lacks acknowledged write \
                         {v} at {log_id}"
                    ));
                }
            }
            self.verified.insert((id, term), self.acked.len());
        }
        // State machine safety: the same index applied means the same write everywhere.
        self.compared.resize(disks.len(), 0);
        for (id, d) in disks.iter().enumerate() {
            let d = d.lock().unwrap();
            let writes = &d.sm.writes;
            if writes.len() < self.compared[id] {
                self.compared[id] = 0; // Rebuilt after a crash: compare again.
            }
            for (i, v) in &writes[self.compared[id]..] {
                match self.applied_at.get(i) {
                    Some(w) if w != v => self.violations.push(format!(
                        "at {now_ms} ms: index {i} applied as {v} on member {id}, as {w} elsewhere"
                    )),
                    Some(_) => {}
                    None => {
                        self.applied_at.insert(*i, *v);
                    }
                }
            }
            self.compared[id] = writes.len();
        }
        self.violations.dedup();
    }
}

/// One seeded run. Never panics on a violation: it reports it.
pub fn run_raft(seed: u64) -> RaftOutcome {
    run_raft_with(seed, false, Model::HAVEN)
}

/// The leader every member follows, in its term. Not merely a member in the leader state: a
/// member restarted from its disk leads its old term again until it hears of a later one (see
/// the checker), and measuring catch-up against such a leader's shorter log would end a wait
/// too soon.
fn followed_leader(rafts: &[Raft]) -> Option<&Raft> {
    rafts.iter().find(|r| {
        let m = r.metrics().borrow().clone();
        m.state == ServerState::Leader
            && rafts.iter().all(|o| {
                let o = o.metrics().borrow().clone();
                o.current_term == m.current_term && o.current_leader == Some(m.id)
            })
    })
}

/// Members that start in step: `members` fresh members started at the same instant, each
/// initialised with the whole group at once, so that each stands at once with an equal log, over
/// the same delays and losses as [`run_raft`] and no other fault. Returns how long it took
/// until every member followed one leader, or `None` if none did within [`HEAL_WAIT_MS`].
pub fn elect_from_a_standing_start(seed: u64, members: u64, model: Model) -> Option<u64> {
    runtime(seed, model).block_on(async move {
        let (world, disks) = start_group(seed, members, model).await;
        let all: BTreeMap<u64, BasicNode> =
            (0..members).map(|id| (id, BasicNode::default())).collect();
        let rafts: Vec<Raft> = (0..members)
            .map(|id| world.raft(id).expect("started"))
            .collect();
        for r in &rafts {
            r.initialize(all.clone()).await.expect("initialise");
        }
        let started = tokio::time::Instant::now();
        let mut elected = None;
        while started.elapsed() < Duration::from_millis(HEAL_WAIT_MS) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if followed_leader(&rafts).is_some() {
                elected = Some(started.elapsed().as_millis() as u64);
                break;
            }
        }
        for id in 0..members {
            crash(&world, &disks, id, false).await;
        }
        elected
    })
}

/// One seeded run; with `lossy_log`, a crash loses the member's unapplied log entries (a
/// broken store: the invariants must catch it).
pub fn run_raft_with(seed: u64, lossy_log: bool, model: Model) -> RaftOutcome {
    // A task that panics (openraft's core, a member's store) ends quietly inside tokio; the
    // run reports it, as a release build would abort on it.
    crate::panics::watch();
    let mut outcome = runtime(seed, model).block_on(run_async(seed, lossy_log, model));
    for p in crate::panics::seen() {
        outcome
            .violations
            .push(format!("a simulated task panicked: {p}"));
    }
    outcome
}

/// A run's runtime: one thread on tokio's paused clock, with this thread's timing seeded. The
/// timing draws from a stream of its own, so the fault schedule depends on the seed alone and
/// not on how many ticks ran.
fn runtime(seed: u64, model: Model) -> tokio::runtime::Runtime {
    crate::raft_clock::seed(seed ^ 0x71c4, model.clock == Clock::Real);
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// `members` fresh members, started at the same instant.
async fn start_group(seed: u64, members: u64, model: Model) -> (Arc<World>, Vec<Arc<Mutex<Disk>>>) {
    let world = Arc::new(World {
        rafts: Mutex::new(vec![None; members as usize]),
        cuts: Mutex::new(BTreeSet::new()),
        rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)),
        model,
        step_backs: Mutex::new((0..members).map(|_| None).collect()),
    });
    let disks: Vec<Arc<Mutex<Disk>>> = (0..members).map(|_| Arc::default()).collect();
    for id in 0..members {
        start(&world, &disks, id).await;
    }
    (world, disks)
}

async fn run_async(seed: u64, lossy: bool, model: Model) -> RaftOutcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let members: u64 = if rng.gen_bool(0.5) { 3 } else { 5 };
    let (world, disks) = start_group(seed, members, model).await;
    let all: BTreeMap<u64, BasicNode> = (0..members).map(|id| (id, BasicNode::default())).collect();
    world
        .raft(0)
        .expect("started")
        .initialize(all)
        .await
        .expect("initialise");
    let checker = Arc::new(Mutex::new(Checker::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_client = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = tokio::time::Instant::now();
    let now_ms = move || started.elapsed().as_millis() as u64;
    // The clients: each writes its own numbers (client c: c, c + CLIENTS, ...) to whoever
    // leads; a write is acknowledged once the leader reports it committed (and applied).
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|c| {
            let (world, checker, stop) = (world.clone(), checker.clone(), stop_client.clone());
            tokio::spawn(async move {
                let mut next = c;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let leader = world
                        .rafts
                        .lock()
                        .unwrap()
                        .iter()
                        .flatten()
                        .filter(|r| r.metrics().borrow().state == ServerState::Leader)
                        .max_by_key(|r| r.metrics().borrow().current_term)
                        .cloned();
                    let Some(leader) = leader else { continue };
                    let v = next;
                    next += CLIENTS;
                    let write = leader.client_write(v);
                    if let Ok(Ok(resp)) =
                        tokio::time::timeout(Duration::from_millis(WRITE_TIMEOUT_MS), write).await
                    {
                        let committed_by_term = leader.metrics().borrow().current_term;
                        checker.lock().unwrap().acked.push(Acked {
                            value: v,
                            log_id: resp.log_id,
                            committed_by_term,
                        });
                    }
                }
            })
        })
        .collect();
    let checking = {
        let (world, disks, checker, stop) =
            (world.clone(), disks.clone(), checker.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                checker.lock().unwrap().check(&world, &disks, now_ms());
                tokio::time::sleep(Duration::from_millis(CHECK_EVERY_MS)).await;
            }
        })
    };
    // The fault phase.
    let (mut crashes, mut cuts) = (0, 0);
    while now_ms() < FAULT_MS {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(FAULT_GAP_MS))).await;
        let down: Vec<u64> = (0..members).filter(|&i| world.raft(i).is_none()).collect();
        match rng.gen_range(0..10) {
            // Crash a member, the leader more often than not.
            0..=2 if down.len() < members as usize => {
                let leader = (0..members).find(|&i| {
                    world
                        .raft(i)
                        .is_some_and(|r| r.metrics().borrow().state == ServerState::Leader)
                });
                let victim = match leader {
                    Some(l) if rng.gen_bool(0.6) => l,
                    _ => rng.gen_range(0..members),
                };
                if world.raft(victim).is_some() {
                    crash(&world, &disks, victim, lossy).await;
                    crashes += 1;
                }
            }
            3..=4 if !down.is_empty() => {
                let id = down[rng.gen_range(0..down.len())];
                start(&world, &disks, id).await;
            }
            // Cut a random group off from the rest, both ways or one way.
            5..=6 => {
                let side: Vec<u64> = (0..members).filter(|_| rng.gen_bool(0.4)).collect();
                let one_way = rng.gen_bool(0.3);
                let mut c = world.cuts.lock().unwrap();
                for &a in &side {
                    for b in (0..members).filter(|b| !side.contains(b)) {
                        c.insert((a, b));
                        if !one_way {
                            c.insert((b, a));
                        }
                    }
                }
                cuts += 1;
            }
            7..=8 => world.cuts.lock().unwrap().clear(),
            _ => {}
        }
    }
    // Healing: every link, every member; the client stops, so the group can settle.
    stop_client.store(true, std::sync::atomic::Ordering::Relaxed);
    world.cuts.lock().unwrap().clear();
    for id in 0..members {
        if world.raft(id).is_none() {
            start(&world, &disks, id).await;
        }
    }
    let healed_at = now_ms();
    let healed_by = healed_at + HEAL_WAIT_MS;
    let mut settled = None;
    while now_ms() < healed_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let rafts: Vec<Raft> = world
            .rafts
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect();
        if let Some(l) = followed_leader(&rafts) {
            let last = l.metrics().borrow().last_log_index;
            if last.is_some()
                && rafts
                    .iter()
                    .all(|r| r.metrics().borrow().last_applied.map(|a| a.index) >= last)
            {
                settled = Some(now_ms() - healed_at);
                break;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    let _ = checking.await;
    let mut checker = Arc::try_unwrap(checker)
        .unwrap_or_else(|_| panic!("the tasks have ended"))
        .into_inner()
        .unwrap();
    checker.check(&world, &disks, now_ms());
    if settled.is_none() {
        checker.violations.push(format!(
            "no leader with every member caught up {HEAL_WAIT_MS} ms after healing"
        ));
    }
    // Every acknowledged write applied exactly once, in order, on every member.
    let acked: Vec<(u64, u64)> = checker
        .acked
        .iter()
        .map(|a| (a.log_id.index, a.value))
        .collect();
    for (id, d) in disks.iter().enumerate() {
        let writes = d.lock().unwrap().sm.writes.clone();
        let set: BTreeMap<u64, u64> = writes.iter().copied().collect();
        if set.len() != writes.len() {
            checker
                .violations
                .push(format!("member {id} applied an index twice"));
        }
        if settled.is_some() {
            for (i, v) in &acked {
                if set.get(i) != Some(v) {
                    checker.violations.push(format!(
                        "member {id} lacks acknowledged write {v} at index {i} after healing"
                    ));
                }
            }
        }
    }
    for id in 0..members {
        crash(&world, &disks, id, false).await;
    }
    RaftOutcome {
        seed,
        members,
        acknowledged: checker.acked.len() as u64,
        leaders: checker.leader_of_term.len() as u64,
        violations: checker.violations,
        crashes,
        cuts,
        settled_ms: settled,
    }
}
