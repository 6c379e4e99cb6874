//! openraft's async runtime for Haven: tokio, except that no RPC is given less than
//! [`RPC_TIMEOUT_FLOOR_MS`].
//!
//! openraft 0.9 gives every append, vote and leadership confirmation the heartbeat interval as
//! its timeout, and a follower's answer to an append includes its fsync. At Haven's default
//! heartbeat (50 ms, chosen for sub-second failover) a disk busy for 50 ms (a new leader reading
//! a deep backlog back in, another process syncing) fails appends that would have succeeded,
//! and the group churns: a new leader cannot confirm its leadership, followers stand, and so
//! on. The floor decouples the time an RPC may take from how often heartbeats go out. It does
//! not delay failover: followers stand on their own election timers, and a leader steps down
//! when no majority has answered for 3 election timeouts (`node.rs`), whatever its RPCs wait.

use openraft::{AsyncRuntime, TokioRuntime};
use std::future::Future;
use std::time::Duration;

/// The least time an RPC to a peer is given.
pub const RPC_TIMEOUT_FLOOR_MS: u64 = 500;

/// `duration`, or the floor if longer.
pub fn rpc_timeout(duration: Duration) -> Duration {
    duration.max(Duration::from_millis(RPC_TIMEOUT_FLOOR_MS))
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct HavenRuntime;

type T = TokioRuntime;

impl AsyncRuntime for HavenRuntime {
    type JoinError = <T as AsyncRuntime>::JoinError;
    type JoinHandle<R: openraft::OptionalSend + 'static> = <T as AsyncRuntime>::JoinHandle<R>;
    type Sleep = <T as AsyncRuntime>::Sleep;
    type Instant = <T as AsyncRuntime>::Instant;
    type TimeoutError = <T as AsyncRuntime>::TimeoutError;
    type Timeout<R, F: Future<Output = R> + openraft::OptionalSend> =
        <T as AsyncRuntime>::Timeout<R, F>;
    type ThreadLocalRng = <T as AsyncRuntime>::ThreadLocalRng;
    type OneshotSender<V: openraft::OptionalSend> = <T as AsyncRuntime>::OneshotSender<V>;
    type OneshotReceiverError = <T as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<V: openraft::OptionalSend> = <T as AsyncRuntime>::OneshotReceiver<V>;

    fn spawn<F>(future: F) -> Self::JoinHandle<F::Output>
    where
        F: Future + openraft::OptionalSend + 'static,
        F::Output: openraft::OptionalSend + 'static,
    {
        T::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        T::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        T::sleep_until(deadline)
    }

    /// Every RPC timeout openraft sets goes through here (replication, votes, leadership
    /// confirmation, snapshot chunks).
    fn timeout<R, F: Future<Output = R> + openraft::OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        T::timeout(rpc_timeout(duration), future)
    }

    fn timeout_at<R, F: Future<Output = R> + openraft::OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        T::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        T::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        T::thread_rng()
    }

    fn oneshot<V>() -> (Self::OneshotSender<V>, Self::OneshotReceiver<V>)
    where
        V: openraft::OptionalSend,
    {
        T::oneshot()
    }
}
