//! The resumable request parser: client bytes in, [`Request`]s out. Follows redis-server
//! 7's `processMultibulkBuffer` and `processInlineBuffer`, stricter where a proxy must be
//! (a bulk must end in CRLF; header lines must end in CRLF). Inline splitting is `inline`'s.

use bytes::{Bytes, BytesMut};

use super::error::ParseError;
use super::header::quick_header;
use super::inline::split_args;
use super::request::{ArgRanges, Request};
use super::{parse_i64, Limits};

/// Progress inside the request at the front of the buffer, kept across calls so that a
/// large bulk arriving in pieces is looked at once, not once per read. Every offset is
/// relative to the start of that request, which stays at the front of the buffer until
/// the request is complete.
#[derive(Default)]
struct Partial {
    /// Bytes accepted so far; 0 = the request's first line is not read yet.
    pos: usize,
    /// Arguments still to come.
    remaining: usize,
    args: ArgRanges,
    /// Length announced by the bulk header just read; its payload starts at `pos`.
    bulk: Option<usize>,
    /// Nothing can happen before the request has this many bytes.
    need: usize,
    /// How far the current line was already searched for its ending.
    scanned: usize,
}

/// What one step over the front of the buffer found.
enum Step {
    Incomplete,
    /// A line that makes no request (empty inline line, `*0`, `*-1`) of this many bytes.
    Skipped(usize),
    /// A multibulk request of this many bytes, and its arguments.
    Multibulk(usize, ArgRanges),
    /// An inline request of this many bytes, already encoded as a multibulk.
    Inline(usize, Request),
}

/// Resumable request parser; one per client connection.
pub struct RequestParser {
    limits: Limits,
    /// Header lines of up to 20 bytes are within the limits, so `quick_header` may be used.
    quick: bool,
    cur: Partial,
    /// (index in `out`, start, end) of the multibulk requests of this call, waiting for the
    /// one shared buffer that is split off the read buffer at the end of the call.
    pending: Vec<(usize, usize, usize)>,
}

impl RequestParser {
    pub fn new(limits: Limits) -> Self {
        RequestParser {
            quick: limits.max_inline_len >= 20,
            limits,
            cur: Partial::default(),
            pending: Vec::new(),
        }
    }

    /// Parses every complete request at the front of `buf` into `out` and removes their
    /// bytes from `buf`. `Ok(())` when the rest is incomplete (append more and call again;
    /// `buf` must only grow between calls). On `Err`, `out` still holds the requests that
    /// came before the violation, as Redis would have run them.
    pub fn parse(&mut self, buf: &mut BytesMut, out: &mut Vec<Request>) -> Result<(), ParseError> {
        self.parse_at_most(buf, out, usize::MAX)
    }

    /// `parse`, stopping after `max` requests (at least one): the rest stays in `buf`, from
    /// a request's first byte.
    pub fn parse_at_most(
        &mut self,
        buf: &mut BytesMut,
        out: &mut Vec<Request>,
        max: usize,
    ) -> Result<(), ParseError> {
        self.pending.clear();
        let first = out.len();
        let mut start = 0;
        let result = loop {
            if out.len() - first >= max.max(1) {
                break Ok(());
            }
            let s = &buf[start..];
            if s.is_empty() || s.len() < self.cur.need {
                break Ok(());
            }
            match self.step(s) {
                Ok(Step::Incomplete) => break Ok(()),
                Ok(Step::Skipped(len)) => {
                    self.cur = Partial::default();
                    start += len;
                }
                Ok(Step::Multibulk(len, args)) => {
                    self.pending.push((out.len(), start, start + len));
                    out.push(Request {
                        data: Bytes::new(),
                        args,
                        inline: false,
                    });
                    start += len;
                }
                Ok(Step::Inline(len, request)) => {
                    out.push(request);
                    start += len;
                }
                Err(e) => {
                    self.cur = Partial::default();
                    break Err(e);
                }
            }
        };
        if start > 0 {
            let shared = buf.split_to(start).freeze();
            for &(i, s, e) in &self.pending {
                out[i].data = shared.slice(s..e);
            }
        }
        result
    }

    /// How many bytes the buffer must hold before the parser can make progress (0 when
    /// idle). Bounded by the limits, so a caller may reserve it.
    pub fn bytes_needed(&self) -> usize {
        self.cur.need
    }

    fn step(&mut self, s: &[u8]) -> Result<Step, ParseError> {
        if self.cur.pos == 0 {
            if s[0] != b'*' {
                return self.inline(s);
            }
            if self.quick {
                if let Some(step) = self.fast_multibulk(s) {
                    return Ok(step);
                }
            }
        }
        if self.cur.pos == 0 {
            let Some((n, next)) = self.header(s, 0, false)? else {
                return Ok(Step::Incomplete);
            };
            if n <= 0 {
                return Ok(Step::Skipped(next));
            }
            self.cur.remaining = usize::try_from(n)
                .ok()
                .filter(|&n| n <= self.limits.max_args)
                .ok_or(ParseError::InvalidMultibulkLength)?;
            self.cur.pos = next;
        }
        loop {
            if let Some(len) = self.cur.bulk {
                let cur = &mut self.cur;
                let end = cur.pos.saturating_add(len);
                if s.len() < end.saturating_add(2) {
                    cur.need = end.saturating_add(2);
                    return Ok(Step::Incomplete);
                }
                if &s[end..end + 2] != b"\r\n" {
                    return Err(ParseError::MissingCrlfAfterBulk);
                }
                cur.args.push((cur.pos, end));
                cur.pos = end + 2;
                cur.bulk = None;
                cur.remaining -= 1;
                if cur.remaining == 0 {
                    let done = std::mem::take(cur);
                    return Ok(Step::Multibulk(done.pos, done.args));
                }
            }
            let at = self.cur.pos;
            match s.get(at) {
                None => {
                    self.cur.need = at + 1;
                    return Ok(Step::Incomplete);
                }
                Some(&b'$') => {}
                Some(&other) => return Err(ParseError::ExpectedDollar(other)),
            }
            let Some((len, next)) = self.header(s, at, true)? else {
                return Ok(Step::Incomplete);
            };
            let len = usize::try_from(len)
                .ok()
                .filter(|&n| n <= self.limits.max_bulk_len)
                .ok_or(ParseError::InvalidBulkLength)?;
            self.cur.pos = next;
            self.cur.bulk = Some(len);
        }
    }

    /// The common case, a whole multibulk already in the buffer, read with local state.
    /// Stops at the first thing it does not expect (a partial or unusual line, a missing
    /// CRLF, a limit) and leaves its progress in `cur` for `step`, which takes over from
    /// there with the exact rules and messages; so nothing is ever read twice.
    fn fast_multibulk(&mut self, s: &[u8]) -> Option<Step> {
        let (n, mut pos) = quick_header(s, 0)?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n > 0 && n <= self.limits.max_args)?;
        let mut args = ArgRanges::new();
        let mut left = n;
        while left > 0 {
            if s.get(pos) != Some(&b'$') {
                break;
            }
            let Some((len, next)) = quick_header(s, pos) else {
                break;
            };
            let len = len as usize; // quick_header never returns a negative
            if len > self.limits.max_bulk_len {
                break;
            }
            let end = next.saturating_add(len);
            if s.get(end..end.saturating_add(2)) != Some(b"\r\n") {
                break;
            }
            args.push((next, end));
            pos = end + 2;
            left -= 1;
        }
        if left == 0 {
            // A header seen in part by an earlier call may have left its marks.
            self.cur.need = 0;
            self.cur.scanned = 0;
            return Some(Step::Multibulk(pos, args));
        }
        self.cur = Partial {
            pos,
            remaining: left,
            args,
            ..Partial::default()
        };
        None
    }

    /// Reads the number of the `*N` (or, if `bulk`, `$N`) line at `at`: Some((N, index after
    /// the line)), or None (and `need` set) when the line has not all arrived.
    fn header(
        &mut self,
        s: &[u8],
        at: usize,
        bulk: bool,
    ) -> Result<Option<(i64, usize)>, ParseError> {
        if self.quick {
            if let Some(found) = quick_header(s, at) {
                self.cur.scanned = 0;
                return Ok(Some(found));
            }
        }
        let (too_big, invalid) = if bulk {
            (ParseError::BulkCountTooBig, ParseError::InvalidBulkLength)
        } else {
            (
                ParseError::MultibulkCountTooBig,
                ParseError::InvalidMultibulkLength,
            )
        };
        let Some((end, next)) = self.header_line(s, at, too_big)? else {
            return Ok(None);
        };
        let n = parse_i64(&s[at + 1..end]).ok_or(invalid)?;
        Ok(Some((n, next)))
    }

    /// Finds the CRLF ending the `*N` or `$N` line that starts at `at`: Some((index of CR,
    /// index after LF)), or None (and `need` set) when it has not all arrived.
    fn header_line(
        &mut self,
        s: &[u8],
        at: usize,
        too_big: ParseError,
    ) -> Result<Option<(usize, usize)>, ParseError> {
        let max = self.limits.max_inline_len;
        let from = self.cur.scanned.max(at + 1);
        let window_end = s.len().min(at.saturating_add(max).saturating_add(1));
        let found = s
            .get(from..window_end)
            .and_then(|w| w.iter().position(|&b| b == b'\r'));
        let Some(cr) = found.map(|i| from + i) else {
            if s.len() - at > max {
                return Err(too_big);
            }
            self.cur.scanned = s.len();
            self.cur.need = s.len() + 1;
            return Ok(None);
        };
        if s.len() < cr + 2 {
            self.cur.scanned = cr;
            self.cur.need = cr + 2;
            return Ok(None);
        }
        if s[cr + 1] != b'\n' {
            return Err(match too_big {
                ParseError::MultibulkCountTooBig => ParseError::InvalidMultibulkLength,
                _ => ParseError::InvalidBulkLength,
            });
        }
        self.cur.scanned = 0;
        Ok(Some((cr, cr + 2)))
    }

    /// An inline command: one line, ended by LF or CRLF, of at most `max_inline_len` bytes.
    fn inline(&mut self, s: &[u8]) -> Result<Step, ParseError> {
        let max = self.limits.max_inline_len;
        let from = self.cur.scanned;
        let window_end = s.len().min(max.saturating_add(1));
        let found = s
            .get(from..window_end)
            .and_then(|w| w.iter().position(|&b| b == b'\n'));
        let Some(lf) = found.map(|i| from + i) else {
            if s.len() > max {
                return Err(ParseError::InlineTooBig);
            }
            self.cur.scanned = s.len();
            self.cur.need = s.len() + 1;
            return Ok(Step::Incomplete);
        };
        self.cur = Partial::default();
        let line = match s[..lf].split_last() {
            Some((b'\r', rest)) => rest,
            _ => &s[..lf],
        };
        let args = split_args(line)?;
        if args.is_empty() {
            return Ok(Step::Skipped(lf + 1));
        }
        let request = Request::encode(args.iter().map(|a| a.as_slice()), args.len(), true);
        Ok(Step::Inline(lf + 1, request))
    }
}
