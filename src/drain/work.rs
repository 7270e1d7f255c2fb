//! The common background work on the handle: a must-finish task, a resource closer. The
//! rest is on [`Tasks`](crate::Tasks).

use std::future::Future;

use tokio::task::JoinHandle;

use super::Drain;
use crate::work::closers::{BoxError, CloseOptions};
use crate::work::tasks::TaskKind;

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

    /// Registers a resource closer. Closers run after in-flight requests and tasks reach zero
    /// (or the quiesce deadline passes), in reverse registration order, inside `close_budget`.
    /// Each gets a fair share of what is left when its turn comes (what is left before the hard
    /// deadline, divided by the closers still to run), so one slow closer cannot leave the
    /// ones after it nothing; see [`Tasks::on_close_with`](crate::Tasks::on_close_with) for a
    /// timeout of its own or a *critical* closer. A closer that errors, panics or times out is
    /// recorded; the next one still runs.
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
        self.tasks().on_close_with(name, CloseOptions::new(), close);
    }
}
