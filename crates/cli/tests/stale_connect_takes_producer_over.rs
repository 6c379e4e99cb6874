//! Found by the chaos soak: a failover client had SENDs refused with "producer ... was taken
//! over by a newer connection" after a black-holed link healed. A reconnect attempt sent
//! CONNECT (with the client's `haven-producer`) into the silent link and timed out; the next
//! attempt got through after the heal. The stale CONNECT then reached the broker after the
//! live one and, being the newer CONNECT, took the producer over, fencing the live session.
//!
//! Fixed by `haven-session` on CONNECT (the client's start time plus its connection number):
//! the broker refuses a CONNECT older than the producer's current owner. Before the fix this
//! test reproduced the refusal on each of 3 runs (2–5 refused SENDs over 5 black holes).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use haven_client::{Client, ClientError, ConnectOptions};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess, Fault, Proxy};

/// Black holes, each long enough for heart-beats to end the connection (about 1 s) and for at
/// least one reconnect attempt to time out inside it (`CONNECT_TIMEOUT_MS`).
const BLACK_HOLES: u64 = 5;
const BLACK_HOLE_MS: u64 = 4_000;
const CONNECT_TIMEOUT_MS: u64 = 2_000;
const HEARTBEAT_MS: u64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn black_holed_links_never_make_the_client_refuse_a_send() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("broker"),
        free_addr(),
    );
    opts.config_toml = Some(format!(
        "[stomp]\nheartbeat_send_ms = {HEARTBEAT_MS}\nheartbeat_receive_ms = {HEARTBEAT_MS}\n"
    ));
    let mut broker = BrokerProcess::start(opts).expect("broker starts");
    let proxy = Proxy::start(broker.addr()).expect("proxy starts");
    let uri = format!(
        "failover:(tcp://{})?initialReconnectDelay=10&maxReconnectDelay=200",
        proxy.addr()
    );
    let client = Client::connect(
        &uri,
        ConnectOptions {
            heartbeat_ms: (HEARTBEAT_MS, HEARTBEAT_MS),
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
            ..ConnectOptions::default()
        },
    )
    .await
    .expect("connects");
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut refused = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                match client.send_receipted("/queue/x", &[], n.to_string()).await {
                    Ok(()) => {}
                    Err(e @ ClientError::Server { .. }) => refused.push(e.to_string()),
                    Err(e) => panic!("send {n}: {e}"),
                }
            }
            refused
        })
    };
    for _ in 0..BLACK_HOLES {
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.set(Fault::BlackHole);
        tokio::time::sleep(Duration::from_millis(BLACK_HOLE_MS)).await;
        proxy.set(Fault::Pass);
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, Ordering::Relaxed);
    let refused = producer.await.expect("producer task");
    eprintln!("client: {:?}", client.stats());
    assert!(client.reconnects() > 0, "no black hole ended a connection");
    assert!(
        refused.is_empty(),
        "{} SENDs refused: {refused:?}",
        refused.len()
    );
    client.disconnect().await.expect("disconnect");
    broker.stop().expect("broker stops");
}
