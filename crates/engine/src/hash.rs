//! The engine's hash maps: keyed by a per-process secret, reproducible when a seed is given.
//!
//! Why not std's `RandomState`: its keys differ on every map and every run, so the order in
//! which the engine walks a map (a connection's in-flight messages when it closes, its
//! subscriptions) differs between two runs of the same input — and the deterministic
//! simulation could not replay a seed. Why not a fixed key: map keys come from clients
//! (subscription ids, transaction names, destinations), and a known hash key lets a client
//! craft colliding keys (HashDoS). So every map hashes a secret 64-bit prefix, then the key,
//! with std's SipHash: the prefix is random per process in production, and set from the
//! simulation's seed (`set_seed`) before a simulated broker starts.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

pub type HashMap<K, V> = std::collections::HashMap<K, V, Seeded>;

static FIXED: AtomicU64 = AtomicU64::new(0);
static FIXED_SET: AtomicBool = AtomicBool::new(false);
static RANDOM: OnceLock<u64> = OnceLock::new();

/// Makes every map created from now on hash with `seed` (for simulations: the same seed, the
/// same iteration order). Production never calls it and gets a random secret.
pub fn set_seed(seed: u64) {
    FIXED.store(seed, Ordering::SeqCst);
    FIXED_SET.store(true, Ordering::SeqCst);
}

fn seed() -> u64 {
    if FIXED_SET.load(Ordering::SeqCst) {
        return FIXED.load(Ordering::SeqCst);
    }
    // A random secret per process, from the OS by way of RandomState.
    *RANDOM.get_or_init(|| RandomState::new().build_hasher().finish())
}

#[derive(Clone, Debug)]
pub struct Seeded {
    prefix: u64,
}

impl Default for Seeded {
    fn default() -> Seeded {
        Seeded { prefix: seed() }
    }
}

impl BuildHasher for Seeded {
    type Hasher = DefaultHasher;
    fn build_hasher(&self) -> DefaultHasher {
        let mut h = DefaultHasher::new();
        h.write_u64(self.prefix);
        h
    }
}
