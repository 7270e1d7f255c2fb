//! What the drain is waiting for, counted now: requests, connections, background tasks.

use super::Drain;

/// The work a [`Drain`] counts: requests in flight, open connections, background tasks.
///
/// Returned by [`Drain::counts`]; it borrows the drain, and each method reads its count when
/// called (a request count is one atomic load). [`Drain::status`] carries the same three in
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
#[derive(Clone, Copy, Debug)]
pub struct Counts<'a> {
    drain: &'a Drain,
}

impl<'a> Counts<'a> {
    pub(super) fn new(drain: &'a Drain) -> Self {
        Self { drain }
    }

    /// Requests (guards) in flight now.
    pub fn in_flight(&self) -> usize {
        self.drain.core().counter.count()
    }

    /// Open connections on `lameduck::serve` listeners.
    pub fn connections(&self) -> usize {
        self.drain.inner.driver.progress().connections()
    }

    /// Background tasks still running.
    pub fn tasks(&self) -> usize {
        self.drain.inner.driver.tasks.len()
    }
}
