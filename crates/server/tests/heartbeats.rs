//! Heart-beats both ways: the broker beats while idle, drops a client that goes silent, and
//! keeps one that beats.

mod common;

use common::{frame, Broker, Client, Read, WAIT};
use haven_stomp::Command;
use std::time::Duration;
use tokio::time::Instant;

const BEAT_MS: u64 = 100;

async fn broker() -> Broker {
    Broker::start_with(|c| {
        c.stomp.heartbeat_send_ms = BEAT_MS;
        c.stomp.heartbeat_receive_ms = BEAT_MS;
    })
    .await
}

async fn connect(broker: &Broker, heart_beat: &str) -> Client {
    let mut c = Client::open(broker.addr()).await;
    let reply = c
        .handshake(
            Command::Connect,
            &[("accept-version", "1.2"), ("heart-beat", heart_beat)],
        )
        .await;
    assert_eq!(reply.command, Command::Connected, "{reply:?}");
    assert_eq!(reply.header("heart-beat"), Some("100,100"), "{reply:?}");
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn the_broker_sends_heart_beats_while_idle() {
    let broker = broker().await;
    // The client asks for beats but promises none, so the broker expects nothing from it.
    let mut c = connect(&broker, "0,100").await;
    let mut beats = 0;
    while beats < 3 {
        match c.read().await {
            Read::Heartbeat => beats += 1,
            other => panic!("expected only heart-beats on an idle connection, got {other:?}"),
        }
    }
    // Still a working connection.
    c.put("/queue/hb", "after beats", &[]).await;
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_client_is_disconnected() {
    let broker = broker().await;
    // Promises a beat every 100 ms, then sends nothing.
    let mut c = connect(&broker, "100,0").await;
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.read_within(left).await {
            None => panic!("a silent client was still connected after {WAIT:?}"),
            Some(Read::Closed(_)) => break,
            Some(Read::Heartbeat) => panic!("the client asked for no heart-beats"),
            Some(Read::Frame(f)) => {
                assert_eq!(f.command, Command::Error, "{f:?}");
                let message = f.header("message").unwrap_or_default();
                assert!(message.contains("heart-beat"), "{message}");
            }
        }
    }
    // Other clients are unaffected.
    let mut other = broker.client().await;
    other.put("/queue/hb", "still serving", &[]).await;
    other.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_beats_stays_connected() {
    let broker = broker().await;
    let mut c = connect(&broker, "100,100").await;
    // Well past the broker's allowance for silence (2 × 100 ms), beating every 50 ms.
    let until = Instant::now() + Duration::from_millis(BEAT_MS * 10);
    let every = Duration::from_millis(BEAT_MS / 2);
    let mut next_beat = Instant::now() + every;
    let mut received = 0;
    while Instant::now() < until {
        if Instant::now() >= next_beat {
            c.write_raw(b"\n").await;
            next_beat += every;
        }
        let left = next_beat.saturating_duration_since(Instant::now());
        match c.read_within(left).await {
            None => {}
            Some(Read::Heartbeat) => received += 1,
            Some(other) => panic!("a beating client got {other:?}"),
        }
    }
    assert!(received > 0, "the broker sent no heart-beats");
    c.put("/queue/hb", "alive", &[]).await;
    c.subscribe("1", "/queue/hb", &[]).await;
    assert_eq!(c.message_body().await, "alive");
    c.send(&frame(Command::Disconnect, &[("receipt", "bye")], ""))
        .await;
    // Heart-beats may still arrive before the receipt.
    loop {
        match c.read().await {
            Read::Heartbeat => continue,
            Read::Frame(f) => {
                assert_eq!(f.command, Command::Receipt, "{f:?}");
                break;
            }
            Read::Closed(why) => panic!("closed before the receipt ({why:?})"),
        }
    }
    c.closed().await;
    broker.stop().await;
}
