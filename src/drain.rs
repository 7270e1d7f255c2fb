//! The public face: [`Drain`], a thin handle that puts the parts together, and its builder.
//!
//! # Invariants
//!
//! * `Drain` is a cheap handle over `Arc<Inner>`: the readiness part, the driver (the
//!   lifecycle: phases, deadlines, the exit holds), the work (tasks and closers, shared with
//!   the driver) and the signal settings. Each part owns its state and its lock; the handle
//!   holds no state of its own, and the handles it returns are clones of the parts.
//! * The hot-path counter lives in a leaked [`Core`] so that request guards need no reference
//!   count (see `guard.rs`); add-ons reach it through [`Drain::core`] only.
//! * The add-ons are handed the parts they write to when built, each a seam of its own —
//!   [`AdminSeam`] (admin router and server), [`ServeSeam`] (`serve`'s accept loop),
//!   [`WatchSeam`] (the Kubernetes watch) — not crate-private methods on the handle.
//!   `.ci/handle-surface.py` fails on any such method but `core`.
//! * Dependencies point down: this module uses the parts, no part uses it.

use std::sync::Arc;

use tokio::time::Instant;

use crate::drain::signal::{Receipt, Signals};
use crate::hot::guard::{Core, InFlightGuard};
use crate::lifecycle::{Driver, Status};
use crate::readiness::{Caller, ReadinessState};
use crate::report::DrainReport;
use crate::vocab::phase::{unix_ms_now, Phase, Trigger};
use crate::work::Work;

#[cfg(feature = "admin")]
mod admin;
mod builder;
mod counts;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "kube")]
mod kube;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
mod moments;
mod ready;
pub(crate) mod signal;

pub use builder::{DrainBuilder, PROXY_LABEL_ENV};
pub use counts::Counts;
pub use moments::Moments;
pub use ready::{Readiness, StartupGate};

#[cfg(feature = "admin")]
pub(crate) use admin::AdminSeam;
#[cfg(feature = "http")]
pub(crate) use http::ServeSeam;
#[cfg(feature = "kube")]
pub(crate) use kube::WatchSeam;

pub(crate) struct Inner {
    readiness: Arc<ReadinessState>,
    driver: Arc<Driver>,
    work: Work,
    signals: Signals,
}

/// The drain coordinator: a cheap-to-clone handle shared by the server, the admin endpoint,
/// background tasks and `main`.
///
/// It holds the lifecycle [`Phase`], counts in-flight work ([`enter`](Self::enter), the HTTP
/// layer), tracks named background tasks ([`work`](Self::work)), and on the first trigger
/// drives the drain: readiness flip, propagation window, stop accepting, wait for zero or the
/// quiesce deadline, close resources in reverse order, emit the [`DrainReport`].
///
/// `Drain` keeps the lifecycle: build, trigger ([`start`](Self::start), [`force`](Self::force),
/// signals), wait ([`drained`](Self::drained), [`run`](Self::run)) and report, plus the hot
/// path's [`enter`](Self::enter) and the HTTP layer (`layer`, feature `http`). The rest are parts,
/// each an owned handle (a cheap clone, `'static`, to keep where it is used):
/// [`readiness`](Self::readiness) (startup gates, checks, what `/readyz` answers),
/// [`work`](Self::work) (background tasks and resource closers),
/// [`moments`](Self::moments) (the three tokens, the deadlines, the budget, the timeline, phase
/// changes) and [`counts`](Self::counts) (requests, connections, tasks). The add-ons are built
/// from a `&Drain`: `AdminBuilder::new` (feature `admin`), `StreamStop::new` (`http`),
/// `Metrics::new` (`metrics`), `grpc::health` (`grpc`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::{Drain, Phase, Propagation, Signals, Trigger};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), lameduck::ConfigError> {
/// let drain = Drain::builder()
///     .grace_period(Duration::from_secs(30))
///     .propagation(Propagation::fixed(Duration::from_secs(1)))
///     .signals(Signals::none())
///     .report_to_stderr(false)
///     .build()?;
///
/// let gate = drain.readiness().startup_gate("cache-warmup");
/// assert!(!drain.readiness().is_ready());
/// gate.open();
/// assert!(drain.readiness().is_ready());
///
/// let guard = drain.enter(); // one request in flight
/// assert!(drain.start(Trigger::Api));
/// assert!(!drain.start(Trigger::Api)); // idempotent
/// drop(guard);
///
/// let report = drain.drained().await;
/// assert_eq!(report.exit_code, 0);
/// assert_eq!(drain.phase(), Phase::Done);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Drain {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("phase", &self.phase())
            .field("in_flight", &self.counts().in_flight())
            .field("budget", &self.inner.driver.deadlines().budget())
            .finish_non_exhaustive()
    }
}

impl Drain {
    /// The hot-path block, for the add-ons (HTTP layer, `serve`, metrics) that count on it.
    /// The one seam through which they reach the coordinator's counters.
    #[inline]
    pub(crate) fn core(&self) -> &'static Core {
        self.inner.driver.core
    }
}

impl Drain {
    /// A builder with every default.
    pub fn builder() -> DrainBuilder {
        DrainBuilder::default()
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.inner.driver.progress().phase()
    }

    /// The drain's moments: the tokens of `drain_started`, `stopped_accepting` and
    /// `deadline_exceeded`, the deadlines, the budget, the timeline so far, phase changes.
    pub fn moments(&self) -> Moments {
        Moments::new(Arc::clone(&self.inner.driver))
    }

    /// Readiness: startup gates, readiness checks, what `/readyz` answers, the policy.
    pub fn readiness(&self) -> Readiness {
        Readiness::new(
            Arc::clone(&self.inner.readiness),
            Arc::clone(&self.inner.driver),
        )
    }

    /// Counts one unit of in-flight work until the returned guard is dropped.
    ///
    /// This is what the HTTP layer does per request; use it directly for work the layer does
    /// not see (a message handler, a raw TCP exchange). One atomic operation, no allocation.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::Trigger;
    ///
    /// let guard = drain.enter(); // e.g. one message taken from a raw TCP protocol
    /// assert_eq!(drain.counts().in_flight(), 1);
    /// drain.start(Trigger::Api);
    /// // ... finish the work; the drain cannot reach zero before ...
    /// drop(guard);
    /// let report = drain.drained().await;
    /// assert_eq!(report.exit_code, 0);
    /// # }
    /// ```
    #[inline]
    pub fn enter(&self) -> InFlightGuard {
        let (guard, draining) = self.inner.driver.plain.enter();
        if draining {
            self.core().observed().record_activity();
        }
        guard
    }

    /// What the drain counts: requests in flight, open connections, background tasks.
    pub fn counts(&self) -> Counts {
        Counts::new(Arc::clone(&self.inner.driver))
    }

    /// The background work: named tasks the drain waits for (must-finish, cancellable, with a
    /// recovery action) and the resource closers it runs after them, in reverse order. An owned
    /// handle: keep a clone where the work is made.
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
    /// drain.work().spawn("flush", async { /* upload what is buffered */ });
    /// drain.work().on_close("database", || async { Ok::<_, std::io::Error>(()) });
    /// drain.start(Trigger::Api);
    /// assert_eq!(drain.drained().await.closers[0].name, "database");
    /// # }
    /// ```
    pub fn work(&self) -> Work {
        self.inner.work.clone()
    }

    /// Starts the drain. Returns `true` only for the call that started it; later calls are
    /// recorded as `signal_received` and change nothing.
    ///
    /// # Panics
    ///
    /// If called outside a Tokio runtime for the first time (the drain's driver is spawned).
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::{Phase, Trigger};
    ///
    /// assert!(drain.start(Trigger::Api)); // started it
    /// assert!(!drain.start(Trigger::Sigterm)); // recorded as `signal_received`, changes nothing
    /// assert_eq!(drain.phase(), Phase::Draining);
    /// assert!(!drain.readiness().is_ready());
    /// # }
    /// ```
    pub fn start(&self, trigger: Trigger) -> bool {
        self.inner
            .driver
            .start(trigger, Instant::now(), unix_ms_now(), false)
    }

    /// Exit now: skip the remaining waits and the closers, report `forced`. Starts the drain if
    /// it had not started. Returns `true` if this call forced it.
    pub fn force(&self) -> bool {
        self.inner.driver.force()
    }

    /// A snapshot for `/status`, with both readiness answers: `ready` (what load balancers and
    /// other callers get) and `ready_for_kubelet` (what kubelet's probe gets; they differ under
    /// [`ReadinessWhileDraining::Auto`](crate::ReadinessWhileDraining::Auto) while draining).
    pub fn status(&self) -> Status {
        let phase = self.phase();
        let readiness = self.readiness();
        let ready = readiness.is_ready();
        let for_kubelet = readiness.readiness_for(Caller::Kubelet).ready;
        self.inner.driver.status(phase, ready, for_kubelet)
    }

    /// The report, once the drain is Done.
    pub fn report(&self) -> Option<DrainReport> {
        self.inner.driver.record().report()
    }

    /// Resolves when the drain is Done, with its report. Does not start the drain.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn drained(&self) -> DrainReport {
        self.moments().reached(Phase::Done).await;
        self.report()
            .expect("the report is stored before the phase turns Done")
    }

    /// Drives the whole lifecycle and returns the final report: installs the signal handlers,
    /// marks startup complete, waits for a trigger (a signal, `/drain`, [`start`](Self::start)),
    /// drains, and — after a `preStop` drain — waits for the stop signal before it returns.
    ///
    /// The report returned is the one written last: it ends with an `exit` event carrying the
    /// exit code, after every signal received (also the one that followed a `preStop` drain).
    /// The file and the termination log are written when the drain is Done and again here; the
    /// stderr line only here, once.
    pub async fn run(&self) -> DrainReport {
        let driver = &self.inner.driver;
        driver.exit().own();
        self.install_signals();
        self.readiness().mark_serving();
        let report = self.drained().await;
        let signals = &self.inner.signals;
        let stop = (!signals.is_none()).then(|| signals.stop().as_str());
        driver.conclude(report, stop).await
    }

    /// Installs the configured OS signal handlers (once). [`run`](Self::run) calls it; call it
    /// yourself when you drive the lifecycle with [`drained`](Self::drained).
    pub fn install_signals(&self) {
        if self.inner.signals.is_none() || !self.inner.driver.exit().watch() {
            return;
        }
        // The signal thread holds the driver only: signals are a trigger source, they do not
        // reach into the handle.
        let driver = Arc::clone(&self.inner.driver);
        let deliver = move |signal: crate::drain::signal::Delivery, receipt: Receipt| {
            let at = Instant::from_std(receipt.at);
            match signal {
                crate::drain::signal::Delivery::Trigger { trigger, force } => {
                    driver.on_signal(trigger, at, receipt.unix_ms, force)
                }
                crate::drain::signal::Delivery::Ignored(name) => {
                    driver.record().ignored_signal(name, at, receipt.unix_ms)
                }
            }
        };
        if let Err(e) = crate::drain::signal::install(self.inner.signals, deliver) {
            tracing::error!(error = %e, "lameduck: cannot install signal handlers");
        }
    }
}
