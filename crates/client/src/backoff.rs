//! How long the failover transport waits between passes over its broker list.
//!
//! ActiveMQ's rule: the first pass after a failure starts at once; after each pass that found
//! no broker it waits `initialReconnectDelay`, multiplied by `backOffMultiplier` after every
//! further failed pass when `useExponentialBackOff` is on, never more than `maxReconnectDelay`,
//! plus a random jitter of up to `reconnectDelayJitter`. The attempt limit counts passes.

use std::future::Future;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::uri::FailoverOptions;
use crate::ClientError;

pub(crate) struct Backoff {
    initial_ms: u64,
    max_ms: u64,
    exponential: bool,
    multiplier: f64,
    jitter_ms: u64,
    /// Failed passes so far in this episode.
    failed_passes: u64,
    rng: StdRng,
}

impl Backoff {
    pub(crate) fn new(o: &FailoverOptions, seed: u64) -> Backoff {
        Backoff {
            initial_ms: o.initial_reconnect_delay_ms,
            max_ms: o.max_reconnect_delay_ms.max(o.initial_reconnect_delay_ms),
            exponential: o.use_exponential_back_off,
            multiplier: o.back_off_multiplier,
            jitter_ms: o.reconnect_delay_jitter_ms,
            failed_passes: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Records a failed pass and returns how long to wait before the next one.
    pub(crate) fn failed_pass(&mut self) -> u64 {
        let exponent = if self.exponential {
            self.failed_passes
        } else {
            0
        };
        self.failed_passes += 1;
        // powi on f64 saturates to infinity, which `min` then clamps: no overflow at any count.
        let exponent = i32::try_from(exponent).unwrap_or(i32::MAX);
        let base =
            (self.initial_ms as f64 * self.multiplier.powi(exponent)).min(self.max_ms as f64);
        let jitter = if self.jitter_ms > 0 {
            self.rng.gen_range(0..=self.jitter_ms)
        } else {
            0
        };
        (base as u64).saturating_add(jitter)
    }

    pub(crate) fn failed_passes(&self) -> u64 {
        self.failed_passes
    }
}

/// One reconnect episode: passes over `candidates()` calling `dial` on each until one
/// succeeds, sleeping the back-off between passes, until `limit` passes failed (-1: never)
/// or `stop` turns true. Generic over the dialer so tests drive it with a paused clock.
pub(crate) async fn reconnect<T, F, Fut>(
    options: &FailoverOptions,
    limit: i64,
    seed: u64,
    mut candidates: impl FnMut() -> Vec<String>,
    mut dial: F,
    mut stop: watch::Receiver<bool>,
) -> Result<(T, String), ClientError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let mut backoff = Backoff::new(options, seed);
    loop {
        let list = candidates();
        let mut last_error = ClientError::Closed;
        for broker in &list {
            if *stop.borrow() {
                return Err(ClientError::Closed);
            }
            match dial(broker.clone()).await {
                Ok(t) => return Ok((t, broker.clone())),
                Err(e) => {
                    tracing::debug!(broker, error = %e, "connect attempt failed");
                    last_error = e;
                }
            }
        }
        let delay_ms = backoff.failed_pass();
        let passes = backoff.failed_passes();
        if attempts_exhausted(limit, passes) {
            return Err(ClientError::NoBroker {
                brokers: list,
                passes,
                last_error: last_error.to_string(),
            });
        }
        let warn_every = options.warn_after_reconnect_attempts;
        if warn_every > 0 && passes.is_multiple_of(warn_every) {
            tracing::warn!(passes, error = %last_error, "still no broker reachable");
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return Err(ClientError::Closed),
            _ = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
        }
    }
}

/// Whether `failed_passes` has used up `limit` (-1: never).
pub(crate) fn attempts_exhausted(limit: i64, failed_passes: u64) -> bool {
    limit >= 0 && failed_passes > limit as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_delays_are_capped() {
        let o = FailoverOptions {
            initial_reconnect_delay_ms: 10,
            max_reconnect_delay_ms: 100,
            ..FailoverOptions::default()
        };
        let mut b = Backoff::new(&o, 1);
        let delays: Vec<u64> = (0..6).map(|_| b.failed_pass()).collect();
        assert_eq!(delays, vec![10, 20, 40, 80, 100, 100]);
        for _ in 0..10_000 {
            assert_eq!(b.failed_pass(), 100);
        }
    }

    #[test]
    fn constant_delay_and_jitter_bounds() {
        let o = FailoverOptions {
            initial_reconnect_delay_ms: 50,
            use_exponential_back_off: false,
            reconnect_delay_jitter_ms: 7,
            ..FailoverOptions::default()
        };
        let mut b = Backoff::new(&o, 42);
        let delays: Vec<u64> = (0..200).map(|_| b.failed_pass()).collect();
        assert!(delays.iter().all(|d| (50..=57).contains(d)), "{delays:?}");
        assert!(delays.iter().any(|d| *d != delays[0]), "jitter varies");
    }

    #[test]
    fn attempt_limits() {
        assert!(!attempts_exhausted(-1, u64::MAX));
        assert!(!attempts_exhausted(0, 0));
        assert!(attempts_exhausted(0, 1));
        assert!(!attempts_exhausted(3, 3));
        assert!(attempts_exhausted(3, 4));
    }

    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    /// Runs an episode against brokers that never answer and returns when each pass started
    /// (ms after the start, on tokio's paused clock) and how it ended.
    async fn failing_episode(
        options: FailoverOptions,
        limit: i64,
    ) -> (Vec<u64>, Result<((), String), ClientError>) {
        let start = Instant::now();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let seen = starts.clone();
        let (_stop_tx, stop) = watch::channel(false);
        let result = reconnect(
            &options,
            limit,
            7,
            || vec!["tcp://a:1".to_string(), "tcp://b:2".to_string()],
            move |broker| {
                let seen = seen.clone();
                async move {
                    if broker == "tcp://a:1" {
                        seen.lock()
                            .unwrap()
                            .push(start.elapsed().as_millis() as u64);
                    }
                    Err::<(), _>(ClientError::Closed)
                }
            },
            stop,
        )
        .await;
        let starts = starts.lock().unwrap().clone();
        (starts, result)
    }

    #[tokio::test(start_paused = true)]
    async fn passes_follow_the_exponential_back_off_on_a_paused_clock() {
        let options = FailoverOptions {
            initial_reconnect_delay_ms: 10,
            max_reconnect_delay_ms: 100,
            ..FailoverOptions::default()
        };
        let (starts, result) = failing_episode(options, 6).await;
        // First pass at once, then 10, 20, 40, 80, 100, 100 ms apart.
        assert_eq!(starts, vec![0, 10, 30, 70, 150, 250, 350]);
        match result {
            Err(ClientError::NoBroker {
                passes, brokers, ..
            }) => {
                assert_eq!(passes, 7);
                assert_eq!(brokers.len(), 2);
            }
            other => panic!("expected NoBroker, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn constant_delay_without_exponential_back_off() {
        let options = FailoverOptions {
            initial_reconnect_delay_ms: 250,
            use_exponential_back_off: false,
            ..FailoverOptions::default()
        };
        let (starts, result) = failing_episode(options, 3).await;
        assert_eq!(starts, vec![0, 250, 500, 750]);
        assert!(matches!(
            result,
            Err(ClientError::NoBroker { passes: 4, .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_attempts_means_one_pass_and_success_stops_the_episode() {
        let (starts, result) = failing_episode(FailoverOptions::default(), 0).await;
        assert_eq!(starts, vec![0]);
        assert!(matches!(
            result,
            Err(ClientError::NoBroker { passes: 1, .. })
        ));

        let tries = Arc::new(Mutex::new(0u32));
        let counted = tries.clone();
        let (_stop_tx, stop) = watch::channel(false);
        let start = Instant::now();
        let (value, broker) = reconnect(
            &FailoverOptions::default(),
            -1,
            1,
            || vec!["tcp://x:1".to_string()],
            move |_| {
                let counted = counted.clone();
                async move {
                    let mut n = counted.lock().unwrap();
                    *n += 1;
                    if *n < 4 {
                        Err(ClientError::Closed)
                    } else {
                        Ok(*n)
                    }
                }
            },
            stop,
        )
        .await
        .unwrap();
        assert_eq!((value, broker.as_str()), (4, "tcp://x:1"));
        assert_eq!(start.elapsed().as_millis(), 10 + 20 + 40);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_ends_an_endless_episode() {
        let (stop_tx, stop) = watch::channel(false);
        let episode = tokio::spawn(async move {
            reconnect(
                &FailoverOptions::default(),
                -1,
                1,
                || vec!["tcp://x:1".to_string()],
                |_| async { Err::<(), _>(ClientError::Closed) },
                stop,
            )
            .await
        });
        tokio::time::sleep(Duration::from_secs(120)).await;
        stop_tx.send_replace(true);
        assert!(matches!(episode.await.unwrap(), Err(ClientError::Closed)));
    }
}
