//! One STOMP connection: the CONNECT handshake, frame → engine command translation, MESSAGE
//! rendering, heart-beats both ways, and closing with an ERROR that says what was wrong.
//!
//! One task per connection owns its socket. Reading and writing share the task (`select!`), so
//! a client that stops reading its socket also stops being read: backpressure without extra
//! buffers. Errors found here (a malformed frame, a missing header) and errors the engine
//! finds (an unknown ACK id) both travel through the core, so the ERROR frame is written only
//! after every earlier answer for this connection.

use crate::auth::Users;
use crate::cluster::{self, ClusterFeed, ClusterHandle};
use crate::config::Config;
use crate::core::{CoreMsg, Outbound};
use crate::net::{Accepted, ReadHalf, WriteHalf};
use crate::network::headers::{BROKER_HEADER, DEMAND_HEADER, ORIGIN_HEADER, PENALTY_HEADER};
use crate::send_window::{send_body_bytes, SendWindow};
use futures::{SinkExt, StreamExt};
use haven_engine::selector::Selector;
use haven_engine::{
    AckMode, AckRef, Command, ConnId, Decimal, Delivery, Destination, Headers, NetworkConsumer,
    NewMessage, ProducerSeq, SubscribeOptions, NETWORK_ORIGIN_PREFIX, PRODUCER_ID_BYTES_MAX,
};
use haven_stomp::{
    is_empty_and_larger_than, release_large_read_buffer, Command as Cmd, Frame, Item, Limits,
    StompCodec, Version,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant};
use tokio_util::codec::{FramedRead, FramedWrite};

pub(crate) struct Shared {
    pub config: Config,
    pub users: Users,
    /// The cluster settings in force (`config.cluster` is only what the broker started with).
    pub cluster: ClusterHandle,
    pub core: mpsc::Sender<CoreMsg>,
    /// Announced as `haven-store` in CONNECTED (see `store_id.rs`).
    pub store_id: String,
    /// The next connection id (see `next_conn_id`).
    pub next_conn: std::sync::atomic::AtomicU64,
    /// Run before CONNECTED reports a producer's mark (`LogStore::leadership_check`).
    pub leadership: Option<crate::log::LeadershipCheck>,
}

impl Shared {
    /// A connection id never used before by this broker, for a socket or a bridge's
    /// in-process connection. Ids name temporary destinations
    /// (`/remote-temp-queue/haven-<conn>-<name>`): the counter starts from the boot time
    /// (`boot_id << 20`) so a stale reply-to from an earlier run cannot reach a new
    /// connection that happens to get the same number.
    pub fn next_conn_id(&self) -> ConnId {
        self.next_conn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Bytes buffered for the socket beyond which the writer flushes mid-batch. Each consumer's
/// buffer grows to about twice this, and a hundred consumers keep a hundred of them: at
/// 256 KiB they held 50 MiB in scenario (g) of BENCHMARKS.md; 64 KiB is still a few thousand
/// writes per second at full speed.
const WRITE_BUFFER_FLUSH_BYTES: usize = 64 * 1024;

/// A write buffer that grew past this (a large message, a burst) is given back once empty,
/// so that an idle connection keeps little.
const WRITE_BUFFER_KEEP_BYTES: usize = 2 * WRITE_BUFFER_FLUSH_BYTES;

/// Outbound frames written per wake-up before flushing.
const WRITES_PER_FLUSH_MAX: usize = 256;

/// Headers the broker sets on MESSAGE frames or that only steer a SEND; never passed through.
const RESERVED_HEADERS: &[&str] = &[
    "destination",
    "receipt",
    "transaction",
    "content-length",
    "persistent",
    "priority",
    "expires",
    "message-id",
    "timestamp",
    "redelivered",
    "subscription",
    "ack",
    "delivery-count",
];

pub(crate) async fn serve(stream: Accepted, conn: ConnId, shared: Arc<Shared>) {
    let peer = stream.peer.to_string();
    let cfg = &shared.config.stomp;
    let limits = Limits {
        frame_bytes_max: cfg.frame_bytes_max,
        header_count_max: cfg.header_count_max,
        header_bytes_max: cfg.header_bytes_max,
    };
    let (rd, wr) = (stream.read, stream.write);
    let mut reader = FramedRead::new(rd, StompCodec::new(limits));
    let mut writer = FramedWrite::new(wr, StompCodec::new(limits));
    let Some(session) = handshake(conn, &shared, &mut reader, &mut writer).await else {
        return;
    };
    tracing::debug!(conn, %peer, version = session.version.as_str(), "connected");
    run(conn, &shared, session, reader, writer).await;
    tracing::debug!(conn, %peer, "closed");
}

struct Session {
    version: Version,
    limits: Limits,
    outbound: mpsc::UnboundedReceiver<Outbound>,
    /// Negotiated heart-beat periods (0 = none).
    send_ms: u64,
    recv_ms: u64,
    /// Cluster announcements to push, if the client asked for them.
    cluster: Option<ClusterFeed>,
}

async fn write_error_and_close(writer: &mut FramedWrite<WriteHalf, StompCodec>, message: &str) {
    let frame = Frame::new(Cmd::Error)
        .with_header("message", message)
        .with_header("content-type", "text/plain")
        .with_body(format!("{message}\n"));
    // Best effort, bounded: the peer may not be reading.
    let limit = Duration::from_secs(5);
    let _ = within(limit, writer.send(&frame)).await;
    let _ = within(limit, writer.get_mut().shutdown()).await;
}

use tokio::io::AsyncWriteExt;

/// Runs one socket write; false if it failed or did not finish within `limit`.
async fn within<T, E>(
    limit: Duration,
    write: impl std::future::Future<Output = Result<T, E>>,
) -> bool {
    matches!(tokio::time::timeout(limit, write).await, Ok(Ok(_)))
}

/// Parses `heart-beat: cx,cy`.
fn parse_heartbeat(v: &str) -> Option<(u64, u64)> {
    let (a, b) = v.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

async fn handshake(
    conn: ConnId,
    shared: &Shared,
    reader: &mut FramedRead<ReadHalf, StompCodec>,
    writer: &mut FramedWrite<WriteHalf, StompCodec>,
) -> Option<Session> {
    let cfg = &shared.config.stomp;
    let deadline = Instant::now() + Duration::from_millis(cfg.connect_timeout_ms);
    let frame = loop {
        let next = tokio::select! {
            biased;
            next = reader.next() => next,
            _ = sleep_until(deadline) => {
                write_error_and_close(writer, "no CONNECT frame within the connect timeout").await;
                return None;
            }
        };
        match next {
            None => return None,
            Some(Ok(Item::Heartbeat)) => continue,
            Some(Ok(Item::Frame(f))) => break f,
            Some(Err(e)) => {
                write_error_and_close(writer, &e.to_string()).await;
                return None;
            }
        }
    };
    if !matches!(frame.command, Cmd::Connect | Cmd::Stomp) {
        write_error_and_close(
            writer,
            &format!(
                "expected CONNECT or STOMP as the first frame, got {}",
                frame.command.as_str()
            ),
        )
        .await;
        return None;
    }
    let Some(version) = Version::negotiate(frame.header("accept-version")) else {
        write_error_and_close(
            writer,
            "no common protocol version: this broker supports 1.0,1.1,1.2",
        )
        .await;
        return None;
    };
    if !shared
        .users
        .check(frame.header("login"), frame.header("passcode"))
    {
        tracing::info!(
            conn,
            login = frame.header("login").unwrap_or(""),
            "login refused"
        );
        write_error_and_close(writer, "login failed: unknown login or wrong passcode").await;
        return None;
    }
    let (cx, cy) = match frame.header("heart-beat") {
        None => (0, 0),
        Some(v) => match parse_heartbeat(v) {
            Some(hb) if version > Version::V1_0 => hb,
            Some(_) => (0, 0),
            None => {
                write_error_and_close(
                    writer,
                    &format!("bad heart-beat header '{v}': expected two integers 'cx,cy'"),
                )
                .await;
                return None;
            }
        },
    };
    let cluster_updates = match cluster::wants_updates(frame.header(cluster::UPDATES_HEADER)) {
        Ok(wanted) => wanted,
        Err(message) => {
            write_error_and_close(writer, &message).await;
            return None;
        }
    };
    let (sx, sy) = (cfg.heartbeat_send_ms, cfg.heartbeat_receive_ms);
    let send_ms = if sx > 0 && cy > 0 { sx.max(cy) } else { 0 };
    let recv_ms = if sy > 0 && cx > 0 { sy.max(cx) } else { 0 };
    let client_id = frame.header("client-id").map(str::to_string);
    // Exactly-once sends: this session takes the producer over; CONNECTED says how far its
    // sequence got.
    let producer = match frame.header("haven-producer").map(producer_id).transpose() {
        Ok(p) => p,
        Err(message) => {
            write_error_and_close(writer, &message).await;
            return None;
        }
    };
    let session = match frame
        .header("haven-session")
        .map(str::parse::<u64>)
        .transpose()
    {
        Ok(s) => s.unwrap_or(0),
        Err(_) => {
            write_error_and_close(writer, "haven-session must be a number").await;
            return None;
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let (reply_tx, reply_rx) = oneshot::channel();
    if shared
        .core
        .send(CoreMsg::Connect {
            conn,
            client_id,
            producer: producer.clone(),
            session,
            outbound: tx,
            reply: reply_tx,
        })
        .await
        .is_err()
    {
        write_error_and_close(writer, "broker is shutting down").await;
        return None;
    }
    let producer_hwm = match reply_rx.await {
        Ok(Ok(hwm)) => hwm,
        Ok(Err(e)) => {
            write_error_and_close(writer, &e.to_string()).await;
            return None;
        }
        Err(_) => {
            write_error_and_close(writer, "broker is shutting down").await;
            return None;
        }
    };
    // A Raft leader frozen while another was elected answers from its old state until it
    // hears of the newer term: a mark below what the client had receipted since (seen by the
    // replicated soak as "producers forgotten by a store", and failing SENDs as unknown where
    // the client does not resend). Confirmed with a majority after the mark was read, the
    // mark is current.
    if let (Some(_), Some(check)) = (&producer, &shared.leadership) {
        if !check().await {
            write_error_and_close(writer, "not the leader: connect to another member").await;
            return None;
        }
    }
    let mut connected = Frame::new(Cmd::Connected)
        .with_header("version", version.as_str())
        .with_header("server", format!("Haven/{}", env!("CARGO_PKG_VERSION")))
        .with_header("session", format!("haven-{conn}"));
    if version > Version::V1_0 {
        connected.push_header("heart-beat", format!("{sx},{sy}"));
    }
    connected.push_header("haven-store", shared.store_id.as_str());
    connected.push_header(BROKER_HEADER, shared.config.broker.name.as_str());
    // A failover client needs it to tell which of its SENDs the store keeps across a restart
    // (`ConnectionEvent::ProducerForgotten`).
    connected.push_header(
        "haven-persistent-default",
        if shared.config.broker.default_persistent {
            "true"
        } else {
            "false"
        },
    );
    if producer.is_some() {
        connected.push_header("haven-seq", producer_hwm.to_string());
    }
    let cluster = shared.cluster.attach(cluster_updates, &mut connected);
    if !within(
        Duration::from_millis(cfg.connect_timeout_ms),
        writer.send(&connected),
    )
    .await
    {
        let _ = shared
            .core
            .send(CoreMsg::Command(Command::Close {
                conn,
                receipt: None,
            }))
            .await;
        return None;
    }
    reader.decoder_mut().set_version(version);
    writer.encoder_mut().set_version(version);
    Some(Session {
        limits: reader.decoder().limits(),
        version,
        outbound: rx,
        send_ms,
        recv_ms,
        cluster,
    })
}

async fn run(
    conn: ConnId,
    shared: &Shared,
    mut s: Session,
    mut reader: FramedRead<ReadHalf, StompCodec>,
    mut writer: FramedWrite<WriteHalf, StompCodec>,
) {
    let core = &shared.core;
    // A peer that stops reading its socket (paused, wedged) would otherwise hold the messages
    // in flight to it for ever: a write that makes no progress for this long closes it.
    let wt = Duration::from_millis(shared.config.stomp.write_timeout_ms);
    let mut reading = true;
    // Producer flow control: the core holds this connection's SENDs back and asked us to stop
    // reading, so TCP pushes back on the client.
    let mut paused = false;
    // SEND bytes handed to the core and not yet taken off its queue: reading stops while the
    // window is full (`send_window.rs`).
    let window = Arc::new(SendWindow::default());
    let far = Duration::from_secs(86_400 * 365);
    let send_every = if s.send_ms > 0 {
        Duration::from_millis(s.send_ms)
    } else {
        far
    };
    // Twice the negotiated period: heart-beats are best effort and networks jitter.
    let recv_grace = if s.recv_ms > 0 {
        Duration::from_millis(s.recv_ms * 2)
    } else {
        far
    };
    let mut last_write = Instant::now();
    let mut read_deadline = Instant::now() + recv_grace;
    // MESSAGE frames are encoded straight into the write buffer (no `Frame` built per message).
    let mut encoder = StompCodec::new(s.limits);
    encoder.set_version(s.version);
    let mut dest_buf = String::with_capacity(128);
    // Auto-ack deliveries written since the last flush: per subscription, the highest tag.
    let mut credit: Vec<(String, u64)> = Vec::new();
    loop {
        tokio::select! {
            biased;
            ob = s.outbound.recv() => {
                let Some(ob) = ob else { break };
                let mut next = Some(ob);
                let mut done = false;
                let mut n = 0;
                while let Some(ob) = next.take() {
                    match ob {
                        Outbound::Deliver(d) => {
                            if let Err(e) = encode_message(&encoder, &d, s.version, &mut dest_buf, writer.write_buffer_mut()) {
                                // Not written, so not credited: closing redelivers it.
                                tracing::warn!(conn, error = %e, "cannot encode a MESSAGE for this connection; closing it");
                                let message = format!("cannot deliver message {}: {e}", d.message.id);
                                let _ = within(wt, writer.feed(&Frame::new(Cmd::Error).with_header("message", message))).await;
                                done = true;
                                break;
                            }
                            if d.auto_ack {
                                // Credit (and with it the acknowledgement) only once written.
                                match credit.iter_mut().find(|(id, _)| *id == d.sub_id) {
                                    Some((_, t)) => *t = (*t).max(d.ack_tag),
                                    None => credit.push((d.sub_id.clone(), d.ack_tag)),
                                }
                            }
                            if writer.write_buffer().len() >= WRITE_BUFFER_FLUSH_BYTES {
                                if !within(wt, SinkExt::<Item>::flush(&mut writer)).await {
                                    credit.clear();
                                    done = true;
                                    break;
                                }
                                // Written: credit now, not at the end of the batch, so that a
                                // window full of large messages keeps flowing
                                // (`delivery.prefetch_bytes_max`).
                                if !send_credit(core, conn, &mut credit).await {
                                    done = true;
                                    break;
                                }
                            }
                        }
                        Outbound::Receipt(id) => {
                            let frame = Frame::new(Cmd::Receipt).with_header("receipt-id", id);
                            if !within(wt, writer.feed(&frame)).await { done = true; break; }
                        }
                        Outbound::Error { message, receipt } => {
                            // The header carries the first line; the body the whole text (an
                            // invalid selector's error shows the text and a caret under it).
                            let headline = message.lines().next().unwrap_or("").to_string();
                            let mut frame = Frame::new(Cmd::Error).with_header("message", headline);
                            if let Some(r) = receipt { frame.push_header("receipt-id", r); }
                            let frame = frame.with_header("content-type", "text/plain").with_body(format!("{message}\n"));
                            let _ = within(wt, writer.feed(&frame)).await;
                            reading = false;
                        }
                        Outbound::Close => { done = true; break; }
                        Outbound::Pause => paused = true,
                        Outbound::Resume => {
                            paused = false;
                            // Its heart-beats waited in the socket too.
                            read_deadline = Instant::now() + recv_grace;
                        }
                    }
                    n += 1;
                    if n < WRITES_PER_FLUSH_MAX {
                        next = s.outbound.try_recv().ok();
                    }
                }
                if !within(wt, SinkExt::<Item>::flush(&mut writer)).await {
                    // Not known to be written: no acknowledgement; closing redelivers them.
                    credit.clear();
                    done = true;
                }
                let buf = writer.write_buffer_mut();
                if is_empty_and_larger_than(buf, WRITE_BUFFER_KEEP_BYTES) {
                    *buf = bytes::BytesMut::new();
                }
                last_write = Instant::now();
                if !send_credit(core, conn, &mut credit).await {
                    done = true;
                }
                if done { break; }
            }
            () = window.reopened(), if window.is_full() => {
                // Its heart-beats waited in the socket too.
                read_deadline = Instant::now() + recv_grace;
            }
            item = reader.next(), if reading && !paused && !window.is_full() => {
                let now = Instant::now();
                read_deadline = now + recv_grace;
                // The beat's own branch comes later in this biased select, so while frames
                // keep arriving it is rarely reached (measured on a loaded machine: 1 beat of
                // the 30 due in 3 s of a SEND flood), and a client that only sends would drop
                // a healthy broker for silence. Beat here when one is due.
                if now >= last_write + send_every {
                    if !within(wt, writer.send(Item::Heartbeat)).await { break; }
                    last_write = now;
                }
                match item {
                    None => {
                        // Peer went away without DISCONNECT.
                        let _ = core.send(CoreMsg::Command(Command::Close { conn, receipt: None })).await;
                        return;
                    }
                    Some(Err(e)) => {
                        reading = false;
                        let _ = core.send(CoreMsg::Fail { conn, message: e.to_string(), receipt: None }).await;
                    }
                    Some(Ok(Item::Heartbeat)) => {}
                    Some(Ok(Item::Frame(frame))) => {
                        release_large_read_buffer(reader.read_buffer_mut());
                        let disconnect = frame.command == Cmd::Disconnect;
                        let msg = match translate(conn, &frame, s.version, shared) {
                            Ok(cmd) => with_credit(&window, cmd),
                            Err(Refusal::Composite(cmds)) => {
                                // One SEND to several destinations: one command each, in order;
                                // only the last carries the receipt.
                                let mut failed = false;
                                for cmd in cmds {
                                    if core.send(with_credit(&window, cmd)).await.is_err() { failed = true; break; }
                                }
                                if failed { break; }
                                continue;
                            }
                            Err(Refusal::Bad(message)) => {
                                reading = false;
                                CoreMsg::Fail { conn, message, receipt: frame.header("receipt").map(str::to_string) }
                            }
                        };
                        if disconnect { reading = false; }
                        if core.send(msg).await.is_err() { break; }
                    }
                }
            }
            frame = cluster::next_announcement(&mut s.cluster) => {
                // Unsolicited, outside every subscription: see `cluster`.
                if !within(wt, writer.send(&frame)).await { break; }
                last_write = Instant::now();
            }
            _ = sleep_until(last_write + send_every) => {
                if !within(wt, writer.send(Item::Heartbeat)).await { break; }
                last_write = Instant::now();
            }
            _ = sleep_until(read_deadline), if reading && !paused && !window.is_full() => {
                reading = false;
                let message = format!("no frame or heart-beat for {} ms; closing", recv_grace.as_millis());
                let _ = core.send(CoreMsg::Fail { conn, message, receipt: None }).await;
            }
        }
    }
    let _ = within(wt, writer.get_mut().shutdown()).await;
    // Idempotent: the engine ignores a Close for a connection it already closed.
    let _ = core
        .send(CoreMsg::Command(Command::Close {
            conn,
            receipt: None,
        }))
        .await;
}

fn required<'a>(frame: &'a Frame, name: &str) -> Result<&'a str, String> {
    frame
        .header(name)
        .ok_or_else(|| format!("{} frame needs a '{name}' header", frame.command.as_str()))
}

fn opt(frame: &Frame, name: &str) -> Option<String> {
    frame.header(name).map(str::to_string)
}

/// A `haven-producer` id: non-empty, at most `PRODUCER_ID_BYTES_MAX` bytes.
fn producer_id(id: &str) -> Result<String, String> {
    if id.is_empty() || id.len() > PRODUCER_ID_BYTES_MAX {
        return Err(format!(
            "haven-producer must be 1 to {PRODUCER_ID_BYTES_MAX} bytes, not {} bytes",
            id.len()
        ));
    }
    if id.starts_with(NETWORK_ORIGIN_PREFIX) {
        return Err(format!(
            "haven-producer may not begin with '{NETWORK_ORIGIN_PREFIX}' (reserved for \
             haven-net-origin)"
        ));
    }
    Ok(id.to_string())
}

/// `cmd` for the core's queue: a SEND with its body's bytes in `window`.
fn with_credit(window: &Arc<SendWindow>, cmd: Command) -> CoreMsg {
    match send_body_bytes(&cmd) {
        Some(bytes) => {
            let credit = window.take(bytes);
            CoreMsg::Send(cmd, credit)
        }
        None => CoreMsg::Command(cmd),
    }
}

/// `haven-net-origin`: names one message for duplicate detection, whoever sends it; a second
/// SEND with the same origin is answered and not stored. Bridges set it to the store and
/// message id the message had on the broker it came from. Judged like a producer of its own
/// whose only sequence number is 1 (see the engine's `NETWORK_ORIGIN_PREFIX`).
fn origin_seq(frame: &Frame) -> Result<Option<ProducerSeq>, String> {
    let Some(origin) = frame.header(ORIGIN_HEADER) else {
        return Ok(None);
    };
    // Not `format!`: one per forwarded SEND, and it was 2% of a receiving broker's instructions.
    let mut producer = String::with_capacity(NETWORK_ORIGIN_PREFIX.len() + origin.len());
    producer.push_str(NETWORK_ORIGIN_PREFIX);
    producer.push_str(origin);
    if origin.is_empty() || producer.len() > PRODUCER_ID_BYTES_MAX {
        return Err(format!(
            "{ORIGIN_HEADER} must be 1 to {} bytes, not {} bytes",
            PRODUCER_ID_BYTES_MAX - NETWORK_ORIGIN_PREFIX.len(),
            origin.len()
        ));
    }
    if frame.header("haven-producer").is_some() {
        return Err(format!(
            "a SEND carries either {ORIGIN_HEADER} or haven-producer/haven-seq, not both"
        ));
    }
    Ok(Some(ProducerSeq { producer, seq: 1 }))
}

/// `haven-net-demand` (and `haven-net-priority-penalty`) on SUBSCRIBE: a network bridge
/// subscribing on behalf of consumers on other brokers (see `network/`).
fn network_consumer(frame: &Frame) -> Result<Option<NetworkConsumer>, String> {
    let Some(path) = frame.header(DEMAND_HEADER) else {
        return Ok(None);
    };
    let demand_path = crate::network::path::parse(path)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            format!("{DEMAND_HEADER} must be a comma-separated list of broker names, not '{path}'")
        })?;
    let priority_penalty = match frame.header(PENALTY_HEADER) {
        None => 0,
        Some(v) => v
            .parse::<u8>()
            .map_err(|_| format!("{PENALTY_HEADER} must be an integer 0-255, not '{v}'"))?,
    };
    Ok(Some(NetworkConsumer {
        demand_path,
        priority_penalty,
    }))
}

/// Exactly-once sends: `haven-producer` and `haven-seq` (a decimal u64 of at least 1), both
/// or neither. The headers stay on the message too (consumers and bridges may use them).
fn producer_seq(frame: &Frame) -> Result<Option<ProducerSeq>, String> {
    let command = frame.command.as_str();
    match (frame.header("haven-producer"), frame.header("haven-seq")) {
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(format!(
            "{command} frame has only one of 'haven-producer' and 'haven-seq': both or neither"
        )),
        (Some(id), Some(seq)) => {
            let producer = producer_id(id)?;
            let seq = match seq.parse::<u64>() {
                Ok(s) if s >= 1 => s,
                _ => {
                    return Err(format!(
                        "haven-seq must be a decimal integer from 1 to {}, not '{seq}'",
                        u64::MAX
                    ))
                }
            };
            Ok(Some(ProducerSeq { producer, seq }))
        }
    }
}

/// Why a frame did not become exactly one command.
pub(crate) enum Refusal {
    /// Malformed: this message goes into the ERROR frame.
    Bad(String),
    /// A SEND to a composite destination (`/queue/a,/topic/b`): one command per destination.
    Composite(Vec<Command>),
}

impl Refusal {
    /// What to tell whoever sent the frame.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Bad(message) => message,
            Refusal::Composite(_) => "a SEND to several destinations is not one command",
        }
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal::Bad(message)
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Refusal {
        Refusal::Bad(message.to_string())
    }
}

/// Most destinations one composite SEND may name.
const COMPOSITE_DESTINATIONS_MAX: usize = 64;

/// Turns a client frame into an engine command, or says what is wrong with it.
pub(crate) fn translate(
    conn: ConnId,
    frame: &Frame,
    version: Version,
    shared: &Shared,
) -> Result<Command, Refusal> {
    let receipt = opt(frame, "receipt");
    let dest = |name: &str| Destination::parse(name, conn).map_err(|e| e.to_string());
    Ok(match frame.command {
        Cmd::Send => {
            let dest_text = required(frame, "destination")?;
            let mut composite = Vec::new();
            if dest_text.contains(',') {
                for part in dest_text.split(',') {
                    composite.push(dest(part.trim())?);
                }
                if composite.len() > COMPOSITE_DESTINATIONS_MAX {
                    return Err(Refusal::Bad(format!(
                        "composite destination names {} destinations; at most {COMPOSITE_DESTINATIONS_MAX}",
                        composite.len()
                    )));
                }
            }
            let destination = match composite.first() {
                Some(d) => d.clone(),
                None => dest(dest_text)?,
            };
            let persistent = match frame.header("persistent") {
                None => shared.config.broker.default_persistent,
                Some("true") => true,
                Some("false") => false,
                Some(v) => {
                    return Err(format!("persistent must be 'true' or 'false', not '{v}'").into())
                }
            };
            let priority = match frame.header("priority") {
                None => haven_engine::PRIORITY_DEFAULT,
                Some(v) => match v.trim().parse::<u8>() {
                    Ok(p) if p <= 9 => p,
                    _ => return Err(format!("priority must be an integer 0-9, not '{v}'").into()),
                },
            };
            let expires_ms = match frame.header("expires") {
                None => 0,
                Some(v) => v.trim().parse::<u64>().map_err(|_| {
                    format!("expires must be milliseconds since the epoch, not '{v}'")
                })?,
            };
            // The first `reply-to` naming the owner's own temporary destination becomes a name
            // any connection can send to.
            let reply_to = match frame.header("reply-to") {
                Some(v) if v.starts_with("/temp-") => Some(dest(v)?.to_string()),
                _ => None,
            };
            let transaction = opt(frame, "transaction");
            // Inside a transaction the COMMIT carries the producer sequence; a SEND's own
            // producer headers are plain headers there (not interpreted, not checked).
            let producer = match transaction {
                Some(_) => None,
                None => match origin_seq(frame)? {
                    Some(origin) => Some(origin),
                    None => producer_seq(frame)?,
                },
            };
            if composite.len() > 1 && producer.is_some() {
                // One sequence number cannot cover several stores that are not atomic.
                return Err(Refusal::Bad(
                    "haven-producer/haven-seq cannot be used with a composite destination \
                     outside a transaction"
                        .into(),
                ));
            }
            // The message keeps the producer's headers less the broker-managed ones and
            // repeats (the first occurrence wins). The origin is kept as the message's
            // producer mark; as a header too, a forwarded message would store it twice and
            // hand it to every consumer.
            let repeats = frame.headers.has_repeated_names();
            let kept = frame.headers.iter().enumerate().filter_map(|(i, (k, v))| {
                if RESERVED_HEADERS.contains(&k)
                    || k == ORIGIN_HEADER
                    || (repeats && frame.headers.position(k) != Some(i))
                {
                    return None;
                }
                match (k, &reply_to) {
                    ("reply-to", Some(rewritten)) => Some((k, rewritten.as_str())),
                    _ => Some((k, v)),
                }
            });
            let message = NewMessage {
                headers: Headers::sized(kept),
                body: frame.body.clone(),
                persistent,
                priority,
                expires_ms,
            };
            if composite.len() > 1 {
                let last = composite.len() - 1;
                let cmds = composite
                    .into_iter()
                    .enumerate()
                    .map(|(i, destination)| Command::Send {
                        conn,
                        destination,
                        message: message.clone(),
                        transaction: transaction.clone(),
                        receipt: if i == last { receipt.clone() } else { None },
                        producer: None,
                    })
                    .collect();
                return Err(Refusal::Composite(cmds));
            }
            Command::Send {
                conn,
                destination,
                message,
                transaction,
                receipt,
                producer,
            }
        }
        Cmd::Subscribe => {
            let dest_text = required(frame, "destination")?;
            let destination = dest(dest_text)?;
            let sub_id = match frame.header("id") {
                Some(id) => id.to_string(),
                None if version == Version::V1_0 => dest_text.to_string(),
                None => return Err("SUBSCRIBE frame needs an 'id' header".into()),
            };
            let ack = match frame.header("ack") {
                None => AckMode::Auto,
                Some(v) => AckMode::parse(v).ok_or_else(|| {
                    format!("ack must be auto, client or client-individual, not '{v}'")
                })?,
            };
            let d = &shared.config.delivery;
            let prefetch = match frame.header("activemq.prefetchSize") {
                None => d.prefetch_default,
                Some(v) => v
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| {
                        format!("activemq.prefetchSize must be a non-negative integer, not '{v}'")
                    })?
                    .clamp(1, d.prefetch_max),
            };
            let exclusive = match frame.header("activemq.exclusive") {
                None | Some("false") => false,
                Some("true") => true,
                Some(v) => {
                    return Err(
                        format!("activemq.exclusive must be 'true' or 'false', not '{v}'").into(),
                    )
                }
            };
            let priority = match frame.header("activemq.priority") {
                None => 0,
                Some(v) => match v.trim().parse::<u8>() {
                    Ok(p) if p <= 127 => p,
                    _ => {
                        return Err(format!(
                            "activemq.priority must be an integer 0-127, not '{v}'"
                        )
                        .into())
                    }
                },
            };
            let selector = match frame.header("selector").map(str::trim) {
                None | Some("") => None,
                Some(text) => Some(Selector::parse(text).map_err(|e| e.to_string())?),
            };
            let browser = match frame.header("browser") {
                None | Some("false") => false,
                Some("true") => true,
                Some(v) => {
                    return Err(format!("browser must be 'true' or 'false', not '{v}'").into())
                }
            };
            let options = SubscribeOptions {
                exclusive,
                priority,
                selector,
                browser,
                network: network_consumer(frame)?,
            };
            let durable_name = opt(frame, "activemq.subscriptionName")
                .or_else(|| opt(frame, "durable-subscription-name"));
            Command::Subscribe {
                conn,
                sub_id,
                destination,
                ack,
                prefetch,
                durable_name,
                options,
                receipt,
            }
        }
        Cmd::Unsubscribe => {
            let sub_id = match (frame.header("id"), frame.header("destination")) {
                (Some(id), _) => id.to_string(),
                (None, Some(d)) if version == Version::V1_0 => d.to_string(),
                _ => return Err("UNSUBSCRIBE frame needs an 'id' header".into()),
            };
            let durable_name = opt(frame, "activemq.subscriptionName")
                .or_else(|| opt(frame, "durable-subscription-name"));
            Command::Unsubscribe {
                conn,
                sub_id,
                durable_name,
                receipt,
            }
        }
        Cmd::Ack | Cmd::Nack => {
            let ack = ack_ref(frame, version)?;
            let transaction = opt(frame, "transaction");
            if frame.command == Cmd::Ack {
                Command::Ack {
                    conn,
                    ack,
                    transaction,
                    receipt,
                }
            } else {
                Command::Nack {
                    conn,
                    ack,
                    transaction,
                    receipt,
                }
            }
        }
        Cmd::Begin => Command::Begin {
            conn,
            transaction: required(frame, "transaction")?.to_string(),
            receipt,
        },
        Cmd::Commit => Command::Commit {
            conn,
            transaction: required(frame, "transaction")?.to_string(),
            receipt,
            producer: producer_seq(frame)?,
        },
        Cmd::Abort => Command::Abort {
            conn,
            transaction: required(frame, "transaction")?.to_string(),
            receipt,
        },
        Cmd::Disconnect => Command::Close { conn, receipt },
        Cmd::Connect | Cmd::Stomp => {
            return Err("already connected: a second CONNECT is not allowed".into())
        }
        Cmd::Connected | Cmd::Message | Cmd::Receipt | Cmd::Error => {
            return Err(format!(
                "{} is a server frame; a client may not send it",
                frame.command.as_str()
            )
            .into())
        }
    })
}

fn ack_ref(frame: &Frame, version: Version) -> Result<AckRef, String> {
    if version == Version::V1_2 {
        let id = required(frame, "id")?;
        return match id.parse::<u64>() {
            Ok(tag) => Ok(AckRef::Tag(tag)),
            // Some clients ack by message-id even in 1.2.
            Err(_) => Ok(AckRef::MessageId {
                message_id: id.to_string(),
                subscription: opt(frame, "subscription"),
            }),
        };
    }
    let message_id = required(frame, "message-id")?.to_string();
    Ok(AckRef::MessageId {
        message_id,
        subscription: opt(frame, "subscription"),
    })
}

fn m_has_trailing_cr(d: &Delivery) -> bool {
    d.message
        .headers
        .iter()
        .any(|(k, v)| k.ends_with('\r') || v.ends_with('\r'))
}

/// Reports auto-ack deliveries written (per subscription, up to a tag) to the core, which
/// acknowledges them and frees their prefetch credit. False if the core is gone.
async fn send_credit(
    core: &mpsc::Sender<CoreMsg>,
    conn: ConnId,
    credit: &mut Vec<(String, u64)>,
) -> bool {
    for (sub_id, up_to_tag) in credit.drain(..) {
        let credit = Command::Credit {
            conn,
            sub_id,
            up_to_tag,
        };
        if core.send(CoreMsg::Command(credit)).await.is_err() {
            return false;
        }
    }
    true
}

/// Writes one MESSAGE frame for `d` into `dst`.
fn encode_message(
    encoder: &StompCodec,
    d: &Delivery,
    version: Version,
    dest_buf: &mut String,
    dst: &mut bytes::BytesMut,
) -> std::io::Result<()> {
    let cr_for_1_1 = version == Version::V1_1 && m_has_trailing_cr(d);
    if version == Version::V1_0 || cr_for_1_1 {
        // Rare, and needs header rewriting: the allocating path.
        let f = render_message(d, version);
        return encoder.encode_parts(Cmd::Message, f.headers.iter(), &f.body, dst);
    }
    let m = &d.message;
    dest_buf.clear();
    m.destination.push_header_form(dest_buf);
    let (tag, count) = (
        Decimal::new(d.ack_tag),
        Decimal::new(d.delivery_count as u64),
    );
    let (ts, prio, exp) = (
        Decimal::new(m.timestamp_ms),
        Decimal::new(m.priority as u64),
        Decimal::new(m.expires_ms),
    );
    let bool_str = |b: bool| if b { "true" } else { "false" };
    let fixed = [
        ("subscription", d.sub_id.as_str()),
        ("message-id", m.id.as_str()),
        ("destination", dest_buf.as_str()),
        ("ack", tag.as_str()),
        ("redelivered", bool_str(d.redelivered)),
        ("delivery-count", count.as_str()),
        ("timestamp", ts.as_str()),
        ("priority", prio.as_str()),
        ("expires", exp.as_str()),
        ("persistent", bool_str(m.persistent)),
    ];
    let v12 = version == Version::V1_2;
    let headers = fixed
        .iter()
        .copied()
        .filter(move |(k, _)| v12 || *k != "ack")
        .chain(m.headers.iter());
    encoder.encode_parts(Cmd::Message, headers, &m.body, dst)
}

fn render_message(d: &Delivery, version: Version) -> Frame {
    let m = &d.message;
    let mut headers: Vec<(String, String)> = Vec::with_capacity(10 + m.headers.len());
    headers.push(("subscription".into(), d.sub_id.clone()));
    headers.push(("message-id".into(), m.id.clone()));
    headers.push(("destination".into(), m.destination.to_string()));
    if version == Version::V1_2 {
        headers.push(("ack".into(), d.ack_tag.to_string()));
    }
    headers.push(("redelivered".into(), d.redelivered.to_string()));
    headers.push(("delivery-count".into(), d.delivery_count.to_string()));
    headers.push(("timestamp".into(), m.timestamp_ms.to_string()));
    headers.push(("priority".into(), m.priority.to_string()));
    headers.push(("expires".into(), m.expires_ms.to_string()));
    headers.push(("persistent".into(), m.persistent.to_string()));
    if version == Version::V1_1 {
        // 1.1 cannot escape CR, and a value ending in one would lose it (or break the frame).
        let clean = |v: &str| match v.strip_suffix('\r') {
            Some(rest) => format!("{rest} "),
            None => v.to_string(),
        };
        headers.extend(m.headers.iter().map(|(k, v)| (clean(k), clean(v))));
    } else if version == Version::V1_0 {
        // STOMP 1.0 has no header escaping: a newline (or a colon in a name) from a 1.1/1.2
        // producer cannot be written, so it is replaced rather than breaking the consumer.
        let clean = |s: &str, colon: bool| {
            s.replace(['\n', '\r'], " ")
                .replace(if colon { ':' } else { '\n' }, "_")
        };
        headers.extend(
            m.headers
                .iter()
                .map(|(k, v)| (clean(k, true), clean(v, false))),
        );
    } else {
        headers.extend(
            m.headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
    }
    Frame {
        command: Cmd::Message,
        headers: Headers::from_pairs(&headers),
        body: m.body.clone(),
    }
}

/// Answers a connection the broker will not serve with an ERROR, then closes it.
pub(crate) async fn refuse(stream: Accepted, message: &str) {
    let wr = stream.write;
    let mut writer = FramedWrite::new(wr, StompCodec::new(Limits::default()));
    write_error_and_close(&mut writer, message).await;
}
