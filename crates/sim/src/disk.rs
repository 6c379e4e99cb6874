//! A simulated disk under the broker's durable log, and the crash model that goes with it.
//!
//! The disk outlives the broker process: a simulated crash drops the broker's tasks, not the
//! disk. What a crash does to the disk is decided when the broker next opens it (power comes
//! back): every record appended but not yet synced is kept or lost, as a random prefix —
//! like a real disk, which may have written some of the dirty pages and not others. A record
//! that was reported durable is never lost or changed; the disk checks that on every open
//! against checksums it took when it reported each record durable, so a broker that reused an
//! LSN for different bytes, or a model bug, fails the run.
//!
//! Segments are modelled (a fixed number of records each) so the core's retention and
//! compaction run as they do over the real journal; deleting a segment waits, like the
//! journal's writer, until every record appended before the deletion was asked for is durable.
//!
//! **Shared store** (master/slave over one store). Several brokers open the same disk, one
//! after another, each with the epoch the lease (`crate::lease`) granted it
//! ([`SimDisk::fenced_store`]). Each grant moves the disk's fence ([`SimDisk::grant`]): the
//! newest epoch lives in the store, as the epoch file or the database's lease row does. Every
//! write a log handle makes — append, sync, segment deletion — carries the handle's epoch, and
//! the disk refuses one whose epoch is older than the fence, atomically with the write (a
//! conditional write, as the database does it): the handle's log fails for good and nothing of
//! it is stored. A deposed master that was paused, or cut off from the lease, therefore cannot
//! store a record or have one reported durable, however late it wakes up. Every record keeps
//! its epoch, and the disk checks what the simulation's invariants need: records in strictly
//! increasing LSN order with non-decreasing epochs, no record stored after a newer epoch was
//! granted, no durability reported to a deposed master, and no durable record lost by a crash.
//! A broken check is not a panic but a [violation](SimDisk::violations) the run fails with,
//! with its simulated time, so the negative test (fencing switched off) can observe it.

use haven_engine::{Message, MessageLoader, Record};
use haven_journal::{JournalError, JournalFailure, Lsn, SegmentInfo};
use haven_server::{DurableLog, LogStore, OnRecord};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// Records per simulated segment: small, so retention and compaction happen within a run.
pub const SEGMENT_RECORDS: u64 = 256;
/// Bounds of one simulated fdatasync, in microseconds.
const SYNC_US_MIN: u64 = 100;
const SYNC_US_MAX: u64 = 4_000;
/// How often a sync cut off from the storage looks again, in simulated milliseconds.
const UNREACHABLE_RETRY_MS: u64 = 5;
/// The largest record payload the simulated log accepts (as the journal's default).
const RECORD_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Counters a run reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub opens: u64,
    pub syncs: u64,
    /// Unsynced records a crash lost / let through.
    pub lost_unsynced: u64,
    pub kept_unsynced: u64,
    pub segments_released: u64,
    pub sync_failures: u64,
    /// Writes (appends, syncs, deletions) refused because the writer's epoch was older than
    /// the fence: a deposed master tried to write.
    pub refused_writes: u64,
    /// Records stored from an epoch older than the fence. Must stay 0 while fencing is on.
    pub stale_records: u64,
}

/// One stored record.
struct Stored {
    lsn: Lsn,
    /// Epoch of the master that wrote it (0 outside the shared-store mode).
    epoch: u64,
    payload: Arc<Vec<u8>>,
}

/// One open log handle's writer: its writes on their way to the store, what it asked to make
/// durable and where it is told.
struct Writer {
    /// The epoch the handle writes with; `None` for a single-writer disk (no fencing).
    epoch: Option<u64>,
    /// The broker host writing (shared-store mode), whose reach of the storage a fault cuts.
    host: Option<usize>,
    /// Records appended while the host could not reach the storage (paused, or cut off), in
    /// order from LSN `held_base`: they reach the store — through the fence — when it can.
    held: Vec<Arc<Vec<u8>>>,
    held_base: Lsn,
    /// Set once a write was refused: the log is failed for good and stores nothing more.
    /// Further appends are numbered on from here, so the handle's LSNs never go backwards.
    refused_next: Option<Lsn>,
    /// What `flush` asked to make durable.
    flush_to: Lsn,
    sync_running: bool,
    durable_tx: watch::Sender<Result<Lsn, JournalFailure>>,
    /// One past the last LSN this handle handed out. Its own numbering: a newer master's
    /// recovery may drop this handle's unsynced records from the store, and the store's next
    /// LSN then goes back, but a real journal's next LSN never goes back for its writer. (The
    /// model once let it: a deposed master's CONNECT reply then named a producer mark above
    /// everything durable, and the client dropped 4 SENDs as stored: sim seed 1027.)
    next: Lsn,
}

struct State {
    /// Every retained record, oldest first.
    records: VecDeque<Stored>,
    /// LSN of `records[0]` (1 when nothing was ever released).
    first: Lsn,
    durable: Lsn,
    /// Open log handles by generation (the current one and, in the shared-store mode,
    /// deposed masters' handles that have not been dropped yet).
    writers: BTreeMap<u64, Writer>,
    /// The newest epoch granted over this disk: writes of older epochs are refused.
    fence_epoch: u64,
    /// Off only for the negative test: stale writes are then stored, and must be caught.
    fencing: bool,
    /// Broker hosts cut off from the storage, with how many faults cut each (a pause and a
    /// partition may overlap). Their writes wait, as on a hard NFS mount.
    cut: BTreeMap<usize, u32>,
    /// Broken invariants, each with its simulated time; the run fails on the first.
    violations: Vec<String>,
    /// How far `check_step` has verified the record order: (lsn, epoch) of the last record.
    checked: Option<(Lsn, u64)>,
    /// Deletions waiting for the records appended before them: (below, needs durable ≥).
    releases: VecDeque<(Lsn, Lsn)>,
    /// CRC of every record ever reported durable and not released: the "never lost, never
    /// changed" check.
    durable_crcs: BTreeMap<Lsn, u32>,
    /// Bumped on every open: a log handle from before a crash must never write again.
    generation: u64,
    fail_syncs: bool,
    /// Reports syncs without doing them: a crash may lose what was reported durable.
    lying: bool,
    /// What really is on stable storage (equal to `durable` unless `lying`).
    stable: Lsn,
    rng: StdRng,
    stats: DiskStats,
}

/// One broker's disk. Cheap to clone; clones share the disk.
#[derive(Clone)]
pub struct SimDisk {
    name: String,
    state: Arc<Mutex<State>>,
}

impl SimDisk {
    pub fn new(name: &str, seed: u64) -> SimDisk {
        SimDisk {
            name: name.to_string(),
            state: Arc::new(Mutex::new(State {
                records: VecDeque::new(),
                first: 1,
                durable: 0,
                writers: BTreeMap::new(),
                fence_epoch: 0,
                fencing: true,
                cut: BTreeMap::new(),
                violations: Vec::new(),
                checked: None,
                releases: VecDeque::new(),
                durable_crcs: BTreeMap::new(),
                generation: 0,
                fail_syncs: false,
                lying: false,
                stable: 0,
                rng: StdRng::seed_from_u64(seed),
                stats: DiskStats::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("sim disk poisoned")
    }

    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// From now on every sync fails (the broker must stop; nothing more is acknowledged).
    /// Cleared by the next open, as a replaced disk would be.
    pub fn fail_syncs(&self) {
        self.lock().fail_syncs = true;
    }

    /// From now on syncs are reported but not done (a disk with a lying write cache). A
    /// broken disk for negative tests: the checker must then find losses.
    pub fn lie_about_syncs(&self) {
        self.lock().lying = true;
    }

    /// The log store a broker opens on start (a disk with one writer: no fencing).
    pub fn store(&self) -> Box<dyn LogStore> {
        Box::new(SimStore {
            disk: self.clone(),
            epoch: None,
            host: None,
        })
    }

    /// The log store of the master of `epoch` over a shared disk: every write it makes is
    /// refused once a newer epoch has been granted.
    /// `host` is the broker host writing, whose reach of the storage a fault can cut.
    pub fn fenced_store(&self, epoch: u64, host: usize) -> Box<dyn LogStore> {
        assert!(epoch > 0, "epochs start at 1");
        Box::new(SimStore {
            disk: self.clone(),
            epoch: Some(epoch),
            host: Some(host),
        })
    }

    /// A new master was granted `epoch`: from now on writes of older epochs are refused.
    /// Called by the lease, atomically with the grant (the epoch lives in the store).
    pub fn grant(&self, epoch: u64) {
        let mut st = self.lock();
        assert!(
            epoch > st.fence_epoch,
            "epoch {epoch} granted after epoch {}",
            st.fence_epoch
        );
        st.fence_epoch = epoch;
    }

    /// Test-only: store stale writes instead of refusing them (the negative test).
    pub fn disable_fencing(&self) {
        self.lock().fencing = false;
    }

    /// Cuts broker host `host` off from the storage (a partition, or the host is paused).
    /// Its appends wait in the writer; its syncs wait too.
    pub fn cut_off(&self, host: usize) {
        *self.lock().cut.entry(host).or_default() += 1;
    }

    /// Ends one `cut_off` of `host`. When none is left, the writes it held reach the store,
    /// through the fence: a deposed master's are refused.
    pub fn reconnect(&self, host: usize) {
        let mut st = self.lock();
        let n = st
            .cut
            .get_mut(&host)
            .expect("reconnect of a host not cut off");
        *n -= 1;
        if *n > 0 {
            return;
        }
        st.cut.remove(&host);
        let generations: Vec<u64> = st
            .writers
            .iter()
            .filter(|(_, w)| w.host == Some(host) && !w.held.is_empty())
            .map(|(g, _)| *g)
            .collect();
        for generation in generations {
            st.apply_held(generation);
        }
    }

    pub fn reachable(&self, host: usize) -> bool {
        !self.lock().cut.contains_key(&host)
    }

    /// Every invariant broken so far, each with its simulated time.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// The per-step check: the records stored since the last call follow their predecessors
    /// in strictly increasing LSN order with non-decreasing epochs, and every record reported
    /// durable is still held. Cheap: it looks only at what is new. Returns the violations
    /// found so far (also those found as writes happened).
    pub fn check_step(&self) -> Vec<String> {
        let mut st = self.lock();
        st.check_order();
        if let Some((&lsn, _)) = st.durable_crcs.iter().next_back() {
            if lsn > st.durable || lsn < st.first || lsn >= st.next_lsn() {
                let what = format!(
                    "record {lsn} was reported durable but the store holds {}..{} \
                     (durable to {})",
                    st.first,
                    st.next_lsn(),
                    st.durable
                );
                st.violate(what);
            }
        }
        st.violations.clone()
    }

    /// Records held, for tests of the disk model.
    pub fn durable_lsn(&self) -> Lsn {
        self.lock().durable
    }
}

impl State {
    fn next_lsn(&self) -> Lsn {
        self.first + self.records.len() as u64
    }

    fn record(&self, lsn: Lsn) -> Option<&Arc<Vec<u8>>> {
        let i = lsn.checked_sub(self.first)?;
        self.records.get(i as usize).map(|r| {
            assert_eq!(r.lsn, lsn, "sim disk records out of order");
            &r.payload
        })
    }

    /// Records a broken invariant with the simulated time (0 outside a simulation: the unit
    /// tests).
    fn violate(&mut self, what: String) {
        // Outside a host (a fault healed by the run, a unit test) the run adds the time.
        match turmoil::sim_elapsed() {
            Some(t) => self
                .violations
                .push(format!("at {} ms: {what}", t.as_millis())),
            None => self.violations.push(what),
        }
    }

    /// Walks the records stored since the last check (see `check_step`).
    fn check_order(&mut self) {
        let start = match self.checked {
            Some((lsn, _)) if lsn + 1 >= self.first => lsn + 1,
            _ => self.first,
        };
        let mut last = self.checked;
        for lsn in start..self.next_lsn() {
            let r = &self.records[(lsn - self.first) as usize];
            let (l, e) = (r.lsn, r.epoch);
            if let Some((prev_lsn, prev_epoch)) = last {
                if l <= prev_lsn || e < prev_epoch {
                    self.violate(format!(
                        "split brain in the store: record {l} of epoch {e} follows record \
                         {prev_lsn} of epoch {prev_epoch}"
                    ));
                }
            }
            last = Some((l, e));
        }
        self.checked = last;
    }

    /// The LSN the next append of writer `generation` gets.
    fn writer_next(&self, generation: u64) -> Lsn {
        match self.writers.get(&generation) {
            Some(w) if w.refused_next.is_some() => w.refused_next.expect("checked"),
            Some(w) if !w.held.is_empty() => w.held_base + w.held.len() as u64,
            Some(w) => self.next_lsn().max(w.next),
            None => self.next_lsn(),
        }
    }

    /// Stores one record of writer `generation`, through the fence. False if refused.
    fn store(&mut self, generation: u64, payload: Arc<Vec<u8>>) -> bool {
        let epoch = self.writers.get(&generation).and_then(|w| w.epoch);
        if !self.admit(generation, epoch, "append") {
            return false;
        }
        let lsn = self.next_lsn();
        let epoch = epoch.unwrap_or(0);
        if epoch < self.fence_epoch {
            // Only with fencing off: a deposed master's record reaches the store.
            self.stats.stale_records += 1;
            let fence = self.fence_epoch;
            self.violate(format!(
                "record {lsn} of epoch {epoch} stored after epoch {fence} was granted"
            ));
        }
        self.records.push_back(Stored {
            lsn,
            epoch,
            payload,
        });
        true
    }

    /// The writes writer `generation` held while its host was cut off reach the store now.
    fn apply_held(&mut self, generation: u64) {
        let w = self.writers.get_mut(&generation).expect("writer");
        let held = std::mem::take(&mut w.held);
        let base = w.held_base;
        for (i, payload) in held.iter().enumerate() {
            let fresh = self
                .writers
                .get(&generation)
                .and_then(|w| w.epoch)
                .is_none_or(|e| e >= self.fence_epoch);
            if fresh {
                // Nobody else wrote meanwhile: the LSNs handed out still follow the store.
                assert_eq!(self.next_lsn(), base + i as u64, "held writes out of place");
            }
            if !self.store(generation, payload.clone()) {
                // The rest were refused with it: the log failed at the first.
                let w = self.writers.get_mut(&generation).expect("writer");
                w.refused_next = Some(base + held.len() as u64);
                self.stats.refused_writes += (held.len() - i - 1) as u64;
                return;
            }
        }
    }

    /// Whether a write by `generation`/`epoch` may go ahead. A handle of an older epoch than
    /// the fence is refused (its log fails for good) unless fencing is off; a single-writer
    /// handle from before a crash is a model bug.
    fn admit(&mut self, generation: u64, epoch: Option<u64>, op: &'static str) -> bool {
        let Some(epoch) = epoch else {
            assert_eq!(
                self.generation, generation,
                "a log handle from before a crash was used"
            );
            return true;
        };
        if epoch < self.fence_epoch {
            if !self.fencing {
                return true;
            }
            self.stats.refused_writes += 1;
            let failure = JournalFailure {
                op: "fence",
                path: PathBuf::from("sim:shared"),
                message: format!(
                    "{op} refused: this master's epoch {epoch} is older than epoch {}",
                    self.fence_epoch
                ),
            };
            let next = self.writer_next(generation);
            if let Some(w) = self.writers.get_mut(&generation) {
                w.refused_next = Some(next);
                // Sticky, as the journal's failure is.
                let _ = w.durable_tx.send_replace(Err(failure));
            }
            return false;
        }
        assert_eq!(epoch, self.fence_epoch, "an epoch newer than the fence");
        assert_eq!(
            self.generation, generation,
            "two opens of the shared disk in one epoch"
        );
        true
    }

    /// Power comes back after whatever happened: unsynced records survive as a random prefix.
    fn recover(&mut self) {
        if self.lying {
            // The cache lied: only what was stable at the last open survives for sure.
            self.durable = self.stable.max(self.first - 1);
            let durable = self.durable;
            self.durable_crcs.retain(|lsn, _| *lsn <= durable);
        }
        // A log numbers on from its own appends whatever another writer did to the store
        // (the core asserts it), but a writer's next LSN here follows the store's while it is
        // ahead: a deposed master, paused while the next one wrote, saw that master's records
        // in its numbering. Losing them must not take its numbering back.
        let store_next = self.next_lsn();
        for w in self.writers.values_mut() {
            w.next = w.next.max(store_next);
        }
        let unsynced = self.next_lsn() - 1 - self.durable;
        let kept = if unsynced == 0 {
            0
        } else {
            self.rng.gen_range(0..=unsynced)
        };
        self.stats.kept_unsynced += kept;
        self.stats.lost_unsynced += unsynced - kept;
        let keep_len = (self.durable + kept + 1 - self.first) as usize;
        self.records.truncate(keep_len);
        if self.checked.is_some_and(|(lsn, _)| lsn >= self.next_lsn()) {
            self.checked = None;
        }
        self.durable = self.next_lsn() - 1;
        self.stable = self.durable;
        self.releases.clear();
        self.fail_syncs = false;
        self.generation += 1;
        self.stats.opens += 1;
        // What was durable before must still be here, byte for byte.
        let mut broken = Vec::new();
        for (lsn, crc) in &self.durable_crcs {
            match self.record(*lsn) {
                None => broken.push(format!("durable record {lsn} lost by a crash")),
                Some(p) if crc32c::crc32c(p) != *crc => {
                    broken.push(format!("durable record {lsn} changed on disk"))
                }
                Some(_) => {}
            }
        }
        for b in broken {
            self.violate(b);
        }
        self.durable_crcs
            .retain(|lsn, _| *lsn <= self.durable && *lsn >= self.first);
        for lsn in self
            .durable_crcs
            .keys()
            .next_back()
            .map_or(self.first, |l| l + 1)..=self.durable
        {
            let crc = crc32c::crc32c(self.record(lsn).expect("kept record"));
            self.durable_crcs.insert(lsn, crc);
        }
    }

    /// The sync finished: everything up to `to` is durable; queued deletions that waited for
    /// it happen.
    fn synced(&mut self, to: Lsn) {
        assert!(
            to >= self.durable && to < self.next_lsn(),
            "sync beyond the log"
        );
        for lsn in self.durable + 1..=to {
            let crc = crc32c::crc32c(self.record(lsn).expect("synced record"));
            let before = self.durable_crcs.insert(lsn, crc);
            assert!(before.is_none(), "record {lsn} made durable twice");
        }
        self.durable = to;
        if !self.lying {
            self.stable = to;
        }
        self.stats.syncs += 1;
        while let Some(&(below, needs)) = self.releases.front() {
            if needs > self.durable {
                break;
            }
            self.releases.pop_front();
            self.release_now(below);
        }
    }

    fn release_now(&mut self, below: Lsn) {
        let active_base = self.segment_base(self.next_lsn());
        let mut released = 0;
        while self.first + SEGMENT_RECORDS <= below.min(active_base)
            && self.first + SEGMENT_RECORDS <= self.durable + 1
        {
            for _ in 0..SEGMENT_RECORDS {
                let r = self.records.pop_front().expect("segment records");
                self.durable_crcs.remove(&r.lsn);
            }
            self.first += SEGMENT_RECORDS;
            released += 1;
        }
        self.stats.segments_released += released;
    }

    fn segment_base(&self, lsn: Lsn) -> Lsn {
        (lsn - 1) / SEGMENT_RECORDS * SEGMENT_RECORDS + 1
    }
}

struct SimStore {
    disk: SimDisk,
    /// The master's epoch in the shared-store mode; `None` for a disk with one writer.
    epoch: Option<u64>,
    /// The broker host writing (shared-store mode).
    host: Option<usize>,
}

impl LogStore for SimStore {
    fn loader(&self) -> Box<dyn MessageLoader> {
        Box::new(SimLoader {
            disk: self.disk.clone(),
        })
    }

    fn record_bytes_max(&self) -> usize {
        RECORD_BYTES_MAX
    }

    fn open(self: Box<Self>, on_record: OnRecord<'_>) -> Result<Box<dyn DurableLog>, JournalError> {
        let (generation, records, durable) = {
            let mut st = self.disk.lock();
            if let Some(epoch) = self.epoch {
                if epoch < st.fence_epoch {
                    // Deposed before it could recover: the journal refuses a stale epoch too.
                    st.stats.refused_writes += 1;
                    return Err(JournalError::StaleEpoch {
                        mine: epoch_u32(epoch),
                        found: epoch_u32(st.fence_epoch),
                    });
                }
            }
            st.recover();
            let records: Vec<(Lsn, Arc<Vec<u8>>)> = st
                .records
                .iter()
                .map(|r| (r.lsn, r.payload.clone()))
                .collect();
            (st.generation, records, st.durable)
        };
        for (lsn, payload) in records {
            on_record(lsn, &payload).map_err(JournalError::Replay)?;
        }
        let (durable_tx, durable_rx) = watch::channel(Ok(durable));
        let mut st = self.disk.lock();
        if st.generation != generation {
            // Another master opened the store while this one replayed (it was deposed).
            return Err(JournalError::StaleEpoch {
                mine: epoch_u32(self.epoch.unwrap_or(0)),
                found: epoch_u32(st.fence_epoch),
            });
        }
        st.writers.insert(
            generation,
            Writer {
                epoch: self.epoch,
                host: self.host,
                held: Vec::new(),
                held_base: 0,
                refused_next: None,
                flush_to: durable,
                sync_running: false,
                durable_tx,
                next: durable + 1,
            },
        );
        drop(st);
        Ok(Box::new(SimLog {
            disk: self.disk,
            generation,
            epoch: self.epoch,
            durable_rx,
        }))
    }

    fn describe(&self) -> String {
        match self.epoch {
            Some(e) => format!("sim disk {} (epoch {e})", self.disk.name),
            None => format!("sim disk {}", self.disk.name),
        }
    }
}

struct SimLog {
    disk: SimDisk,
    generation: u64,
    epoch: Option<u64>,
    durable_rx: watch::Receiver<Result<Lsn, JournalFailure>>,
}

impl SimLog {
    /// The disk, checked: a single-writer handle from before a crash is a model bug.
    fn lock(&self) -> MutexGuard<'_, State> {
        let st = self.disk.lock();
        if self.epoch.is_none() {
            assert_eq!(
                st.generation, self.generation,
                "a log handle from before a crash was used"
            );
        }
        st
    }

    fn refused(st: &State, generation: u64) -> bool {
        st.writers
            .get(&generation)
            .is_some_and(|w| w.refused_next.is_some())
    }
}

impl Drop for SimLog {
    fn drop(&mut self) {
        if let Ok(mut st) = self.disk.state.lock() {
            st.writers.remove(&self.generation);
        }
    }
}

/// Syncs until nothing more was asked for, one simulated fdatasync per round (group commit).
/// A sync completes only while the writer's host reaches the storage (a hard mount waits),
/// and is fenced like any write: it is refused if a newer epoch was granted meanwhile.
async fn sync_loop(disk: SimDisk, generation: u64, host: Option<usize>) {
    loop {
        let (target, wait) = {
            let mut st = disk.lock();
            let current = st.generation == generation;
            let durable = st.durable;
            let Some(w) = st.writers.get_mut(&generation) else {
                return;
            };
            // A single-writer handle from before a crash: its broker is gone.
            if (w.epoch.is_none() && !current) || w.flush_to <= durable {
                w.sync_running = false;
                return;
            }
            let target = w.flush_to;
            let us = st.rng.gen_range(SYNC_US_MIN..=SYNC_US_MAX);
            (target, Duration::from_micros(us))
        };
        tokio::time::sleep(wait).await;
        while host.is_some_and(|h| !disk.reachable(h)) {
            tokio::time::sleep(Duration::from_millis(UNREACHABLE_RETRY_MS)).await;
        }
        let mut st = disk.lock();
        let Some(epoch) = st.writers.get(&generation).map(|w| w.epoch) else {
            return;
        };
        if epoch.is_none() && st.generation != generation {
            return;
        }
        if !st.admit(generation, epoch, "fdatasync") {
            return;
        }
        if let Some(epoch) = epoch.filter(|e| *e < st.fence_epoch) {
            // Fencing is off and a deposed master's sync went through: it is told its records
            // are durable while a newer master owns the store. Split brain.
            let fence = st.fence_epoch;
            st.violate(format!(
                "durability up to record {target} reported to the master of epoch {epoch} \
                 after epoch {fence} was granted"
            ));
            let w = st.writers.get_mut(&generation).expect("writer");
            w.sync_running = false;
            let _ = w.durable_tx.send(Ok(target));
            return;
        }
        if st.fail_syncs {
            st.stats.sync_failures += 1;
            let failure = JournalFailure {
                op: "fdatasync",
                path: PathBuf::from(format!("sim:{}", disk.name)),
                message: "injected I/O error".into(),
            };
            let w = st.writers.get_mut(&generation).expect("writer");
            w.sync_running = false;
            let _ = w.durable_tx.send(Err(failure));
            return;
        }
        st.synced(target);
        let durable = st.durable;
        let w = st.writers.get(&generation).expect("writer");
        let _ = w.durable_tx.send(Ok(durable));
    }
}

impl DurableLog for SimLog {
    fn append(&mut self, payload: &[u8]) -> Lsn {
        assert!(payload.len() <= RECORD_BYTES_MAX, "record over the limit");
        let generation = self.generation;
        let mut st = self.lock();
        let lsn = st.writer_next(generation);
        let payload = Arc::new(payload.to_vec());
        let cut = st
            .writers
            .get(&generation)
            .and_then(|w| w.host)
            .is_some_and(|h| st.cut.contains_key(&h));
        let w = st.writers.get_mut(&generation).expect("open writer");
        w.next = lsn + 1;
        if let Some(next) = w.refused_next {
            w.refused_next = Some(next + 1);
        } else if cut {
            // On its way to the store: it arrives (or is refused) when the host reaches it.
            if w.held.is_empty() {
                w.held_base = lsn;
            }
            w.held.push(payload);
        } else if !st.store(generation, payload) {
            let w = st.writers.get_mut(&generation).expect("open writer");
            let next = w.refused_next.expect("refused");
            w.refused_next = Some(next + 1);
        }
        lsn
    }

    fn next_lsn(&self) -> Lsn {
        self.lock().writer_next(self.generation)
    }

    fn flush(&mut self) {
        // Not a write itself: the sync it starts is fenced when it completes.
        let generation = self.generation;
        let mut st = self.lock();
        let to = st.writer_next(generation) - 1;
        let (durable, fail_syncs) = (st.durable, st.fail_syncs);
        let w = st.writers.get_mut(&generation).expect("open writer");
        if w.refused_next.is_some() || to <= durable {
            return;
        }
        w.flush_to = to;
        if !w.sync_running && !fail_syncs {
            w.sync_running = true;
            tokio::spawn(sync_loop(self.disk.clone(), generation, w.host));
        }
    }

    fn durable(&self) -> watch::Receiver<Result<Lsn, JournalFailure>> {
        self.durable_rx.clone()
    }

    fn durable_lsn(&self) -> Result<Lsn, JournalFailure> {
        self.durable_rx.borrow().clone()
    }

    fn segments(&self) -> Vec<SegmentInfo> {
        let st = self.lock();
        let next = st.next_lsn();
        let active = st.segment_base(next);
        let mut out = Vec::new();
        let mut base = st.first;
        while base <= active {
            let end = (base + SEGMENT_RECORDS)
                .min(next)
                .min(st.durable + 1)
                .max(base);
            let bytes = (base..end)
                .map(|l| st.record(l).map_or(0, |p| p.len() as u64 + 16))
                .sum();
            out.push(SegmentInfo {
                base_lsn: base,
                end_lsn: end,
                bytes,
                sealed: base < active && end == base + SEGMENT_RECORDS,
            });
            base += SEGMENT_RECORDS;
        }
        out
    }

    fn segment_bytes(&self) -> u64 {
        // Nominal: the core multiplies segments by this for `disk_bytes_max`.
        SEGMENT_RECORDS * 4096
    }

    fn release_before(&mut self, lsn: Lsn) -> usize {
        let generation = self.generation;
        let mut st = self.lock();
        let cut = st
            .writers
            .get(&generation)
            .and_then(|w| w.host)
            .is_some_and(|h| st.cut.contains_key(&h));
        // A host cut off from the storage deletes nothing now; the core asks again later.
        if cut || Self::refused(&st, generation) || !st.admit(generation, self.epoch, "delete") {
            return 0;
        }
        let needs = st.next_lsn() - 1;
        let active = st.segment_base(st.next_lsn());
        let whole = (lsn.min(active).saturating_sub(st.first)) / SEGMENT_RECORDS;
        st.releases.push_back((lsn, needs));
        if needs <= st.durable {
            let (below, _) = st.releases.pop_back().expect("just queued");
            st.release_now(below);
        }
        whole as usize
    }

    fn free_bytes(&self) -> Option<u64> {
        None
    }

    fn close(self: Box<Self>) -> Result<(), JournalError> {
        // An orderly stop syncs everything appended (nothing in the simulation stops a
        // shared-store broker in order, so nothing is held here).
        let generation = self.generation;
        let mut st = self.lock();
        let held = st
            .writers
            .get(&generation)
            .is_some_and(|w| !w.held.is_empty());
        assert!(!held, "an orderly stop with writes held");
        if Self::refused(&st, generation) || !st.admit(generation, self.epoch, "close") {
            let failure = self
                .durable_rx
                .borrow()
                .clone()
                .expect_err("a refused log failed");
            return Err(JournalError::Failed(failure));
        }
        let to = st.next_lsn() - 1;
        if to > st.durable {
            st.synced(to);
        }
        Ok(())
    }
}

/// Epochs are `u32` in the journal's segment headers; the lease never comes near that.
fn epoch_u32(epoch: u64) -> u32 {
    u32::try_from(epoch).expect("epochs fit in u32")
}

/// Reads paged-out messages back from the disk (only records reported durable).
struct SimLoader {
    disk: SimDisk,
}

impl MessageLoader for SimLoader {
    fn load(&mut self, lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        let st = self.disk.lock();
        if lsn > st.durable {
            return Err(format!("record {lsn} is not durable yet"));
        }
        let payload = st
            .record(lsn)
            .ok_or_else(|| format!("record {lsn} was released"))?;
        let record = Record::decode(payload).map_err(|e| format!("lsn {lsn}: {e}"))?;
        record
            .message_with_seq(seq)
            .cloned()
            .ok_or_else(|| format!("record {lsn} does not carry message {seq}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(disk: &SimDisk) -> (Box<dyn DurableLog>, Vec<Lsn>) {
        let mut seen = Vec::new();
        let log = disk
            .store()
            .open(&mut |lsn, _| {
                seen.push(lsn);
                Ok(())
            })
            .expect("open");
        (log, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_keeps_every_durable_record_and_a_prefix_of_the_rest() {
        for seed in 0..50 {
            let disk = SimDisk::new("d", seed);
            let (mut log, _) = open(&disk);
            for i in 0..10u8 {
                log.append(&[i]);
            }
            log.flush();
            let mut rx = log.durable();
            while *rx.borrow_and_update() != Ok(10) {
                rx.changed().await.expect("sync");
            }
            for i in 10..20u8 {
                log.append(&[i]);
            }
            drop(log); // crash: nothing more was flushed
            let (log, seen) = open(&disk);
            assert!(
                seen.len() >= 10 && seen.len() <= 20,
                "seed {seed}: {seen:?}"
            );
            assert_eq!(seen, (1..=seen.len() as u64).collect::<Vec<_>>());
            assert_eq!(log.next_lsn(), seen.len() as u64 + 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_waits_for_the_records_appended_before_it() {
        let disk = SimDisk::new("d", 1);
        let (mut log, _) = open(&disk);
        for _ in 0..SEGMENT_RECORDS * 2 + 5 {
            log.append(b"x");
        }
        log.flush();
        let want = SEGMENT_RECORDS * 2 + 5;
        let mut rx = log.durable();
        while *rx.borrow_and_update() != Ok(want) {
            rx.changed().await.expect("sync");
        }
        log.append(b"supersedes");
        assert_eq!(log.release_before(SEGMENT_RECORDS + 1), 1);
        assert_eq!(
            log.segments()[0].base_lsn,
            1,
            "not before the new record is durable"
        );
        log.flush();
        while *rx.borrow_and_update() != Ok(want + 1) {
            rx.changed().await.expect("sync");
        }
        assert_eq!(log.segments()[0].base_lsn, SEGMENT_RECORDS + 1);
        drop(log);
        let (_, seen) = open(&disk);
        assert_eq!(seen.first(), Some(&(SEGMENT_RECORDS + 1)));
    }

    fn open_fenced(disk: &SimDisk, epoch: u64, host: usize) -> (Box<dyn DurableLog>, Vec<Lsn>) {
        let mut seen = Vec::new();
        let log = disk
            .fenced_store(epoch, host)
            .open(&mut |lsn, _| {
                seen.push(lsn);
                Ok(())
            })
            .expect("open");
        (log, seen)
    }

    async fn wait_durable(log: &dyn DurableLog, lsn: Lsn) {
        let mut rx = log.durable();
        while *rx.borrow_and_update() != Ok(lsn) {
            rx.changed().await.expect("sync");
        }
    }

    /// A master paused with a write in flight wakes up deposed: the write is refused when it
    /// reaches the store, so are its later ones, and its log fails.
    #[tokio::test(start_paused = true)]
    async fn a_deposed_masters_writes_are_refused_and_its_log_fails() {
        let disk = SimDisk::new("d", 1);
        disk.grant(1);
        let (mut old, _) = open_fenced(&disk, 1, 0);
        old.append(b"a");
        old.flush();
        wait_durable(&*old, 1).await;
        disk.cut_off(0);
        assert_eq!(old.append(b"in flight"), 2);
        disk.grant(2);
        let (mut new, seen) = open_fenced(&disk, 2, 1);
        assert_eq!(seen, vec![1], "the held write never reached the store");
        disk.reconnect(0);
        assert!(
            old.durable_lsn().is_err(),
            "the deposed master's log failed"
        );
        assert_eq!(old.append(b"late"), 3, "its LSNs do not go backwards");
        assert_eq!(new.append(b"b"), 2);
        let stats = disk.stats();
        // One refusal: after it the log has failed and sends the store nothing more.
        assert_eq!((stats.refused_writes, stats.stale_records), (1, 0));
        assert_eq!(disk.check_step(), Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn without_fencing_a_deposed_masters_record_is_a_violation() {
        let disk = SimDisk::new("d", 1);
        disk.disable_fencing();
        disk.grant(1);
        let (mut old, _) = open_fenced(&disk, 1, 0);
        disk.grant(2);
        let (mut new, _) = open_fenced(&disk, 2, 1);
        new.append(b"new");
        old.append(b"stale");
        assert_eq!(disk.stats().stale_records, 1);
        let v = disk.check_step();
        assert!(
            v[0].contains("record 2 of epoch 1 stored after epoch 2"),
            "{v:?}"
        );
        assert!(v[1].contains("split brain"), "{v:?}");
    }

    #[test]
    #[should_panic(expected = "from before a crash")]
    fn a_handle_from_before_a_crash_cannot_write() {
        let disk = SimDisk::new("d", 1);
        let (mut old, _) = open(&disk);
        let _new = open(&disk);
        old.append(b"stale");
    }
}
