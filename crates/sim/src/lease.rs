//! The shared store's lock, simulated as a lease, and the `SharedStore` each broker host
//! competes for mastership through.
//!
//! One model covers both production stores: an NFSv4 lock (the server forgets a client's locks
//! when its lease is not renewed) and the PostgreSQL lease row (a master renews `expires_at`;
//! a slave may take an expired row). The lease lives in the storage, next to the disk, and its
//! time is the storage's: simulated monotonic time, which no clock-jump fault moves. Rules:
//!
//! - a grant bumps the epoch and moves the disk's fence in the same step (the epoch lives in
//!   the store), so the deposed master's next write is refused;
//! - the holder must renew within `lease_ms`; a host that is crashed, paused or cut off from
//!   the storage cannot, and loses the lease when it expires;
//! - a crashed holder's session ends at once (the kernel closes its NFS state, the database
//!   drops its connection), so a slave need not wait out the lease;
//! - the holder's own view runs on *its* monotonic clock (tokio time, which the simulation's
//!   wall-clock jumps do not move): it gives up — sets `lost` — once it has not renewed for
//!   `lease_ms - lease_margin_ms`, before the storage can grant the lease to another. Renewal
//!   time is taken when the request is *sent*, which is conservative.
//!
//! A paused host (a stop-the-world pause, SIGSTOP) does nothing: no renewal and no check of
//! its own lease. When it resumes, the requests its clients queued meanwhile arrive, and its
//! core may try to write before its lease check runs: exactly the case fencing exists for.
//!
//! Lock order: the lease's mutex, then the disk's. The disk never calls the lease.

use crate::disk::SimDisk;
use haven_server::ha::{Acquiring, Mastership, SharedStore};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Lease timing, in simulated milliseconds: the same settings as `[ha]` for shared-db, scaled
/// down so a run sees many takeovers.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTimes {
    /// How long a grant or renewal lasts, by the storage's clock.
    pub lease_ms: u64,
    /// How often the master renews, and checks its own lease.
    pub renew_ms: u64,
    /// The master gives up this long before the storage can expire its lease.
    pub lease_margin_ms: u64,
    /// How often a slave tries to take the lease.
    pub poll_ms: u64,
}

impl LeaseTimes {
    pub const SIM: LeaseTimes = LeaseTimes {
        lease_ms: 3_000,
        renew_ms: 500,
        lease_margin_ms: 1_000,
        poll_ms: 200,
    };

    /// The master checks its lease every `renew_ms`, so it notices an unrenewed lease up to
    /// `renew_ms` after `lease_ms - lease_margin_ms`: that must still be before expiry.
    /// (The production config asks for two renewals within the trusted time; see `[ha]`.)
    pub fn check(&self) {
        let trusted = self.lease_ms - self.lease_margin_ms;
        assert!(
            trusted >= 2 * self.renew_ms,
            "{self:?}: renew at least twice per lease"
        );
        assert!(
            self.lease_margin_ms > self.renew_ms,
            "{self:?}: a late lease check would outlive the lease"
        );
    }
}

/// Outcome of one renewal.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    Renewed,
    /// The storage could not be reached: try again; the lease runs down meanwhile.
    Unreachable,
    /// The lease is gone (expired, or a newer master holds it): stop serving now.
    Gone(String),
}

#[derive(Clone, Copy, Debug)]
struct Holder {
    host: usize,
    epoch: u64,
    /// Simulated time the lease expires at, unless renewed.
    expires: Duration,
}

/// One grant, for the per-step invariants and the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub epoch: u64,
    pub host: usize,
    pub at_ms: u64,
}

struct State {
    holder: Option<Holder>,
    /// Every grant, in epoch order (`grants[e - 1]` is epoch `e`).
    grants: Vec<Grant>,
    /// Hosts in a stop-the-world pause.
    paused: Vec<bool>,
    renewals: u64,
    expiries: u64,
}

/// The lease over one shared disk. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct SimLease {
    disk: SimDisk,
    times: LeaseTimes,
    state: Arc<Mutex<State>>,
}

/// The storage's clock: simulated monotonic time (never jumped).
fn storage_now() -> Duration {
    turmoil::sim_elapsed().expect("the lease is used inside the simulation")
}

impl SimLease {
    pub fn new(disk: SimDisk, hosts: usize, times: LeaseTimes) -> SimLease {
        times.check();
        SimLease {
            disk,
            times,
            state: Arc::new(Mutex::new(State {
                holder: None,
                grants: Vec::new(),
                paused: vec![false; hosts],
                renewals: 0,
                expiries: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("sim lease poisoned")
    }

    pub fn times(&self) -> LeaseTimes {
        self.times
    }

    /// Takes the lease for `host` if it is free or expired: returns the new epoch.
    pub fn try_acquire(&self, host: usize) -> Option<u64> {
        let now = storage_now();
        let mut st = self.lock();
        if st.paused[host] || !self.disk.reachable(host) {
            return None;
        }
        if let Some(h) = st.holder {
            if h.expires > now {
                return None;
            }
            st.expiries += 1;
        }
        let epoch = st.grants.len() as u64 + 1;
        // The epoch moves in the store together with the grant.
        self.disk.grant(epoch);
        st.holder = Some(Holder {
            host,
            epoch,
            expires: now + Duration::from_millis(self.times.lease_ms),
        });
        st.grants.push(Grant {
            epoch,
            host,
            at_ms: now.as_millis() as u64,
        });
        Some(epoch)
    }

    /// Extends the lease of the master of `epoch`, if it still holds it.
    pub fn renew(&self, host: usize, epoch: u64) -> Renewal {
        let now = storage_now();
        let mut st = self.lock();
        assert!(!st.paused[host], "a paused host does not renew");
        if !self.disk.reachable(host) {
            return Renewal::Unreachable;
        }
        match st.holder {
            Some(h) if h.epoch == epoch && h.expires > now => {
                assert_eq!(h.host, host, "epoch {epoch} held by another host");
                st.holder = Some(Holder {
                    expires: now + Duration::from_millis(self.times.lease_ms),
                    ..h
                });
                st.renewals += 1;
                Renewal::Renewed
            }
            Some(h) if h.epoch == epoch => Renewal::Gone(format!(
                "lease of epoch {epoch} expired {} ms ago",
                (now - h.expires).as_millis()
            )),
            Some(h) => Renewal::Gone(format!(
                "epoch {} (host {}) holds the lease; this master's epoch is {epoch}",
                h.epoch, h.host
            )),
            None => Renewal::Gone(format!("lease of epoch {epoch} was released")),
        }
    }

    /// The master of `epoch` stepped down: the lease is free at once (if it can tell the
    /// storage; otherwise the lease expires on its own).
    pub fn release(&self, host: usize, epoch: u64) {
        let mut st = self.lock();
        if !self.disk.reachable(host) {
            return;
        }
        if st.holder.is_some_and(|h| h.epoch == epoch) {
            st.holder = None;
        }
    }

    /// Host `host` crashed: its session with the storage ends, and so does its lease.
    pub fn host_crashed(&self, host: usize) {
        let mut st = self.lock();
        if st.holder.is_some_and(|h| h.host == host) {
            st.holder = None;
        }
    }

    /// Starts or ends a stop-the-world pause of `host`.
    pub fn set_paused(&self, host: usize, paused: bool) {
        self.lock().paused[host] = paused;
    }

    pub fn paused(&self, host: usize) -> bool {
        self.lock().paused[host]
    }

    /// The host epoch `epoch` was granted to.
    pub fn granted_to(&self, epoch: u64) -> Option<usize> {
        let st = self.lock();
        let i = usize::try_from(epoch).ok()?.checked_sub(1)?;
        st.grants.get(i).map(|g| g.host)
    }

    pub fn grants(&self) -> Vec<Grant> {
        self.lock().grants.clone()
    }

    /// (renewals, expired leases taken over) so far.
    pub fn counts(&self) -> (u64, u64) {
        let st = self.lock();
        (st.renewals, st.expiries)
    }
}

/// One broker host's view of the shared store: what `run_shared` acquires mastership from.
pub struct SimSharedStore {
    pub lease: SimLease,
    pub disk: SimDisk,
    pub host: usize,
}

/// The same for every master of the store (`haven-store` in CONNECTED).
pub const SHARED_STORE_ID: &str = "sim-shared";

impl SharedStore for SimSharedStore {
    fn acquire(&self) -> Acquiring<'_> {
        Box::pin(async move {
            let times = self.lease.times();
            let epoch = loop {
                if let Some(epoch) = self.lease.try_acquire(self.host) {
                    break epoch;
                }
                tokio::time::sleep(Duration::from_millis(times.poll_ms)).await;
            };
            let (lost_tx, lost_rx) = watch::channel(None);
            let keeper = tokio::spawn(keep_lease(self.lease.clone(), self.host, epoch, lost_tx));
            Ok(Mastership {
                epoch,
                log: self.disk.fenced_store(epoch, self.host),
                store_id: SHARED_STORE_ID.to_string(),
                lost: lost_rx,
                hold: Box::new(Hold {
                    lease: self.lease.clone(),
                    host: self.host,
                    epoch,
                    keeper,
                }),
            })
        })
    }

    fn describe(&self) -> String {
        format!("sim shared disk (host {})", self.host)
    }
}

/// Held while master: dropping it stops renewing and releases the lease.
struct Hold {
    lease: SimLease,
    host: usize,
    epoch: u64,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.keeper.abort();
        self.lease.release(self.host, self.epoch);
    }
}

/// Renews the lease every `renew_ms` and sets `lost` the moment this master can no longer
/// trust it. Timed by tokio's clock — monotonic — never by the broker's (jumpable) wall clock.
async fn keep_lease(lease: SimLease, host: usize, epoch: u64, lost: watch::Sender<Option<String>>) {
    let times = lease.times();
    let trusted = Duration::from_millis(times.lease_ms - times.lease_margin_ms);
    // The grant's request was sent just now.
    let mut renewed_at = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(times.renew_ms));
    tick.tick().await;
    loop {
        tick.tick().await;
        if lease.paused(host) {
            continue;
        }
        let since = renewed_at.elapsed();
        if since >= trusted {
            let _ = lost.send(Some(format!(
                "lease of epoch {epoch} not renewed for {} ms",
                since.as_millis()
            )));
            return;
        }
        let sent = Instant::now();
        match lease.renew(host, epoch) {
            Renewal::Renewed => renewed_at = sent,
            Renewal::Unreachable => {}
            Renewal::Gone(reason) => {
                let _ = lost.send(Some(reason));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleep_ms(ms: u64) -> tokio::time::Sleep {
        tokio::time::sleep(Duration::from_millis(ms))
    }

    #[test]
    fn a_lease_is_exclusive_until_it_expires_and_each_grant_moves_the_fence() {
        let mut sim = turmoil::Builder::new()
            .tick_duration(Duration::from_millis(1))
            .build();
        let disk = SimDisk::new("d", 1);
        let lease = SimLease::new(disk.clone(), 2, LeaseTimes::SIM);
        let lease_ms = LeaseTimes::SIM.lease_ms;
        sim.client("test", async move {
            assert_eq!(lease.try_acquire(0), Some(1));
            assert_eq!(lease.try_acquire(1), None, "held");
            sleep_ms(lease_ms - 1).await;
            assert_eq!(lease.renew(0, 1), Renewal::Renewed);
            sleep_ms(lease_ms - 1).await;
            assert_eq!(lease.try_acquire(1), None, "renewed, not expired yet");
            sleep_ms(2).await;
            assert_eq!(lease.try_acquire(1), Some(2), "expired: taken over");
            assert!(matches!(lease.renew(0, 1), Renewal::Gone(_)));
            // The deposed epoch is fenced at the store.
            let refused = disk
                .fenced_store(1, 0)
                .open(&mut |_, _| Ok(()))
                .map(|_| ())
                .expect_err("a stale epoch cannot open")
                .to_string();
            assert!(refused.contains("newer master"), "{refused}");
            // A crashed holder's session ends at once.
            lease.host_crashed(1);
            assert_eq!(lease.try_acquire(0), Some(3));
            disk.cut_off(0);
            assert_eq!(lease.renew(0, 3), Renewal::Unreachable);
            disk.reconnect(0);
            assert_eq!(lease.renew(0, 3), Renewal::Renewed);
            assert_eq!(lease.granted_to(2), Some(1));
            Ok(())
        });
        sim.run().expect("lease test");
    }
}
