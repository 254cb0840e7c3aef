//! A reply as a tree, for the few replies the proxy merges or inspects, and its encoding
//! for RESP2 or RESP3 clients. Forwarded replies never come here: they stay bytes,
//! delimited by `framer`.

use bytes::{Bytes, BytesMut};

use super::encode::{encode_int, put_blob, put_header, put_line};
use super::framer::{read_token, FrameError, Read, Token};

/// The protocol a client speaks (`HELLO 3` switches to RESP3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Resp2,
    Resp3,
}

/// A reply. Text stays as sent: a double is kept in its textual form, a verbatim string
/// with its `txt:` prefix.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Simple(Bytes),
    Error(Bytes),
    Integer(i64),
    Bulk(Bytes),
    /// `$-1` or `_`.
    Nil,
    /// `*-1`.
    NilArray,
    Array(Vec<Value>),
    Double(Bytes),
    Boolean(bool),
    BigNumber(Bytes),
    /// The whole payload, format prefix included (`txt:hello`).
    Verbatim(Bytes),
    Map(Vec<(Value, Value)>),
    Set(Vec<Value>),
    Push(Vec<Value>),
}

/// Deepest nesting [`parse_value`] accepts: a tree this deep is still dropped, compared and
/// encoded by recursion without danger to the stack.
pub const MAX_DEPTH: usize = 512;

/// An aggregate being filled.
enum Open {
    List(u8, Vec<Value>, usize),
    Map(Vec<(Value, Value)>, Option<Value>, usize),
    /// Attributes are read and dropped: the value after them is the reply.
    Attribute(usize),
}

impl Open {
    /// Adds one entry; returns the finished aggregate (None for an attribute) once full.
    fn push(&mut self, v: Value) -> Option<Option<Value>> {
        let remaining = match self {
            Open::List(_, items, remaining) => {
                items.push(v);
                remaining
            }
            Open::Map(pairs, key, remaining) => match key.take() {
                None => {
                    *key = Some(v);
                    return None;
                }
                Some(k) => {
                    pairs.push((k, v));
                    remaining
                }
            },
            Open::Attribute(remaining) => remaining,
        };
        *remaining -= 1;
        if *remaining > 0 {
            return None;
        }
        Some(match std::mem::replace(self, Open::Attribute(0)) {
            Open::List(b'~', items, _) => Some(Value::Set(items)),
            Open::List(b'>', items, _) => Some(Value::Push(items)),
            Open::List(_, items, _) => Some(Value::Array(items)),
            Open::Map(pairs, _, _) => Some(Value::Map(pairs)),
            Open::Attribute(_) => None,
        })
    }
}

/// Parses one complete reply at the front of `buf`: `Some((value, bytes used))`, or None
/// when it is not all there. Attributes (`|`) are skipped. Iterative, depth-limited.
pub fn parse_value(buf: &[u8]) -> Result<Option<(Value, usize)>, FrameError> {
    let mut stack: Vec<Open> = Vec::new();
    let mut pos = 0;
    loop {
        let (token, next) = match read_token(buf, pos, 0, usize::MAX)? {
            Read::Done(token, next) => (token, next),
            Read::Need { .. } => return Ok(None),
        };
        pos = next;
        let copy = |s: usize, e: usize| Bytes::copy_from_slice(&buf[s..e]);
        let mut value = match token {
            Token::Line(b'+', s, e) => Value::Simple(copy(s, e)),
            Token::Line(b'-', s, e) => Value::Error(copy(s, e)),
            Token::Line(b',', s, e) => Value::Double(copy(s, e)),
            Token::Line(_, s, e) => Value::BigNumber(copy(s, e)),
            Token::Integer(i) => Value::Integer(i),
            Token::Boolean(b) => Value::Boolean(b),
            Token::Blob(b'=', s, e) => Value::Verbatim(copy(s, e)),
            Token::Blob(b'!', s, e) => Value::Error(copy(s, e)),
            Token::Blob(_, s, e) => Value::Bulk(copy(s, e)),
            Token::Null => Value::Nil,
            Token::NullArray => Value::NilArray,
            Token::Aggregate(kind, 0) => match kind {
                // An empty attribute annotates the value that follows: read on.
                b'|' => continue,
                b'%' => Value::Map(Vec::new()),
                b'~' => Value::Set(Vec::new()),
                b'>' => Value::Push(Vec::new()),
                _ => Value::Array(Vec::new()),
            },
            Token::Aggregate(kind, n) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(FrameError::TooDeep(MAX_DEPTH));
                }
                // Never trust a count for allocation: the entries must arrive first.
                let cap = n.min(1024);
                stack.push(match kind {
                    b'|' => Open::Attribute(n.saturating_mul(2)),
                    b'%' => Open::Map(Vec::with_capacity(cap), None, n),
                    _ => Open::List(kind, Vec::with_capacity(cap), n),
                });
                continue;
            }
        };
        // Hand the finished value up through every aggregate it completes.
        loop {
            let Some(top) = stack.last_mut() else {
                return Ok(Some((value, pos)));
            };
            match top.push(value) {
                None => break,
                Some(finished) => {
                    stack.pop();
                    match finished {
                        Some(v) => value = v,
                        None => break,
                    }
                }
            }
        }
    }
}

impl Value {
    /// Writes this value for a client speaking `proto`. RESP2 clients get what Redis
    /// sends them: maps flattened, sets and pushes as arrays, doubles, big numbers and
    /// verbatim text as bulks, booleans as 1/0, nulls as `$-1` / `*-1`.
    pub fn encode(&self, proto: Proto, out: &mut BytesMut) {
        let resp3 = proto == Proto::Resp3;
        match self {
            Value::Simple(s) => put_line(b'+', s, out),
            Value::Error(s) => put_line(b'-', s, out),
            Value::Integer(i) => encode_int(*i, out),
            Value::Bulk(b) => put_blob(b'$', b, out),
            Value::Nil | Value::NilArray if resp3 => out.extend_from_slice(b"_\r\n"),
            Value::Nil => out.extend_from_slice(b"$-1\r\n"),
            Value::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Value::Double(d) if resp3 => put_line(b',', d, out),
            Value::BigNumber(n) if resp3 => put_line(b'(', n, out),
            Value::Double(b) | Value::BigNumber(b) => put_blob(b'$', b, out),
            Value::Boolean(b) if resp3 => {
                out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" })
            }
            Value::Boolean(b) => encode_int(i64::from(*b), out),
            Value::Verbatim(v) if resp3 => put_blob(b'=', v, out),
            Value::Verbatim(v) => {
                let text = match v.get(3) {
                    Some(b':') => &v[4..],
                    _ => &v[..],
                };
                put_blob(b'$', text, out)
            }
            Value::Map(pairs) => {
                if resp3 {
                    put_header(b'%', pairs.len(), out);
                } else {
                    put_header(b'*', pairs.len() * 2, out);
                }
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
            Value::Array(items) | Value::Set(items) | Value::Push(items) => {
                let prefix = match self {
                    Value::Set(_) if resp3 => b'~',
                    Value::Push(_) if resp3 => b'>',
                    _ => b'*',
                };
                put_header(prefix, items.len(), out);
                for v in items {
                    v.encode(proto, out);
                }
            }
        }
    }

    /// The encoded bytes, for tests and for the rare reply built whole.
    pub fn to_bytes(&self, proto: Proto) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(proto, &mut out);
        out.freeze()
    }
}
