//! [`DrainBuilder`]: the settings, validated, and the parts put together.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Drain, Inner};
use crate::drain::signal::{Signals, STOP_SIGNAL_ENV};
use crate::hot::guard::Core;
use crate::lifecycle::{Driver, Settings};
use crate::propagation::Propagation;
use crate::readiness::{ReadinessState, SourceTable};
use crate::report::Sinks;
use crate::vocab::budget::{Budget, DurationDisplay, GRACE_PERIOD_ENV, SHORTEST_GRACE_ENV};
use crate::vocab::error::ConfigError;
use crate::vocab::phase::ReadinessWhileDraining;
use crate::vocab::phase::{unix_ms_now, Trigger};

/// The environment variable naming the path in front of the process, for the report's
/// `proxy_label` (see [`DrainBuilder::proxy_label`]).
pub const PROXY_LABEL_ENV: &str = "LAMEDUCK_PROXY_LABEL";

/// Builds a [`Drain`](crate::Drain). Every setting has a default; [`build`](Self::build) validates them.
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::{Drain, Propagation, ReadinessWhileDraining};
///
/// let drain = Drain::builder()
///     .grace_period(Duration::from_secs(60)) // = terminationGracePeriodSeconds
///     .close_budget(Duration::from_secs(10))
///     .propagation(Propagation::quiet(Duration::from_secs(3)).max(Duration::from_secs(30)))
///     .readiness_while_draining(ReadinessWhileDraining::NotReady)
///     .build()?;
/// assert_eq!(drain.moments().budget().quiesce_deadline(), Duration::from_secs(49)); // 60 − 1 − 10
/// # Ok::<(), lameduck::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct DrainBuilder {
    grace_period: Option<Duration>,
    safety_margin: Option<Duration>,
    close_budget: Option<Duration>,
    shortest_grace: Option<Duration>,
    propagation: Propagation,
    signals: Option<Signals>,
    readiness: ReadinessWhileDraining,
    sinks: Sinks,
    hurry_lead: Option<Duration>,
    drain_on_task_panic: bool,
    proxy_label: Option<String>,
}

impl DrainBuilder {
    /// The Pod's `terminationGracePeriodSeconds`. Default: env `LAMEDUCK_GRACE_PERIOD`
    /// (`30s`, `1500ms`, `2m`, or a bare number of seconds), else 30 s.
    pub fn grace_period(mut self, d: Duration) -> Self {
        self.grace_period = Some(d);
        self
    }

    /// Kept free before SIGKILL. Default 1 s (scaled down for grace periods under 30 s).
    pub fn safety_margin(mut self, d: Duration) -> Self {
        self.safety_margin = Some(d);
        self
    }

    /// Reserved for resource closers. Default 5 s (scaled down for grace periods under 30 s).
    pub fn close_budget(mut self, d: Duration) -> Self {
        self.close_budget = Some(d);
        self
    }

    /// The shortest grace this Pod may be given, when that is less than its
    /// `terminationGracePeriodSeconds`: the kubelet's graceful node shutdown (e.g. 15 s of a
    /// spot node's 30 s for ordinary Pods), a soft node-pressure eviction
    /// (`evictionMaxPodGracePeriod`). A process cannot tell those from a rollout by its
    /// SIGTERM, so every drain is planned to fit this budget: counted from the trigger, the
    /// margin, the close budget and propagation `max` shrink in its proportion, as for a
    /// deletion with a shorter grace, and the report names it (`budget.deletion`, source
    /// `shortest_grace`, and the advice `budget_shortened`). Default: env
    /// `LAMEDUCK_SHORTEST_GRACE`, else none (the grace period is the budget). With the
    /// `kube` feature the watch sees the actual termination and its budget instead; see the
    /// Kubernetes guide, "Terminations that are not a rollout".
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use lameduck::Drain;
    ///
    /// // A spot node pool: node shutdown gives ordinary Pods 15 s of their 30 s.
    /// let drain = Drain::builder()
    ///     .grace_period(Duration::from_secs(30))
    ///     .shortest_grace(Duration::from_secs(15))
    ///     .build()?;
    /// # Ok::<(), lameduck::ConfigError>(())
    /// ```
    pub fn shortest_grace(mut self, d: Duration) -> Self {
        self.shortest_grace = Some(d);
        self
    }

    /// When to stop accepting. Default: [`Propagation::default`] (quiet window 500 ms, min 1 s,
    /// confidence from the arrival rate with ε = 10⁻³, max half the grace period).
    pub fn propagation(mut self, p: Propagation) -> Self {
        self.propagation = p;
        self
    }

    /// Which OS signals [`Drain::run`](crate::Drain::run) listens to. Default [`Signals::default`], with the
    /// stop signal from env `LAMEDUCK_STOP_SIGNAL` (else SIGTERM).
    pub fn signals(mut self, s: Signals) -> Self {
        self.signals = Some(s);
        self
    }

    /// What `/readyz` says while draining. Default [`ReadinessWhileDraining::Auto`].
    pub fn readiness_while_draining(mut self, r: ReadinessWhileDraining) -> Self {
        self.readiness = r;
        self
    }

    /// Also write the final report (one JSON line) to this file.
    ///
    /// The file is replaced atomically (a temporary file created exclusively, under an
    /// unpredictable name, in the same directory, synced, then renamed), so a crash leaves the
    /// previous report or the new one, never a truncated file. A FIFO, and the process's own
    /// output (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`), are written in
    /// place without blocking (a FIFO nobody reads is an error, not a hang), and so is a
    /// bind-mounted file (a Kubernetes `subPath` mount), which cannot be renamed over. Those
    /// output paths and `/dev/termination-log` are the only ones whose links are followed
    /// (the path resolved as text: `/dev/../x` is `/x`): a link anywhere else, `/dev/shm`
    /// included, is replaced, never followed, and a device there is refused, not written.
    /// Every write is bounded in time: a stalled reader cannot hold the exit.
    /// If it cannot be written, the error is said on stderr, recorded in the report's
    /// `sink_errors`, and the exit code is 1.
    pub fn report_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.sinks.file = Some(path.into());
        self
    }

    /// Write the report to stderr at the exit (default `true`): one line for people (the
    /// outcome, the grace used and, when the commit did not go on evidence, why — e.g. a
    /// process that served less than 15 s waits to `max`), then the JSON line for tools.
    pub fn report_to_stderr(mut self, yes: bool) -> Self {
        self.sinks.stderr = yes;
        self
    }

    /// Where the short summary goes; default `/dev/termination-log`, written only when that
    /// file exists and is writable. `None` turns it off.
    pub fn termination_log(mut self, path: Option<PathBuf>) -> Self {
        self.sinks.termination_log = path;
        self
    }

    /// How long before the quiesce deadline cancellable tasks get their *hurry* signal
    /// ([`TaskContext::hurry`](crate::TaskContext::hurry)). Default: a fifth of the window between the trigger and the
    /// quiesce deadline, at most 5 s.
    pub fn hurry_lead(mut self, d: Duration) -> Self {
        self.hurry_lead = Some(d);
        self
    }

    /// Start the drain (trigger `task_panic`) when a background task started with
    /// [`Work::spawn`](crate::Work::spawn) and friends panics: a process whose must-finish work died is better
    /// replaced than left serving half-broken. Default `false`: the panic is recorded in the
    /// report (`tasks`) and the process goes on.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use lameduck::report::TaskResult;
    /// use lameduck::{Drain, Signals, Trigger};
    ///
    /// let drain = Drain::builder()
    ///     .drain_on_task_panic(true)
    ///     # .signals(Signals::none()).report_to_stderr(false).termination_log(None)
    ///     .build()
    ///     .unwrap();
    /// drain.work().spawn("exporter", async { panic!("lost the connection") });
    /// let report = drain.drained().await;
    /// assert_eq!(report.trigger, Some(Trigger::TaskPanic));
    /// assert_eq!(report.tasks[0].result, TaskResult::Panicked);
    /// # }
    /// ```
    pub fn drain_on_task_panic(mut self, yes: bool) -> Self {
        self.drain_on_task_panic = yes;
        self
    }

    /// Names what stands between the clients and this process — `kube-proxy iptables 1.31`,
    /// `ingress-nginx 1.11`, `AWS ALB (ip targets)` — for the report (`proxy_label`): its
    /// numbers are evidence about that path only. Default: env `LAMEDUCK_PROXY_LABEL`, else
    /// none.
    pub fn proxy_label(mut self, label: impl Into<String>) -> Self {
        self.proxy_label = Some(label.into());
        self
    }

    /// Validates the settings and builds the coordinator.
    ///
    /// Each build leaks one block of memory (the hot-path counters, under 2 KiB, and the arrival
    /// rows of 16 paths, about 9 KiB) for the life
    /// of the process, so that an in-flight guard and the tower layer are plain references
    /// with no reference count to bump per request; so does each distinct set of layer
    /// options (one small block, whatever the number of layers built with it), and, while
    /// draining, 16 bytes for each request described for the straggler list at the same moment
    /// (reused by the requests described after it). Build one coordinator per process (tests that build
    /// many pay one block each). What a drain accumulates (per-peer connection counts,
    /// traffic-path counts, the straggler list's descriptions) is freed when it reaches
    /// [`Phase::Done`](crate::Phase::Done).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting to change: a zero grace period, a close budget plus
    /// safety margin that leave nothing of the grace period, a propagation `min` above `max`
    /// or a `max` past the quiesce deadline, an unparsable `LAMEDUCK_GRACE_PERIOD`, a grace
    /// period under 1 s or above 24 h, a shortest grace (or `LAMEDUCK_SHORTEST_GRACE`) that
    /// does not parse, is under 1 s or is longer than the grace period, an unknown `LAMEDUCK_STOP_SIGNAL`, a per-request peer
    /// (or an item of `LAMEDUCK_PER_REQUEST_PEERS`) that is neither an address nor a CIDR
    /// block, and (feature `admin`) a `LAMEDUCK_ADMIN_TOKEN` that no request could carry — a
    /// space, a tab, a line break, a non-ASCII character, more than 4096 characters: the admin
    /// router would refuse every `/drain`, or the `preStop` client would fail every time. The
    /// error names what is wrong, never the value.
    pub fn build(self) -> Result<Drain, ConfigError> {
        let env = std::env::var(GRACE_PERIOD_ENV).ok();
        let budget = Budget::resolve(
            self.grace_period,
            self.safety_margin,
            self.close_budget,
            env.as_deref(),
        )?;
        let shortest_env = std::env::var(SHORTEST_GRACE_ENV).ok();
        let shortest_grace =
            budget.resolve_shortest(self.shortest_grace, shortest_env.as_deref())?;
        // Every deadline is `origin + offset ≤ origin + grace`: refuse a grace period the
        // clock cannot represent now rather than overflow at the trigger.
        if Instant::now().checked_add(budget.grace_period).is_none() {
            return Err(ConfigError::budget(format!(
                "grace_period ({}) overflows this platform's clock: lower it",
                DurationDisplay(budget.grace_period)
            )));
        }
        #[cfg(feature = "admin")]
        crate::vocab::token::check_env()?;
        let stop_env = std::env::var(STOP_SIGNAL_ENV).ok();
        let signals = self
            .signals
            .unwrap_or_default()
            .resolve(stop_env.as_deref())?;
        let policy = self.propagation.resolve_with_env(&budget)?;
        let window = budget.quiesce_deadline();
        let hurry_lead = match self.hurry_lead {
            Some(d) if d > window => {
                return Err(ConfigError::budget(format!(
                    "hurry_lead ({}) is longer than the window before the quiesce deadline ({}): lower hurry_lead",
                    DurationDisplay(d),
                    DurationDisplay(window)
                )))
            }
            Some(d) => d,
            None => (window / 5).min(Duration::from_secs(5)),
        };
        let core = Core::leak();
        let proxy_label = self.proxy_label.or_else(|| {
            std::env::var(PROXY_LABEL_ENV)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        });
        // Written by the admin router's `/readyz`, read by the driver (`/status`, report).
        let settings = Settings {
            budget,
            policy,
            probe_sources: SourceTable::default(),
            readiness: self.readiness,
            sinks: self.sinks,
            hurry_lead,
            shortest_grace,
            proxy_label,
            observer: crate::drain_metrics::observer(),
        };
        let driver = Arc::new(Driver::new(core, settings));
        if self.drain_on_task_panic {
            // Weak: the hook lives in the driver it would otherwise keep alive.
            let weak = Arc::downgrade(&driver);
            driver.work.tasks().set_on_panic(Arc::new(move |name: &str| {
                if let Some(driver) = weak.upgrade() {
                    tracing::warn!(task = %name, "lameduck: a task panicked; starting the drain");
                    driver.start(Trigger::TaskPanic, Instant::now(), unix_ms_now(), false);
                }
            }));
        }
        // The first sample, so the gauges exist before the first event.
        driver.progress().observe();
        Ok(Drain {
            inner: Arc::new(Inner {
                readiness: Arc::new(ReadinessState::new(self.readiness)),
                work: driver.work.clone(),
                driver,
                signals,
            }),
        })
    }
}
