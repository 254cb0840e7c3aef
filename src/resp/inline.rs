//! Splitting an inline command line (`SET k "a b"`) into arguments, exactly as Redis's
//! `sdssplitargs` does. Finding the line in the buffer is `parser`'s job.

use super::error::ParseError;

/// C's `isspace` in the "C" locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Splits one line (without its line ending) into arguments: words separated by blanks,
/// "double quotes" with `\n \r \t \b \a \\ \" \xHH` escapes, 'single quotes' with `\'`.
/// A closing quote must be followed by a blank or the end of the line.
///
/// Redis searches the buffer with C string functions, so a NUL byte in an inline line
/// leaves its client waiting forever; rather than run a truncated command, this refuses it.
pub(crate) fn split_args(line: &[u8]) -> Result<Vec<Vec<u8>>, ParseError> {
    if line.contains(&0) {
        return Err(ParseError::NulInInline);
    }
    // Past the end reads as NUL, as in C, which keeps the port of sdssplitargs literal.
    let at = |i: usize| line.get(i).copied().unwrap_or(0);
    let mut args = Vec::new();
    let mut p = 0;
    loop {
        while at(p) != 0 && is_space(at(p)) {
            p += 1;
        }
        if at(p) == 0 {
            return Ok(args);
        }
        let (mut in_double, mut in_single, mut done) = (false, false, false);
        let mut current = Vec::new();
        while !done {
            let c = at(p);
            if in_double {
                match (c, at(p + 1)) {
                    (b'\\', b'x')
                        if hex_value(at(p + 2)).is_some() && hex_value(at(p + 3)).is_some() =>
                    {
                        let hi = hex_value(at(p + 2)).unwrap_or(0);
                        let lo = hex_value(at(p + 3)).unwrap_or(0);
                        current.push(hi * 16 + lo);
                        p += 3;
                    }
                    (b'\\', next) if next != 0 => {
                        p += 1;
                        current.push(match next {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                    }
                    (b'"', next) => {
                        if next != 0 && !is_space(next) {
                            return Err(ParseError::UnbalancedQuotes);
                        }
                        done = true;
                    }
                    (0, _) => return Err(ParseError::UnbalancedQuotes),
                    _ => current.push(c),
                }
            } else if in_single {
                match (c, at(p + 1)) {
                    (b'\\', b'\'') => {
                        p += 1;
                        current.push(b'\'');
                    }
                    (b'\'', next) => {
                        if next != 0 && !is_space(next) {
                            return Err(ParseError::UnbalancedQuotes);
                        }
                        done = true;
                    }
                    (0, _) => return Err(ParseError::UnbalancedQuotes),
                    _ => current.push(c),
                }
            } else {
                match c {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => done = true,
                    b'"' => in_double = true,
                    b'\'' => in_single = true,
                    _ => current.push(c),
                }
            }
            if at(p) != 0 {
                p += 1;
            }
        }
        args.push(current);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &[u8]) -> Result<Vec<String>, ParseError> {
        split_args(s).map(|v| {
            v.into_iter()
                .map(|a| String::from_utf8_lossy(&a).into_owned())
                .collect()
        })
    }

    #[test]
    fn words_split_on_blanks() {
        assert_eq!(split(b"SET k v").unwrap(), ["SET", "k", "v"]);
        assert_eq!(split(b"  GET\t\tk  ").unwrap(), ["GET", "k"]);
        assert_eq!(split(b"").unwrap(), Vec::<String>::new());
        assert_eq!(split(b"   ").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn double_quotes_keep_blanks_and_decode_escapes() {
        assert_eq!(split(br#"SET k "a b""#).unwrap(), ["SET", "k", "a b"]);
        assert_eq!(
            split(br#""\n\r\t\b\a\\\"\x41\x7a\q""#).unwrap(),
            ["\n\r\t\u{8}\u{7}\\\"Azq"]
        );
        // An incomplete \x escape is just an escaped 'x'.
        assert_eq!(split(br#""\x4""#).unwrap(), ["x4"]);
        assert_eq!(split(br#""""#).unwrap(), [""]);
    }

    #[test]
    fn single_quotes_are_literal_except_escaped_quote() {
        assert_eq!(split(br"SET k 'a \n b'").unwrap(), ["SET", "k", r"a \n b"]);
        assert_eq!(split(br"'it\'s'").unwrap(), ["it's"]);
    }

    #[test]
    fn quote_inside_a_word_opens_a_quoted_part() {
        assert_eq!(split(br#"ab"c d""#).unwrap(), ["abc d"]);
    }

    #[test]
    fn unbalanced_quotes_are_a_protocol_error() {
        for bad in [
            &br#"SET k "abc"#[..],
            br"SET k 'abc",
            br#""abc"def"#,
            br"'abc'def",
            br#""abc\"#,
        ] {
            let err = split_args(bad).unwrap_err();
            assert_eq!(
                err.to_string(),
                "Protocol error: unbalanced quotes in request"
            );
        }
    }

    #[test]
    fn nul_byte_in_an_inline_line_is_a_protocol_error() {
        assert_eq!(
            split_args(b"SET k a\0b").unwrap_err().to_string(),
            "Protocol error: NUL byte in inline request"
        );
    }
}
