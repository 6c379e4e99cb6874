//! Protocol versions and their negotiation.
//!
//! The version only changes how header lines are escaped (see `escape.rs`); framing is the
//! same in 1.0, 1.1 and 1.2. Negotiation lives here, not in the server, so the client and
//! the server agree on one rule: the highest version both sides speak wins.

/// A STOMP protocol version. Ordered, so `max` picks the newest.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord, Hash)]
pub enum Version {
    V1_0,
    V1_1,
    V1_2,
}

impl Version {
    /// Every version this crate speaks, oldest first.
    pub const ALL: [Version; 3] = [Version::V1_0, Version::V1_1, Version::V1_2];

    /// The wire form, as used in `accept-version` and `version` headers.
    pub fn as_str(&self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V1_1 => "1.1",
            Version::V1_2 => "1.2",
        }
    }

    /// Parses one wire version (`"1.2"`); surrounding whitespace is ignored.
    pub fn parse(s: &str) -> Option<Version> {
        match s.trim() {
            "1.0" => Some(Version::V1_0),
            "1.1" => Some(Version::V1_1),
            "1.2" => Some(Version::V1_2),
            _ => None,
        }
    }

    /// Negotiate from a CONNECT `accept-version` header value (None => 1.0). Returns the
    /// highest common version, or None if no overlap.
    ///
    /// Unknown entries (`"2.0"`, garbage) are skipped rather than rejected: the spec lets a
    /// client offer versions the server does not know, and the server must pick from the
    /// rest.
    pub fn negotiate(accept_version: Option<&str>) -> Option<Version> {
        match accept_version {
            // A 1.0 client does not send the header at all.
            None => Some(Version::V1_0),
            Some(list) => list.split(',').filter_map(Version::parse).max(),
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_accept_version_means_1_0() {
        assert_eq!(Version::negotiate(None), Some(Version::V1_0));
    }

    #[test]
    fn negotiation_picks_highest_common_version() {
        assert_eq!(Version::negotiate(Some("1.0,1.1,1.2")), Some(Version::V1_2));
        assert_eq!(Version::negotiate(Some("1.1, 1.0")), Some(Version::V1_1));
        assert_eq!(Version::negotiate(Some("1.0")), Some(Version::V1_0));
        assert_eq!(Version::negotiate(Some("1.1,2.0")), Some(Version::V1_1));
    }

    #[test]
    fn negotiation_without_overlap_fails() {
        assert_eq!(Version::negotiate(Some("2.0,3.1")), None);
        assert_eq!(Version::negotiate(Some("")), None);
    }

    #[test]
    fn wire_form_round_trips() {
        for v in Version::ALL {
            assert_eq!(Version::parse(v.as_str()), Some(v));
            assert_eq!(v.to_string(), v.as_str());
        }
        assert!(Version::V1_0 < Version::V1_1 && Version::V1_1 < Version::V1_2);
    }
}
