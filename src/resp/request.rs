//! One client request: its arguments as ranges into a shared buffer, and the bytes to
//! forward. Parsing lives in `parser` (multibulk) and `inline`.

use std::fmt;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use super::encode::{encode_array_header, encode_bulk};

/// Argument ranges (start, end) into [`Request::wire`]. Four fit inline: most commands
/// have one to four arguments.
pub(crate) type ArgRanges = SmallVec<[(usize, usize); 4]>;

/// One request. `data` is the frame exactly as the client sent it (a zero-copy slice of the
/// read buffer shared by every request of the same parse call), or, for an inline command,
/// the equivalent multibulk encoded afresh; arguments are ranges into it.
#[derive(Clone)]
pub struct Request {
    pub(crate) data: Bytes,
    pub(crate) args: ArgRanges,
    pub(crate) inline: bool,
}

impl Request {
    /// Number of arguments, command name included (always at least 1).
    pub fn argc(&self) -> usize {
        self.args.len()
    }

    /// Argument `i` (0 is the command name). Panics if `i >= argc()`, like slice indexing.
    pub fn arg(&self, i: usize) -> &[u8] {
        let (s, e) = self.args[i];
        &self.data[s..e]
    }

    /// Argument `i` as a zero-copy slice of the shared buffer. Panics if `i >= argc()`.
    pub fn arg_bytes(&self, i: usize) -> Bytes {
        let (s, e) = self.args[i];
        self.data.slice(s..e)
    }

    /// Iterates over the arguments, command name first.
    pub fn args(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.args.iter().map(move |&(s, e)| &self.data[s..e])
    }

    /// The bytes to forward to a backend: the original frame for RESP input, a freshly
    /// encoded multibulk for inline input. Cheap: a reference-count increment.
    pub fn wire(&self) -> Bytes {
        self.data.clone()
    }

    /// Length of [`Request::wire`] in bytes.
    pub fn wire_len(&self) -> usize {
        self.data.len()
    }

    /// Builds a request from arguments by encoding them as a multibulk.
    pub fn from_args<A: AsRef<[u8]>>(args: &[A]) -> Request {
        Self::encode(args.iter().map(|a| a.as_ref()), args.len(), false)
    }

    /// True if the client sent this as an inline command (`PING\r\n`) rather than RESP.
    pub fn is_inline(&self) -> bool {
        self.inline
    }

    /// Encodes `args` (of which there are `n`) and records where each landed.
    pub(crate) fn encode<'a>(
        args: impl Iterator<Item = &'a [u8]> + Clone,
        n: usize,
        inline: bool,
    ) -> Request {
        let size: usize = args.clone().map(|a| a.len() + 16).sum::<usize>() + 16;
        let mut out = BytesMut::with_capacity(size);
        let mut ranges = ArgRanges::with_capacity(n);
        encode_array_header(n, &mut out);
        for a in args {
            // The payload ends 2 bytes before the end (its CRLF) and starts len bytes earlier.
            encode_bulk(a, &mut out);
            let end = out.len() - 2;
            ranges.push((end - a.len(), end));
        }
        Request {
            data: out.freeze(),
            args: ranges,
            inline,
        }
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for a in self.args() {
            list.entry(&String::from_utf8_lossy(a));
        }
        list.finish()?;
        if self.inline {
            f.write_str(" (inline)")?;
        }
        Ok(())
    }
}

impl PartialEq for Request {
    /// Two requests are equal when they carry the same arguments, however they were sent.
    fn eq(&self, other: &Self) -> bool {
        self.argc() == other.argc() && self.args().eq(other.args())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_args_encodes_and_indexes_every_argument() {
        let r = Request::from_args(&["SET", "key:1", ""]);
        assert_eq!(r.argc(), 3);
        assert_eq!(r.arg(0), b"SET");
        assert_eq!(r.arg(1), b"key:1");
        assert_eq!(r.arg(2), b"");
        assert_eq!(&r.arg_bytes(1)[..], b"key:1");
        assert_eq!(
            &r.wire()[..],
            b"*3\r\n$3\r\nSET\r\n$5\r\nkey:1\r\n$0\r\n\r\n"
        );
        assert_eq!(r.wire_len(), r.wire().len());
        assert!(!r.is_inline());
        assert_eq!(format!("{r:?}"), r#"["SET", "key:1", ""]"#);
    }

    #[test]
    fn arg_bytes_shares_the_wire_buffer() {
        let r = Request::from_args(&["GET", "k"]);
        let wire = r.wire();
        let key = r.arg_bytes(1);
        let off = key.as_ptr() as usize - wire.as_ptr() as usize;
        assert_eq!(&wire[off..off + 1], b"k");
    }

    #[test]
    #[should_panic]
    fn arg_out_of_range_panics_like_slice_indexing() {
        let r = Request::from_args(&["PING"]);
        let _ = r.arg(1);
    }
}
