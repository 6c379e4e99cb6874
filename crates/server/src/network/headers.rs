//! The STOMP headers brokers in a network use with each other. Each is an ordinary header, so
//! any STOMP tool can read them; only the ones below steer the broker.

/// CONNECTED: the broker's name (`[broker] name`), unique in a network.
pub const BROKER_HEADER: &str = "haven-broker";

/// SEND: the message's identity on the broker it was forwarded from (`<store>/<message-id>`).
/// A second SEND with the same origin is answered and not stored, so a bridge may resend
/// whatever it is unsure about.
pub const ORIGIN_HEADER: &str = "haven-net-origin";

/// SEND and MESSAGE: the brokers the message was on before this one, oldest first, joined by
/// `,` (see `path.rs`).
pub const PATH_HEADER: &str = "haven-net-path";

/// SUBSCRIBE: the subscription is a bridge's, on behalf of consumers at the end of this path
/// (consumers' broker first, the broker it forwards to last).
pub const DEMAND_HEADER: &str = "haven-net-demand";

/// SUBSCRIBE: how far a bridge's subscription ranks below local consumers
/// (`decreaseNetworkConsumerPriority`).
pub const PENALTY_HEADER: &str = "haven-net-priority-penalty";

/// Consumer advisories: which destination the advisory is about, and its consumers (`-` for
/// a local consumer, else the demand path), joined by `;`.
pub const ADVISORY_FOR_HEADER: &str = "haven-advisory-for";
pub const ADVISORY_DEMAND_HEADER: &str = "haven-demand";

/// Where consumer advisories are published (ActiveMQ's names: `...Consumer.Queue.<name>`,
/// `...Consumer.Topic.<name>`, `...Consumer.TempQueue.<name>`); a bridge subscribes to all.
pub const CONSUMER_ADVISORIES: &str = "/topic/ActiveMQ.Advisory.Consumer.>";
