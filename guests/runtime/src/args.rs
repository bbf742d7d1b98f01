//! The payload argument string (`vmm --payload-arg`): whitespace-separated words, either
//! bare (`reset`, `1000`) or `key=value`.

#[derive(Clone, Copy, Debug)]
pub struct Args<'a>(&'a str);

/// A `key=value` whose value is not a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadNumber<'a> {
    pub key: &'a str,
    pub value: &'a str,
}

impl core::fmt::Display for BadNumber<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "argument {}={} is not a number", self.key, self.value)
    }
}

impl<'a> Args<'a> {
    pub fn new(s: &'a str) -> Self {
        Args(s)
    }

    pub fn as_str(&self) -> &'a str {
        self.0
    }

    pub fn words(&self) -> impl Iterator<Item = &'a str> {
        self.0.split_whitespace()
    }

    /// Whether the bare word `word` is present.
    pub fn flag(&self, word: &str) -> bool {
        self.words().any(|w| w == word)
    }

    /// The value of the last `key=value`.
    pub fn value(&self, key: &str) -> Option<&'a str> {
        self.words()
            .filter_map(|w| w.split_once('='))
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
            .last()
    }

    /// The `n`th bare word (not `key=value`).
    pub fn positional(&self, n: usize) -> Option<&'a str> {
        self.words().filter(|w| !w.contains('=')).nth(n)
    }

    /// `key=<number>` (decimal, or hex with 0x), or `default` when absent.
    pub fn number(&self, key: &'a str, default: u64) -> Result<u64, BadNumber<'a>> {
        match self.value(key) {
            None => Ok(default),
            Some(v) => parse_number(v).ok_or(BadNumber { key, value: v }),
        }
    }
}

/// Decimal or 0x-prefixed hex, `_` separators allowed.
pub fn parse_number(s: &str) -> Option<u64> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    let mut any = false;
    let mut value: u64 = 0;
    for c in digits.chars().filter(|&c| c != '_') {
        let d = c.to_digit(radix)?;
        value = value
            .checked_mul(u64::from(radix))?
            .checked_add(u64::from(d))?;
        any = true;
    }
    any.then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("100_000"), Some(100_000));
        assert_eq!(parse_number("0x1F"), Some(31));
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("0x"), None);
        assert_eq!(parse_number("12a"), None);
        assert_eq!(parse_number("18446744073709551616"), None);
    }

    #[test]
    fn words() {
        let a = Args::new("reset  exit=7 500 iters=0x10 exit=9");
        assert!(a.flag("reset"));
        assert!(!a.flag("exit"));
        assert_eq!(a.value("exit"), Some("9"));
        assert_eq!(a.positional(0), Some("reset"));
        assert_eq!(a.positional(1), Some("500"));
        assert_eq!(a.number("iters", 1), Ok(16));
        assert_eq!(a.number("missing", 1), Ok(1));
        let bad = Args::new("n=abc");
        assert_eq!(
            bad.number("n", 1),
            Err(BadNumber {
                key: "n",
                value: "abc"
            })
        );
    }
}
