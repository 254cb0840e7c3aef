//! Tests of the request parser: pipelines split at every point, inline commands, and
//! every protocol error a client can earn.

use bytes::BytesMut;

use super::{Limits, ParseError, Request, RequestParser};

/// Parses `input` delivered in pieces of the given sizes (the last piece takes the rest).
fn parse_in_pieces(input: &[u8], sizes: &mut dyn Iterator<Item = usize>) -> Vec<Request> {
    let mut parser = RequestParser::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        parser.parse(&mut buf, &mut out).expect("valid input");
    }
    assert!(buf.is_empty(), "left over: {:?}", buf);
    out
}

fn parse_all(input: &[u8]) -> Result<Vec<Request>, ParseError> {
    parse_with(Limits::default(), input)
}

fn parse_with(limits: Limits, input: &[u8]) -> Result<Vec<Request>, ParseError> {
    let mut buf = BytesMut::from(input);
    let mut out = Vec::new();
    RequestParser::new(limits).parse(&mut buf, &mut out)?;
    Ok(out)
}

fn error_of(input: &[u8]) -> String {
    parse_all(input).expect_err("a protocol error").to_string()
}

fn args(r: &Request) -> Vec<String> {
    r.args()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// A small deterministic generator, so a failing chunking is reproducible.
fn xorshift(mut x: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Some((x % 40) as usize + 1)
    })
}

fn pipeline() -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..16 {
        v.extend_from_slice(&Request::from_args(&["SET", &format!("key:{i:04}"), "value"]).wire());
    }
    v.extend_from_slice(b"*0\r\n*-1\r\nPING\r\n\r\n  \nGET \"a b\"\n");
    v.extend_from_slice(b"*2\r\n$4\r\nECHO\r\n$10\r\n\r\n\r\n\0\0\r\n\r\n\r\n");
    // Ends short, so a wait-for-more mark left behind by any split shows as leftover bytes.
    v.extend_from_slice(b"*1\r\n$4\r\nPING\r\n\n");
    v
}

#[test]
fn pipelined_requests_parse_the_same_whole_byte_by_byte_and_in_random_chunks() {
    let input = pipeline();
    let whole = parse_all(&input).unwrap();
    assert_eq!(whole.len(), 20);
    assert_eq!(args(&whole[3]), ["SET", "key:0003", "value"]);
    assert_eq!(args(&whole[16]), ["PING"]);
    assert_eq!(args(&whole[17]), ["GET", "a b"]);
    assert_eq!(whole[18].arg(1), b"\r\n\r\n\0\0\r\n\r\n");
    assert_eq!(parse_in_pieces(&input, &mut std::iter::repeat(1)), whole);
    for seed in 1..200 {
        assert_eq!(
            parse_in_pieces(&input, &mut xorshift(seed)),
            whole,
            "seed {seed}"
        );
    }
}

#[test]
fn every_split_point_of_a_pipeline_gives_the_same_requests() {
    let input = pipeline();
    let whole = parse_all(&input).unwrap();
    for cut in 0..=input.len() {
        let sizes = [cut, input.len()];
        assert_eq!(
            parse_in_pieces(&input, &mut sizes.into_iter()),
            whole,
            "cut {cut}"
        );
    }
}

#[test]
fn requests_of_one_call_share_one_buffer_and_keep_their_original_bytes() {
    let input = b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
    let reqs = parse_all(input).unwrap();
    assert_eq!(&reqs[0].wire()[..], b"*1\r\n$4\r\nPING\r\n");
    assert_eq!(&reqs[1].wire()[..], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    let first_end = reqs[0].wire().as_ptr() as usize + reqs[0].wire_len();
    assert_eq!(reqs[1].wire().as_ptr() as usize, first_end);
    assert_eq!(&reqs[1].arg_bytes(1)[..], b"k");
    assert!(!reqs[1].is_inline());
}

#[test]
fn partial_request_stays_in_the_buffer_and_complete_ones_leave_it() {
    let mut parser = RequestParser::new(Limits::default());
    let mut buf = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGE"[..]);
    let mut out = Vec::new();
    parser.parse(&mut buf, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(&buf[..], b"*2\r\n$3\r\nGE");
    buf.extend_from_slice(b"T\r\n$1\r\nk\r\n");
    parser.parse(&mut buf, &mut out).unwrap();
    assert_eq!(args(&out[1]), ["GET", "k"]);
    assert!(buf.is_empty());
}

#[test]
fn large_bulk_arriving_in_pieces_waits_for_its_announced_length() {
    let value = vec![b'x'; 1 << 20];
    let wire = Request::from_args(&[&b"SET"[..], b"k", &value]).wire();
    let mut parser = RequestParser::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in wire.chunks(4096) {
        buf.extend_from_slice(piece);
        parser.parse(&mut buf, &mut out).unwrap();
        if out.is_empty() && buf.len() > 64 {
            // The parser knows the whole size and does not look before it is there.
            assert_eq!(parser.bytes_needed(), wire.len());
        }
    }
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].arg(2).len(), 1 << 20);
}

#[test]
fn huge_multibulk_count_allocates_nothing_up_front() {
    let reqs = parse_all(b"*1048576\r\n$3\r\nSET\r\n").unwrap();
    assert!(reqs.is_empty());
    let mut parser = RequestParser::new(Limits::default());
    let mut buf = BytesMut::from(&b"*1048576\r\n$1\r\na\r\n"[..]);
    parser.parse(&mut buf, &mut Vec::new()).unwrap();
    assert_eq!(parser.bytes_needed(), buf.len() + 1);
}

#[test]
fn empty_and_null_multibulks_are_skipped() {
    let reqs = parse_all(b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n").unwrap();
    assert_eq!(reqs.len(), 1);
    assert_eq!(&reqs[0].wire()[..], b"*1\r\n$4\r\nPING\r\n");
}

#[test]
fn skipped_line_that_arrived_in_pieces_leaves_no_state_behind() {
    // Found by the fuzzer: a split `*0` header left its wait-for-more mark behind.
    let input = b"PING\n*0\r\n\n";
    let whole = parse_all(input).unwrap();
    assert_eq!(whole.len(), 1);
    let sizes = [7, 4];
    assert_eq!(parse_in_pieces(input, &mut sizes.into_iter()), whole);
}

#[test]
fn inline_commands_accept_crlf_or_lone_lf_and_skip_empty_lines() {
    let reqs = parse_all(b"PING\r\n\r\n\n   \r\nSET k 'a b'\nECHO \"x\\ty\"\r\n").unwrap();
    assert_eq!(reqs.len(), 3);
    assert_eq!(args(&reqs[0]), ["PING"]);
    assert_eq!(args(&reqs[1]), ["SET", "k", "a b"]);
    assert_eq!(args(&reqs[2]), ["ECHO", "x\ty"]);
    assert!(reqs[1].is_inline());
    // Forwarded as the multibulk a backend expects.
    assert_eq!(
        &reqs[1].wire()[..],
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\na b\r\n"
    );
    assert_eq!(&reqs[1].arg_bytes(2)[..], b"a b");
}

#[test]
fn inline_line_up_to_the_limit_is_accepted_however_it_arrives() {
    let limits = Limits {
        max_inline_len: 16,
        ..Limits::default()
    };
    let ok = b"GET 12345678901\r\n"; // 16 bytes before LF, CR included
    assert_eq!(parse_with(limits.clone(), ok).unwrap().len(), 1);
    let err = parse_with(limits.clone(), b"GET 123456789012\r\n").unwrap_err();
    assert_eq!(err, ParseError::InlineTooBig);
    // Without its LF yet: an error as soon as the limit is passed, not before.
    assert!(parse_with(limits.clone(), b"GET 123456789012")
        .unwrap()
        .is_empty());
    assert_eq!(
        parse_with(limits, b"GET 1234567890123")
            .unwrap_err()
            .to_string(),
        "Protocol error: too big inline request"
    );
}

#[test]
fn unbalanced_quotes_in_an_inline_command_are_a_protocol_error() {
    assert_eq!(
        error_of(b"SET k \"abc\r\n"),
        "Protocol error: unbalanced quotes in request"
    );
}

#[test]
fn multibulk_length_over_the_limit_or_malformed_is_invalid() {
    let msg = "Protocol error: invalid multibulk length";
    assert_eq!(error_of(b"*1048577\r\n"), msg);
    assert_eq!(error_of(b"*abc\r\n"), msg);
    assert_eq!(error_of(b"*\r\n"), msg);
    assert_eq!(error_of(b"*+1\r\n"), msg);
    assert_eq!(error_of(b"*1\rX"), msg);
    assert!(parse_all(b"*1048576\r\n").is_ok());
}

#[test]
fn bulk_header_must_start_with_dollar() {
    assert_eq!(
        error_of(b"*1\r\n:3\r\nabc\r\n"),
        "Protocol error: expected '$', got ':'"
    );
    assert_eq!(
        error_of(b"*1\r\n\x01"),
        "Protocol error: expected '$', got '\\x01'"
    );
}

#[test]
fn negative_oversized_or_malformed_bulk_length_is_invalid() {
    let msg = "Protocol error: invalid bulk length";
    assert_eq!(error_of(b"*1\r\n$-1\r\n"), msg);
    assert_eq!(error_of(b"*1\r\n$x\r\n"), msg);
    assert_eq!(error_of(b"*1\r\n$536870913\r\n"), msg);
    assert_eq!(error_of(b"*1\r\n$3\rX"), msg);
    let small = Limits {
        max_bulk_len: 4,
        ..Limits::default()
    };
    assert_eq!(
        parse_with(small.clone(), b"*1\r\n$5\r\n")
            .unwrap_err()
            .to_string(),
        msg
    );
    assert_eq!(parse_with(small, b"*1\r\n$4\r\nabcd\r\n").unwrap().len(), 1);
}

#[test]
fn bulk_without_crlf_is_a_protocol_error() {
    let msg = "Protocol error: expected CRLF after bulk";
    assert_eq!(error_of(b"*1\r\n$3\r\nabcd\r\n"), msg);
    assert_eq!(error_of(b"*1\r\n$3\r\nabc\n\r"), msg);
    assert_eq!(error_of(b"*1\r\n$3\r\nabc\rx"), msg);
}

#[test]
fn header_lines_without_crlf_are_limited_to_64_kib() {
    // Redis counts the type byte too: 64 KiB in all without CR is still waiting.
    let mut long = vec![b'*'];
    long.extend(vec![b'1'; 64 * 1024 - 1]);
    assert!(parse_all(&long).unwrap().is_empty());
    long.push(b'1');
    assert_eq!(
        parse_all(&long).unwrap_err().to_string(),
        "Protocol error: too big mbulk count string"
    );
    let mut long = b"*1\r\n$".to_vec();
    long.extend(vec![b'1'; 64 * 1024]);
    assert_eq!(
        parse_all(&long).unwrap_err().to_string(),
        "Protocol error: too big bulk count string"
    );
}

#[test]
fn requests_before_a_violation_are_still_delivered() {
    let mut buf = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*1\r\n$3\r\nabcd\r\n"[..]);
    let mut out = Vec::new();
    let err = RequestParser::new(Limits::default()).parse(&mut buf, &mut out);
    assert_eq!(err, Err(ParseError::MissingCrlfAfterBulk));
    assert_eq!(out.len(), 1);
    assert_eq!(args(&out[0]), ["PING"]);
}

#[test]
fn slow_header_is_not_rescanned_from_the_start() {
    let mut parser = RequestParser::new(Limits::default());
    let mut buf = BytesMut::from(&b"*1\r\n$"[..]);
    let mut out = Vec::new();
    for _ in 0..10 {
        buf.extend_from_slice(b"0");
        parser.parse(&mut buf, &mut out).unwrap();
        assert_eq!(parser.bytes_needed(), buf.len() + 1);
    }
}

/// CPU time of this thread in nanoseconds, where Linux tells it: on a shared machine the
/// wall clock also counts the time other processes had the core.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// `cargo test --release -- --ignored parse_throughput --nocapture`
/// (RESP_BENCH_ROUNDS sets the number of 16-request batches, default a million).
#[test]
#[ignore]
fn parse_throughput() {
    let mut batch = Vec::new();
    for i in 0..16 {
        let key = format!("key:{i:04}");
        batch.extend_from_slice(&Request::from_args(&["SET", &key, "value"]).wire());
    }
    let mut parser = RequestParser::new(Limits::default());
    let mut out = Vec::with_capacity(16);
    let rounds: u32 = std::env::var("RESP_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1_000_000);
    let mut buf = BytesMut::with_capacity(batch.len());
    let cpu_start = thread_cpu_ns();
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        buf.extend_from_slice(&batch);
        parser.parse(&mut buf, &mut out).unwrap();
        assert_eq!(out.len(), 16);
        out.clear();
    }
    let elapsed = start.elapsed();
    let n = f64::from(rounds) * 16.0;
    println!(
        "wall: {:.1} ns/request, {:.1} M requests/s",
        elapsed.as_nanos() as f64 / n,
        n / elapsed.as_secs_f64() / 1e6
    );
    if let (Some(a), Some(b)) = (cpu_start, thread_cpu_ns()) {
        println!("cpu:  {:.1} ns/request", (b - a) as f64 / n);
    }
}
