//! Ordered resource closers: run after the work that uses the resources, in reverse
//! registration order (like `defer`), each with its own timeout, inside `close_budget`.
//!
//! # Invariants
//!
//! * Every closer runs or is recorded as `skipped`; one failing, panicking or timing out never
//!   stops the next. A forced exit runs none after the force (the one running is `aborted`),
//!   and records each of them `skipped`.
//! * A closer without a timeout of its own gets a *fair share* of what is left before the hard
//!   deadline: `left / closers still to run`. So a slow closer cannot take the time of the ones
//!   after it — and the one registered first, usually the database pool, runs last and still
//!   gets its share.
//! * A closer with its own timeout may take more than its share, but never the time reserved
//!   for the *critical* closers after it (each reserves its fair share as of that moment).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::report::{ActionResult, CloserResult};
use crate::vocab::sync::MutexExt;

/// The error type a closer may return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

pub(crate) type CloseFn =
    Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> + Send>;

struct Closer {
    name: String,
    options: CloseOptions,
    f: CloseFn,
}

/// The closers registered so far, in registration order, behind their own lock (taken when a
/// closer is registered and once when the drain takes them to run).
#[derive(Debug, Default)]
pub(crate) struct Closers {
    registered: Mutex<Vec<Closer>>,
}

impl Closers {
    pub(crate) fn register<F, Fut, E>(&self, name: String, options: CloseOptions, close: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let f: CloseFn =
            Box::new(move || Box::pin(async move { close().await.map_err(Into::into) }));
        self.lock().push(Closer { name, options, f });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Closer>> {
        // A push is the only write: a panic elsewhere leaves the list whole.
        self.registered.locked()
    }

    /// Runs every registered closer (see [`run_all`]) until `force` is cancelled: from then on
    /// the one running is aborted and the rest are recorded `skipped`, so a forced exit's report
    /// still names every closer it did not run.
    pub(crate) async fn run(
        &self,
        hard: Instant,
        force: &CancellationToken,
        on_each: impl FnMut(&CloserResult),
    ) -> Vec<CloserResult> {
        let closers = std::mem::take(&mut *self.lock());
        run_all(closers, hard, force, on_each).await
    }

    /// The closers not run yet, in the order they would run, each recorded `skipped`: for a
    /// report written without the driver (a starved runtime). Takes them, so none runs after.
    pub(crate) fn skipped_by_force(&self) -> Vec<CloserResult> {
        let closers = std::mem::take(&mut *self.lock());
        closers
            .into_iter()
            .rev()
            .map(|c| CloserResult {
                name: c.name,
                took_ms: 0,
                result: ActionResult::Skipped,
            })
            .collect()
    }
}

/// How a resource closer is bounded: [`Work::on_close_with`](crate::Work::on_close_with).
///
/// By default a closer gets a fair share of what is left of the close budget when its turn
/// comes (what is left before the hard deadline, divided by the closers still to run). A
/// [`timeout`](Self::timeout) replaces the share (it may be longer, and is still cut at the
/// hard deadline); [`critical`](Self::critical) keeps time for the closer however long the
/// ones before it take.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::CloseOptions;
///
/// // The pool must be closed whatever happens before it; the exporter may take 3 s.
/// let pool = CloseOptions::new().critical();
/// let exporter = CloseOptions::new().timeout(Duration::from_secs(3));
/// # let _ = (pool, exporter);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "options do nothing until passed to `Work::on_close_with`"]
pub struct CloseOptions {
    timeout: Option<Duration>,
    critical: bool,
}

impl CloseOptions {
    /// A fair share of the close budget, not critical.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bounds the closer by `timeout` instead of its fair share (and always by the hard
    /// deadline, and by the time reserved for critical closers after it).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Reserves this closer's fair share while the closers before it run: however long they
    /// are allowed to take, this one still gets its time.
    pub fn critical(mut self) -> Self {
        self.critical = true;
        self
    }
}

impl std::fmt::Debug for Closer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closer")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish()
    }
}

/// Runs the closers in reverse order, each bounded as the module docs say. One failing,
/// panicking or timing out does not stop the next.
async fn run_all(
    mut closers: Vec<Closer>,
    hard: Instant,
    force: &CancellationToken,
    mut on_each: impl FnMut(&CloserResult),
) -> Vec<CloserResult> {
    let mut results = Vec::with_capacity(closers.len());
    while let Some(c) = closers.pop() {
        let start = Instant::now();
        let left = hard.saturating_duration_since(start);
        let limit = limit_for(&c.options, &closers, left);
        let result = if limit.is_zero() || force.is_cancelled() {
            ActionResult::Skipped
        } else {
            let handle = tokio::spawn((c.f)());
            let abort = handle.abort_handle();
            let result = tokio::select! {
                r = crate::work::action::bounded(handle, limit) => r,
                // Exit now: the closer is cut like one past its time.
                () = force.cancelled() => ActionResult::Aborted,
            };
            if matches!(result, ActionResult::TimedOut | ActionResult::Aborted) {
                // A closer past its time must not keep the resource busy while the next closes.
                abort.abort();
            }
            result
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

/// The time the next closer may take, given what is `left` and the closers still `after` it
/// (in registration order: they run from the end).
fn limit_for(options: &CloseOptions, after: &[Closer], left: Duration) -> Duration {
    let to_run = after.len() as u32 + 1;
    let share = left / to_run;
    match options.timeout {
        None => share,
        Some(t) => {
            // Critical closers after this one keep their fair share as of now.
            let reserved = share * after.iter().filter(|c| c.options.critical).count() as u32;
            let usable = left.saturating_sub(reserved);
            // A critical closer's own timeout never shrinks it below its share.
            if options.critical {
                t.min(left).max(share.min(t))
            } else {
                t.min(usable)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closer(options: CloseOptions) -> Closer {
        Closer {
            name: String::new(),
            options,
            f: Box::new(|| Box::pin(async { Ok(()) })),
        }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn without_a_timeout_each_gets_a_fair_share() {
        let after = [closer(CloseOptions::new()), closer(CloseOptions::new())];
        assert_eq!(limit_for(&CloseOptions::new(), &after, 3 * S), S);
        assert_eq!(limit_for(&CloseOptions::new(), &[], 3 * S), 3 * S);
    }

    #[test]
    fn an_own_timeout_may_exceed_the_share_but_not_the_critical_reserve() {
        let long = CloseOptions::new().timeout(10 * S);
        let plain = [closer(CloseOptions::new())];
        assert_eq!(limit_for(&long, &plain, 4 * S), 4 * S);
        let critical = [closer(CloseOptions::new().critical())];
        assert_eq!(limit_for(&long, &critical, 4 * S), 2 * S);
        let short = CloseOptions::new().timeout(S / 2);
        assert_eq!(limit_for(&short, &critical, 4 * S), S / 2);
    }

    #[test]
    fn a_critical_closer_keeps_at_least_its_share() {
        let tight = CloseOptions::new().critical().timeout(S / 10);
        assert_eq!(limit_for(&tight, &[], 4 * S), S / 10);
        let crit = CloseOptions::new().critical();
        assert_eq!(
            limit_for(&crit, &[closer(CloseOptions::new())], 4 * S),
            2 * S
        );
    }
}
