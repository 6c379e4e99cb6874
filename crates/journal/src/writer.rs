//! The writer thread: the only owner of the segment files after recovery.
//!
//! Group commit: callers encode records into their own buffer (`Journal::append`) and hand it
//! over with `Journal::flush`, which appends it to `Queue::buf` under the queue mutex and wakes
//! the writer. The writer swaps the queued buffer with its own empty one (buffers are recycled,
//! not reallocated), releases the lock, and does write + fdatasync while new appends accumulate
//! for the next batch, so every producer that flushed during one fdatasync shares the next one.
//! After each fdatasync the highest LSN written is published on the durable watch channel.
//!
//! One batch is written in chunks of at most `batch_bytes_max` bytes, each with its own
//! fdatasync, and never across a segment boundary: a record that does not fit in the active
//! segment rolls over to the spare (see `segment.rs`), which is zero-filled between batches at
//! least as fast as the active segment fills so rolling over rarely waits for it. A segment
//! the caller releases is kept as the next spare instead of deleted, up to
//! `RECYCLED_SEGMENTS_MAX` of them, so a journal in steady state writes no zeros at all.
//!
//! Failure: the first failed write, fdatasync, rename or directory fsync is published as
//! `Err(JournalFailure)` and the writer never touches the files again (it keeps draining the
//! queue so memory does not grow, and waits to be closed). Retrying an fsync is unsafe.
//!
//! Locks (never held together): `Shared::queue` by `flush`/`release_before`/`close` and the
//! writer; `Shared::segments` by `segments`/`release_before` and the writer (which updates
//! the last entry after each sync and seals it on roll over). Files: only this thread writes,
//! renames or deletes them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{error, info};

use crate::fs::FileOps;
use crate::record::next_record;
use crate::recovery::ZERO_CHUNK_BYTES;
use crate::segment::{ActiveSegment, Spare, RECYCLED_PREFIX, SEGMENT_HEADER_BYTES, TMP_SUFFIX};
use crate::sync_latency::{SyncLatency, SyncReporter};
use crate::{JournalFailure, Lsn, SegmentInfo};

/// Zeros written to the spare per idle step: 1 MiB.
const SPARE_STEP_BYTES: u64 = 1024 * 1024;
/// Zeros written to the spare after a batch at least: 64 KiB (more when the active segment's
/// room runs short: `spare_pace_bytes`).
const SPARE_PACE_BYTES_MIN: u64 = 64 * 1024;
/// Released segments kept to become spares rather than deleted. Each holds `segment_bytes` of
/// disk (64 MiB by default) until it is used; two cover a roll over while the next release is
/// on its way.
const RECYCLED_SEGMENTS_MAX: usize = 2;
/// Capacity a batch buffer keeps after it was written: 8 MiB. Bursts of large messages grew the
/// buffers to 32 MiB each, and a `Vec` keeps its size.
const BATCH_CAPACITY_KEEP_BYTES: usize = 8 << 20;
/// Capacity a buffer keeps once the broker has gone idle (`Journal::release_idle_buffers`):
/// 256 KiB. Between bursts the three buffers kept up to 8 MiB each, and a broker that had
/// carried a burst held 23 MiB of empty buffers for good (heaptrack, docs/PERFORMANCE.md).
pub(crate) const IDLE_CAPACITY_KEEP_BYTES: usize = 256 << 10;

/// Drops `buf`'s allocation if it is empty and larger than an idle broker keeps.
pub(crate) fn shrink_idle(buf: &mut Vec<u8>) {
    if buf.is_empty() && buf.capacity() > IDLE_CAPACITY_KEEP_BYTES {
        *buf = Vec::new();
    }
}

/// After each batch the writer polls this long for the next one before it sleeps on the
/// condition variable. Waking a sleeping thread took 36 µs on average on the benchmark VM
/// (`perf sched`), a third of a disk sync, and a producer that waits for each RECEIPT pays it
/// on every message. Polling yields the CPU between looks, so a runnable thread on this CPU
/// loses little; an idle broker polls once, after its last batch.
const IDLE_POLL: Duration = Duration::from_micros(200);

pub(crate) type DurableSender = watch::Sender<Result<Lsn, JournalFailure>>;

#[derive(Default)]
pub(crate) struct Queue {
    /// Encoded records flushed by the caller and not yet taken by the writer.
    pub buf: Vec<u8>,
    /// Sealed segment files to delete, oldest first.
    pub deletes: Vec<PathBuf>,
    /// Set by close/drop after the final flush: write what is queued, then exit.
    pub closing: bool,
    /// Set when the caller went idle: the writer gives back its buffer's and this queue's
    /// spare capacity (`shrink_idle`).
    pub shrink: bool,
}

#[derive(Default)]
pub(crate) struct Shared {
    pub queue: Mutex<Queue>,
    pub wake: Condvar,
    /// Set with every hand-over to `queue` (records, deletions, closing), cleared by the
    /// writer when it takes them: what `IDLE_POLL` looks at without the lock.
    pub pending: AtomicBool,
    pub segments: Mutex<Vec<SegmentInfo>>,
    /// Record batches written + fdatasync'ed (for `Journal::stats`).
    pub batches: AtomicU64,
    /// Record bytes written.
    pub record_bytes: AtomicU64,
    /// How long the batches' fdatasyncs took.
    pub sync_latency: SyncLatency,
}

pub(crate) struct Writer {
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub batch_bytes_max: usize,
    pub ops: Arc<dyn FileOps>,
    pub shared: Arc<Shared>,
    pub durable_tx: Arc<DurableSender>,
    pub active: ActiveSegment,
    pub durable_lsn: Lsn,
    pub spare: Option<Spare>,
    /// Released segments waiting to become the next segment (newest last).
    pub recycled: Vec<Spare>,
    /// Names the next recycled file uniquely.
    pub recycled_seq: u64,
    /// New segments are holes, not zeros written ahead (`JournalConfig::sparse_segments`).
    pub sparse_segments: bool,
    /// `JournalConfig::sync_writes`.
    pub sync_writes: bool,
    pub zeros: Vec<u8>,
    pub batch: Vec<u8>,
    pub failed: bool,
    /// Written into the header of every segment this writer starts.
    pub epoch: u32,
    /// Checked before every write: a deposed master writes nothing more.
    pub fence: Option<crate::Fence>,
    pub sync_reporter: SyncReporter,
}

type Failure = JournalFailure;

fn failure(op: &'static str, path: &Path, e: std::io::Error) -> Failure {
    JournalFailure {
        op,
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

impl Writer {
    pub fn run(mut self) {
        loop {
            self.poll_for_work();
            let (deletes, closing, shrink) = {
                let mut q = self.shared.queue.lock().unwrap();
                self.shared.pending.store(false, Ordering::Release);
                while q.buf.is_empty()
                    && q.deletes.is_empty()
                    && !q.closing
                    && !self.spare_needs_work()
                    && !q.shrink
                {
                    q = self.shared.wake.wait(q).unwrap();
                }
                debug_assert!(self.batch.is_empty());
                std::mem::swap(&mut self.batch, &mut q.buf);
                (
                    std::mem::take(&mut q.deletes),
                    q.closing,
                    std::mem::take(&mut q.shrink),
                )
            };
            let written = self.batch.len() as u64;
            if !self.failed && !self.batch.is_empty() {
                if let Err(f) = self.write_batch() {
                    self.fail(f);
                }
            }
            self.batch.clear();
            if self.batch.capacity() > BATCH_CAPACITY_KEEP_BYTES {
                // A burst grew it; the three buffers rotate through here (caller, queue,
                // writer), so this bounds what all of them keep between bursts.
                self.batch = Vec::new();
            }
            if shrink {
                // After the write: what the caller flushed with its request (compaction's
                // records, say) is written, and its buffer is the one to give back.
                shrink_idle(&mut self.batch);
                shrink_idle(&mut self.shared.queue.lock().unwrap().buf);
            }
            if !self.failed {
                for path in deletes {
                    if let Err(f) = self.delete(&path) {
                        self.fail(f);
                        break;
                    }
                }
            }
            if closing {
                self.sync_reporter.closing(&self.shared.sync_latency);
                for spare in self.spare.take().into_iter().chain(self.recycled.drain(..)) {
                    let _ = self.ops.remove(spare.path());
                }
                return;
            }
            if !self.failed {
                if let Err(f) = self.spare_step(written) {
                    self.fail(f);
                }
            }
        }
    }

    /// Returns when work was handed over, or after `IDLE_POLL`.
    fn poll_for_work(&self) {
        let start = Instant::now();
        while !self.shared.pending.load(Ordering::Acquire) && start.elapsed() < IDLE_POLL {
            std::thread::yield_now();
        }
    }

    fn spare_needs_work(&self) -> bool {
        !self.failed
            && self.recycled.is_empty()
            && !self.spare.as_ref().is_some_and(Spare::is_ready)
    }

    fn new_spare(&self) -> Result<Spare, Failure> {
        if self.sparse_segments {
            Spare::create_sparse(&*self.ops, &self.dir, self.segment_bytes)
                .map_err(|(op, e)| failure(op, &self.dir, e))
        } else {
            Spare::create(&self.dir, self.segment_bytes)
                .map_err(|e| failure("create spare", &self.dir, e))
        }
    }

    /// Prepares the spare a step further after a batch of `written` bytes (0: woken with no
    /// records).
    fn spare_step(&mut self, written: u64) -> Result<(), Failure> {
        if !self.recycled.is_empty() {
            return Ok(());
        }
        if self.spare.is_none() {
            self.spare = Some(self.new_spare()?);
        }
        let active_left = self.active.remaining_bytes();
        let spare = self.spare.as_mut().unwrap();
        if !spare.is_ready() {
            let bytes_max = spare_pace_bytes(written, spare.unfilled_bytes(), active_left);
            spare
                .fill_step(&*self.ops, &self.zeros, bytes_max)
                .map_err(|(op, e)| failure(op, spare.path(), e))?;
        }
        Ok(())
    }

    fn fail(&mut self, f: Failure) {
        error!(op = f.op, path = %f.path.display(), error = %f.message,
            "journal: write path failed; no further writes, durability stops at LSN {}", self.durable_lsn);
        self.failed = true;
        let _previous = self.durable_tx.send_replace(Err(f));
    }

    fn write_batch(&mut self) -> Result<(), Failure> {
        let buf = std::mem::take(&mut self.batch);
        let result = self.write_records(&buf);
        self.batch = buf;
        result
    }

    fn write_records(&mut self, buf: &[u8]) -> Result<(), Failure> {
        let mut i = 0;
        while i < buf.len() {
            let start = i;
            let mut last_lsn = None;
            while i < buf.len() {
                let (h, total) = next_record(&buf[i..]);
                assert_eq!(
                    h.lsn,
                    last_lsn.unwrap_or(self.durable_lsn) + 1,
                    "records arrive in LSN order"
                );
                let chunk = i - start;
                if self.active.write_pos + (chunk + total) as u64 > self.active.capacity_bytes {
                    break;
                }
                if chunk > 0 && chunk + total > self.batch_bytes_max {
                    break;
                }
                i += total;
                last_lsn = Some(h.lsn);
            }
            self.check_fence()?;
            match last_lsn {
                Some(lsn) => {
                    let seg = &mut self.active;
                    self.ops
                        .write_at(&seg.file, &buf[start..i], seg.write_pos)
                        .map_err(|e| failure("write", &seg.path, e))?;
                    seg.write_pos += (i - start) as u64;
                    seg.end_log(&*self.ops)
                        .map_err(|e| failure("write", &seg.path, e))?;
                    if self.sync_writes {
                        let start = Instant::now();
                        self.ops
                            .sync_data(&seg.file)
                            .map_err(|e| failure("fdatasync", &seg.path, e))?;
                        let now = Instant::now();
                        self.sync_reporter.synced(
                            &self.shared.sync_latency,
                            now - start,
                            &seg.path,
                            now,
                        );
                    }
                    // Again before anything is reported durable: had a new master taken over
                    // between the check above and this sync, its recovery (which starts only
                    // after it bumped the epoch) may not have seen these records, and they
                    // must not be acknowledged. Passing here means the bump came after the
                    // sync, so the new master reads them.
                    self.check_fence()?;
                    self.shared.batches.fetch_add(1, Ordering::Relaxed);
                    self.shared
                        .record_bytes
                        .fetch_add((i - start) as u64, Ordering::Relaxed);
                    self.publish(lsn);
                }
                None => {
                    let (h, total) = next_record(&buf[i..]);
                    self.roll(h.lsn)?;
                    assert!(
                        total as u64 <= self.active.remaining_bytes(),
                        "a record fits in an empty segment"
                    );
                }
            }
        }
        Ok(())
    }

    fn check_fence(&self) -> Result<(), Failure> {
        match &self.fence {
            Some(fence) => fence.check().map_err(|message| JournalFailure {
                op: "fence",
                path: self.dir.clone(),
                message,
            }),
            None => Ok(()),
        }
    }

    fn publish(&mut self, lsn: Lsn) {
        assert!(lsn > self.durable_lsn, "durable LSN is monotonic");
        self.durable_lsn = lsn;
        {
            let mut segments = self.shared.segments.lock().unwrap();
            let last = segments.last_mut().expect("active segment listed");
            assert_eq!(last.base_lsn, self.active.base_lsn);
            last.end_lsn = lsn + 1;
            last.bytes = self.active.write_pos;
        }
        let _previous = self.durable_tx.send_replace(Ok(lsn));
    }

    fn roll(&mut self, base_lsn: Lsn) -> Result<(), Failure> {
        assert_eq!(
            base_lsn,
            self.durable_lsn + 1,
            "everything before a roll over is durable"
        );
        let mut spare = match (self.recycled.pop(), self.spare.take()) {
            (Some(recycled), spare) => {
                // The half-filled spare waits for the next roll over.
                self.spare = spare;
                recycled
            }
            (None, Some(spare)) => spare,
            (None, None) => self.new_spare()?,
        };
        spare
            .finish(&*self.ops, &self.zeros)
            .map_err(|(op, e)| failure(op, spare.path(), e))?;
        let segment = spare
            .into_segment(&*self.ops, &self.dir, base_lsn, self.epoch)
            .map_err(|(op, path, e)| failure(op, &path, e))?;
        {
            let mut segments = self.shared.segments.lock().unwrap();
            let last = segments.last_mut().expect("active segment listed");
            assert_eq!(last.end_lsn, base_lsn);
            let new = SegmentInfo {
                base_lsn,
                end_lsn: base_lsn,
                bytes: SEGMENT_HEADER_BYTES,
                sealed: false,
            };
            if last.base_lsn == base_lsn {
                // The active segment held no record (the first did not fit: one larger than
                // a new journal's short first segment). The new one has its name, so the
                // rename replaced its file; it replaces it in the list too, or a release
                // would delete the empty one's name, which is now the active segment.
                *last = new;
            } else {
                last.sealed = true;
                segments.push(new);
            }
        }
        info!(segment = %segment.path.display(), "journal: rolled over to a new segment");
        self.active = segment;
        Ok(())
    }

    /// Deletes one sealed segment, or keeps it to recycle, and makes that durable before the
    /// next, so a crash leaves a contiguous suffix of segments. A recycled file is a `.tmp`,
    /// which recovery deletes: nothing in it counts any more.
    fn delete(&mut self, path: &Path) -> Result<(), Failure> {
        assert_ne!(path, self.active.path, "never delete the active segment");
        let full_size = std::fs::metadata(path).is_ok_and(|m| m.len() == self.segment_bytes);
        if self.recycled.len() < RECYCLED_SEGMENTS_MAX && full_size {
            let to = self.dir.join(format!(
                "{RECYCLED_PREFIX}{}{TMP_SUFFIX}",
                self.recycled_seq
            ));
            self.recycled_seq += 1;
            let spare = Spare::recycle(&*self.ops, path, to, self.segment_bytes)
                .map_err(|(op, e)| failure(op, path, e))?;
            self.recycled.push(spare);
        } else {
            match self.ops.remove(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(failure("delete", path, e)),
            }
        }
        self.ops
            .sync_dir(&self.dir)
            .map_err(|e| failure("fsync dir", &self.dir, e))
    }
}

/// Zeros to write to an incomplete spare after a batch of `written` bytes, with `spare_left`
/// zeros still to write and `active_left` bytes of room left in the active segment. Idle
/// (nothing written), a whole step. After a batch, twice the batch's share of what is left
/// (`written * spare_left / active_left`, doubled), and at least `SPARE_PACE_BYTES_MIN`: at
/// that pace the zeros left never grow against the room left, and as the room runs out the
/// share becomes all of them, so a roll over finds the spare ready however the batches are
/// sized (on a new journal, whose first segment is short, the share is large from the start).
/// Small batches are paced by the minimum: a 64 MiB spare is done after about 1,000 of them.
/// A whole MiB after every batch, as before, put a MiB's copy into each of 64 round trips in a
/// row of a producer that waits for its RECEIPT, after every roll over (docs/PERFORMANCE.md).
fn spare_pace_bytes(written: u64, spare_left: u64, active_left: u64) -> u64 {
    if written == 0 {
        return SPARE_STEP_BYTES;
    }
    let share = u128::from(written) * 2 * u128::from(spare_left) / u128::from(active_left.max(1));
    u64::try_from(share)
        .unwrap_or(u64::MAX)
        .max(SPARE_PACE_BYTES_MIN)
}

/// Allocates the writer's zero buffer.
pub(crate) fn zeros() -> Vec<u8> {
    vec![0u8; ZERO_CHUNK_BYTES]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches of `batch` bytes into an active segment with `active` bytes of room, the spare
    /// paced after each: returns the room left when the spare was complete (None: the segment
    /// filled first, and the roll over would have had to finish the spare).
    fn room_left_when_spare_done(batch: u64, active: u64, spare: u64) -> Option<u64> {
        let (mut active_left, mut spare_left) = (active, spare);
        while active_left >= batch {
            active_left -= batch;
            spare_left =
                spare_left.saturating_sub(spare_pace_bytes(batch, spare_left, active_left));
            if spare_left == 0 {
                return Some(active_left);
            }
        }
        None
    }

    #[test]
    fn the_spare_is_complete_before_the_active_segment_is_full() {
        const MIB: u64 = 1024 * 1024;
        for batch in [100, 1_300, 64 * 1024, MIB, 4 * MIB] {
            for (active, spare) in [
                (4 * MIB, 64 * MIB),
                (64 * MIB, 64 * MIB),
                (60 * MIB, 64 * MIB),
            ] {
                let left = room_left_when_spare_done(batch, active, spare);
                assert!(
                    left.is_some(),
                    "batch {batch}, active {active}, spare {spare}: {left:?}"
                );
            }
        }
    }

    #[test]
    fn small_batches_wait_behind_small_writes_and_idle_steps_are_whole() {
        const MIB: u64 = 1024 * 1024;
        assert_eq!(spare_pace_bytes(0, 64 * MIB, 64 * MIB), SPARE_STEP_BYTES);
        assert_eq!(
            spare_pace_bytes(1_300, 64 * MIB, 60 * MIB),
            SPARE_PACE_BYTES_MIN
        );
        // The active segment's room running short raises the pace.
        assert_eq!(spare_pace_bytes(MIB, 64 * MIB, 2 * MIB), 64 * MIB);
        assert_eq!(spare_pace_bytes(1_300, 64 * MIB, 0), 64 * MIB * 2 * 1_300);
    }
}
