//! Journal configuration and the limits derived from it.
//!
//! Every limit carries its unit in its name. The record size limit is derived from the segment
//! size (half of a segment's record area) so that a record always fits in an empty segment and
//! rolling over wastes at most half a segment.

use std::path::PathBuf;

use crate::record::RECORD_HEADER_BYTES;
use crate::segment::SEGMENT_HEADER_BYTES;

/// Default size of one segment file: 64 MiB.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default for the most bytes written by one write + fdatasync: 4 MiB.
pub const BATCH_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;
/// Default for a batch's fdatasync that gets a warning in the log: 500 ms.
pub const SLOW_SYNC_WARN_MS_DEFAULT: u64 = 500;
/// The first segment of a new journal is at most this long: 4 MiB (see
/// `recovery::create_segment`: it is zero-filled before the broker serves).
pub const FIRST_SEGMENT_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// Smallest segment accepted: 4 KiB (one page).
pub const SEGMENT_BYTES_MIN: u64 = 4096;
/// Largest segment accepted: 1 GiB, so record lengths stay far inside `u32`.
pub const SEGMENT_BYTES_MAX: u64 = 1024 * 1024 * 1024;

/// A check the writer makes before every write: `Err(reason)` when this process may no longer
/// write the journal (shared-store master/slave: a newer master exists). The failure is sticky.
#[derive(Clone)]
pub struct Fence(pub std::sync::Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl Fence {
    pub fn check(&self) -> Result<(), String> {
        (self.0)()
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fence")
    }
}

#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// Directory holding the segment files; created by `Journal::open` if missing. One journal per
    /// directory (the spare file has a fixed name).
    pub dir: PathBuf,
    /// Size of each segment file, preallocated with zeros. Default 64 MiB.
    pub segment_bytes: u64,
    /// Most bytes written per write + fdatasync batch (a single larger record is written alone).
    /// Default 4 MiB.
    pub batch_bytes_max: usize,
    /// The epoch of the master writing (shared journal directory); 0 for a standalone broker.
    /// Opening with an epoch older than one already in the journal fails (`StaleEpoch`); with a
    /// newer one, the journal starts a new segment stamped with it.
    pub epoch: u32,
    /// Checked before every write (see `Fence`).
    pub fence: Option<Fence>,
    /// New segments are created as holes (`set_len`) instead of being zero-filled ahead of
    /// use. Zero-filling makes each fdatasync cheaper but writes every byte twice and ends with
    /// a large flush per segment; where several journals share one disk (a replica's Raft log
    /// and state journal), those flushes stall the others' syncs. Default false.
    pub sparse_segments: bool,
    /// fdatasync each batch before reporting it durable. False: "durable" means written to
    /// the operating system, which survives the process but not the machine; only for a
    /// journal that something else makes durable and that can be rebuilt (a replica's state
    /// journal: the Raft log and the last snapshot hold everything in it). Default true.
    pub sync_writes: bool,
    /// A batch's fdatasync taking this long or longer is logged as a warning (at most one
    /// line per 10 s, with how many there were) and counted in `SyncStats::slow_syncs`.
    /// Default 500 ms.
    pub slow_sync_warn_ms: u64,
}

impl JournalConfig {
    /// A configuration with default limits.
    pub fn new(dir: impl Into<PathBuf>) -> JournalConfig {
        JournalConfig {
            dir: dir.into(),
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            batch_bytes_max: BATCH_BYTES_MAX_DEFAULT,
            epoch: 0,
            fence: None,
            sparse_segments: false,
            sync_writes: true,
            slow_sync_warn_ms: SLOW_SYNC_WARN_MS_DEFAULT,
        }
    }

    /// Largest payload `Journal::append` accepts: half of a segment's record area minus one
    /// record header (about 32 MiB with the default segment size).
    pub fn record_bytes_max(&self) -> usize {
        let area = self.segment_bytes.saturating_sub(SEGMENT_HEADER_BYTES);
        ((area / 2) as usize).saturating_sub(RECORD_HEADER_BYTES)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes) {
            return Err(format!(
                "segment_bytes {} outside {SEGMENT_BYTES_MIN}..={SEGMENT_BYTES_MAX}",
                self.segment_bytes
            ));
        }
        if self.batch_bytes_max == 0 {
            return Err("batch_bytes_max must be > 0".to_string());
        }
        Ok(())
    }
}
