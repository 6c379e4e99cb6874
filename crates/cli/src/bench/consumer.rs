//! One consumer connection: subscribes (before any producer starts), receives, ACKs per the ack
//! mode, records send→receive latency and which (producer, sequence) pairs arrived.
//!
//! ACKs are batched the way a fast real consumer would: after the bytes already read are
//! processed and before the next socket read, `client` mode sends one cumulative ACK for the
//! newest message and `client-individual` sends one ACK per message, all in one write.
//! Messages from an earlier run (another run id, left in a durable queue) are counted as stale,
//! acknowledged, and otherwise ignored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use super::error::{BenchError, Result};
use super::stomp::{self, ConnectOptions, Frame, Version};
use super::{headers, report, AckMode};

/// Maximum producers a consumer tracks (producer ids index a table).
pub const PRODUCERS_MAX: usize = 4096;

pub struct ConsumerPlan {
    pub connect: ConnectOptions,
    pub destinations: Vec<String>,
    pub ack: AckMode,
    pub prefetch: Option<u32>,
    pub run_id: u64,
    pub epoch: Instant,
    pub warmup: u64,
    pub extra_headers: Vec<(String, String)>,
    pub progress: Arc<Progress>,
    /// Record send→receive latency (false when the send times are another process's clock).
    pub latency: bool,
}

/// Counters shared with the driver for the progress bar and the stop decision.
#[derive(Default)]
pub struct Progress {
    /// Deliveries of this run's messages (a duplicate counts twice).
    pub delivered: AtomicU64,
    pub stale: AtomicU64,
}

/// Which sequence numbers of each producer arrived, as a growable bit set.
#[derive(Default, Clone)]
pub struct Seen {
    pub bits: Vec<Vec<u64>>,
}

impl Seen {
    /// Marks (producer, seq); returns false if it was already marked.
    pub fn mark(&mut self, producer: usize, seq: u64) -> bool {
        assert!(producer < PRODUCERS_MAX);
        if self.bits.len() <= producer {
            self.bits.resize(producer + 1, Vec::new());
        }
        let words = &mut self.bits[producer];
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if words.len() <= word {
            words.resize((word + 1).max(words.len() * 2), 0);
        }
        let fresh = words[word] & (1 << bit) == 0;
        words[word] |= 1 << bit;
        fresh
    }

    /// Number of distinct sequence numbers below `sent` that arrived from `producer`.
    pub fn count_below(&self, producer: usize, sent: u64) -> u64 {
        let Some(words) = self.bits.get(producer) else {
            return 0;
        };
        let full = (sent / 64) as usize;
        let mut n: u64 = words
            .iter()
            .take(full)
            .map(|w| u64::from(w.count_ones()))
            .sum();
        if !sent.is_multiple_of(64) {
            if let Some(w) = words.get(full) {
                n += u64::from((w & ((1u64 << (sent % 64)) - 1)).count_ones());
            }
        }
        n
    }

    /// Union into `self`; returns how many marks were already present (cross-consumer duplicates).
    pub fn merge(&mut self, other: &Seen) -> u64 {
        let mut overlap = 0;
        if self.bits.len() < other.bits.len() {
            self.bits.resize(other.bits.len(), Vec::new());
        }
        for (mine, theirs) in self.bits.iter_mut().zip(&other.bits) {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (m, t) in mine.iter_mut().zip(theirs) {
                overlap += u64::from((*m & *t).count_ones());
                *m |= *t;
            }
        }
        overlap
    }
}

pub struct ConsumerReport {
    pub seen: Seen,
    pub deliveries: u64,
    /// Deliveries of a (producer, seq) this consumer had already received.
    pub duplicates: u64,
    pub redelivered_flagged: u64,
    pub stale: u64,
    /// Deliveries of post-warm-up messages (the received throughput's count).
    pub measured: u64,
    pub latency_ns: Histogram<u64>,
    /// Time of the last measured (post-warm-up) delivery, ns since the epoch.
    pub last_receive_ns: u64,
}

/// A consumer that has subscribed (the broker confirmed with a RECEIPT) and can be started.
pub struct Subscribed {
    plan: ConsumerPlan,
    conn: stomp::Connection,
    state: State,
}

pub async fn subscribe(plan: ConsumerPlan) -> Result<Subscribed> {
    let mut conn = stomp::connect(&plan.connect).await?;
    let mut buf = BytesMut::with_capacity(512);
    let ack = plan.ack.header_value();
    for (i, destination) in plan.destinations.iter().enumerate() {
        stomp::begin(&mut buf, "SUBSCRIBE");
        stomp::header(&mut buf, "id", i);
        stomp::header(&mut buf, "destination", destination);
        stomp::header(&mut buf, "ack", ack);
        if let Some(p) = plan.prefetch {
            stomp::header(&mut buf, "activemq.prefetchSize", p); // ActiveMQ, Haven
            stomp::header(&mut buf, "prefetch-count", p); // RabbitMQ
        }
        for (k, v) in &plan.extra_headers {
            stomp::header(&mut buf, k, v);
        }
        if i + 1 == plan.destinations.len() {
            stomp::header(&mut buf, "receipt", "subscribed");
        }
        stomp::end(&mut buf, b"");
    }
    conn.writer.write_all(&buf).await?;
    // Messages may arrive before the RECEIPT (stale ones from a queue's backlog): handle them.
    let deadline = Duration::from_millis(stomp::CONNECT_TIMEOUT_MS);
    let mut state = State::new();
    let mut acks = BytesMut::new();
    tokio::time::timeout(deadline, async {
        loop {
            let frame = conn
                .reader
                .next()
                .await?
                .ok_or(BenchError::Closed("during SUBSCRIBE"))?;
            if frame.is("RECEIPT") {
                return Ok::<(), BenchError>(());
            }
            state.handle(&plan, conn.version, &frame, &mut acks)?;
        }
    })
    .await
    .map_err(|_| BenchError::Timeout("no RECEIPT for SUBSCRIBE".into()))??;
    state.flush_ack(conn.version, &mut acks);
    conn.writer.write_all(&acks).await?;
    Ok(Subscribed { plan, conn, state })
}

/// Receives until `stop` turns true, then ACKs what is pending, DISCONNECTs with a receipt (so
/// the broker has processed the ACKs before this run ends) and reports.
pub async fn run(
    subscribed: Subscribed,
    mut stop: watch::Receiver<bool>,
) -> Result<ConsumerReport> {
    let Subscribed {
        plan,
        conn,
        mut state,
    } = subscribed;
    let stomp::Connection {
        mut reader,
        mut writer,
        version,
    } = conn;
    let mut out = BytesMut::with_capacity(4096);
    loop {
        while let Some(frame) = reader.try_next()? {
            state.handle(&plan, version, &frame, &mut out)?;
        }
        state.flush_ack(version, &mut out);
        if !out.is_empty() {
            writer.write_all(&out).await?;
            out.clear();
        }
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            more = reader.fill() => if !more? { return Err(BenchError::Closed("under a consumer")) },
            _ = stop.changed() => {}
        }
    }
    stomp::begin(&mut out, "DISCONNECT");
    stomp::header(&mut out, "receipt", "bye");
    stomp::end(&mut out, b"");
    writer.write_all(&out).await?;
    // Deliveries still in flight are processed (and counted) while waiting for the receipt.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(frame) = reader.next().await? {
            if frame.is("RECEIPT") {
                break;
            }
            let mut ignored = BytesMut::new();
            state.handle(&plan, version, &frame, &mut ignored)?;
        }
        Ok::<(), BenchError>(())
    })
    .await;
    Ok(ConsumerReport {
        seen: state.seen,
        deliveries: state.deliveries,
        duplicates: state.duplicates,
        redelivered_flagged: state.redelivered,
        stale: state.stale,
        measured: state.measured,
        latency_ns: state.latency_ns,
        last_receive_ns: state.last_receive_ns,
    })
}

struct State {
    seen: Seen,
    deliveries: u64,
    duplicates: u64,
    redelivered: u64,
    stale: u64,
    measured: u64,
    latency_ns: Histogram<u64>,
    last_receive_ns: u64,
    /// Newest unacked message for `client` mode: (ack header or message-id, subscription).
    pending_cumulative: Option<(Bytes, Option<Bytes>)>,
}

impl State {
    fn new() -> State {
        State {
            seen: Seen::default(),
            deliveries: 0,
            duplicates: 0,
            redelivered: 0,
            stale: 0,
            measured: 0,
            latency_ns: report::new_histogram(),
            last_receive_ns: 0,
            pending_cumulative: None,
        }
    }

    fn handle(
        &mut self,
        plan: &ConsumerPlan,
        version: Version,
        frame: &Frame,
        out: &mut BytesMut,
    ) -> Result<()> {
        if frame.is("ERROR") {
            return Err(BenchError::Broker(frame.error_text()));
        }
        if !frame.is("MESSAGE") {
            return Ok(());
        }
        let now_ns = plan.epoch.elapsed().as_nanos() as u64;
        if plan.ack != AckMode::Auto {
            let id_header = if version == Version::V12 {
                "ack"
            } else {
                "message-id"
            };
            let id = frame
                .header(id_header)
                .ok_or_else(|| BenchError::Protocol(format!("MESSAGE without {id_header}")))?;
            let id = Bytes::copy_from_slice(id);
            let subscription = frame.header("subscription").map(Bytes::copy_from_slice);
            match plan.ack {
                AckMode::ClientIndividual => write_ack(out, version, &id, subscription.as_deref()),
                AckMode::Client => self.pending_cumulative = Some((id, subscription)),
                AckMode::Auto => unreachable!(),
            }
        }
        if frame.header_u64(headers::RUN) != Some(plan.run_id) {
            self.stale += 1;
            plan.progress.stale.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let (Some(producer), Some(seq), Some(sent_ns)) = (
            frame.header_u64(headers::PRODUCER),
            frame.header_u64(headers::SEQ),
            frame.header_u64(headers::SENT_NS),
        ) else {
            return Err(BenchError::Protocol(
                "bench message lost its producer/seq/sent headers".into(),
            ));
        };
        let producer = usize::try_from(producer)
            .ok()
            .filter(|&p| p < PRODUCERS_MAX)
            .ok_or_else(|| BenchError::Protocol(format!("producer id {producer} out of range")))?;
        self.deliveries += 1;
        plan.progress.delivered.fetch_add(1, Ordering::Relaxed);
        if !self.seen.mark(producer, seq) {
            self.duplicates += 1;
        }
        if frame.header("redelivered") == Some(b"true") {
            self.redelivered += 1;
        }
        if seq >= plan.warmup {
            self.measured += 1;
            if plan.latency {
                self.latency_ns
                    .saturating_record(now_ns.saturating_sub(sent_ns));
            }
            self.last_receive_ns = self.last_receive_ns.max(now_ns);
        }
        Ok(())
    }

    fn flush_ack(&mut self, version: Version, out: &mut BytesMut) {
        if let Some((id, subscription)) = self.pending_cumulative.take() {
            write_ack(out, version, &id, subscription.as_deref());
        }
    }
}

fn write_ack(out: &mut BytesMut, version: Version, id: &[u8], subscription: Option<&[u8]>) {
    stomp::begin(out, "ACK");
    match version {
        Version::V12 => stomp::header_raw(out, "id", id),
        Version::V11 | Version::V10 => {
            stomp::header_raw(out, "message-id", id);
            if let Some(s) = subscription {
                stomp::header_raw(out, "subscription", s);
            }
        }
    }
    stomp::end(out, b"");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_counts_marks_duplicates_and_merges() {
        let mut a = Seen::default();
        assert!(a.mark(0, 0));
        assert!(a.mark(0, 64));
        assert!(!a.mark(0, 64), "second mark is a duplicate");
        assert_eq!(a.count_below(0, 64), 1);
        assert_eq!(a.count_below(0, 65), 2);
        let mut b = Seen::default();
        b.mark(0, 64);
        b.mark(2, 5);
        assert_eq!(a.merge(&b), 1);
        assert_eq!(a.count_below(2, 6), 1);
    }
}
