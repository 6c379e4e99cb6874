//! Which destinations a connector forwards: `staticallyIncludedDestinations` always,
//! `dynamicallyIncludedDestinations` on demand (all when the list is empty), never
//! `excludedDestinations`. Destinations are written `/queue/NAME` or `/topic/NAME`, with
//! ActiveMQ's wildcards (`*` one segment, `>` the rest).

use haven_engine::wildcard_matches;

/// How a temporary queue of another connection is named (`/remote-temp-queue/haven-<c>-<n>`).
pub const TEMP_QUEUE_PREFIX: &str = "/remote-temp-queue/";

#[derive(Debug, Clone, Default)]
pub struct Filter {
    statics: Vec<String>,
    dynamics: Vec<String>,
    excluded: Vec<String>,
}

/// Splits `/queue/a.b` into (false, "a.b") and `/topic/a.b` into (true, "a.b").
pub fn split(destination: &str) -> Option<(bool, &str)> {
    if let Some(name) = destination.strip_prefix("/queue/") {
        return Some((false, name));
    }
    destination.strip_prefix("/topic/").map(|n| (true, n))
}

/// Whether `pattern` (a config entry) covers `destination`. A destination that is itself a
/// pattern (a wildcard consumer's) is covered when the pattern matches it read as a name.
fn covers(pattern: &str, destination: &str) -> bool {
    match (split(pattern), split(destination)) {
        (Some((pt, pn)), Some((dt, dn))) => pt == dt && wildcard_matches(pn, dn),
        _ => false,
    }
}

impl Filter {
    pub fn new(statics: &[String], dynamics: &[String], excluded: &[String]) -> Filter {
        Filter {
            statics: statics.to_vec(),
            dynamics: dynamics.to_vec(),
            excluded: excluded.to_vec(),
        }
    }

    pub fn statics(&self) -> &[String] {
        &self.statics
    }

    pub fn is_excluded(&self, destination: &str) -> bool {
        self.excluded.iter().any(|p| covers(p, destination))
    }

    /// Whether demand for `destination` is followed. A static include covers it already (a
    /// second subscription would copy topic messages twice).
    pub fn follows_demand(&self, destination: &str) -> bool {
        !self.is_excluded(destination)
            && !self.statics.iter().any(|p| covers(p, destination))
            && (self.dynamics.is_empty() || self.dynamics.iter().any(|p| covers(p, destination)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(statics: &[&str], dynamics: &[&str], excluded: &[&str]) -> Filter {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Filter::new(&v(statics), &v(dynamics), &v(excluded))
    }

    #[test]
    fn everything_by_default() {
        let f = f(&[], &[], &[]);
        assert!(f.follows_demand("/queue/a"));
        assert!(f.follows_demand("/topic/a.b"));
    }

    #[test]
    fn excluded_wins_and_kinds_differ() {
        let f = f(&[], &["/queue/>"], &["/queue/local.>"]);
        assert!(f.follows_demand("/queue/orders"));
        assert!(!f.follows_demand("/queue/local.x"));
        assert!(!f.follows_demand("/topic/orders"));
        assert!(f.is_excluded("/queue/local.x"));
    }

    #[test]
    fn static_includes_are_not_followed_twice() {
        let f = f(&["/topic/prices.>"], &[], &[]);
        assert!(!f.follows_demand("/topic/prices.eu"));
        assert!(f.follows_demand("/topic/news"));
    }
}
