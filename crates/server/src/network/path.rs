//! Broker paths: which brokers a message has been on (`haven-net-path`), and the rules that
//! keep messages from circling while still letting them follow consumers that moved.
//!
//! A queue message goes where the demand is; demand never travels through a broker twice
//! (`demand.rs`), so a message only goes round when consumers move. When it comes back to a
//! broker it was on, the path is cut back to what it was there — the detour is forgotten —
//! so the path always names distinct brokers and stays shorter than the network. The engine
//! gives a message back to the bridge it came over only when no local consumer is left to
//! take it (ActiveMQ's `replayWhenNoConsumers`, always on).
//!
//! A topic message is copied to every subscriber; it is never forwarded to a broker it has
//! been on, nor over more than `networkTTL` bridges, so a mesh delivers each copy once.

/// Longest broker name, in bytes: names travel in every forwarded message.
pub const NAME_BYTES_MAX: usize = 64;

/// A broker name may not contain the separators of paths and demand lists.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name != "-"
        && name
            .chars()
            .all(|c| !c.is_whitespace() && !matches!(c, ',' | ';' | '/' | ':'))
}

/// `A,B,C` → `[A, B, C]`; the empty text is the empty path. None if a name is invalid.
pub fn parse(text: &str) -> Option<Vec<String>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|n| valid_name(n).then(|| n.to_string()))
        .collect()
}

pub fn format(path: &[String]) -> String {
    let mut text = String::new();
    format_into(path, &mut text);
    text
}

/// `[A, B, C]` → `A,B,C`, appended to `text` (a bridge reuses one buffer for every message).
pub fn format_into(path: &[String], text: &mut String) {
    for (i, hop) in path.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(hop);
    }
}

/// What a bridge does with one message it was given to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Send it, with this path.
    Forward(Vec<String>),
    /// Do not send it: acknowledge it here (a topic copy the remote broker has had, or one
    /// that would cross more bridges than allowed).
    Skip,
}

/// Where a message on broker `here`, that was on `path` before, may go when a bridge offers it
/// to broker `to`.
pub fn route(path: &[String], here: &str, to: &str, topic: bool, ttl: u32) -> Route {
    // A path that names this broker came from elsewhere than a Haven bridge (which cuts
    // paths back): read it as if the message had arrived here then.
    let path = match path.iter().position(|b| b == here) {
        Some(i) => &path[..i],
        None => path,
    };
    if let Some(i) = path.iter().position(|b| b == to) {
        if topic {
            return Route::Skip;
        }
        // Back to where it was: the consumers moved there.
        return Route::Forward(path[..i].to_vec());
    }
    let mut next = path.to_vec();
    next.push(here.to_string());
    if topic && next.len() > ttl as usize {
        return Route::Skip;
    }
    Route::Forward(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Vec<String> {
        parse(text).expect("valid path")
    }

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse(""), Some(vec![]));
        assert_eq!(p("a,b"), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(format(&p("a,b")), "a,b");
        assert_eq!(parse("a,,b"), None);
        assert_eq!(parse("a b"), None);
        assert_eq!(parse("-"), None);
        assert_eq!(parse(&"x".repeat(NAME_BYTES_MAX + 1)), None);
    }

    #[test]
    fn a_queue_message_goes_out_with_this_broker_appended() {
        assert_eq!(route(&[], "A", "B", false, 1), Route::Forward(p("A")));
        // Queue messages follow demand; demand is what the hop limit bounds.
        assert_eq!(route(&p("A"), "B", "C", false, 1), Route::Forward(p("A,B")));
    }

    #[test]
    fn a_queue_message_may_return_and_forgets_the_detour() {
        assert_eq!(route(&p("A"), "B", "A", false, 1), Route::Forward(vec![]));
        assert_eq!(route(&p("A,B"), "C", "B", false, 3), Route::Forward(p("A")));
    }

    #[test]
    fn a_topic_message_never_returns_and_obeys_the_hop_limit() {
        assert_eq!(route(&p("A"), "B", "A", true, 5), Route::Skip);
        assert_eq!(route(&[], "A", "B", true, 1), Route::Forward(p("A")));
        assert_eq!(route(&p("A"), "B", "C", true, 1), Route::Skip);
        assert_eq!(route(&p("A"), "B", "C", true, 2), Route::Forward(p("A,B")));
    }

    #[test]
    fn a_path_through_this_broker_is_cut_back_to_it() {
        assert_eq!(
            route(&p("A,B,C"), "B", "D", false, 9),
            Route::Forward(p("A,B"))
        );
    }
}
