//! What a client can get wrong on the wire: the request parser's and the inline
//! splitter's errors, worded as Redis words them.

use std::fmt;

/// A protocol violation by the client. Display is the message Redis would send; the
/// caller replies `-ERR <message>` and closes the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("Protocol error: expected '$', got '{}'", ShowByte(*.0))]
    ExpectedDollar(u8),
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    #[error("Protocol error: expected CRLF after bulk")]
    MissingCrlfAfterBulk,
    #[error("Protocol error: too big mbulk count string")]
    MultibulkCountTooBig,
    #[error("Protocol error: too big bulk count string")]
    BulkCountTooBig,
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    #[error("Protocol error: NUL byte in inline request")]
    NulInInline,
}

/// A byte as Redis's `%c` shows it, escaped when not printable.
struct ShowByte(u8);

impl fmt::Display for ShowByte {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() || self.0 == b' ' {
            write!(f, "{}", self.0 as char)
        } else {
            write!(f, "\\x{:02x}", self.0)
        }
    }
}
