//! `haven run --config FILE` re-reads FILE's `[cluster]` on SIGHUP, and a client that asked
//! for cluster updates is pushed the new member list; changes to other tables are logged as
//! needing a restart, and a bad file keeps the running settings. The real binary, a real signal.

use std::path::Path;
use std::time::{Duration, Instant};

use haven_client::{AckMode, ConnectOptions, Connection, Subscription};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};

const A: &str = "tcp://127.0.0.1:61613";
const B: &str = "tcp://127.0.0.2:61613";
/// Bound on every wait for the broker (a pushed frame, a log line).
const WAIT_MS: u64 = 10_000;

fn cluster_toml(members: &[&str], rebalance: bool) -> String {
    let quoted: Vec<String> = members.iter().map(|m| format!("\"{m}\"")).collect();
    format!(
        "[cluster]\nmembers = [{}]\nupdate_cluster_clients = true\nrebalance_cluster_clients = {rebalance}\n",
        quoted.join(", ")
    )
}

async fn connect(broker: &BrokerProcess, updates: bool) -> Connection {
    let mut opts = ConnectOptions::default();
    if updates {
        opts.headers
            .push(("haven-cluster-updates".into(), "true".into()));
    }
    Connection::connect(&broker.stomp_url(), opts)
        .await
        .unwrap_or_else(|e| panic!("client connects: {e}"))
}

/// Waits until the broker's log contains `needle` (after `from` bytes, so earlier reloads do
/// not count); panics with the log tail after [`WAIT_MS`].
async fn wait_for_log(broker: &BrokerProcess, from: usize, needle: &str) {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
        if log.get(from..).is_some_and(|tail| tail.contains(needle)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the broker log within {WAIT_MS} ms; log tail:\n{}",
            broker.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn log_len(broker: &BrokerProcess) -> usize {
    std::fs::metadata(broker.log_path()).map_or(0, |m| m.len() as usize)
}

fn rewrite(path: &Path, text: &str) {
    // Write then rename, as an editor or a deployment tool would: the broker never reads half a
    // file.
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).expect("write new config");
    std::fs::rename(&tmp, path).expect("replace config");
}

async fn next_announcement(sub: &mut Subscription) -> haven_client::Message {
    tokio::time::timeout(Duration::from_millis(WAIT_MS), sub.next())
        .await
        .unwrap_or_else(|_| panic!("no cluster announcement within {WAIT_MS} ms"))
        .expect("connection open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_cluster_and_pushes_it_to_clients() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("data"),
        free_addr(),
    );
    opts.config_toml = Some(cluster_toml(&[A], false));
    let mut broker = BrokerProcess::start(opts).unwrap_or_else(|e| panic!("broker starts: {e}"));
    let config = broker
        .config_path()
        .expect("started with a config file")
        .to_path_buf();

    let conn = connect(&broker, true).await;
    assert_eq!(conn.connected_header("haven-cluster"), Some(A));
    // haven-client routes a MESSAGE by its `subscription` header; a subscription with the
    // announcement's id is how this test receives it.
    let mut announcements = conn
        .subscribe(
            "/topic/haven.cluster",
            AckMode::Auto,
            &[("id", "haven.cluster")],
        )
        .await
        .unwrap();

    // A new member and a rebalance request, plus a change that needs a restart.
    let from = log_len(&broker);
    let new = format!(
        "{}[stomp]\nconnections_max = 5\n",
        cluster_toml(&[A, B], true)
    );
    rewrite(&config, &new);
    broker.sighup().expect("SIGHUP");
    let m = next_announcement(&mut announcements).await;
    assert_eq!(m.message_id, "haven-cluster-1");
    assert_eq!(m.header("haven-cluster"), Some(&*format!("{A},{B}")));
    assert_eq!(m.header("haven-rebalance"), Some("true"));
    wait_for_log(&broker, from, "needs a restart").await;
    wait_for_log(&broker, from, "cluster settings changed").await;

    // A bad file changes nothing: no announcement, and new clients hear the running list.
    let from = log_len(&broker);
    rewrite(&config, "[cluster]\nmembers = [\"broker-b:61613\"]\n");
    broker.sighup().expect("SIGHUP");
    wait_for_log(&broker, from, "config not reloaded").await;
    let late = connect(&broker, false).await;
    assert_eq!(
        late.connected_header("haven-cluster"),
        Some(&*format!("{A},{B}"))
    );
    late.disconnect().await.unwrap();
    assert!(
        announcements.try_next().is_none(),
        "a bad config file was announced"
    );

    // Fixed again: the member leaves, announced as number 2.
    rewrite(&config, &cluster_toml(&[B], false));
    broker.sighup().expect("SIGHUP");
    let m = next_announcement(&mut announcements).await;
    assert_eq!(m.message_id, "haven-cluster-2");
    assert_eq!(m.header("haven-cluster"), Some(B));
    assert_eq!(m.header("haven-rebalance"), Some("false"));

    conn.disconnect().await.unwrap();
    let status = broker.stop().expect("broker stops");
    assert!(
        status.success(),
        "broker ended with {status}; log tail:\n{}",
        broker.log_tail()
    );
}
