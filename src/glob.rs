//! Key patterns: Redis's glob (`*`, `?`, `[abc]`, `[^a]`, `[a-z]`, `\` escape), checked at load.
//!
//! Written here rather than taken from a glob or regex crate for two reasons. SREs already
//! write these patterns for `KEYS`, `SCAN MATCH` and `PSUBSCRIBE`, so a rule must mean
//! exactly what the same pattern means to Redis, quirks included (reversed ranges, a `]`
//! that ends a range, signed byte ranges). And the matcher runs on the request path: a
//! byte loop with no allocation and no compiled automaton is all it needs.
//!
//! The algorithm follows Redis's `stringmatchlen` (src/util.c), including its guard against
//! abusive patterns (give up past 1000 nested `*`) and its early exit when a `*` has already
//! failed at every later position. Checked against redis-server's `KEYS` on random patterns
//! and keys (signed ranges, escapes, unterminated classes): the same answers, with one
//! deliberate difference: the empty key matches any pattern made only of `*` (Redis matches
//! it with `*`, through a shortcut, but not with `**`).

use std::fmt;

/// Longest pattern accepted in a rules file.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// A validated pattern, with its literal ends for a cheap first test: most keys a rule does
/// not cover differ in the first or last bytes, and those never reach the matcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    text: String,
    /// Bytes before the first metacharacter: a key must start with them.
    prefix_len: usize,
    /// Bytes after the last metacharacter (and after what it escapes): a key must end with them.
    suffix_len: usize,
    /// No metacharacter at all: the pattern matches only the key equal to it.
    literal: bool,
}

impl Glob {
    /// Checks `text` and prepares it; the error says what is wrong, for a located message.
    pub fn new(text: &str) -> Result<Glob, GlobError> {
        let b = text.as_bytes();
        check(b)?;
        let meta = |c: &u8| matches!(c, b'*' | b'?' | b'[' | b']' | b'\\');
        let prefix_len = b
            .iter()
            .position(|c| meta(c) && *c != b']')
            .unwrap_or(b.len());
        let literal = prefix_len == b.len();
        let suffix_len = match b.iter().rposition(meta) {
            _ if literal => 0,
            // A backslash escapes the byte after it: keep that byte in the middle.
            Some(i) if b[i] == b'\\' => b.len().saturating_sub(i + 2),
            Some(i) => b.len() - i - 1,
            None => 0,
        };
        Ok(Glob {
            text: text.to_string(),
            prefix_len,
            suffix_len,
            literal,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when `key` matches, with the semantics of `KEYS`/`SCAN MATCH`.
    #[inline]
    pub fn matches(&self, key: &[u8]) -> bool {
        let p = self.text.as_bytes();
        if self.literal {
            return p == key;
        }
        let (pre, suf) = (self.prefix_len, self.suffix_len);
        if key.len() < pre + suf
            || key[..pre] != p[..pre]
            || key[key.len() - suf..] != p[p.len() - suf..]
        {
            return false;
        }
        // Literal ends each consume exactly their own bytes, so the middles match alone.
        stringmatch(&p[pre..p.len() - suf], &key[pre..key.len() - suf])
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Redis's glob match on raw bytes (no case folding: `KEYS` and `SCAN` do not fold case).
pub fn stringmatch(pattern: &[u8], key: &[u8]) -> bool {
    if key.is_empty() {
        return pattern.iter().all(|&c| c == b'*');
    }
    let mut skip_longer = false;
    match_impl(pattern, key, &mut skip_longer, 0)
}

fn match_impl(mut p: &[u8], mut s: &[u8], skip_longer: &mut bool, nesting: u32) -> bool {
    if nesting > 1000 {
        return false;
    }
    while !p.is_empty() && !s.is_empty() {
        match p[0] {
            b'*' => {
                while p.len() >= 2 && p[1] == b'*' {
                    p = &p[1..];
                }
                if p.len() == 1 {
                    return true;
                }
                while !s.is_empty() {
                    if match_impl(&p[1..], s, skip_longer, nesting + 1) {
                        return true;
                    }
                    if *skip_longer {
                        return false;
                    }
                    s = &s[1..];
                }
                // The rest of the pattern matched nowhere in the rest of the key, so no
                // earlier `*` can help by eating more: stop the whole search.
                *skip_longer = true;
                return false;
            }
            b'?' => s = &s[1..],
            b'[' => {
                let (hit, rest) = class(&p[1..], s[0]);
                if !hit {
                    return false;
                }
                s = &s[1..];
                // `rest` starts at the closing `]`, or is empty when the class never closed.
                p = rest;
                if p.is_empty() {
                    break;
                }
            }
            c => {
                let lit = if c == b'\\' && p.len() >= 2 {
                    p = &p[1..];
                    p[0]
                } else {
                    c
                };
                if lit != s[0] {
                    return false;
                }
                s = &s[1..];
            }
        }
        p = &p[1..];
        if s.is_empty() {
            while p.first() == Some(&b'*') {
                p = &p[1..];
            }
            break;
        }
    }
    p.is_empty() && s.is_empty()
}

/// Tests byte `c` against the class whose body starts at `p` (just after `[`). Returns the
/// verdict and the pattern from the closing `]` on (empty when unterminated).
fn class(mut p: &[u8], c: u8) -> (bool, &[u8]) {
    let negate = p.first() == Some(&b'^');
    if negate {
        p = &p[1..];
    }
    let mut hit = false;
    loop {
        if p.is_empty() {
            break;
        }
        if p[0] == b'\\' && p.len() >= 2 {
            p = &p[1..];
            hit |= p[0] == c;
        } else if p[0] == b']' {
            break;
        } else if p.len() >= 3 && p[1] == b'-' {
            // Redis compares C `char`s, signed on x86-64 (where nearly every Redis runs):
            // bytes >= 0x80 sort below ASCII in a range there, so they do here too.
            let (mut lo, mut hi) = (p[0] as i8, p[2] as i8);
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            hit |= (lo..=hi).contains(&(c as i8));
            p = &p[2..];
        } else {
            hit |= p[0] == c;
        }
        p = &p[1..];
    }
    (hit != negate, p)
}

/// What is wrong with a pattern that Redis would accept silently but that is almost surely
/// a mistake. Display says how to write it instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobError {
    #[error("empty pattern; use \"*\" to match every key")]
    Empty,
    #[error("pattern is {0} bytes; at most {MAX_PATTERN_BYTES}")]
    TooLong(usize),
    #[error("ends with a lone `\\`; write `\\\\` for a literal backslash")]
    LoneBackslash,
    #[error("`[` at byte {0} is never closed (a `]` right after `-` ends a range, as in Redis; escape it as `\\]`)")]
    Unclosed(usize),
    #[error("`[]` at byte {0} matches nothing (Redis does not take a leading `]` as a member; write `[\\]]`)")]
    EmptyClass(usize),
}

/// Syntax check: what Redis would accept silently but almost surely is a mistake.
fn check(p: &[u8]) -> Result<(), GlobError> {
    if p.is_empty() {
        return Err(GlobError::Empty);
    }
    if p.len() > MAX_PATTERN_BYTES {
        return Err(GlobError::TooLong(p.len()));
    }
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'\\' if i + 1 == p.len() => return Err(GlobError::LoneBackslash),
            b'\\' => i += 2,
            b'[' => {
                let body = &p[i + 1..];
                let (_, rest) = class(body, 0);
                if rest.is_empty() {
                    return Err(GlobError::Unclosed(i + 1));
                }
                if body.first() == Some(&b']') {
                    return Err(GlobError::EmptyClass(i + 1));
                }
                i = p.len() - rest.len() + 1;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        stringmatch(p.as_bytes(), s.as_bytes())
    }

    #[test]
    fn basics_from_the_keys_documentation() {
        assert!(m("h?llo", "hello") && m("h?llo", "hallo") && !m("h?llo", "hllo"));
        assert!(m("h*llo", "hllo") && m("h*llo", "heeeello"));
        assert!(m("h[ae]llo", "hello") && m("h[ae]llo", "hallo") && !m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo") && m("h[^e]llo", "hbllo") && !m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hallo") && m("h[a-b]llo", "hbllo") && !m("h[a-b]llo", "hcllo"));
        assert!(m("*", "anything") && m("a**", "a") && m("*b", "ab") && !m("*a", "ab"));
        assert!(m("key:*", "key:") && !m("key:1??", "key:12") && m("key:1??", "key:123"));
    }

    #[test]
    fn reversed_range_is_swapped_like_redis() {
        assert!(m("[z-a]", "m") && !m("[z-a]", "A"));
        assert!(m("x[9-0]", "x5"));
    }

    #[test]
    fn escapes_match_the_metacharacter_literally() {
        assert!(m(r"a\*b", "a*b") && !m(r"a\*b", "axb"));
        assert!(m(r"\?", "?") && !m(r"\?", "x"));
        assert!(m(r"[\]]", "]") && m(r"[\^a]", "^") && m(r"[a\-z]", "-") && !m(r"[a\-z]", "m"));
        // A trailing backslash has nothing to escape: Redis compares it literally.
        assert!(m("a\\", "a\\"));
    }

    #[test]
    fn unterminated_class_takes_the_rest_of_the_pattern_like_redis() {
        assert!(m("a[bc", "ab") && m("a[bc", "ac") && !m("a[bc", "abc"));
        assert!(!m("[", "x") && m("[^", "x"));
        // `]` right after `-` is the end of a range (`]`..=`a`), so this class never closes.
        assert!(m("[a-]", "^") && m("[a-]", "a") && !m("[a-]", "b"));
    }

    #[test]
    fn ranges_compare_signed_bytes_like_redis_on_x86_64() {
        // 0xff is -1 as a C char: the range becomes -1..='a'.
        assert!(!stringmatch(b"[a-\xff]", b"b"));
        assert!(stringmatch(b"[a-\xff]", b"A"));
    }

    #[test]
    fn empty_key_matches_only_stars() {
        assert!(m("*", "") && m("**", "") && m("", ""));
        assert!(!m("?", "") && !m("[^a]", "") && !m("a", ""));
    }

    #[test]
    fn nested_stars_fail_fast_like_keyspace_regression_tests() {
        // keyspace.tcl "Regression for pattern matching long nested loops".
        let t = std::time::Instant::now();
        assert!(!m(
            "a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b",
            &"a".repeat(40)
        ));
        // "... very long nested loops": the nesting guard gives up.
        assert!(!m(&"*?".repeat(50_000), &"a".repeat(50_000)));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn glob_uses_literal_ends_without_changing_answers() {
        let cases = [
            ("likes:*", "likes:1"),
            ("likes:*", "like"),
            ("vote:final", "vote:final"),
            (r"a\*", "a*"),
            (r"a\bc", "abc"),
            (r"a\\b", r"a\b"),
            ("*:likes", "p:1:likes"),
            ("*:likes", "p:1:like"),
            ("a*b", "ab"),
            ("a?b", "ab"),
            ("a*?", "a"),
            ("[ab]c", "bc"),
            ("[a-]]x", "]x"),
            ("x]y*z", "x]yz"),
            (r"*\*x", "a*x"),
        ];
        for (p, k) in cases {
            assert_eq!(
                Glob::new(p).unwrap().matches(k.as_bytes()),
                m(p, k),
                "{p} {k}"
            );
        }
        assert!(!Glob::new("vote:final").unwrap().matches(b"vote:final2"));
    }

    #[test]
    fn check_rejects_patterns_that_are_surely_mistakes() {
        for bad in ["", "a[bc", "[a-]", "x\\", "[]", "a[]b"] {
            assert!(Glob::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["*", "[^]", "[\\]]", "a[b-c]d", "\\[", "[a-]]", "lock:*"] {
            assert!(Glob::new(good).is_ok(), "{good:?}: {:?}", Glob::new(good));
        }
        assert!(Glob::new(&"a".repeat(MAX_PATTERN_BYTES + 1)).is_err());
    }
}
