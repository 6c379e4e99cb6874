//! A broker's bridges run on one thread of their own (`haven-bridges`, see
//! `server/src/network/mod.rs`): a broker without connectors starts none, and stopping the
//! broker ends it. One test in a binary of its own, because it counts the process's threads by
//! name and other tests' brokers would be counted too.

mod common;

use common::Broker;
use haven_server::config::NetworkConnector;

fn bridge_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("this process's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == "haven-bridges")
        .count()
}

/// A loopback port nothing listens on (bound, then released): the bridges to it keep retrying.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test]
async fn the_bridges_thread_lives_as_long_as_its_broker() {
    assert_eq!(bridge_threads(), 0);
    let plain = Broker::start().await;
    assert_eq!(
        bridge_threads(),
        0,
        "a broker without connectors starts no thread"
    );

    let (b, c) = (closed_port(), closed_port());
    let networked = Broker::start_with(|config| {
        config.broker.name = "A".into();
        config.network = vec![NetworkConnector {
            uri: format!("static:(tcp://127.0.0.1:{b},tcp://127.0.0.1:{c})"),
            ..NetworkConnector::default()
        }];
    })
    .await;
    assert_eq!(
        bridge_threads(),
        1,
        "one thread for all of a broker's bridges"
    );
    // The broker still serves while its bridges retry.
    let mut client = networked.client().await;
    client
        .send_receipted(
            common::frame(
                haven_stomp::Command::Send,
                &[("destination", "/queue/q")],
                "x",
            ),
            "r1",
        )
        .await;

    networked.stop().await;
    assert_eq!(
        bridge_threads(),
        0,
        "stopping the broker ends its bridges' thread"
    );
    plain.stop().await;
}
