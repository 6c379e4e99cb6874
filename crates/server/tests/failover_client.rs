//! The failover `Client` against the real broker (in process): request/reply over temporary
//! queues, and a durable subscription that reattaches after the broker restarts.

mod common;

use std::time::Duration;

use common::{Broker, WAIT};
use haven_client::{AckMode, Client, ConnectOptions, ConnectionEvent};

/// A broker on a fixed free port, so a restart comes back at the same address.
async fn broker_on_fixed_port() -> Broker {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    Broker::start_with(|c| c.stomp.listen = ([127, 0, 0, 1], port).into()).await
}

fn failover(broker: &Broker) -> String {
    format!(
        "failover:(tcp://{})?initialReconnectDelay=5&maxReconnectDelay=50",
        broker.addr()
    )
}

async fn next(sub: &mut haven_client::Subscription) -> haven_client::Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a message in time")
        .expect("subscription open")
}

#[tokio::test(flavor = "multi_thread")]
async fn request_reply_over_a_temporary_queue() {
    let broker = broker_on_fixed_port().await;
    let requester = Client::connect(&failover(&broker), ConnectOptions::default())
        .await
        .unwrap();
    let responder = Client::connect(&failover(&broker), ConnectOptions::default())
        .await
        .unwrap();
    let mut replies = requester
        .subscribe("/temp-queue/replies", AckMode::Auto, &[])
        .await
        .unwrap();
    let mut requests = responder
        .subscribe("/queue/requests", AckMode::ClientIndividual, &[])
        .await
        .unwrap();
    requester
        .send_receipted(
            "/queue/requests",
            &[
                ("reply-to", "/temp-queue/replies"),
                ("correlation-id", "c-1"),
            ],
            "2+2",
        )
        .await
        .unwrap();
    let request = next(&mut requests).await;
    let reply_to = request.header("reply-to").expect("reply-to").to_string();
    assert!(reply_to.starts_with("/remote-temp-queue/"), "{reply_to}");
    responder
        .send_receipted(&reply_to, &[("correlation-id", "c-1")], "4")
        .await
        .unwrap();
    responder.ack(&request).await.unwrap();
    let reply = next(&mut replies).await;
    assert_eq!(&reply.body[..], b"4");
    assert_eq!(reply.header("correlation-id"), Some("c-1"));
    requester.disconnect().await.unwrap();
    responder.disconnect().await.unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_durable_subscription_reattaches_after_the_broker_restarts() {
    let mut broker = broker_on_fixed_port().await;
    let opts = ConnectOptions {
        client_id: Some("durable-owner".into()),
        ..ConnectOptions::default()
    };
    let subscriber = Client::connect(&failover(&broker), opts).await.unwrap();
    let mut events = subscriber.events();
    let mut sub = subscriber
        .subscribe(
            "/topic/prices",
            AckMode::ClientIndividual,
            &[("activemq.subscriptionName", "prices-1")],
        )
        .await
        .unwrap();
    let publisher = Client::connect(&failover(&broker), ConnectOptions::default())
        .await
        .unwrap();
    publisher
        .send_receipted("/topic/prices", &[], "before")
        .await
        .unwrap();
    let before = next(&mut sub).await;
    subscriber.ack(&before).await.unwrap();

    broker.restart().await;
    // Published while the subscriber may still be reconnecting: the durable subscription
    // keeps it (it was recovered from the journal).
    publisher
        .send_receipted("/topic/prices", &[], "after")
        .await
        .unwrap();
    let after = next(&mut sub).await;
    assert_eq!(&after.body[..], b"after");
    subscriber.ack(&after).await.unwrap();
    let resumed = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(ConnectionEvent::Resumed { .. }) = events.recv().await {
                return;
            }
        }
    })
    .await;
    assert!(resumed.is_ok(), "no Resumed event");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), sub.next())
            .await
            .is_err(),
        "the acked 'before' must not come back"
    );
    subscriber.disconnect().await.unwrap();
    publisher.disconnect().await.unwrap();
    broker.stop().await;
}
