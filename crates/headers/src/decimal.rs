//! Decimal text of a number without allocating or going through `fmt`: the numbers a broker
//! writes into every frame and message (delivery tags, counts, timestamps, `content-length`,
//! message ids). `format!` took about 430 instructions per message id (callgrind, scenario
//! (c)); this is the digit loop alone.

/// The decimal text of a `u64`, kept on the stack.
#[derive(Clone, Copy)]
pub struct Decimal {
    /// The digits, right-aligned: `u64::MAX` has 20.
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    #[inline]
    pub fn new(mut n: u64) -> Decimal {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { buf, start }
    }

    /// The digits, for a byte buffer: no UTF-8 check.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Appends the digits to `out` without a UTF-8 check of them (`as_str` has one).
    #[inline]
    pub fn push_to(&self, out: &mut String) {
        out.extend(self.as_bytes().iter().map(|&b| char::from(b)));
    }

    #[inline]
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).expect("ASCII digits")
    }
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn matches_display_at_the_edges_and_between() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let d = Decimal::new(n);
            assert_eq!(d.as_str(), n.to_string());
            assert_eq!(d.as_bytes(), n.to_string().as_bytes());
            let mut pushed = String::from("x");
            d.push_to(&mut pushed);
            assert_eq!(pushed, format!("x{n}"));
        }
        let mut n = 1u64;
        while let Some(next) = n.checked_mul(3) {
            assert_eq!(Decimal::new(n - 1).as_str(), (n - 1).to_string());
            n = next;
        }
    }
}
