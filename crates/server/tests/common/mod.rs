//! Test support for the broker's integration tests: an in-process broker on a free port with
//! its journal in a temporary directory, and a raw-TCP client that writes bytes and reads
//! frames with the broker's own codec, so a test sees exactly what a STOMP user would.
//!
//! Every wait is bounded by [`WAIT`]: a test that does not get what it expects fails with a
//! message saying what it was waiting for, rather than hanging. Nothing here sleeps to assert
//! timing.
#![allow(dead_code)] // each test file uses a different subset

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use haven_server::{Config, Server};
use haven_stomp::{Command, Frame, Item, Limits, StompCodec, Version};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{Encoder, FramedRead};

/// Longest a test waits for anything (a frame, EOF, a connection).
pub const WAIT: Duration = Duration::from_secs(5);

/// A broker for one test. Call [`Broker::stop`] at the end of the test.
pub struct Broker {
    server: Option<Server>,
    config: Config,
    dir: TempDir,
}

impl Broker {
    /// A broker with default settings on a free port and a fresh journal directory.
    pub async fn start() -> Broker {
        Broker::start_with(|_| {}).await
    }

    /// Like [`Broker::start`], after `edit` adjusts the configuration.
    pub async fn start_with(edit: impl FnOnce(&mut Config)) -> Broker {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::default();
        config.stomp.listen = "127.0.0.1:0".parse().expect("addr");
        config.journal.dir = dir.path().to_path_buf();
        edit(&mut config);
        let server = Server::start(config.clone()).await.expect("broker starts");
        Broker {
            server: Some(server),
            config,
            dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.as_ref().expect("running").local_addr()
    }

    /// The running broker's cluster settings (`set_cluster` announces changes to clients).
    pub fn cluster(&self) -> haven_server::ClusterHandle {
        self.server.as_ref().expect("running").cluster_handle()
    }

    /// Orderly stop, then start again on the same journal (on a new free port).
    pub async fn restart(&mut self) {
        let server = self.server.take().expect("running");
        shutdown(server).await;
        let server = Server::start(self.config.clone())
            .await
            .expect("broker restarts on its journal");
        self.server = Some(server);
    }

    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            shutdown(server).await;
        }
        drop(self.dir);
    }

    /// A client connected with STOMP 1.2.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr(), &[("accept-version", "1.2")]).await
    }
}

async fn shutdown(server: Server) {
    tokio::time::timeout(WAIT, server.shutdown())
        .await
        .unwrap_or_else(|_| panic!("broker did not shut down within {WAIT:?}"))
        .expect("orderly shutdown");
}

/// A `haven_client` connection to `server` with default options.
pub async fn connect_client(server: &Server) -> haven_client::Connection {
    haven_client::Connection::connect(
        &server.local_addr().to_string(),
        haven_client::ConnectOptions::default(),
    )
    .await
    .expect("client connects")
}

/// The body of the next message on `sub`, as text, waiting at most `wait`.
pub async fn next_body(sub: &mut haven_client::Subscription, wait: Duration) -> String {
    let m = tokio::time::timeout(wait, sub.next())
        .await
        .expect("a message in time")
        .expect("open");
    String::from_utf8(m.body.to_vec()).unwrap()
}

/// Builds a frame from header pairs.
pub fn frame(command: Command, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Frame {
    let mut f = Frame::new(command).with_body(body);
    for (k, v) in headers {
        f.push_header(*k, *v);
    }
    f
}

/// What one read from the broker gave.
#[derive(Debug)]
pub enum Read {
    Frame(Frame),
    Heartbeat,
    /// EOF, or the connection reset: either way the broker closed it.
    Closed(Option<std::io::ErrorKind>),
}

/// One raw TCP connection to the broker.
pub struct Client {
    reader: FramedRead<OwnedReadHalf, StompCodec>,
    writer: OwnedWriteHalf,
    encoder: StompCodec,
    /// MESSAGEs that arrived while waiting for a RECEIPT, handed out first by `frame`.
    pending: VecDeque<Frame>,
    pub version: Version,
}

impl Client {
    /// Opens TCP only; nothing is sent.
    pub async fn open(addr: SocketAddr) -> Client {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("TCP connect within the wait")
            .expect("TCP connect");
        stream.set_nodelay(true).expect("nodelay");
        let (rd, wr) = stream.into_split();
        let limits = Limits {
            frame_bytes_max: 64 * 1024 * 1024,
            ..Limits::default()
        };
        Client {
            reader: FramedRead::new(rd, StompCodec::new(limits)),
            writer: wr,
            encoder: StompCodec::new(limits),
            pending: VecDeque::new(),
            version: Version::V1_0,
        }
    }

    /// Opens TCP and sends CONNECT with `headers`; panics unless CONNECTED comes back.
    pub async fn connect(addr: SocketAddr, headers: &[(&str, &str)]) -> Client {
        let mut c = Client::open(addr).await;
        let reply = c.handshake(Command::Connect, headers).await;
        assert_eq!(
            reply.command,
            Command::Connected,
            "CONNECT {headers:?} refused: {reply:?}"
        );
        c
    }

    /// Sends CONNECT (or STOMP) and returns the broker's answer. On CONNECTED, switches both
    /// directions to the negotiated version's escaping, as a client must.
    pub async fn handshake(&mut self, command: Command, headers: &[(&str, &str)]) -> Frame {
        self.send(&frame(command, headers, Bytes::new())).await;
        let reply = self.frame().await;
        if reply.command == Command::Connected {
            let v = reply.header("version").unwrap_or("1.0");
            self.version = Version::parse(v).expect("CONNECTED names a known version");
            self.reader.decoder_mut().set_version(self.version);
            self.encoder.set_version(self.version);
        }
        reply
    }

    /// Writes bytes exactly as given.
    pub async fn write_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.expect("write to broker");
    }

    /// Writes bytes; a broker that already closed the connection is not an error here.
    pub async fn write_raw_lenient(&mut self, bytes: &[u8]) {
        let _ = self.writer.write_all(bytes).await;
    }

    /// Writes `bytes` while reading, as a client streaming a large frame does, until the
    /// broker closes the connection. Returns the first frame read (if any) and how the
    /// connection ended. The write may fail once the broker stops reading; that is expected.
    pub async fn write_and_read_until_closed(
        &mut self,
        bytes: &[u8],
    ) -> (Option<Frame>, Option<std::io::ErrorKind>) {
        let writer = &mut self.writer;
        let reader = &mut self.reader;
        let write = async move {
            let _ = tokio::time::timeout(WAIT, writer.write_all(bytes)).await;
        };
        let read = async move {
            let mut first = None;
            loop {
                let next = tokio::time::timeout(WAIT, reader.next())
                    .await
                    .unwrap_or_else(|_| panic!("connection still open after {WAIT:?}"));
                match next {
                    None => return (first, None),
                    Some(Ok(Item::Frame(f))) => {
                        first.get_or_insert(f);
                    }
                    Some(Ok(Item::Heartbeat)) => {}
                    Some(Err(haven_stomp::DecodeError::Io(e))) => return (first, Some(e.kind())),
                    Some(Err(e)) => panic!("broker sent bytes that do not decode: {e}"),
                }
            }
        };
        let ((), result) = tokio::join!(write, read);
        result
    }

    /// Closes the write direction (the broker reads EOF); reading still works.
    pub async fn half_close(&mut self) {
        self.writer.shutdown().await.expect("half-close");
    }

    /// Encodes `frame` under the negotiated version's rules and writes it.
    pub async fn send(&mut self, frame: &Frame) {
        let mut buf = BytesMut::new();
        self.encoder
            .encode(frame, &mut buf)
            .expect("encodable frame");
        self.write_raw(&buf).await;
    }

    /// Sends `frame` with a `receipt` header and waits for that RECEIPT (no other frame may
    /// come first).
    pub async fn send_receipted(&mut self, frame: Frame, receipt: &str) {
        let frame = frame.with_header("receipt", receipt);
        self.send(&frame).await;
        self.receipt(receipt).await;
    }

    /// Waits for a RECEIPT for `id`. MESSAGEs that come first (a SUBSCRIBE's dispatch is
    /// answered before its receipt) are kept for `frame`; any other frame is a failure.
    pub async fn receipt(&mut self, id: &str) {
        loop {
            let f = self.read_frame().await;
            if f.command == Command::Message {
                self.pending.push_back(f);
                continue;
            }
            assert_eq!(
                f.command,
                Command::Receipt,
                "waiting for RECEIPT {id}: {f:?}"
            );
            assert_eq!(f.header("receipt-id"), Some(id), "{f:?}");
            return;
        }
    }

    /// SEND with a receipt; returns once the broker has the message.
    pub async fn put(&mut self, destination: &str, body: &str, headers: &[(&str, &str)]) {
        let mut f = frame(
            Command::Send,
            &[("destination", destination)],
            body.to_owned(),
        );
        for (k, v) in headers {
            f.push_header(*k, *v);
        }
        let receipt = format!("put-{destination}-{body}");
        self.send_receipted(f, &receipt).await;
    }

    /// SUBSCRIBE with a receipt; returns once the subscription is in place.
    pub async fn subscribe(&mut self, id: &str, destination: &str, headers: &[(&str, &str)]) {
        let mut f = frame(
            Command::Subscribe,
            &[("id", id), ("destination", destination)],
            Bytes::new(),
        );
        for (k, v) in headers {
            f.push_header(*k, *v);
        }
        self.send_receipted(f, &format!("sub-{id}")).await;
    }

    /// The next thing the broker sends, waiting at most [`WAIT`].
    pub async fn read(&mut self) -> Read {
        self.read_within(WAIT)
            .await
            .unwrap_or_else(|| panic!("nothing from the broker within {WAIT:?}"))
    }

    /// The next thing the broker sends, or None if nothing arrives within `wait`.
    pub async fn read_within(&mut self, wait: Duration) -> Option<Read> {
        if let Some(f) = self.pending.pop_front() {
            return Some(Read::Frame(f));
        }
        self.read_socket_within(wait).await
    }

    /// Like `read_within`, ignoring frames kept aside by `receipt`.
    async fn read_socket_within(&mut self, wait: Duration) -> Option<Read> {
        let next = tokio::time::timeout(wait, self.reader.next()).await.ok()?;
        Some(match next {
            None => Read::Closed(None),
            Some(Ok(Item::Frame(f))) => Read::Frame(f),
            Some(Ok(Item::Heartbeat)) => Read::Heartbeat,
            Some(Err(haven_stomp::DecodeError::Io(e))) => Read::Closed(Some(e.kind())),
            Some(Err(e)) => panic!("broker sent bytes that do not decode: {e}"),
        })
    }

    /// The next frame, skipping heart-beats; panics on close or after [`WAIT`].
    pub async fn frame(&mut self) -> Frame {
        match self.pending.pop_front() {
            Some(f) => f,
            None => self.read_frame().await,
        }
    }

    async fn read_frame(&mut self) -> Frame {
        loop {
            let read = self.read_socket_within(WAIT).await;
            match read.unwrap_or_else(|| panic!("no frame from the broker within {WAIT:?}")) {
                Read::Frame(f) => return f,
                Read::Heartbeat => continue,
                Read::Closed(why) => {
                    panic!("connection closed while waiting for a frame ({why:?})")
                }
            }
        }
    }

    /// The next frame, which must be a MESSAGE.
    pub async fn message(&mut self) -> Frame {
        let f = self.frame().await;
        assert_eq!(f.command, Command::Message, "expected MESSAGE: {f:?}");
        f
    }

    /// The next MESSAGE's body as text.
    pub async fn message_body(&mut self) -> String {
        let f = self.message().await;
        String::from_utf8(f.body.to_vec()).expect("text body")
    }

    /// Waits for the broker to close the connection; panics if a frame arrives instead.
    pub async fn closed(&mut self) {
        loop {
            match self.read().await {
                Read::Closed(_) => return,
                Read::Heartbeat => continue,
                Read::Frame(f) => panic!("expected the connection to close, got {f:?}"),
            }
        }
    }

    /// Expects an ERROR whose `message` header contains `needle` (case-insensitive), then
    /// the connection closing. Returns the ERROR frame.
    pub async fn error_then_close(&mut self, needle: &str) -> Frame {
        let f = loop {
            match self.read().await {
                Read::Frame(f) => break f,
                Read::Heartbeat => continue,
                Read::Closed(why) => {
                    panic!("connection closed without an ERROR (wanted {needle:?}; {why:?})")
                }
            }
        };
        assert_eq!(f.command, Command::Error, "expected ERROR: {f:?}");
        let message = f.header("message").unwrap_or_default().to_lowercase();
        assert!(
            message.contains(&needle.to_lowercase()),
            "ERROR message {message:?} does not say {needle:?}"
        );
        self.closed().await;
        f
    }

    /// DISCONNECT with a receipt: RECEIPT, then the broker closes.
    pub async fn disconnect(mut self) {
        let f = frame(Command::Disconnect, &[("receipt", "bye")], Bytes::new());
        self.send(&f).await;
        self.receipt("bye").await;
        self.closed().await;
    }
}
