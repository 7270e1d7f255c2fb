//! The drain's background work beyond the common case: cancel-on-drain tasks, tasks with a
//! recovery action, closers with options.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::Drain;
use crate::work::closers::{BoxError, CloseOptions};
use crate::work::tasks::{Recovery, TaskContext, TaskKind};

/// Background work on a [`Drain`] beyond [`Drain::spawn`] and [`Drain::on_close`]:
/// cancel-on-drain tasks, tasks with a recovery action, closers with [`CloseOptions`].
///
/// Returned by [`Drain::tasks`]; it borrows the drain. How many tasks still run is
/// [`Counts::tasks`](crate::Counts::tasks).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
/// #     .report_to_stderr(false).termination_log(None).build().unwrap();
/// use lameduck::Trigger;
///
/// let consumer = drain.tasks().spawn_cancellable("consumer", |cx| async move {
///     cx.drain_started().cancelled().await; // stop taking new messages
/// });
/// assert_eq!(drain.counts().tasks(), 1);
/// drain.start(Trigger::Api);
/// consumer.await.unwrap();
/// assert_eq!(drain.drained().await.exit_code, 0);
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Tasks<'a> {
    drain: &'a Drain,
}

impl<'a> Tasks<'a> {
    pub(super) fn new(drain: &'a Drain) -> Self {
        Self { drain }
    }

    /// Runs a cancel-on-drain task: `make` gets a [`TaskContext`] whose [`drain_started`](TaskContext::drain_started)
    /// token fires when the drain starts (stop taking new work). The task is counted until it
    /// returns. Returns the task's [`JoinHandle`], as [`Drain::spawn`] does.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use std::time::Duration;
    /// use lameduck::Trigger;
    ///
    /// drain.tasks().spawn_cancellable("poller", |cx| async move {
    ///     loop {
    ///         tokio::select! {
    ///             () = cx.drain_started().cancelled() => break, // stop taking new work
    ///             () = tokio::time::sleep(Duration::from_secs(1)) => { /* poll, handle */ }
    ///         }
    ///     }
    ///     // ... finish what was taken ...
    /// });
    /// drain.start(Trigger::Api);
    /// assert_eq!(drain.drained().await.exit_code, 0);
    /// # }
    /// ```
    pub fn spawn_cancellable<F, Fut>(
        &self,
        name: impl Into<String>,
        make: F,
    ) -> JoinHandle<Fut::Output>
    where
        F: FnOnce(TaskContext) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let fut = make(self.drain.inner.driver.task_context());
        self.drain
            .inner
            .driver
            .tasks
            .spawn(name.into(), TaskKind::CancelOnDrain, None, fut)
    }

    /// Like [`spawn_cancellable`](Self::spawn_cancellable), with a recovery action that runs if
    /// the task is still unfinished at the quiesce deadline, before it is aborted (e.g. return
    /// an unacknowledged message to its queue), bounded by `timeout`. The report records
    /// whether it ran and its result.
    pub fn spawn_with_recovery<F, Fut, R, RFut, E>(
        &self,
        name: impl Into<String>,
        make: F,
        timeout: Duration,
        recovery: R,
    ) -> JoinHandle<Fut::Output>
    where
        F: FnOnce(TaskContext) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
        R: FnOnce() -> RFut + Send + 'static,
        RFut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let fut = make(self.drain.inner.driver.task_context());
        let rec: Recovery = Box::new(move || {
            Box::pin(async move { recovery().await.map_err(|e| e.into().to_string()) })
        });
        self.drain.inner.driver.tasks.spawn(
            name.into(),
            TaskKind::CancelOnDrain,
            Some((timeout, rec)),
            fut,
        )
    }

    /// Like [`Drain::on_close`], with [`CloseOptions`]: a timeout of its own, or
    /// *critical* (keeps its time however long the closers before it take).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use std::time::Duration;
    /// use lameduck::report::ActionResult;
    /// use lameduck::{CloseOptions, Trigger};
    ///
    /// // Registered first, closed last: the pool gets its time even if the exporter hangs.
    /// drain.tasks().on_close_with("database", CloseOptions::new().critical(), || async {
    ///     Ok::<_, std::io::Error>(())
    /// });
    /// drain.tasks().on_close_with("exporter", CloseOptions::new().timeout(Duration::from_secs(60)), || async {
    ///     std::future::pending::<Result<(), std::io::Error>>().await // hangs
    /// });
    /// drain.start(Trigger::Api);
    /// let report = drain.drained().await;
    /// assert_eq!(report.closers[0].result, ActionResult::TimedOut); // the exporter, cut to leave time
    /// assert_eq!(report.closers[1].result, ActionResult::Ok); // the database
    /// # }
    /// ```
    pub fn on_close_with<F, Fut, E>(&self, name: impl Into<String>, options: CloseOptions, close: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.drain
            .inner
            .driver
            .closers
            .register(name.into(), options, close);
    }
}
