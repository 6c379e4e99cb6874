//! Demand: which subscriptions a bridge keeps on its source broker for the consumers its sink
//! broker announces in consumer advisories.
//!
//! An advisory lists every consumer of one destination on the sink: `-` for a consumer of
//! the sink itself, or the demand path of a bridge's subscription there (the brokers the
//! demand came through, the consumers' own broker first). The bridge stands for each such
//! entry with a subscription on the source whose demand path is the entry's plus the sink.
//! It ignores an entry whose path already names the source (the demand came from there: a
//! loop) and one that would be longer than `networkTTL`.

use super::path;

/// Parses `haven-demand` (`-;-;C,B`): one demand path per consumer, empty for the sink's
/// own consumers. None if malformed.
pub fn parse(text: &str) -> Option<Vec<Vec<String>>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(';')
        .map(|entry| match entry {
            "-" => Some(Vec::new()),
            _ => path::parse(entry).filter(|p| !p.is_empty()),
        })
        .collect()
}

/// The demand paths the bridge from `source` to `sink` should subscribe with, sorted. With
/// `conduit`, consumers reached the same way share one subscription; without, each has its
/// own (so the source's dispatcher shares messages among them as among local consumers).
pub fn wanted(
    entries: &[Vec<String>],
    source: &str,
    sink: &str,
    ttl: u32,
    conduit: bool,
) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = entries
        .iter()
        .filter(|e| !e.iter().any(|b| b == source || b == sink))
        .map(|e| {
            let mut p = e.clone();
            p.push(sink.to_string());
            p
        })
        .filter(|p| p.len() <= ttl as usize)
        .collect();
    out.sort();
    if conduit {
        out.dedup();
    }
    out
}

/// `decreaseNetworkConsumerPriority`: 5 points per bridge the demand crossed.
pub fn priority_penalty(demand_path: &[String]) -> u8 {
    (demand_path.len() * 5).min(u8::MAX as usize) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<Vec<String>> {
        list.iter()
            .map(|t| path::parse(t).expect("valid"))
            .collect()
    }

    #[test]
    fn parses_entries() {
        assert_eq!(parse(""), Some(vec![]));
        assert_eq!(parse("-;C,B"), Some(paths(&["", "C,B"])));
        assert_eq!(parse("-;;x"), None);
        assert_eq!(parse("a b"), None);
    }

    #[test]
    fn local_consumers_of_the_sink_share_one_conduit() {
        let e = paths(&["", "", ""]);
        assert_eq!(wanted(&e, "A", "B", 1, true), paths(&["B"]));
        assert_eq!(wanted(&e, "A", "B", 1, false), paths(&["B", "B", "B"]));
    }

    #[test]
    fn demand_from_further_away_needs_the_hops() {
        let e = paths(&["C"]);
        assert_eq!(wanted(&e, "A", "B", 1, true), Vec::<Vec<String>>::new());
        assert_eq!(wanted(&e, "A", "B", 2, true), paths(&["C,B"]));
    }

    #[test]
    fn demand_that_came_from_the_source_is_a_loop() {
        let e = paths(&["A", "C,A", "-"].map(|s| if s == "-" { "" } else { s }));
        assert_eq!(wanted(&e, "A", "B", 5, true), paths(&["B"]));
    }

    #[test]
    fn penalty_grows_with_hops() {
        assert_eq!(priority_penalty(&paths(&["C,B"])[0]), 10);
    }
}
