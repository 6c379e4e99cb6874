//! Shared file system master/slave with real `haven` processes: brokers share one journal
//! directory (`[ha] mode = "shared-fs"`), one holds the lock and serves, the others wait.
//!
//! 1. The master is killed with `kill -9` again and again under load; each time a slave takes
//!    over, and the killed broker is started again and rejoins as a slave (failback needs no
//!    operator). Exactly once holds across every takeover: the brokers share the store, so the
//!    producer sequence drops resends the dead master already stored, and nothing receipted is
//!    lost.
//! 2. Three brokers, the master killed twice in a row (the second new master dies before the
//!    first is back), then both rejoin and the third master is killed too.
//! 3. Fencing: a master that finds a newer epoch in the epoch file (what it sees when another
//!    broker took the lock from it, e.g. after an NFS lease expired while it was frozen) stops
//!    serving without writing a single record, and a waiting slave takes over.
//!
//! Kill intervals are random but seeded (printed; HAVEN_SHARED_SEED replays them).

#[path = "support/group.rs"]
mod group;
#[path = "support/traffic.rs"]
mod traffic;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use group::*;
use haven_client::{ConnectOptions, Connection};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess, Duplicates};
use tokio::sync::Mutex;
use traffic::*;

const QUEUE: &str = "/queue/shared-fs";
/// Bounds on how long the master serves between kills.
const KILL_AFTER_MS: std::ops::Range<u64> = 200..800;

fn shared_config(name: &str, extra_ha: &str) -> String {
    format!("[broker]\nname = \"{name}\"\n\n[ha]\nmode = \"shared-fs\"\n{extra_ha}")
}

/// `n` brokers on one shared directory: the first is master when this returns, the others
/// are started as slaves.
fn start_group(dir: &std::path::Path, n: usize) -> Vec<BrokerProcess> {
    start_group_with(dir, n, "")
}

fn start_group_with(dir: &std::path::Path, n: usize, extra_ha: &str) -> Vec<BrokerProcess> {
    let shared = dir.join("shared");
    (0..n)
        .map(|i| {
            let name = format!("b{i}");
            let mut opts = BrokerOpts::new(env!("CARGO_BIN_EXE_haven"), &shared, free_addr());
            opts.config_toml = Some(shared_config(&name, extra_ha));
            opts.name = Some(name);
            if i == 0 {
                BrokerProcess::start(opts).expect("first broker becomes master")
            } else {
                BrokerProcess::spawn(opts).expect("slave starts")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn master_killed_repeatedly_under_load_slaves_take_over_exactly_once() {
    const KILLS: usize = 5;
    let seed = seed("HAVEN_SHARED_SEED");
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_group(dir.path(), 2);
    let (report, mut b) = kill_masters_under_load(brokers, QUEUE, KILLS, KILL_AFTER_MS, seed).await;
    eprintln!("shared-fs, {KILLS} master kills: {report}");
    if !report.is_ok() {
        eprintln!("{}", logs(&b));
    }
    assert!(report.receipted > 0, "{report}");
    assert_eq!(report.unknown, 0, "every SEND was confirmed: {report}");
    assert!(report.is_ok(), "seed {seed}: {report}");
    // Both brokers were master more than once: a killed master came back as a slave and
    // took over again later.
    for broker in b.iter() {
        assert!(terms(broker) >= 2, "{}", logs(&b));
    }
    for broker in b.iter_mut() {
        broker.stop().expect("broker stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_brokers_master_killed_twice_in_a_row_then_old_masters_rejoin() {
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_group(dir.path(), 3);
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let brokers = Arc::new(Mutex::new(brokers));
    let t = Traffic::start(&uri, QUEUE).await;
    let receipts = t.receipts.clone();
    wait_progress(&receipts, receipts.load(Ordering::Relaxed), 20).await;
    // First master dies; as soon as a second one serves, it dies too.
    let (first, second) = {
        let brokers = brokers.clone();
        blocking(move || kill_two_masters_in_a_row(&mut brokers.blocking_lock())).await
    };
    wait_progress(&receipts, receipts.load(Ordering::Relaxed), 20).await;
    // Both old masters rejoin as slaves; then the third master dies as well.
    {
        let brokers = brokers.clone();
        blocking(move || {
            rejoin_both_then_kill_the_third(&mut brokers.blocking_lock(), first, second)
        })
        .await;
    }
    let report = t.finish_exactly_once(Vec::new()).await;
    eprintln!("shared-fs, three brokers: {report}");
    let mut b = brokers.lock().await;
    if !report.is_ok() {
        eprintln!("{}", logs(&b));
    }
    assert!(report.receipted > 0, "{report}");
    assert!(report.is_ok(), "{report}");
    for broker in b.iter_mut() {
        if broker.is_running() {
            broker.stop().expect("broker stops");
        }
    }
}

/// Every journal segment file and its bytes.
fn segments(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_finds_a_newer_epoch_stops_without_writing_and_a_slave_takes_over() {
    const STORED: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let mut brokers = start_group(dir.path(), 2);
    let shared = dir.path().join("shared");
    let a_addr = brokers[0].addr().to_string();
    let conn = Connection::connect(&a_addr, ConnectOptions::default())
        .await
        .expect("connect to the master");
    for i in 0..STORED {
        conn.send_receipted(QUEUE, &[], format!("before-{i}"))
            .await
            .expect("stored");
    }
    // Freeze the master, and do what a new master does after taking the lock from it.
    brokers[0].sigstop().expect("SIGSTOP");
    let epoch: u64 = std::fs::read_to_string(shared.join("epoch"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::write(shared.join("epoch"), format!("{}\n", epoch + 1)).unwrap();
    let before = segments(&shared);
    brokers[0].sigcont().expect("SIGCONT");
    // It wakes up believing it is master; a SEND must not be stored, nor receipted.
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        conn.send_receipted(QUEUE, &[], "after-fence"),
    )
    .await
    .expect("the fenced master answers or closes");
    assert!(refused.is_err(), "a fenced master receipted a SEND");
    assert_eq!(
        segments(&shared)
            .into_iter()
            .filter(|(name, _)| before.iter().any(|(n, _)| n == name))
            .collect::<Vec<_>>(),
        before,
        "the fenced master wrote to the journal"
    );
    // The slave takes over (the fenced master released the lock) and has every stored message.
    let b1 = wait_master_async(&mut brokers).await;
    let log = std::fs::read_to_string(brokers[0].log_path()).unwrap();
    // Stopped by the writer's fence or by the keep-alive, whichever looked first.
    assert!(log.contains("a newer master took over"), "{log}");
    assert!(log.contains("stepping down to slave"), "{log}");
    let c = Connection::connect(&brokers[b1].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the new master");
    let (mut sub, got) = receive_bodies(&c, QUEUE, STORED).await;
    let want: Vec<String> = (0..STORED).map(|i| format!("before-{i}")).collect();
    assert_eq!(got, want);
    assert!(
        nothing_more(&mut sub).await,
        "a message the fenced master refused was stored"
    );
    c.disconnect().await.unwrap();
    for b in brokers.iter_mut() {
        b.stop().expect("broker stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_master_keeps_the_lock_no_split_brain_and_nothing_lost() {
    const FROZEN_MS: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_group(dir.path(), 2);
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let brokers = Arc::new(Mutex::new(brokers));
    let mut t = Traffic::start(&uri, QUEUE).await;
    let receipts = t.receipts.clone();
    wait_progress(&receipts, 0, 20).await;
    {
        let brokers = brokers.clone();
        blocking(move || {
            let mut b = brokers.blocking_lock();
            assert_eq!(wait_master(&mut b), 0);
            b[0].sigstop().expect("SIGSTOP");
            // A frozen process still holds its lock (the kernel keeps it for a live process):
            // the slave must not take over and write beside it.
            let deadline = Instant::now() + Duration::from_millis(FROZEN_MS);
            while Instant::now() < deadline {
                assert!(
                    serving(&mut b).is_empty(),
                    "a broker served while the master was frozen"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            b[0].sigcont().expect("SIGCONT");
        })
        .await;
    }
    t.stop_producers().await;
    let (producer, history) = (t.producer.clone(), t.history.clone());
    producer.disconnect().await.expect("producer disconnect");
    t.finish_consumer().await;
    let report = history.check(Duplicates::Forbidden, true);
    eprintln!("shared-fs, frozen master: {report}");
    let mut b = brokers.lock().await;
    assert!(report.is_ok(), "{report}\n{}", logs(&b));
    assert_eq!(terms(&b[1]), 0, "the slave became master: {}", logs(&b));
    for broker in b.iter_mut() {
        broker.stop().expect("broker stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_broker_can_take_over_a_directory_a_group_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut group = start_group(dir.path(), 1);
    let conn = Connection::connect(&group[0].addr().to_string(), ConnectOptions::default())
        .await
        .unwrap();
    conn.send_receipted(QUEUE, &[], "kept").await.unwrap();
    conn.disconnect().await.unwrap();
    group[0].stop().expect("stops");
    // The same directory, now without [ha]: the journal's segments carry epoch 1.
    let mut standalone = BrokerProcess::start(BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("shared"),
        free_addr(),
    ))
    .expect("a standalone broker opens the group's directory");
    let c = Connection::connect(&standalone.addr().to_string(), ConnectOptions::default())
        .await
        .unwrap();
    let (_, got) = receive_bodies(&c, QUEUE, 1).await;
    assert_eq!(got, ["kept"]);
    c.disconnect().await.unwrap();
    standalone.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slaves_that_poll_the_lock_log_the_master_and_take_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut brokers = start_group_with(dir.path(), 2, "lock_poll_ms = 100\n");
    let conn = Connection::connect(&brokers[0].addr().to_string(), ConnectOptions::default())
        .await
        .unwrap();
    conn.send_receipted(QUEUE, &[], "one").await.unwrap();
    conn.disconnect().await.unwrap();
    // The slave names the master in its log (its state, for an operator).
    let deadline = Instant::now() + Duration::from_secs(10);
    let slave_log = loop {
        let log = std::fs::read_to_string(brokers[1].log_path()).unwrap_or_default();
        if log.contains("slave: waiting for the lock; master is b0") {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "slave never logged the master:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(slave_log.contains("epoch 1"), "{slave_log}");
    brokers[0].kill9().unwrap();
    let m = wait_master_async(&mut brokers).await;
    assert_eq!(m, 1);
    let c = Connection::connect(&brokers[1].addr().to_string(), ConnectOptions::default())
        .await
        .unwrap();
    let (_, got) = receive_bodies(&c, QUEUE, 1).await;
    assert_eq!(got, ["one"]);
    c.disconnect().await.unwrap();
    brokers[1].stop().unwrap();
}
