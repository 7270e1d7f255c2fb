//! The work a drain waits for and ends, as one handle: [`Work`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::closers::{BoxError, CloseOptions, Closers};
use super::tasks::{Recovery, TaskContext, TaskKind, TaskSet};

/// The drain's background work: named tasks it waits for, and the resource closers it runs
/// after them. Returned by [`Drain::work`](crate::Drain::work).
///
/// It owns that state: a cheap clone (one reference count), `'static`, so a component can keep
/// its own `Work` and register tasks and closers without holding the [`Drain`](crate::Drain).
/// Every clone is the same work: the drain waits for tasks spawned on any of them.
///
/// - [`spawn`](Self::spawn): a must-finish task; the drain waits for it.
/// - [`spawn_cancellable`](Self::spawn_cancellable): told when the drain starts; the drain
///   waits for it to return.
/// - [`spawn_with_recovery`](Self::spawn_with_recovery): cancellable, with a bounded action
///   run if it is cut at the quiesce deadline.
/// - [`on_close`](Self::on_close), [`on_close_with`](Self::on_close_with): resource closers,
///   run in reverse registration order once the work is done.
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
/// let work = drain.work(); // owned: move it where the tasks are made
/// let consumer = work.spawn_cancellable("consumer", |cx| async move {
///     cx.drain_started().cancelled().await; // stop taking new messages
/// });
/// work.on_close("queue", || async { Ok::<_, std::io::Error>(()) });
/// assert_eq!(work.running(), 1);
/// drain.start(Trigger::Api);
/// consumer.await.unwrap();
/// assert_eq!(drain.drained().await.exit_code, 0);
/// # }
/// ```
#[derive(Clone)]
pub struct Work {
    parts: Arc<Parts>,
}

struct Parts {
    tasks: TaskSet,
    closers: Closers,
    /// The drain's tokens and quiesce deadline, handed to each cancellable task.
    context: TaskContext,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("running", &self.running())
            .finish_non_exhaustive()
    }
}

impl Work {
    /// The work of a drain whose cancellable tasks get `context`.
    pub(crate) fn new(context: TaskContext) -> Self {
        Self {
            parts: Arc::new(Parts {
                tasks: TaskSet::default(),
                closers: Closers::default(),
                context,
            }),
        }
    }

    /// The tasks, for the lifecycle's waits and its report.
    pub(crate) fn tasks(&self) -> &TaskSet {
        &self.parts.tasks
    }

    /// The closers, for the lifecycle's closing step.
    pub(crate) fn closers(&self) -> &Closers {
        &self.parts.closers
    }

    /// How many background tasks are running now.
    pub fn running(&self) -> usize {
        self.parts.tasks.len()
    }

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
    /// let flushed = drain.work().spawn("flush-uploads", async {
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
        self.parts
            .tasks
            .spawn(name.into(), TaskKind::MustFinish, None, fut)
    }

    /// Registers a resource closer. Closers run after in-flight requests and tasks reach zero
    /// (or the quiesce deadline passes), in reverse registration order, inside `close_budget`.
    /// Each gets a fair share of what is left when its turn comes (what is left before the hard
    /// deadline, divided by the closers still to run), so one slow closer cannot leave the
    /// ones after it nothing; see [`on_close_with`](Self::on_close_with) for a
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
    /// drain.work().on_close("database", || async { /* pool.close().await */ Ok::<_, std::io::Error>(()) });
    /// drain.work().on_close("tracer", || async { /* flush spans */ Ok::<_, std::io::Error>(()) });
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
    /// drain.work().spawn_cancellable("poller", |cx| async move {
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
        let fut = make(self.parts.context.clone());
        self.parts
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
        let fut = make(self.parts.context.clone());
        let rec: Recovery = Box::new(move || {
            Box::pin(async move { recovery().await.map_err(|e| e.into().to_string()) })
        });
        self.parts.tasks.spawn(
            name.into(),
            TaskKind::CancelOnDrain,
            Some((timeout, rec)),
            fut,
        )
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
    /// drain.work().on_close_with("database", CloseOptions::new().critical(), || async {
    ///     Ok::<_, std::io::Error>(())
    /// });
    /// drain.work().on_close_with("exporter", CloseOptions::new().timeout(Duration::from_secs(60)), || async {
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
        self.parts.closers.register(name.into(), options, close);
    }
}
