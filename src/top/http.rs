//! The admin port's HTTP client: one GET per connection, on hyper's HTTP/1 client (the
//! same hyper the admin server runs on), driven by a small current-thread runtime so that
//! `top` itself stays a plain blocking loop.

use std::sync::OnceLock;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

use super::*;

/// The runtime every GET of this process runs on (top polls from one thread).
fn runtime() -> Result<&'static tokio::runtime::Runtime, TopError> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| TopError::Http {
        at: "the HTTP client".into(),
        what: format!("cannot start: {e}"),
    })
}

/// `GET path` from `addr`: the body of a 200, or an error that says who failed. `timeout`
/// bounds the whole exchange (connect, headers, body); a body over `MAX_RESPONSE_BYTES` is
/// refused.
pub fn http_get(
    addr: &str,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<String, TopError> {
    let rt = runtime()?;
    let late = || TopError::Http {
        at: format!("{addr}{path}"),
        what: format!("no answer within {} ms", timeout.as_millis()),
    };
    rt.block_on(async {
        tokio::time::timeout(timeout, get(addr, path, token))
            .await
            .unwrap_or_else(|_| Err(late()))
    })
}

async fn get(addr: &str, path: &str, token: Option<&str>) -> Result<String, TopError> {
    let at = |e: &dyn std::fmt::Display| TopError::Http {
        at: format!("{addr}{path}"),
        what: e.to_string(),
    };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| TopError::Http {
            at: addr.to_string(),
            what: e.to_string(),
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| at(&e))?;
    // The connection is driven beside the request; it ends when the answer is read.
    let driver = tokio::spawn(conn);
    let mut req = hyper::Request::get(path);
    if let Some(t) = token {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .header(hyper::header::HOST, addr)
        .header(hyper::header::USER_AGENT, "saltshaker-top")
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| at(&e))?;
    let res = sender.send_request(req).await.map_err(|e| at(&e))?;
    let status = res.status();
    let body = Limited::new(res.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(
            |e| match e.downcast_ref::<http_body_util::LengthLimitError>() {
                Some(_) => at(&format!("answer larger than {MAX_RESPONSE_BYTES} bytes")),
                None => at(&e),
            },
        )?
        .to_bytes();
    driver.abort();
    let text = String::from_utf8_lossy(&body).into_owned();
    if status != hyper::StatusCode::OK {
        let first = text.lines().next().unwrap_or("").trim();
        return Err(at(&format!(
            "HTTP {} {}{}{first}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            if first.is_empty() { "" } else { ": " }
        )));
    }
    Ok(text)
}
