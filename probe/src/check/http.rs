//! One GET on a fresh HTTP/1.1 connection, for readiness, liveness and `preStop` `httpGet`:
//! kubelet opens a new connection for every probe too.
//!
//! Bounded in time (the caller's timeout) and in bytes: at most [`MAX_BODY`] of the body is
//! read, then the connection is dropped (kubelet reads at most 10 KiB of a probe's body too),
//! so an endless or huge body costs neither memory nor the run.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Body as _;
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, HOST, USER_AGENT};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The most of a body read before the answer counts as complete.
const MAX_BODY: u64 = 64 * 1024;

/// A URL `check` may call: `http://host:port/path?query`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    authority: String,
    path: String,
}

impl Url {
    /// Parses `http://host:port/path`; `https` and missing ports are refused with a hint.
    pub(crate) fn parse(text: &str) -> Result<Url, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "{text:?}: only http:// URLs are supported (probes speak plain HTTP to the Pod)"
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{text:?} has no host"))?;
        if authority.port_u16().is_none() {
            return Err(format!(
                "{text:?} has no port; write it like http://127.0.0.1:9901/readyz"
            ));
        }
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        Ok(Url {
            authority: authority.as_str().to_owned(),
            path,
        })
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

/// `GET url` with `headers`, on a new connection, read to the end within `timeout`.
/// `Ok(status)` for any answer; `Err` says why there was none.
pub(crate) async fn get(
    url: &Url,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<u16, String> {
    match tokio::time::timeout(timeout, get_inner(url, headers)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

async fn get_inner(url: &Url, headers: &[(String, String)]) -> Result<u16, String> {
    let stream = TcpStream::connect(&url.authority)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    // Ends when the response is read and the connection closes, or with this function's future.
    let driver = tokio::spawn(conn);
    let mut builder = Request::get(url.path.as_str())
        .header(HOST, url.authority.as_str())
        .header(
            USER_AGENT,
            concat!("lameduck-probe/", env!("CARGO_PKG_VERSION"), " check"),
        )
        .header(CONNECTION, "close");
    for (name, value) in headers {
        let name =
            HeaderName::try_from(name.as_str()).map_err(|e| format!("header {name}: {e}"))?;
        let value =
            HeaderValue::try_from(value.as_str()).map_err(|e| format!("header {name}: {e}"))?;
        // A header given twice replaces (User-Agent, as a mesh would rewrite it).
        builder
            .headers_mut()
            .expect("the request was built from valid parts")
            .insert(name, value);
    }
    let request = builder
        .body(Empty::new())
        .map_err(|e| format!("request: {e}"))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| crate::conn::error_text(&e))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut read = 0u64;
        while read < MAX_BODY && !body.is_end_stream() {
            match body.frame().await {
                Some(Ok(frame)) => {
                    read += frame.data_ref().map_or(0, |d| d.len() as u64);
                }
                Some(Err(e)) => {
                    return Err(format!("body: {}", crate::conn::error_text(&e)));
                }
                None => break,
            }
        }
        Ok(status)
    }
    .await;
    driver.abort();
    result
}
