//! How many SEND body bytes one connection may have handed to the core that the core has not
//! yet taken off its queue.
//!
//! The core's queue is bounded in commands (shared by every connection), not in bytes, and a
//! connection reads its socket as fast as the client writes. A producer with many RECEIPTs
//! outstanding (the bench's default: 16 windows of 100 SENDs) could so put 1,600 SENDs into
//! the queue at once: with 64 KiB bodies, 100 MiB outside every memory bound, waiting while the
//! core waited for a sync (scenario (f): peak RSS 280–350 MiB; 67 MiB with one window).
//! With this window a connection stops reading at `SEND_WINDOW_BYTES_MAX` and TCP pushes back
//! on the client, as it does for producer flow control; the core's own bounds (unsynced bytes,
//! memory, parked SENDs) take over from there.
//!
//! Each SEND travels with a [`SendCredit`] for its bytes, released (dropped) as the core takes
//! it off the queue, so nothing is counted twice and nothing leaks when the core is gone.

use haven_engine::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// SEND body bytes one connection may have queued for the core: 8 MiB. 1 KiB producers never
/// reach it (the bench's 1,600 SENDs in flight are 1.6 MiB); 64 KiB ones stop at 128.
pub(crate) const SEND_WINDOW_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The body bytes of `cmd` if it is a SEND: what the window (and the core's parked-SEND bound)
/// counts.
pub(crate) fn send_body_bytes(cmd: &Command) -> Option<usize> {
    match cmd {
        Command::Send { message, .. } => Some(message.body.len()),
        _ => None,
    }
}

#[derive(Debug, Default)]
pub(crate) struct SendWindow {
    bytes: AtomicUsize,
    /// Signalled when the queued bytes fall back below the maximum.
    reopened: Notify,
}

impl SendWindow {
    /// Counts `bytes` as queued; the returned credit gives them back when dropped.
    pub fn take(self: &Arc<Self>, bytes: usize) -> SendCredit {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        SendCredit {
            window: self.clone(),
            bytes,
        }
    }

    /// Whether the connection must stop reading until the core takes what is queued.
    pub fn is_full(&self) -> bool {
        self.bytes.load(Ordering::Acquire) >= SEND_WINDOW_BYTES_MAX
    }

    /// Resolves once the window reopened (at once if it did since the last call: the
    /// notification waits for its waiter).
    pub async fn reopened(&self) {
        self.reopened.notified().await;
    }

    #[cfg(test)]
    fn queued_bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}

/// One SEND's bytes in a connection's [`SendWindow`]; dropping it gives them back.
#[derive(Debug)]
pub(crate) struct SendCredit {
    window: Arc<SendWindow>,
    bytes: usize,
}

impl Drop for SendCredit {
    fn drop(&mut self) {
        let before = self.window.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        assert!(before >= self.bytes, "send window credit returned twice");
        if before >= SEND_WINDOW_BYTES_MAX && before - self.bytes < SEND_WINDOW_BYTES_MAX {
            self.window.reopened.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_window_closes_at_its_maximum_and_reopens_as_the_core_takes_sends() {
        let w = Arc::new(SendWindow::default());
        let half = SEND_WINDOW_BYTES_MAX / 2;
        let a = w.take(half);
        assert!(!w.is_full());
        let b = w.take(half);
        assert!(w.is_full(), "full at exactly the maximum");
        let waiter = {
            let w = w.clone();
            tokio::spawn(async move { w.reopened().await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "reopened while still full");
        drop(a);
        assert!(!w.is_full());
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was woken")
            .unwrap();
        drop(b);
        assert_eq!(w.queued_bytes(), 0);
    }

    #[tokio::test]
    async fn a_reopening_before_the_wait_is_not_lost() {
        let w = Arc::new(SendWindow::default());
        let all = w.take(SEND_WINDOW_BYTES_MAX);
        assert!(w.is_full());
        drop(all); // the core takes it between the connection's check and its wait
        tokio::time::timeout(Duration::from_secs(5), w.reopened())
            .await
            .expect("the reopening was remembered");
    }
}
