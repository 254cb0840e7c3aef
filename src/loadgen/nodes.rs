//! Backend load as the backends count it: the `calls=` of `INFO commandstats`, read from
//! each node before and after a run.

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::BenchError;
use crate::resp::{encode_command, parse_value, Value};

/// Largest INFO reply accepted: commandstats is a few KiB even with every command used.
const MAX_REPLY: usize = 4 * 1024 * 1024;

/// Commands executed on `node` so far: the sum of `calls=` over every `cmdstat_*` line.
/// Costs the node one INFO call, which the next snapshot will include.
pub(crate) async fn total_calls(node: &str) -> Result<u64, BenchError> {
    Ok(sum_calls(&info_commandstats(node).await?))
}

async fn info_commandstats(node: &str) -> Result<String, BenchError> {
    let failed = |what: &dyn std::fmt::Display| BenchError::Node {
        node: node.to_string(),
        what: format!("INFO commandstats: {what}"),
    };
    let mut stream = TcpStream::connect(node).await.map_err(|e| failed(&e))?;
    let mut out = BytesMut::new();
    encode_command(&["INFO", "commandstats"], &mut out);
    stream.write_all(&out).await.map_err(|e| failed(&e))?;
    let mut buf = Vec::with_capacity(8192);
    loop {
        match parse_value(&buf).map_err(|e| failed(&e))? {
            Some((Value::Bulk(b) | Value::Verbatim(b), _)) => {
                return Ok(String::from_utf8_lossy(&b).into_owned())
            }
            Some((Value::Error(e), _)) => return Err(failed(&String::from_utf8_lossy(&e))),
            Some((other, _)) => return Err(failed(&format!("unexpected reply {other:?}"))),
            None => {}
        }
        if buf.len() > MAX_REPLY {
            return Err(failed(&"reply too large"));
        }
        let n = stream.read_buf(&mut buf).await.map_err(|e| failed(&e))?;
        if n == 0 {
            return Err(failed(&"connection closed"));
        }
    }
}

/// Sums `calls=N` over the `cmdstat_<name>:calls=N,usec=...` lines of an INFO reply.
/// Lines that do not parse are skipped: a node's load is a measurement, not a contract.
pub(crate) fn sum_calls(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter_map(|l| {
            let (_, fields) = l.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            calls.trim().parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::sum_calls;

    #[test]
    fn calls_are_summed_over_every_command_and_subcommand() {
        let info = "# Commandstats\r\n\
            cmdstat_get:calls=100,usec=50,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_config|get:calls=2,usec=5,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_incr:calls=7,usec=3,usec_per_call=0.43,rejected_calls=1,failed_calls=2\r\n";
        assert_eq!(sum_calls(info), 109);
    }

    #[test]
    fn malformed_lines_count_nothing() {
        assert_eq!(
            sum_calls("cmdstat_get:usec=5\r\ncmdstat_set\r\nfoo:calls=3\r\n"),
            0
        );
        assert_eq!(sum_calls(""), 0);
    }
}
