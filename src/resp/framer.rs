//! Reply framing: where does the next backend reply end? RESP2 and RESP3, resumable, no
//! recursion and no allocation per element. Building a reply tree is `value`'s job; both
//! read tokens with [`read_token`].

use super::parse_i64;

/// The backend sent something that is not a RESP reply this proxy understands. The
/// connection to that backend cannot be trusted after this.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unknown reply type byte 0x{0:02x}")]
    UnknownType(u8),
    #[error("streamed RESP3 replies are not supported")]
    Streamed,
    #[error("invalid length or number after '{}'", *.0 as char)]
    BadHeader(u8),
    #[error("bulk of {len} bytes exceeds the limit of {max}")]
    BulkTooLong { len: usize, max: usize },
    #[error("line longer than {0} bytes")]
    LineTooLong(usize),
    #[error("expected CRLF after '{}' reply", *.0 as char)]
    MissingCrlf(u8),
    #[error("invalid boolean")]
    BadBoolean,
    #[error("reply nested deeper than {0} levels")]
    TooDeep(usize),
}

/// One reply token: a whole scalar, or the header of an aggregate.
#[derive(Debug, PartialEq)]
pub(crate) enum Token {
    /// `+ - , (` : the type byte and the payload range.
    Line(u8, usize, usize),
    /// `:`
    Integer(i64),
    /// `#`
    Boolean(bool),
    /// `$ = !` : the type byte and the payload range (its CRLF is checked).
    Blob(u8, usize, usize),
    /// `$-1` and `_`
    Null,
    /// `*-1`
    NullArray,
    /// `* ~ > % |` : the type byte and the count (pairs for `%` and `|`).
    Aggregate(u8, usize),
}

/// Result of [`read_token`].
pub(crate) enum Read {
    /// The token and the offset just past it.
    Done(Token, usize),
    /// Incomplete: try again when the buffer holds `need` bytes; the line was searched up
    /// to `scanned`.
    Need { need: usize, scanned: usize },
}

/// Longest header line after its type byte: "-9223372036854775808" plus slack.
const MAX_HEADER: usize = 24;

/// Reads the token at `s[at..]`. `scanned` (from a previous `Need`) lets a long simple
/// line resume its search for CRLF where it stopped.
pub(crate) fn read_token(
    s: &[u8],
    at: usize,
    scanned: usize,
    max_len: usize,
) -> Result<Read, FrameError> {
    let Some(&kind) = s.get(at) else {
        return Ok(Read::Need {
            need: at + 1,
            scanned: 0,
        });
    };
    let bounded = !matches!(kind, b'+' | b'-' | b',' | b'(');
    let limit = if bounded { MAX_HEADER } else { max_len };
    if !matches!(
        kind,
        b'+' | b'-'
            | b','
            | b'('
            | b':'
            | b'#'
            | b'_'
            | b'$'
            | b'='
            | b'!'
            | b'*'
            | b'~'
            | b'>'
            | b'%'
            | b'|'
    ) {
        return Err(FrameError::UnknownType(kind));
    }
    // Find the CR ending the line that starts after the type byte.
    let from = scanned.max(at + 1);
    let window_end = s.len().min(at.saturating_add(limit).saturating_add(2));
    let found = s
        .get(from..window_end)
        .and_then(|w| w.iter().position(|&b| b == b'\r'));
    let Some(cr) = found.map(|i| from + i) else {
        if s.len() - at > limit.saturating_add(1) {
            return Err(if bounded {
                FrameError::BadHeader(kind)
            } else {
                FrameError::LineTooLong(max_len)
            });
        }
        return Ok(Read::Need {
            need: s.len() + 1,
            scanned: if bounded { 0 } else { s.len() },
        });
    };
    if s.len() < cr + 2 {
        return Ok(Read::Need {
            need: cr + 2,
            scanned: if bounded { 0 } else { cr },
        });
    }
    if s[cr + 1] != b'\n' {
        return Err(FrameError::MissingCrlf(kind));
    }
    let line = &s[at + 1..cr];
    let next = cr + 2;
    if line.first() == Some(&b'?') && matches!(kind, b'$' | b'*' | b'~' | b'%' | b'>' | b'|') {
        return Err(FrameError::Streamed);
    }
    let token = match kind {
        b'+' | b'-' | b',' | b'(' => Token::Line(kind, at + 1, cr),
        b':' => Token::Integer(parse_i64(line).ok_or(FrameError::BadHeader(kind))?),
        b'#' => match line {
            b"t" => Token::Boolean(true),
            b"f" => Token::Boolean(false),
            _ => return Err(FrameError::BadBoolean),
        },
        b'_' if line.is_empty() => Token::Null,
        b'_' => return Err(FrameError::MissingCrlf(kind)),
        _ => {
            let n = parse_i64(line).ok_or(FrameError::BadHeader(kind))?;
            match (kind, n) {
                (b'$', -1) => Token::Null,
                (b'*', -1) => Token::NullArray,
                (_, n) if n < 0 => return Err(FrameError::BadHeader(kind)),
                (b'$' | b'=' | b'!', n) => {
                    let len = usize::try_from(n).map_err(|_| FrameError::BadHeader(kind))?;
                    if len > max_len {
                        return Err(FrameError::BulkTooLong { len, max: max_len });
                    }
                    let end = next.saturating_add(len);
                    if s.len() < end.saturating_add(2) {
                        return Ok(Read::Need {
                            need: end.saturating_add(2),
                            scanned: 0,
                        });
                    }
                    if &s[end..end + 2] != b"\r\n" {
                        return Err(FrameError::MissingCrlf(kind));
                    }
                    return Ok(Read::Done(Token::Blob(kind, next, end), end + 2));
                }
                (_, n) => Token::Aggregate(
                    kind,
                    usize::try_from(n).map_err(|_| FrameError::BadHeader(kind))?,
                ),
            }
        }
    };
    Ok(Read::Done(token, next))
}

/// One open aggregate: how many entries are still to come, and whether it is an
/// attribute (which annotates the value after it rather than being one).
struct Level {
    remaining: usize,
    attr: bool,
}

/// Finds the end of the next complete reply at the front of a growing buffer. Keeps its
/// position and a stack of open aggregates across calls, so a reply of a million elements
/// arriving in 64 KiB pieces is read once.
pub struct ReplyFramer {
    max_bulk_len: usize,
    pos: usize,
    need: usize,
    scanned: usize,
    stack: Vec<Level>,
}

impl ReplyFramer {
    /// `max_bulk_len` bounds bulk payloads and simple lines (`+ - , (`) alike, so a broken
    /// backend cannot make the proxy buffer without end.
    pub fn new(max_bulk_len: usize) -> Self {
        ReplyFramer {
            max_bulk_len,
            pos: 0,
            need: 0,
            scanned: 0,
            stack: Vec::new(),
        }
    }

    /// `Some(len)`: the first `len` bytes of `buf` are one complete reply, and the framer
    /// is reset for the next one (which starts at `buf[len..]` once the caller has consumed
    /// those bytes). `None`: need more bytes; call again with the same buffer, grown.
    pub fn next_len(&mut self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        loop {
            if buf.len() < self.need {
                return Ok(None);
            }
            let read = read_token(buf, self.pos, self.scanned, self.max_bulk_len);
            let (token, next) = match read {
                Ok(Read::Done(token, next)) => (token, next),
                Ok(Read::Need { need, scanned }) => {
                    self.need = need;
                    self.scanned = scanned;
                    return Ok(None);
                }
                Err(e) => {
                    self.reset();
                    return Err(e);
                }
            };
            self.pos = next;
            self.need = 0;
            self.scanned = 0;
            let complete = match token {
                Token::Aggregate(kind, n) if n > 0 => {
                    let pairs = matches!(kind, b'%' | b'|');
                    let Some(remaining) = n.checked_mul(if pairs { 2 } else { 1 }) else {
                        self.reset();
                        return Err(FrameError::BadHeader(kind));
                    };
                    self.stack.push(Level {
                        remaining,
                        attr: kind == b'|',
                    });
                    false
                }
                // An empty attribute still precedes the value it annotates.
                Token::Aggregate(b'|', _) => false,
                _ => self.element_done(),
            };
            if complete {
                let len = self.pos;
                self.reset();
                return Ok(Some(len));
            }
        }
    }

    /// Counts one finished element against the open aggregates; true when the whole reply
    /// is finished.
    fn element_done(&mut self) -> bool {
        while let Some(top) = self.stack.last_mut() {
            top.remaining -= 1;
            if top.remaining > 0 {
                return false;
            }
            let attr = top.attr;
            self.stack.pop();
            if attr {
                return false;
            }
        }
        true
    }

    fn reset(&mut self) {
        self.pos = 0;
        self.need = 0;
        self.scanned = 0;
        self.stack.clear();
    }
}
