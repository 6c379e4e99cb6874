//! `haven bench`: a load generator and checker for any STOMP broker (Haven, ActiveMQ, RabbitMQ).
//!
//! It opens `--consumers` connections that subscribe first (each SUBSCRIBE confirmed by a
//! RECEIPT), then `--producers` connections that send tagged messages, and measures:
//! throughput sent and received, send→receipt and send→receive latency (HDR histograms), and
//! exact accounting — every message carries run id, producer id and sequence number, so the
//! bench proves that every message the broker receipted arrived, none twice. Loss or duplication
//! makes `run` return an error (non-zero exit). `--json` prints one line for scripts
//! (`bench/compare.sh`). `--fsync-probe DIR` instead measures the disk's raw `fdatasync`.
//!
//! A backlog is measured in two runs that share a `--run-id` (`bench/backlog.sh`): a fill with
//! `--consumers 0` leaves the messages queued and checks only that each was receipted; a later
//! `--drain-only` run with the fill's `--producers`, `--count` and `--warmup` starts no
//! producer and checks that every message the fill sent arrives exactly once.
//!
//! The STOMP side is the bench's own (see `stomp.rs` for why). Producers and consumers share one
//! process, so the send timestamp in a header is read against the same monotonic clock.

mod consumer;
mod error;
mod producer;
mod report;
mod stomp;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use error::BenchError;
use error::Result;

/// Headers the bench puts on every message it sends.
mod headers {
    pub const RUN: &str = "haven-bench-run";
    pub const PRODUCER: &str = "haven-bench-producer";
    pub const SEQ: &str = "haven-bench-seq";
    pub const SENT_NS: &str = "haven-bench-sent-ns";
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Broker STOMP address, host:port (a tcp:// or stomp:// prefix is accepted).
    #[arg(long, default_value = "127.0.0.1:61613")]
    pub url: String,
    /// Consumers connect here instead of `--url` (a network of brokers: produce on one
    /// broker, consume on another, and the bridges carry the messages).
    #[arg(long)]
    pub consume_url: Option<String>,
    /// CONNECT `login` (omitted when unset).
    #[arg(long)]
    pub login: Option<String>,
    /// CONNECT `passcode` (omitted when unset).
    #[arg(long)]
    pub passcode: Option<String>,
    /// STOMP `host` header (RabbitMQ: the virtual host).
    #[arg(long, default_value = "/")]
    pub stomp_host: String,
    /// Producer connections, each sending its own numbered sequence.
    #[arg(long, default_value_t = 1)]
    pub producers: u32,
    /// Consumer connections, subscribed before any producer starts. 0 = fill only: the
    /// messages stay queued (for a later `--drain-only` run) and delivery is not checked.
    #[arg(long, default_value_t = 1)]
    pub consumers: u32,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Sent explicitly on every SEND as `persistent:true|false` (ActiveMQ defaults to false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", value_name = "BOOL")]
    pub persistent: bool,
    /// Ask a RECEIPT every K sends; 1 = each send waits for its receipt (latency scenario);
    /// 0 = only the last send. The last send of each producer always asks one.
    #[arg(long, default_value_t = 100)]
    pub receipt_every: u64,
    /// RECEIPT-requesting frames a producer may have in flight (forced to 1 when K <= 1).
    #[arg(long, default_value_t = 16)]
    pub receipt_window: usize,
    /// Consumer ack mode; `client` ACKs cumulatively after each socket read.
    #[arg(long, value_enum, default_value_t = AckMode::Auto)]
    pub ack: AckMode,
    /// Messages to send in total over all producers (after warm-up). Default 100000.
    #[arg(long, conflicts_with = "duration_s")]
    pub count: Option<u64>,
    /// Send for this many seconds (after warm-up) instead of a count.
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Offered load: all producers together send at most this many messages per second
    /// (warm-up included), each its share, evenly paced. Unset: as fast as the receipt window
    /// lets them. With a rate the run measures whether the broker keeps up with it (compare
    /// msg/s with the rate) instead of how fast it goes when overloaded.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Destination to send to and subscribe on.
    #[arg(long, default_value = "/queue/bench")]
    pub destination: String,
    /// Spread over this many destinations, `<destination>.<i>`; producer i sends to i mod M.
    #[arg(long, default_value_t = 1)]
    pub queues: u32,
    /// Consumer prefetch (`activemq.prefetchSize` and `prefetch-count`); broker default if unset.
    #[arg(long)]
    pub prefetch: Option<u32>,
    /// Messages each producer sends first that are not measured (they are still accounted).
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Print one JSON line with every result instead of text; no progress bar.
    #[arg(long)]
    pub json: bool,
    /// Free-form label copied into the output (e.g. broker name and scenario).
    #[arg(long)]
    pub label: Option<String>,
    /// Tag the messages with this run id instead of a random one, so that a `--drain-only` run
    /// can recognise the messages of an earlier fill.
    #[arg(long)]
    pub run_id: Option<u64>,
    /// Start no producer: the consumers drain what an earlier run with this `--run-id`,
    /// `--producers`, `--count` and `--warmup` sent, and the accounting checks that every one
    /// of those messages arrives exactly once. Send→receive latency is not measured (the send
    /// times are another process's clock).
    #[arg(long, requires = "run_id", conflicts_with = "duration_s")]
    pub drain_only: bool,
    /// Extra header on every SEND, NAME:VALUE (repeatable).
    #[arg(long = "send-header", value_parser = parse_header)]
    pub send_headers: Vec<(String, String)>,
    /// Extra header on every SUBSCRIBE, NAME:VALUE (repeatable), e.g. x-queue-type:quorum.
    #[arg(long = "subscribe-header", value_parser = parse_header)]
    pub subscribe_headers: Vec<(String, String)>,
    /// After the producers finish, how long consumers may go without a delivery before the
    /// missing messages are declared lost.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout_s: u64,
    /// How long a producer waits for its outstanding receipts at the end.
    #[arg(long, default_value_t = 60)]
    pub receipt_timeout_s: u64,
    /// Measure the raw fdatasync rate and latency of the disk holding DIR, then exit.
    #[arg(long, value_name = "DIR")]
    pub fsync_probe: Option<PathBuf>,
    /// Number of fdatasync samples for --fsync-probe.
    #[arg(long, default_value_t = 2000)]
    pub fsync_count: usize,
    /// Bytes written before each fdatasync for --fsync-probe.
    #[arg(long, default_value_t = 4096)]
    pub fsync_bytes: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    Auto,
    Client,
    ClientIndividual,
}

impl AckMode {
    fn header_value(self) -> &'static str {
        match self {
            AckMode::Auto => "auto",
            AckMode::Client => "client",
            AckMode::ClientIndividual => "client-individual",
        }
    }
}

/// When a producer stops: after a number of messages (warm-up included) or a measured duration.
#[derive(Clone, Copy, Debug)]
enum Stop {
    Count(u64),
    Duration(Duration),
}

fn parse_header(s: &str) -> std::result::Result<(String, String), String> {
    let (k, v) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}` is not NAME:VALUE"))?;
    if k.is_empty() || k.contains('\n') || v.contains('\n') {
        return Err(format!("`{s}` is not a valid header"));
    }
    Ok((k.to_string(), v.to_string()))
}

pub async fn run(args: BenchArgs) -> std::result::Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = &args.fsync_probe {
        return Ok(report::fsync(
            dir,
            args.fsync_count,
            args.fsync_bytes,
            args.json,
            args.label.as_deref(),
        )?);
    }
    Ok(run_load(args).await?)
}

async fn run_load(args: BenchArgs) -> Result<()> {
    validate(&args)?;
    let epoch = Instant::now();
    let run_id = args.run_id.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 48
    });
    let addr_of = |url: &str| {
        url.trim_start_matches("tcp://")
            .trim_start_matches("stomp://")
            .trim_end_matches('/')
            .to_string()
    };
    let connect = stomp::ConnectOptions {
        addr: addr_of(&args.url),
        login: args.login.clone(),
        passcode: args.passcode.clone(),
        host: args.stomp_host.clone(),
    };
    let consume = stomp::ConnectOptions {
        addr: addr_of(args.consume_url.as_deref().unwrap_or(&args.url)),
        ..connect.clone()
    };
    let destinations: Vec<String> = if args.queues == 1 {
        vec![args.destination.clone()]
    } else {
        (0..args.queues)
            .map(|q| format!("{}.{q}", args.destination))
            .collect()
    };

    // Consumers first, all subscribed before any producer starts. One after the other: the
    // first SUBSCRIBE may declare the destination (RabbitMQ), and concurrent declarations of
    // one quorum queue fail there.
    let progress = Arc::new(consumer::Progress::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut consumers = Vec::new();
    for c in 0..args.consumers {
        let plan = consumer::ConsumerPlan {
            connect: consume.clone(),
            destinations: consumer_destinations(&destinations, c, args.consumers),
            ack: args.ack,
            prefetch: args.prefetch,
            run_id,
            epoch,
            warmup: args.warmup,
            extra_headers: args.subscribe_headers.clone(),
            progress: progress.clone(),
            latency: !args.drain_only,
        };
        let subscribed = match consumer::subscribe(plan).await {
            Ok(s) => s,
            Err(e) => {
                abort_all(std::iter::empty::<&JoinHandle<()>>(), &consumers);
                return Err(e);
            }
        };
        consumers.push(tokio::spawn(consumer::run(subscribed, stop_rx.clone())));
    }

    let total = args.count.unwrap_or(100_000);
    // Messages producer `p` sends in a `--count` run, warm-up included.
    let count_of = |p: u32| {
        args.warmup
            + total / u64::from(args.producers)
            + u64::from(u64::from(p) < total % u64::from(args.producers))
    };
    let sent_counter = Arc::new(AtomicU64::new(0));
    let body = Arc::new(vec![b'x'; args.size]);
    let mut producers: Vec<Option<JoinHandle<Result<producer::ProducerReport>>>> = (0..args
        .producers)
        .filter(|_| !args.drain_only)
        .map(|p| {
            let stop = match args.duration_s {
                Some(s) => Stop::Duration(Duration::from_secs_f64(s)),
                None => Stop::Count(count_of(p)),
            };
            let plan = producer::ProducerPlan {
                id: p,
                connect: connect.clone(),
                destination: destinations[(p % args.queues) as usize].clone(),
                body: body.clone(),
                persistent: args.persistent,
                receipt_every: args.receipt_every,
                receipt_window: if args.receipt_every <= 1 {
                    1
                } else {
                    args.receipt_window
                },
                stop,
                warmup: args.warmup,
                run_id,
                epoch,
                receipt_timeout: Duration::from_secs(args.receipt_timeout_s),
                extra_headers: args.send_headers.clone(),
                sent_counter: sent_counter.clone(),
                interval: args
                    .rate
                    .map(|r| Duration::from_secs_f64(f64::from(args.producers) / r)),
            };
            Some(tokio::spawn(producer::run(plan)))
        })
        .collect();

    let bar = progress_bar(&args, total + args.warmup * u64::from(args.producers));
    let tick = Duration::from_millis(100);
    // Phase 1: producers run; any failure (producer or consumer) ends the run. A drain-only
    // run owes what the earlier fill sent, as if its producers had just sent it.
    let mut producer_reports = Vec::new();
    if args.drain_only {
        let now = Instant::now();
        producer_reports.extend((0..args.producers).map(|p| producer::ProducerReport {
            id: p,
            sent: count_of(p),
            receipts: 0,
            receipt_latency_ns: report::new_histogram(),
            measure_start: now,
            end: now,
        }));
    }
    loop {
        for slot in producers.iter_mut() {
            if slot.as_ref().is_some_and(JoinHandle::is_finished) {
                let handle = slot.take().expect("checked above");
                match join(handle).await {
                    Ok(report) => producer_reports.push(report),
                    Err(e) => {
                        abort_all(producers.iter().flatten(), &consumers);
                        return Err(e);
                    }
                }
            }
        }
        if producers.iter().all(Option::is_none) {
            break;
        }
        if let Some(e) = consumer_failed(&mut consumers).await {
            abort_all(producers.iter().flatten(), &consumers);
            return Err(e);
        }
        update_bar(&bar, &sent_counter, &progress);
        tokio::time::sleep(tick).await;
    }
    let total_sent: u64 = producer_reports.iter().map(|r| r.sent).sum();
    if let Some(b) = &bar {
        b.set_length(total_sent);
    }
    // Phase 2: drain until every sent message was delivered or deliveries stop coming. A
    // fill-only run (no consumers) leaves the messages queued.
    let mut last_delivered = progress.delivered.load(Ordering::Relaxed);
    let mut last_progress = Instant::now();
    loop {
        let delivered = progress.delivered.load(Ordering::Relaxed);
        if args.consumers == 0
            || delivered >= total_sent
            || last_progress.elapsed() > Duration::from_secs(args.drain_timeout_s)
        {
            break;
        }
        if delivered != last_delivered {
            last_delivered = delivered;
            last_progress = Instant::now();
        }
        if let Some(e) = consumer_failed(&mut consumers).await {
            abort_all(std::iter::empty::<&JoinHandle<()>>(), &consumers);
            return Err(e);
        }
        update_bar(&bar, &sent_counter, &progress);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop_tx.send_replace(true);
    let mut consumer_reports = Vec::new();
    for handle in consumers {
        consumer_reports.push(join(handle).await?);
    }
    if let Some(b) = bar {
        update_bar(&Some(b.clone()), &sent_counter, &progress);
        b.finish_and_clear();
    }
    let outcome = report::LoadOutcome::new(&args, epoch, producer_reports, consumer_reports);
    outcome.print(&args, run_id);
    if outcome.lost > 0 || outcome.duplicates > 0 {
        return Err(BenchError::Accounting {
            lost: outcome.lost,
            duplicates: outcome.duplicates,
        });
    }
    Ok(())
}

fn validate(args: &BenchArgs) -> Result<()> {
    let bad = |why: &str| Err(BenchError::Args(why.to_string()));
    if args.producers == 0 || args.queues == 0 {
        return bad("--producers and --queues must be at least 1");
    }
    if args.drain_only && args.consumers == 0 {
        return bad("--drain-only needs at least one consumer");
    }
    if args.producers as usize > consumer::PRODUCERS_MAX {
        return bad("too many producers");
    }
    if args.duration_s.is_none() && args.count.unwrap_or(100_000) < u64::from(args.producers) {
        return bad("--count must be at least --producers");
    }
    if args.duration_s.is_some_and(|s| !(s > 0.0 && s.is_finite())) {
        return bad("--duration-s must be positive");
    }
    if args
        .rate
        .is_some_and(|r| !(r.is_finite() && r >= f64::from(args.producers) / 3600.0))
    {
        return bad("--rate must be positive (and at least one message per producer per hour)");
    }
    if args.receipt_window == 0 || args.receipt_window > 1 << 20 {
        return bad("--receipt-window must be 1..=1048576");
    }
    Ok(())
}

/// Destination `q` goes to consumer `q mod C`; when there are more consumers than
/// destinations, consumer `c` (c >= M) also takes destination `c mod M`. Every destination has
/// a consumer and every consumer has a destination.
fn consumer_destinations(destinations: &[String], consumer: u32, consumers: u32) -> Vec<String> {
    let m = destinations.len() as u32;
    let mut mine: Vec<String> = (0..m)
        .filter(|q| q % consumers == consumer)
        .map(|q| destinations[q as usize].clone())
        .collect();
    if consumer >= m {
        mine.push(destinations[(consumer % m) as usize].clone());
    }
    assert!(!mine.is_empty());
    mine
}

async fn join<T>(handle: JoinHandle<Result<T>>) -> Result<T> {
    match handle.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(BenchError::Closed("(task cancelled)")),
    }
}

async fn consumer_failed(
    consumers: &mut [JoinHandle<Result<consumer::ConsumerReport>>],
) -> Option<BenchError> {
    for handle in consumers.iter_mut() {
        if handle.is_finished() {
            // A consumer only ends early on an error.
            return Some(match handle.await {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => BenchError::Closed("(a consumer stopped early)"),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => BenchError::Closed("(consumer task cancelled)"),
            });
        }
    }
    None
}

fn abort_all<'a, A: 'a, B>(
    producers: impl Iterator<Item = &'a JoinHandle<A>>,
    consumers: &[JoinHandle<B>],
) {
    producers.for_each(JoinHandle::abort);
    consumers.iter().for_each(JoinHandle::abort);
}

fn progress_bar(args: &BenchArgs, expected: u64) -> Option<indicatif::ProgressBar> {
    if args.json || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match args.duration_s {
        Some(_) => indicatif::ProgressBar::new_spinner(),
        None => indicatif::ProgressBar::new(expected),
    };
    let template = match args.duration_s {
        Some(_) => "{spinner} {elapsed_precise} received {pos} ({per_sec}) {msg}",
        None => "{spinner} {elapsed_precise} [{bar:30}] received {pos}/{len} ({per_sec}) {msg}",
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    Some(bar)
}

fn update_bar(
    bar: &Option<indicatif::ProgressBar>,
    sent: &AtomicU64,
    progress: &consumer::Progress,
) {
    if let Some(b) = bar {
        b.set_position(progress.delivered.load(Ordering::Relaxed));
        let stale = progress.stale.load(Ordering::Relaxed);
        let stale = if stale > 0 {
            format!(", {stale} stale")
        } else {
            String::new()
        };
        b.set_message(format!("sent {}{stale}", sent.load(Ordering::Relaxed)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_destination_has_a_consumer_and_every_consumer_a_destination() {
        for m in 1..6u32 {
            for c in 1..6u32 {
                let dests: Vec<String> = (0..m).map(|q| q.to_string()).collect();
                let mut covered = vec![false; m as usize];
                for consumer in 0..c {
                    for d in consumer_destinations(&dests, consumer, c) {
                        covered[d.parse::<usize>().unwrap()] = true;
                    }
                }
                assert!(covered.iter().all(|&x| x), "m={m} c={c}");
            }
        }
    }
}
