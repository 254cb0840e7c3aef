//! Encoders for the proxy's own replies and commands, and the allocation-free integer
//! formatter every encoder in `resp` uses. Reply trees are encoded by `value`.

use bytes::{BufMut, BytesMut};

use super::Proto;

const CRLF: &[u8] = b"\r\n";

/// Writes `v` in decimal into a stack buffer; returns the buffer and where the digits start.
fn format_u64(mut v: u64, buf: &mut [u8; 20]) -> usize {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return i;
        }
    }
}

/// Appends the decimal form of `v`.
pub(crate) fn put_i64(v: i64, out: &mut BytesMut) {
    let mut buf = [0u8; 20];
    let start = format_u64(v.unsigned_abs(), &mut buf);
    if v < 0 {
        out.put_u8(b'-');
    }
    out.extend_from_slice(&buf[start..]);
}

/// Appends the decimal form of `v`.
pub(crate) fn put_usize(v: usize, out: &mut BytesMut) {
    let mut buf = [0u8; 20];
    let start = format_u64(v as u64, &mut buf);
    out.extend_from_slice(&buf[start..]);
}

/// Appends `<prefix><n>\r\n`, the header of every length-prefixed type.
pub(crate) fn put_header(prefix: u8, n: usize, out: &mut BytesMut) {
    out.reserve(24);
    out.put_u8(prefix);
    put_usize(n, out);
    out.extend_from_slice(CRLF);
}

/// Appends `<prefix><payload>\r\n` for a bulk-like type (`$`, `=`).
pub(crate) fn put_blob(prefix: u8, payload: &[u8], out: &mut BytesMut) {
    out.reserve(payload.len() + 24);
    put_header(prefix, payload.len(), out);
    out.extend_from_slice(payload);
    out.extend_from_slice(CRLF);
}

/// Appends `<prefix><line>\r\n` with any CR or LF in `line` replaced by a space, so a
/// message can never end the line early or smuggle a second reply.
pub(crate) fn put_line(prefix: u8, line: &[u8], out: &mut BytesMut) {
    out.reserve(line.len() + 3);
    out.put_u8(prefix);
    for chunk in line.split_inclusive(|&b| b == b'\r' || b == b'\n') {
        match chunk.split_last() {
            Some((&last, head)) if last == b'\r' || last == b'\n' => {
                out.extend_from_slice(head);
                out.put_u8(b' ');
            }
            _ => out.extend_from_slice(chunk),
        }
    }
    out.extend_from_slice(CRLF);
}

/// `-<msg>\r\n`. `msg` carries its own prefix (`ERR ...`, `MOVED ...`); CR and LF in it
/// become spaces.
pub fn encode_error(msg: &str, out: &mut BytesMut) {
    put_line(b'-', msg.as_bytes(), out);
}

/// `+<s>\r\n`; CR and LF in `s` become spaces.
pub fn encode_simple(s: &str, out: &mut BytesMut) {
    put_line(b'+', s.as_bytes(), out);
}

/// `:<i>\r\n`.
pub fn encode_int(i: i64, out: &mut BytesMut) {
    out.reserve(23);
    out.put_u8(b':');
    put_i64(i, out);
    out.extend_from_slice(CRLF);
}

/// `$<len>\r\n<b>\r\n`.
pub fn encode_bulk(b: &[u8], out: &mut BytesMut) {
    put_blob(b'$', b, out);
}

/// The null reply a client of `proto` expects for a missing value: `$-1` or `_`.
pub fn encode_null(proto: Proto, out: &mut BytesMut) {
    out.extend_from_slice(match proto {
        Proto::Resp2 => b"$-1\r\n",
        Proto::Resp3 => b"_\r\n",
    });
}

/// `*<n>\r\n`; the caller writes the `n` elements.
pub fn encode_array_header(n: usize, out: &mut BytesMut) {
    put_header(b'*', n, out);
}

/// `%<n>\r\n` in RESP3, `*<2n>\r\n` in RESP2; the caller writes `n` key/value pairs.
pub fn encode_map_header(n: usize, proto: Proto, out: &mut BytesMut) {
    match proto {
        Proto::Resp3 => put_header(b'%', n, out),
        Proto::Resp2 => put_header(b'*', n.saturating_mul(2), out),
    }
}

/// A command as a client would send it: a multibulk of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A], out: &mut BytesMut) {
    let payload: usize = args.iter().map(|a| a.as_ref().len() + 16).sum();
    out.reserve(payload + 16);
    encode_array_header(args.len(), out);
    for a in args {
        encode_bulk(a.as_ref(), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
        let mut out = BytesMut::new();
        f(&mut out);
        out.to_vec()
    }

    #[test]
    fn integers_format_without_allocation_at_the_extremes() {
        assert_eq!(enc(|o| encode_int(0, o)), b":0\r\n");
        assert_eq!(enc(|o| encode_int(-7, o)), b":-7\r\n");
        assert_eq!(
            enc(|o| encode_int(i64::MAX, o)),
            b":9223372036854775807\r\n"
        );
        assert_eq!(
            enc(|o| encode_int(i64::MIN, o)),
            b":-9223372036854775808\r\n"
        );
        for v in [1i64, 9, 10, 99, 100, 12345, -1, -10, 1 << 40] {
            assert_eq!(enc(|o| encode_int(v, o)), format!(":{v}\r\n").as_bytes());
        }
    }

    #[test]
    fn error_message_newlines_become_spaces() {
        assert_eq!(
            enc(|o| encode_error("ERR bad\r\nthing\n", o)),
            b"-ERR bad  thing \r\n"
        );
        assert_eq!(enc(|o| encode_simple("OK", o)), b"+OK\r\n");
        assert_eq!(enc(|o| encode_simple("", o)), b"+\r\n");
    }

    #[test]
    fn bulk_null_and_headers_encode_per_protocol() {
        assert_eq!(enc(|o| encode_bulk(b"hi", o)), b"$2\r\nhi\r\n");
        assert_eq!(enc(|o| encode_bulk(b"", o)), b"$0\r\n\r\n");
        assert_eq!(enc(|o| encode_null(Proto::Resp2, o)), b"$-1\r\n");
        assert_eq!(enc(|o| encode_null(Proto::Resp3, o)), b"_\r\n");
        assert_eq!(enc(|o| encode_array_header(3, o)), b"*3\r\n");
        assert_eq!(enc(|o| encode_map_header(2, Proto::Resp3, o)), b"%2\r\n");
        assert_eq!(enc(|o| encode_map_header(2, Proto::Resp2, o)), b"*4\r\n");
    }

    #[test]
    fn command_encodes_as_multibulk() {
        assert_eq!(
            enc(|o| encode_command(&["SET", "k", "v"], o)),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
        );
        let none: [&[u8]; 0] = [];
        assert_eq!(enc(|o| encode_command(&none, o)), b"*0\r\n");
    }
}
