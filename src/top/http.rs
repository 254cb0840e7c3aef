//! A tiny blocking HTTP/1.1 GET client, enough for an admin port.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::*;

// ---- HTTP: one GET per connection, enough for an admin port on localhost. ----

/// `GET path` from `addr` with `Connection: close`: the body of a 200, or an error that says
/// who failed. `timeout` bounds the connect and the whole exchange.
pub fn http_get(addr: &str, path: &str, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let addrs = addr.to_socket_addrs().map_err(|e| format!("{addr}: {e}"))?;
    let mut last = format!("{addr}: resolves to no address");
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    let mut stream = stream.ok_or(last)?;
    let io_err = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("{addr}{path}: no answer within {} ms", timeout.as_millis())
        }
        _ => format!("{addr}{path}: {e}"),
    };
    stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: saltshaker-top\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).map_err(io_err)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        // A server that trickles bytes would reset the read timeout forever.
        if Instant::now() > deadline {
            return Err(format!(
                "{addr}{path}: no complete answer within {} ms",
                timeout.as_millis()
            ));
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(e)),
        }
        if raw.len() > MAX_RESPONSE_BYTES {
            return Err(format!(
                "{addr}{path}: answer larger than {MAX_RESPONSE_BYTES} bytes"
            ));
        }
    }
    parse_response(&raw).map_err(|e| format!("{addr}{path}: {e}"))
}

/// Splits a whole HTTP/1.x response into head and body; the body of a 200, else an error.
pub(super) fn parse_response(raw: &[u8]) -> Result<String, String> {
    if raw.is_empty() {
        return Err("connection closed without an answer".into());
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("answer ended inside its headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let mut parts = status.splitn(3, ' ');
    if !parts.next().unwrap_or("").starts_with("HTTP/1.") {
        return Err("not an HTTP/1 answer".into());
    }
    let code: u16 = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or("bad HTTP status line")?;
    let reason = parts.next().unwrap_or("").trim();
    let (mut chunked, mut length) = (false, None);
    for h in lines {
        let Some((name, value)) = h.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if name == "content-length" {
            length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
        }
    }
    let mut body = &raw[split + 4..];
    let dechunked;
    if chunked {
        dechunked = dechunk(body)?;
        body = &dechunked;
    } else if let Some(n) = length {
        body = body
            .get(..n)
            .ok_or("answer shorter than its Content-Length")?;
    }
    let text = String::from_utf8_lossy(body).into_owned();
    if code != 200 {
        let first = text.lines().next().unwrap_or("").trim();
        return Err(format!(
            "HTTP {code} {reason}{}{first}",
            if first.is_empty() { "" } else { ": " }
        ));
    }
    Ok(text)
}

pub(super) fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunked answer cut short")?;
        let size_line = String::from_utf8_lossy(&body[..eol]);
        let size_hex = size_line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| "bad chunk size")?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(body.get(..size).ok_or("chunked answer cut short")?);
        body = body.get(size + 2..).ok_or("chunked answer cut short")?;
    }
}
