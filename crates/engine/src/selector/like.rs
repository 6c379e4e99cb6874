//! `LIKE` patterns, compiled once into literal-and-`_` segments split at `%`.
//!
//! Matching never backtracks more than one level: the first segment is anchored at the start,
//! the last at the end, and each middle one is taken at its leftmost occurrence, which is
//! optimal when the only variable-length wildcard is `%`. A match therefore costs at most
//! (value length × pattern length) character comparisons, whatever the pattern.

/// One pattern position: a character that must be equal, or `_` (any one character).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PatChar {
    Lit(char),
    AnyOne,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LikePattern {
    /// The pattern split at each unescaped `%`; never empty.
    segments: Vec<Vec<PatChar>>,
}

impl LikePattern {
    /// Compiles `pattern`; `escape` makes the following `%`, `_` or escape character literal.
    /// The error says what is wrong with the pattern.
    pub(crate) fn compile(pattern: &str, escape: Option<char>) -> Result<LikePattern, String> {
        let mut segments = vec![Vec::new()];
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            let current = segments.last_mut().expect("segments is never empty");
            if Some(c) == escape {
                match chars.next() {
                    Some(e) if e == '%' || e == '_' || Some(e) == escape => {
                        current.push(PatChar::Lit(e))
                    }
                    _ => {
                        return Err(format!(
                            "in the LIKE pattern, the escape character '{c}' must be followed \
                             by %, _ or itself"
                        ))
                    }
                }
            } else if c == '%' {
                segments.push(Vec::new());
            } else if c == '_' {
                current.push(PatChar::AnyOne);
            } else {
                current.push(PatChar::Lit(c));
            }
        }
        assert!(!segments.is_empty());
        Ok(LikePattern { segments })
    }

    pub(crate) fn matches(&self, value: &str) -> bool {
        let v: Vec<char> = value.chars().collect();
        let segments = &self.segments;
        let first = &segments[0];
        if segments.len() == 1 {
            return v.len() == first.len() && segment_at(first, &v, 0);
        }
        let last = &segments[segments.len() - 1];
        if v.len() < first.len() + last.len()
            || !segment_at(first, &v, 0)
            || !segment_at(last, &v, v.len() - last.len())
        {
            return false;
        }
        let mut from = first.len();
        let end = v.len() - last.len();
        for segment in &segments[1..segments.len() - 1] {
            if segment.is_empty() {
                continue;
            }
            let found = (from..)
                .take_while(|s| s + segment.len() <= end)
                .find(|&s| segment_at(segment, &v, s));
            match found {
                Some(s) => from = s + segment.len(),
                None => return false,
            }
        }
        true
    }
}

/// Whether `segment` matches `v` starting at `at` (and fits).
fn segment_at(segment: &[PatChar], v: &[char], at: usize) -> bool {
    at + segment.len() <= v.len()
        && segment.iter().zip(&v[at..]).all(|(p, c)| match p {
            PatChar::Lit(l) => l == c,
            PatChar::AnyOne => true,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn like(value: &str, pattern: &str) -> bool {
        LikePattern::compile(pattern, None).unwrap().matches(value)
    }

    #[test]
    fn percent_matches_any_run_and_underscore_one_character() {
        assert!(like("order.created", "order.%"));
        assert!(like("order.", "order.%"));
        assert!(!like("orde", "order.%"));
        assert!(like("abc", "a_c"));
        assert!(!like("ac", "a_c"));
        assert!(!like("abbc", "a_c"));
        assert!(like("", "%"));
        assert!(like("", ""));
        assert!(!like("a", ""));
        assert!(like("xaybzc", "%a%b%c"));
        assert!(!like("xaybz", "%a%b%c"));
        assert!(like("aXbXc", "a%b%c"));
        assert!(like("abab", "%ab"));
        assert!(like("héllo", "h_llo"));
        assert!(!like("ABC", "abc"), "LIKE is case-sensitive");
    }

    #[test]
    fn first_and_last_segments_must_not_overlap() {
        assert!(!like("ab", "ab%ab"));
        assert!(like("abab", "ab%ab"));
        assert!(like("aba", "ab%a"));
        assert!(!like("ab", "ab%b"));
    }

    #[test]
    fn escape_makes_wildcards_literal() {
        let p = LikePattern::compile("100!%", Some('!')).unwrap();
        assert!(p.matches("100%"));
        assert!(!p.matches("1000"));
        let p = LikePattern::compile("a!_%", Some('!')).unwrap();
        assert!(p.matches("a_b"));
        assert!(!p.matches("ab"));
        let p = LikePattern::compile("a!!", Some('!')).unwrap();
        assert!(p.matches("a!"));
    }

    #[test]
    fn escape_before_an_ordinary_character_is_an_error() {
        assert!(LikePattern::compile("a!b", Some('!')).is_err());
        assert!(LikePattern::compile("a!", Some('!')).is_err());
    }

    #[test]
    fn pathological_pattern_is_fast() {
        let value = "a".repeat(2000);
        let pattern = format!("{}b", "%a".repeat(500));
        let start = std::time::Instant::now();
        assert!(!like(&value, &pattern));
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
    }
}
