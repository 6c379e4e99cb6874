//! State shared by a connection's handle(s) and its reader task.
//!
//! Ownership: the reader task and every `Connection` clone hold an `Arc<Shared>`; the single
//! `std::sync::Mutex` is never held across an `.await`. The invariant that makes waiting safe:
//! once `closed` is set, no receipt waiter or subscription can be registered, and every one
//! registered before was completed or dropped by the same `close` call — so no waiter hangs.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot, watch};

use crate::{ClientError, Message, Result};

pub(crate) type ReceiptTx = oneshot::Sender<Result<()>>;

/// What a failover client attaches to each connection it opens.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    /// Stamped on every delivered message (see `Message::generation`).
    pub generation: u64,
    /// RECEIPTs nobody registered a waiter for go here: the failover client tracks its SENDs
    /// by receipt id in one table instead of one waiter per frame.
    pub receipt_sink: Option<mpsc::UnboundedSender<String>>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    hooks: Hooks,
    /// Becomes true when the connection closes, for whoever waits on `Connection::closed`.
    closed_tx: watch::Sender<bool>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new(Hooks::default())
    }
}

#[derive(Default)]
struct State {
    closed: Option<ClientError>,
    receipts: BTreeMap<String, ReceiptTx>,
    subscriptions: BTreeMap<String, mpsc::Sender<Message>>,
}

impl Shared {
    pub(crate) fn new(hooks: Hooks) -> Shared {
        Shared {
            state: Mutex::default(),
            hooks,
            closed_tx: watch::channel(false).0,
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.hooks.generation
    }

    /// Hands a RECEIPT nobody waits for to the receipt sink; false without one.
    pub(crate) fn forward_receipt(&self, receipt_id: &str) -> bool {
        match &self.hooks.receipt_sink {
            Some(sink) => sink.send(receipt_id.to_string()).is_ok(),
            None => false,
        }
    }

    pub(crate) fn closed_watch(&self) -> watch::Receiver<bool> {
        self.closed_tx.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock is a bug in this crate; poisoning would only hide it.
        self.state.lock().expect("client shared state poisoned")
    }

    pub(crate) fn close_reason(&self) -> Option<ClientError> {
        self.lock().closed.clone()
    }

    /// Registers a waiter for `receipt_id`; fails with the close reason once closed.
    pub(crate) fn register_receipt(
        &self,
        receipt_id: &str,
    ) -> Result<oneshot::Receiver<Result<()>>> {
        let mut st = self.lock();
        if let Some(e) = &st.closed {
            return Err(e.clone());
        }
        let (tx, rx) = oneshot::channel();
        let previous = st.receipts.insert(receipt_id.to_string(), tx);
        assert!(previous.is_none(), "receipt id {receipt_id} issued twice");
        Ok(rx)
    }

    /// Forgets a waiter whose frame never reached the writer.
    pub(crate) fn cancel_receipt(&self, receipt_id: &str) {
        self.lock().receipts.remove(receipt_id);
    }

    /// Completes the waiter for `receipt_id`. Returns false for an id nobody waits for.
    pub(crate) fn complete_receipt(&self, receipt_id: &str) -> bool {
        let waiter = self.lock().receipts.remove(receipt_id);
        match waiter {
            Some(tx) => {
                // The waiter may have been dropped (caller stopped caring): not an error.
                let _ = tx.send(Ok(()));
                true
            }
            None => false,
        }
    }

    pub(crate) fn register_subscription(&self, id: &str, tx: mpsc::Sender<Message>) -> Result<()> {
        let mut st = self.lock();
        if let Some(e) = &st.closed {
            return Err(e.clone());
        }
        if st.subscriptions.contains_key(id) {
            return Err(ClientError::Protocol(format!(
                "subscription id {id:?} is already in use on this connection"
            )));
        }
        st.subscriptions.insert(id.to_string(), tx);
        Ok(())
    }

    pub(crate) fn remove_subscription(&self, id: &str) {
        self.lock().subscriptions.remove(id);
    }

    pub(crate) fn subscription_sender(&self, id: &str) -> Option<mpsc::Sender<Message>> {
        self.lock().subscriptions.get(id).cloned()
    }

    /// Ends the connection's shared life: the first reason wins, every receipt waiter fails with
    /// it and every subscription's stream ends. Idempotent.
    pub(crate) fn close(&self, reason: ClientError) {
        let (receipts, reason) = {
            let mut st = self.lock();
            if st.closed.is_none() {
                st.closed = Some(reason);
            }
            st.subscriptions.clear();
            let receipts: Vec<ReceiptTx> = std::mem::take(&mut st.receipts).into_values().collect();
            (receipts, st.closed.clone().expect("closed was just set"))
        };
        for tx in receipts {
            let _ = tx.send(Err(reason.clone()));
        }
        self.closed_tx.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_fails_waiters_and_refuses_new_ones() {
        let shared = Shared::default();
        let mut rx = shared.register_receipt("r1").unwrap();
        let (stx, mut srx) = mpsc::channel(1);
        shared.register_subscription("s1", stx).unwrap();
        shared.close(ClientError::Closed);
        shared.close(ClientError::Protocol("later reason is ignored".into()));
        assert!(matches!(rx.try_recv(), Ok(Err(ClientError::Closed))));
        assert!(srx.try_recv().is_err());
        assert!(matches!(
            shared.register_receipt("r2"),
            Err(ClientError::Closed)
        ));
        let (stx2, _srx2) = mpsc::channel(1);
        assert!(shared.register_subscription("s2", stx2).is_err());
        assert!(matches!(shared.close_reason(), Some(ClientError::Closed)));
    }

    #[test]
    fn complete_receipt_only_matches_known_ids() {
        let shared = Shared::default();
        let mut rx = shared.register_receipt("r1").unwrap();
        assert!(!shared.complete_receipt("nope"));
        assert!(shared.complete_receipt("r1"));
        assert!(matches!(rx.try_recv(), Ok(Ok(()))));
        assert!(!shared.complete_receipt("r1"));
    }
}
