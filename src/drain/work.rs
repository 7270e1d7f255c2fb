//! The handle's background work: tasks the drain waits for, and resource closers.

use std::future::Future;
use std::time::Duration;

use super::Drain;
use crate::closers::{BoxError, CloseOptions};
use crate::tasks::{Recovery, TaskContext, TaskKind};

impl Drain {
    /// Runs `fut` as a must-finish background task named `name`: the drain waits for it (up to
    /// the quiesce deadline, where it is named as a straggler and aborted).
    ///
    /// A panic in the task is caught and recorded with its name.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::Trigger;
    ///
    /// drain.spawn("flush-uploads", async {
    ///     // ... upload what is buffered ...
    /// });
    /// drain.start(Trigger::Api);
    /// let report = drain.drained().await; // waited for the task
    /// assert!(report.tasks.is_empty()); // lists only tasks that panicked or were cut
    /// # }
    /// ```
    pub fn spawn<F>(&self, name: impl Into<String>, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner
            .driver
            .tasks
            .spawn(name.into(), TaskKind::MustFinish, None, fut);
    }

    /// Runs a cancel-on-drain task: `make` gets a [`TaskContext`] whose [`stop`](TaskContext::stop)
    /// token fires when the drain starts (stop taking new work). The task is counted until it
    /// returns.
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
    ///             () = cx.stop().cancelled() => break, // stop taking new work
    ///             () = tokio::time::sleep(Duration::from_secs(1)) => { /* poll, handle */ }
    ///         }
    ///     }
    ///     // ... finish what was taken ...
    /// });
    /// drain.start(Trigger::Api);
    /// assert_eq!(drain.drained().await.exit_code, 0);
    /// # }
    /// ```
    pub fn spawn_cancellable<F, Fut>(&self, name: impl Into<String>, make: F)
    where
        F: FnOnce(TaskContext) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let fut = make(self.inner.driver.task_context());
        self.inner
            .driver
            .tasks
            .spawn(name.into(), TaskKind::CancelOnDrain, None, fut);
    }

    /// Like [`spawn_cancellable`](Self::spawn_cancellable), with a recovery action that runs if
    /// the task is still unfinished at the quiesce deadline, before it is aborted (e.g. return
    /// an unacknowledged message to its queue), bounded by `timeout`. The report records
    /// whether it ran and its result.
    pub fn spawn_with_recovery<F, Fut, R, RFut>(
        &self,
        name: impl Into<String>,
        make: F,
        timeout: Duration,
        recovery: R,
    ) where
        F: FnOnce(TaskContext) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
        R: FnOnce() -> RFut + Send + 'static,
        RFut: Future<Output = Result<(), String>> + Send + 'static,
    {
        let fut = make(self.inner.driver.task_context());
        let rec: Recovery = Box::new(move || Box::pin(recovery()));
        self.inner.driver.tasks.spawn(
            name.into(),
            TaskKind::CancelOnDrain,
            Some((timeout, rec)),
            fut,
        );
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
        self.inner
            .driver
            .closers
            .register(name.into(), CloseOptions::new(), close);
    }

    /// Like [`on_close`](Self::on_close), bounded by its own `timeout` instead of a fair share
    /// (and always by what is left of the budget). Same as
    /// `on_close_with(name, CloseOptions::new().timeout(timeout), close)`.
    pub fn on_close_with_timeout<F, Fut, E>(
        &self,
        name: impl Into<String>,
        timeout: Duration,
        close: F,
    ) where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        self.inner.driver.closers.register(
            name.into(),
            CloseOptions::new().timeout(timeout),
            close,
        );
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
    /// assert_eq!(report.closers[0].result, lameduck::ActionResult::TimedOut); // the exporter, cut to leave time
    /// assert_eq!(report.closers[1].result, lameduck::ActionResult::Ok); // the database
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
