//! A scripted fake STOMP server for the client's tests: the test body plays the broker's side
//! one frame at a time, so each test states exactly what the client must see and send.
#![allow(dead_code)]

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use haven_client::{Command, Frame};
use haven_stomp::{Item, Limits, StompCodec};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;

/// How long a scripted step waits for the client before the test fails.
pub const STEP_MS: u64 = 5_000;

pub struct FakeServer {
    listener: TcpListener,
    pub addr: String,
}

impl FakeServer {
    pub async fn bind() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake server");
        let addr = listener.local_addr().unwrap().to_string();
        FakeServer { listener, addr }
    }

    pub async fn accept(&self) -> Peer {
        let (stream, _) =
            tokio::time::timeout(Duration::from_millis(STEP_MS), self.listener.accept())
                .await
                .expect("client did not connect in time")
                .expect("accept");
        Peer {
            framed: Framed::new(stream, StompCodec::new(Limits::default())),
        }
    }
}

pub struct Peer {
    pub framed: Framed<TcpStream, StompCodec>,
}

impl Peer {
    /// Next item (frame or heart-beat), `None` at EOF. Fails the test after `STEP_MS`.
    pub async fn recv_item(&mut self) -> Option<Item> {
        tokio::time::timeout(Duration::from_millis(STEP_MS), self.framed.next())
            .await
            .expect("client sent nothing in time")
            .map(|r| r.expect("client sent an undecodable frame"))
    }

    /// Next frame, skipping heart-beats.
    pub async fn recv(&mut self) -> Frame {
        loop {
            match self.recv_item().await {
                Some(Item::Frame(f)) => return f,
                Some(Item::Heartbeat) => continue,
                None => panic!("client closed the connection while a frame was expected"),
            }
        }
    }

    /// Next frame, asserting its command.
    pub async fn expect(&mut self, command: Command) -> Frame {
        let f = self.recv().await;
        assert_eq!(f.command, command, "unexpected frame {f:?}");
        f
    }

    pub async fn send(&mut self, frame: Frame) {
        self.framed
            .send(Item::Frame(frame))
            .await
            .expect("fake server send");
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.framed
            .get_mut()
            .write_all(bytes)
            .await
            .expect("fake server raw send");
    }

    /// Reads CONNECT and answers CONNECTED with `version` and `heart_beat`.
    pub async fn handshake(&mut self, version: &str, heart_beat: &str) -> Frame {
        let connect = self.expect(Command::Connect).await;
        self.send(
            Frame::new(Command::Connected)
                .with_header("version", version)
                .with_header("heart-beat", heart_beat)
                .with_header("session", "fake-session-1")
                .with_header("server", "fake/0"),
        )
        .await;
        connect
    }

    /// Answers `frame`'s `receipt` header with a RECEIPT.
    pub async fn receipt(&mut self, frame: &Frame) {
        let id = frame
            .header("receipt")
            .expect("frame asked for no receipt")
            .to_string();
        self.send(Frame::new(Command::Receipt).with_header("receipt-id", id))
            .await;
    }

    /// Reads one frame of `command` and answers its receipt.
    pub async fn expect_receipted(&mut self, command: Command) -> Frame {
        let f = self.expect(command).await;
        self.receipt(&f).await;
        f
    }
}

pub fn message(sub: &str, id: &str, body: &str) -> Frame {
    Frame::new(Command::Message)
        .with_header("subscription", sub)
        .with_header("message-id", id)
        .with_header("destination", "/queue/test")
        .with_header("ack", format!("ack-{id}"))
        .with_body(body.to_string())
}
