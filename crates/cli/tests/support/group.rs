//! A master/slave group of broker processes sharing one store: which of them serves, waiting
//! for a (new) master, and their logs for failure messages. Include with
//! `#[path = "support/group.rs"] mod group;`, beside `support/traffic.rs` as `mod traffic`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use haven_testkit::{stomp_connect_probe, BrokerProcess};

/// Bound on a slave becoming master after the master died or lost its store.
pub const TAKEOVER_WAIT_MS: u64 = 60_000;
/// How long a probe waits for CONNECTED from a broker.
pub const PROBE_TIMEOUT_MS: u64 = 500;

/// The brokers among `candidates` that answer CONNECT right now (slaves do not listen).
pub fn serving_among(brokers: &mut [BrokerProcess], candidates: &[usize]) -> Vec<usize> {
    candidates
        .iter()
        .copied()
        .filter(|&i| {
            brokers[i].is_running()
                && matches!(
                    stomp_connect_probe(brokers[i].addr(), Duration::from_millis(PROBE_TIMEOUT_MS)),
                    Ok(c) if c == "CONNECTED"
                )
        })
        .collect()
}

/// The brokers that answer CONNECT right now.
pub fn serving(brokers: &mut [BrokerProcess]) -> Vec<usize> {
    let all: Vec<usize> = (0..brokers.len()).collect();
    serving_among(brokers, &all)
}

/// Waits until exactly one broker serves, and returns it. Two serving at once fails the test.
pub fn wait_master(brokers: &mut [BrokerProcess]) -> usize {
    let all: Vec<usize> = (0..brokers.len()).collect();
    wait_master_among(brokers, &all)
}

/// Waits until exactly one of `candidates` serves, and returns it; two of them at once fail
/// the test. (Others may still serve: a deposed leader that has not noticed yet.)
pub fn wait_master_among(brokers: &mut [BrokerProcess], candidates: &[usize]) -> usize {
    let deadline = Instant::now() + Duration::from_millis(TAKEOVER_WAIT_MS);
    loop {
        let s = serving_among(brokers, candidates);
        assert!(
            s.len() <= 1,
            "two brokers serve the same store at once: {s:?}"
        );
        if let [m] = s[..] {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "none of {candidates:?} became master:\n{}",
            logs(brokers)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `wait_master` off the async threads.
pub async fn wait_master_async(brokers: &mut Vec<BrokerProcess>) -> usize {
    let mut owned = std::mem::take(brokers);
    let (m, owned) = tokio::task::spawn_blocking(move || {
        let m = wait_master(&mut owned);
        (m, owned)
    })
    .await
    .expect("blocking task");
    *brokers = owned;
    m
}

/// How many times a broker became master, from its log.
pub fn terms(b: &BrokerProcess) -> usize {
    std::fs::read_to_string(b.log_path())
        .unwrap_or_default()
        .matches("master: recovering the store")
        .count()
}

/// Every broker's log tail, for failure messages.
pub fn logs(brokers: &[BrokerProcess]) -> String {
    brokers
        .iter()
        .map(|b| format!("--- {} ---\n{}", b.log_path().display(), b.log_tail()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Between slave respawns and the next kill: long enough for the slaves to be waiting on the
/// store, so one takes over at once.
pub const REJOIN_SETTLE_MS: u64 = 500;

/// Kills the master with `kill -9`, waits for another broker to take over, and starts the old
/// master again: it rejoins as a slave.
pub fn kill_master_and_rejoin(b: &mut [BrokerProcess]) {
    let master = wait_master(b);
    b[master].kill9().expect("kill -9");
    let next = wait_master(b);
    assert_ne!(next, master);
    b[master].respawn().expect("respawn as slave");
}

/// Kills the master, and the next one as soon as it serves. Returns both.
pub fn kill_two_masters_in_a_row(b: &mut [BrokerProcess]) -> (usize, usize) {
    let first = wait_master(b);
    b[first].kill9().expect("kill -9 first master");
    let second = wait_master(b);
    b[second].kill9().expect("kill -9 second master");
    (first, second)
}

/// After `kill_two_masters_in_a_row` (and a third broker took over): both old masters rejoin
/// as slaves, then the third master dies too and one of them must take over.
pub fn rejoin_both_then_kill_the_third(b: &mut [BrokerProcess], first: usize, second: usize) {
    let third = wait_master(b);
    assert!(third != first && third != second);
    b[first].respawn().expect("respawn first");
    b[second].respawn().expect("respawn second");
    std::thread::sleep(Duration::from_millis(REJOIN_SETTLE_MS));
    b[third].kill9().expect("kill -9 third master");
    let fourth = wait_master(b);
    assert!(fourth == first || fourth == second);
}

/// Runs failover traffic (receipted producers, two pipelined ones, one consumer) while the
/// serving broker is killed `kills` times, each after a random interval from `kill_after_ms`
/// (seeded by `seed`); each killed broker is started again and rejoins. Returns the
/// exactly-once report and the brokers.
pub async fn kill_masters_under_load(
    brokers: Vec<BrokerProcess>,
    queue: &'static str,
    kills: usize,
    kill_after_ms: std::ops::Range<u64>,
    seed: u64,
) -> (haven_testkit::Report, Vec<BrokerProcess>) {
    use crate::traffic::{blocking, quick_failover, url_of, Traffic};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let brokers = std::sync::Arc::new(tokio::sync::Mutex::new(brokers));
    let t = Traffic::start(&uri, queue).await;
    let pipelined = t.spawn_pipelined(queue, 2);
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(kill_after_ms.clone()))).await;
        let brokers = brokers.clone();
        blocking(move || kill_master_and_rejoin(&mut brokers.blocking_lock())).await;
    }
    let report = t.finish_exactly_once(pipelined).await;
    let brokers = std::sync::Arc::try_unwrap(brokers)
        .unwrap_or_else(|_| panic!("the kill tasks have finished"))
        .into_inner();
    (report, brokers)
}

/// Bound on each stored message reaching a new subscriber.
pub const DELIVERY_WAIT_MS: u64 = 10_000;
/// How long a subscriber waits to be sure no further message comes.
pub const QUIET_MS: u64 = 500;

/// Subscribes to `queue` (auto ack) on `conn` and receives `n` messages; returns their bodies
/// and the subscription.
pub async fn receive_bodies(
    conn: &haven_client::Connection,
    queue: &str,
    n: usize,
) -> (haven_client::Subscription, Vec<String>) {
    let mut sub = conn
        .subscribe(queue, haven_client::AckMode::Auto, &[])
        .await
        .expect("subscribe");
    let mut got = Vec::new();
    while got.len() < n {
        let msg = tokio::time::timeout(Duration::from_millis(DELIVERY_WAIT_MS), sub.next())
            .await
            .expect("stored message delivered")
            .expect("subscription open");
        got.push(String::from_utf8_lossy(&msg.body).into_owned());
    }
    (sub, got)
}

/// Whether nothing more arrives on `sub` for `QUIET_MS`.
pub async fn nothing_more(sub: &mut haven_client::Subscription) -> bool {
    tokio::time::timeout(Duration::from_millis(QUIET_MS), sub.next())
        .await
        .is_err()
}
