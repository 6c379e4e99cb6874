//! What a caller can choose when connecting and subscribing, and how addresses are parsed.

use crate::ClientError;

/// Options for [`crate::Connection::connect`]. Every field has a default; the limits are bounded
/// so a slow consumer or a stalled socket cannot grow memory without end.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub login: Option<String>,
    pub passcode: Option<String>,
    /// Sent as `client-id`; names the owner of durable topic subscriptions.
    pub client_id: Option<String>,
    /// Virtual host for the `host` header; defaults to the host part of the address.
    pub host: Option<String>,
    /// Sent as `accept-version`.
    pub accept_version: String,
    /// `(cx, cy)` of the `heart-beat` header: the client can send every `cx` ms and wants to
    /// hear from the broker every `cy` ms. `(0, 0)` disables heart-beats.
    pub heartbeat_ms: (u64, u64),
    /// Extra CONNECT headers, sent after the ones above.
    pub headers: Vec<(String, String)>,
    /// Bound on TCP connect plus the CONNECT/CONNECTED exchange.
    pub connect_timeout_ms: u64,
    /// Messages buffered per subscription before the reader task waits for the application
    /// (which in turn stops reading the socket: TCP back-pressure to the broker).
    pub subscription_buffer_messages_max: usize,
    /// Frames queued for the writer task before `send` waits.
    pub write_queue_frames_max: usize,
    /// [`crate::Client`] only: the producer id sent as `haven-producer` with every SEND, so a
    /// Haven broker stores a resent message once. Default: a random id per `Client`.
    pub producer_id: Option<String>,
    /// [`crate::Client`] only: SENDs kept until their RECEIPT (to send again after a failover)
    /// before `send` waits. Bounds the client's memory while no broker is reachable.
    pub unconfirmed_sends_max: usize,
    /// [`crate::Client`] only: acknowledged message ids remembered per subscription to drop
    /// redeliveries of messages the application already acked.
    pub dedup_window_messages: usize,
    /// [`crate::Client`] only: what to do, after a reconnect to a store that forgot this
    /// producer (`ConnectionEvent::ProducerForgotten`), with the SENDs that were written and
    /// not yet confirmed: the store may hold them, and can no longer tell a resend from a new
    /// message. `true` (the default) sends them again: nothing is lost, some may be stored
    /// twice. `false` fails each with [`ClientError::OutcomeUnknown`] instead, so nothing is
    /// stored twice behind the application's back and it decides (look, or send again).
    pub resend_when_producer_forgotten: bool,
    /// How sockets are opened: TCP by default; the simulator passes its own network.
    pub dialer: crate::transport::Dialer,
    /// [`crate::Client`] only: seeds its random choices (broker order under `randomize`,
    /// back-off jitter, generated ids). Default: a random seed. The simulator sets it so that
    /// a run replays exactly.
    pub rng_seed: Option<u64>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            login: None,
            passcode: None,
            client_id: None,
            host: None,
            accept_version: "1.2,1.1,1.0".to_string(),
            heartbeat_ms: (0, 0),
            headers: Default::default(),
            connect_timeout_ms: 10_000,
            subscription_buffer_messages_max: 4096,
            write_queue_frames_max: 1024,
            producer_id: None,
            unconfirmed_sends_max: 4096,
            dedup_window_messages: 8192,
            resend_when_producer_forgotten: true,
            dialer: Default::default(),
            rng_seed: None,
        }
    }
}

/// The `ack` mode of a SUBSCRIBE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    Auto,
    /// Cumulative: acking a message acks every earlier message of the subscription.
    Client,
    ClientIndividual,
}

impl AckMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::Auto => "auto",
            AckMode::Client => "client",
            AckMode::ClientIndividual => "client-individual",
        }
    }
}

/// A parsed `tcp://host:port` or `host:port` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Address {
    pub host: String,
    /// `host:port`, as given to `TcpStream::connect`.
    pub authority: String,
}

pub(crate) fn parse_address(addr: &str) -> Result<Address, ClientError> {
    let bad = |reason: &str| ClientError::BadAddress {
        addr: addr.to_string(),
        reason: reason.to_string(),
    };
    let rest = if let Some(rest) = addr.strip_prefix("tcp://") {
        rest
    } else if let Some(rest) = addr.strip_prefix("stomp://") {
        rest
    } else if addr.contains("://") || addr.starts_with("failover:") {
        return Err(bad(
            "only tcp:// (or a bare host:port) is supported by Connection",
        ));
    } else {
        addr
    };
    // Drop any `?query` (ActiveMQ URIs carry transport options there) and a trailing slash.
    let rest = rest.split('?').next().unwrap_or("").trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("missing :port"))?;
    if host.is_empty() {
        return Err(bad("missing host"));
    }
    port.parse::<u16>()
        .map_err(|_| bad("port is not a number in 0..=65535"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok(Address {
        host,
        authority: rest.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcp_uri_and_bare_authority() {
        let a = parse_address("tcp://127.0.0.1:61613").unwrap();
        assert_eq!(a.host, "127.0.0.1");
        assert_eq!(a.authority, "127.0.0.1:61613");
        let b = parse_address("localhost:1234").unwrap();
        assert_eq!(b.host, "localhost");
        assert_eq!(b.authority, "localhost:1234");
        let c = parse_address("tcp://[::1]:61613?wireFormat.maxInactivityDuration=0").unwrap();
        assert_eq!(c.host, "::1");
        assert_eq!(c.authority, "[::1]:61613");
    }

    #[test]
    fn rejects_failover_and_missing_port() {
        assert!(matches!(
            parse_address("failover:(tcp://a:1,tcp://b:2)"),
            Err(ClientError::BadAddress { .. })
        ));
        assert!(parse_address("tcp://host").is_err());
        assert!(parse_address("tcp://host:notaport").is_err());
        assert!(parse_address(":61613").is_err());
    }
}
