//! Running a bounded piece of user code (a resource closer, a task's recovery action) and
//! saying how it ended, as a [`ActionResult`] of the report.

use std::fmt;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::report::ActionResult;

/// Awaits `handle` for at most `limit` and says how it ended. On `TimedOut` the task is left
/// running: the caller decides whether to abort it.
pub(crate) async fn bounded<E: fmt::Display>(
    handle: JoinHandle<Result<(), E>>,
    limit: Duration,
) -> ActionResult {
    match tokio::time::timeout(limit, handle).await {
        Ok(Ok(Ok(()))) => ActionResult::Ok,
        Ok(Ok(Err(e))) => ActionResult::Error(e.to_string()),
        Ok(Err(e)) if e.is_panic() => ActionResult::Panicked,
        Ok(Err(_)) => ActionResult::Aborted,
        Err(_) => ActionResult::TimedOut,
    }
}
