//! The Raft simulation's runtime for openraft: tokio on its paused clock, with the two things a
//! real machine adds and a paused clock does not, drawn from the run's seed.
//!
//! - **Each member's election timeout is drawn at start** from Haven's range, as openraft
//!   draws it in `Raft::new` (once per process) from the runtime's random number generator.
//!   Here that generator is seeded, so a run replays.
//! - **Timer ticks land a little late.** openraft checks the election timeout on a tick every
//!   1.5 heartbeats and sets the next tick from the moment this one fired. On a real machine the
//!   wake-up is late by the scheduler's delay, so members' ticks drift apart. On a paused clock
//!   they do not: members whose ticks fall on the same instant, with timeouts that round up to
//!   the same tick, stand for election at the same instant every time, each votes for itself,
//!   and no one is elected, for ever (seed 40000003388 ran 200 terms like that). Late ticks make
//!   such a run end, but only as slowly as the ticks drift apart, which can take tens of
//!   seconds; what ends it soon is Haven's step back after a split vote
//!   (`haven_raft::split_vote`). [`TICK_LATE_US`] is the scheduler delay given to each tick.
//!
//! Everything else (spawning, sleeps, timeouts, channels) is tokio's, as in Haven.

use openraft::async_runtime::{AsyncRuntime, TokioOneShotSender};
use openraft::{OptionalSend, TokioInstant};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

/// How late a tick may fire: a loaded machine's wake-up delay.
pub const TICK_LATE_US: std::ops::RangeInclusive<u64> = 0..=500;

thread_local! {
    /// The run's timing randomness; a run owns its thread (a current-thread runtime).
    static TIMING: RefCell<Option<Timing>> = const { RefCell::new(None) };
}

struct Timing {
    rng: StdRng,
    /// Off for the former model's exact clock (`raft::Clock::Exact`).
    jitter: bool,
}

/// Seeds this thread's timing for one run; `jitter` off gives the exact clock (ticks exactly on
/// time).
pub fn seed(seed: u64, jitter: bool) {
    TIMING.with(|t| {
        *t.borrow_mut() = Some(Timing {
            rng: StdRng::seed_from_u64(seed),
            jitter,
        })
    });
}

fn draw<T>(f: impl FnOnce(&mut Timing) -> T) -> T {
    TIMING.with(|t| {
        f(t.borrow_mut()
            .as_mut()
            .expect("raft_clock::seed before a run"))
    })
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct SimRuntime;

impl AsyncRuntime for SimRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = StdRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    /// openraft's tick loop is this function's only caller (0.9: `core/tick.rs`).
    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        let late_us = draw(|t| {
            if t.jitter {
                t.rng.gen_range(TICK_LATE_US)
            } else {
                0
            }
        });
        tokio::time::sleep_until(deadline + Duration::from_micros(late_us))
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    /// openraft draws each member's election timeout from this at `Raft::new`, and
    /// `haven_raft::split_vote` its pauses.
    fn thread_rng() -> Self::ThreadLocalRng {
        StdRng::seed_from_u64(draw(|t| t.rng.gen()))
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}
