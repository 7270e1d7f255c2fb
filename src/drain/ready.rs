//! Readiness on the handle: startup gates, readiness checks, and what `/readyz` answers.

use std::sync::Arc;

use crate::lifecycle::Driver;
use crate::readiness::{Caller, ReadinessAnswer, ReadinessState};
use crate::vocab::phase::Phase;
use crate::vocab::phase::ReadinessWhileDraining;

/// A startup gate: readiness stays false until every gate is [`open`](Self::open)ed.
///
/// Dropping a gate without opening it keeps it closed for good (readiness never turns true) and
/// logs a warning: a warm-up that failed must not make the service look ready.
#[derive(Debug)]
#[must_use = "readiness stays false until the gate is opened"]
pub struct StartupGate {
    readiness: Readiness,
    index: usize,
    opened: bool,
}

impl StartupGate {
    /// Opens the gate. When it was the last closed one, the phase moves to Serving.
    pub fn open(mut self) {
        self.opened = true;
        let name = self.readiness.state.open_gate(self.index);
        tracing::info!(gate = %name, "lameduck: startup gate opened");
        self.readiness.maybe_serving();
    }
}

impl Drop for StartupGate {
    fn drop(&mut self) {
        if !self.opened {
            tracing::warn!(
                gate = %self.readiness.state.gate_name(self.index),
                "lameduck: startup gate dropped without open(); readiness stays false"
            );
        }
    }
}

/// Readiness on a [`Drain`](crate::Drain): startup gates, readiness checks, and what `/readyz` answers.
///
/// Returned by [`Drain::readiness`](crate::Drain::readiness). It owns what it reads (the gates and checks, and the
/// lifecycle's phase): a cheap clone, `'static`, to keep where readiness is decided.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
/// #     .report_to_stderr(false).termination_log(None).build().unwrap();
/// let cache = drain.readiness().startup_gate("cache");
/// drain.readiness().mark_serving();
/// assert!(!drain.readiness().is_ready());
/// assert_eq!(drain.readiness().answer().reason, "starting: waiting for cache");
/// cache.open();
/// assert!(drain.readiness().is_ready());
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Readiness {
    state: Arc<ReadinessState>,
    driver: Arc<Driver>,
}

impl Readiness {
    pub(super) fn new(state: Arc<ReadinessState>, driver: Arc<Driver>) -> Self {
        Self { state, driver }
    }

    /// A startup gate named `name`. Readiness is false until every gate is opened.
    ///
    /// Create every gate before the phase can turn Serving — before [`Drain::run`](crate::Drain::run) or the
    /// server starts — since opening the last closed gate (or starting with none) makes the
    /// service ready.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use lameduck::Phase;
    ///
    /// let cache = drain.readiness().startup_gate("cache");
    /// drain.readiness().mark_serving(); // what `run` and `serve` do; no effect while a gate is closed
    /// assert_eq!(drain.phase(), Phase::Starting);
    /// assert!(!drain.readiness().is_ready());
    ///
    /// tokio::spawn(async move {
    ///     // ... load the cache ...
    ///     cache.open();
    /// });
    /// drain.moments().reached(Phase::Serving).await;
    /// assert!(drain.readiness().is_ready());
    /// # }
    /// ```
    pub fn startup_gate(&self, name: impl Into<String>) -> StartupGate {
        let name = name.into();
        let index = self.state.add_gate(name.clone());
        self.driver.record().note_gate();
        if self.driver.progress().phase() != Phase::Starting {
            tracing::warn!(gate = %name, "lameduck: startup gate created after startup; it only affects readiness reporting");
        }
        StartupGate {
            readiness: self.clone(),
            index,
            opened: false,
        }
    }

    /// Adds a readiness check evaluated on every `/readyz`. Keep it local: readiness must not
    /// depend on shared downstream services, or one slow database takes every replica out of
    /// the load balancer at once.
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let drain = lameduck::Drain::builder().signals(lameduck::Signals::none())
    /// #     .report_to_stderr(false).termination_log(None).build().unwrap();
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let disk_ok = Arc::new(AtomicBool::new(true));
    /// let flag = Arc::clone(&disk_ok);
    /// drain.readiness().check("scratch-disk", move || {
    ///     if flag.load(Ordering::Relaxed) { Ok(()) } else { Err("disk full") }
    /// });
    /// drain.readiness().mark_serving();
    /// assert!(drain.readiness().is_ready());
    /// disk_ok.store(false, Ordering::Relaxed);
    /// assert_eq!(drain.readiness().answer().reason, "check scratch-disk failed: disk full");
    /// # }
    /// ```
    pub fn check<F, E>(&self, name: impl Into<String>, check: F)
    where
        F: Fn() -> Result<(), E> + Send + Sync + 'static,
        E: Into<crate::work::closers::BoxError>,
    {
        self.state.add_check(
            name.into(),
            Arc::new(move || check().map_err(|e| e.into().to_string())),
        );
    }

    /// Marks startup complete if no gate is closed (Starting → Serving). Called by
    /// [`Drain::run`](crate::Drain::run), by `serve`, and when the last gate opens.
    pub fn mark_serving(&self) {
        self.maybe_serving();
    }

    /// `true` when `/readyz` answers 200 to callers other than kubelet's probe (see
    /// [`ReadinessWhileDraining::Auto`]).
    pub fn is_ready(&self) -> bool {
        self.answer().ready
    }

    /// Readiness with its reason and every check, as a caller other than kubelet's probe sees
    /// it (see [`ReadinessWhileDraining::Auto`]).
    pub fn answer(&self) -> ReadinessAnswer {
        self.readiness_for(Caller::Other)
    }

    /// The readiness policy in force.
    pub fn policy(&self) -> ReadinessWhileDraining {
        self.state.policy()
    }
}

impl Readiness {
    fn maybe_serving(&self) {
        if self.state.all_gates_open() {
            self.driver.progress().mark_serving();
        }
    }

    /// Readiness as `caller` sees it: `/readyz` passes who asked.
    pub(crate) fn readiness_for(&self, caller: Caller) -> ReadinessAnswer {
        self.readiness_in(self.driver.progress().phase(), caller, caller.describe())
    }

    /// Readiness in `phase` as `caller` (described as `who`) sees it, with the propagation
    /// evidence once draining.
    pub(crate) fn readiness_in(&self, phase: Phase, caller: Caller, who: &str) -> ReadinessAnswer {
        let evidence = if phase >= Phase::Draining {
            self.driver.evidence_now().map(|e| e.describe())
        } else {
            None
        };
        self.state.evaluate(phase, caller, who, evidence)
    }
}
