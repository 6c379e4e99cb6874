//! The receiving end of one SUBSCRIBE.

use tokio::sync::mpsc;

use crate::Message;

/// Messages for one subscription, in the order the broker sent them. Dropping it stops local
/// delivery (messages the broker still sends for it are discarded); call
/// [`crate::Connection::unsubscribe`] to tell the broker.
#[derive(Debug)]
pub struct Subscription {
    pub(crate) id: String,
    pub(crate) destination: String,
    pub(crate) rx: mpsc::Receiver<Message>,
}

impl Subscription {
    /// The next message, or `None` once the connection has closed and every message that had
    /// arrived before was returned. [`crate::Connection::close_reason`] says why it closed.
    pub async fn next(&mut self) -> Option<Message> {
        self.rx.recv().await
    }

    /// A message that has already arrived, without waiting.
    pub fn try_next(&mut self) -> Option<Message> {
        self.rx.try_recv().ok()
    }

    /// The subscription's `id` header value.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn destination(&self) -> &str {
        &self.destination
    }
}
