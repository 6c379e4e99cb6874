//! Cluster discovery pushed to clients (ActiveMQ's `updateClusterClients` and
//! `rebalanceClusterClients`): the broker announces the client-facing addresses of the brokers
//! in its cluster, so a failover client learns members it was not configured with.
//!
//! The settings (`[cluster]`) live in one `watch` channel owned by the server. Whoever decides
//! membership — today the operator through SIGHUP (`haven run`), later Raft — calls
//! [`ClusterHandle::set_cluster`]; every connection task holds a receiver and selects on it in
//! its run loop. A watch rather than a broadcast: a connection that is slow to notice two
//! changes in a row only needs the latest list, so nothing queues per connection and no
//! connection can lag behind and lose an announcement.
//!
//! What a client sees:
//! - CONNECTED carries `haven-cluster: tcp://a:1,tcp://b:2` (config order) while
//!   `update_cluster_clients` is on and `members` is non-empty;
//! - a client whose CONNECT carried `haven-cluster-updates: true` is sent, whenever the
//!   announcement (the list or the rebalance flag) changes, an unsolicited MESSAGE on
//!   subscription `haven.cluster` ([`announcement_frame`]). It belongs to no subscription the
//!   client made and must not be ACKed: the broker does not know its id and would answer with
//!   an ERROR. Clients that did not opt in never get it (a plain STOMP client would treat a
//!   MESSAGE for an unknown subscription as a protocol error).
//!
//! Announcements are numbered per broker (`message-id: haven-cluster-<n>`, n from 1; CONNECTED
//! describes announcement 0 or the latest one), so a client can tell a repeat from news.

use crate::config::ClusterConfig;
use haven_stomp::{Command as Cmd, Frame};
use std::sync::Arc;
use tokio::sync::watch;

/// CONNECT header by which a client asks for pushed announcements.
pub const UPDATES_HEADER: &str = "haven-cluster-updates";
/// CONNECTED and announcement header: the members, comma-separated.
pub const MEMBERS_HEADER: &str = "haven-cluster";
/// Announcement header: `true` asks the client to reconnect to a randomly chosen member.
pub const REBALANCE_HEADER: &str = "haven-rebalance";
/// `subscription` of an announcement; no client subscription is involved.
pub const ANNOUNCEMENT_SUBSCRIPTION: &str = "haven.cluster";
/// `destination` of an announcement.
pub const ANNOUNCEMENT_DESTINATION: &str = "/topic/haven.cluster";

/// Most members a cluster may list.
pub const CLUSTER_MEMBERS_MAX: usize = 64;
/// Longest member list as a header value, so every client's default header limit (10 KiB in
/// haven-client, ActiveMQ and stomp.py alike) has room for it.
pub const MEMBERS_HEADER_BYTES_MAX: usize = 4096;

/// Why cluster settings were refused. The config file and [`ClusterHandle::set_cluster`]
/// apply the same rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("'{entry}' is not tcp://host:port: {reason}")]
    BadMember { entry: String, reason: &'static str },
    #[error("'{entry}' is listed twice")]
    DuplicateMember { entry: String },
    #[error("{count} members; at most {CLUSTER_MEMBERS_MAX}")]
    TooManyMembers { count: usize },
    #[error("the member list takes {bytes} bytes as a header; at most {MEMBERS_HEADER_BYTES_MAX}")]
    MembersTooLong { bytes: usize },
    #[error(
        "needs update_cluster_clients = true: a rebalance request travels with the member list"
    )]
    RebalanceWithoutUpdate,
}

impl ClusterError {
    /// The config key the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            ClusterError::RebalanceWithoutUpdate => "cluster.rebalance_cluster_clients",
            _ => "cluster.members",
        }
    }
}

/// Checks cluster settings: every member is `tcp://host:port` and listed once, the list fits
/// its bounds, and a rebalance is only asked for together with announcements.
pub fn check(c: &ClusterConfig) -> Result<(), ClusterError> {
    if c.members.len() > CLUSTER_MEMBERS_MAX {
        return Err(ClusterError::TooManyMembers {
            count: c.members.len(),
        });
    }
    for (i, entry) in c.members.iter().enumerate() {
        check_member(entry).map_err(|reason| ClusterError::BadMember {
            entry: entry.clone(),
            reason,
        })?;
        if c.members[..i].contains(entry) {
            return Err(ClusterError::DuplicateMember {
                entry: entry.clone(),
            });
        }
    }
    let bytes = members_header(&c.members).len();
    if bytes > MEMBERS_HEADER_BYTES_MAX {
        return Err(ClusterError::MembersTooLong { bytes });
    }
    if c.rebalance_cluster_clients && !c.update_cluster_clients {
        return Err(ClusterError::RebalanceWithoutUpdate);
    }
    Ok(())
}

/// `tcp://host:port`, host a name, an IPv4 address or a bracketed IPv6 address. Nothing that
/// would break the comma-separated header (a comma, white space) or that a client could not
/// dial (a query string, a path, port 0).
fn check_member(entry: &str) -> Result<(), &'static str> {
    let rest = entry
        .strip_prefix("tcp://")
        .ok_or("must start with tcp://")?;
    if rest
        .chars()
        .any(|c| c == ',' || c == '/' || c == '?' || c.is_whitespace() || c.is_control())
    {
        return Err("only host:port may follow tcp:// (no comma, space, path or query)");
    }
    let (host, port) = rest.rsplit_once(':').ok_or("missing :port")?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err("port must be a number in 1..=65535"),
    }
    let bare = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .filter(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
            .ok_or("a bracketed host must be an IPv6 address")?,
        None if host.contains(':') => return Err("an IPv6 host must be in brackets"),
        None => host,
    };
    if bare.is_empty() {
        return Err("missing host");
    }
    Ok(())
}

/// The comma-separated header value, config order.
fn members_header(members: &[String]) -> String {
    members.join(",")
}

/// One announcement: what the broker tells clients about its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Announcement {
    /// 0 for the settings the broker started with (only ever seen in CONNECTED); pushes count
    /// from 1.
    n: u64,
    /// [`MEMBERS_HEADER`]'s value.
    members: String,
    rebalance: bool,
}

/// The watched value.
#[derive(Debug)]
struct ClusterState {
    settings: ClusterConfig,
    /// None while there is nothing to announce (updates off, or no members).
    announcement: Option<Announcement>,
    /// Announcements pushed so far (the highest `n` given out).
    pushed: u64,
}

/// What the settings announce, if anything: (members header, rebalance).
fn announced(settings: &ClusterConfig) -> Option<(String, bool)> {
    (settings.update_cluster_clients && !settings.members.is_empty()).then(|| {
        (
            members_header(&settings.members),
            settings.rebalance_cluster_clients,
        )
    })
}

/// What [`ClusterHandle::set_cluster`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterChange {
    /// The settings were the ones in force already.
    Unchanged,
    /// Settings replaced; what clients are told did not change (or there is nothing to tell).
    Applied,
    /// Settings replaced and announcement `n` pushed to every client that opted in.
    Announced { n: u64 },
}

/// The cluster settings of one running broker, shared by the server, its connections and
/// whoever changes membership. Cheap to clone; every clone acts on the same settings.
#[derive(Clone, Debug)]
pub struct ClusterHandle {
    tx: Arc<watch::Sender<ClusterState>>,
}

impl ClusterHandle {
    /// Panics on settings that [`check`] refuses: the caller validated its config.
    pub(crate) fn new(settings: ClusterConfig) -> ClusterHandle {
        assert_eq!(check(&settings), Ok(()), "cluster settings were validated");
        let announcement = announced(&settings).map(|(members, rebalance)| Announcement {
            n: 0,
            members,
            rebalance,
        });
        let (tx, _) = watch::channel(ClusterState {
            settings,
            announcement,
            pushed: 0,
        });
        ClusterHandle { tx: Arc::new(tx) }
    }

    /// The settings in force.
    pub fn current(&self) -> ClusterConfig {
        self.tx.borrow().settings.clone()
    }

    /// Replaces the cluster settings. When what clients are told changes (the member list, the
    /// rebalance flag, announcements switched on), every connection that opted in is pushed the
    /// new announcement; connections opened from now on see it in CONNECTED. Settings that
    /// [`check`] refuses change nothing.
    ///
    /// Safe to call from any thread, at any rate: connections only ever act on the latest
    /// settings, and each announcement is numbered once.
    pub fn set_cluster(&self, settings: ClusterConfig) -> Result<ClusterChange, ClusterError> {
        check(&settings)?;
        let mut change = ClusterChange::Unchanged;
        self.tx.send_if_modified(|state| {
            if state.settings == settings {
                return false;
            }
            let next = announced(&settings);
            let same = match (&state.announcement, &next) {
                (Some(a), Some((members, rebalance))) => {
                    a.members == *members && a.rebalance == *rebalance
                }
                (None, None) => true,
                _ => false,
            };
            change = ClusterChange::Applied;
            if !same {
                state.announcement = next.map(|(members, rebalance)| {
                    state.pushed += 1;
                    change = ClusterChange::Announced { n: state.pushed };
                    Announcement {
                        n: state.pushed,
                        members,
                        rebalance,
                    }
                });
            }
            state.settings = settings.clone();
            true
        });
        if change != ClusterChange::Unchanged {
            let announcement = match change {
                ClusterChange::Announced { n } => Some(n),
                _ => None,
            };
            tracing::info!(
                members = %members_header(&settings.members),
                update_cluster_clients = settings.update_cluster_clients,
                rebalance_cluster_clients = settings.rebalance_cluster_clients,
                announcement,
                "cluster settings changed"
            );
        }
        Ok(change)
    }

    /// For a new connection: adds [`MEMBERS_HEADER`] to its CONNECTED frame if there is
    /// something to announce, and returns the feed of later announcements if the client asked
    /// for them. Everything announced after this call reaches the feed; nothing before it does
    /// (CONNECTED already said it).
    pub(crate) fn attach(&self, updates: bool, connected: &mut Frame) -> Option<ClusterFeed> {
        let mut rx = self.tx.subscribe();
        let seen = {
            let state = rx.borrow_and_update();
            if let Some(a) = &state.announcement {
                connected.push_header(MEMBERS_HEADER, a.members.clone());
            }
            state.pushed
        };
        updates.then_some(ClusterFeed { rx, seen })
    }
}

/// One connection's view of the announcements (only for clients that opted in).
pub(crate) struct ClusterFeed {
    rx: watch::Receiver<ClusterState>,
    /// The highest announcement this connection has been told.
    seen: u64,
}

impl ClusterFeed {
    /// Waits for an announcement newer than the last one this connection was told and returns
    /// the frame to push. Cancel-safe (a `select!` branch): nothing is consumed until it
    /// returns. Never returns once the broker's settings are gone (shutdown).
    pub(crate) async fn next(&mut self) -> Frame {
        loop {
            if self.rx.changed().await.is_err() {
                return std::future::pending().await;
            }
            let frame = {
                let state = self.rx.borrow_and_update();
                match &state.announcement {
                    Some(a) if a.n > self.seen => {
                        assert!(a.n <= state.pushed, "announcements are numbered once");
                        self.seen = a.n;
                        Some(announcement_frame(a))
                    }
                    _ => None,
                }
            };
            if let Some(frame) = frame {
                return frame;
            }
        }
    }
}

/// The next announcement for a connection with a feed; for one without (the client did not
/// opt in), never. A `select!` branch for every connection.
pub(crate) async fn next_announcement(feed: &mut Option<ClusterFeed>) -> Frame {
    match feed {
        Some(feed) => feed.next().await,
        None => std::future::pending().await,
    }
}

/// Parses the CONNECT header [`UPDATES_HEADER`]: absent means no.
pub(crate) fn wants_updates(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(format!(
            "{UPDATES_HEADER} must be 'true' or 'false', not '{v}'"
        )),
    }
}

/// The pushed MESSAGE: no body, no `ack` header (it needs no acknowledgement).
fn announcement_frame(a: &Announcement) -> Frame {
    Frame::new(Cmd::Message)
        .with_header("subscription", ANNOUNCEMENT_SUBSCRIPTION)
        .with_header("destination", ANNOUNCEMENT_DESTINATION)
        .with_header("message-id", format!("haven-cluster-{}", a.n))
        .with_header(MEMBERS_HEADER, a.members.clone())
        .with_header(REBALANCE_HEADER, if a.rebalance { "true" } else { "false" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(members: &[&str], update: bool, rebalance: bool) -> ClusterConfig {
        ClusterConfig {
            members: members.iter().map(|m| m.to_string()).collect(),
            update_cluster_clients: update,
            rebalance_cluster_clients: rebalance,
        }
    }

    #[test]
    fn members_must_be_tcp_host_port() {
        for good in [
            "tcp://127.0.0.1:61613",
            "tcp://broker-1.example.com:61613",
            "tcp://[::1]:61613",
        ] {
            assert_eq!(check(&settings(&[good], true, false)), Ok(()), "{good}");
        }
        for bad in [
            "127.0.0.1:61613",
            "stomp://a:1",
            "tcp://a",
            "tcp://:61613",
            "tcp://a:0",
            "tcp://a:70000",
            "tcp://a:1,tcp://b:2",
            "tcp://a:1?x=y",
            "tcp://a:1/",
            "tcp://a b:1",
            "tcp://::1:61613",
            "tcp://[nope]:1",
        ] {
            let e = check(&settings(&[bad], true, false)).unwrap_err();
            assert!(
                matches!(&e, ClusterError::BadMember { entry, .. } if entry == bad),
                "{bad}: {e}"
            );
            assert_eq!(e.key(), "cluster.members");
        }
    }

    #[test]
    fn duplicates_too_many_and_rebalance_without_update_are_refused() {
        let e = check(&settings(&["tcp://a:1", "tcp://a:1"], true, false)).unwrap_err();
        assert_eq!(
            e,
            ClusterError::DuplicateMember {
                entry: "tcp://a:1".into()
            }
        );
        let many: Vec<String> = (1..=CLUSTER_MEMBERS_MAX + 1)
            .map(|p| format!("tcp://h:{p}"))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(matches!(
            check(&settings(&refs, true, false)),
            Err(ClusterError::TooManyMembers { .. })
        ));
        let long = format!("tcp://{}:1", "h".repeat(MEMBERS_HEADER_BYTES_MAX));
        assert!(matches!(
            check(&settings(&[&long], true, false)),
            Err(ClusterError::MembersTooLong { .. })
        ));
        let e = check(&settings(&["tcp://a:1"], false, true)).unwrap_err();
        assert_eq!(e, ClusterError::RebalanceWithoutUpdate);
        assert_eq!(e.key(), "cluster.rebalance_cluster_clients");
    }

    #[test]
    fn connected_header_only_while_announcing() {
        let mut f = Frame::new(Cmd::Connected);
        let h = ClusterHandle::new(settings(&["tcp://a:1", "tcp://b:2"], true, false));
        assert!(h.attach(false, &mut f).is_none());
        assert_eq!(f.header(MEMBERS_HEADER), Some("tcp://a:1,tcp://b:2"));
        for off in [
            settings(&["tcp://a:1"], false, false),
            settings(&[], true, false),
        ] {
            let mut f = Frame::new(Cmd::Connected);
            ClusterHandle::new(off).attach(true, &mut f);
            assert_eq!(f.header(MEMBERS_HEADER), None);
        }
    }

    #[test]
    fn only_a_changed_announcement_is_numbered_and_pushed() {
        let h = ClusterHandle::new(settings(&["tcp://a:1"], true, false));
        let same = settings(&["tcp://a:1"], true, false);
        assert_eq!(h.set_cluster(same), Ok(ClusterChange::Unchanged));
        let two = settings(&["tcp://a:1", "tcp://b:2"], true, false);
        assert_eq!(
            h.set_cluster(two.clone()),
            Ok(ClusterChange::Announced { n: 1 })
        );
        assert_eq!(h.current(), two);
        let rebalance = settings(&["tcp://a:1", "tcp://b:2"], true, true);
        assert_eq!(
            h.set_cluster(rebalance),
            Ok(ClusterChange::Announced { n: 2 })
        );
        // Switching announcements off tells nobody anything; on again is news.
        let off = settings(&["tcp://a:1", "tcp://b:2"], false, false);
        assert_eq!(h.set_cluster(off), Ok(ClusterChange::Applied));
        let on = settings(&["tcp://a:1", "tcp://b:2"], true, false);
        assert_eq!(h.set_cluster(on), Ok(ClusterChange::Announced { n: 3 }));
        // Refused settings change nothing.
        let bad = settings(&["tcp://c"], true, false);
        assert!(h.set_cluster(bad).is_err());
        assert_eq!(h.current().members.len(), 2);
    }

    #[tokio::test]
    async fn a_feed_gets_only_the_latest_announcement_after_attach() {
        let h = ClusterHandle::new(settings(&["tcp://a:1"], true, false));
        let mut f = Frame::new(Cmd::Connected);
        let mut feed = h.attach(true, &mut f).expect("opted in");
        h.set_cluster(settings(&["tcp://a:1", "tcp://b:2"], true, false))
            .unwrap();
        h.set_cluster(settings(&["tcp://b:2"], true, true)).unwrap();
        let frame = feed.next().await;
        assert_eq!(frame.command, Cmd::Message);
        assert_eq!(
            frame.header("subscription"),
            Some(ANNOUNCEMENT_SUBSCRIPTION)
        );
        assert_eq!(frame.header("destination"), Some(ANNOUNCEMENT_DESTINATION));
        assert_eq!(frame.header("message-id"), Some("haven-cluster-2"));
        assert_eq!(frame.header(MEMBERS_HEADER), Some("tcp://b:2"));
        assert_eq!(frame.header(REBALANCE_HEADER), Some("true"));
        assert!(frame.body.is_empty());
        // Nothing newer: the feed waits.
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), feed.next()).await;
        assert!(waited.is_err(), "no announcement was made");
    }
}
