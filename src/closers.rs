//! Ordered resource closers: run after the work that uses the resources, in reverse
//! registration order (like `defer`), each with its own timeout, inside `close_budget`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The error type a closer may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

pub(crate) type CloseFn =
    Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> + Send>;

pub(crate) struct Closer {
    pub(crate) name: String,
    pub(crate) timeout: Option<Duration>,
    pub(crate) f: CloseFn,
}

impl std::fmt::Debug for Closer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closer")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// How one closer went, as recorded in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloserResult {
    /// The name given to [`Drain::on_close`](crate::Drain::on_close).
    pub name: String,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
    /// `ok`, `error: <message>`, `panicked`, `timed_out` or `skipped` (no budget left).
    pub result: String,
}

impl CloserResult {
    /// `true` if the closer returned `Ok`.
    pub fn is_ok(&self) -> bool {
        self.result == "ok"
    }
}

/// Runs the closers in reverse order; each gets `min(own timeout, time left before `hard`)`.
/// One failing, panicking or timing out does not stop the next.
pub(crate) async fn run_all(
    mut closers: Vec<Closer>,
    hard: Instant,
    mut on_each: impl FnMut(&CloserResult),
) -> Vec<CloserResult> {
    let mut results = Vec::with_capacity(closers.len());
    while let Some(c) = closers.pop() {
        let start = Instant::now();
        let left = hard.saturating_duration_since(start);
        let limit = c.timeout.map_or(left, |t| t.min(left));
        let result = if limit.is_zero() {
            "skipped".to_owned()
        } else {
            let handle = tokio::spawn((c.f)());
            let abort = handle.abort_handle();
            match tokio::time::timeout(limit, handle).await {
                Ok(Ok(Ok(()))) => "ok".to_owned(),
                Ok(Ok(Err(e))) => format!("error: {e}"),
                Ok(Err(e)) if e.is_panic() => "panicked".to_owned(),
                Ok(Err(_)) => "aborted".to_owned(),
                Err(_) => {
                    abort.abort();
                    "timed_out".to_owned()
                }
            }
        };
        let r = CloserResult {
            name: c.name,
            took_ms: start.elapsed().as_millis() as u64,
            result,
        };
        on_each(&r);
        results.push(r);
    }
    results
}
