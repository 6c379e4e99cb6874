//! One end of a bridge: the remote broker over STOMP (`haven-client`), or this broker in
//! process (`local.rs`). A bridge direction reads from one and writes to the other through
//! this one interface, whichever way round they are.

use super::headers::{ORIGIN_HEADER, PATH_HEADER};
use super::local::{self, LocalConn};
use super::path;
use haven_client::{
    AckMode, ClientError, Command, Connection, Frame, Headers, Message, Subscription,
};
use haven_engine::{Decimal, Delivery, PRIORITY_DEFAULT};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

/// What a forwarded SEND's command and headers usually take, for sizing a batch's buffer.
const FORWARD_HEADER_BYTES_GUESS: usize = 320;

pub(crate) enum Link {
    Remote(Connection),
    Local(LocalConn),
}

/// A RECEIPT owed by either end.
pub(crate) type Receipt = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>;

/// A subscription's deliveries.
pub(crate) enum Feed {
    Remote(Subscription),
    Local(local::Feed),
}

/// A message as one end delivered it.
pub(crate) enum Delivered {
    Remote(Message),
    Local(Delivery),
}

impl Link {
    pub async fn subscribe(
        &self,
        destination: &str,
        ack: AckMode,
        headers: &[(&str, &str)],
    ) -> Result<Feed, ClientError> {
        Ok(match self {
            Link::Remote(c) => Feed::Remote(c.subscribe(destination, ack, headers).await?),
            Link::Local(c) => Feed::Local(c.subscribe(destination, ack, headers).await?),
        })
    }

    pub async fn unsubscribe_id(&self, id: &str) -> Result<(), ClientError> {
        match self {
            Link::Remote(c) => c.unsubscribe_id(id, &[]).await,
            Link::Local(c) => c.unsubscribe_id(id).await,
        }
    }

    /// Acknowledges `d` (cumulatively on a `client` subscription). `d` came from this end.
    pub async fn ack(&self, d: &Delivered) -> Result<(), ClientError> {
        match (self, d) {
            (Link::Remote(c), Delivered::Remote(m)) => c.ack(m).await,
            (Link::Local(c), Delivered::Local(d)) => c.ack(d).await,
            _ => unreachable!("a delivery acknowledged on the other end of its bridge"),
        }
    }

    pub async fn send(&self, frame: Frame) -> Result<(), ClientError> {
        match self {
            Link::Remote(c) => c.raw_send_frame(frame).await,
            Link::Local(c) => c.send_frame(frame).await,
        }
    }

    pub async fn send_with_receipt(&self, frame: Frame) -> Result<Receipt, ClientError> {
        Ok(match self {
            Link::Remote(c) => Box::pin(c.send_frame_with_receipt(frame).await?),
            Link::Local(c) => {
                let rx = c.send_frame_with_receipt(frame).await?;
                Box::pin(async move { rx.await.unwrap_or(Err(ClientError::Closed)) })
            }
        })
    }

    /// Forwards `sends` (at least one: a message, the destination it goes to on this end,
    /// and its path on) as SENDs in order, the last asking for a RECEIPT, which is returned.
    /// To a remote broker they go as one write, encoded from the messages' own parts.
    pub async fn forward_batch(
        &self,
        sends: &[(&Delivered, &str, &[String])],
        origin_store: &str,
        scratch: &mut ForwardScratch,
    ) -> Result<Receipt, ClientError> {
        let (last, rest) = sends
            .split_last()
            .expect("a batch forwards at least one message");
        match self {
            Link::Remote(c) => {
                let bodies: usize = sends.iter().map(|(m, _, _)| m.body().len()).sum();
                let mut batch = c.frame_batch(bodies + sends.len() * FORWARD_HEADER_BYTES_GUESS);
                for (m, destination, next_path) in rest {
                    let headers = m.forward_headers(destination, origin_store, next_path, scratch);
                    batch.push(Command::Send, headers.into_iter(), m.body())?;
                }
                let (m, destination, next_path) = last;
                let headers = m.forward_headers(destination, origin_store, next_path, scratch);
                let receipt = c
                    .send_batch_with_receipt(batch, Command::Send, headers.into_iter(), m.body())
                    .await?;
                Ok(Box::pin(receipt))
            }
            Link::Local(_) => {
                for (m, destination, next_path) in rest {
                    self.send(m.forward(destination, origin_store, next_path))
                        .await?;
                }
                let (m, destination, next_path) = last;
                self.send_with_receipt(m.forward(destination, origin_store, next_path))
                    .await
            }
        }
    }

    /// Resolves with the reason once this end's connection has ended.
    pub async fn closed(&self) -> ClientError {
        match self {
            Link::Remote(c) => c.closed().await,
            Link::Local(c) => c.closed().await,
        }
    }

    pub fn close_now(&self) {
        match self {
            Link::Remote(c) => c.close_now(),
            Link::Local(c) => c.close_now(),
        }
    }
}

impl Feed {
    pub async fn next(&mut self) -> Option<Delivered> {
        match self {
            Feed::Remote(s) => s.next().await.map(Delivered::Remote),
            Feed::Local(f) => f.next().await.map(Delivered::Local),
        }
    }
}

impl Delivered {
    /// The destination it was delivered from, as STOMP names it.
    pub fn destination(&self) -> Cow<'_, str> {
        match self {
            Delivered::Remote(m) => Cow::Borrowed(m.destination.as_str()),
            Delivered::Local(d) => Cow::Owned(d.message.destination.to_string()),
        }
    }

    /// The engine's destination of a message delivered in process (None from a remote end).
    pub fn local_destination(&self) -> Option<&haven_engine::Destination> {
        match self {
            Delivered::Remote(_) => None,
            Delivered::Local(d) => Some(&d.message.destination),
        }
    }

    /// The first occurrence of an application header (or, from the remote end, of any
    /// MESSAGE header).
    pub fn header(&self, name: &str) -> Option<&str> {
        match self {
            Delivered::Remote(m) => m.header(name),
            Delivered::Local(d) => d.message.header(name),
        }
    }

    /// The SEND that forwards it to `destination` on the other end, as a frame (for an end
    /// in process); see [`Delivered::forward_headers`].
    pub fn forward(&self, destination: &str, origin_store: &str, next_path: &[String]) -> Frame {
        let mut scratch = ForwardScratch::default();
        let headers = Headers::sized(
            self.forward_headers(destination, origin_store, next_path, &mut scratch)
                .into_iter(),
        );
        Frame {
            command: haven_client::Command::Send,
            headers,
            body: self.body().clone(),
        }
    }

    /// The headers of the SEND that forwards it to `destination` on the other end: its own
    /// headers less what the source broker set for this delivery and what would steer the sink
    /// wrongly, then its origin (`origin_store` and its message id) and its path on. Borrowed
    /// from the message and `scratch`, so a bridge encodes its SENDs without building frames.
    pub fn forward_headers<'a>(
        &'a self,
        destination: &'a str,
        origin_store: &str,
        next_path: &[String],
        scratch: &'a mut ForwardScratch,
    ) -> Vec<(&'a str, &'a str)> {
        scratch.origin.clear();
        scratch.path.clear();
        scratch.priority.clear();
        scratch.expires.clear();
        // Pushed, not written with `write!`: formatting was a third of this function's
        // instructions on a forwarding broker.
        let id = match self {
            Delivered::Remote(m) => m.message_id.as_str(),
            Delivered::Local(d) => {
                let m = &d.message;
                if m.priority != PRIORITY_DEFAULT {
                    let priority = Decimal::new(u64::from(m.priority));
                    scratch.priority.push_str(priority.as_str());
                }
                if m.expires_ms != 0 {
                    scratch
                        .expires
                        .push_str(Decimal::new(m.expires_ms).as_str());
                }
                m.id.as_str()
            }
        };
        scratch.origin.push_str(origin_store);
        scratch.origin.push('/');
        scratch.origin.push_str(id);
        path::format_into(next_path, &mut scratch.path);
        let scratch: &'a ForwardScratch = scratch;
        let mut headers: Vec<(&'a str, &'a str)>;
        match self {
            Delivered::Remote(m) => {
                headers = Vec::with_capacity(m.headers.len() + 3);
                headers.push(("destination", destination));
                push_passed(&mut headers, m.headers.iter());
            }
            Delivered::Local(d) => {
                let m = &d.message;
                headers = Vec::with_capacity(m.headers.len() + 6);
                headers.push(("destination", destination));
                // The engine keeps these as fields, not headers.
                headers.push(("persistent", if m.persistent { "true" } else { "false" }));
                // The receiving broker gives a SEND without one the same default.
                if m.priority != PRIORITY_DEFAULT {
                    headers.push(("priority", scratch.priority.as_str()));
                }
                if m.expires_ms != 0 {
                    headers.push(("expires", scratch.expires.as_str()));
                }
                push_passed(&mut headers, m.headers.iter());
            }
        }
        headers.push((ORIGIN_HEADER, scratch.origin.as_str()));
        if !next_path.is_empty() {
            headers.push((PATH_HEADER, scratch.path.as_str()));
        }
        headers
    }

    pub fn body(&self) -> &bytes::Bytes {
        match self {
            Delivered::Remote(m) => &m.body,
            Delivered::Local(d) => &d.message.body,
        }
    }
}

/// The header values [`Delivered::forward_headers`] formats rather than borrows; one per
/// bridge direction, reused for every message.
#[derive(Default)]
pub(crate) struct ForwardScratch {
    origin: String,
    path: String,
    priority: String,
    expires: String,
}

/// Appends the headers of `from` a forwarded SEND keeps: the first occurrence of each, less
/// what the source broker set for the delivery and the exactly-once and network headers the
/// forwarding replaces.
fn push_passed<'a>(
    to: &mut Vec<(&'a str, &'a str)>,
    from: impl Iterator<Item = (&'a str, &'a str)>,
) {
    const DROPPED: &[&str] = &[
        "destination",
        "message-id",
        "subscription",
        "ack",
        "redelivered",
        "delivery-count",
        "content-length",
        "receipt",
        "transaction",
        "haven-producer",
        "haven-seq",
        ORIGIN_HEADER,
        PATH_HEADER,
    ];
    for (k, v) in from {
        if DROPPED.contains(&k) || to.iter().any(|(k2, _)| *k2 == k) {
            continue;
        }
        to.push((k, v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use haven_engine::{Destination, Message as Stored};
    use std::sync::Arc;

    #[test]
    fn a_remote_message_keeps_the_application_s_headers_and_names_its_origin() {
        let m = Message::from_headers(
            haven_engine::Headers::from_pairs(&[
                ("destination", "/queue/q"),
                ("message-id", "ID:haven-7"),
                ("subscription", "net-1"),
                ("ack", "3"),
                ("persistent", "true"),
                ("haven-producer", "p"),
                ("haven-seq", "9"),
                (PATH_HEADER, "A"),
                ("color", "red"),
                ("color", "blue"),
            ]),
            Bytes::from_static(b"x"),
        );
        let f = Delivered::Remote(m).forward("/queue/q", "s1", &["A".into(), "B".into()]);
        assert_eq!(
            f.headers.iter().collect::<Vec<_>>(),
            [
                ("destination", "/queue/q"),
                ("persistent", "true"),
                ("color", "red"),
                (ORIGIN_HEADER, "s1/ID:haven-7"),
                (PATH_HEADER, "A,B"),
            ]
        );
        assert_eq!(f.body, Bytes::from_static(b"x"));
    }

    #[test]
    fn a_local_message_carries_its_delivery_fields_as_headers() {
        let stored = Stored {
            seq: 1,
            id: "ID:haven-9".into(),
            destination: Destination::Queue("q".into()),
            headers: haven_engine::Headers::from_pairs(&[
                ("haven-producer", "p"),
                ("haven-seq", "1"),
                ("reply-to", "/queue/r"),
            ]),
            body: Bytes::from_static(b"y"),
            persistent: false,
            priority: 7,
            expires_ms: 123,
            timestamp_ms: 5,
            dead_lettered: false,
        };
        let d = Delivered::Local(Delivery {
            sub_id: "net-1".into(),
            ack_tag: 4,
            message: Arc::new(stored),
            redelivered: true,
            delivery_count: 2,
            auto_ack: false,
        });
        assert_eq!(d.destination(), "/queue/q");
        let f = d.forward(&d.destination(), "s2", &["A".into()]);
        assert_eq!(
            f.headers.iter().collect::<Vec<_>>(),
            [
                ("destination", "/queue/q"),
                ("persistent", "false"),
                ("priority", "7"),
                ("expires", "123"),
                ("reply-to", "/queue/r"),
                (ORIGIN_HEADER, "s2/ID:haven-9"),
                (PATH_HEADER, "A"),
            ]
        );
    }

    #[test]
    fn a_local_message_of_the_default_priority_is_sent_without_one() {
        let stored = Stored {
            seq: 1,
            id: "ID:haven-3".into(),
            destination: Destination::Queue("q".into()),
            headers: haven_engine::Headers::from_pairs(&[("color", "red")]),
            body: Bytes::from_static(b"z"),
            persistent: true,
            priority: PRIORITY_DEFAULT,
            expires_ms: 0,
            timestamp_ms: 5,
            dead_lettered: false,
        };
        let d = Delivered::Local(Delivery {
            sub_id: "net-1".into(),
            ack_tag: 1,
            message: Arc::new(stored),
            redelivered: false,
            delivery_count: 1,
            auto_ack: false,
        });
        let f = d.forward(&d.destination(), "s2", &[]);
        assert_eq!(
            f.headers.iter().collect::<Vec<_>>(),
            [
                ("destination", "/queue/q"),
                ("persistent", "true"),
                ("color", "red"),
                (ORIGIN_HEADER, "s2/ID:haven-3"),
            ]
        );
    }
}
