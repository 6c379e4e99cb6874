//! A message's producer headers: names and values in order, in one buffer.
//!
//! Why not a `Vec<(String, String)>`: that is two heap blocks per header, each allocated when
//! a SEND arrives or a paged-out message is read back and freed when the message dies, often
//! on another thread and long after, with its memory cold. Freeing a message's strings was
//! 13% of a forwarding broker's worker (issue 8's profile). Here a message's headers are two
//! blocks whatever their number: the text, and where each name and value ends.

use std::fmt;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// Each header's name then its value, back to back.
    text: String,
    /// Per header, the ends of its name and of its value in `text`.
    ends: Vec<(u32, u32)>,
}

impl Headers {
    /// Room for `count` headers of `text_bytes` in all, so building them allocates once.
    pub fn with_capacity(count: usize, text_bytes: usize) -> Headers {
        Headers {
            text: String::with_capacity(text_bytes),
            ends: Vec::with_capacity(count),
        }
    }

    /// Headers from pairs, in their order, sized exactly.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Headers {
        Headers::sized(pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
    }

    /// Headers from the pairs `pairs` yields, in their order: one pass over a copy of the
    /// iterator sizes them, so building them allocates once.
    pub fn sized<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> Headers {
        let (count, text_bytes) = pairs
            .clone()
            .fold((0, 0), |(n, b), (k, v)| (n + 1, b + k.len() + v.len()));
        let mut h = Headers::with_capacity(count, text_bytes);
        for (k, v) in pairs {
            h.push(k, v);
        }
        h
    }

    /// Appends a header (repeats are kept: `get` finds the first).
    pub fn push(&mut self, name: &str, value: &str) {
        self.text.push_str(name);
        let name_end = self.offset();
        self.text.push_str(value);
        let value_end = self.offset();
        self.ends.push((name_end, value_end));
    }

    fn offset(&self) -> u32 {
        // A frame's headers are bounded far below this (`stomp.header_bytes_max`).
        u32::try_from(self.text.len()).expect("headers over 4 GiB")
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The bytes of every name and value together.
    pub fn text_bytes(&self) -> usize {
        self.text.len()
    }

    /// The value of the first header called `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            headers: self,
            next: 0,
        }
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Headers {
        let mut h = Headers::default();
        for (k, v) in pairs {
            h.push(k.as_ref(), v.as_ref());
        }
        h.text.shrink_to_fit();
        h.ends.shrink_to_fit();
        h
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The headers as (name, value), in order.
#[derive(Clone)]
pub struct Iter<'a> {
    headers: &'a Headers,
    next: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        let &(name_end, value_end) = self.headers.ends.get(self.next)?;
        let start = match self.next {
            0 => 0,
            i => self.headers.ends[i - 1].1,
        };
        self.next += 1;
        let text = &self.headers.text;
        Some((
            &text[start as usize..name_end as usize],
            &text[name_end as usize..value_end as usize],
        ))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.headers.ends.len() - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_come_back_in_order_with_empty_names_values_and_repeats() {
        let pairs = [
            ("a", "1"),
            ("", "x"),
            ("k", ""),
            ("a", "2"),
            ("ünï", "cödé:\n"),
        ];
        let h = Headers::from_pairs(&pairs);
        assert_eq!(h.iter().collect::<Vec<_>>(), pairs);
        assert_eq!(h.len(), 5);
        assert_eq!(h.iter().len(), 5);
        assert_eq!(h.get("a"), Some("1"), "the first occurrence");
        assert_eq!(h.get("k"), Some(""));
        assert_eq!(h.get("missing"), None);
        assert_eq!(
            h.text_bytes(),
            pairs.iter().map(|(k, v)| k.len() + v.len()).sum()
        );
        let collected: Headers = pairs.iter().copied().collect();
        assert_eq!(collected, h);
        assert_eq!(format!("{h:?}"), format!("{:?}", pairs));
    }

    #[test]
    fn no_headers_allocate_nothing() {
        let h = Headers::default();
        assert!(h.is_empty() && h.iter().next().is_none());
        assert_eq!(h, Headers::from_pairs::<&str, &str>(&[]));
    }

    #[test]
    fn boundaries_do_not_shift_text_between_headers() {
        // "ab"+"c" and "a"+"bc" have the same text but are different headers.
        let one = Headers::from_pairs(&[("ab", "c")]);
        let two = Headers::from_pairs(&[("a", "bc")]);
        assert_ne!(one, two);
        assert_eq!(two.get("a"), Some("bc"));
    }
}
