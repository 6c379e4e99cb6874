//! Networks of brokers with real `haven` processes: `[[network]]` connectors carry messages
//! toward the brokers where the consumers are (store and forward), and nothing is lost or
//! doubled on the way, whatever breaks.
//!
//! 1. A line A → B → C: a consumer on C draws A's messages over two bridges (`network_ttl = 2`
//!    on A's connector); each arrives once and nothing is left on A or B.
//! 2. A consumer moves between A and B (and back) while A's producers go on; the messages
//!    follow it, including ones B had taken for it and must hand back to A. Once with a
//!    connector each way, once with one duplex connector.
//! 3. A full mesh of three brokers (`network_ttl = 1`): a subscriber on each broker gets every
//!    topic message of two producers exactly once.
//! 4. A loop A → B → C → A (`network_ttl = 3`): messages reach C's consumer once; with no
//!    consumer anywhere, messages stay where they are (no bridge carries them round) and a
//!    consumer that comes later gets exactly those.
//! 5. A bridge under faults: its connection reset and black-holed (through a fault proxy),
//!    the source broker and the remote broker killed with `kill -9` and restarted, in a seeded
//!    random order, under steady producers. Exactly once end to end.
//! 6. The remote broker is a shared-fs HA group (`failover:(...)` connector) whose master is
//!    killed under load; the slave takes over and the bridge follows it. Then the other way
//!    round: the source broker is the HA group. Exactly once end to end.
//!
//! 7. A hub that two brokers forward to, with a small origin memory: one source's bridge is
//!    cut (black hole, reset, `kill -9`) while the other floods the hub; the cut source's
//!    resends are still recognised. Exactly once end to end.
//! 8. A source broker killed just after forwarding (and restarted with the remote broker
//!    gone) holds nothing it would forward again: its bridge's acknowledgements were durable.
//!
//! Every wait is bounded and fails with the brokers' logs; time is never a pass criterion.
//! Fault schedules are random but seeded (printed; HAVEN_NETWORK_SEED replays them).

#[path = "support/group.rs"]
mod group;
#[path = "support/network.rs"]
mod network;
#[path = "support/traffic.rs"]
mod traffic;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use group::{logs, wait_master, REJOIN_SETTLE_MS};
use haven_client::{Client, ConnectOptions};
use haven_testkit::{BrokerProcess, Duplicates, Fault, History, Proxy, Report};
use network::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use traffic::{quick_failover, seed, spawn_producer, wait_progress, HEALING_RECEIPTS_MIN};

/// Receipted producer tasks in the tests that run producers until told to stop.
const PRODUCER_TASKS: usize = 3;
/// Further deliveries a consumer must see after each fault or move (progress).
const PROGRESS_MESSAGES: u64 = 100;

/// A consumer of `queue` on the broker at one of `addrs` (failing over quickly between them),
/// recording every message, probes included, into `history`.
async fn recorder_on(
    label: &str,
    addrs: &[SocketAddr],
    queue: &str,
    history: &Arc<History>,
) -> Recorder {
    let uris: Vec<String> = addrs.iter().map(|a| tcp(*a)).collect();
    Recorder::start(label, &quick_failover(&uris), queue, history.clone(), true).await
}

async fn connect(uri: &str) -> Client {
    Client::connect(uri, ConnectOptions::default())
        .await
        .unwrap_or_else(|e| panic!("connect to {uri}: {e}"))
}

/// Producer tasks on `client` (ids `p<i>-<n>`), until `stop`.
fn start_producers(
    client: &Client,
    queue: &'static str,
    history: &Arc<History>,
    receipts: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..PRODUCER_TASKS)
        .map(|p| {
            spawn_producer(
                client.clone(),
                queue,
                p,
                history.clone(),
                receipts.clone(),
                stop.clone(),
            )
        })
        .collect()
}

/// Lets the producers confirm some more (they work after the last fault), stops them and
/// disconnects their client (every SEND confirmed).
async fn stop_producers(
    client: Client,
    receipts: &AtomicU64,
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    wait_progress(
        receipts,
        receipts.load(Ordering::Relaxed),
        HEALING_RECEIPTS_MIN,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("producer task");
    }
    eprintln!("producer client: {:?}", client.stats());
    client.disconnect().await.expect("producer disconnects");
}

/// Waits until `consumer` has recorded `PROGRESS_MESSAGES` more; fails with the logs.
async fn expect_progress(consumer: &Recorder, what: &str, brokers: &[&BrokerProcess]) {
    let want = consumer.received() + PROGRESS_MESSAGES;
    if !consumer.wait_received(want, PROGRESS_WAIT_MS).await {
        panic!(
            "{what}: consumer {} stuck at {} deliveries (wanted {want}):\n{}",
            consumer.label,
            consumer.received(),
            logs_of(brokers)
        );
    }
}

fn logs_of(brokers: &[&BrokerProcess]) -> String {
    brokers
        .iter()
        .map(|b| format!("--- {} ---\n{}", b.log_path().display(), b.log_tail()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_exactly_once(report: &Report, brokers: &[&BrokerProcess]) {
    assert!(report.receipted > 0, "{report}");
    assert_eq!(report.unknown, 0, "every SEND was confirmed: {report}");
    assert!(report.is_ok(), "{report}\n{}", logs_of(brokers));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn line_a_b_c_forwards_over_two_hops() {
    const QUEUE: &str = "/queue/line";
    const N: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c] = free_addrs();
    let bc = start_broker(dir.path(), "C", c, &[]);
    let bb = start_broker(dir.path(), "B", b, &[connector(&tcp(c), 1, "")]);
    let ba = start_broker(dir.path(), "A", a, &[connector(&tcp(b), 2, "")]);
    let all = [&ba, &bb, &bc];
    let history = Arc::new(History::new());
    let on_c = Recorder::start("on C", &tcp(c), QUEUE, history.clone(), true).await;
    let producer = connect(&tcp(a)).await;
    assert!(
        wait_queue_demand(&producer, QUEUE, &history).await,
        "C's demand never reached A over two bridges:\n{}",
        logs_of(&all)
    );
    send_all(
        &producer,
        QUEUE,
        "m",
        N,
        0,
        std::slice::from_ref(&history),
        4,
    )
    .await;
    producer.disconnect().await.unwrap();
    let at_c = on_c.drain().await;
    // Nothing stays behind: consumers on A and B (which also draw A's leftovers to B) get
    // nothing, as C already had every message.
    let on_a = Recorder::start("on A", &tcp(a), QUEUE, history.clone(), true).await;
    let on_b = Recorder::start("on B", &tcp(b), QUEUE, history.clone(), true).await;
    tokio::time::sleep(Duration::from_millis(QUIET_MS * 2)).await;
    let left_a = on_a.stop().await;
    let left_b = on_b.stop().await;
    let report = history.check(Duplicates::Forbidden, false);
    eprintln!("line A-B-C: {report}; at C {}", at_c.len());
    assert_exactly_once(&report, &all);
    assert!(report.receipted > N, "{report}");
    assert_eq!(at_c.len(), report.receipted, "C got every message, once");
    assert!(
        left_a.is_empty() && left_b.is_empty(),
        "left on A: {left_a:?}, on B: {left_b:?}"
    );
    // Both bridges of the line ran.
    assert!(count_in_log(&ba, "bridge up") >= 1, "{}", logs_of(&all));
    assert!(count_in_log(&bb, "bridge up") >= 1, "{}", logs_of(&all));
}

/// A consumer on B, then on A, and so on; the last one on B dies holding some messages it was
/// given, and a last one on A drains. Producers on A run throughout.
async fn consumers_move_and_messages_follow(duplex: bool) {
    const QUEUE: &str = "/queue/moving";
    /// Messages the last consumer on B takes and never acknowledges.
    const HELD: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = free_addrs();
    let (a_connectors, b_connectors) = if duplex {
        (vec![connector(&tcp(b), 1, "duplex = true")], vec![])
    } else {
        (
            vec![connector(&tcp(b), 1, "")],
            vec![connector(&tcp(a), 1, "")],
        )
    };
    let bb = start_broker(dir.path(), "B", b, &b_connectors);
    let ba = start_broker(dir.path(), "A", a, &a_connectors);
    let all = [&ba, &bb];
    let history = Arc::new(History::new());
    let producer = connect(&tcp(a)).await;
    let mut consumer = Recorder::start("B#1", &tcp(b), QUEUE, history.clone(), true).await;
    assert!(
        wait_queue_demand(&producer, QUEUE, &history).await,
        "B's demand never reached A:\n{}",
        logs_of(&all)
    );
    let receipts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let producers = start_producers(&producer, QUEUE, &history, &receipts, &stop);
    let mut delivered = 0;
    for (label, addr) in [("A#1", a), ("B#2", b), ("A#2", a), ("B#3", b)] {
        expect_progress(&consumer, "before the consumer moves", &all).await;
        delivered += consumer.stop().await.len();
        consumer = Recorder::start(label, &tcp(addr), QUEUE, history.clone(), true).await;
    }
    expect_progress(&consumer, "before the consumer moves", &all).await;
    let (got, held) = consumer.stop_holding(HELD).await;
    delivered += got.len();
    assert!(
        !held.is_empty(),
        "the consumer on B was given nothing more to hold:\n{}",
        logs_of(&all)
    );
    stop_producers(producer, &receipts, &stop, producers).await;
    // The last consumer is on A: what B holds (the unacknowledged messages among it) must
    // come back.
    let last = Recorder::start("A#3", &tcp(a), QUEUE, history.clone(), true)
        .await
        .drain()
        .await;
    delivered += last.len();
    let report = history.check(Duplicates::Forbidden, false);
    eprintln!(
        "consumers moving (duplex {duplex}): {report}; last consumer on A got {}, of them {} held on B",
        last.len(),
        held.iter().filter(|id| last.contains(id)).count()
    );
    assert_exactly_once(&report, &all);
    assert_eq!(delivered, report.receipted, "{report}");
    let missing: Vec<&String> = held.iter().filter(|id| !last.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "messages B held for a consumer that died did not follow the consumer to A: \
         {missing:?}\n{}",
        logs_of(&all)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_moving_between_brokers_messages_follow() {
    consumers_move_and_messages_follow(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumers_moving_between_brokers_over_one_duplex_connector() {
    consumers_move_and_messages_follow(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topic_fan_out_across_a_mesh_of_three_without_duplicates() {
    const TOPIC: &str = "/topic/mesh";
    const N: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let addrs = free_addrs::<3>();
    let names = ["A", "B", "C"];
    let brokers: Vec<BrokerProcess> = (0..3)
        .map(|i| {
            let others: Vec<String> = (0..3).filter(|j| *j != i).map(|j| tcp(addrs[j])).collect();
            let uri = format!("static:({})", others.join(","));
            start_broker(dir.path(), names[i], addrs[i], &[connector(&uri, 1, "")])
        })
        .collect();
    let all: Vec<&BrokerProcess> = brokers.iter().collect();
    let mut subscribers = Vec::new();
    for i in 0..3 {
        subscribers.push(
            Recorder::start(
                &format!("on {}", names[i]),
                &tcp(addrs[i]),
                TOPIC,
                Arc::new(History::new()),
                false,
            )
            .await,
        );
    }
    let on_a = connect(&tcp(addrs[0])).await;
    let on_b = connect(&tcp(addrs[1])).await;
    let subs: Vec<&Recorder> = subscribers.iter().collect();
    assert!(
        wait_topic_demand(&[("A", &on_a), ("B", &on_b)], TOPIC, &subs).await,
        "the subscribers' demand never reached A and B:\n{}",
        logs_of(&all)
    );
    let histories: Vec<Arc<History>> = subscribers.iter().map(|s| s.history.clone()).collect();
    tokio::join!(
        send_all(&on_a, TOPIC, "a", N, 0, &histories, 2),
        send_all(&on_b, TOPIC, "b", N, 0, &histories, 2),
    );
    on_a.disconnect().await.unwrap();
    on_b.disconnect().await.unwrap();
    let mut failures = Vec::new();
    for s in subscribers {
        let (label, history) = (s.label.clone(), s.history.clone());
        let got = s.drain().await;
        let report = history.check(Duplicates::Forbidden, false);
        eprintln!("mesh, subscriber {label}: {report}");
        if !report.is_ok() || got.len() != 2 * N || report.receipted != 2 * N {
            failures.push(format!("{label}: got {} of {}: {report}", got.len(), 2 * N));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        logs_of(&all)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loop_topology_no_message_circles() {
    const QUEUE: &str = "/queue/loop";
    const N: usize = 500;
    const M: usize = 200;
    /// Bodies larger than anything else a bridge sends, so one forwarded message shows in
    /// the proxies' byte counts.
    const PAD_BYTES: usize = 2_000;
    /// Quiet: less than one message's worth through every proxy for this long.
    const QUIET_WINDOW_MS: u64 = 3_000;
    const SETTLE_WAIT_MS: u64 = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c] = free_addrs();
    // Each bridge reaches its remote broker through a proxy that counts what it carries.
    let to_a = Proxy::start(a).unwrap();
    let to_b = Proxy::start(b).unwrap();
    let to_c = Proxy::start(c).unwrap();
    let ba = start_broker(dir.path(), "A", a, &[connector(&tcp(to_b.addr()), 3, "")]);
    let bb = start_broker(dir.path(), "B", b, &[connector(&tcp(to_c.addr()), 3, "")]);
    let bc = start_broker(dir.path(), "C", c, &[connector(&tcp(to_a.addr()), 3, "")]);
    let all = [&ba, &bb, &bc];
    let history = Arc::new(History::new());
    let producer = connect(&tcp(a)).await;
    let on_c = Recorder::start("on C", &tcp(c), QUEUE, history.clone(), true).await;
    assert!(
        wait_queue_demand(&producer, QUEUE, &history).await,
        "C's demand never reached A:\n{}",
        logs_of(&all)
    );
    send_all(
        &producer,
        QUEUE,
        "m",
        N,
        PAD_BYTES,
        std::slice::from_ref(&history),
        4,
    )
    .await;
    let at_c = on_c.drain().await;
    let first = history.check(Duplicates::Forbidden, false);
    eprintln!("loop, consumer on C: {first}");
    assert_exactly_once(&first, &all);
    assert_eq!(at_c.len(), first.receipted);
    // No consumer anywhere now. Messages sent to A may still go a hop or two while the
    // demand is withdrawn, but then they must stay put: no bridge carries anything.
    send_all(
        &producer,
        QUEUE,
        "late",
        M,
        PAD_BYTES,
        std::slice::from_ref(&history),
        4,
    )
    .await;
    producer.disconnect().await.unwrap();
    if let Err(grown) = wait_bridges_quiet(
        &[&to_a, &to_b, &to_c],
        QUIET_WINDOW_MS,
        PAD_BYTES as u64,
        SETTLE_WAIT_MS,
    )
    .await
    {
        panic!(
            "with no consumer anywhere, bridges still carry messages after {SETTLE_WAIT_MS} \
             ms (bytes to A, B, C in the last {QUIET_WINDOW_MS} ms: {grown:?}):\n{}",
            logs_of(&all)
        );
    }
    // A consumer that comes to A later gets exactly those, wherever they waited.
    let at_a = Recorder::start("on A", &tcp(a), QUEUE, history.clone(), true)
        .await
        .drain()
        .await;
    let report = history.check(Duplicates::Forbidden, false);
    eprintln!("loop, then a consumer on A: {report}");
    assert_exactly_once(&report, &all);
    assert_eq!(at_a.len(), M, "{report}");
    assert!(at_a.iter().all(|id| id.starts_with("late-")), "{at_a:?}");
}

/// What happens to the bridge A → B, in a seeded random order.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// The bridge's connection is reset (RST) and new ones are refused for a moment.
    Reset,
    /// The connection goes silent for longer than heart-beats tolerate.
    BlackHole,
    /// `kill -9` of the source broker, then a restart.
    KillSource,
    /// `kill -9` of the remote broker, then a restart.
    KillRemote,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bridge_killed_under_load_nothing_lost_or_doubled() {
    const QUEUE: &str = "/queue/bridge-faults";
    const RESET_MS: u64 = 300;
    /// Longer than a bridge tolerates silence (heart-beats every 2 s).
    const BLACK_HOLE_MS: u64 = 8_000;
    const DOWN_MS: u64 = 200;
    const RUN_BEFORE_CUT_MS: std::ops::Range<u64> = 200..1_000;
    let seed = seed("HAVEN_NETWORK_SEED");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut schedule = [
        Cut::Reset,
        Cut::BlackHole,
        Cut::Reset,
        Cut::KillSource,
        Cut::Reset,
        Cut::KillRemote,
    ];
    schedule.shuffle(&mut rng);
    eprintln!("schedule: {schedule:?}");
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = free_addrs();
    let to_b = Proxy::start(b).unwrap();
    let mut bb = start_broker(dir.path(), "B", b, &[]);
    let mut ba = start_broker(dir.path(), "A", a, &[connector(&tcp(to_b.addr()), 1, "")]);
    let history = Arc::new(History::new());
    let on_b = recorder_on("on B", &[b], QUEUE, &history).await;
    let producer = connect(&quick_failover(&[tcp(a)])).await;
    assert!(
        wait_queue_demand(&producer, QUEUE, &history).await,
        "B's demand never reached A:\n{}",
        logs_of(&[&ba, &bb])
    );
    let receipts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let producers = start_producers(&producer, QUEUE, &history, &receipts, &stop);
    // Broken promises about sessions, kept to report after the exactly-once check (which
    // matters most, and which the rest of the run still exercises).
    let mut session_failures = Vec::new();
    for cut in schedule {
        expect_progress(&on_b, "before a cut", &[&ba, &bb]).await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(RUN_BEFORE_CUT_MS))).await;
        eprintln!("cut: {cut:?}");
        let ups = count_in_log(&ba, "bridge up");
        match cut {
            Cut::Reset => {
                to_b.set(Fault::Reset);
                tokio::time::sleep(Duration::from_millis(RESET_MS)).await;
                to_b.set(Fault::Pass);
            }
            Cut::BlackHole => {
                let downs = count_in_log(&ba, "bridge down");
                to_b.set(Fault::BlackHole);
                tokio::time::sleep(Duration::from_millis(BLACK_HOLE_MS)).await;
                // Heart-beats every 2 s: the silence is noticed well within the black hole.
                let noticed = count_in_log(&ba, "bridge down") > downs;
                to_b.set(Fault::Pass);
                if !noticed {
                    session_failures.push(format!(
                        "a {BLACK_HOLE_MS} ms black hole ended no bridge session (no 'bridge \
                         down' in A's log during it)"
                    ));
                    continue;
                }
            }
            Cut::KillSource => {
                ba.kill9().expect("kill -9 A");
                tokio::time::sleep(Duration::from_millis(DOWN_MS)).await;
                ba.restart().expect("A restarts");
            }
            Cut::KillRemote => {
                bb.kill9().expect("kill -9 B");
                tokio::time::sleep(Duration::from_millis(DOWN_MS)).await;
                bb.restart().expect("B restarts");
            }
        }
        // The bridge comes back after every cut.
        if !wait_log_count(&ba, "bridge up", ups + 1, PROGRESS_WAIT_MS).await {
            session_failures.push(format!("no new bridge session after {cut:?}"));
        }
    }
    expect_progress(&on_b, "after the last cut", &[&ba, &bb]).await;
    stop_producers(producer, &receipts, &stop, producers).await;
    let got = on_b.drain().await;
    let report = history.check(Duplicates::Forbidden, false);
    let ups = count_in_log(&ba, "bridge up");
    eprintln!(
        "bridge faults: {report}; consumer on B recorded {}; A's bridge came up {ups} times",
        got.len()
    );
    if !report.is_ok() {
        eprintln!("seed {seed}");
    }
    assert_exactly_once(&report, &[&ba, &bb]);
    assert!(
        session_failures.is_empty(),
        "seed {seed}: {}\n{}",
        session_failures.join("; "),
        logs_of(&[&ba, &bb])
    );
}

/// A hub that two brokers forward to remembers fewer origins than usual (10,000), and one
/// source's bridge is cut (black-holed, reset, the source killed) while the other source goes
/// on forwarding far more than that. What the cut source had in flight is resent when its
/// bridge comes back; the hub must still recognise it, however much the other sent meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hub_recognises_a_cut_sources_resends_while_another_source_floods_it() {
    const CUT_QUEUE: &str = "/queue/hub-cut";
    const BUSY_QUEUE: &str = "/queue/hub-busy";
    const ORIGINS_MAX: usize = 10_000;
    /// Longer than a bridge tolerates silence (heart-beats every 2 s).
    const BLACK_HOLE_MS: u64 = 8_000;
    const RESET_MS: u64 = 300;
    const DOWN_MS: u64 = 500;
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c] = free_addrs();
    let to_b = Proxy::start(b).unwrap();
    let limits = format!("[limits]\nnetwork_origins_max = {ORIGINS_MAX}\n");
    let bb = start_broker_with(dir.path(), "B", b, &limits, &[]);
    let mut ba = start_broker(dir.path(), "A", a, &[connector(&tcp(to_b.addr()), 1, "")]);
    let bc = start_broker(dir.path(), "C", c, &[connector(&tcp(b), 1, "")]);
    let cut_history = Arc::new(History::new());
    let busy_history = Arc::new(History::new());
    let cut_on_b = recorder_on("cut on B", &[b], CUT_QUEUE, &cut_history).await;
    let busy_on_b = recorder_on("busy on B", &[b], BUSY_QUEUE, &busy_history).await;
    let all = [&ba, &bb, &bc];
    let cut_producer = connect(&quick_failover(&[tcp(a)])).await;
    let busy_producer = connect(&quick_failover(&[tcp(c)])).await;
    assert!(
        wait_queue_demand(&cut_producer, CUT_QUEUE, &cut_history).await
            && wait_queue_demand(&busy_producer, BUSY_QUEUE, &busy_history).await,
        "B's demand never reached A or C:\n{}",
        logs_of(&all)
    );
    let cut_receipts = Arc::new(AtomicU64::new(0));
    let busy_receipts = Arc::new(AtomicU64::new(0));
    let cut_stop = Arc::new(AtomicBool::new(false));
    let busy_stop = Arc::new(AtomicBool::new(false));
    let cut_tasks = start_producers(
        &cut_producer,
        CUT_QUEUE,
        &cut_history,
        &cut_receipts,
        &cut_stop,
    );
    let busy_tasks = start_producers(
        &busy_producer,
        BUSY_QUEUE,
        &busy_history,
        &busy_receipts,
        &busy_stop,
    );
    for cut in [Cut::BlackHole, Cut::Reset, Cut::KillSource, Cut::BlackHole] {
        let all = [&ba, &bb, &bc];
        expect_progress(&cut_on_b, "before a cut", &all).await;
        expect_progress(&busy_on_b, "before a cut", &all).await;
        let ups = count_in_log(&ba, "bridge up");
        let busy_before = busy_on_b.received();
        eprintln!("cut: {cut:?}");
        match cut {
            Cut::BlackHole => {
                to_b.set(Fault::BlackHole);
                tokio::time::sleep(Duration::from_millis(BLACK_HOLE_MS)).await;
                to_b.set(Fault::Pass);
            }
            Cut::Reset => {
                to_b.set(Fault::Reset);
                tokio::time::sleep(Duration::from_millis(RESET_MS)).await;
                to_b.set(Fault::Pass);
            }
            Cut::KillSource => {
                ba.kill9().expect("kill -9 A");
                tokio::time::sleep(Duration::from_millis(DOWN_MS)).await;
                ba.restart().expect("A restarts");
            }
            Cut::KillRemote => unreachable!("the hub stays up"),
        }
        let all = [&ba, &bb, &bc];
        assert!(
            wait_log_count(&ba, "bridge up", ups + 1, PROGRESS_WAIT_MS).await,
            "no new bridge session after {cut:?}:\n{}",
            logs_of(&all)
        );
        // The other source went on meanwhile (its traffic is what would push the cut
        // source's origins out of a table that forgot the oldest overall).
        eprintln!(
            "busy source forwarded {} during and after the {cut:?}",
            busy_on_b.received() - busy_before
        );
    }
    let all = [&ba, &bb, &bc];
    expect_progress(&cut_on_b, "after the last cut", &all).await;
    stop_producers(cut_producer, &cut_receipts, &cut_stop, cut_tasks).await;
    stop_producers(busy_producer, &busy_receipts, &busy_stop, busy_tasks).await;
    let cut_got = cut_on_b.drain().await;
    let busy_got = busy_on_b.drain().await;
    let cut_report = cut_history.check(Duplicates::Forbidden, false);
    let busy_report = busy_history.check(Duplicates::Forbidden, false);
    eprintln!(
        "cut source: {cut_report} ({} recorded); busy source: {busy_report} ({} recorded)",
        cut_got.len(),
        busy_got.len()
    );
    assert!(
        busy_got.len() > 4 * ORIGINS_MAX,
        "the busy source forwarded too little to test anything"
    );
    assert_exactly_once(&cut_report, &all);
    assert_exactly_once(&busy_report, &all);
}

/// A source broker killed just after forwarding has nothing left to forward: its bridge's
/// acknowledgements of what the remote broker stored reach its disk at once, not with its next
/// timed sync (here 10 minutes away). The remote broker would drop the resends as duplicates,
/// but only while it remembers their origins; what is not resent cannot be doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_source_killed_after_forwarding_has_nothing_left_to_forward() {
    const QUEUE: &str = "/queue/forwarded-then-killed";
    const MESSAGES: usize = 300;
    /// The bridge acknowledges on A once B's RECEIPT is in: well within this.
    const ACK_SETTLE_MS: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = free_addrs();
    let mut bb = start_broker(dir.path(), "B", b, &[]);
    // No timed sync on A during the test: only what asks for one reaches its disk.
    let lazy = "[journal]\nmaintenance_interval_ms = 600000\n";
    let mut ba = start_broker_with(dir.path(), "A", a, lazy, &[connector(&tcp(b), 1, "")]);
    let history = Arc::new(History::new());
    let on_b = recorder_on("on B", &[b], QUEUE, &history).await;
    let producer = connect(&tcp(a)).await;
    assert!(
        wait_queue_demand(&producer, QUEUE, &history).await,
        "B's demand never reached A:\n{}",
        logs_of(&[&ba, &bb])
    );
    // Every probe has arrived (that is how the demand was seen).
    let probes = on_b.received();
    send_all(
        &producer,
        QUEUE,
        "m",
        MESSAGES,
        0,
        std::slice::from_ref(&history),
        1,
    )
    .await;
    assert!(
        on_b.wait_received(probes + MESSAGES as u64, PROGRESS_WAIT_MS)
            .await,
        "B's consumer is missing {} messages:\n{}",
        history.missing(),
        logs_of(&[&ba, &bb])
    );
    tokio::time::sleep(Duration::from_millis(ACK_SETTLE_MS)).await;
    // Nothing may touch A before it dies: a DISCONNECT asks for a sync, and any command lets
    // A's core run its 100 ms flush. B then goes for good, so that nothing A still holds can
    // leave it after the restart.
    ba.kill9().expect("kill -9 A");
    bb.kill9().expect("kill -9 B");
    drop(on_b);
    drop(producer);
    ba.restart().expect("A restarts");
    let local = connect(&tcp(a)).await;
    let mut sub = local
        .subscribe(QUEUE, haven_client::AckMode::Auto, &[])
        .await
        .expect("subscribe on A");
    let mut left = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(QUIET_MS), sub.next()).await
    {
        left.push(body_id(&m.body));
    }
    assert!(
        left.is_empty(),
        "A kept {} forwarded messages and would forward them again: {:?}",
        left.len(),
        &left[..left.len().min(10)]
    );
    local.disconnect().await.expect("consumer disconnects");
}

/// Kills the master of `group` and waits for another member to serve; the old master then
/// rejoins as a slave.
fn kill_master_and_rejoin(group: &mut [BrokerProcess]) -> (usize, usize) {
    let master = wait_master(group);
    group[master].kill9().expect("kill -9 master");
    let next = wait_master(group);
    assert_ne!(next, master, "the killed master serves");
    group[master].respawn().expect("old master respawns");
    (master, next)
}

/// Messages sent to `queue` by `producer`, recorded on arrival by `on` into `history`.
struct Flow {
    producer: Client,
    queue: &'static str,
    on: Recorder,
    history: Arc<History>,
}

/// Forwards a flow under load while `group` loses its master `MASTER_KILLS` times, each after
/// a seeded pause, then checks exactly once. `other` is the broker outside the group (its log
/// goes into failure messages). With `bridge_in_other`, the bridge runs on `other` and must
/// reconnect to each new master.
async fn forward_through_master_kills(
    label: &str,
    group: &mut [BrokerProcess],
    other: &BrokerProcess,
    bridge_in_other: bool,
    flow: Flow,
) {
    const RUN_BEFORE_KILL_MS: std::ops::Range<u64> = 300..1_000;
    let Flow {
        producer,
        queue,
        on,
        history,
    } = flow;
    let seed = seed("HAVEN_NETWORK_SEED");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    assert!(
        wait_queue_demand(&producer, queue, &history).await,
        "{label}: the demand never reached the producer's broker:\n{}\n{}",
        other.log_tail(),
        logs(group)
    );
    let receipts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let producers = start_producers(&producer, queue, &history, &receipts, &stop);
    for _ in 0..MASTER_KILLS {
        expect_progress(&on, "before the kill", &[other]).await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(RUN_BEFORE_KILL_MS))).await;
        let ups = count_in_log(other, "bridge up");
        let (old, new) = kill_master_and_rejoin(group);
        eprintln!("{label}: member {old} killed, member {new} serves");
        if bridge_in_other {
            // The bridge follows the group to its new master.
            assert!(
                wait_log_count(other, "bridge up", ups + 1, PROGRESS_WAIT_MS).await,
                "{label}: the bridge did not reconnect to member {new}:\n{}\n{}",
                other.log_tail(),
                logs(group)
            );
        }
        let want = on.received() + PROGRESS_MESSAGES;
        assert!(
            on.wait_received(want, PROGRESS_WAIT_MS).await,
            "{label}: nothing forwarded after member {new} took over:\n{}\n{}",
            other.log_tail(),
            logs(group)
        );
        tokio::time::sleep(Duration::from_millis(REJOIN_SETTLE_MS)).await;
    }
    stop_producers(producer, &receipts, &stop, producers).await;
    let got = on.drain().await;
    let report = history.check(Duplicates::Forbidden, false);
    eprintln!(
        "{label}, {MASTER_KILLS} master kills: {report}; consumer recorded {}",
        got.len()
    );
    assert!(
        report.is_ok() && report.unknown == 0 && report.receipted > 0,
        "{label}, seed {seed}: {report}\n{}\n{}",
        other.log_tail(),
        logs(group)
    );
}

/// Master kills in each HA test.
const MASTER_KILLS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_member_loses_its_master_while_forwarding() {
    const QUEUE: &str = "/queue/ha-remote";
    let dir = tempfile::tempdir().unwrap();
    let [a, b1, b2] = free_addrs();
    let mut group = start_shared_fs_group(dir.path(), "B", &[b1, b2], &[]);
    let ba = start_broker(
        dir.path(),
        "A",
        a,
        &[connector(&failover_group(&[b1, b2]), 1, "")],
    );
    let history = Arc::new(History::new());
    let on_b = recorder_on("on B", &[b1, b2], QUEUE, &history).await;
    let producer = connect(&quick_failover(&[tcp(a)])).await;
    let flow = Flow {
        producer,
        queue: QUEUE,
        on: on_b,
        history,
    };
    forward_through_master_kills("HA remote", &mut group, &ba, true, flow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_source_loses_its_master_while_forwarding() {
    const QUEUE: &str = "/queue/ha-source";
    let dir = tempfile::tempdir().unwrap();
    let [a1, a2, c] = free_addrs();
    let bc = start_broker(dir.path(), "C", c, &[]);
    let mut group = start_shared_fs_group(dir.path(), "A", &[a1, a2], &[connector(&tcp(c), 1, "")]);
    let history = Arc::new(History::new());
    let on_c = Recorder::start("on C", &tcp(c), QUEUE, history.clone(), true).await;
    let producer = connect(&quick_failover(&[tcp(a1), tcp(a2)])).await;
    let flow = Flow {
        producer,
        queue: QUEUE,
        on: on_c,
        history,
    };
    forward_through_master_kills("HA source", &mut group, &bc, false, flow).await;
}

/// Request/reply across the network (`bridge_temp_destinations`): a requester on A asks over
/// its temporary queue, a service on B answers to the `reply-to` it reads; the reply travels
/// back over the same duplex bridge. Each request gets its one reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_reply_over_a_temporary_queue_crosses_the_network() {
    const SERVICE: &str = "/queue/service";
    const REQUESTS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = free_addrs();
    let bb = start_broker(dir.path(), "B", b, &[]);
    let ba = start_broker(
        dir.path(),
        "A",
        a,
        &[connector(&tcp(b), 1, "duplex = true")],
    );
    let all = [&ba, &bb];
    // The service on B: answers every request to its reply-to, with the request's body.
    let service = connect(&tcp(b)).await;
    let mut requests = service
        .subscribe(SERVICE, haven_client::AckMode::ClientIndividual, &[])
        .await
        .unwrap();
    let answering = tokio::spawn(async move {
        while let Some(m) = requests.next().await {
            let reply_to = m
                .header("reply-to")
                .expect("a request names its reply-to")
                .to_string();
            service
                .send_receipted(&reply_to, &[("persistent", "false")], m.body.clone())
                .await
                .unwrap();
            service.ack(&m).await.unwrap();
        }
    });
    // The requester on A, with its own temporary queue.
    let requester = connect(&tcp(a)).await;
    let mut replies = requester
        .subscribe("/temp-queue/replies", haven_client::AckMode::Auto, &[])
        .await
        .unwrap();
    let mut got = std::collections::BTreeMap::new();
    let mut sent = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(DRAIN_WAIT_MS);
    // Demand for the service and for the reply queue has to cross first: the first requests
    // may wait on A until B's service is known there; keep asking until one is answered.
    while got.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reply crossed the network:\n{}",
            logs_of(&all)
        );
        sent += 1;
        requester
            .send_receipted(
                SERVICE,
                &[("reply-to", "/temp-queue/replies")],
                format!("probe-{sent}"),
            )
            .await
            .unwrap();
        if let Ok(Some(m)) =
            tokio::time::timeout(Duration::from_millis(PROBE_EVERY_MS), replies.next()).await
        {
            *got.entry(String::from_utf8_lossy(&m.body).to_string())
                .or_insert(0) += 1;
        }
    }
    for i in 0..REQUESTS {
        requester
            .send_receipted(
                SERVICE,
                &[("reply-to", "/temp-queue/replies")],
                format!("req-{i}"),
            )
            .await
            .unwrap();
    }
    let want = |got: &std::collections::BTreeMap<String, usize>| {
        (0..REQUESTS).all(|i| got.contains_key(&format!("req-{i}")))
            && (1..=sent).all(|i| got.contains_key(&format!("probe-{i}")))
    };
    while !want(&got) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, replies.next()).await {
            Ok(Some(m)) => {
                *got.entry(String::from_utf8_lossy(&m.body).to_string())
                    .or_insert(0) += 1;
            }
            _ => panic!(
                "{} of {} replies arrived:\n{}",
                got.len(),
                REQUESTS + sent,
                logs_of(&all)
            ),
        }
    }
    // Nothing more comes, and nothing came twice.
    if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(QUIET_MS), replies.next()).await
    {
        panic!("an extra reply: {:?}", String::from_utf8_lossy(&m.body));
    }
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "replies that came twice: {twice:?}");
    answering.abort();
}
