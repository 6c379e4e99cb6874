//! The consumer side of "no duplicates across failover": a bounded window of messages the
//! application has already acknowledged, per subscription.
//!
//! After a failover the broker (the same one restarted, or another with the same store)
//! redelivers every message whose ACK it had not made durable, with `redelivered:true`. Those
//! the application already acked must not reach it twice; the window recognises them and the
//! client acks them again on the new connection instead. Keys carry the store the message came
//! from (CONNECTED's `haven-store`, or the broker address for other brokers), because two
//! brokers with separate stores may both number a message `ID:haven-7`.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// `(store, message-id)`.
pub(crate) type Key = (Arc<str>, String);

pub(crate) struct DupWindow {
    set: HashSet<Key>,
    order: VecDeque<Key>,
    capacity: usize,
}

impl DupWindow {
    pub(crate) fn new(capacity: usize) -> DupWindow {
        assert!(
            capacity > 0,
            "a duplicate window needs room for one message"
        );
        DupWindow {
            set: HashSet::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// Remembers `key`; the oldest key is forgotten when the window is full.
    pub(crate) fn insert(&mut self, key: Key) {
        if self.set.contains(&key) {
            return;
        }
        if self.order.len() == self.capacity {
            let oldest = self
                .order
                .pop_front()
                .expect("full window has an oldest key");
            self.set.remove(&oldest);
        }
        self.set.insert(key.clone());
        self.order.push_back(key);
        debug_assert_eq!(self.set.len(), self.order.len());
    }

    pub(crate) fn contains(&self, key: &Key) -> bool {
        self.set.contains(key)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(store: &str, id: &str) -> Key {
        (Arc::from(store), id.to_string())
    }

    #[test]
    fn window_is_bounded_and_forgets_the_oldest() {
        let mut w = DupWindow::new(3);
        for id in ["a", "b", "c", "a"] {
            w.insert(k("s", id));
        }
        assert_eq!(w.len(), 3);
        w.insert(k("s", "d"));
        assert!(!w.contains(&k("s", "a")));
        assert!(w.contains(&k("s", "b")) && w.contains(&k("s", "d")));
    }

    #[test]
    fn same_id_from_another_store_is_a_different_message() {
        let mut w = DupWindow::new(8);
        w.insert(k("store-1", "ID:haven-7"));
        assert!(!w.contains(&k("store-2", "ID:haven-7")));
    }
}
