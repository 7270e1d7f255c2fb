//! Named background tasks, on top of `tokio_util`'s `TaskTracker` and `CancellationToken`.
//!
//! A task start is rare, so the registry of names and start times sits behind a `Mutex`; it is
//! never touched on the request path. Each task is one Tokio task, whose `JoinHandle` goes to
//! the caller as `tokio::spawn`'s does. Inside it a wrapper catches the future's panic (records
//! it by name, then resumes it, so the handle reports it as usual), and a drop guard records an
//! abort at the quiesce deadline and holds the `TaskTracker` count until the task is gone.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

use crate::report::{ActionResult, TaskEnd, TaskResult};
use crate::vocab::sync::MutexExt;

/// How a background task is treated by the drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskKind {
    /// Counted; the drain waits for it.
    MustFinish,
    /// Its token fires at drain start (stop taking new work); counted until it returns.
    CancelOnDrain,
}

/// Given to cancellable tasks: the drain's moments, under the names of their timeline events
/// (the same names as on [`Drain`](crate::Drain)), and when to hurry.
#[derive(Clone, Debug)]
pub struct TaskContext {
    pub(crate) drain: CancellationToken,
    pub(crate) stop: CancellationToken,
    pub(crate) hurry: CancellationToken,
    pub(crate) deadline: CancellationToken,
    /// The quiesce deadline, set when the drain starts; a shorter deletion grace (feature
    /// `kube`) moves it earlier.
    pub(crate) quiesce_at: Arc<Mutex<Option<Instant>>>,
}

impl TaskContext {
    /// Fires at `drain_started`: stop taking new work.
    pub fn drain_started(&self) -> &CancellationToken {
        &self.drain
    }

    /// Fires at `stopped_accepting`: the propagation policy committed and listeners closed
    /// (end long-lived streams here, if the task serves any).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::{Phase, Trigger};
    ///
    /// let moments = drain.work().spawn_cancellable("pusher", |cx| async move {
    ///     cx.drain_started().cancelled().await; // stop taking new subscribers
    ///     cx.stopped_accepting().cancelled().await; // now end the open streams
    ///     "ended"
    /// });
    /// drain.start(Trigger::Api);
    /// assert_eq!(moments.await.unwrap(), "ended");
    /// assert!(drain.phase() >= Phase::StoppedAccepting);
    /// # }
    /// ```
    pub fn stopped_accepting(&self) -> &CancellationToken {
        &self.stop
    }

    /// Fires `hurry_lead` before the quiesce deadline: checkpoint, nack, re-enqueue now.
    pub fn hurry(&self) -> &CancellationToken {
        &self.hurry
    }

    /// Fires at `deadline_exceeded`, the quiesce deadline, just before unfinished tasks are
    /// aborted.
    pub fn deadline_exceeded(&self) -> &CancellationToken {
        &self.deadline
    }

    /// The quiesce deadline, once the drain has started.
    pub fn deadline(&self) -> Option<Instant> {
        *self.quiesce_at.locked()
    }
}

/// A recovery action: runs if the task is still unfinished at the quiesce deadline, before it is
/// aborted.
pub(crate) type Recovery =
    Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send>;

pub(crate) struct Running {
    pub(crate) name: String,
    pub(crate) kind: TaskKind,
    pub(crate) started: Instant,
    pub(crate) abort: AbortHandle,
    pub(crate) recovery: Option<(Duration, Recovery)>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("started", &self.started)
            .field("recovery", &self.recovery.is_some())
            .finish()
    }
}

/// A task still running at the quiesce deadline.
struct Unfinished {
    name: String,
    abort: AbortHandle,
    recovery: Option<(Duration, Recovery)>,
}

/// Called with a task's name when it panics (set by the coordinator when it should start the
/// drain then).
pub(crate) type OnPanic = Arc<dyn Fn(&str) + Send + Sync>;

#[derive(Default)]
pub(crate) struct TaskSet {
    pub(crate) tracker: TaskTracker,
    registry: Arc<Mutex<TaskRegistry>>,
    on_panic: std::sync::OnceLock<OnPanic>,
}

impl std::fmt::Debug for TaskSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSet")
            .field("tracker", &self.tracker)
            .field("registry", &self.registry)
            .field("on_panic", &self.on_panic.get().is_some())
            .finish()
    }
}

#[derive(Debug, Default)]
struct TaskRegistry {
    next_id: u64,
    running: BTreeMap<u64, Running>,
    /// Tasks that panicked or were aborted (completed ones are not kept).
    ended: Vec<TaskEnd>,
    /// When the last task to end ended, however it ended, and its name: the timeline's
    /// `tasks_done` says when the work ended, not only when the drain saw it done.
    last_end: Option<(Instant, String)>,
}

/// Records how a task ended when its wrapper is dropped: on completion (`outcome` `None`:
/// nothing to record), after a caught panic, or when the task is aborted and its future dropped
/// mid-way (the default, `Aborted`). Holds the tracker's count until then.
struct TaskEndGuard {
    registry: Arc<Mutex<TaskRegistry>>,
    id: u64,
    on_panic: Option<OnPanic>,
    outcome: Option<TaskResult>,
    _counted: TaskTrackerToken,
}

impl Drop for TaskEndGuard {
    fn drop(&mut self) {
        let panicked = {
            let mut reg = self.registry.locked();
            let Some(task) = reg.running.remove(&self.id) else {
                return;
            };
            let Some(result) = self.outcome else {
                reg.last_end = Some((Instant::now(), task.name));
                return;
            };
            reg.last_end = Some((Instant::now(), task.name.clone()));
            if result == TaskResult::Panicked {
                tracing::error!(task = %task.name, "lameduck: background task panicked");
            }
            let name = task.name.clone();
            reg.ended.push(TaskEnd {
                name: task.name,
                result,
                ran_ms: task.started.elapsed().as_millis() as u64,
            });
            (result == TaskResult::Panicked).then_some(name)
        };
        // Outside the registry's lock: starting the drain takes the coordinator's.
        if let (Some(name), Some(f)) = (panicked, self.on_panic.take()) {
            f(&name);
        }
    }
}

impl TaskSet {
    /// Sets what happens when a task panics (once; later calls are ignored).
    pub(crate) fn set_on_panic(&self, f: OnPanic) {
        let _ = self.on_panic.set(f);
    }

    /// Spawns `fut` as a Tokio task registered under `name`, and returns Tokio's own handle to
    /// it: awaiting it gives the task's output, or the `JoinError` of a panic or an abort, as
    /// for `tokio::spawn`.
    ///
    /// The task is one Tokio task: `fut` runs inside a wrapper that catches its panic (to
    /// record it by name, then resumes it so the handle reports it too), and whose drop guard
    /// records an abort and releases the tracker's count however the task ends.
    pub(crate) fn spawn<F>(
        &self,
        name: String,
        kind: TaskKind,
        recovery: Option<(Duration, Recovery)>,
        fut: F,
    ) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let started = Instant::now();
        // The registry's lock is held across the spawn, so the task cannot end (and look for
        // its entry) before the entry exists.
        let mut reg = self.registry.locked();
        let id = reg.next_id;
        reg.next_id += 1;
        let mut end = TaskEndGuard {
            registry: Arc::clone(&self.registry),
            id,
            on_panic: self.on_panic.get().cloned(),
            outcome: Some(TaskResult::Aborted),
            _counted: self.tracker.token(),
        };
        let handle = tokio::spawn(async move {
            let mut fut = std::pin::pin!(fut);
            let caught = std::future::poll_fn(|cx| {
                match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
                    Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
                    Ok(Poll::Pending) => Poll::Pending,
                    Err(panic) => Poll::Ready(Err(panic)),
                }
            })
            .await;
            match caught {
                Ok(out) => {
                    end.outcome = None;
                    drop(end);
                    out
                }
                Err(panic) => {
                    end.outcome = Some(TaskResult::Panicked);
                    drop(end);
                    std::panic::resume_unwind(panic)
                }
            }
        });
        reg.running.insert(
            id,
            Running {
                name,
                kind,
                started,
                abort: handle.abort_handle(),
                recovery,
            },
        );
        drop(reg);
        handle
    }

    pub(crate) fn len(&self) -> usize {
        self.tracker.len()
    }

    /// When the last task to end ended, and its name; `None` if none has ended.
    pub(crate) fn last_ended(&self) -> Option<(Instant, String)> {
        self.registry.locked().last_end.clone()
    }

    /// The `keep` tasks running longest, and how many are running.
    pub(crate) fn oldest_running(&self, keep: usize) -> (Vec<(String, TaskKind, Instant)>, usize) {
        let reg = self.registry.locked();
        let oldest = crate::vocab::sync::oldest(reg.running.values(), keep, |t| t.started);
        let named = oldest
            .into_iter()
            .map(|t| (t.name.clone(), t.kind, t.started))
            .collect();
        (named, reg.running.len())
    }

    /// Takes the recovery actions of the tasks still running, with their abort handles.
    fn take_unfinished(&self) -> Vec<Unfinished> {
        let mut reg = self.registry.locked();
        reg.running
            .values_mut()
            .map(|t| Unfinished {
                name: t.name.clone(),
                abort: t.abort.clone(),
                recovery: t.recovery.take(),
            })
            .collect()
    }

    /// Aborts every task still running, without recovery (the drain was forced).
    pub(crate) fn abort_all(&self) {
        for task in self.take_unfinished() {
            task.abort.abort();
        }
    }

    /// Runs the recovery actions of unfinished tasks (each bounded by its timeout and the hard
    /// deadline), aborts the tasks, and returns what each recovery action did, by task name.
    pub(crate) async fn recover_and_abort(&self, hard: Instant) -> Vec<(String, ActionResult)> {
        let mut recovered = Vec::new();
        for Unfinished {
            name,
            abort,
            recovery,
        } in self.take_unfinished()
        {
            if let Some((timeout, rec)) = recovery {
                let left = hard.saturating_duration_since(Instant::now());
                let result =
                    crate::work::action::bounded(tokio::spawn(rec()), timeout.min(left)).await;
                tracing::warn!(task = %name, result = %result, "lameduck: recovery action ran");
                recovered.push((name, result));
            }
            abort.abort();
        }
        // Wait for the aborted tasks' wrappers to record their end (the tracker is closed, so
        // `wait` resolves once they have); bounded, in case a task blocks its thread.
        let settle = (Instant::now() + Duration::from_millis(100)).min(hard);
        let _ = tokio::time::timeout_at(settle, self.tracker.wait()).await;
        recovered
    }

    pub(crate) fn ended(&self) -> Vec<TaskEnd> {
        let reg = self.registry.locked();
        reg.ended.clone()
    }
}
