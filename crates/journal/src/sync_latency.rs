//! How long the journal's own fdatasyncs take: a histogram the writer fills and
//! `Journal::stats` reads, a summary in the log every `REPORT_INTERVAL` and at close, and a
//! warning for a sync slower than `JournalConfig::slow_sync_warn_ms`.
//!
//! Why: every RECEIPT for a persistent SEND waits for one of these syncs, so their tail is
//! the floor of the broker's send->receipt tail. An isolated probe of the disk
//! (`haven bench --fsync-probe`) measures the disk alone; this measures it as the broker
//! meets it, under its own load and with its CPU contention, which is what an operator
//! explaining a slow RECEIPT needs, and what a dying disk shows first.
//!
//! Buckets are fixed and log-linear (one per µs below 16 µs, then 8 per power of two, so a
//! bucket is at most 12.5% wide) and the counters are atomics: recording is a few
//! instructions on the writer thread, and reading never blocks it. Quantiles are reported
//! as the top of their bucket (never below the true value), capped at the largest sync seen.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// Values below this have a bucket each: µs.
const LINEAR_US: u64 = 16;
/// Buckets per power of two above `LINEAR_US`.
const SUB_BUCKETS: usize = 8;
/// log2 of `LINEAR_US`.
const LINEAR_POWER: u32 = 4;
/// Syncs of 2^TOP_POWER µs (19 hours) or more share the last bucket.
const TOP_POWER: u32 = 36;
pub(crate) const BUCKETS: usize =
    LINEAR_US as usize + (TOP_POWER - LINEAR_POWER) as usize * SUB_BUCKETS;

/// How often the writer logs the syncs of the interval just ended (when there were any).
pub(crate) const REPORT_INTERVAL: Duration = Duration::from_secs(600);
/// Slow-sync warnings after the first come at most this often, with how many were slow.
pub(crate) const SLOW_WARN_INTERVAL: Duration = Duration::from_secs(10);

fn bucket_of(us: u64) -> usize {
    if us < LINEAR_US {
        return us as usize;
    }
    let power = 63 - us.leading_zeros();
    if power >= TOP_POWER {
        return BUCKETS - 1;
    }
    let sub = ((us >> (power - 3)) & (SUB_BUCKETS as u64 - 1)) as usize;
    LINEAR_US as usize + (power - LINEAR_POWER) as usize * SUB_BUCKETS + sub
}

/// The largest value that falls in bucket `i`.
fn bucket_high_us(i: usize) -> u64 {
    assert!(i < BUCKETS, "bucket {i} out of range");
    if i < LINEAR_US as usize {
        return i as u64;
    }
    let j = i - LINEAR_US as usize;
    let power = LINEAR_POWER + (j / SUB_BUCKETS) as u32;
    let width = 1u64 << (power - 3);
    (1u64 << power) + (j % SUB_BUCKETS + 1) as u64 * width - 1
}

/// Sync latencies since the journal opened (written by the writer thread only).
pub(crate) struct SyncLatency {
    counts: Box<[AtomicU64]>,
    max_us: AtomicU64,
    slow: AtomicU64,
}

impl Default for SyncLatency {
    fn default() -> Self {
        SyncLatency {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_us: AtomicU64::new(0),
            slow: AtomicU64::new(0),
        }
    }
}

impl SyncLatency {
    pub fn record(&self, took: Duration, slow: bool) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
        if slow {
            self.slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The bucket counts as they are now.
    pub fn counts(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    pub fn stats(&self) -> SyncStats {
        SyncStats::from_counts(
            &self.counts(),
            self.max_us.load(Ordering::Relaxed),
            self.slow.load(Ordering::Relaxed),
        )
    }
}

/// The journal's fdatasyncs of record batches: how many and how long (µs). Part of
/// `JournalStats`. All zero for a journal that does not sync (`sync_writes = false`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub syncs: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Syncs that took `JournalConfig::slow_sync_warn_ms` or longer.
    pub slow_syncs: u64,
}

impl SyncStats {
    pub(crate) fn from_counts(counts: &[u64], max_us: u64, slow_syncs: u64) -> SyncStats {
        assert_eq!(counts.len(), BUCKETS, "one count per bucket");
        let syncs: u64 = counts.iter().sum();
        let quantile = |q_permille: u64| -> u64 {
            if syncs == 0 {
                return 0;
            }
            // The smallest value with at least q of the syncs at or below it.
            let rank = (syncs * q_permille).div_ceil(1000).max(1);
            let mut seen = 0;
            for (i, &n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return bucket_high_us(i).min(max_us);
                }
            }
            unreachable!("rank {rank} is within the {syncs} counted")
        };
        SyncStats {
            syncs,
            p50_us: quantile(500),
            p99_us: quantile(990),
            p999_us: quantile(999),
            max_us,
            slow_syncs,
        }
    }
}

/// The writer's side: the interval being reported, and slow-sync warnings held back.
pub(crate) struct SyncReporter {
    slow_after: Duration,
    opened: Instant,
    window_start: Instant,
    /// `SyncLatency::counts` when the interval began.
    window_base: Vec<u64>,
    window_max_us: u64,
    window_slow: u64,
    last_slow_warn: Option<Instant>,
    /// Slow syncs since the last warning, not yet named in one.
    slow_unwarned: u64,
}

impl SyncReporter {
    pub fn new(slow_after: Duration, now: Instant) -> SyncReporter {
        SyncReporter {
            slow_after,
            opened: now,
            window_start: now,
            window_base: vec![0; BUCKETS],
            window_max_us: 0,
            window_slow: 0,
            last_slow_warn: None,
            slow_unwarned: 0,
        }
    }

    /// Records one fdatasync of `path` that took `took`, ending at `now`.
    pub fn synced(&mut self, latency: &SyncLatency, took: Duration, path: &Path, now: Instant) {
        let slow = took >= self.slow_after;
        latency.record(took, slow);
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.window_max_us = self.window_max_us.max(us);
        if slow {
            self.window_slow += 1;
            self.slow_unwarned += 1;
            if self
                .last_slow_warn
                .is_none_or(|at| now.duration_since(at) >= SLOW_WARN_INTERVAL)
            {
                warn!(
                    path = %path.display(),
                    ms = took.as_millis() as u64,
                    slow_sync_warn_ms = self.slow_after.as_millis() as u64,
                    slow_since_last_warning = self.slow_unwarned,
                    "journal: slow fdatasync; every RECEIPT for a persistent message waits for \
                     one (a failing or overloaded disk?)"
                );
                self.last_slow_warn = Some(now);
                self.slow_unwarned = 0;
            }
        }
        if now.duration_since(self.window_start) >= REPORT_INTERVAL {
            let counts = latency.counts();
            let window: Vec<u64> = counts
                .iter()
                .zip(&self.window_base)
                .map(|(now, then)| now - then)
                .collect();
            let s = SyncStats::from_counts(&window, self.window_max_us, self.window_slow);
            log_summary(
                "journal: fdatasync latency over the last interval",
                &s,
                now.duration_since(self.window_start),
            );
            self.window_base = counts;
            self.window_start = now;
            self.window_max_us = 0;
            self.window_slow = 0;
        }
    }

    /// Logs the syncs since the journal opened (when there were any); at close.
    pub fn closing(&self, latency: &SyncLatency) {
        let s = latency.stats();
        if s.syncs > 0 {
            log_summary(
                "journal: fdatasync latency since open",
                &s,
                self.opened.elapsed(),
            );
        }
    }
}

fn log_summary(what: &str, s: &SyncStats, over: Duration) {
    info!(
        seconds = over.as_secs(),
        syncs = s.syncs,
        p50_us = s.p50_us,
        p99_us = s.p99_us,
        p999_us = s.p999_us,
        max_us = s.max_us,
        slow = s.slow_syncs,
        "{what}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_a_bucket_whose_bounds_hold_it() {
        let mut values: Vec<u64> = (0..5000).collect();
        for power in 4..64 {
            let p = 1u64 << power;
            values.extend([p - 1, p, p + 1, p + p / 3]);
        }
        values.push(u64::MAX);
        for us in values {
            let i = bucket_of(us);
            assert!(i < BUCKETS, "{us} µs -> bucket {i}");
            if us < 1 << TOP_POWER {
                assert!(us <= bucket_high_us(i), "{us} µs above its bucket's top");
                assert!(
                    i == 0 || us > bucket_high_us(i - 1),
                    "{us} µs belongs in an earlier bucket than {i}"
                );
                // At most 12.5% wide: the top is within an eighth of the value.
                assert!(
                    bucket_high_us(i) - us <= us / 8,
                    "bucket {i} too wide for {us}"
                );
            } else {
                assert_eq!(i, BUCKETS - 1);
            }
        }
        assert_eq!(bucket_high_us(BUCKETS - 1), (1 << TOP_POWER) - 1);
    }

    #[test]
    fn quantiles_are_the_top_of_their_bucket_capped_at_the_max() {
        let h = SyncLatency::default();
        assert_eq!(h.stats(), SyncStats::default(), "no syncs, all zero");
        for _ in 0..990 {
            h.record(Duration::from_micros(100), false);
        }
        for _ in 0..9 {
            h.record(Duration::from_micros(1000), false);
        }
        h.record(Duration::from_millis(700), true);
        let s = h.stats();
        assert_eq!(s.syncs, 1000);
        assert_eq!(s.slow_syncs, 1);
        assert_eq!(s.max_us, 700_000);
        // 100 µs is in the bucket 96..=103, so p50 and p99 read 103.
        assert_eq!(bucket_high_us(bucket_of(100)), 103);
        assert_eq!((s.p50_us, s.p99_us), (103, 103));
        // The 999th is one of the 1,000 µs syncs (bucket 896..=1023).
        assert_eq!(s.p999_us, 1023);
        // A single sync: every quantile is it, not its bucket's top.
        let one = SyncLatency::default();
        one.record(Duration::from_micros(1000), false);
        let s = one.stats();
        assert_eq!(
            (s.p50_us, s.p99_us, s.p999_us, s.max_us),
            (1000, 1000, 1000, 1000)
        );
    }

    #[test]
    fn an_interval_is_the_difference_of_two_readings() {
        let h = SyncLatency::default();
        h.record(Duration::from_micros(50), false);
        let before = h.counts();
        h.record(Duration::from_micros(5000), false);
        h.record(Duration::from_micros(5000), false);
        let window: Vec<u64> = h.counts().iter().zip(&before).map(|(a, b)| a - b).collect();
        let s = SyncStats::from_counts(&window, 5000, 0);
        assert_eq!(s.syncs, 2);
        assert_eq!(s.p50_us, 5000);
    }
}
