//! What the drain is waiting for, counted now: requests, connections, background tasks.

use std::sync::Arc;

use crate::lifecycle::Driver;

/// The work a [`Drain`](crate::Drain) counts: requests in flight, open connections, background tasks.
///
/// Returned by [`Drain::counts`](crate::Drain::counts): a cheap clone, `'static`, that owns
/// what it counts. Each method reads its count when
/// called (a request count is one atomic load). [`Drain::status`](crate::Drain::status) carries the same three in
/// one snapshot, with the rest of `/status`.
///
/// # Examples
///
/// ```
/// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
/// #     .report_to_stderr(false).termination_log(None).build().unwrap();
/// let guard = drain.enter();
/// assert_eq!(drain.counts().in_flight(), 1);
/// drop(guard);
/// assert_eq!(drain.counts().in_flight(), 0);
/// assert_eq!(drain.counts().connections(), 0); // none on `lameduck::serve` listeners
/// assert_eq!(drain.counts().tasks(), 0);
/// ```
#[derive(Clone, Debug)]
pub struct Counts {
    driver: Arc<Driver>,
}

impl Counts {
    pub(super) fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }

    /// Requests (guards) in flight now.
    pub fn in_flight(&self) -> usize {
        self.driver.core.counter.count()
    }

    /// Open connections on `lameduck::serve` listeners.
    pub fn connections(&self) -> usize {
        self.driver.progress().connections()
    }

    /// Background tasks still running.
    pub fn tasks(&self) -> usize {
        self.driver.work.running()
    }
}
