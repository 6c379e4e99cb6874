//! The idle hook (`haven_server::set_idle_hook`, which the binary points at its allocator's
//! collection): the core runs it once it has had no command for a maintenance interval, again
//! after each new spell of work, and not while commands keep coming.

mod common;

use common::Broker;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static CALLS: AtomicUsize = AtomicUsize::new(0);

fn count() {
    CALLS.fetch_add(1, Ordering::SeqCst);
}

const TICK_MS: u64 = 100;

/// Waits until `cond` holds, for at most 10 s (a loaded machine delays the core's ticks).
async fn eventually(cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(TICK_MS)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hook_runs_when_the_broker_goes_quiet_after_work() {
    haven_server::set_idle_hook(count);
    let broker = Broker::start_with(|c| c.journal.maintenance_interval_ms = TICK_MS).await;
    let mut c = broker.client().await;
    assert!(
        eventually(|| CALLS.load(Ordering::SeqCst) >= 1).await,
        "an idle broker ran the hook"
    );
    // The start and the CONNECT each end in a quiet spell; after them the count must stop
    // growing while nothing happens (a hook run on every tick never would).
    let mut quiet = CALLS.load(Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(5 * TICK_MS)).await;
        let now = CALLS.load(Ordering::SeqCst);
        if now == quiet {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "once per quiet spell, not every tick: {now} runs"
        );
        quiet = now;
    }

    c.put("/queue/idle", "work", &[]).await;
    assert!(
        eventually(|| CALLS.load(Ordering::SeqCst) > quiet).await,
        "a new quiet spell after the SEND ran it again"
    );
    c.disconnect().await;
    broker.stop().await;
}
