//! Errors of classification, worded exactly as Redis 7.0 words them, so a client sees
//! the same reply through the proxy as from the server (the proxy sends "-" + Display).

use std::borrow::Cow;

use super::{Args, Spec};

/// Why a request could not be classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// Unknown command or unknown subcommand; holds the whole reply text.
    #[error("{0}")]
    Unknown(String),
    /// Wrong number of arguments for this command or subcommand.
    #[error("ERR wrong number of arguments for '{}' command", .0.fullname())]
    Arity(&'static Spec),
    /// Arguments from which the keys cannot be found (numkeys, STREAMS..): Redis's text.
    #[error("{0}")]
    Syntax(Cow<'static, str>),
}

// Redis caps what it echoes back of a name or of the arguments.
const ECHO_MAX: usize = 128;

impl CommandError {
    pub(super) fn syntax(text: &'static str) -> Self {
        CommandError::Syntax(Cow::Borrowed(text))
    }

    /// "ERR unknown command 'foo', with args beginning with: 'a' 'b' "
    pub(super) fn unknown<A: Args + ?Sized>(args: &A) -> Self {
        let mut out = b"ERR unknown command '".to_vec();
        if args.argc() > 0 {
            out.extend_from_slice(c_str(args.arg(0), ECHO_MAX));
        }
        out.extend_from_slice(b"', with args beginning with: ");
        let mut echoed = 0;
        let mut i = 1;
        while i < args.argc() && echoed < ECHO_MAX {
            let arg = c_str(args.arg(i), ECHO_MAX - echoed);
            out.push(b'\'');
            out.extend_from_slice(arg);
            out.extend_from_slice(b"' ");
            echoed += arg.len() + 3;
            i += 1;
        }
        CommandError::Unknown(one_line(&out))
    }

    /// "ERR unknown subcommand 'x'. Try CLIENT HELP."
    pub(super) fn unknown_subcommand<A: Args + ?Sized>(args: &A) -> Self {
        let mut out = b"ERR unknown subcommand '".to_vec();
        out.extend_from_slice(c_str(args.arg(1), ECHO_MAX));
        out.extend_from_slice(b"'. Try ");
        out.extend(
            c_str(args.arg(0), usize::MAX)
                .iter()
                .map(u8::to_ascii_uppercase),
        );
        out.extend_from_slice(b" HELP.");
        CommandError::Unknown(one_line(&out))
    }
}

/// What C's "%.*s" prints of an argument: up to the first NUL, at most `max` bytes.
fn c_str(arg: &[u8], max: usize) -> &[u8] {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    &arg[..end.min(max)]
}

/// Redis turns CR and LF into spaces so an error stays one protocol line.
fn one_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect()
}
