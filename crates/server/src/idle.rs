//! What the broker does once it has been idle a while: hands back memory it freed.
//!
//! Why: mimalloc returns what a thread freed to the kernel only while that thread allocates,
//! so a broker that goes quiet after a burst keeps it. Measured (`bench/idle_memory.sh`): 8 s
//! of 64 KiB messages, then 3 s idle, left 82–90 MiB resident; collecting when idle left
//! 55–62 MiB (docs/PERFORMANCE.md). The server crate does not choose the allocator, the
//! binary does, so the binary installs the collection here (`set_idle_hook`); without one,
//! nothing happens.

use std::sync::OnceLock;

static IDLE_HOOK: OnceLock<fn()> = OnceLock::new();

/// Installs what `idle` runs, once per process (a second call is ignored).
pub fn set_idle_hook(hook: fn()) {
    let _ = IDLE_HOOK.set(hook);
}

/// Runs the hook on the calling thread: allocators keep their free memory per thread, so each
/// thread that went idle calls it for itself.
pub(crate) fn idle() {
    if let Some(hook) = IDLE_HOOK.get() {
        hook();
    }
}

/// Tells whether a thread on a periodic timer (the core) has become idle: `tick` is called on
/// the timer, `busy` whenever work arrives; `tick` answers true once per quiet spell, on the
/// first tick of it that saw no work since the tick before.
#[derive(Debug, Default)]
pub(crate) struct IdleSpell {
    busy: bool,
    collected: bool,
}

impl IdleSpell {
    pub(crate) fn busy(&mut self) {
        self.busy = true;
        self.collected = false;
    }

    /// Whether the spell reported by `tick` is still on (no work since).
    pub(crate) fn is_quiet(&self) -> bool {
        self.collected
    }

    pub(crate) fn tick(&mut self) -> bool {
        let quiet = !self.busy;
        self.busy = false;
        if quiet && !self.collected {
            self.collected = true;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_spell_is_reported_once_and_work_starts_a_new_one() {
        let mut s = IdleSpell::default();
        s.busy();
        assert!(!s.tick(), "the tick after work is not idle");
        assert!(s.tick(), "a whole quiet tick is");
        assert!(s.is_quiet());
        assert!(!s.tick() && !s.tick(), "once per spell");
        assert!(s.is_quiet(), "the spell goes on");
        s.busy();
        assert!(!s.is_quiet(), "work ends it");
        assert!(!s.tick());
        assert!(s.tick(), "a new spell after new work");
    }
}
