//! A list of headers (names and values in order, repeats kept) in one buffer: a STOMP frame's
//! (`haven-stomp`) and a message's producer headers (`haven-engine`).
//!
//! Why not a `Vec<(String, String)>`: that is two heap blocks per header, each allocated when
//! a SEND arrives or a paged-out message is read back and freed when the message dies, often
//! on another thread and long after, with its memory cold. Freeing a message's strings was
//! 13% of a forwarding broker's worker (issue 8's profile), and the decoder's two allocations
//! per header of a forwarded SEND another 8% of the receiving broker's. Here a list is two
//! blocks whatever its length: the text, and where each name and value ends.

mod decimal;

pub use decimal::Decimal;
use std::fmt;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// Each header's name then its value, back to back.
    text: String,
    /// Per header, the ends of its name and of its value in `text`.
    ends: Vec<(u32, u32)>,
    /// One bit per name held (`name_bit`): a lookup of a name whose bit is clear, which is
    /// most lookups, is answered without a scan, and a list whose names set as many bits as
    /// it has headers has no repeated name.
    names: u64,
}

/// A name's bit in `Headers::names`, from its length and its first and last bytes, which
/// tell apart the names a SEND is asked for.
fn name_bit(name: &[u8]) -> u64 {
    let (first, last) = match name {
        [] => (0, 0),
        [f, .., l] => (*f, *l),
        [f] => (*f, *f),
    };
    let mix = (name.len() as u32)
        .wrapping_mul(7)
        .wrapping_add(u32::from(first).wrapping_mul(3))
        .wrapping_add(u32::from(last));
    1 << (mix % 64)
}

impl Headers {
    /// Room for `count` headers of `text_bytes` in all, so building them allocates once.
    pub fn with_capacity(count: usize, text_bytes: usize) -> Headers {
        Headers {
            text: String::with_capacity(text_bytes),
            ends: Vec::with_capacity(count),
            names: 0,
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
        self.names |= name_bit(name.as_bytes());
    }

    /// Appends a header whose name and value `write_name` and `write_value` append to the
    /// text they are given (a decoder unescaping straight into the buffer). They may only
    /// append. If either fails, nothing is appended and its error is returned.
    pub fn push_with<E>(
        &mut self,
        write_name: impl FnOnce(&mut String) -> Result<(), E>,
        write_value: impl FnOnce(&mut String) -> Result<(), E>,
    ) -> Result<(), E> {
        let start = self.text.len();
        let written = write_name(&mut self.text).and_then(|()| {
            assert!(self.text.len() >= start, "a header writer removed text");
            let name_end = self.offset();
            write_value(&mut self.text).map(|()| name_end)
        });
        match written {
            Ok(name_end) => {
                assert!(
                    self.text.len() as u64 >= u64::from(name_end),
                    "a header writer removed text"
                );
                let value_end = self.offset();
                self.ends.push((name_end, value_end));
                self.names |= name_bit(&self.text.as_bytes()[start..name_end as usize]);
                Ok(())
            }
            Err(e) => {
                self.text.truncate(start);
                Err(e)
            }
        }
    }

    /// Removes every header, keeping the buffers' capacity.
    pub fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
        self.names = 0;
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
        let (name_end, value_end) = self.find(name)?.1;
        Some(&self.text[name_end as usize..value_end as usize])
    }

    /// The index of the first header called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        Some(self.find(name)?.0)
    }

    /// The first header called `name`: its index and ends. Compares lengths, then bytes, so a
    /// lookup costs a few instructions per header (a SEND is asked for a dozen names, most of
    /// which it does not have).
    fn find(&self, name: &str) -> Option<(usize, (u32, u32))> {
        if self.names & name_bit(name.as_bytes()) == 0 {
            return None;
        }
        let text = self.text.as_bytes();
        let mut start = 0u32;
        for (i, &(name_end, value_end)) in self.ends.iter().enumerate() {
            if (name_end - start) as usize == name.len()
                && text[start as usize..name_end as usize] == *name.as_bytes()
            {
                return Some((i, (name_end, value_end)));
            }
            start = value_end;
        }
        None
    }

    /// Whether some name occurs more than once (STOMP: only the first counts). Usually
    /// answered from the names' bits alone.
    pub fn has_repeated_names(&self) -> bool {
        if self.names.count_ones() as usize == self.ends.len() {
            return false;
        }
        self.iter()
            .enumerate()
            .any(|(i, (name, _))| self.position(name) != Some(i))
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            text: &self.text,
            ends: self.ends.iter(),
            start: 0,
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
    text: &'a str,
    ends: std::slice::Iter<'a, (u32, u32)>,
    /// Where the next header's name starts.
    start: u32,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        let &(name_end, value_end) = self.ends.next()?;
        let start = std::mem::replace(&mut self.start, value_end);
        Some((
            &self.text[start as usize..name_end as usize],
            &self.text[name_end as usize..value_end as usize],
        ))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.ends.size_hint()
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
        assert_eq!(h.position("a"), Some(0));
        assert_eq!(h.position(""), Some(1));
        assert_eq!(h.position("ünï"), Some(4));
        assert_eq!(h.position("ün"), None, "a prefix of a name is not the name");
        assert_eq!(h.get("ünï"), Some("cödé:\n"));
        assert_eq!(
            h.text_bytes(),
            pairs.iter().map(|(k, v)| k.len() + v.len()).sum()
        );
        let collected: Headers = pairs.iter().copied().collect();
        assert_eq!(collected, h);
        assert_eq!(format!("{h:?}"), format!("{:?}", pairs));
    }

    #[test]
    fn lookups_and_repeats_agree_with_a_plain_scan() {
        // Many names, so that bits collide: the filter may only skip what is not there.
        let names: Vec<String> = (0..200).map(|i| format!("h{i}-{}", i * 7 % 13)).collect();
        for n in [0, 1, 2, 5, 30, 200] {
            let pairs: Vec<(&str, &str)> = names[..n].iter().map(|k| (k.as_str(), "v")).collect();
            let mut h = Headers::from_pairs(&pairs);
            assert!(!h.has_repeated_names(), "{n} distinct names");
            for (i, k) in names.iter().enumerate() {
                let want = (i < n).then_some(i);
                assert_eq!(h.position(k), want, "{k} among {n}");
            }
            if n > 0 {
                h.push(&names[n / 2], "again");
                assert!(h.has_repeated_names());
                assert_eq!(h.get(&names[n / 2]), Some("v"), "the first wins");
            }
        }
        assert!(!Headers::default().has_repeated_names());
        assert!(Headers::from_pairs(&[("", "a"), ("", "b")]).has_repeated_names());
    }

    #[test]
    fn a_failed_writer_appends_nothing() {
        let mut h = Headers::from_pairs(&[("a", "1")]);
        let r: Result<(), &str> = h.push_with(
            |t| {
                t.push_str("name");
                Ok(())
            },
            |t| {
                t.push_str("half");
                Err("bad escape")
            },
        );
        assert_eq!(r, Err("bad escape"));
        let r: Result<(), &str> = h.push_with(|_| Err("bad name"), |_| Ok(()));
        assert_eq!(r, Err("bad name"));
        assert_eq!(h, Headers::from_pairs(&[("a", "1")]));
        h.push_with::<()>(
            |t| {
                t.push('b');
                Ok(())
            },
            |t| {
                t.push('2');
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(h, Headers::from_pairs(&[("a", "1"), ("b", "2")]));
        h.clear();
        assert!(h.is_empty());
        assert_eq!(h.text_bytes(), 0);
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
