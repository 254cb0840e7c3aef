//! Fuzzes the request parser: no panic on any input, the outcome does not depend on how
//! the bytes are split, and every parsed request survives re-encoding.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use saltshaker::resp::{Limits, ParseError, Request, RequestParser};

type Outcome = (Vec<Request>, Result<usize, ParseError>);

fn parse_chunked(input: &[u8], chunk: usize, limits: &Limits) -> Outcome {
    let mut parser = RequestParser::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in input.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        if let Err(e) = parser.parse(&mut buf, &mut out) {
            return (out, Err(e));
        }
    }
    (out, Ok(buf.len()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, input)) = data.split_first() else {
        return;
    };
    let small = Limits {
        max_bulk_len: 64,
        max_args: 8,
        max_inline_len: 32,
    };
    for limits in [Limits::default(), small] {
        let whole = parse_chunked(input, input.len(), &limits);
        let pieces = parse_chunked(input, usize::from(split % 17) + 1, &limits);
        assert_eq!(whole, pieces, "splitting changed the outcome");
        for request in &whole.0 {
            assert!(request.argc() > 0);
            let args: Vec<&[u8]> = request.args().collect();
            let again = Request::from_args(&args);
            assert_eq!(
                again.wire(),
                request.wire(),
                "wire is not the canonical encoding"
            );
        }
    }
});
