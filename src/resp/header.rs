//! The fast path for `*N` / `$N` header lines that are whole and ordinary. The general,
//! resumable path with Redis's exact rules and messages is `parser`'s.

/// The common header, whole: a type byte, 1 to 18 digits without a leading zero (or a lone
/// "0"), CRLF. Returns (N, index after the line); anything else takes the general path,
/// which gives the same answer more slowly. Short enough for any sane `max_inline_len`.
#[inline]
pub(crate) fn quick_header(s: &[u8], at: usize) -> Option<(i64, usize)> {
    // Most headers have one or two digits: check those in one comparison each.
    match s.get(at + 1..at + 5) {
        Some(&[d @ b'0'..=b'9', b'\r', b'\n', _]) => Some((i64::from(d - b'0'), at + 4)),
        Some(&[d1 @ b'1'..=b'9', d2 @ b'0'..=b'9', b'\r', b'\n']) => {
            Some((i64::from(d1 - b'0') * 10 + i64::from(d2 - b'0'), at + 5))
        }
        _ => long_header(s, at),
    }
}

fn long_header(s: &[u8], at: usize) -> Option<(i64, usize)> {
    let (&first, tail) = s.get(at + 1..)?.split_first()?;
    if !(b'1'..=b'9').contains(&first) {
        return (first == b'0' && tail.starts_with(b"\r\n")).then_some((0, at + 4));
    }
    let mut v = i64::from(first - b'0');
    for (i, &b) in tail.iter().take(18).enumerate() {
        match b {
            b'0'..=b'9' if i < 17 => v = v * 10 + i64::from(b - b'0'),
            b'\r' => return (tail.get(i + 1) == Some(&b'\n')).then_some((v, at + i + 4)),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::parse_i64;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn quick_header_agrees_with_the_general_path(line in "[-+0-9]{0,21}(\r\n)?[$x]?") {
            let input = format!("${line}");
            let s = input.as_bytes();
            if let Some((n, next)) = quick_header(s, 0) {
                let cr = s.iter().position(|&b| b == b'\r').unwrap();
                prop_assert_eq!(Some(n), parse_i64(&s[1..cr]));
                prop_assert_eq!(next, cr + 2);
            }
        }
    }

    #[test]
    fn quick_header_takes_the_common_lengths() {
        assert_eq!(quick_header(b"$0\r\n", 0), Some((0, 4)));
        assert_eq!(quick_header(b"$0\r\n$", 0), Some((0, 4)));
        assert_eq!(quick_header(b"$7\r\n$", 0), Some((7, 4)));
        assert_eq!(quick_header(b"$42\r\n", 0), Some((42, 5)));
        assert_eq!(quick_header(b"$04\r\n", 0), None);
        assert_eq!(quick_header(b"*3\r\n", 0), Some((3, 4)));
        assert_eq!(quick_header(b"xx$1024\r\n", 2), Some((1024, 9)));
        assert_eq!(
            quick_header(b"$999999999999999999\r\n", 0),
            Some((999_999_999_999_999_999, 21))
        );
        for other in [
            &b"$01\r\n"[..],
            b"$-1\r\n",
            b"$1\r",
            b"$\r\n",
            b"$1234567890123456789\r\n",
        ] {
            assert_eq!(quick_header(other, 0), None);
        }
    }
}
