//! Raw fdatasync latency of a disk, for the bench tool.
//!
//! Measures what the journal's group commit is built on: one write of `bytes` into a
//! preallocated, zero-filled file followed by fdatasync, `count` times. The rate the disk
//! sustains here is the ceiling on journal batches per second.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// File name used in `dir` while probing; removed afterwards.
const PROBE_FILE_NAME: &str = "fdatasync-probe.tmp";

/// Writes `bytes` and fdatasyncs, `count` times, on a preallocated file in `dir`; returns each
/// latency (write + fdatasync). Panics on I/O errors (a bench tool wants to stop there); see
/// `try_fdatasync_probe`.
pub fn fdatasync_probe(dir: &Path, count: usize, bytes: usize) -> Vec<Duration> {
    try_fdatasync_probe(dir, count, bytes)
        .unwrap_or_else(|e| panic!("fdatasync probe in {} failed: {e}", dir.display()))
}

/// `fdatasync_probe` returning I/O errors.
pub fn try_fdatasync_probe(
    dir: &Path,
    count: usize,
    bytes: usize,
) -> std::io::Result<Vec<Duration>> {
    let path = dir.join(PROBE_FILE_NAME);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let result = (|| {
        let total = (count as u64) * (bytes as u64);
        let zeros = vec![0u8; 1024 * 1024];
        let mut at = 0;
        while at < total {
            let n = (total - at).min(zeros.len() as u64);
            file.write_all_at(&zeros[..n as usize], at)?;
            at += n;
        }
        file.sync_all()?;
        let data = vec![0xA5u8; bytes];
        let mut latencies = Vec::with_capacity(count);
        for i in 0..count {
            let start = Instant::now();
            file.write_all_at(&data, (i * bytes) as u64)?;
            file.sync_data()?;
            latencies.push(start.elapsed());
        }
        Ok(latencies)
    })();
    let _ = std::fs::remove_file(&path);
    result
}
