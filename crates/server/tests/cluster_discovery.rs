//! Cluster discovery pushed to clients (`[cluster]`): CONNECTED names the members while
//! `update_cluster_clients` is on; a client that sent `haven-cluster-updates: true` is pushed a
//! `haven.cluster` MESSAGE when the announcement changes; every other client sees nothing new.

mod common;

use common::{frame, Broker, Client, Read, WAIT};
use haven_client::{AckMode, ConnectOptions, Connection};
use haven_server::{ClusterChange, ClusterConfig, ClusterError, Config, Server, ServerError};
use haven_stomp::Command;
use std::time::Duration;

const A: &str = "tcp://127.0.0.1:61613";
const B: &str = "tcp://127.0.0.2:61613";
const C: &str = "tcp://127.0.0.3:61613";

fn cluster(members: &[&str], update: bool, rebalance: bool) -> ClusterConfig {
    ClusterConfig {
        members: members.iter().map(|m| m.to_string()).collect(),
        update_cluster_clients: update,
        rebalance_cluster_clients: rebalance,
    }
}

async fn start(settings: ClusterConfig) -> Broker {
    Broker::start_with(|c| c.cluster = settings).await
}

/// A haven-client connection, opted in to announcements or not.
async fn client(broker: &Broker, updates: bool) -> Connection {
    let mut opts = ConnectOptions::default();
    if updates {
        opts.headers
            .push(("haven-cluster-updates".into(), "true".into()));
    }
    Connection::connect(&broker.addr().to_string(), opts)
        .await
        .expect("client connects")
}

/// A raw STOMP 1.2 client that asked for announcements.
async fn raw_opted_in(broker: &Broker) -> Client {
    Client::connect(
        broker.addr(),
        &[("accept-version", "1.2"), ("haven-cluster-updates", "true")],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn connected_names_the_members_in_config_order_when_updates_are_on() {
    let broker = start(cluster(&[B, A], true, false)).await;
    let conn = client(&broker, false).await;
    assert_eq!(
        conn.connected_header("haven-cluster"),
        Some(&*format!("{B},{A}"))
    );
    conn.disconnect().await.unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connected_has_no_cluster_header_when_updates_are_off_or_no_members() {
    for settings in [cluster(&[A, B], false, false), cluster(&[], true, false)] {
        let broker = start(settings.clone()).await;
        let conn = client(&broker, true).await;
        assert_eq!(conn.connected_header("haven-cluster"), None, "{settings:?}");
        conn.disconnect().await.unwrap();
        broker.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_opted_in_client_is_pushed_each_new_announcement() {
    let broker = start(cluster(&[A], true, false)).await;
    let mut c = raw_opted_in(&broker).await;
    let handle = broker.cluster();

    let change = handle.set_cluster(cluster(&[A, B], true, true)).unwrap();
    assert_eq!(change, ClusterChange::Announced { n: 1 });
    let m = c.message().await;
    assert_eq!(m.header("subscription"), Some("haven.cluster"));
    assert_eq!(m.header("destination"), Some("/topic/haven.cluster"));
    assert_eq!(m.header("message-id"), Some("haven-cluster-1"));
    assert_eq!(m.header("haven-cluster"), Some(&*format!("{A},{B}")));
    assert_eq!(m.header("haven-rebalance"), Some("true"));
    assert_eq!(m.header("ack"), None, "an announcement is not acknowledged");
    assert!(m.body.is_empty(), "{m:?}");

    // Setting what is in force already announces nothing; the next change is numbered on.
    assert_eq!(
        handle.set_cluster(cluster(&[A, B], true, true)).unwrap(),
        ClusterChange::Unchanged
    );
    handle.set_cluster(cluster(&[C], true, false)).unwrap();
    let m = c.message().await;
    assert_eq!(m.header("message-id"), Some("haven-cluster-2"));
    assert_eq!(m.header("haven-cluster"), Some(C));
    assert_eq!(m.header("haven-rebalance"), Some("false"));

    // The connection carries on as usual, and a new one is told the new list at once.
    c.subscribe("1", "/queue/cluster-push", &[]).await;
    c.put("/queue/cluster-push", "after", &[]).await;
    assert_eq!(c.message_body().await, "after");
    let late = client(&broker, false).await;
    assert_eq!(late.connected_header("haven-cluster"), Some(C));
    late.disconnect().await.unwrap();
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn switching_updates_on_is_announced_to_clients_that_asked() {
    let broker = start(cluster(&[A], false, false)).await;
    let mut c = raw_opted_in(&broker).await;
    broker
        .cluster()
        .set_cluster(cluster(&[A, B], true, false))
        .unwrap();
    let m = c.message().await;
    assert_eq!(m.header("haven-cluster"), Some(&*format!("{A},{B}")));
    assert_eq!(m.header("haven-rebalance"), Some("false"));
    c.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_haven_client_that_opted_in_receives_the_announcement() {
    let broker = start(cluster(&[A], true, false)).await;
    let conn = client(&broker, true).await;
    // haven-client hands a MESSAGE to the subscription its `subscription` header names; until
    // it handles announcements itself, a subscription with that id is how this test sees it.
    let mut sub = conn
        .subscribe(
            "/topic/haven.cluster",
            AckMode::Auto,
            &[("id", "haven.cluster")],
        )
        .await
        .unwrap();
    broker
        .cluster()
        .set_cluster(cluster(&[B, C], true, true))
        .unwrap();
    let m = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("announcement in time")
        .expect("open");
    assert_eq!(m.message_id, "haven-cluster-1");
    assert_eq!(m.header("haven-cluster"), Some(&*format!("{B},{C}")));
    assert_eq!(m.header("haven-rebalance"), Some("true"));
    conn.disconnect().await.unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_did_not_opt_in_gets_nothing_and_keeps_working() {
    let broker = start(cluster(&[A], true, false)).await;
    let mut plain = broker.client().await;
    plain.subscribe("1", "/queue/cluster-plain", &[]).await;
    let mut asked = raw_opted_in(&broker).await;
    broker
        .cluster()
        .set_cluster(cluster(&[A, B], true, true))
        .unwrap();
    // Once the client that asked has it, the push is done; the other client's next frames are
    // its own (`receipt` and `message` fail on anything else, a MESSAGE included).
    assert_eq!(
        asked.message().await.header("message-id"),
        Some("haven-cluster-1")
    );
    plain.put("/queue/cluster-plain", "still here", &[]).await;
    assert_eq!(plain.message_body().await, "still here");
    match plain.read_within(Duration::from_millis(200)).await {
        None | Some(Read::Heartbeat) => {}
        Some(other) => panic!("a client that did not opt in was sent {other:?}"),
    }
    plain.disconnect().await;
    asked.disconnect().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_opt_in_value_gets_an_error() {
    let broker = start(cluster(&[A], true, false)).await;
    let mut c = Client::open(broker.addr()).await;
    c.send(&frame(
        Command::Connect,
        &[("accept-version", "1.2"), ("haven-cluster-updates", "yes")],
        "",
    ))
    .await;
    c.error_then_close("haven-cluster-updates").await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_settings_change_nothing() {
    let broker = start(cluster(&[A], true, false)).await;
    let handle = broker.cluster();
    let e = handle
        .set_cluster(cluster(&[A, "tcp://nowhere"], true, false))
        .unwrap_err();
    assert!(
        matches!(&e, ClusterError::BadMember { entry, .. } if entry == "tcp://nowhere"),
        "{e}"
    );
    assert_eq!(
        handle.set_cluster(cluster(&[A], false, true)),
        Err(ClusterError::RebalanceWithoutUpdate)
    );
    assert_eq!(handle.current(), cluster(&[A], true, false));
    let conn = client(&broker, false).await;
    assert_eq!(conn.connected_header("haven-cluster"), Some(A));
    conn.disconnect().await.unwrap();
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_cluster_config_stops_start_up_naming_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let start_with = |settings: ClusterConfig| {
        let mut config = Config::default();
        config.stomp.listen = "127.0.0.1:0".parse().unwrap();
        config.journal.dir = dir.path().to_path_buf();
        config.cluster = settings;
        Server::start(config)
    };
    let e = start_with(cluster(&[A, "127.0.0.2:61613"], true, false))
        .await
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(matches!(e, ServerError::Config(_)), "{text}");
    assert!(
        text.contains("cluster.members") && text.contains("'127.0.0.2:61613'"),
        "{text}"
    );
    let e = start_with(cluster(&[A], false, true))
        .await
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(
        text.contains("cluster.rebalance_cluster_clients")
            && text.contains("update_cluster_clients"),
        "{text}"
    );
}

/// The failover client end to end: it merges the members CONNECTED names, then those a pushed
/// announcement adds, and says so with a `ClusterUpdated` event.
#[tokio::test(flavor = "multi_thread")]
async fn the_failover_client_merges_announced_members_into_its_list() {
    let broker = start(cluster(&[B], true, false)).await;
    let own = format!("tcp://{}", broker.addr());
    let client = haven_client::Client::connect(
        &format!("failover:({own})?randomize=false"),
        ConnectOptions::default(),
    )
    .await
    .expect("failover client connects");
    assert_eq!(client.brokers(), vec![own.clone(), B.to_string()]);
    let mut events = client.events();
    broker
        .cluster()
        .set_cluster(cluster(&[B, C], true, false))
        .unwrap();
    loop {
        match tokio::time::timeout(WAIT, events.recv()).await {
            // The first listener also sees the update CONNECTED made; wait for C.
            Ok(Ok(haven_client::ConnectionEvent::ClusterUpdated { brokers }))
                if brokers.contains(&C.to_string()) =>
            {
                assert_eq!(brokers, vec![own.clone(), B.to_string(), C.to_string()]);
                break;
            }
            Ok(Ok(_)) => {}
            other => panic!("expected ClusterUpdated, got {other:?}"),
        }
    }
    assert_eq!(client.broker(), Some(own), "no rebalance asked: it stays");
    client.disconnect().await.unwrap();
    broker.stop().await;
}
