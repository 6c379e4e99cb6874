//! `Connection`: one STOMP session over one TCP socket.
//!
//! Task ownership: `connect` spawns a writer task (owns the write half, see `writer.rs`) and a
//! reader task (owns the read half, see `reader.rs`). The handle owns the writer's queue sender
//! and the reader's abort handle; when the last clone of the handle is dropped, the queue closes
//! (the writer flushes what was queued, then shuts the socket's write side) and the reader is
//! aborted, which drops its subscriptions: a dropped connection is a closed connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::transport::{ReadHalf, WriteHalf};
use bytes::{Bytes, BytesMut};
use haven_stomp::{Command, Frame, Item, Limits, StompCodec, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_util::codec::{Decoder, Encoder};

use crate::options::parse_address;
use crate::shared::{Hooks, Shared};
use crate::{reader, writer};
use crate::{AckMode, ClientError, ConnectOptions, Message, Result, Subscription};

/// A connected STOMP session. Cheap to clone; every clone is the same session, and all methods
/// take `&self`, so any number of tasks may send, ack and subscribe concurrently.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

struct Inner {
    outgoing: mpsc::Sender<Bytes>,
    shared: Arc<Shared>,
    version: Version,
    connected_headers: haven_stomp::Headers,
    next_id: AtomicU64,
    subscription_buffer_messages_max: usize,
    disconnect_timeout_ms: u64,
    reader: AbortHandle,
    writer: AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// A RECEIPT the broker owes: resolves `Ok(())` when it arrives, or to the error that closed
/// the connection first. Dropping it does not cancel the frame, only the wait.
#[must_use = "a Receipt does nothing unless awaited"]
#[derive(Debug)]
pub struct Receipt {
    id: String,
    rx: oneshot::Receiver<Result<()>>,
}

impl Receipt {
    /// The `receipt` header value sent with the frame.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Future for Receipt {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(ClientError::Closed)))
    }
}

impl Connection {
    /// Connects to `addr` (`tcp://host:port` or `host:port`) and completes the CONNECT /
    /// CONNECTED exchange within `opts.connect_timeout_ms`. An ERROR answer is
    /// [`ClientError::Refused`] with the broker's `message` header.
    pub async fn connect(addr: &str, opts: ConnectOptions) -> Result<Connection> {
        Connection::connect_hooked(addr, &opts, Hooks::default()).await
    }

    pub(crate) async fn connect_hooked(
        addr: &str,
        opts: &ConnectOptions,
        hooks: Hooks,
    ) -> Result<Connection> {
        let address = parse_address(addr)?;
        let timeout_ms = opts.connect_timeout_ms;
        match tokio::time::timeout(
            Duration::from_millis(timeout_ms),
            handshake(&address.authority, &address.host, opts),
        )
        .await
        {
            Ok(Ok(established)) => Ok(Connection::start(established, opts, hooks)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ClientError::Timeout {
                what: "CONNECTED",
                ms: timeout_ms,
            }),
        }
    }

    fn start(est: Established, opts: &ConnectOptions, hooks: Hooks) -> Connection {
        let (read_half, write_half) = (est.read, est.write);
        let shared = Arc::new(Shared::new(hooks));
        let (tx, rx) = mpsc::channel(opts.write_queue_frames_max.max(1));
        let (send_ms, recv_ms) =
            negotiate_heartbeat(opts.heartbeat_ms, est.version, &est.connected);
        let writer = tokio::spawn(writer::run(write_half, rx, send_ms, shared.clone()));
        let mut codec = StompCodec::new(Limits::default());
        codec.set_version(est.version);
        let reader = tokio::spawn(reader::run(
            read_half,
            est.buffered,
            codec,
            recv_ms,
            shared.clone(),
            writer.abort_handle(),
        ));
        Connection {
            inner: Arc::new(Inner {
                outgoing: tx,
                shared,
                version: est.version,
                connected_headers: est.connected.headers,
                next_id: AtomicU64::new(1),
                subscription_buffer_messages_max: opts.subscription_buffer_messages_max.max(1),
                disconnect_timeout_ms: opts.connect_timeout_ms,
                reader: reader.abort_handle(),
                writer: writer.abort_handle(),
            }),
        }
    }

    /// The negotiated protocol version.
    pub fn version(&self) -> Version {
        self.inner.version
    }

    /// A header of the broker's CONNECTED frame (`session`, `server`, `heart-beat`, ...).
    pub fn connected_header(&self, name: &str) -> Option<&str> {
        self.inner.connected_headers.get(name)
    }

    /// Why the connection closed, or `None` while it is open.
    pub fn close_reason(&self) -> Option<ClientError> {
        self.inner.shared.close_reason()
    }

    pub fn is_closed(&self) -> bool {
        self.close_reason().is_some()
    }

    /// Resolves once the connection has closed, with the reason.
    pub async fn closed(&self) -> ClientError {
        let mut watch = self.inner.shared.closed_watch();
        // An error here means the sender (inside `Shared`, which we hold) is gone: impossible.
        let _ = watch.wait_for(|closed| *closed).await;
        self.close_reason().unwrap_or(ClientError::Closed)
    }

    /// Where the failover client's generation of this connection is recorded.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.shared.generation()
    }

    /// Registers `tx` as subscription `id` and sends `frame` (a SUBSCRIBE carrying that id)
    /// with a receipt: how a failover client restores a subscription on a new connection.
    pub(crate) async fn subscribe_raw(
        &self,
        id: &str,
        frame: Frame,
        tx: mpsc::Sender<Message>,
    ) -> Result<Receipt> {
        self.inner.shared.register_subscription(id, tx)?;
        self.request(frame).await
    }

    /// Routes MESSAGE frames for subscription `id` to `tx` without sending a SUBSCRIBE (for
    /// frames a broker pushes unasked, such as cluster announcements).
    pub(crate) fn register_channel(&self, id: &str, tx: mpsc::Sender<Message>) -> Result<()> {
        self.inner.shared.register_subscription(id, tx)
    }

    /// Queues `frame` as is; its `receipt` header (if any) is answered through the receipt
    /// sink of the connection's hooks.
    pub(crate) async fn enqueue_frame(&self, frame: &Frame) -> Result<()> {
        self.enqueue(frame).await
    }

    /// Closes the socket at once, without DISCONNECT: the broker treats it as a lost
    /// connection (unacknowledged messages are delivered again). For callers that give up on
    /// a connection, such as a network bridge ending a session.
    pub fn close_now(&self) {
        self.abandon(ClientError::Closed);
    }

    /// Closes at once without DISCONNECT (the failover client giving up on a broker).
    pub(crate) fn abandon(&self, reason: ClientError) {
        self.inner.shared.close(reason);
        self.inner.writer.abort();
        self.inner.reader.abort();
    }

    // ----- sending -----------------------------------------------------------------------

    /// Queues a SEND without a receipt; returns once the writer task has it.
    pub async fn send(
        &self,
        destination: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<()> {
        self.enqueue(&send_frame(destination, headers, body.into()))
            .await
    }

    /// Sends with a `receipt` header and waits for the broker's RECEIPT (for a persistent
    /// message on Haven: it is on disk).
    pub async fn send_receipted(
        &self,
        destination: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<()> {
        self.send_with_receipt_future(destination, headers, body)
            .await?
            .await
    }

    /// Queues a SEND with a `receipt` header and returns the pending [`Receipt`] without
    /// waiting for it, so a caller can keep many receipts outstanding (pipelining).
    pub async fn send_with_receipt_future(
        &self,
        destination: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Receipt> {
        self.request(send_frame(destination, headers, body.into()))
            .await
    }

    // ----- subscribing -------------------------------------------------------------------

    /// Subscribes and waits for the broker's RECEIPT, so messages sent after this returns are
    /// seen by the subscription. An `id` in `headers` is used as the subscription id; otherwise
    /// one is generated. Other headers (`selector`, `activemq.subscriptionName`,
    /// `activemq.prefetchSize`, ...) pass through.
    pub async fn subscribe(
        &self,
        destination: &str,
        ack: AckMode,
        headers: &[(&str, &str)],
    ) -> Result<Subscription> {
        let id = match headers.iter().find(|(k, _)| *k == "id") {
            Some((_, v)) => v.to_string(),
            None => format!("sub-{}", self.next_id()),
        };
        let mut frame = Frame::new(Command::Subscribe)
            .with_header("destination", destination)
            .with_header("id", id.as_str())
            .with_header("ack", ack.as_str());
        for (k, v) in headers.iter().filter(|(k, _)| *k != "id") {
            frame = frame.with_header(*k, *v);
        }
        let (tx, rx) = mpsc::channel(self.inner.subscription_buffer_messages_max);
        self.inner.shared.register_subscription(&id, tx)?;
        let subscribed = match self.request(frame).await {
            Ok(receipt) => receipt.await,
            Err(e) => Err(e),
        };
        if let Err(e) = subscribed {
            self.inner.shared.remove_subscription(&id);
            return Err(e);
        }
        Ok(Subscription {
            id,
            destination: destination.to_string(),
            rx,
            tracker: None,
        })
    }

    /// UNSUBSCRIBE (receipted). For a durable subscription pass
    /// `("activemq.subscriptionName", name)` in `headers` to remove it from the broker.
    pub async fn unsubscribe(&self, sub: Subscription, headers: &[(&str, &str)]) -> Result<()> {
        let id = sub.id.clone();
        drop(sub);
        self.unsubscribe_id(&id, headers).await
    }

    /// UNSUBSCRIBE by id, e.g. to remove a durable subscription this connection never opened.
    pub async fn unsubscribe_id(&self, id: &str, headers: &[(&str, &str)]) -> Result<()> {
        let mut frame = Frame::new(Command::Unsubscribe).with_header("id", id);
        for (k, v) in headers.iter().filter(|(k, _)| *k != "id") {
            frame = frame.with_header(*k, *v);
        }
        self.inner.shared.remove_subscription(id);
        self.request(frame).await?.await
    }

    // ----- acknowledging -----------------------------------------------------------------

    /// ACK without a receipt.
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        self.ack_with(msg, None, false).await
    }

    /// ACK and wait for the RECEIPT (on Haven: the ack is durable).
    pub async fn ack_receipted(&self, msg: &Message) -> Result<()> {
        self.ack_with(msg, None, true).await
    }

    /// ACK, optionally inside `transaction`, optionally waiting for a RECEIPT.
    pub async fn ack_with(
        &self,
        msg: &Message,
        transaction: Option<&str>,
        receipted: bool,
    ) -> Result<()> {
        self.acknowledge(Command::Ack, msg, transaction, receipted)
            .await
    }

    /// NACK without a receipt (STOMP 1.1+): the broker redelivers with `redelivered:true`.
    pub async fn nack(&self, msg: &Message) -> Result<()> {
        self.nack_with(msg, None, false).await
    }

    pub async fn nack_receipted(&self, msg: &Message) -> Result<()> {
        self.nack_with(msg, None, true).await
    }

    pub async fn nack_with(
        &self,
        msg: &Message,
        transaction: Option<&str>,
        receipted: bool,
    ) -> Result<()> {
        self.acknowledge(Command::Nack, msg, transaction, receipted)
            .await
    }

    async fn acknowledge(
        &self,
        command: Command,
        msg: &Message,
        transaction: Option<&str>,
        receipted: bool,
    ) -> Result<()> {
        let frame = ack_frame(command, self.inner.version, msg, transaction);
        if receipted {
            self.request(frame).await?.await
        } else {
            self.enqueue(&frame).await
        }
    }

    // ----- transactions ------------------------------------------------------------------

    /// BEGIN `transaction` (receipted). SENDs join it with a `("transaction", tx)` header;
    /// acks with [`Connection::ack_with`].
    pub async fn begin(&self, transaction: &str) -> Result<()> {
        self.tx_frame(Command::Begin, transaction).await
    }

    /// COMMIT (receipted: on Haven the whole transaction is durable when this returns).
    pub async fn commit(&self, transaction: &str) -> Result<()> {
        self.tx_frame(Command::Commit, transaction).await
    }

    pub async fn abort(&self, transaction: &str) -> Result<()> {
        self.tx_frame(Command::Abort, transaction).await
    }

    async fn tx_frame(&self, command: Command, transaction: &str) -> Result<()> {
        let frame = Frame::new(command).with_header("transaction", transaction);
        self.request(frame).await?.await
    }

    // ----- closing -----------------------------------------------------------------------

    /// Receipted DISCONNECT (so everything sent before is processed), then closes the socket.
    /// Every clone of this connection is closed afterwards.
    pub async fn disconnect(&self) -> Result<()> {
        let result = match self.request(Frame::new(Command::Disconnect)).await {
            Ok(receipt) => {
                let ms = self.inner.disconnect_timeout_ms;
                match tokio::time::timeout(Duration::from_millis(ms), receipt).await {
                    Ok(r) => r,
                    Err(_) => Err(ClientError::Timeout {
                        what: "DISCONNECT receipt",
                        ms,
                    }),
                }
            }
            Err(e) => Err(e),
        };
        self.inner.shared.close(ClientError::Closed);
        // Everything queued before DISCONNECT was written (the broker receipted it): stop both
        // tasks now so the socket closes even while clones of this handle are alive.
        self.inner.writer.abort();
        self.inner.reader.abort();
        result
    }

    // ----- batches -------------------------------------------------------------------------

    /// An empty batch in this connection's negotiated version: frames encoded from borrowed
    /// parts into one buffer and queued as one write by
    /// [`Connection::send_batch_with_receipt`]. For a
    /// caller that sends many frames at once (a network bridge forwarding what arrived
    /// together): no `Frame` is built per message, and the writer is handed one buffer.
    /// `capacity_bytes` is the caller's estimate of the encoded size (the buffer grows past
    /// it if needed; a good estimate saves copying it as it grows).
    pub fn frame_batch(&self, capacity_bytes: usize) -> FrameBatch {
        let mut codec = StompCodec::new(Limits::default());
        codec.set_version(self.inner.version);
        FrameBatch {
            codec,
            buf: BytesMut::with_capacity(capacity_bytes),
            frames: 0,
        }
    }

    /// Adds one last frame to `batch` carrying a fresh `receipt` header, queues the batch as
    /// one write, and returns that RECEIPT: a broker that answers in order (as STOMP brokers
    /// do) confirms the whole batch with it.
    pub async fn send_batch_with_receipt<'a, I>(
        &self,
        mut batch: FrameBatch,
        command: Command,
        headers: I,
        body: &[u8],
    ) -> Result<Receipt>
    where
        I: Iterator<Item = (&'a str, &'a str)> + Clone,
    {
        let id = format!("rcpt-{}", self.next_id());
        batch.push_with_receipt(command, headers, &id, body)?;
        let rx = self.inner.shared.register_receipt(&id)?;
        if let Err(e) = self.push(batch.buf.freeze()).await {
            self.inner.shared.cancel_receipt(&id);
            return Err(e);
        }
        Ok(Receipt { id, rx })
    }

    // ----- escape hatches for tests --------------------------------------------------------

    /// Sends `frame` exactly as given (no receipt bookkeeping): for tests that need odd frames.
    pub async fn raw_send_frame(&self, frame: Frame) -> Result<()> {
        self.enqueue(&frame).await
    }

    /// Writes `bytes` to the socket unchanged: for tests of malformed input.
    pub async fn raw_send_bytes(&self, bytes: impl Into<Bytes>) -> Result<()> {
        self.push(bytes.into()).await
    }

    // ----- internals ---------------------------------------------------------------------

    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues `frame` with a `receipt` header of the connection's choosing and returns the
    /// pending [`Receipt`]: any frame can be receipted this way (a caller that builds its own
    /// SEND frames, such as a network bridge, avoids building them twice).
    pub async fn send_frame_with_receipt(&self, frame: Frame) -> Result<Receipt> {
        self.request(frame).await
    }

    /// Adds a fresh `receipt` header, registers the waiter, queues the frame.
    pub(crate) async fn request(&self, frame: Frame) -> Result<Receipt> {
        let id = format!("rcpt-{}", self.next_id());
        let frame = frame.with_header("receipt", id.as_str());
        let rx = self.inner.shared.register_receipt(&id)?;
        if let Err(e) = self.enqueue(&frame).await {
            self.inner.shared.cancel_receipt(&id);
            return Err(e);
        }
        Ok(Receipt { id, rx })
    }

    async fn enqueue(&self, frame: &Frame) -> Result<()> {
        let bytes = self.encode(frame)?;
        self.push(bytes).await
    }

    /// `frame` in this connection's negotiated version.
    pub(crate) fn encode(&self, frame: &Frame) -> Result<Bytes> {
        encode(frame, self.inner.version)
    }

    /// Queues already encoded bytes (from [`Connection::encode`]).
    pub(crate) async fn push(&self, bytes: Bytes) -> Result<()> {
        if let Some(reason) = self.inner.shared.close_reason() {
            return Err(reason);
        }
        self.inner.outgoing.send(bytes).await.map_err(|_| {
            self.inner
                .shared
                .close_reason()
                .unwrap_or(ClientError::Closed)
        })
    }
}

/// Frames encoded for one connection and queued together (see [`Connection::frame_batch`]).
pub struct FrameBatch {
    codec: StompCodec,
    buf: BytesMut,
    frames: usize,
}

impl FrameBatch {
    /// Appends one frame. A frame that cannot be encoded (a `content-length` that disagrees
    /// with the body, a header the version cannot carry) is an error and leaves the batch as
    /// it was.
    pub fn push<'a, I>(&mut self, command: Command, headers: I, body: &[u8]) -> Result<()>
    where
        I: Iterator<Item = (&'a str, &'a str)> + Clone,
    {
        self.codec
            .encode_parts(command, headers, body, &mut self.buf)
            .map_err(|e| ClientError::Protocol(format!("cannot encode {command:?} frame: {e}")))?;
        self.frames += 1;
        Ok(())
    }

    fn push_with_receipt<'a, 'b, I>(
        &mut self,
        command: Command,
        headers: I,
        receipt: &'b str,
        body: &[u8],
    ) -> Result<()>
    where
        'a: 'b,
        I: Iterator<Item = (&'a str, &'a str)> + Clone,
    {
        let headers = headers.map(|(k, v)| -> (&'b str, &'b str) { (k, v) });
        self.push(
            command,
            headers.chain(std::iter::once(("receipt", receipt))),
            body,
        )
    }

    /// Frames in the batch.
    pub fn len(&self) -> usize {
        self.frames
    }

    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    /// Bytes encoded so far.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }
}

fn encode(frame: &Frame, version: Version) -> Result<Bytes> {
    let mut codec = StompCodec::new(Limits::default());
    codec.set_version(version);
    let mut buf = BytesMut::new();
    codec.encode(frame, &mut buf).map_err(|e| {
        ClientError::Protocol(format!("cannot encode {:?} frame: {e}", frame.command))
    })?;
    Ok(buf.freeze())
}

pub(crate) fn send_frame(destination: &str, headers: &[(&str, &str)], body: Bytes) -> Frame {
    let mut frame = Frame::new(Command::Send).with_header("destination", destination);
    for (k, v) in headers {
        frame = frame.with_header(*k, *v);
    }
    frame.with_body(body)
}

/// ACK/NACK headers per version: 1.2 names the message by its `ack` header in `id`; 1.1 by
/// `message-id` plus `subscription`; 1.0 by `message-id` alone.
pub(crate) fn ack_frame(
    command: Command,
    version: Version,
    msg: &Message,
    transaction: Option<&str>,
) -> Frame {
    let mut frame = Frame::new(command);
    frame = match version {
        Version::V1_2 => frame.with_header("id", msg.ack_id()),
        Version::V1_1 => frame
            .with_header("message-id", msg.message_id.as_str())
            .with_header("subscription", msg.subscription.as_str()),
        Version::V1_0 => frame.with_header("message-id", msg.message_id.as_str()),
    };
    if let Some(tx) = transaction {
        frame = frame.with_header("transaction", tx);
    }
    frame
}

/// `(send_every_ms, expect_every_ms)` from what we offered and what the broker answered;
/// 0 means off. STOMP 1.0 has no heart-beats.
fn negotiate_heartbeat(offered: (u64, u64), version: Version, connected: &Frame) -> (u64, u64) {
    if matches!(version, Version::V1_0) {
        return (0, 0);
    }
    let (cx, cy) = offered;
    let (sx, sy) = connected
        .header("heart-beat")
        .and_then(|v| {
            let (a, b) = v.split_once(',')?;
            Some((a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?))
        })
        .unwrap_or((0, 0));
    let send = if cx > 0 && sy > 0 { cx.max(sy) } else { 0 };
    let recv = if cy > 0 && sx > 0 { cy.max(sx) } else { 0 };
    (send, recv)
}

/// What a successful handshake leaves: the socket, bytes read past CONNECTED, the frame.
struct Established {
    read: ReadHalf,
    write: WriteHalf,
    buffered: BytesMut,
    connected: Frame,
    version: Version,
}

async fn handshake(authority: &str, host: &str, opts: &ConnectOptions) -> Result<Established> {
    let (mut read, mut write) = opts.dialer.dial(authority).await?;

    let mut connect = Frame::new(Command::Connect)
        .with_header("accept-version", opts.accept_version.as_str())
        .with_header("host", opts.host.as_deref().unwrap_or(host));
    if let Some(login) = &opts.login {
        connect = connect.with_header("login", login.as_str());
    }
    if let Some(passcode) = &opts.passcode {
        connect = connect.with_header("passcode", passcode.as_str());
    }
    if let Some(client_id) = &opts.client_id {
        connect = connect.with_header("client-id", client_id.as_str());
    }
    let heart_beat = format!("{},{}", opts.heartbeat_ms.0, opts.heartbeat_ms.1);
    connect = connect.with_header("heart-beat", heart_beat.as_str());
    for (k, v) in &opts.headers {
        connect = connect.with_header(k.as_str(), v.as_str());
    }
    // CONNECT headers are never escaped (STOMP 1.2 spec), so version 1.0 encoding is exact.
    write.write_all(&encode(&connect, Version::V1_0)?).await?;

    let mut codec = StompCodec::new(Limits::default());
    let mut buf = BytesMut::with_capacity(4096);
    let frame = loop {
        match codec.decode(&mut buf) {
            Ok(Some(Item::Frame(frame))) => break frame,
            Ok(Some(Item::Heartbeat)) => continue,
            Ok(None) => {}
            Err(e) => {
                return Err(ClientError::Protocol(format!(
                    "undecodable answer to CONNECT: {e}"
                )))
            }
        }
        if read.read_buf(&mut buf).await? == 0 {
            return Err(ClientError::Protocol(
                "broker closed the connection before CONNECTED".into(),
            ));
        }
    };
    match frame.command {
        Command::Connected => {
            let version = match frame.header("version") {
                None | Some("1.0") => Version::V1_0,
                Some("1.1") => Version::V1_1,
                Some("1.2") => Version::V1_2,
                Some(other) => {
                    return Err(ClientError::Protocol(format!(
                        "broker chose unknown version {other:?}"
                    )))
                }
            };
            Ok(Established {
                read,
                write,
                buffered: buf,
                connected: frame,
                version,
            })
        }
        Command::Error => {
            let message = frame
                .header("message")
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&frame.body).into_owned());
            Err(ClientError::Refused { message })
        }
        other => Err(ClientError::Protocol(format!(
            "expected CONNECTED, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_negotiation_takes_the_larger_interval_and_needs_both_sides() {
        let connected = Frame::new(Command::Connected).with_header("heart-beat", "500,2000");
        assert_eq!(
            negotiate_heartbeat((1000, 1000), Version::V1_2, &connected),
            (2000, 1000)
        );
        assert_eq!(
            negotiate_heartbeat((0, 1000), Version::V1_2, &connected),
            (0, 1000)
        );
        assert_eq!(
            negotiate_heartbeat((1000, 0), Version::V1_2, &connected),
            (2000, 0)
        );
        assert_eq!(
            negotiate_heartbeat((1000, 1000), Version::V1_0, &connected),
            (0, 0)
        );
        let none = Frame::new(Command::Connected);
        assert_eq!(
            negotiate_heartbeat((1000, 1000), Version::V1_1, &none),
            (0, 0)
        );
    }

    fn msg() -> Message {
        Message::from_headers(
            haven_stomp::Headers::from_pairs(&[
                ("message-id", "m-7"),
                ("subscription", "s-1"),
                ("ack", "a-7"),
            ]),
            Bytes::new(),
        )
    }

    #[test]
    fn ack_frame_names_the_message_per_version() {
        let f = ack_frame(Command::Ack, Version::V1_2, &msg(), Some("tx1"));
        assert_eq!(f.header("id"), Some("a-7"));
        assert_eq!(f.header("transaction"), Some("tx1"));
        assert_eq!(f.header("message-id"), None);
        let f = ack_frame(Command::Nack, Version::V1_1, &msg(), None);
        assert_eq!(f.header("message-id"), Some("m-7"));
        assert_eq!(f.header("subscription"), Some("s-1"));
        assert_eq!(f.header("id"), None);
        let f = ack_frame(Command::Ack, Version::V1_0, &msg(), None);
        assert_eq!(f.header("message-id"), Some("m-7"));
        assert_eq!(f.header("subscription"), None);
    }

    #[test]
    fn a_batch_holds_its_frames_in_order_and_refuses_a_bad_one_whole() {
        let mut codec = StompCodec::new(Limits::default());
        codec.set_version(Version::V1_2);
        let mut batch = FrameBatch {
            codec,
            buf: BytesMut::new(),
            frames: 0,
        };
        let first = [("destination", "/queue/a"), ("x", "a:b")];
        batch
            .push(Command::Send, first.into_iter(), b"one")
            .unwrap();
        let before = batch.bytes();
        let bad = [("destination", "/queue/a"), ("content-length", "9")];
        assert!(batch.push(Command::Send, bad.into_iter(), b"two").is_err());
        assert_eq!(
            (batch.len(), batch.bytes()),
            (1, before),
            "a refused frame left bytes"
        );
        batch
            .push_with_receipt(
                Command::Send,
                [("destination", "/queue/b")].into_iter(),
                "r-1",
                b"",
            )
            .unwrap();
        assert_eq!(batch.len(), 2);

        let mut decoder = StompCodec::new(Limits::default());
        decoder.set_version(Version::V1_2);
        let mut buf = batch.buf.clone();
        let mut frames = Vec::new();
        while let Some(item) = decoder.decode(&mut buf).unwrap() {
            if let Item::Frame(f) = item {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].header("x"), Some("a:b"));
        assert_eq!(&frames[0].body[..], b"one");
        assert_eq!(frames[1].header("destination"), Some("/queue/b"));
        assert_eq!(frames[1].header("receipt"), Some("r-1"));
    }
}
