//! One request's life: get a connection, send, read the response to its end.

use std::error::Error as StdError;

use http_body_util::{BodyExt, Empty};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, USER_AGENT};
use hyper::Request;

use crate::config::{HttpVersion, Kind};
use crate::conn::{error_text, Connections, ReqBody};
use crate::record::Failure;

/// The response header naming the instance that served the request.
pub const INSTANCE_HEADER: &str = "x-instance";
/// The response header carrying the serving instance's drain phase.
pub const PHASE_HEADER: &str = "x-lameduck-phase";
/// The request header carrying the request's unique id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The request header carrying the traffic-path label.
pub const TRAFFIC_PATH_HEADER: &str = "x-traffic-path";

/// How often one request may be moved to another connection before anything was sent.
const MAX_REROUTES: u32 = 3;
/// Longest header value kept in a record; the rest is cut, so a misbehaving server cannot
/// grow the probe's memory.
const MAX_HEADER_CHARS: usize = 200;

/// What one request needs to know.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) id: &'a str,
    pub(crate) kind: Kind,
    pub(crate) path: &'a str,
    pub(crate) host: &'a str,
    pub(crate) label: &'a str,
    pub(crate) http: HttpVersion,
    pub(crate) keepalive: bool,
}

/// What is known so far; kept outside the request future so an unfinished request still
/// reports its connection, status and instance.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) conn: Option<u64>,
    pub(crate) reused: bool,
    pub(crate) status: Option<u16>,
    pub(crate) instance: Option<String>,
    pub(crate) phase: Option<String>,
    pub(crate) bytes: u64,
    pub(crate) rerouted: u32,
    /// The response said `Connection: close`.
    pub(crate) told_close: bool,
}

/// Runs one request to its end. `Err` says where it failed and why.
pub(crate) async fn exchange(
    conns: &Connections,
    plan: &Plan<'_>,
    seen: &mut Seen,
) -> Result<(), (Failure, String)> {
    loop {
        let mut lease = conns
            .lease(plan.keepalive)
            .await
            .map_err(|e| (Failure::Connect, e))?;
        seen.conn = Some(lease.id);
        seen.reused = lease.reused;
        let response = match lease.send(build(plan)).await {
            Ok(response) => response,
            Err(mut e) => {
                let unsent = e.take_message().is_some() || refused_unprocessed(e.error());
                if unsent && seen.rerouted < MAX_REROUTES {
                    seen.rerouted += 1;
                    if plan.http == HttpVersion::Http2 && lease.keepalive {
                        conns.retire(lease.id).await;
                    }
                    continue;
                }
                return Err((Failure::Request, error_text(e.error())));
            }
        };

        let status = response.status();
        seen.status = Some(status.as_u16());
        seen.instance = header_text(response.headers(), INSTANCE_HEADER);
        seen.phase = header_text(response.headers(), PHASE_HEADER);
        let server_keeps_it = !says_close(response.headers());
        seen.told_close = !server_keeps_it;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        seen.bytes += data.len() as u64;
                    }
                }
                Err(e) => return Err((Failure::Body, format!("body: {}", error_text(&e)))),
            }
        }
        conns.release(lease, server_keeps_it);
        if !status.is_success() {
            return Err((Failure::Status, format!("status {status}")));
        }
        return Ok(());
    }
}

fn build(plan: &Plan<'_>) -> Request<ReqBody> {
    let builder = match plan.http {
        // HTTP/1.1 wants origin form plus a Host header.
        HttpVersion::Http1 => Request::get(plan.path).header(HOST, plan.host),
        // HTTP/2 takes :scheme and :authority from an absolute URI.
        HttpVersion::Http2 => Request::get(format!("http://{}{}", plan.host, plan.path)),
    };
    let mut builder = builder
        .header(
            USER_AGENT,
            concat!("lameduck-probe/", env!("CARGO_PKG_VERSION")),
        )
        .header(REQUEST_ID_HEADER, plan.id)
        .header(TRAFFIC_PATH_HEADER, plan.label)
        .header("x-probe-kind", plan.kind.as_str());
    if plan.http == HttpVersion::Http1 && !plan.keepalive {
        // A one-shot connection says so, so the server does not keep it idle for nothing.
        builder = builder.header(CONNECTION, HeaderValue::from_static("close"));
    }
    builder
        .body(Empty::new())
        .expect("host, path and label were validated with the config")
}

/// `true` when an error means the server never processed the request: an HTTP/2 stream
/// refused by a graceful GOAWAY (it was above the last stream id, or opened after the GOAWAY
/// arrived) or reset with `REFUSED_STREAM`. RFC 9113 §8.7 makes such requests safe to send
/// again; the response headers had not arrived, or `send` would have succeeded.
fn refused_unprocessed(error: &hyper::Error) -> bool {
    let mut source: Option<&(dyn StdError + 'static)> = error.source();
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_remote()
                && ((h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR))
                    || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM)));
        }
        source = e.source();
    }
    false
}

fn header_text(headers: &HeaderMap, name: &'static str) -> Option<String> {
    let value = headers.get(HeaderName::from_static(name))?;
    let text = String::from_utf8_lossy(value.as_bytes());
    Some(text.chars().take(MAX_HEADER_CHARS).collect())
}

fn says_close(headers: &HeaderMap) -> bool {
    headers.get_all(CONNECTION).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    })
}
