//! The wire format, both directions: the only code that sees RESP bytes.
//!
//! - [`RequestParser`] turns client bytes into [`Request`]s (RESP multibulk and inline
//!   commands, as redis-server 7 reads them, but stricter about a bulk's trailing CRLF).
//! - [`ReplyFramer`] finds where each backend reply ends (RESP2 and RESP3) without building
//!   it, so replies are forwarded as the bytes the backend sent.
//! - [`Value`] and [`parse_value`] build a reply tree for the few replies the proxy merges or
//!   inspects; [`Value::encode`] writes it back for a RESP2 or RESP3 client.
//! - The `encode_*` functions write the proxy's own replies and commands.
//!
//! What a command means (its keys, its routing) belongs to `command`; sockets and buffers
//! belong to `proxy` and `backend`.

mod encode;
mod error;
mod framer;
mod header;
mod inline;
mod parser;
mod request;
mod value;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod reply_tests;
#[cfg(test)]
mod request_tests;

pub use encode::{
    encode_array_header, encode_bulk, encode_command, encode_error, encode_int, encode_map_header,
    encode_null, encode_simple,
};
pub use error::ParseError;
pub use framer::{FrameError, ReplyFramer};
pub use parser::RequestParser;
pub use request::Request;
pub use value::{parse_value, Proto, Value};

/// Limits on what one client may send, with Redis's defaults.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest bulk string argument, in bytes (Redis `proto-max-bulk-len`, 512 MiB).
    pub max_bulk_len: usize,
    /// Most arguments in one multibulk request (Redis's historical limit, 1024 * 1024).
    pub max_args: usize,
    /// Longest inline command line, and longest `*N` / `$N` header line, in bytes
    /// (Redis `PROTO_INLINE_MAX_SIZE`, 64 KiB).
    pub max_inline_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 512 * 1024 * 1024,
            max_args: 1024 * 1024,
            max_inline_len: 64 * 1024,
        }
    }
}

/// Parses a decimal integer the way Redis's `string2ll` does: optional '-', no '+', no
/// leading zeros, no spaces, no "-0", and it must fit an i64.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some(_) => (false, s),
        None => return None,
    };
    match digits {
        [] => return None,
        [b'0'] if !neg => return Some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    if digits.len() > 19 {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        if v <= i64::MAX as u64 + 1 {
            Some((v as i64).wrapping_neg())
        } else {
            None
        }
    } else {
        i64::try_from(v).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_i64;

    #[test]
    fn integers_parse_as_strictly_as_string2ll() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"42"), Some(42));
        assert_eq!(parse_i64(b"-42"), Some(-42));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b"01",
            b"-0",
            b" 1",
            b"1 ",
            b"1a",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
