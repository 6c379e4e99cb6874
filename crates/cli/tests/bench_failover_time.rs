//! Benchmark (ignored by `cargo test`; run it on purpose): how long a failover client is
//! without a broker when the one it uses dies.
//!
//! ```sh
//! cargo test --release -p haven-cli --test bench_failover_time -- --ignored --nocapture
//! ```
//!
//! Two standalone brokers on loopback; a client on `failover:(a,b)` with default options
//! (except `randomize=false`, so the first connection is deterministic) sends persistent
//! messages one RECEIPT at a time. Each trial kills the broker in use with `kill -9` and
//! measures from the kill to the RECEIPT of the first SEND begun after the kill (which only
//! the other broker can give; it includes resending the SEND lost in flight); the killed broker is
//! restarted before the next trial. Prints each trial and the median, as a figure for
//! BENCHMARKS.md, not a pass/fail bound.
//!
//! The shared-fs variant runs the same trials against a master/slave pair on one journal
//! directory (`[ha] mode = "shared-fs"`, default settings): the kill frees the lock, the slave
//! blocked on it becomes master (epoch bump, recovery, listen), and the client reconnects to
//! it. The killed broker is started again as a slave. The shared-db variant does the same over
//! a throwaway PostgreSQL (default lease settings): the dead master's database session ends
//! with it, so the slave takes the lease without waiting for it to expire. The replicated
//! variant kills the Raft leader of three members (default timings): the others elect a new
//! leader, which recovers its state journal and listens; the killed member rejoins as a follower.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haven_client::{Client, ConnectOptions};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};

const TRIALS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn failover_time_kill9_to_first_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let brokers: Vec<BrokerProcess> = (0..2)
        .map(|i| {
            BrokerProcess::start(BrokerOpts::new(
                env!("CARGO_BIN_EXE_haven"),
                dir.path().join(format!("b{i}")),
                free_addr(),
            ))
            .expect("broker starts")
        })
        .collect();
    trials("standalone brokers", brokers, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn shared_fs_failover_time_kill9_to_first_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let brokers: Vec<BrokerProcess> = (0..2)
        .map(|i| {
            let mut opts = BrokerOpts::new(
                env!("CARGO_BIN_EXE_haven"),
                dir.path().join("shared"),
                free_addr(),
            );
            opts.name = Some(format!("b{i}"));
            opts.config_toml = Some("[ha]\nmode = \"shared-fs\"\n".into());
            if i == 0 {
                BrokerProcess::start(opts).expect("master starts")
            } else {
                BrokerProcess::spawn(opts).expect("slave starts")
            }
        })
        .collect();
    trials("shared-fs master/slave", brokers, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn shared_db_failover_time_kill9_to_first_receipt() {
    let pg = haven_testkit::PgCluster::start().expect("a PostgreSQL test cluster");
    let dir = tempfile::tempdir().unwrap();
    let brokers: Vec<BrokerProcess> = (0..2)
        .map(|i| {
            let mut opts = BrokerOpts::new(
                env!("CARGO_BIN_EXE_haven"),
                dir.path().join(format!("b{i}")),
                free_addr(),
            );
            opts.config_toml = Some(format!(
                "[broker]\nname = \"b{i}\"\n[ha]\nmode = \"shared-db\"\ndb_url = \"{}\"\n",
                pg.url()
            ));
            if i == 0 {
                BrokerProcess::start(opts).expect("master starts")
            } else {
                BrokerProcess::spawn(opts).expect("slave starts")
            }
        })
        .collect();
    trials("shared-db master/slave", brokers, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn replicated_failover_time_kill9_to_first_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let members: Vec<(u64, std::net::SocketAddr, std::net::SocketAddr)> =
        (1..=3).map(|id| (id, free_addr(), free_addr())).collect();
    let mut list = String::new();
    for (id, raft, stomp) in &members {
        list += &format!("[[ha.members]]\nid = {id}\nraft = \"{raft}\"\nstomp = \"{stomp}\"\n");
    }
    let brokers: Vec<BrokerProcess> = members
        .iter()
        .map(|(id, _, stomp)| {
            let mut opts = BrokerOpts::new(
                env!("CARGO_BIN_EXE_haven"),
                dir.path().join(format!("r{id}")),
                *stomp,
            );
            // Default timings (heartbeat 50 ms, election timeout 100 ms: a follower stands after 300-400 ms).
            opts.config_toml = Some(format!(
                "[ha]\nmode = \"replicated\"\nnode_id = {id}\n{list}"
            ));
            BrokerProcess::spawn(opts).expect("member starts")
        })
        .collect();
    // Wait for a leader before the client connects.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !brokers.iter().any(|b| {
        matches!(haven_testkit::stomp_connect_probe(b.addr(), Duration::from_millis(500)), Ok(c) if c == "CONNECTED")
    }) {
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    trials("3 replicas (Raft)", brokers, true).await;
}

/// Kills the broker in use `TRIALS` times; `slaves`: brokers come back as slaves (shared
/// store), not as brokers that serve at once.
async fn trials(what: &str, mut brokers: Vec<BrokerProcess>, slaves: bool) {
    let urls: Vec<String> = brokers
        .iter()
        .map(|b| format!("tcp://{}", b.addr()))
        .collect();
    let uri = format!("failover:({})?randomize=false", urls.join(","));
    let client = Client::connect(&uri, ConnectOptions::default())
        .await
        .unwrap();
    // (when the SEND started, when its RECEIPT came) of the latest message.
    let last_receipt = Arc::new(Mutex::new((Instant::now(), Instant::now())));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (client, last_receipt, stop) = (client.clone(), last_receipt.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                client
                    .send_receipted("/queue/failover-time", &[], vec![b'x'; 1024])
                    .await
                    .expect("send");
                *last_receipt.lock().unwrap() = (started, Instant::now());
            }
        })
    };
    let mut trials_ms = Vec::new();
    for trial in 1..=TRIALS {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let current = client.broker().expect("connected");
        let index = urls.iter().position(|u| *u == current).unwrap();
        let killed_at = Instant::now();
        brokers[index].kill9().unwrap();
        loop {
            // The first SEND started after the kill can only be receipted by the other broker
            // (a RECEIPT already on its way from the killed one would be for an earlier SEND).
            let (started, receipted) = *last_receipt.lock().unwrap();
            if started > killed_at {
                let ms = (receipted - killed_at).as_secs_f64() * 1000.0;
                eprintln!("trial {trial}: {current} killed, first RECEIPT from the other after {ms:.1} ms");
                trials_ms.push(ms);
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let b = &mut brokers[index];
        if slaves {
            b.respawn().expect("respawn as slave");
        } else {
            tokio::task::block_in_place(|| b.restart().expect("restart"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    client.disconnect().await.unwrap();
    trials_ms.sort_by(f64::total_cmp);
    eprintln!(
        "{what}: failover kill -9 -> first RECEIPT over {TRIALS} trials: p50 {:.1} ms, min {:.1} ms, max {:.1} ms",
        trials_ms[TRIALS / 2],
        trials_ms[0],
        trials_ms[TRIALS - 1]
    );
    for b in &mut brokers {
        b.stop().unwrap();
    }
}
