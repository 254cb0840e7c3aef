//! Fuzzes the reply side: no panic on any input, a growing buffer frames like a whole
//! one, and any value that parses re-encodes to a whole reply in both protocols.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saltshaker::resp::{parse_value, Proto, ReplyFramer};

fuzz_target!(|data: &[u8]| {
    let Some((&step, input)) = data.split_first() else {
        return;
    };
    let whole = ReplyFramer::new(1 << 20).next_len(input);
    let mut framer = ReplyFramer::new(1 << 20);
    let step = usize::from(step % 17) + 1;
    let mut end = 0;
    let grown = loop {
        end = (end + step).min(input.len());
        let r = framer.next_len(&input[..end]);
        if !matches!(r, Ok(None)) || end == input.len() {
            break r;
        }
    };
    assert_eq!(whole, grown, "growing the buffer changed the outcome");

    if let Ok(Some((value, used))) = parse_value(input) {
        assert_eq!(
            whole,
            Ok(Some(used)),
            "framer and parser disagree on the length"
        );
        for proto in [Proto::Resp2, Proto::Resp3] {
            let bytes = value.to_bytes(proto);
            let framed = ReplyFramer::new(usize::MAX).next_len(&bytes);
            assert_eq!(
                framed,
                Ok(Some(bytes.len())),
                "re-encoding is not one reply"
            );
        }
    }
});
