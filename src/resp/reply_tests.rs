//! Tests of the reply side: framing every RESP2/RESP3 type, resuming across pieces,
//! building values, and encoding them for either protocol.

use bytes::{Bytes, BytesMut};

use super::{parse_value, FrameError, Proto, ReplyFramer, Value};

/// One example of every reply type, each a complete reply on its own.
const REPLIES: &[&[u8]] = &[
    b"+OK\r\n",
    b"-ERR unknown command\r\n",
    b":-42\r\n",
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*3\r\n:1\r\n$1\r\na\r\n*1\r\n+x\r\n",
    b"_\r\n",
    b",3.14\r\n",
    b",inf\r\n",
    b"#t\r\n",
    b"#f\r\n",
    b"!10\r\nERR broken\r\n",
    b"=8\r\ntxt:a\r\nb\r\n",
    b"(3492890328409238509324850943850943825024385\r\n",
    b"%2\r\n+a\r\n:1\r\n+b\r\n%0\r\n",
    b"~2\r\n:1\r\n:2\r\n",
    b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nmsg\r\n",
    b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",
    b"*2\r\n|0\r\n:1\r\n|1\r\n+k\r\n+v\r\n:2\r\n",
];

#[test]
fn every_reply_type_is_framed_whole() {
    for r in REPLIES {
        let mut framer = ReplyFramer::new(1 << 20);
        assert_eq!(
            framer.next_len(r),
            Ok(Some(r.len())),
            "{:?}",
            Bytes::from(*r)
        );
    }
}

#[test]
fn every_reply_prefix_needs_more_and_growing_buffers_frame_the_same() {
    let all: Vec<u8> = REPLIES.concat();
    for r in REPLIES {
        for cut in 0..r.len() {
            let mut fresh = ReplyFramer::new(1 << 20);
            assert_eq!(
                fresh.next_len(&r[..cut]),
                Ok(None),
                "{:?} at {cut}",
                Bytes::from(*r)
            );
        }
    }
    // One framer fed a byte at a time across the whole pipeline.
    let mut framer = ReplyFramer::new(1 << 20);
    let (mut start, mut end, mut lens) = (0, 0, Vec::new());
    while end < all.len() {
        end += 1;
        if let Some(len) = framer.next_len(&all[start..end]).unwrap() {
            lens.push(len);
            start += len;
        }
    }
    let expected: Vec<usize> = REPLIES.iter().map(|r| r.len()).collect();
    assert_eq!(lens, expected);
}

#[test]
fn million_element_array_in_64_kib_pieces_is_read_once() {
    let n = 1_000_000;
    let mut reply = format!("*{n}\r\n").into_bytes();
    for i in 0..n {
        reply.extend_from_slice(format!(":{i}\r\n").as_bytes());
    }
    let mut framer = ReplyFramer::new(1 << 20);
    let started = std::time::Instant::now();
    let mut end = 0;
    let mut result = None;
    while end < reply.len() {
        end = (end + 64 * 1024).min(reply.len());
        result = framer.next_len(&reply[..end]).unwrap();
        assert!(result.is_none() || end == reply.len());
    }
    assert_eq!(result, Some(reply.len()));
    // Quadratic rescanning would take minutes here; linear takes well under a second.
    assert!(started.elapsed().as_secs() < 10);
}

#[test]
fn deep_nesting_frames_without_recursion_and_parse_value_refuses_it() {
    let depth = 200_000;
    let mut reply = b"*1\r\n".repeat(depth);
    reply.extend_from_slice(b":1\r\n");
    let mut framer = ReplyFramer::new(1 << 20);
    assert_eq!(framer.next_len(&reply), Ok(Some(reply.len())));
    assert_eq!(parse_value(&reply), Err(FrameError::TooDeep(512)));
}

#[test]
fn framer_resets_after_each_reply_and_after_an_error() {
    let mut framer = ReplyFramer::new(16);
    assert_eq!(framer.next_len(b"*2\r\n:1\r\n"), Ok(None));
    assert_eq!(framer.next_len(b"*2\r\n:1\r\n:2\r\n+OK\r\n"), Ok(Some(12)));
    assert_eq!(framer.next_len(b"+OK\r\n"), Ok(Some(5)));
    assert!(framer.next_len(b"$17\r\n").is_err());
    assert_eq!(framer.next_len(b"$1\r\nx\r\n"), Ok(Some(7)));
}

#[test]
fn malformed_replies_are_errors() {
    let cases: &[(&[u8], FrameError)] = &[
        (b"?\r\n", FrameError::UnknownType(b'?')),
        (b"$?\r\n;4\r\nabcd\r\n;0\r\n", FrameError::Streamed),
        (b"*?\r\n", FrameError::Streamed),
        (b"$3\r\nabcd\r\n", FrameError::MissingCrlf(b'$')),
        (b"+OK\rX", FrameError::MissingCrlf(b'+')),
        (b"$-2\r\n", FrameError::BadHeader(b'$')),
        (b"%-1\r\n", FrameError::BadHeader(b'%')),
        (b":1.5\r\n", FrameError::BadHeader(b':')),
        (b"#x\r\n", FrameError::BadBoolean),
        (b"_x\r\n", FrameError::MissingCrlf(b'_')),
        (b"$100\r\n", FrameError::BulkTooLong { len: 100, max: 64 }),
        (
            b":111111111111111111111111111111",
            FrameError::BadHeader(b':'),
        ),
    ];
    for (input, expected) in cases {
        let mut framer = ReplyFramer::new(64);
        assert_eq!(
            framer.next_len(input).as_ref(),
            Err(expected),
            "{:?}",
            Bytes::from(*input)
        );
    }
    let mut framer = ReplyFramer::new(8);
    assert_eq!(
        framer.next_len(b"+123456789"),
        Err(FrameError::LineTooLong(8))
    );
}

fn value(input: &[u8]) -> Value {
    let (v, used) = parse_value(input).unwrap().unwrap();
    assert_eq!(used, input.len());
    v
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn values_of_every_type_parse() {
    use Value::*;
    let expected = [
        Simple(b("OK")),
        Error(b("ERR unknown command")),
        Integer(-42),
        Bulk(b("hello")),
        Bulk(b("")),
        Nil,
        NilArray,
        Array(vec![]),
        Array(vec![Integer(1), Bulk(b("a")), Array(vec![Simple(b("x"))])]),
        Nil,
        Double(b("3.14")),
        Double(b("inf")),
        Boolean(true),
        Boolean(false),
        Error(b("ERR broken")),
        Verbatim(b("txt:a\r\nb")),
        BigNumber(b("3492890328409238509324850943850943825024385")),
        Map(vec![
            (Simple(b("a")), Integer(1)),
            (Simple(b("b")), Map(vec![])),
        ]),
        Set(vec![Integer(1), Integer(2)]),
        Push(vec![Bulk(b("message")), Bulk(b("ch")), Bulk(b("msg"))]),
        Bulk(b("v")),
        Array(vec![Integer(1), Integer(2)]),
    ];
    for (input, want) in REPLIES.iter().zip(expected) {
        assert_eq!(value(input), want, "{:?}", Bytes::from(*input));
        for cut in 0..input.len() {
            assert_eq!(parse_value(&input[..cut]), Ok(None));
        }
    }
}

#[test]
fn resp3_encoding_round_trips() {
    for input in REPLIES {
        let v = value(input);
        let again = value(&v.to_bytes(Proto::Resp3));
        let expected = if v == Value::NilArray { Value::Nil } else { v };
        assert_eq!(again, expected);
    }
}

#[test]
fn resp2_encoding_downgrades_as_redis_does() {
    let enc = |input: &[u8]| value(input).to_bytes(Proto::Resp2);
    assert_eq!(enc(b"%1\r\n+a\r\n:1\r\n"), &b"*2\r\n+a\r\n:1\r\n"[..]);
    assert_eq!(enc(b"~1\r\n:1\r\n"), &b"*1\r\n:1\r\n"[..]);
    assert_eq!(enc(b">1\r\n:1\r\n"), &b"*1\r\n:1\r\n"[..]);
    assert_eq!(enc(b",1.5\r\n"), &b"$3\r\n1.5\r\n"[..]);
    assert_eq!(enc(b"#t\r\n"), &b":1\r\n"[..]);
    assert_eq!(enc(b"#f\r\n"), &b":0\r\n"[..]);
    assert_eq!(enc(b"_\r\n"), &b"$-1\r\n"[..]);
    assert_eq!(enc(b"*-1\r\n"), &b"*-1\r\n"[..]);
    assert_eq!(enc(b"(12\r\n"), &b"$2\r\n12\r\n"[..]);
    assert_eq!(enc(b"=6\r\ntxt:hi\r\n"), &b"$2\r\nhi\r\n"[..]);
    for input in REPLIES {
        // Every RESP2 encoding is itself a valid, whole reply.
        let bytes = value(input).to_bytes(Proto::Resp2);
        assert_eq!(
            ReplyFramer::new(1 << 20).next_len(&bytes),
            Ok(Some(bytes.len()))
        );
    }
}

#[test]
fn nil_and_nil_array_are_both_null_in_resp3() {
    let mut out = BytesMut::new();
    Value::Nil.encode(Proto::Resp3, &mut out);
    Value::NilArray.encode(Proto::Resp3, &mut out);
    assert_eq!(&out[..], b"_\r\n_\r\n");
}

#[test]
fn huge_declared_counts_allocate_nothing_up_front() {
    assert_eq!(parse_value(b"*9223372036854775807\r\n"), Ok(None));
    assert_eq!(parse_value(b"%4611686018427387904\r\n:1\r\n"), Ok(None));
}
