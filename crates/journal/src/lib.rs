//! haven-journal: a segmented append-only log of opaque records with group commit.
//!
//! Haven's promise is that a persistent message that got its RECEIPT survives kill -9 and power
//! loss; this crate is where "durable" is decided. The broker appends its own encoded records,
//! each gets a monotonically increasing `Lsn` (the first record ever is 1; the counter continues
//! across segments, restarts and deletion of old segments), and a record counts as durable
//! only once `durable()` reports an LSN at or above it, i.e. after write + fdatasync.
//!
//! Design: appends are buffered on the caller's side without I/O; `flush` hands the buffer to
//! one writer thread that owns the files and does write + fdatasync for everything handed over
//! since the last sync (group commit, `writer.rs`). Records carry a CRC32C and their LSN
//! (`record.rs`) in preallocated, zero-filled segment files (`segment.rs`). `open` streams the
//! files back, truncates a torn tail and refuses anything that looks like real corruption
//! (`recovery.rs`). A failed write or fsync is fatal and sticky (`error.rs`). Durable records
//! are read back by LSN through a `Reader` on its own file descriptors (`reader.rs`).
//!
//! Ownership: a `Journal` is used from one task (`&mut self` for appends); clone the receiver
//! from `durable()` to wait for durability elsewhere. The caller bounds how much it appends
//! ahead of durability (in-flight appends are the broker's limit, not the journal's).

mod config;
mod error;
mod fs;
mod probe;
mod reader;
mod record;
mod recovery;
mod segment;
mod sync_latency;
mod writer;

use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::watch;

pub use config::{
    Fence, JournalConfig, BATCH_BYTES_MAX_DEFAULT, FIRST_SEGMENT_BYTES_MAX, SEGMENT_BYTES_DEFAULT,
    SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, SLOW_SYNC_WARN_MS_DEFAULT,
};
pub use error::{JournalError, JournalFailure};
#[cfg(feature = "fault-injection")]
pub use fs::Faults;
pub use probe::{fdatasync_probe, try_fdatasync_probe};
pub use reader::{Reader, ReaderLimits, ReaderStats};
pub use record::RECORD_HEADER_BYTES;
pub use segment::{segment_file_name, SEGMENT_HEADER_BYTES};
pub use sync_latency::SyncStats;

use fs::{FileOps, RealFs};
use sync_latency::SyncReporter;
use writer::{Queue, Shared, Writer};

/// Log sequence number. The first record ever written is 1; 0 means "nothing".
pub type Lsn = u64;

/// One segment file, as listed by `Journal::segments`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// LSN of the first record in the segment (also in its file name).
    pub base_lsn: Lsn,
    /// One past the last durable record in it (`== base_lsn` when empty).
    pub end_lsn: Lsn,
    /// Bytes used: header plus durable records (the file itself is preallocated larger).
    pub bytes: u64,
    /// Not the active segment: complete, fully durable, and never written again.
    pub sealed: bool,
}

/// Counters since `open`, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Record batches written, each followed by one fdatasync.
    pub batches: u64,
    /// Record bytes written (headers included).
    pub record_bytes: u64,
    /// The batches' fdatasyncs: how many and how long.
    pub sync: SyncStats,
}

pub struct Journal {
    config: JournalConfig,
    record_bytes_max: usize,
    /// Encoded records appended since the last flush.
    buf: Vec<u8>,
    next_lsn: Lsn,
    shared: Arc<Shared>,
    durable_rx: watch::Receiver<Result<Lsn, JournalFailure>>,
    writer: Option<JoinHandle<()>>,
}

impl Journal {
    /// Opens (creating the dir if needed), recovers, and calls `on_record(lsn, payload)` for
    /// every valid record in order.
    ///
    /// A torn tail (last segment, damaged/incomplete record with nothing valid after it) is
    /// truncated with a warn log. Damage anywhere else (a bad record in a sealed segment, a bad
    /// record in the last segment followed by a valid one, an LSN gap) is
    /// `Err(JournalError::Corrupt { segment, offset, reason })`, never silently skipped. An
    /// error returned by `on_record` aborts open with `JournalError::Replay`. See `recovery.rs`
    /// for the one false alarm this rule can raise after a power loss.
    pub fn open(
        config: JournalConfig,
        on_record: impl FnMut(Lsn, &[u8]) -> Result<(), String>,
    ) -> Result<Journal, JournalError> {
        Journal::open_with_ops(config, Arc::new(RealFs), on_record)
    }

    /// `open` with fault switches on the writer's file operations (tests and chaos runs).
    #[cfg(feature = "fault-injection")]
    pub fn open_with_faults(
        config: JournalConfig,
        faults: Arc<Faults>,
        on_record: impl FnMut(Lsn, &[u8]) -> Result<(), String>,
    ) -> Result<Journal, JournalError> {
        Journal::open_with_ops(config, Arc::new(fs::FaultyFs { faults }), on_record)
    }

    fn open_with_ops(
        config: JournalConfig,
        ops: Arc<dyn FileOps>,
        mut on_record: impl FnMut(Lsn, &[u8]) -> Result<(), String>,
    ) -> Result<Journal, JournalError> {
        config.validate().map_err(JournalError::Config)?;
        let recovered = recovery::recover(&config, &*ops, &mut on_record)?;
        let durable_lsn = recovered.next_lsn - 1;
        let (durable_tx, durable_rx) = watch::channel(Ok(durable_lsn));
        let shared = Arc::new(Shared {
            queue: std::sync::Mutex::new(Queue::default()),
            wake: std::sync::Condvar::new(),
            segments: std::sync::Mutex::new(recovered.segments),
            ..Shared::default()
        });
        let durable_tx = Arc::new(durable_tx);
        let writer = Writer {
            dir: config.dir.clone(),
            segment_bytes: config.segment_bytes,
            batch_bytes_max: config.batch_bytes_max,
            ops,
            shared: shared.clone(),
            durable_tx: durable_tx.clone(),
            active: recovered.active,
            durable_lsn,
            spare: None,
            recycled: Vec::new(),
            recycled_seq: 0,
            sparse_segments: config.sparse_segments,
            sync_writes: config.sync_writes,
            zeros: writer::zeros(),
            batch: Vec::new(),
            failed: false,
            epoch: config.epoch,
            fence: config.fence.clone(),
            sync_reporter: SyncReporter::new(
                std::time::Duration::from_millis(config.slow_sync_warn_ms),
                std::time::Instant::now(),
            ),
        };
        let handle = std::thread::Builder::new()
            .name("haven-journal-writer".to_string())
            .spawn(move || {
                // A panic (a broken invariant) must not look like "still durable up to N".
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run()));
                if let Err(panic) = result {
                    let _previous = durable_tx.send_replace(Err(JournalFailure {
                        op: "writer thread",
                        path: std::path::PathBuf::new(),
                        message: "panicked".to_string(),
                    }));
                    std::panic::resume_unwind(panic);
                }
            })
            .map_err(|e| JournalError::io(&config.dir, e))?;
        Ok(Journal {
            record_bytes_max: config.record_bytes_max(),
            config,
            buf: Vec::new(),
            next_lsn: recovered.next_lsn,
            shared,
            durable_rx,
            writer: Some(handle),
        })
    }

    /// Buffers one record and returns its LSN; no I/O. The record is durable once `durable()`
    /// reports an LSN >= the returned one, which requires a `flush`.
    ///
    /// Panics if `payload.len() > record_bytes_max()` (half a segment's record area, about
    /// 32 MiB by default): the caller must enforce its own smaller frame limit first.
    pub fn append(&mut self, payload: &[u8]) -> Lsn {
        assert!(
            payload.len() <= self.record_bytes_max,
            "journal record of {} bytes exceeds record_bytes_max {}",
            payload.len(),
            self.record_bytes_max
        );
        let lsn = self.next_lsn;
        record::encode_into(&mut self.buf, lsn, payload);
        self.next_lsn += 1;
        lsn
    }

    /// The LSN the next append will get.
    pub fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    /// Largest payload `append` accepts.
    pub fn record_bytes_max(&self) -> usize {
        self.record_bytes_max
    }

    pub fn config(&self) -> &JournalConfig {
        &self.config
    }

    /// Hands what has been appended to the writer thread (cheap if nothing new).
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        {
            let mut q = self.shared.queue.lock().unwrap();
            if q.buf.is_empty() {
                // Take the writer's recycled (empty, allocated) buffer in exchange.
                std::mem::swap(&mut q.buf, &mut self.buf);
            } else {
                q.buf.extend_from_slice(&self.buf);
                self.buf.clear();
            }
        }
        self.shared
            .pending
            .store(true, std::sync::atomic::Ordering::Release);
        self.shared.wake.notify_one();
    }

    /// Gives back the spare capacity of the write buffers (this one, the queue's and the
    /// writer's) once the caller has gone idle: a burst grows each to up to 8 MiB, which a
    /// quiet broker would otherwise keep. Cheap; the writer shrinks its part when it wakes.
    pub fn release_idle_buffers(&mut self) {
        writer::shrink_idle(&mut self.buf);
        self.shared.queue.lock().unwrap().shrink = true;
        self.shared.wake.notify_one();
    }

    /// Highest LSN known durable (written + fdatasync'ed), or `Err` once a write or fsync failed.
    /// The error is sticky: the broker must stop; appends after it are never reported durable.
    /// If every sender is gone (the writer thread exited) the last value stays.
    pub fn durable(&self) -> watch::Receiver<Result<Lsn, JournalFailure>> {
        self.durable_rx.clone()
    }

    /// The current value of `durable()`.
    pub fn durable_lsn(&self) -> Result<Lsn, JournalFailure> {
        self.durable_rx.borrow().clone()
    }

    pub fn stats(&self) -> JournalStats {
        use std::sync::atomic::Ordering::Relaxed;
        JournalStats {
            batches: self.shared.batches.load(Relaxed),
            record_bytes: self.shared.record_bytes.load(Relaxed),
            sync: self.shared.sync_latency.stats(),
        }
    }

    /// A `Reader` with the default limits on this journal's directory, for reading durable
    /// records back by LSN. It works on its own file descriptors, independently of the writer
    /// thread. Open one for each task that reads.
    pub fn reader(&self) -> Result<Reader, JournalError> {
        Reader::open(&self.config.dir)
    }

    /// Segments, oldest first. The active (last) one's `end_lsn` and `bytes` cover what is durable.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.shared.segments.lock().unwrap().clone()
    }

    /// Deletes every sealed segment whose `end_lsn <= lsn` (none of its records is needed any
    /// more), oldest first, stopping at the first one that is not. Never the active segment, so
    /// its file name keeps the LSN counter across restarts. Sealed segments are fully durable
    /// (the writer syncs a segment before rolling over). The files are deleted on the writer
    /// thread, each followed by a directory fsync; a crash before that brings them back at
    /// the next open (their records are replayed again). Returns the number released.
    pub fn release_before(&mut self, lsn: Lsn) -> usize {
        let durable = self.durable_rx.borrow().clone();
        let paths: Vec<_> = {
            let mut segments = self.shared.segments.lock().unwrap();
            let n = segments
                .iter()
                .take_while(|s| s.sealed && s.end_lsn <= lsn)
                .count();
            assert!(n < segments.len(), "the active segment is never released");
            segments
                .drain(..n)
                .map(|s| {
                    if let Ok(d) = durable {
                        assert!(s.end_lsn - 1 <= d, "a sealed segment is durable");
                    }
                    self.config.dir.join(segment_file_name(s.base_lsn))
                })
                .collect()
        };
        if paths.is_empty() {
            return 0;
        }
        let n = paths.len();
        self.shared.queue.lock().unwrap().deletes.extend(paths);
        self.shared
            .pending
            .store(true, std::sync::atomic::Ordering::Release);
        self.shared.wake.notify_one();
        n
    }

    /// Flushes, waits until everything appended is durable, and stops the writer thread.
    /// Returns `JournalError::Failed` if the writer had failed.
    pub fn close(mut self) -> Result<(), JournalError> {
        self.flush();
        self.stop_writer()?;
        match self.durable_lsn() {
            Ok(lsn) => {
                assert_eq!(lsn + 1, self.next_lsn, "close made every append durable");
                Ok(())
            }
            Err(f) => Err(JournalError::Failed(f)),
        }
    }

    fn stop_writer(&mut self) -> Result<(), JournalError> {
        let Some(handle) = self.writer.take() else {
            return Ok(());
        };
        self.shared.queue.lock().unwrap().closing = true;
        self.shared
            .pending
            .store(true, std::sync::atomic::Ordering::Release);
        self.shared.wake.notify_one();
        handle.join().map_err(|_| JournalError::WriterPanicked)
    }
}

impl Drop for Journal {
    /// Stops the writer after it has written what was flushed; records appended but not
    /// flushed are discarded (they were never reported durable).
    fn drop(&mut self) {
        let _ = self.stop_writer();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use writer::IDLE_CAPACITY_KEEP_BYTES;

    fn wait_durable(j: &Journal, lsn: Lsn) {
        let mut rx = j.durable();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            while rx.borrow_and_update().clone().unwrap() < lsn {
                rx.changed().await.unwrap();
            }
        });
    }

    /// Appends `records` records of `bytes` each, flushes them as one batch and waits until
    /// the last is durable; then the writer has swapped buffers with the queue at least once.
    fn burst(j: &mut Journal, records: usize, bytes: usize) {
        let mut last = 0;
        for _ in 0..records {
            last = j.append(&vec![7u8; bytes]);
        }
        j.flush();
        wait_durable(j, last);
    }

    fn config(dir: &std::path::Path) -> JournalConfig {
        JournalConfig {
            dir: dir.to_path_buf(),
            segment_bytes: 64 << 20,
            batch_bytes_max: 1 << 20,
            epoch: 0,
            fence: None,
            sparse_segments: false,
            sync_writes: true,
            slow_sync_warn_ms: SLOW_SYNC_WARN_MS_DEFAULT,
        }
    }

    fn queue_capacity(j: &Journal) -> usize {
        j.shared.queue.lock().unwrap().buf.capacity()
    }

    #[test]
    fn an_idle_journal_gives_back_the_capacity_a_burst_grew_and_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(config(dir.path()), |_, _| Ok(())).unwrap();
        // Bursts of 4 MiB until the caller's buffer and the queue's are both large: the
        // buffers rotate (caller → queue → writer → queue → caller), and the writer also
        // swaps when it wakes for its spare segment, so how many bursts that takes varies.
        let mut bursts = 0;
        while j.buf.capacity() <= IDLE_CAPACITY_KEEP_BYTES
            || queue_capacity(&j) <= IDLE_CAPACITY_KEEP_BYTES
        {
            assert!(bursts < 50, "bursts never grew the buffers");
            burst(&mut j, 64, 64 << 10);
            bursts += 1;
        }

        j.release_idle_buffers();
        assert!(j.buf.capacity() <= IDLE_CAPACITY_KEEP_BYTES);
        // The writer shrinks its own buffer and the queue's once it has woken for it.
        for _ in 0..1000 {
            if queue_capacity(&j) <= IDLE_CAPACITY_KEEP_BYTES {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            queue_capacity(&j) <= IDLE_CAPACITY_KEEP_BYTES,
            "the writer never gave the queue's buffer back"
        );
        // The next small write swaps the writer's buffer into the queue: it was shrunk too.
        burst(&mut j, 1, 100);
        assert!(queue_capacity(&j) <= IDLE_CAPACITY_KEEP_BYTES);
        assert!(j.buf.capacity() <= IDLE_CAPACITY_KEEP_BYTES);

        // Shrinking lost nothing: every record reads back after a reopen.
        let last = j.next_lsn() - 1;
        j.close().unwrap();
        let mut count = 0;
        Journal::open(config(dir.path()), |_, _| {
            count += 1;
            Ok(())
        })
        .unwrap()
        .close()
        .unwrap();
        assert_eq!(count, last);
    }
}
