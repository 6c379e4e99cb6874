//! Broker URIs: `tcp://host:port` and ActiveMQ's `failover:(uri1,...,uriN)?options`.
//!
//! The option names and defaults are ActiveMQ Classic's failover transport's, so a URI copied
//! from an ActiveMQ application means the same here. An option Haven does not implement is an
//! error, never silently ignored: an operator who sets `trackMessages=true` must learn that it
//! has no effect (Haven always resends unreceipted SENDs) rather than believe it configured
//! something.

use crate::options::parse_address;
use crate::ClientError;

/// Brokers named in one URI, with the failover options.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerUri {
    /// `tcp://host:port` of each broker, in the order given.
    pub brokers: Vec<String>,
    pub options: FailoverOptions,
    /// False for a plain `tcp://` URI: the connection is not re-established when it fails.
    pub failover: bool,
}

/// ActiveMQ's failover transport options. Times are milliseconds; `-1` means "no limit" where
/// ActiveMQ uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct FailoverOptions {
    /// `initialReconnectDelay`: wait after the first failed pass over the broker list.
    pub initial_reconnect_delay_ms: u64,
    /// `maxReconnectDelay`: the back-off never waits longer than this.
    pub max_reconnect_delay_ms: u64,
    /// `useExponentialBackOff`: multiply the delay after each failed pass.
    pub use_exponential_back_off: bool,
    /// `backOffMultiplier` (alias `reconnectDelayExponent`).
    pub back_off_multiplier: f64,
    /// `reconnectDelayJitter`: a random 0..=jitter ms added to each delay, so clients that lost
    /// the same broker do not all reconnect in the same millisecond.
    pub reconnect_delay_jitter_ms: u64,
    /// `maxReconnectAttempts`: passes over the list after a connection is lost before giving
    /// up; -1 forever, 0 never reconnect.
    pub max_reconnect_attempts: i64,
    /// `startupMaxReconnectAttempts`: the same for the very first connection; -1 forever.
    pub startup_max_reconnect_attempts: i64,
    /// `randomize`: try the brokers in a random order (spreads clients over brokers).
    pub randomize: bool,
    /// `priorityBackup`: while connected to a broker that is not a priority one, keep trying
    /// the priority ones and move back as soon as one answers.
    pub priority_backup: bool,
    /// `priorityURIs`: the priority brokers; default the first of the list.
    pub priority_uris: Vec<String>,
    /// `timeout`: an operation that cannot reach a broker within this fails with
    /// [`ClientError::Timeout`]; -1 waits for as long as reconnecting goes on.
    pub timeout_ms: i64,
    /// `backup`: keep a second connection open to another broker, used at once on failure.
    pub backup: bool,
    /// `updateURIsSupported`: merge the broker addresses a Haven cluster announces into the
    /// list (`haven-cluster` header) and follow its rebalance requests.
    pub update_uris_supported: bool,
    /// `warnAfterReconnectAttempts`: log a warning every this many failed passes (0: never).
    pub warn_after_reconnect_attempts: u64,
}

impl Default for FailoverOptions {
    fn default() -> Self {
        FailoverOptions {
            initial_reconnect_delay_ms: 10,
            max_reconnect_delay_ms: 30_000,
            use_exponential_back_off: true,
            back_off_multiplier: 2.0,
            reconnect_delay_jitter_ms: 0,
            max_reconnect_attempts: -1,
            startup_max_reconnect_attempts: -1,
            randomize: true,
            priority_backup: false,
            priority_uris: Vec::new(),
            timeout_ms: -1,
            backup: false,
            update_uris_supported: true,
            warn_after_reconnect_attempts: 10,
        }
    }
}

/// Brokers a URI may list; a longer list is almost certainly a mistake (a pasted file).
const BROKERS_MAX: usize = 64;

/// Parses `tcp://h:p`, `h:p`, `failover:(u1,u2)?opts`, `failover:u1,u2` and
/// `failover://(u1,u2)?opts`.
pub fn parse_uri(uri: &str) -> Result<BrokerUri, ClientError> {
    let bad = |reason: String| ClientError::BadAddress {
        addr: uri.to_string(),
        reason,
    };
    let trimmed = uri.trim();
    let Some(rest) = trimmed.strip_prefix("failover:") else {
        let address = parse_address(trimmed)?;
        return Ok(BrokerUri {
            brokers: vec![format!("tcp://{}", address.authority)],
            options: FailoverOptions {
                max_reconnect_attempts: 0,
                startup_max_reconnect_attempts: 0,
                randomize: false,
                ..FailoverOptions::default()
            },
            failover: false,
        });
    };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (list, query) = if let Some(inner) = rest.strip_prefix('(') {
        let close = inner
            .find(')')
            .ok_or_else(|| bad("'(' without a matching ')'".into()))?;
        let after = &inner[close + 1..];
        let query = match after {
            "" => None,
            q if q.starts_with('?') => Some(&q[1..]),
            other => {
                return Err(bad(format!(
                    "unexpected {other:?} after the broker list (options start with '?')"
                )))
            }
        };
        (&inner[..close], query)
    } else {
        // `failover:u1,u2`: ActiveMQ allows no options in this form, since a `?` would belong
        // to the last nested URI.
        if rest.contains('?') {
            return Err(bad(
                "options need the parenthesised form failover:(uri1,uri2)?options".into(),
            ));
        }
        (rest, None)
    };
    let mut brokers = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(bad("empty broker in the list".into()));
        }
        if part.contains('?') {
            return Err(bad(format!(
                "{part}: options on a nested URI are not supported (put failover options after the list)"
            )));
        }
        let address = parse_address(part).map_err(|e| bad(e.to_string()))?;
        brokers.push(format!("tcp://{}", address.authority));
    }
    if brokers.is_empty() {
        return Err(bad("no broker in the list".into()));
    }
    if brokers.len() > BROKERS_MAX {
        return Err(bad(format!("more than {BROKERS_MAX} brokers")));
    }
    let mut options = FailoverOptions::default();
    if let Some(query) = query {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("option {pair:?} has no '=value'")))?;
            set_option(&mut options, key, value).map_err(bad)?;
        }
    }
    for p in &options.priority_uris {
        if !brokers.contains(p) {
            return Err(bad(format!(
                "priorityURIs names {p}, which is not in the broker list"
            )));
        }
    }
    if options.back_off_multiplier < 1.0 {
        return Err(bad("backOffMultiplier must be at least 1".into()));
    }
    Ok(BrokerUri {
        brokers,
        options,
        failover: true,
    })
}

fn set_option(o: &mut FailoverOptions, key: &str, value: &str) -> Result<(), String> {
    let uint = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| format!("option {key}={v}: expected a whole number of milliseconds"))
    };
    let int = |v: &str| {
        v.parse::<i64>()
            .ok()
            .filter(|n| *n >= -1)
            .ok_or_else(|| format!("option {key}={v}: expected -1 or a whole number"))
    };
    let boolean = |v: &str| match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("option {key}={v}: expected true or false")),
    };
    match key {
        "initialReconnectDelay" => o.initial_reconnect_delay_ms = uint(value)?,
        "maxReconnectDelay" => o.max_reconnect_delay_ms = uint(value)?,
        "useExponentialBackOff" => o.use_exponential_back_off = boolean(value)?,
        "backOffMultiplier" | "reconnectDelayExponent" => {
            o.back_off_multiplier = value
                .parse::<f64>()
                .ok()
                .filter(|m| m.is_finite())
                .ok_or_else(|| format!("option {key}={value}: expected a number"))?
        }
        "reconnectDelayJitter" => o.reconnect_delay_jitter_ms = uint(value)?,
        "maxReconnectAttempts" => o.max_reconnect_attempts = int(value)?,
        "startupMaxReconnectAttempts" => o.startup_max_reconnect_attempts = int(value)?,
        "randomize" => o.randomize = boolean(value)?,
        "priorityBackup" => o.priority_backup = boolean(value)?,
        "priorityURIs" => {
            let mut uris = Vec::new();
            for part in value.split(',').filter(|p| !p.trim().is_empty()) {
                let a = parse_address(part.trim()).map_err(|e| format!("priorityURIs: {e}"))?;
                uris.push(format!("tcp://{}", a.authority));
            }
            o.priority_uris = uris;
        }
        "timeout" => o.timeout_ms = int(value)?,
        "backup" => o.backup = boolean(value)?,
        "updateURIsSupported" => o.update_uris_supported = boolean(value)?,
        "warnAfterReconnectAttempts" => o.warn_after_reconnect_attempts = uint(value)?,
        "trackMessages" | "maxCacheSize" | "trackTransactionProducers" => {
            return Err(format!(
                "option {key} is not supported: Haven always keeps every unreceipted SEND and sends it again after a reconnect"
            ))
        }
        "backupPoolSize" | "reconnectSupported" | "updateURIsURL" | "nested" => {
            return Err(format!("option {key} is not supported by Haven's client"))
        }
        other => return Err(format!("unknown option {other:?}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tcp_is_one_broker_without_reconnect() {
        let u = parse_uri("tcp://127.0.0.1:61613").unwrap();
        assert_eq!(u.brokers, vec!["tcp://127.0.0.1:61613"]);
        assert!(!u.failover);
        assert_eq!(u.options.max_reconnect_attempts, 0);
        let bare = parse_uri("localhost:1").unwrap();
        assert_eq!(bare.brokers, vec!["tcp://localhost:1"]);
    }

    #[test]
    fn failover_defaults_are_activemqs() {
        let u = parse_uri("failover:(tcp://a:1,tcp://b:2)").unwrap();
        assert!(u.failover);
        assert_eq!(u.brokers, vec!["tcp://a:1", "tcp://b:2"]);
        let o = &u.options;
        assert_eq!(o.initial_reconnect_delay_ms, 10);
        assert_eq!(o.max_reconnect_delay_ms, 30_000);
        assert!(o.use_exponential_back_off);
        assert_eq!(o.back_off_multiplier, 2.0);
        assert_eq!(o.max_reconnect_attempts, -1);
        assert_eq!(o.startup_max_reconnect_attempts, -1);
        assert!(o.randomize);
        assert!(!o.priority_backup);
        assert_eq!(o.timeout_ms, -1);
        assert!(!o.backup);
        assert_eq!(*o, FailoverOptions::default());
    }

    #[test]
    fn every_option_is_parsed() {
        let u = parse_uri(
            "failover://(tcp://a:1,b:2)?initialReconnectDelay=100&maxReconnectDelay=5000\
             &useExponentialBackOff=false&backOffMultiplier=1.5&reconnectDelayJitter=20\
             &maxReconnectAttempts=3&startupMaxReconnectAttempts=0&randomize=false\
             &priorityBackup=true&priorityURIs=tcp://b:2&timeout=250&backup=true\
             &updateURIsSupported=false&warnAfterReconnectAttempts=0",
        )
        .unwrap();
        let o = u.options;
        assert_eq!(u.brokers, vec!["tcp://a:1", "tcp://b:2"]);
        assert_eq!(o.initial_reconnect_delay_ms, 100);
        assert_eq!(o.max_reconnect_delay_ms, 5000);
        assert!(!o.use_exponential_back_off);
        assert_eq!(o.back_off_multiplier, 1.5);
        assert_eq!(o.reconnect_delay_jitter_ms, 20);
        assert_eq!(o.max_reconnect_attempts, 3);
        assert_eq!(o.startup_max_reconnect_attempts, 0);
        assert!(!o.randomize);
        assert!(o.priority_backup);
        assert_eq!(o.priority_uris, vec!["tcp://b:2"]);
        assert_eq!(o.timeout_ms, 250);
        assert!(o.backup);
        assert!(!o.update_uris_supported);
        assert_eq!(o.warn_after_reconnect_attempts, 0);
        let alias = parse_uri("failover:(tcp://a:1)?reconnectDelayExponent=3").unwrap();
        assert_eq!(alias.options.back_off_multiplier, 3.0);
    }

    #[test]
    fn unparenthesised_list() {
        let u = parse_uri("failover:tcp://a:1,tcp://b:2").unwrap();
        assert_eq!(u.brokers, vec!["tcp://a:1", "tcp://b:2"]);
    }

    fn reason(uri: &str) -> String {
        match parse_uri(uri) {
            Err(ClientError::BadAddress { reason, .. }) => reason,
            other => panic!("{uri}: expected BadAddress, got {other:?}"),
        }
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        assert!(reason("failover:(tcp://a:1?x=1)").contains("nested"));
        assert!(reason("failover:(tcp://a:1").contains("matching ')'"));
        assert!(reason("failover:(tcp://a:1)?bogus=1").contains("unknown option \"bogus\""));
        assert!(reason("failover:(tcp://a:1)?trackMessages=true").contains("not supported"));
        assert!(reason("failover:(tcp://a:1)?randomize=yes").contains("true or false"));
        assert!(reason("failover:(tcp://a:1)?maxReconnectAttempts=-2").contains("-1"));
        assert!(reason("failover:(tcp://a:1)?initialReconnectDelay").contains("no '=value'"));
        assert!(reason("failover:(tcp://a:1,,tcp://b:2)").contains("empty broker"));
        assert!(reason("failover:()").contains("empty broker"));
        assert!(reason("failover:(tcp://a)").contains("port"));
        assert!(reason("failover:(tcp://a:1)x").contains("after the broker list"));
        assert!(reason("failover:tcp://a:1?randomize=false").contains("parenthesised"));
        assert!(reason("failover:(tcp://a:1)?priorityURIs=tcp://c:3")
            .contains("not in the broker list"));
        assert!(reason("failover:(tcp://a:1)?backOffMultiplier=0.5").contains("at least 1"));
        assert!(matches!(
            parse_uri("http://a:1"),
            Err(ClientError::BadAddress { .. })
        ));
    }
}
