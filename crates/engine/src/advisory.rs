//! Consumer advisories, under ActiveMQ's names: whenever the set of active consumers of a
//! destination changes, a non-persistent message on `ActiveMQ.Advisory.Consumer.Queue.<name>`
//! (or `.Topic.<name>`, or `.TempQueue.haven-<owner>-<name>` for a temporary queue) says how
//! many consumers it has now and, for each, whether it is local or a network bridge's
//! subscription standing for consumers elsewhere (the path their demand came through). A
//! bridge subscribes to these topics to learn where consumers are.
//!
//! Temporary queues are advertised so that request/reply works across a network
//! (`bridgeTempDestinations`): the owner's own consumer of its temporary queue tells a bridge
//! that replies sent to `/remote-temp-queue/haven-<owner>-<name>` on another broker must come
//! here, and a bridge's consumer of that name on the other broker (a foreign temporary queue
//! there) is advertised the same way. The `haven-advisory-for` header carries the remote form,
//! the name a bridge subscribes to elsewhere. Temporary topics are not advertised: nobody
//! else can consume them.
//!
//! This module owns the bookkeeping; the engine publishes. Per destination — keyed exactly as
//! the subscriber named it, so a wildcard queue consumer (`a.>`) is advertised under its
//! pattern and a durable subscription under its topic — the active consumers in subscription
//! order, kept incrementally as subscriptions are made and dropped (no scan of connections).
//! A change only marks the destination; the engine publishes one advisory per marked
//! destination at the end of the same call, before that call's dispatch. So a connection that
//! closes with many consumers of one destination costs one advisory, every advisory states
//! the destination as the call left it, and a subscriber receives it in order with the
//! call's other effects. The engine builds the message only when its advisory topic has a
//! subscriber.
//!
//! Advisories are volatile: nothing is logged, and replay makes none (a replayed engine has no
//! consumers). What a bridge missed while away it learns from the snapshot: a new subscription
//! to a consumer advisory topic gets one advisory for each destination that has consumers now.

use crate::command::NetworkConsumer;
use crate::types::{ConnId, Destination};
use haven_headers::Headers;
use std::collections::{BTreeMap, BTreeSet};

/// Topics under this prefix carry advisories; their own consumers are not advertised (an
/// advisory about advisory subscribers would only feed itself).
pub(crate) const ADVISORY_TOPIC_PREFIX: &str = "ActiveMQ.Advisory.";
/// Consumer advisories: a new subscription whose topic starts with this gets the snapshot.
pub(crate) const CONSUMER_ADVISORY_PREFIX: &str = "ActiveMQ.Advisory.Consumer.";
/// Active consumers of the destination now (decimal, may be 0).
pub(crate) const CONSUMER_COUNT_HEADER: &str = "consumerCount";
/// The destination the advisory is about, in header form (`/queue/<name>`, `/topic/<name>`,
/// `/remote-temp-queue/haven-<owner>-<name>`).
pub(crate) const ADVISORY_FOR_HEADER: &str = "haven-advisory-for";
/// One entry per consumer, in subscription order, joined by `;`: `-` for a local consumer,
/// the demand path joined by `,` for a network consumer. Empty when there is none.
pub(crate) const ADVISORY_DEMAND_HEADER: &str = "haven-demand";
/// A local consumer's entry in `haven-demand`.
const LOCAL_DEMAND: &str = "-";

#[derive(Debug)]
struct Consumer {
    conn: ConnId,
    sub_id: String,
    /// Its `haven-demand` entry, built once when it subscribes.
    demand: String,
}

#[derive(Debug, Default)]
pub(crate) struct ConsumerAdvisories {
    /// Destinations with at least one active consumer (an entry is removed with its last
    /// consumer): sorted, so a snapshot comes out in a fixed order.
    consumers: BTreeMap<Destination, Vec<Consumer>>,
    /// Destinations whose consumers changed during the call in progress.
    changed: BTreeSet<Destination>,
}

/// Whether consumers of `destination` are advertised: queues and topics, by name or pattern,
/// except the advisory topics themselves; temporary queues (replies to them may arrive on
/// another broker); never temporary topics (nobody else can consume them, so no bridge needs
/// to know).
pub(crate) fn advertised(destination: &Destination) -> bool {
    match destination {
        Destination::Queue(name) | Destination::Topic(name) => {
            !name.starts_with(ADVISORY_TOPIC_PREFIX)
        }
        Destination::TempQueue { .. } => true,
        Destination::TempTopic { .. } => false,
    }
}

/// The topic consumer advisories about `destination` are published on.
pub(crate) fn advisory_topic(destination: &Destination) -> Destination {
    let name = match destination {
        Destination::Queue(name) => format!("{CONSUMER_ADVISORY_PREFIX}Queue.{name}"),
        Destination::Topic(name) => format!("{CONSUMER_ADVISORY_PREFIX}Topic.{name}"),
        // The remote form's name, as another broker's clients and bridges write it.
        Destination::TempQueue { owner, name } => {
            format!("{CONSUMER_ADVISORY_PREFIX}TempQueue.haven-{owner}-{name}")
        }
        Destination::TempTopic { .. } => unreachable!("temporary topics are not advertised"),
    };
    Destination::Topic(name)
}

impl ConsumerAdvisories {
    /// A consumer of `destination` became active (SUBSCRIBE, a durable subscriber coming
    /// online).
    pub fn add(
        &mut self,
        destination: &Destination,
        conn: ConnId,
        sub_id: &str,
        network: Option<&NetworkConsumer>,
    ) {
        assert!(advertised(destination), "{destination} is not advertised");
        let demand = match network {
            Some(n) => n.demand_path.join(","),
            None => LOCAL_DEMAND.to_string(),
        };
        let list = self.consumers.entry(destination.clone()).or_default();
        assert!(
            !list.iter().any(|c| c.conn == conn && c.sub_id == sub_id),
            "consumer advertised twice"
        );
        list.push(Consumer {
            conn,
            sub_id: sub_id.to_string(),
            demand,
        });
        self.changed.insert(destination.clone());
    }

    /// A consumer of `destination` (added before) is no longer active.
    pub fn remove(&mut self, destination: &Destination, conn: ConnId, sub_id: &str) {
        let list = self
            .consumers
            .get_mut(destination)
            .expect("an advertised consumer's destination is tracked");
        let i = list
            .iter()
            .position(|c| c.conn == conn && c.sub_id == sub_id)
            .expect("an advertised consumer is tracked");
        list.remove(i);
        if list.is_empty() {
            self.consumers.remove(destination);
        }
        self.changed.insert(destination.clone());
    }

    /// The destinations changed since the last call, which the caller publishes.
    pub fn take_changed(&mut self) -> BTreeSet<Destination> {
        std::mem::take(&mut self.changed)
    }

    pub fn has_changes(&self) -> bool {
        !self.changed.is_empty()
    }

    /// The headers of an advisory about `destination` as it is now.
    pub fn headers(&self, destination: &Destination) -> Headers {
        let list = self
            .consumers
            .get(destination)
            .map_or(&[][..], Vec::as_slice);
        let demand: Vec<&str> = list.iter().map(|c| c.demand.as_str()).collect();
        Headers::from_pairs(&[
            (CONSUMER_COUNT_HEADER, list.len().to_string().as_str()),
            (ADVISORY_FOR_HEADER, destination.to_string().as_str()),
            (ADVISORY_DEMAND_HEADER, demand.join(";").as_str()),
        ])
    }

    /// The destinations with consumers whose advisory topic a subscription to `pattern` (a
    /// topic name or wildcard) receives, in a fixed order: for a snapshot.
    pub fn matching(&self, pattern: &str) -> Vec<Destination> {
        self.consumers
            .keys()
            .filter(|d| match advisory_topic(d) {
                Destination::Topic(name) => crate::types::wildcard_matches(pattern, &name),
                _ => unreachable!("advisory topics are topics"),
            })
            .cloned()
            .collect()
    }

    /// Active consumers advertised, over all destinations: for the engine's cross-check.
    pub fn consumer_count(&self) -> usize {
        self.consumers.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(headers: &'a Headers, name: &str) -> &'a str {
        headers.get(name).unwrap()
    }

    #[test]
    fn demand_lists_consumers_in_subscription_order() {
        let mut a = ConsumerAdvisories::default();
        let q = Destination::Queue("orders".into());
        let bridge = NetworkConsumer {
            demand_path: vec!["C".into(), "B".into()],
            priority_penalty: 1,
        };
        a.add(&q, 1, "s", None);
        a.add(&q, 2, "s", Some(&bridge));
        a.add(&q, 3, "s", None);
        let h = a.headers(&q);
        assert_eq!(header(&h, CONSUMER_COUNT_HEADER), "3");
        assert_eq!(header(&h, ADVISORY_FOR_HEADER), "/queue/orders");
        assert_eq!(header(&h, ADVISORY_DEMAND_HEADER), "-;C,B;-");
        a.remove(&q, 1, "s");
        assert_eq!(header(&a.headers(&q), ADVISORY_DEMAND_HEADER), "C,B;-");
        assert_eq!(a.take_changed().into_iter().collect::<Vec<_>>(), [q]);
        assert!(!a.has_changes());
    }

    #[test]
    fn the_last_consumer_leaving_empties_the_entry() {
        let mut a = ConsumerAdvisories::default();
        let t = Destination::Topic("prices.>".into());
        a.add(&t, 1, "s", None);
        a.remove(&t, 1, "s");
        let h = a.headers(&t);
        assert_eq!(header(&h, CONSUMER_COUNT_HEADER), "0");
        assert_eq!(header(&h, ADVISORY_DEMAND_HEADER), "");
        assert!(
            a.matching(">").is_empty(),
            "no consumers: not in a snapshot"
        );
        assert_eq!(a.consumer_count(), 0);
    }

    #[test]
    fn snapshots_match_the_advisory_topic_names() {
        let mut a = ConsumerAdvisories::default();
        for d in [
            Destination::Topic("t".into()),
            Destination::Queue("b".into()),
            Destination::Queue("a.x".into()),
        ] {
            a.add(&d, 1, &d.to_string(), None);
        }
        let queues = a.matching("ActiveMQ.Advisory.Consumer.Queue.>");
        assert_eq!(
            queues,
            [
                Destination::Queue("a.x".into()),
                Destination::Queue("b".into())
            ]
        );
        assert_eq!(
            a.matching("ActiveMQ.Advisory.Consumer.*.t"),
            [Destination::Topic("t".into())]
        );
        assert_eq!(a.matching("ActiveMQ.Advisory.Consumer.>").len(), 3);
    }

    #[test]
    fn a_temporary_queue_is_advertised_under_its_remote_name() {
        let mut a = ConsumerAdvisories::default();
        let tq = Destination::TempQueue {
            owner: 7,
            name: "r".into(),
        };
        assert!(advertised(&tq));
        assert_eq!(
            advisory_topic(&tq),
            Destination::Topic("ActiveMQ.Advisory.Consumer.TempQueue.haven-7-r".into())
        );
        a.add(&tq, 7, "s", None);
        a.add(&Destination::Queue("q".into()), 7, "q", None);
        assert_eq!(
            header(&a.headers(&tq), ADVISORY_FOR_HEADER),
            "/remote-temp-queue/haven-7-r"
        );
        assert_eq!(a.matching("ActiveMQ.Advisory.Consumer.TempQueue.>"), [tq]);
    }

    #[test]
    fn advisory_topics_and_temporary_topics_are_not_advertised() {
        assert!(advertised(&Destination::Queue("a.>".into())));
        assert!(!advertised(&Destination::Topic(
            "ActiveMQ.Advisory.Consumer.Queue.>".into()
        )));
        assert!(!advertised(&Destination::TempTopic {
            owner: 1,
            name: "r".into()
        }));
        assert_eq!(
            advisory_topic(&Destination::Queue("a.>".into())),
            Destination::Topic("ActiveMQ.Advisory.Consumer.Queue.a.>".into())
        );
    }
}
