//! One producer connection: sends `SEND` frames tagged with run id, producer id, sequence number
//! and send time, and measures send→receipt latency.
//!
//! Ownership: the producer task owns the write half; a reader task it spawns owns the read half
//! and the receipt histogram. They share only a semaphore (the receipt window: one permit per
//! RECEIPT-requesting frame in flight) and the id of the last receipt. The receipt id carries
//! `seq.sent_ns`, so the reader needs no table of pending sends. Receipts may come back out of
//! send order (RabbitMQ's publisher confirms do); each one confirms only its own frame.
//!
//! Every producer asks a RECEIPT for its last frame, so when it finishes, every message it sent
//! has been confirmed by the broker and must be delivered: that is what the accounting checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use hdrhistogram::Histogram;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use super::error::{BenchError, Result};
use super::stomp::{self, ConnectOptions, FrameReader};
use super::{headers, report, Stop};

/// Receipt id of the producer's final DISCONNECT.
const DISCONNECT_RECEIPT: &str = "disconnect";

/// A producer flushes its batch of encoded frames once it holds this many bytes.
const FLUSH_BYTES: usize = 16 << 10;

pub struct ProducerPlan {
    pub id: u32,
    pub connect: ConnectOptions,
    pub destination: String,
    pub body: Arc<Vec<u8>>,
    pub persistent: bool,
    /// 0 = only the last frame asks a receipt.
    pub receipt_every: u64,
    /// Receipt-requesting frames in flight at most (1 for `receipt_every == 1`).
    pub receipt_window: usize,
    pub stop: Stop,
    pub warmup: u64,
    pub run_id: u64,
    pub epoch: Instant,
    pub receipt_timeout: Duration,
    pub extra_headers: Vec<(String, String)>,
    /// Messages sent so far, for the progress bar.
    pub sent_counter: Arc<AtomicU64>,
    /// `--rate`: message `seq` goes out no earlier than `seq * interval` after the first.
    pub interval: Option<Duration>,
}

pub struct ProducerReport {
    pub id: u32,
    /// Messages sent (sequence numbers 0..sent), every one receipted.
    pub sent: u64,
    pub receipts: u64,
    pub receipt_latency_ns: Histogram<u64>,
    /// When the first measured (post-warm-up) message went out and when the last receipt came.
    pub measure_start: Instant,
    pub end: Instant,
}

pub async fn run(plan: ProducerPlan) -> Result<ProducerReport> {
    let conn = stomp::connect(&plan.connect).await?;
    let mut writer = conn.writer;
    let window = Arc::new(Semaphore::new(plan.receipt_window));
    let last_receipt = Arc::new(AtomicU64::new(0));
    let reader = tokio::spawn(read_receipts(
        conn.reader,
        window.clone(),
        last_receipt.clone(),
        plan.epoch,
        plan.warmup,
    ));

    let mut buf = BytesMut::with_capacity(FLUSH_BYTES * 2);
    let mut seq: u64 = 0;
    let mut measure_start = Instant::now();
    let mut deadline = None;
    let mut receipts_asked: u64 = 0;
    let persistent = if plan.persistent { "true" } else { "false" };
    let paced_from = Instant::now();
    let send_result: Result<()> = async {
        loop {
            let mut now = Instant::now();
            if let Some(interval) = plan.interval {
                // Due times, not sleeps between sends: a late wake-up (the timer's resolution
                // is a millisecond) sends what fell due meanwhile at once, so the average rate
                // holds and nothing is sent ahead of its time.
                let due = paced_from + interval.mul_f64(seq as f64);
                if now < due {
                    if !buf.is_empty() {
                        writer.write_all(&buf).await?;
                        buf.clear();
                    }
                    tokio::time::sleep_until(due.into()).await;
                    now = Instant::now();
                }
            }
            if seq == plan.warmup {
                measure_start = now;
                if let Stop::Duration(d) = plan.stop {
                    deadline = Some(now + d);
                }
            }
            let last = match plan.stop {
                Stop::Count(n) => seq + 1 >= n,
                Stop::Duration(_) => deadline.is_some_and(|d| now >= d),
            };
            let want_receipt =
                last || (plan.receipt_every > 0 && (seq + 1).is_multiple_of(plan.receipt_every));
            if want_receipt {
                // Send what is batched before (possibly) waiting for the window.
                if !buf.is_empty() {
                    writer.write_all(&buf).await?;
                    buf.clear();
                }
                match window.acquire().await {
                    Ok(permit) => permit.forget(),
                    // Closed by the reader, which holds the reason.
                    Err(_) => return Err(BenchError::Closed("while sending")),
                }
                receipts_asked += 1;
            }
            let sent_ns = plan.epoch.elapsed().as_nanos() as u64;
            stomp::begin(&mut buf, "SEND");
            stomp::header(&mut buf, "destination", &plan.destination);
            stomp::header(&mut buf, "persistent", persistent);
            stomp::header(&mut buf, "content-length", plan.body.len());
            stomp::header(&mut buf, headers::RUN, plan.run_id);
            stomp::header(&mut buf, headers::PRODUCER, plan.id);
            stomp::header(&mut buf, headers::SEQ, seq);
            stomp::header(&mut buf, headers::SENT_NS, sent_ns);
            for (k, v) in &plan.extra_headers {
                stomp::header(&mut buf, k, v);
            }
            if want_receipt {
                stomp::header(&mut buf, "receipt", format_args!("{seq}.{sent_ns}"));
            }
            stomp::end(&mut buf, &plan.body);
            seq += 1;
            plan.sent_counter.fetch_add(1, Ordering::Relaxed);
            if want_receipt || buf.len() >= FLUSH_BYTES {
                writer.write_all(&buf).await?;
                buf.clear();
            }
            if last {
                return Ok(());
            }
        }
    }
    .await;
    if let Err(e) = send_result {
        if window.is_closed() {
            if let Ok(Err(reason)) = reader.await {
                return Err(reason);
            }
        } else {
            reader.abort();
        }
        return Err(e);
    }
    // Wait until every receipt is in: all permits back.
    let all = u32::try_from(plan.receipt_window).expect("receipt window fits u32");
    match tokio::time::timeout(plan.receipt_timeout, window.acquire_many(all)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => {
            // The reader closed the window: it has the reason.
            return Err(match reader.await {
                Ok(Err(e)) => e,
                _ => BenchError::Closed("before all receipts arrived"),
            });
        }
        Err(_) => {
            reader.abort();
            return Err(BenchError::Timeout(format!(
                "producer {}: {} receipt(s) outstanding after {:?}",
                plan.id,
                plan.receipt_window - window.available_permits(),
                plan.receipt_timeout
            )));
        }
    }
    let end = Instant::now();
    let last = last_receipt.load(Ordering::Acquire);
    assert_eq!(
        last,
        seq - 1,
        "all permits back means the last frame's receipt arrived"
    );
    // DISCONNECT with a receipt: the reader stops at that receipt, whether or not the broker
    // then closes the socket.
    stomp::begin(&mut buf, "DISCONNECT");
    stomp::header(&mut buf, "receipt", DISCONNECT_RECEIPT);
    stomp::end(&mut buf, b"");
    writer.write_all(&buf).await?;
    let (receipts, receipt_latency_ns) =
        match tokio::time::timeout(Duration::from_secs(5), reader).await {
            Ok(Ok(Ok(r))) => r,
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(join)) => panic!("receipt reader panicked: {join}"),
            Err(_) => {
                return Err(BenchError::Timeout(
                    "no RECEIPT for DISCONNECT within 5 s".into(),
                ))
            }
        };
    let _ = writer.shutdown().await;
    assert_eq!(receipts, receipts_asked);
    Ok(ProducerReport {
        id: plan.id,
        sent: seq,
        receipts,
        receipt_latency_ns,
        measure_start,
        end,
    })
}

/// Reads RECEIPTs until the DISCONNECT's receipt (or the broker closes the connection). On ERROR or a protocol violation it
/// closes the window, so the producer stops instead of waiting forever.
async fn read_receipts(
    mut reader: FrameReader,
    window: Arc<Semaphore>,
    last_receipt: Arc<AtomicU64>,
    epoch: Instant,
    warmup: u64,
) -> Result<(u64, Histogram<u64>)> {
    let mut histogram = report::new_histogram();
    let mut receipts = 0u64;
    let result = loop {
        let frame = match reader.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        if frame.is("ERROR") {
            break Err(BenchError::Broker(frame.error_text()));
        }
        if !frame.is("RECEIPT") {
            continue;
        }
        let now_ns = epoch.elapsed().as_nanos() as u64;
        if frame.header("receipt-id") == Some(DISCONNECT_RECEIPT.as_bytes()) {
            break Ok(());
        }
        let Some((seq, sent_ns)) = frame.header("receipt-id").and_then(parse_receipt_id) else {
            break Err(BenchError::Protocol(
                "RECEIPT with an unknown receipt-id".into(),
            ));
        };
        if seq >= warmup {
            histogram.saturating_record(now_ns.saturating_sub(sent_ns));
        }
        receipts += 1;
        last_receipt.fetch_max(seq, Ordering::AcqRel);
        window.add_permits(1);
    };
    window.close();
    result.map(|()| (receipts, histogram))
}

fn parse_receipt_id(id: &[u8]) -> Option<(u64, u64)> {
    let dot = id.iter().position(|&b| b == b'.')?;
    Some((
        stomp::parse_u64(&id[..dot])?,
        stomp::parse_u64(&id[dot + 1..])?,
    ))
}
