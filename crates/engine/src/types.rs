//! Identifiers and destination names shared by commands, records and effects.

use std::fmt;

/// A client connection, numbered by the server; unique within one broker process.
pub type ConnId = u64;

/// Longest destination name accepted, in bytes (after the `/queue/`-style prefix).
pub const DESTINATION_NAME_BYTES_MAX: usize = 1024;

/// A destination as ActiveMQ's STOMP names it.
///
/// Temporary destinations belong to the connection that created them (`owner`); other
/// connections reach them through the `/remote-temp-queue/...` name the owner's `reply-to`
/// header is rewritten to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    Queue(String),
    Topic(String),
    TempQueue { owner: ConnId, name: String },
    TempTopic { owner: ConnId, name: String },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error("destination '{0}' must start with /queue/, /topic/, /temp-queue/ or /temp-topic/")]
    UnknownPrefix(String),
    #[error("destination '{0}' has an empty name")]
    Empty(String),
    #[error("destination name longer than {DESTINATION_NAME_BYTES_MAX} bytes")]
    TooLong,
    #[error("destination '{0}' contains a control character")]
    ControlCharacter(String),
    #[error("destination '{0}' is not a temporary destination of a known connection")]
    BadRemoteTemp(String),
}

const REMOTE_TEMP_QUEUE: &str = "/remote-temp-queue/";
const REMOTE_TEMP_TOPIC: &str = "/remote-temp-topic/";

impl Destination {
    /// Parses a `destination` header as sent by connection `conn`.
    pub fn parse(text: &str, conn: ConnId) -> Result<Destination, DestinationError> {
        let (kind, name) = if let Some(n) = text.strip_prefix("/queue/") {
            (0, n)
        } else if let Some(n) = text.strip_prefix("/topic/") {
            (1, n)
        } else if let Some(n) = text.strip_prefix("/temp-queue/") {
            (2, n)
        } else if let Some(n) = text.strip_prefix("/temp-topic/") {
            (3, n)
        } else if let Some(n) = text.strip_prefix(REMOTE_TEMP_QUEUE) {
            (4, n)
        } else if let Some(n) = text.strip_prefix(REMOTE_TEMP_TOPIC) {
            (5, n)
        } else {
            return Err(DestinationError::UnknownPrefix(text.to_string()));
        };
        if name.is_empty() {
            return Err(DestinationError::Empty(text.to_string()));
        }
        if name.len() > DESTINATION_NAME_BYTES_MAX {
            return Err(DestinationError::TooLong);
        }
        if name.chars().any(char::is_control) {
            return Err(DestinationError::ControlCharacter(text.to_string()));
        }
        let name = name.to_string();
        Ok(match kind {
            0 => Destination::Queue(name),
            1 => Destination::Topic(name),
            2 => Destination::TempQueue { owner: conn, name },
            3 => Destination::TempTopic { owner: conn, name },
            _ => {
                let (owner, rest) = parse_remote(&name)
                    .ok_or_else(|| DestinationError::BadRemoteTemp(text.to_string()))?;
                if kind == 4 {
                    Destination::TempQueue { owner, name: rest }
                } else {
                    Destination::TempTopic { owner, name: rest }
                }
            }
        })
    }

    pub fn is_topic(&self) -> bool {
        matches!(self, Destination::Topic(_) | Destination::TempTopic { .. })
    }

    pub fn is_temporary(&self) -> bool {
        matches!(
            self,
            Destination::TempQueue { .. } | Destination::TempTopic { .. }
        )
    }
}

/// `haven-<owner>-<name>` → (owner, name).
fn parse_remote(text: &str) -> Option<(ConnId, String)> {
    let rest = text.strip_prefix("haven-")?;
    let (owner, name) = rest.split_once('-')?;
    if name.is_empty() {
        return None;
    }
    Some((owner.parse().ok()?, name.to_string()))
}

impl fmt::Display for Destination {
    /// The header form. Temporary destinations are always shown in their remote form so that
    /// any connection can send to the name it reads in `reply-to` or `destination`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Queue(n) => write!(f, "/queue/{n}"),
            Destination::Topic(n) => write!(f, "/topic/{n}"),
            Destination::TempQueue { owner, name } => {
                write!(f, "{REMOTE_TEMP_QUEUE}haven-{owner}-{name}")
            }
            Destination::TempTopic { owner, name } => {
                write!(f, "{REMOTE_TEMP_TOPIC}haven-{owner}-{name}")
            }
        }
    }
}

impl Destination {
    /// Appends the header form (what `Display` writes) to `out`: for a queue or a topic
    /// without the formatting machinery, as every MESSAGE frame needs it.
    pub fn push_header_form(&self, out: &mut String) {
        match self {
            Destination::Queue(n) => {
                out.push_str("/queue/");
                out.push_str(n);
            }
            Destination::Topic(n) => {
                out.push_str("/topic/");
                out.push_str(n);
            }
            temporary => {
                use fmt::Write;
                write!(out, "{temporary}").expect("writing to a String");
            }
        }
    }
}

/// Whether a topic name is a wildcard pattern: a segment (between `.`) that is `*` (exactly
/// one segment) or `>` (this and every following segment, zero or more — ActiveMQ's rule).
pub fn is_wildcard(name: &str) -> bool {
    name.split('.').any(|seg| seg == "*" || seg == ">")
}

/// ActiveMQ wildcard matching over `.`-separated segments.
pub fn wildcard_matches(pattern: &str, name: &str) -> bool {
    let mut p = pattern.split('.');
    let mut n = name.split('.');
    loop {
        match (p.next(), n.next()) {
            (Some(">"), _) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// `Consumer.<group>.VirtualTopic.<rest>` → `VirtualTopic.<rest>`: the virtual topic whose
/// messages this queue receives a copy of.
pub fn virtual_topic_of(queue_name: &str) -> Option<&str> {
    let rest = queue_name.strip_prefix("Consumer.")?;
    let (group, topic) = rest.split_once('.')?;
    (!group.is_empty() && topic.starts_with("VirtualTopic.") && topic.len() > "VirtualTopic.".len())
        .then_some(topic)
}

/// Which store-side queue holds a message. Only `Queue` and `Durable` are ever written to the
/// log; the others live and die with a connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QueueKey {
    /// A named queue, `/queue/NAME`.
    Queue(String),
    /// A durable topic subscription: `client-id` + `activemq.subscriptionName`.
    Durable { client_id: String, name: String },
    /// The private buffer of one non-durable topic subscription.
    TopicSub { conn: ConnId, sub_id: String },
    /// A temporary queue.
    Temp { owner: ConnId, name: String },
}

impl fmt::Display for QueueKey {
    /// How logs and ERROR frames name it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueKey::Queue(n) => write!(f, "/queue/{n}"),
            QueueKey::Durable { client_id, name } => {
                write!(f, "durable subscription {client_id}/{name}")
            }
            QueueKey::TopicSub { conn, sub_id } => {
                write!(f, "topic subscription {sub_id} of connection {conn}")
            }
            QueueKey::Temp { owner, name } => write!(f, "temporary queue {name} of {owner}"),
        }
    }
}

impl QueueKey {
    pub fn is_durable_kind(&self) -> bool {
        matches!(self, QueueKey::Queue(_) | QueueKey::Durable { .. })
    }
}

/// STOMP acknowledgement modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    /// The broker considers a message acknowledged once it is written to the socket.
    Auto,
    /// Cumulative: an ACK covers every earlier message of the subscription.
    Client,
    ClientIndividual,
}

impl AckMode {
    pub fn parse(text: &str) -> Option<AckMode> {
        match text {
            "auto" => Some(AckMode::Auto),
            "client" => Some(AckMode::Client),
            "client-individual" => Some(AckMode::ClientIndividual),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_form_is_what_display_writes() {
        for d in [
            Destination::Queue("orders.eu".into()),
            Destination::Topic("prices.>".into()),
            Destination::TempQueue {
                owner: 7,
                name: "reply".into(),
            },
            Destination::TempTopic {
                owner: 9,
                name: "t".into(),
            },
        ] {
            let mut out = String::from("kept:");
            d.push_header_form(&mut out);
            assert_eq!(out, format!("kept:{d}"));
        }
    }

    #[test]
    fn parses_every_kind_and_round_trips_remote_temp() {
        assert_eq!(
            Destination::parse("/queue/a.b", 1).unwrap(),
            Destination::Queue("a.b".into())
        );
        assert_eq!(
            Destination::parse("/topic/t", 1).unwrap(),
            Destination::Topic("t".into())
        );
        let tq = Destination::parse("/temp-queue/reply-1", 7).unwrap();
        assert_eq!(
            tq,
            Destination::TempQueue {
                owner: 7,
                name: "reply-1".into()
            }
        );
        let shown = tq.to_string();
        assert_eq!(shown, "/remote-temp-queue/haven-7-reply-1");
        assert_eq!(Destination::parse(&shown, 9).unwrap(), tq);
    }

    #[test]
    fn wildcards_follow_activemq() {
        assert!(is_wildcard("PRICE.>") && is_wildcard("PRICE.*.X") && !is_wildcard("PRICE.STOCK"));
        assert!(wildcard_matches("PRICE.>", "PRICE.STOCK.NASDAQ.ORCL"));
        assert!(
            wildcard_matches("PRICE.>", "PRICE"),
            "'>' matches zero or more segments"
        );
        assert!(wildcard_matches("PRICE.*.NASDAQ", "PRICE.STOCK.NASDAQ"));
        assert!(!wildcard_matches("PRICE.*.NASDAQ", "PRICE.STOCK.NYSE"));
        assert!(!wildcard_matches("PRICE.*", "PRICE.STOCK.NASDAQ"));
        assert!(!wildcard_matches("PRICE.*", "PRICE"));
        assert!(wildcard_matches(">", "anything.at.all"));
        assert!(!wildcard_matches("A.B", "A.B.C"));
    }

    #[test]
    fn virtual_topic_consumer_queues() {
        assert_eq!(
            virtual_topic_of("Consumer.A.VirtualTopic.Orders"),
            Some("VirtualTopic.Orders")
        );
        assert_eq!(virtual_topic_of("Consumer.A.B"), None);
        assert_eq!(virtual_topic_of("Consumer..VirtualTopic.X"), None);
        assert_eq!(virtual_topic_of("Consumer.A.VirtualTopic."), None);
        assert_eq!(virtual_topic_of("orders"), None);
    }

    #[test]
    fn rejects_bad_names() {
        assert!(matches!(
            Destination::parse("queue/a", 1),
            Err(DestinationError::UnknownPrefix(_))
        ));
        assert!(matches!(
            Destination::parse("/queue/", 1),
            Err(DestinationError::Empty(_))
        ));
        assert!(matches!(
            Destination::parse("/queue/a\u{1}", 1),
            Err(DestinationError::ControlCharacter(_))
        ));
        assert!(matches!(
            Destination::parse("/remote-temp-queue/x", 1),
            Err(DestinationError::BadRemoteTemp(_))
        ));
        let long = format!("/queue/{}", "x".repeat(DESTINATION_NAME_BYTES_MAX + 1));
        assert_eq!(Destination::parse(&long, 1), Err(DestinationError::TooLong));
    }
}
