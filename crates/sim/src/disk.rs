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
}

struct State {
    /// Every retained record, oldest first, with its LSN.
    records: VecDeque<(Lsn, Arc<Vec<u8>>)>,
    /// LSN of `records[0]` (1 when nothing was ever released).
    first: Lsn,
    durable: Lsn,
    /// What `flush` asked to make durable.
    flush_to: Lsn,
    sync_running: bool,
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
    durable_tx: Option<watch::Sender<Result<Lsn, JournalFailure>>>,
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
                flush_to: 0,
                sync_running: false,
                releases: VecDeque::new(),
                durable_crcs: BTreeMap::new(),
                generation: 0,
                fail_syncs: false,
                lying: false,
                stable: 0,
                durable_tx: None,
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

    /// The log store a broker opens on start.
    pub fn store(&self) -> Box<dyn LogStore> {
        Box::new(SimStore { disk: self.clone() })
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
        self.records.get(i as usize).map(|(l, p)| {
            assert_eq!(*l, lsn, "sim disk records out of order");
            p
        })
    }

    /// Power comes back after whatever happened: unsynced records survive as a random prefix.
    fn recover(&mut self) {
        if self.lying {
            // The cache lied: only what was stable at the last open survives for sure.
            self.durable = self.stable.max(self.first - 1);
            let durable = self.durable;
            self.durable_crcs.retain(|lsn, _| *lsn <= durable);
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
        self.durable = self.next_lsn() - 1;
        self.stable = self.durable;
        self.flush_to = self.durable;
        self.releases.clear();
        self.sync_running = false;
        self.fail_syncs = false;
        self.generation += 1;
        self.stats.opens += 1;
        // What was durable before must still be here, byte for byte.
        for (lsn, crc) in &self.durable_crcs {
            let payload = self
                .record(*lsn)
                .unwrap_or_else(|| panic!("durable record {lsn} lost by the disk"));
            assert_eq!(
                crc32c::crc32c(payload),
                *crc,
                "durable record {lsn} changed on disk"
            );
        }
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
                let (lsn, _) = self.records.pop_front().expect("segment records");
                self.durable_crcs.remove(&lsn);
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
            st.recover();
            let records: Vec<(Lsn, Arc<Vec<u8>>)> = st.records.iter().cloned().collect();
            (st.generation, records, st.durable)
        };
        for (lsn, payload) in records {
            on_record(lsn, &payload).map_err(JournalError::Replay)?;
        }
        let (tx, rx) = watch::channel(Ok(durable));
        self.disk.lock().durable_tx = Some(tx);
        Ok(Box::new(SimLog {
            disk: self.disk,
            generation,
            durable_rx: rx,
        }))
    }

    fn describe(&self) -> String {
        format!("sim disk {}", self.disk.name)
    }
}

struct SimLog {
    disk: SimDisk,
    generation: u64,
    durable_rx: watch::Receiver<Result<Lsn, JournalFailure>>,
}

impl SimLog {
    fn lock(&self) -> MutexGuard<'_, State> {
        let st = self.disk.lock();
        assert_eq!(
            st.generation, self.generation,
            "a log handle from before a crash was used"
        );
        st
    }
}

/// Syncs until nothing more was asked for, one simulated fdatasync per round (group commit).
async fn sync_loop(disk: SimDisk, generation: u64) {
    loop {
        let (target, wait) = {
            let mut st = disk.lock();
            if st.generation != generation || st.flush_to <= st.durable {
                st.sync_running = false;
                return;
            }
            let us = st.rng.gen_range(SYNC_US_MIN..=SYNC_US_MAX);
            (st.flush_to, Duration::from_micros(us))
        };
        tokio::time::sleep(wait).await;
        let mut st = disk.lock();
        if st.generation != generation {
            return;
        }
        if st.fail_syncs {
            st.stats.sync_failures += 1;
            st.sync_running = false;
            let failure = JournalFailure {
                op: "fdatasync",
                path: PathBuf::from(format!("sim:{}", disk.name)),
                message: "injected I/O error".into(),
            };
            if let Some(tx) = &st.durable_tx {
                let _ = tx.send(Err(failure));
            }
            return;
        }
        st.synced(target);
        let durable = st.durable;
        if let Some(tx) = &st.durable_tx {
            let _ = tx.send(Ok(durable));
        }
    }
}

impl DurableLog for SimLog {
    fn append(&mut self, payload: &[u8]) -> Lsn {
        let mut st = self.lock();
        assert!(payload.len() <= RECORD_BYTES_MAX, "record over the limit");
        let lsn = st.next_lsn();
        st.records.push_back((lsn, Arc::new(payload.to_vec())));
        lsn
    }

    fn next_lsn(&self) -> Lsn {
        self.lock().next_lsn()
    }

    fn flush(&mut self) {
        let mut st = self.lock();
        st.flush_to = st.next_lsn() - 1;
        if st.flush_to > st.durable && !st.sync_running && !st.fail_syncs {
            st.sync_running = true;
            tokio::spawn(sync_loop(self.disk.clone(), self.generation));
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
        let mut st = self.lock();
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
        // An orderly stop syncs everything appended.
        let mut st = self.lock();
        let to = st.next_lsn() - 1;
        if to > st.durable {
            st.synced(to);
        }
        Ok(())
    }
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

    #[test]
    #[should_panic(expected = "from before a crash")]
    fn a_handle_from_before_a_crash_cannot_write() {
        let disk = SimDisk::new("d", 1);
        let (mut old, _) = open(&disk);
        let _new = open(&disk);
        old.append(b"stale");
    }
}
