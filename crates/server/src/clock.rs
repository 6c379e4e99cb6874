//! Wall-clock time, behind a trait.
//!
//! The engine reads no clock: the core passes it `now_ms` (expiry, scheduling, producer
//! forgetting). Where that time comes from is an edge decision: the system clock in
//! production, the simulator's clock (which a test can make jump) under simulation. Timeouts
//! and intervals use tokio's clock, which the simulator already controls.

use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The operating system's wall clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}
