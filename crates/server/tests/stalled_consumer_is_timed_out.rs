//! A consumer that stops reading its socket (paused process, wedged client) must not hold its
//! messages for ever: the stalled write times out, the connection closes and the messages go
//! to another consumer.

use haven_client::{AckMode, ConnectOptions, Connection};
use haven_server::{Config, Server};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread")]
async fn messages_held_by_a_consumer_that_stopped_reading_are_redelivered() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config::default();
    c.stomp.listen = "127.0.0.1:0".parse().unwrap();
    c.journal.dir = dir.path().to_path_buf();
    c.stomp.write_timeout_ms = 300;
    let server = Server::start(c).await.unwrap();
    let addr = server.local_addr();

    // The stalled consumer: subscribes, then never reads another byte.
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(b"CONNECT\naccept-version:1.2\nhost:h\n\n\0")
        .await
        .unwrap();
    stalled
        .write_all(b"SUBSCRIBE\nid:s\ndestination:/queue/big\nack:client-individual\nactivemq.prefetchSize:1000\n\n\0")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Enough data to fill every socket buffer between the broker and the stalled client.
    let producer = Connection::connect(&addr.to_string(), ConnectOptions::default())
        .await
        .unwrap();
    let body = vec![b'x'; 256 * 1024];
    let count = 80;
    for i in 0..count {
        producer
            .send_receipted("/queue/big", &[("n", &i.to_string())], body.clone())
            .await
            .unwrap();
    }

    // A healthy consumer gets every message once the stalled one is cut off.
    let healthy = Connection::connect(&addr.to_string(), ConnectOptions::default())
        .await
        .unwrap();
    let mut sub = healthy
        .subscribe("/queue/big", AckMode::ClientIndividual, &[])
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < count {
        let m = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .expect("messages held by the stalled consumer are redelivered in time")
            .expect("connection open");
        seen.insert(m.header("n").unwrap().to_string());
        healthy.ack(&m).await.unwrap();
    }
    drop(stalled);
    healthy.disconnect().await.unwrap();
    producer.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}
