//! Results: accounting (loss, duplicates), throughput, latency percentiles, printed as text or
//! as one JSON line. Latencies are recorded in nanoseconds and reported in microseconds.

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use super::consumer::{ConsumerReport, Seen};
use super::error::{BenchError, Result};
use super::producer::ProducerReport;
use super::BenchArgs;

/// Latency histogram in nanoseconds, 1 ns to 1 hour at 3 significant figures. Values beyond
/// are clamped (`saturating_record`), never dropped.
pub fn new_histogram() -> Histogram<u64> {
    const HOUR_NS: u64 = 3_600 * 1_000_000_000;
    Histogram::new_with_bounds(1, HOUR_NS, 3).expect("static bounds are valid")
}

pub struct LoadOutcome {
    pub sent: u64,
    pub receipts: u64,
    pub delivered: u64,
    pub unique: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub redelivered_flagged: u64,
    pub stale: u64,
    pub send_measured: u64,
    pub send_seconds: f64,
    pub recv_measured: u64,
    pub recv_seconds: f64,
    pub receipt_latency_ns: Histogram<u64>,
    pub latency_ns: Histogram<u64>,
}

impl LoadOutcome {
    pub fn new(
        args: &BenchArgs,
        epoch: Instant,
        producers: Vec<ProducerReport>,
        consumers: Vec<ConsumerReport>,
    ) -> LoadOutcome {
        let mut receipt_latency_ns = new_histogram();
        let mut latency_ns = new_histogram();
        let mut seen = Seen::default();
        let mut duplicates = 0;
        for c in &consumers {
            duplicates += c.duplicates + seen.merge(&c.seen);
            latency_ns
                .add(&c.latency_ns)
                .expect("auto-resizing histograms merge");
        }
        for p in &producers {
            receipt_latency_ns
                .add(&p.receipt_latency_ns)
                .expect("auto-resizing histograms merge");
        }
        let sent: u64 = producers.iter().map(|p| p.sent).sum();
        let unique: u64 = producers
            .iter()
            .map(|p| seen.count_below(p.id as usize, p.sent))
            .sum();
        assert!(unique <= sent);
        let start = producers
            .iter()
            .map(|p| p.measure_start)
            .min()
            .expect("at least one producer");
        let send_end = producers
            .iter()
            .map(|p| p.end)
            .max()
            .expect("at least one producer");
        let start_ns = start.duration_since(epoch).as_nanos() as u64;
        let recv_end_ns = consumers
            .iter()
            .map(|c| c.last_receive_ns)
            .max()
            .unwrap_or(0);
        LoadOutcome {
            sent,
            receipts: producers.iter().map(|p| p.receipts).sum(),
            delivered: consumers.iter().map(|c| c.deliveries).sum(),
            unique,
            // A fill-only run (no consumers) owes no delivery yet: the messages stay queued
            // for a later `--drain-only` run, which does the accounting.
            lost: if consumers.is_empty() {
                0
            } else {
                sent - unique
            },
            duplicates,
            redelivered_flagged: consumers.iter().map(|c| c.redelivered_flagged).sum(),
            stale: consumers.iter().map(|c| c.stale).sum(),
            send_measured: producers
                .iter()
                .map(|p| p.sent.saturating_sub(args.warmup))
                .sum(),
            send_seconds: send_end.duration_since(start).as_secs_f64(),
            recv_measured: consumers.iter().map(|c| c.measured).sum(),
            recv_seconds: Duration::from_nanos(recv_end_ns.saturating_sub(start_ns)).as_secs_f64(),
            receipt_latency_ns,
            latency_ns,
        }
    }

    fn send_rate(&self) -> f64 {
        rate(self.send_measured, self.send_seconds)
    }

    fn recv_rate(&self) -> f64 {
        rate(self.recv_measured, self.recv_seconds)
    }

    pub fn print(&self, args: &BenchArgs, run_id: u64) {
        if args.json {
            let line = json!({
                "kind": "load",
                "label": args.label,
                "url": args.url,
                "run_id": run_id,
                "drain_only": args.drain_only,
                "producers": args.producers,
                "consumers": args.consumers,
                "size_bytes": args.size,
                "persistent": args.persistent,
                "receipt_every": args.receipt_every,
                "receipt_window": args.receipt_window,
                "ack": args.ack.header_value(),
                "queues": args.queues,
                "prefetch": args.prefetch,
                "rate": args.rate,
                "warmup": args.warmup,
                "sent": self.sent,
                "receipts": self.receipts,
                "delivered": self.delivered,
                "unique": self.unique,
                "lost": self.lost,
                "duplicates": self.duplicates,
                "redelivered_flagged": self.redelivered_flagged,
                "stale": self.stale,
                "ok": self.lost == 0 && self.duplicates == 0,
                "send_msgs": self.send_measured,
                "send_seconds": self.send_seconds,
                "send_rate": self.send_rate(),
                "recv_msgs": self.recv_measured,
                "recv_seconds": self.recv_seconds,
                "recv_rate": self.recv_rate(),
                "receipt_latency_us": latency_json(&self.receipt_latency_ns),
                "latency_us": latency_json(&self.latency_ns),
            });
            println!("{line}");
            return;
        }
        println!(
            "haven bench -> {}: {} producer(s), {} consumer(s), {} B, {}, receipt every {}, ack {}, {} queue(s){}",
            args.url,
            args.producers,
            args.consumers,
            args.size,
            if args.persistent { "persistent" } else { "non-persistent" },
            args.receipt_every,
            args.ack.header_value(),
            args.queues,
            args.label.as_deref().map(|l| format!(" [{l}]")).unwrap_or_default(),
        );
        if let Some(rate) = args.rate {
            println!("offered   {rate:>10.0} msg/s (--rate)");
        }
        println!(
            "sent      {:>10} msgs in {:>7.2} s = {:>10.0} msg/s",
            self.send_measured,
            self.send_seconds,
            self.send_rate()
        );
        println!(
            "received  {:>10} msgs in {:>7.2} s = {:>10.0} msg/s",
            self.recv_measured,
            self.recv_seconds,
            self.recv_rate()
        );
        println!("send->receipt  {}", latency_text(&self.receipt_latency_ns));
        println!("send->receive  {}", latency_text(&self.latency_ns));
        println!(
            "accounting: sent {}, receipted {} receipt(s), delivered {} ({} unique), lost {}, duplicates {} ({} flagged redelivered), stale from earlier runs {} -> {}",
            self.sent,
            self.receipts,
            self.delivered,
            self.unique,
            self.lost,
            self.duplicates,
            self.redelivered_flagged,
            self.stale,
            if self.lost == 0 && self.duplicates == 0 { "OK" } else { "FAILED" },
        );
    }
}

fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn latency_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    json!({
        "count": h.len(),
        "mean": h.mean() / 1000.0,
        "p50": us(h.value_at_quantile(0.5)),
        "p99": us(h.value_at_quantile(0.99)),
        "p999": us(h.value_at_quantile(0.999)),
        "max": us(h.max()),
    })
}

fn latency_text(h: &Histogram<u64>) -> String {
    if h.is_empty() {
        return "(no samples)".into();
    }
    format!(
        "p50 {:.0} us  p99 {:.0} us  p999 {:.0} us  max {:.0} us  (n={})",
        us(h.value_at_quantile(0.5)),
        us(h.value_at_quantile(0.99)),
        us(h.value_at_quantile(0.999)),
        us(h.max()),
        h.len()
    )
}

/// Runs the fsync probe and prints its result. The probe is the journal's own
/// (`haven_journal::try_fdatasync_probe`: write + `fdatasync` into a preallocated file), so the
/// number is the ceiling for the journal's group commit, measured the way the journal syncs.
pub fn fsync(
    dir: &Path,
    count: usize,
    bytes: usize,
    as_json: bool,
    label: Option<&str>,
) -> Result<()> {
    if count == 0 {
        return Err(BenchError::Args("--fsync-count must be at least 1".into()));
    }
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Fsync {
        dir: dir.display().to_string(),
        source,
    })?;
    let samples = haven_journal::try_fdatasync_probe(dir, count, bytes).map_err(|source| {
        BenchError::Fsync {
            dir: dir.display().to_string(),
            source,
        }
    })?;
    let mut h = new_histogram();
    for s in &samples {
        h.saturating_record(s.as_nanos() as u64);
    }
    let total: Duration = samples.iter().sum();
    let rate = rate(samples.len() as u64, total.as_secs_f64());
    if as_json {
        let line = json!({
            "kind": "fsync",
            "label": label,
            "dir": dir.display().to_string(),
            "count": count,
            "bytes": bytes,
            "rate": rate,
            "latency_us": latency_json(&h),
        });
        println!("{line}");
    } else {
        println!(
            "fdatasync on {} ({count} x {bytes} B writes): {rate:.0} syncs/s",
            dir.display()
        );
        println!("latency        {}", latency_text(&h));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn producer(id: u32, sent: u64, epoch: Instant) -> ProducerReport {
        ProducerReport {
            id,
            sent,
            receipts: 1,
            receipt_latency_ns: new_histogram(),
            measure_start: epoch,
            end: epoch,
        }
    }

    fn consumer(marks: &[(usize, u64)]) -> ConsumerReport {
        let mut seen = Seen::default();
        let mut duplicates = 0;
        for &(p, s) in marks {
            if !seen.mark(p, s) {
                duplicates += 1;
            }
        }
        ConsumerReport {
            seen,
            deliveries: marks.len() as u64,
            duplicates,
            redelivered_flagged: 0,
            stale: 0,
            measured: marks.len() as u64,
            latency_ns: new_histogram(),
            last_receive_ns: 0,
        }
    }

    #[test]
    fn a_missing_message_is_lost_and_a_second_delivery_is_a_duplicate() {
        let args = Cli::parse_from(["bench"]).args;
        let epoch = Instant::now();
        // Producer 0 sent 0..3, producer 1 sent 0..2. Seq 2 of producer 0 never arrives;
        // (1, 0) arrives twice at one consumer and (0, 1) once at each of two consumers.
        let outcome = LoadOutcome::new(
            &args,
            epoch,
            vec![producer(0, 3, epoch), producer(1, 2, epoch)],
            vec![
                consumer(&[(0, 0), (0, 1), (1, 0), (1, 0)]),
                consumer(&[(0, 1), (1, 1)]),
            ],
        );
        assert_eq!(outcome.sent, 5);
        assert_eq!(outcome.unique, 4);
        assert_eq!(outcome.lost, 1);
        assert_eq!(outcome.duplicates, 2);
    }

    #[test]
    fn a_fill_only_run_owes_no_delivery() {
        let args = Cli::parse_from(["bench", "--consumers", "0"]).args;
        let epoch = Instant::now();
        let outcome = LoadOutcome::new(&args, epoch, vec![producer(0, 3, epoch)], vec![]);
        assert_eq!((outcome.sent, outcome.lost, outcome.duplicates), (3, 0, 0));
    }

    #[test]
    fn exact_delivery_is_clean() {
        let args = Cli::parse_from(["bench"]).args;
        let epoch = Instant::now();
        let outcome = LoadOutcome::new(
            &args,
            epoch,
            vec![producer(0, 2, epoch)],
            vec![consumer(&[(0, 1), (0, 0)])],
        );
        assert_eq!((outcome.lost, outcome.duplicates), (0, 0));
    }
}
