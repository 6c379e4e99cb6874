//! Messages a loader read ahead of need (see `MessageLoader::prefetch`), waiting for the core
//! to take them: bounded in count and bytes, the oldest dropped first, and aware of what the
//! core read itself, so that nothing read twice is kept. Shared by the journal's loader and the
//! PostgreSQL store's.

use crate::hash::IdHash;
use crate::message::Message;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Decoded messages waiting for `load`, at most: one batch ahead, plus slack. Beyond it the
/// oldest go (what was never asked for: consumers went away).
pub const READ_AHEAD_MESSAGES_MAX: usize = 16_384;
/// The same bound in bytes of messages (`Message::size_bytes`): 8 MiB, what one read-ahead
/// hint names at most (the engine's `PREFETCH_HINT_BYTES_MAX`). Counted in messages alone,
/// 64 KiB messages could hold a gigabyte here; at 64 MiB, scenario (f) of BENCHMARKS.md
/// peaked 50–80 MiB higher at the same rate.
pub const READ_AHEAD_BYTES_MAX: usize = 8 << 20;
/// Hints a loader queues for its reader at most; beyond it a new one is dropped, and its
/// messages are read on the spot when loaded. The engine sends one per page-in and one per
/// sync batch that pages messages out, each within the next page-in's window, so the queue
/// stays short (one hint at most, as the journal's loader once kept, dropped most of the
/// second kind).
pub const HINTS_QUEUED_MAX: usize = 1_024;

/// Messages read ahead, by (lsn, seq), each with its `size_bytes` (summed on the worker that
/// decoded it, not again on the core that takes it), and the sum of those.
///
/// Over a bound the oldest go first: they are the ones a consumer that went away never asked
/// for. (Dropping all of them, as this once did, threw away what was about to be taken when
/// large messages filled the bound: the core then read them again itself, and scenario (f) of
/// BENCHMARKS.md with a 16 MiB prefetch window spent 7% of its worker on such reads.)
#[derive(Default)]
pub struct ReadAhead {
    // The keys are the broker's own numbers, so they need no keyed hash (`IdHash`).
    messages: HashMap<(u64, u64), (Arc<Message>, usize), IdHash>,
    /// Keys in the order they were inserted; some already taken.
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    /// Messages the core read itself (`load` found them missing) that the worker may still
    /// be about to read from a hint: it skips them, or drops its copy, instead of leaving one
    /// nobody will take. The engine hints a page-in's window just before it loads the first
    /// messages, so the core often reads those before the worker starts. Oldest first in
    /// `read_by_core_order`, at most `READ_AHEAD_MESSAGES_MAX`.
    read_by_core: HashSet<(u64, u64), IdHash>,
    read_by_core_order: VecDeque<(u64, u64)>,
}

impl ReadAhead {
    fn insert(&mut self, key: (u64, u64), msg: Arc<Message>) {
        let size = msg.size_bytes();
        // Keys taken already leave the front as the core takes messages in order; a key the
        // core skipped ages out with the bound on `order`.
        while let Some(front) = self.order.front() {
            let full = self.messages.len() >= READ_AHEAD_MESSAGES_MAX
                || self.bytes + size > READ_AHEAD_BYTES_MAX
                || self.order.len() >= 2 * READ_AHEAD_MESSAGES_MAX;
            if self.messages.contains_key(front) && !full {
                break;
            }
            let front = self.order.pop_front().expect("just seen");
            if let Some((_, old)) = self.messages.remove(&front) {
                self.bytes -= old;
            }
        }
        if let Some((_, old)) = self.messages.insert(key, (msg, size)) {
            self.bytes -= old;
        }
        self.bytes += size;
        self.order.push_back(key);
    }

    pub fn clear(&mut self) {
        *self = ReadAhead::default();
    }

    /// The core read `key` itself.
    pub fn note_read_by_core(&mut self, key: (u64, u64)) {
        if self.read_by_core.insert(key) {
            self.read_by_core_order.push_back(key);
        }
        while self.read_by_core_order.len() > READ_AHEAD_MESSAGES_MAX {
            let old = self.read_by_core_order.pop_front().expect("over the bound");
            self.read_by_core.remove(&old);
        }
    }

    /// Whether the worker should read hinted `key`: not if it holds it already or the core
    /// read it (which it then forgets: a key is hinted once).
    pub fn wanted(&mut self, key: &(u64, u64)) -> bool {
        !self.messages.contains_key(key) && !self.read_by_core.remove(key)
    }

    /// Keeps what the worker read, unless the core read it meanwhile.
    pub fn offer(&mut self, key: (u64, u64), msg: Arc<Message>) {
        if !self.read_by_core.remove(&key) {
            self.insert(key, msg);
        }
    }

    /// Takes `key`'s message, if read ahead.
    pub fn remove(&mut self, key: &(u64, u64)) -> Option<Arc<Message>> {
        let (msg, size) = self.messages.remove(key)?;
        self.bytes -= size;
        Some(msg)
    }

    /// Messages waiting to be taken.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    pub fn contains(&self, key: &(u64, u64)) -> bool {
        self.messages.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Headers;

    fn msg(seq: u64, body_bytes: usize) -> Arc<Message> {
        let body = bytes::Bytes::from(vec![0u8; body_bytes]);
        Arc::new(Message::for_test(seq, Headers::default(), body))
    }

    /// Large messages fill the byte bound: the oldest go, the newest stay, the sum holds.
    #[test]
    fn over_the_byte_bound_the_oldest_go_first() {
        let mut p = ReadAhead::default();
        let body = READ_AHEAD_BYTES_MAX / 4;
        for seq in 1..=6 {
            p.insert((seq, seq), msg(seq, body));
            assert!(p.bytes <= READ_AHEAD_BYTES_MAX, "{} bytes", p.bytes);
        }
        assert!(
            p.remove(&(1, 1)).is_none()
                && p.remove(&(2, 2)).is_none()
                && p.remove(&(3, 3)).is_none()
        );
        for seq in 4..=6 {
            assert!(p.remove(&(seq, seq)).is_some(), "seq {seq} was dropped");
        }
        assert_eq!(p.bytes, 0);
    }

    /// A message the core read itself is not kept when the worker reads it too, before or
    /// after: the worker skips it, or drops its copy; and the record of such reads is bounded.
    #[test]
    fn what_the_core_read_itself_is_not_kept_again() {
        let mut p = ReadAhead::default();
        p.note_read_by_core((1, 1));
        assert!(
            !p.wanted(&(1, 1)),
            "read by the core before the worker reached it"
        );
        assert!(p.wanted(&(2, 2)));
        p.note_read_by_core((2, 2));
        p.offer((2, 2), msg(2, 10));
        assert!(
            p.remove(&(2, 2)).is_none(),
            "read by the core while the worker read it"
        );
        p.offer((3, 3), msg(3, 10));
        assert!(p.remove(&(3, 3)).is_some());
        for seq in 10..(3 * READ_AHEAD_MESSAGES_MAX as u64) {
            p.note_read_by_core((seq, seq));
        }
        assert!(p.read_by_core.len() <= READ_AHEAD_MESSAGES_MAX);
        assert!(p.read_by_core_order.len() <= READ_AHEAD_MESSAGES_MAX);
    }

    /// Taken messages leave no trace: the order list stays bounded even if none is ever
    /// dropped, and one the core skipped ages out.
    #[test]
    fn taken_keys_do_not_pile_up() {
        let mut p = ReadAhead::default();
        p.insert((0, 0), msg(0, 10)); // never taken
        for seq in 1..(5 * READ_AHEAD_MESSAGES_MAX as u64) {
            p.insert((seq, seq), msg(seq, 10));
            assert!(p.remove(&(seq, seq)).is_some());
            assert!(p.order.len() <= 2 * READ_AHEAD_MESSAGES_MAX);
        }
        assert!(p.remove(&(0, 0)).is_none(), "the skipped message aged out");
        assert_eq!((p.messages.len(), p.bytes), (0, 0));
    }
}
