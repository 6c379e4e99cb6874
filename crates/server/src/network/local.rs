//! A bridge's connection to its own broker, in process: commands go straight to the core and
//! deliveries come back as the engine's shared messages, so a forwarded message is never
//! rendered as a MESSAGE frame, parsed again, or acknowledged through a socket.
//!
//! To the core it is one more connection: it has a connection id from the same counter as the
//! listener's, announces itself with `CoreMsg::Connect`, and hears `Outbound` effects on its own
//! channel, released in order and only once durable like any connection's. Frames it sends
//! (SUBSCRIBE, UNSUBSCRIBE, SEND) are translated by the same code as a socket's, so the broker
//! judges a bridge's frames exactly as it judges a client's.
//!
//! Task ownership: `connect` spawns a router task that owns the outbound channel and hands
//! each delivery to its subscription's feed and each RECEIPT to its waiter. The router ends
//! when the core closes the connection; dropping the last handle closes it on the core and
//! stops the router.

use crate::connection::{translate, Shared};
use crate::core::{CoreMsg, Outbound};
use haven_client::{AckMode, ClientError};
use haven_engine::hash::HashMap;
use haven_engine::{AckRef, Command, ConnId, Delivery};
use haven_stomp::{Command as Cmd, Frame, Version};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;

/// This broker, as a bridge's connection sees it. Cheap to clone; every clone is the same
/// connection.
#[derive(Clone)]
pub(crate) struct LocalConn {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnId,
    shared: Arc<Shared>,
    state: Arc<Mutex<State>>,
    /// The reason the connection ended, once it has.
    closed: watch::Receiver<Option<ClientError>>,
    /// Producer flow control: true while the core holds this connection's SENDs back.
    paused: watch::Receiver<bool>,
    next_id: AtomicU64,
    close_sent: AtomicBool,
    router: AbortHandle,
}

/// What the router shares with the handle.
#[derive(Default)]
struct State {
    /// Per subscription id: where its deliveries go.
    feeds: HashMap<String, mpsc::UnboundedSender<Delivery>>,
    /// Per receipt id: who waits for it.
    receipts: HashMap<String, oneshot::Sender<Result<(), ClientError>>>,
    /// Set once the connection ended: later calls fail with it.
    ended: Option<ClientError>,
}

/// One subscription's deliveries, in order.
pub(crate) struct Feed {
    rx: mpsc::UnboundedReceiver<Delivery>,
    conn: LocalConn,
}

impl Feed {
    /// The next delivery; None once the connection ended. An auto-acknowledged delivery is
    /// acknowledged (and its prefetch credit returned) as it is taken, so the feed never holds
    /// more than the subscription's prefetch.
    pub async fn next(&mut self) -> Option<Delivery> {
        let d = self.rx.recv().await?;
        if d.auto_ack {
            let credit = Command::Credit {
                conn: self.conn.inner.conn,
                sub_id: d.sub_id.clone(),
                up_to_tag: d.ack_tag,
            };
            if self.conn.core(credit).await.is_err() {
                return None;
            }
        }
        Some(d)
    }
}

/// A RECEIPT the broker owes this connection.
pub(crate) type Receipt = oneshot::Receiver<Result<(), ClientError>>;

impl LocalConn {
    /// Opens a connection on the broker `shared` belongs to.
    pub async fn connect(shared: Arc<Shared>) -> Result<LocalConn, ClientError> {
        let conn = shared.next_conn_id();
        let (tx, rx) = mpsc::unbounded_channel();
        let (reply_tx, reply_rx) = oneshot::channel();
        let connect = CoreMsg::Connect {
            conn,
            client_id: None,
            producer: None,
            session: 0,
            outbound: tx,
            reply: reply_tx,
        };
        shared
            .core
            .send(connect)
            .await
            .map_err(|_| ClientError::Closed)?;
        match reply_rx.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(ClientError::Refused {
                    message: e.to_string(),
                })
            }
            Err(_) => return Err(ClientError::Closed),
        }
        let state = Arc::new(Mutex::new(State::default()));
        let (closed_tx, closed) = watch::channel(None);
        let (paused_tx, paused) = watch::channel(false);
        let router = tokio::spawn(route(rx, state.clone(), closed_tx, paused_tx)).abort_handle();
        Ok(LocalConn {
            inner: Arc::new(Inner {
                conn,
                shared,
                state,
                closed,
                paused,
                next_id: AtomicU64::new(1),
                close_sent: AtomicBool::new(false),
                router,
            }),
        })
    }

    /// This broker's name.
    pub fn broker_name(&self) -> &str {
        &self.inner.shared.config.broker.name
    }

    /// This broker's store id (`haven-store`).
    pub fn store_id(&self) -> &str {
        &self.inner.shared.store_id
    }

    /// Subscribes with the frame's headers (plus `id`, `destination`, `ack` set here) and
    /// waits until the broker has applied it.
    pub async fn subscribe(
        &self,
        destination: &str,
        ack: AckMode,
        headers: &[(&str, &str)],
    ) -> Result<Feed, ClientError> {
        let id = match headers.iter().find(|(k, _)| *k == "id") {
            Some((_, id)) => id.to_string(),
            None => format!("sub-{}", self.next_id()),
        };
        let mut frame = Frame::new(Cmd::Subscribe)
            .with_header("id", id.as_str())
            .with_header("destination", destination)
            .with_header("ack", ack.as_str());
        for (k, v) in headers.iter().filter(|(k, _)| *k != "id") {
            frame.push_header(*k, *v);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.state()?.feeds.insert(id.clone(), tx);
        let receipt = self.send_frame_with_receipt(frame).await;
        let result = match receipt {
            Ok(r) => r.await.unwrap_or(Err(ClientError::Closed)),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            self.forget(&id);
            return Err(e);
        }
        Ok(Feed {
            rx,
            conn: self.clone(),
        })
    }

    /// Ends subscription `id` and waits until the broker has applied it: what it held and
    /// was not acknowledged is then the broker's to deliver elsewhere.
    pub async fn unsubscribe_id(&self, id: &str) -> Result<(), ClientError> {
        let frame = Frame::new(Cmd::Unsubscribe).with_header("id", id);
        let receipt = self.send_frame_with_receipt(frame).await?;
        let result = receipt.await.unwrap_or(Err(ClientError::Closed));
        self.forget(id);
        result
    }

    /// Acknowledges `d` and, for a `client` subscription, every earlier delivery of it.
    ///
    /// The ACK asks for a RECEIPT that nobody waits for: a RECEIPT makes the core hand the
    /// acknowledgement to the journal at once, where without one it waits for the next sync
    /// someone asks for (up to 100 ms on a busy broker, a maintenance interval on an idle
    /// one). A bridge acknowledges what the remote broker has stored, so a broker killed in
    /// that window would forward those messages again on restart, and the remote broker
    /// would have to recognise every one as a resend.
    pub async fn ack(&self, d: &Delivery) -> Result<(), ClientError> {
        self.core(Command::Ack {
            conn: self.inner.conn,
            ack: AckRef::Tag(d.ack_tag),
            transaction: None,
            receipt: Some(format!("local-ack-{}", self.next_id())),
        })
        .await
    }

    /// Sends `frame` (a SEND) without a receipt.
    pub async fn send_frame(&self, frame: Frame) -> Result<(), ClientError> {
        self.frame(frame).await
    }

    /// Sends `frame` with a receipt of this connection's choosing; the result resolves once the
    /// broker answered it (for a SEND: once the message, and everything this connection sent
    /// before it, is stored).
    pub async fn send_frame_with_receipt(&self, frame: Frame) -> Result<Receipt, ClientError> {
        let id = format!("local-{}", self.next_id());
        let (tx, rx) = oneshot::channel();
        self.state()?.receipts.insert(id.clone(), tx);
        if let Err(e) = self.frame(frame.with_header("receipt", id.as_str())).await {
            self.inner
                .state
                .lock()
                .expect("local connection state poisoned")
                .receipts
                .remove(&id);
            return Err(e);
        }
        Ok(rx)
    }

    /// Resolves with the reason once the connection has ended.
    pub async fn closed(&self) -> ClientError {
        let mut closed = self.inner.closed.clone();
        let reason = match closed.wait_for(|c| c.is_some()).await {
            Ok(reason) => reason.clone().expect("waited for Some"),
            Err(_) => ClientError::Closed,
        };
        reason
    }

    /// Closes the connection on the broker: what it held unacknowledged is redelivered.
    pub fn close_now(&self) {
        self.inner.close();
    }

    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>, ClientError> {
        let state = self
            .inner
            .state
            .lock()
            .expect("local connection state poisoned");
        match &state.ended {
            Some(reason) => Err(reason.clone()),
            None => Ok(state),
        }
    }

    fn forget(&self, sub_id: &str) {
        self.inner
            .state
            .lock()
            .expect("local connection state poisoned")
            .feeds
            .remove(sub_id);
    }

    /// Translates `frame` as the listener would and hands it to the core. A SEND waits while
    /// the core holds this connection's SENDs back (producer flow control); nothing else does,
    /// so acknowledgements keep draining the broker meanwhile.
    async fn frame(&self, frame: Frame) -> Result<(), ClientError> {
        if frame.command == Cmd::Send {
            let mut paused = self.inner.paused.clone();
            let mut closed = self.inner.closed.clone();
            tokio::select! {
                r = paused.wait_for(|p| !*p) => { r.map_err(|_| ClientError::Closed)?; }
                _ = closed.wait_for(|c| c.is_some()) => {}
            }
        }
        let command = translate(self.inner.conn, &frame, Version::V1_2, &self.inner.shared)
            .map_err(|refusal| {
                ClientError::Protocol(format!(
                    "this broker refused a bridge's {} frame: {}",
                    frame.command.as_str(),
                    refusal.message()
                ))
            })?;
        self.core(command).await
    }

    async fn core(&self, command: Command) -> Result<(), ClientError> {
        drop(self.state()?);
        self.inner
            .shared
            .core
            .send(CoreMsg::Command(command))
            .await
            .map_err(|_| ClientError::Closed)
    }
}

impl Inner {
    fn close(&self) {
        if self.close_sent.swap(true, Ordering::Relaxed) {
            return;
        }
        let core = self.shared.core.clone();
        let close = CoreMsg::Command(Command::Close {
            conn: self.conn,
            receipt: None,
        });
        // Idempotent on the core. Sent at once when the core's queue has room: a bridge's
        // connection is dropped on the bridges' thread, whose runtime may be shutting down and
        // would drop a task spawned on it. A closed queue means the broker is gone.
        match core.try_send(close) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(close)) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _ = core.send(close).await;
                    });
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
        self.router.abort();
    }
}

/// Hands the core's effects to their feeds and waiters until the connection ends.
async fn route(
    mut rx: mpsc::UnboundedReceiver<Outbound>,
    state: Arc<Mutex<State>>,
    closed: watch::Sender<Option<ClientError>>,
    paused: watch::Sender<bool>,
) {
    let reason = loop {
        let Some(ob) = rx.recv().await else {
            break ClientError::Closed;
        };
        match ob {
            Outbound::Deliver(d) => {
                let state = state.lock().expect("local connection state poisoned");
                // A feed whose subscriber is gone leaves the delivery unacknowledged; the
                // broker delivers it again once the subscription or connection ends.
                if let Some(feed) = state.feeds.get(&d.sub_id) {
                    let _ = feed.send(d);
                }
            }
            Outbound::Receipt(id) => {
                let waiter = state
                    .lock()
                    .expect("local connection state poisoned")
                    .receipts
                    .remove(&id);
                if let Some(w) = waiter {
                    let _ = w.send(Ok(()));
                }
            }
            Outbound::Error { message, receipt } => {
                break ClientError::Server {
                    body: message.clone(),
                    message,
                    receipt_id: receipt,
                }
            }
            Outbound::Close => break ClientError::Closed,
            Outbound::Pause => {
                let _ = paused.send(true);
            }
            Outbound::Resume => {
                let _ = paused.send(false);
            }
        }
    };
    let mut state = state.lock().expect("local connection state poisoned");
    state.ended = Some(reason.clone());
    for (_, waiter) in state.receipts.drain() {
        let _ = waiter.send(Err(reason.clone()));
    }
    // Dropping the senders ends every feed.
    state.feeds.clear();
    drop(state);
    let _ = closed.send(Some(reason));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Server};
    use bytes::Bytes;
    use std::time::Duration;

    /// Longest any step waits: a test that does not get what it expects fails, never hangs.
    const WAIT: Duration = Duration::from_secs(5);

    async fn broker() -> (Server, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::default();
        config.stomp.listen = "127.0.0.1:0".parse().expect("addr");
        config.journal.dir = dir.path().to_path_buf();
        let server = Server::start(config).await.expect("broker starts");
        (server, dir)
    }

    async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(WAIT, f)
            .await
            .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"))
    }

    fn send(destination: &str, body: &'static str) -> Frame {
        Frame::new(Cmd::Send)
            .with_header("destination", destination)
            .with_header("persistent", "true")
            .with_body(Bytes::from_static(body.as_bytes()))
    }

    async fn stored(conn: &LocalConn, frame: Frame) {
        let receipt = conn.send_frame_with_receipt(frame).await.expect("sent");
        within("RECEIPT", receipt)
            .await
            .expect("receipt sender kept")
            .expect("stored");
    }

    async fn next(feed: &mut Feed) -> Delivery {
        within("delivery", feed.next()).await.expect("feed open")
    }

    async fn socket_client(server: &Server) -> haven_client::Connection {
        haven_client::Connection::connect(
            &server.local_addr().to_string(),
            haven_client::ConnectOptions::default(),
        )
        .await
        .expect("client connects")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stores_delivers_and_removes_what_it_acknowledges() {
        let (server, _dir) = broker().await;
        let local = LocalConn::connect(server.shared.clone()).await.unwrap();
        stored(&local, send("/queue/q", "one")).await;
        stored(&local, send("/queue/q", "two")).await;
        let mut feed = local
            .subscribe("/queue/q", AckMode::Client, &[("id", "s")])
            .await
            .unwrap();
        let first = next(&mut feed).await;
        let second = next(&mut feed).await;
        assert_eq!(
            (&first.message.body[..], &second.message.body[..]),
            (&b"one"[..], &b"two"[..])
        );
        assert!(!first.auto_ack && first.message.persistent);
        // Cumulative: acknowledging the second removes both.
        local.ack(&second).await.unwrap();
        local.unsubscribe_id("s").await.unwrap();
        stored(&local, send("/queue/q", "three")).await;
        let client = socket_client(&server).await;
        let mut sub = client
            .subscribe("/queue/q", haven_client::AckMode::Auto, &[])
            .await
            .unwrap();
        let m = within("MESSAGE", sub.next()).await.expect("open");
        assert_eq!(&m.body[..], b"three", "acknowledged messages are gone");
        local.close_now();
        server.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_it_did_not_acknowledge_is_redelivered_once_it_closes() {
        let (server, _dir) = broker().await;
        let local = LocalConn::connect(server.shared.clone()).await.unwrap();
        stored(&local, send("/queue/q", "held")).await;
        let mut feed = local
            .subscribe("/queue/q", AckMode::Client, &[("id", "s")])
            .await
            .unwrap();
        assert_eq!(&next(&mut feed).await.message.body[..], b"held");
        let client = socket_client(&server).await;
        let mut sub = client
            .subscribe("/queue/q", haven_client::AckMode::Auto, &[])
            .await
            .unwrap();
        local.close_now();
        let m = within("redelivery", sub.next()).await.expect("open");
        assert_eq!(&m.body[..], b"held");
        assert_eq!(m.header("redelivered"), Some("true"));
        assert!(
            within("the feed to end", feed.next()).await.is_none(),
            "a closed connection's feeds end"
        );
        server.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn auto_acknowledged_feeds_return_credit_as_deliveries_are_taken() {
        let (server, _dir) = broker().await;
        let local = LocalConn::connect(server.shared.clone()).await.unwrap();
        // A window of 2: the third message comes only if credit returned for the first two.
        let mut feed = local
            .subscribe(
                "/queue/auto",
                AckMode::Auto,
                &[("id", "a"), ("activemq.prefetchSize", "2")],
            )
            .await
            .unwrap();
        for body in ["1", "2", "3", "4", "5"] {
            stored(&local, send("/queue/auto", body)).await;
        }
        for body in ["1", "2", "3", "4", "5"] {
            let d = next(&mut feed).await;
            assert!(d.auto_ack);
            assert_eq!(&d.message.body[..], body.as_bytes());
        }
        local.close_now();
        server.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refusals_are_errors_and_a_broker_error_ends_it() {
        let (server, _dir) = broker().await;
        let local = LocalConn::connect(server.shared.clone()).await.unwrap();
        // Judged by the listener's own rules, before reaching the core.
        let bad = send("/nowhere/q", "x");
        match local.send_frame(bad).await {
            Err(ClientError::Protocol(message)) => {
                assert!(message.contains("SEND"), "{message}")
            }
            other => panic!("a bad destination must be refused, got {other:?}"),
        }
        // The engine refuses an acknowledgement of nothing: an ERROR, and the connection ends.
        let bogus = Delivery {
            sub_id: "none".into(),
            ack_tag: 999,
            message: Arc::new(haven_engine::Message {
                seq: 1,
                id: "ID:none".into(),
                destination: haven_engine::Destination::Queue("q".into()),
                headers: Default::default(),
                body: Bytes::new(),
                persistent: true,
                priority: 4,
                expires_ms: 0,
                timestamp_ms: 0,
                dead_lettered: false,
            }),
            redelivered: false,
            delivery_count: 1,
            auto_ack: false,
        };
        local.ack(&bogus).await.unwrap();
        match within("the connection to end", local.closed()).await {
            ClientError::Server { message, .. } => {
                assert!(message.contains("999"), "{message}")
            }
            other => panic!("expected the broker's error, got {other:?}"),
        }
        assert!(
            local.send_frame(send("/queue/q", "late")).await.is_err(),
            "an ended connection refuses further frames"
        );
        server.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ends_when_the_broker_stops() {
        let (server, _dir) = broker().await;
        let local = LocalConn::connect(server.shared.clone()).await.unwrap();
        let mut feed = local
            .subscribe("/queue/q", AckMode::Client, &[("id", "s")])
            .await
            .unwrap();
        server.shutdown().await.unwrap();
        assert!(matches!(
            within("the connection to end", local.closed()).await,
            ClientError::Closed
        ));
        assert!(within("the feed to end", feed.next()).await.is_none());
    }
}
