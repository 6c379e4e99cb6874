//! Networks of brokers: store-and-forward between brokers, driven by where the consumers are
//! (docs/NETWORK.md).
//!
//! Each `[[network]]` connector becomes one bridge per remote broker (`bridge.rs`). A bridge
//! learns the remote broker's consumers from its consumer advisories (`demand.rs`), subscribes
//! here on their behalf, and forwards each message with its origin and broker path
//! (`path.rs`), removing it here only once the remote broker has stored it.

mod bridge;
mod demand;
mod filter;
pub mod headers;
mod link;
mod local;
pub mod path;

use crate::config::{is_destination_pattern, NetworkConnector};
use crate::connection::Shared;
use std::sync::Arc;

/// Longest `prefetch_size`: a bridge's connection buffers a whole window per subscription.
const PREFETCH_MAX: u32 = 100_000;

/// Bridges a connector URI asks for, each as the addresses to try in order:
/// `static:(a,b)` → one bridge to a and one to b; `failover:(a,b)` → one bridge to whichever
/// of a and b serves; `tcp://a` → one bridge.
pub(crate) fn targets(uri: &str) -> Result<Vec<Vec<String>>, String> {
    let uri = uri.trim();
    if let Some(rest) = uri.strip_prefix("static:") {
        let inner = rest
            .strip_prefix('(')
            .and_then(|r| r.split_once(')'))
            .map(|(inner, _)| inner)
            .unwrap_or(rest);
        let mut out = Vec::new();
        for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out.push(addresses(part)?);
        }
        if out.is_empty() {
            return Err(format!("'{uri}' names no broker"));
        }
        return Ok(out);
    }
    Ok(vec![addresses(uri)?])
}

fn addresses(uri: &str) -> Result<Vec<String>, String> {
    haven_client::parse_uri(uri)
        .map(|u| u.brokers)
        .map_err(|e| e.to_string())
}

/// Checks one connector; the error names the key.
pub(crate) fn check(broker_name: &str, n: &NetworkConnector) -> Result<(), (&'static str, String)> {
    if !path::valid_name(broker_name) {
        return Err((
            "broker.name",
            format!(
                "'{broker_name}' cannot name a broker in a network: 1 to {} bytes, no \
                 spaces, ',', ';', '/' or ':'",
                path::NAME_BYTES_MAX
            ),
        ));
    }
    targets(&n.uri).map_err(|e| ("network.uri", e))?;
    if n.network_ttl == 0 {
        return Err(("network.network_ttl", "must be at least 1".into()));
    }
    if n.prefetch_size == 0 || n.prefetch_size > PREFETCH_MAX {
        return Err((
            "network.prefetch_size",
            format!("{} is not between 1 and {PREFETCH_MAX}", n.prefetch_size),
        ));
    }
    if n.reconnect_delay_ms == 0 || n.reconnect_delay_max_ms < n.reconnect_delay_ms {
        return Err((
            "network.reconnect_delay_ms",
            "must be at least 1 and at most reconnect_delay_max_ms".into(),
        ));
    }
    for (key, list) in [
        (
            "network.statically_included_destinations",
            &n.statically_included_destinations,
        ),
        (
            "network.dynamically_included_destinations",
            &n.dynamically_included_destinations,
        ),
        ("network.excluded_destinations", &n.excluded_destinations),
    ] {
        if let Some(bad) = list.iter().find(|d| !is_destination_pattern(d)) {
            return Err((
                key,
                format!("'{bad}' must be /queue/NAME or /topic/NAME (wildcards allowed)"),
            ));
        }
    }
    Ok(())
}

/// The running bridges of a broker; dropping it stops them (their thread's runtime drops
/// every bridge task).
pub(crate) struct Network {
    /// The bridges' own thread; None for a broker without connectors.
    _thread: Option<BridgeThread>,
}

/// The thread every bridge of a broker runs on, with a single-threaded runtime of its own.
///
/// Why not the broker's workers: there are few of them (one on a 2-core machine), and a bridge
/// there is one task among every producer's connection. Measured (issue 8, scenario (c) A → B):
/// while four producers sent to A at 250k msg/s, A's bridge got so little of the worker that it
/// forwarded 8k–28k msg/s, A paged the backlog out, and B sat idle until the producers stopped.
/// On a thread of its own the OS scheduler gives the bridge its share beside the worker:
/// forwarding ran at 50k–75k msg/s while the producers sent, and the run's rate rose from
/// 72k–75k to 78k–84k msg/s. Deliveries and acknowledgements already cross a channel to the
/// core (`local.rs`), so nothing else changes.
struct BridgeThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl BridgeThread {
    /// Returns once the thread runs its runtime (so it exists, under its name, from here on).
    fn start() -> std::io::Result<(BridgeThread, tokio::runtime::Handle)> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (started, handle) = std::sync::mpsc::sync_channel(1);
        let join = std::thread::Builder::new()
            .name("haven-bridges".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                let _ = started.send(Ok(runtime.handle().clone()));
                // Returns when `stop` is sent or dropped; dropping the runtime then drops every
                // bridge task, closing its connections.
                let _ = runtime.block_on(stopped);
            })?;
        let thread = BridgeThread {
            stop: Some(stop),
            join: Some(join),
        };
        let handle = handle
            .recv()
            .expect("the bridges' thread reports before it ends")?;
        Ok((thread, handle))
    }
}

impl Drop for BridgeThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(join) = self.join.take() {
            // Only drops futures: quick, and it means the bridges' sockets are closed once the
            // broker has stopped.
            let _ = join.join();
        }
    }
}

/// Starts every connector's bridges on the broker `here` (each reaches it in process, see
/// `local.rs`), on a thread of their own.
pub(crate) fn start(here: &Arc<Shared>) -> std::io::Result<Network> {
    let config = &here.config;
    if config.network.is_empty() {
        return Ok(Network { _thread: None });
    }
    let (thread, runtime) = BridgeThread::start()?;
    for (i, n) in config.network.iter().enumerate() {
        let name = if n.name.is_empty() {
            format!("network-{}", i + 1)
        } else {
            n.name.clone()
        };
        let targets = targets(&n.uri).expect("validated with the config");
        for remote in targets {
            let spec = bridge::Spec {
                label: format!("{name} → {}", remote.join("|")),
                remote,
                here: here.clone(),
                cfg: n.clone(),
            };
            // Detached: the runtime owns the task and drops it when the thread stops.
            drop(runtime.spawn(bridge::run(spec)));
        }
    }
    Ok(Network {
        _thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_uris_make_one_bridge_per_broker() {
        assert_eq!(
            targets("static:(tcp://b:1,tcp://c:2)").unwrap(),
            vec![vec!["tcp://b:1".to_string()], vec!["tcp://c:2".to_string()]]
        );
        assert_eq!(
            targets("failover:(tcp://b:1,tcp://c:2)").unwrap(),
            vec![vec!["tcp://b:1".to_string(), "tcp://c:2".to_string()]]
        );
        assert_eq!(
            targets("tcp://b:1").unwrap(),
            vec![vec!["tcp://b:1".to_string()]]
        );
        assert!(targets("static:()").is_err());
        assert!(targets("bogus://x").is_err());
    }

    #[test]
    fn checks_name_and_options() {
        let ok = NetworkConnector {
            uri: "static:(tcp://127.0.0.1:1)".into(),
            ..NetworkConnector::default()
        };
        assert!(check("A", &ok).is_ok());
        assert_eq!(check("a,b", &ok).unwrap_err().0, "broker.name");
        let bad = NetworkConnector {
            excluded_destinations: vec!["queue.x".into()],
            ..ok.clone()
        };
        assert_eq!(
            check("A", &bad).unwrap_err().0,
            "network.excluded_destinations"
        );
        let bad = NetworkConnector {
            network_ttl: 0,
            ..ok
        };
        assert_eq!(check("A", &bad).unwrap_err().0, "network.network_ttl");
    }
}
