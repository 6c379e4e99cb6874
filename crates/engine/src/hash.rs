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
//!
//! Keys the broker assigns itself (seqs, delivery tags, connection ids) cannot be crafted by a
//! client, so their maps (`IdMap`) skip the secret and SipHash (see there).

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

/// A map keyed by a number the broker assigns itself: a message's seq, a delivery tag, a
/// connection id. No client chooses these keys, so they need no secret against crafted
/// collisions, and one multiplication hashes them where SipHash over the secret and the key
/// cost 5–7% of a forwarding broker's CPU (issue 8's profile). Iteration order is the same on
/// every run, as the simulation needs.
pub type IdMap<V> = std::collections::HashMap<u64, V, IdHash>;

#[derive(Clone, Copy, Debug, Default)]
pub struct IdHash;

impl BuildHasher for IdHash {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

/// Multiplies by an odd constant (Fibonacci hashing, as rustc's FxHash): consecutive keys land
/// on distinct low bits (the bucket index) and spread over the high bits (the control byte).
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

const ID_HASH_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only reached through a key type other than u64; correct, if slower.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(ID_HASH_MULTIPLIER);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod id_hash_tests {
    use super::*;
    use std::collections::HashSet;

    /// Consecutive ids (how seqs and tags arrive) fill distinct buckets of a power-of-two
    /// table: the low bits of their hashes are all different.
    #[test]
    fn consecutive_ids_spread_over_the_buckets() {
        let buckets = 1u64 << 12;
        let base = 7u64 << 20; // as connection ids are: a boot id above a counter
        let low: HashSet<u64> = (0..buckets)
            .map(|i| IdHash.hash_one(base + i) & (buckets - 1))
            .collect();
        assert_eq!(low.len() as u64, buckets);
        // The control byte (top 7 bits) differs too, not one value for all.
        let top: HashSet<u64> = (0..buckets).map(|i| IdHash.hash_one(i) >> 57).collect();
        assert!(top.len() > 64, "top bits take {} values", top.len());
    }
}
