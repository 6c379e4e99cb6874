//! The receiving end of one SUBSCRIBE.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::failover::SubTracker;
use crate::Message;

/// Messages for one subscription, in the order the broker sent them. Dropping it stops local
/// delivery (messages the broker still sends for it are discarded); call
/// [`crate::Connection::unsubscribe`] to tell the broker.
#[derive(Debug)]
pub struct Subscription {
    pub(crate) id: String,
    pub(crate) destination: String,
    pub(crate) rx: mpsc::Receiver<Message>,
    /// Set for a [`crate::Client`] subscription: filters redeliveries of acked messages.
    pub(crate) tracker: Option<Arc<SubTracker>>,
}

impl Subscription {
    /// The next message, or `None` once the connection has closed and every message that had
    /// arrived before was returned. [`crate::Connection::close_reason`] says why it closed.
    pub async fn next(&mut self) -> Option<Message> {
        loop {
            let msg = self.rx.recv().await?;
            match &self.tracker {
                Some(t) if !t.admit(&msg).await => continue,
                _ => return Some(msg),
            }
        }
    }

    /// A message that has already arrived, without waiting. (On a [`crate::Client`]
    /// subscription, a redelivery of an acked message is dropped but not acked again here;
    /// use `next` for that.)
    pub fn try_next(&mut self) -> Option<Message> {
        loop {
            let msg = self.rx.try_recv().ok()?;
            match &self.tracker {
                Some(t) if t.is_duplicate(&msg) => continue,
                _ => return Some(msg),
            }
        }
    }

    /// The subscription's `id` header value.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn destination(&self) -> &str {
        &self.destination
    }
}
