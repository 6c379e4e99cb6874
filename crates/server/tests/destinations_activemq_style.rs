//! ActiveMQ destination features over the wire: composite SEND, wildcard topic subscriptions,
//! virtual topics.

mod common;

use common::{connect_client as connect, next_body};

use haven_client::AckMode;
use haven_server::{Config, Server};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

async fn start() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config::default();
    c.stomp.listen = "127.0.0.1:0".parse().unwrap();
    c.journal.dir = dir.path().to_path_buf();
    (Server::start(c).await.unwrap(), dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn composite_send_reaches_each_destination_and_receipts_once() {
    let (server, _dir) = start().await;
    let c = connect(&server).await;
    let mut q = c.subscribe("/queue/a", AckMode::Auto, &[]).await.unwrap();
    let mut t = c.subscribe("/topic/b", AckMode::Auto, &[]).await.unwrap();
    c.send_receipted("/queue/a,/topic/b", &[("k", "v")], "both")
        .await
        .unwrap();
    assert_eq!(next_body(&mut q, WAIT).await, "both");
    assert_eq!(next_body(&mut t, WAIT).await, "both");
    // A bad part refuses the whole SEND.
    let bad = connect(&server).await;
    assert!(bad
        .send_receipted("/queue/a,/bogus/x", &[], "no")
        .await
        .is_err());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), q.next())
            .await
            .is_err(),
        "nothing from the refused SEND"
    );
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn wildcard_topic_subscription_and_virtual_topic_groups() {
    let (server, _dir) = start().await;
    let c = connect(&server).await;
    let mut all = c
        .subscribe("/topic/PRICE.>", AckMode::Auto, &[])
        .await
        .unwrap();
    let mut group = c
        .subscribe(
            "/queue/Consumer.billing.VirtualTopic.Orders",
            AckMode::Auto,
            &[],
        )
        .await
        .unwrap();
    c.send_receipted("/topic/PRICE.STOCK.ORCL", &[], "p1")
        .await
        .unwrap();
    c.send_receipted("/topic/VirtualTopic.Orders", &[], "o1")
        .await
        .unwrap();
    assert_eq!(next_body(&mut all, WAIT).await, "p1");
    assert_eq!(next_body(&mut group, WAIT).await, "o1");
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn selector_filters_and_a_bad_selector_says_where_it_failed() {
    let (server, _dir) = start().await;
    let c = connect(&server).await;
    let mut sub = c
        .subscribe(
            "/queue/sel",
            AckMode::Auto,
            &[("selector", "JMSPriority > 6 AND region LIKE 'eu-%'")],
        )
        .await
        .unwrap();
    c.send_receipted(
        "/queue/sel",
        &[("priority", "9"), ("region", "us-east")],
        "no",
    )
    .await
    .unwrap();
    c.send_receipted(
        "/queue/sel",
        &[("priority", "2"), ("region", "eu-west")],
        "no",
    )
    .await
    .unwrap();
    c.send_receipted(
        "/queue/sel",
        &[("priority", "9"), ("region", "eu-west")],
        "yes",
    )
    .await
    .unwrap();
    assert_eq!(next_body(&mut sub, WAIT).await, "yes");
    assert!(tokio::time::timeout(Duration::from_millis(200), sub.next())
        .await
        .is_err());
    // An invalid selector: ERROR naming the position, then the connection closes.
    let bad = connect(&server).await;
    let err = bad
        .subscribe(
            "/queue/sel",
            AckMode::Auto,
            &[("selector", "color = 'red' AND")],
        )
        .await
        .unwrap_err();
    let text = format!("{err:?}");
    assert!(text.contains("invalid selector at position"), "{text}");
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn browsing_a_queue_shows_its_messages_and_ends_with_browser_end() {
    let (server, _dir) = start().await;
    let c = connect(&server).await;
    for n in 0..3 {
        c.send_receipted("/queue/browse", &[], format!("m{n}"))
            .await
            .unwrap();
    }
    let mut b = c
        .subscribe("/queue/browse", AckMode::Auto, &[("browser", "true")])
        .await
        .unwrap();
    for n in 0..3 {
        assert_eq!(next_body(&mut b, WAIT).await, format!("m{n}"));
    }
    let end = tokio::time::timeout(WAIT, b.next()).await.unwrap().unwrap();
    assert_eq!(end.header("browser"), Some("end"));
    // Still there for a real consumer.
    let mut q = c
        .subscribe("/queue/browse", AckMode::Auto, &[])
        .await
        .unwrap();
    assert_eq!(next_body(&mut q, WAIT).await, "m0");
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}
