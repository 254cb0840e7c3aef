//! Property tests standing in for a fuzzer in `cargo test`: random and mutated input never
//! panics, valid frames always parse back, and how the bytes are split never changes the
//! outcome. The cargo-fuzz targets under `fuzz/` run the same checks for longer.

use bytes::BytesMut;
use proptest::prelude::*;

use super::{parse_value, Limits, ParseError, Proto, ReplyFramer, Request, RequestParser, Value};

/// What a client would see: the requests, then an error or the unparsed rest.
type Outcome = (Vec<Request>, Result<usize, ParseError>);

fn parse_chunked(input: &[u8], chunks: &[usize], limits: &Limits) -> Outcome {
    let mut parser = RequestParser::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = input;
    let mut sizes = chunks.iter().copied().cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        if let Err(e) = parser.parse(&mut buf, &mut out) {
            return (out, Err(e));
        }
    }
    (out, Ok(buf.len()))
}

fn small_limits() -> Limits {
    Limits {
        max_bulk_len: 64,
        max_args: 8,
        max_inline_len: 32,
    }
}

/// Bytes that look like RESP often enough to reach deep into the parser.
fn resp_ish() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        any::<u8>().prop_map(|b| vec![b]),
        Just(b"\r\n".to_vec()),
        Just(b"*".to_vec()),
        Just(b"$".to_vec()),
        (0i64..12).prop_map(|n| n.to_string().into_bytes()),
        Just(b"-1".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"'".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"PING".to_vec()),
    ];
    prop::collection::vec(token, 0..60).prop_map(|v| v.concat())
}

fn request_args() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 1..6)
}

/// A mutation of a valid pipeline: flip, insert or delete one byte.
fn mutate(mut v: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, op, byte) in edits {
        if v.is_empty() {
            v.push(byte);
            continue;
        }
        let at = at % v.len();
        match op % 3 {
            0 => v[at] = byte,
            1 => v.insert(at, byte),
            _ => {
                v.remove(at);
            }
        }
    }
    v
}

fn reply_value() -> impl Strategy<Value = Value> {
    let text = "[a-z0-9 .:]{0,12}".prop_map(|s| bytes::Bytes::from(s.into_bytes()));
    let leaf = prop_oneof![
        "[a-zA-Z ]{0,10}".prop_map(|s| Value::Simple(s.into())),
        "ERR [a-z ]{0,10}".prop_map(|s| Value::Error(s.into())),
        any::<i64>().prop_map(Value::Integer),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(|b| Value::Bulk(b.into())),
        Just(Value::Nil),
        Just(Value::NilArray),
        "-?[0-9]{1,5}\\.[0-9]{1,3}".prop_map(|s| Value::Double(s.into())),
        any::<bool>().prop_map(Value::Boolean),
        "-?[1-9][0-9]{0,40}".prop_map(|s| Value::BigNumber(s.into())),
        text.prop_map(|t| {
            let mut v = b"txt:".to_vec();
            v.extend_from_slice(&t);
            Value::Verbatim(v.into())
        }),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Set),
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Push),
            prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

/// RESP3 has one null, so `*-1` comes back as `_`.
fn resp3_normal(v: Value) -> Value {
    match v {
        Value::NilArray => Value::Nil,
        Value::Array(items) => Value::Array(items.into_iter().map(resp3_normal).collect()),
        Value::Set(items) => Value::Set(items.into_iter().map(resp3_normal).collect()),
        Value::Push(items) => Value::Push(items.into_iter().map(resp3_normal).collect()),
        Value::Map(pairs) => Value::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (resp3_normal(k), resp3_normal(v)))
                .collect(),
        ),
        other => other,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_and_splitting_never_changes_the_outcome(
        input in prop_oneof![prop::collection::vec(any::<u8>(), 0..200), resp_ish()],
        chunks in prop::collection::vec(1usize..9, 1..8),
    ) {
        for limits in [Limits::default(), small_limits()] {
            let whole = parse_chunked(&input, &[input.len().max(1)], &limits);
            let pieces = parse_chunked(&input, &chunks, &limits);
            prop_assert_eq!(&whole, &pieces);
        }
        let _ = parse_value(&input);
        let whole = ReplyFramer::new(64).next_len(&input);
        let mut framer = ReplyFramer::new(64);
        let mut grown = None;
        for end in 0..=input.len() {
            grown = Some(framer.next_len(&input[..end]));
            if !matches!(grown, Some(Ok(None))) {
                break;
            }
        }
        prop_assert_eq!(grown, Some(whole));
    }

    #[test]
    fn valid_pipelines_parse_back_to_their_args(
        requests in prop::collection::vec(request_args(), 1..6),
        chunks in prop::collection::vec(1usize..30, 1..8),
    ) {
        let wire: Vec<u8> = requests.iter().flat_map(|r| Request::from_args(r).wire()).collect();
        let (got, rest) = parse_chunked(&wire, &chunks, &Limits::default());
        prop_assert_eq!(rest, Ok(0));
        prop_assert_eq!(got.len(), requests.len());
        for (req, args) in got.iter().zip(&requests) {
            prop_assert_eq!(req.args().collect::<Vec<_>>(), args.iter().map(|a| a.as_slice()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn mutated_pipelines_never_panic_and_split_consistently(
        requests in prop::collection::vec(request_args(), 1..4),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
        chunks in prop::collection::vec(1usize..12, 1..8),
    ) {
        let wire: Vec<u8> = requests.iter().flat_map(|r| Request::from_args(r).wire()).collect();
        let input = mutate(wire, &edits);
        for limits in [Limits::default(), small_limits()] {
            let whole = parse_chunked(&input, &[input.len().max(1)], &limits);
            prop_assert_eq!(&whole, &parse_chunked(&input, &chunks, &limits));
            // The strict parser only accepts canonical frames: forwarding one is
            // forwarding exactly what re-encoding its arguments would give.
            for req in &whole.0 {
                let args: Vec<&[u8]> = req.args().collect();
                prop_assert_eq!(Request::from_args(&args).wire(), req.wire());
            }
        }
        let _ = parse_value(&input);
        let _ = ReplyFramer::new(1 << 20).next_len(&input);
    }

    #[test]
    fn encoded_values_frame_whole_and_parse_back(v in reply_value(), cut in any::<usize>()) {
        let resp3 = v.to_bytes(Proto::Resp3);
        prop_assert_eq!(ReplyFramer::new(1 << 20).next_len(&resp3), Ok(Some(resp3.len())));
        prop_assert_eq!(parse_value(&resp3), Ok(Some((resp3_normal(v.clone()), resp3.len()))));
        let cut = cut % resp3.len();
        prop_assert_eq!(ReplyFramer::new(1 << 20).next_len(&resp3[..cut]), Ok(None));
        let resp2 = v.to_bytes(Proto::Resp2);
        prop_assert_eq!(ReplyFramer::new(1 << 20).next_len(&resp2), Ok(Some(resp2.len())));
    }
}
