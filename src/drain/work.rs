//! The handle's background work: tasks the drain waits for, and resource closers.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::Drain;
use crate::closers::{BoxError, CloseOptions};
use crate::tasks::{Recovery, TaskContext, TaskKind};

impl Drain {
    /// Runs `fut` as a must-finish background task named `name`: the drain waits for it (up to
    /// the quiesce deadline, where it is named as a straggler and aborted).
    ///
    /// A panic in the task is caught and recorded with its name.
    ///
    /// Returns Tokio's [`JoinHandle`], as `tokio::spawn` and `TaskTracker::spawn` do: awaiting
    /// it gives the task's output, or a `JoinError` when it panicked or was aborted at the
    /// quiesce deadline. Dropping the handle detaches the task; the drain still waits for it.
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
    /// let flushed = drain.spawn("flush-uploads", async {
    ///     // ... upload what is buffered ...
    ///     3 // files uploaded
    /// });
    /// drain.start(Trigger::Api);
    /// let report = drain.drained().await; // waited for the task
    /// assert!(report.tasks.is_empty()); // lists only tasks that panicked or were cut
    /// assert_eq!(flushed.await.unwrap(), 3); // the handle still has its output
    /// # }
    /// ```
    pub fn spawn<F>(&self, name: impl Into<String>, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner
            .driver
            .tasks
            .spawn(name.into(), TaskKind::MustFinish, None, fut)
    }

    /// Runs a cancel-on-drain task: `make` gets a [`TaskContext`] whose [`drain_started`](TaskContext::drain_started)
    /// token fires when the drain starts (stop taking new work). The task is counted until it
    /// returns. Returns the task's [`JoinHandle`], as [`spawn`](Self::spawn) does.
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
    /// drain.spawn_cancellable("poller", |cx| async move {
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
        let fut = make(self.inner.driver.task_context());
        self.inner
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
        let fut = make(self.inner.driver.task_context());
        let rec: Recovery = Box::new(move || {
            Box::pin(async move { recovery().await.map_err(|e| e.into().to_string()) })
        });
        self.inner.driver.tasks.spawn(
            name.into(),
            TaskKind::CancelOnDrain,
            Some((timeout, rec)),
            fut,
        )
    }

    /// Registers a resource closer. Closers run after in-flight requests and tasks reach zero
    /// (or the quiesce deadline passes), in reverse registration order, inside `close_budget`.
    /// Each gets a fair share of what is left when its turn comes (what is left before the hard
    /// deadline, divided by the closers still to run), so one slow closer cannot leave the
    /// ones after it nothing; see [`on_close_with`](Self::on_close_with) for a timeout of its
    /// own or a *critical* closer. A closer that errors, panics or times out is recorded; the
    /// next one still runs.
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
    /// drain.on_close("database", || async { /* pool.close().await */ Ok::<_, std::io::Error>(()) });
    /// drain.on_close("tracer", || async { /* flush spans */ Ok::<_, std::io::Error>(()) });
    /// drain.start(Trigger::Api);
    /// let report = drain.drained().await;
    /// let order: Vec<_> = report.closers.iter().map(|c| c.name.as_str()).collect();
    /// assert_eq!(order, ["tracer", "database"]); // reverse registration order
    /// # }
    /// ```
    pub fn on_close<F, Fut, E>(&self, name: impl Into<String>, close: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.on_close_with(name, CloseOptions::new(), close);
    }

    /// Like [`on_close`](Self::on_close), with [`CloseOptions`]: a timeout of its own, or
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
    /// drain.on_close_with("database", CloseOptions::new().critical(), || async {
    ///     Ok::<_, std::io::Error>(())
    /// });
    /// drain.on_close_with("exporter", CloseOptions::new().timeout(Duration::from_secs(60)), || async {
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
        self.inner
            .driver
            .closers
            .register(name.into(), options, close);
    }
}
