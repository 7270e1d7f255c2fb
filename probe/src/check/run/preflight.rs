//! Before the traffic: does the service serve the paths the run will send?
//!
//! One GET per kind of request the run sends (short, slow, stream), once the service is ready.
//! A route the service lacks (404, 405, 501) is a configuration error, not a lost request:
//! sent for the whole run, its answers would be filed as failures under `in_flight` and set
//! the `report` contract against a drain report that lost nothing. A path left at its default
//! (`/slow?ms={ms}`, `/stream?ms={ms}`) that the service lacks is left out of the run, with a
//! note naming the flags that give one; a path the command line names, or the short path
//! (the traffic everything else is judged by), stops the run before it starts, naming the
//! flag that fixes it.

use std::time::Duration;

use super::http::{self, Url};
use crate::config::{Kind, ProbeConfig};

/// How long the preflight's slow and stream requests take (`{ms}`).
const PREFLIGHT_MS: Duration = Duration::from_millis(10);
/// How long one preflight GET may take.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(5);

/// The statuses that say the route is not there.
fn lacks_route(status: u16) -> bool {
    matches!(status, 404 | 405 | 501)
}

/// The flag that names `kind`'s path, and the one that turns it off.
fn flags(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Short => ("--path", "--rate"),
        Kind::Slow => ("--slow-path", "--slow-rate"),
        Kind::Stream => ("--stream-path", "--stream-rate"),
    }
}

/// Whether `kind`'s path is its default (not named on the command line).
fn is_default(traffic: &ProbeConfig, kind: Kind) -> bool {
    let d = ProbeConfig::new(traffic.target.clone());
    match kind {
        Kind::Short => traffic.short_path == d.short_path,
        Kind::Slow => traffic.slow_path == d.slow_path,
        Kind::Stream => traffic.stream_path == d.stream_path,
    }
}

/// Asks the service for each path the run sends. Returns the notes for the kinds left out (their
/// rates set to 0 in `traffic`), or the error that stops the run.
pub(super) async fn paths(traffic: &mut ProbeConfig) -> Result<Vec<String>, String> {
    if traffic.host.is_some() {
        // The service routes by a Host of its own: one GET without it proves nothing.
        return Ok(Vec::new());
    }
    let mut notes = Vec::new();
    for kind in Kind::ALL {
        if traffic.rate(kind) <= 0.0 {
            continue;
        }
        let path = {
            let mut quick = traffic.clone();
            quick.slow = PREFLIGHT_MS;
            quick.stream = PREFLIGHT_MS;
            quick.path(kind)
        };
        let url = Url::parse(&format!("http://{}{path}", traffic.target))
            .map_err(|e| format!("--target {}: {e}", traffic.target))?;
        let Ok(status) = http::get(&url, &[], PREFLIGHT_TIMEOUT).await else {
            // No answer is the run's to judge (a service that stops answering).
            continue;
        };
        if !lacks_route(status) {
            continue;
        }
        let (path_flag, rate_flag) = flags(kind);
        if kind != Kind::Short && is_default(traffic, kind) {
            match kind {
                Kind::Slow => traffic.slow_rate = 0.0,
                _ => traffic.stream_rate = 0.0,
            }
            notes.push(format!(
                "{}: left out: the service answers {status} to GET {path}, so none was sent \
                 (a route it lacks is no lost request); give {path_flag} a route that takes \
                 `{{ms}}` milliseconds to answer, or {rate_flag} 0 to leave them out without \
                 this note",
                kind.as_str()
            ));
        } else {
            return Err(format!(
                "the service answers {status} to GET {path} ({} requests): it has no such \
                 route; give {path_flag} one it serves{}",
                kind.as_str(),
                if kind == Kind::Short {
                    String::new()
                } else {
                    format!(", or {rate_flag} 0 to send none")
                }
            ));
        }
    }
    Ok(notes)
}
