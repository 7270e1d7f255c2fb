//! OS signal triggers, received on a plain thread: a trigger source the coordinator listens
//! to (this module knows nothing of it). What each signal does, first and second, is tabled
//! on [`Signals`].
//!
//! # Invariants
//!
//! * Signals are received on the `lameduck-signals` thread, not on the runtime: the receipt
//!   time is right even when every worker is blocked, and the budget counts from it.
//! * The first trigger of a process that installed the handlers arms the driver's watchdog
//!   (see `driver/exit.rs`).
//! * A signal within [`ECHO_WINDOW`] of the last counted one is an echo of it when it is the
//!   same signal (GNU `timeout` signals the child, then its process group) or when both start
//!   the drain (Ctrl-C reaches the process group: the process's own SIGINT, and the SIGTERM a
//!   wrapper that traps INT forwards): recorded, never counted as a second signal, so it never
//!   forces the exit. A signal that forces on its own (SIGQUIT, unless it is the stop signal)
//!   is never an echo of one that does not.

use crate::vocab::error::ConfigError;
use crate::vocab::phase::Trigger;

/// The environment variable read for the stop signal when the builder is not given one
/// (`SIGTERM`, `SIGINT` or `SIGQUIT`; the `SIG` prefix and case are optional).
pub const STOP_SIGNAL_ENV: &str = "LAMEDUCK_STOP_SIGNAL";

/// The signal that starts the drain: the image's `STOPSIGNAL` (kubelet sends it first, and
/// SIGKILL at the end of the grace period).
///
/// # Examples
///
/// ```
/// use lameduck::{Signals, StopSignal};
///
/// // An nginx-based image (`STOPSIGNAL SIGQUIT`): SIGQUIT drains instead of forcing the exit.
/// let signals = Signals::default().stop_signal(StopSignal::Sigquit);
/// assert_eq!("sigquit".parse::<StopSignal>().unwrap(), StopSignal::Sigquit);
/// assert!("SIGHUP".parse::<StopSignal>().is_err());
/// # let _ = signals;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopSignal {
    /// SIGTERM, the default stop signal of container runtimes.
    #[default]
    Sigterm,
    /// SIGINT.
    Sigint,
    /// SIGQUIT (nginx-based images).
    Sigquit,
}

impl StopSignal {
    /// The signal's name: `SIGTERM`, `SIGINT`, `SIGQUIT`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopSignal::Sigterm => "SIGTERM",
            StopSignal::Sigint => "SIGINT",
            StopSignal::Sigquit => "SIGQUIT",
        }
    }

    pub(crate) fn trigger(self) -> Trigger {
        match self {
            StopSignal::Sigterm => Trigger::Sigterm,
            StopSignal::Sigint => Trigger::Sigint,
            StopSignal::Sigquit => Trigger::Sigquit,
        }
    }
}

impl std::fmt::Display for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for StopSignal {
    type Err = ConfigError;

    /// `SIGTERM`, `TERM`, `sigterm` (any case, `SIG` optional); likewise INT and QUIT.
    fn from_str(raw: &str) -> Result<Self, ConfigError> {
        let upper = raw.trim().to_ascii_uppercase();
        match upper.strip_prefix("SIG").unwrap_or(&upper) {
            "TERM" => Ok(StopSignal::Sigterm),
            "INT" => Ok(StopSignal::Sigint),
            "QUIT" => Ok(StopSignal::Sigquit),
            _ => Err(ConfigError::parse(format!(
                "`{raw}` is not a supported stop signal: use SIGTERM, SIGINT or SIGQUIT"
            ))),
        }
    }
}

/// Which OS signals the coordinator listens to, set with
/// [`DrainBuilder::signals`](crate::DrainBuilder::signals).
///
/// | signal                                  | first signal      | a second request  |
/// |-----------------------------------------|-------------------|-------------------|
/// | the stop signal (default SIGTERM)       | starts the drain  | exit now (forced) |
/// | SIGTERM, SIGINT                         | starts the drain  | exit now (forced) |
/// | SIGQUIT, when it is not the stop signal | exit now (forced) | exit now (forced) |
/// | SIGHUP, SIGUSR1                         | recorded, ignored | recorded, ignored |
///
/// SIGHUP (a closed terminal of `kubectl exec -it` or `docker attach`, a log rotator) and
/// SIGUSR1 (a debugging or reload tool) would otherwise kill the process with their default
/// action, mid-request and without a report: they are recorded (`signal_received` with the
/// signal's name; before the drain, at its start) and change nothing. A service that reloads
/// on SIGHUP installs its own handler as well (`tokio::signal::unix`): both see the signal.
/// [`Signals::without_hup_usr1`] leaves their default action in place.
/// A second request is a signal more than 100 ms after the last one counted — a person's
/// second Ctrl-C, a second `kill`. Within 100 ms it is the same request delivered twice, and
/// is recorded and forces nothing, when it is the same signal (GNU `timeout` signals its child,
/// then the child's process group) or when both signals start the drain (SIGTERM, SIGINT, the
/// stop signal): Ctrl-C at a terminal reaches the whole process group, so a wrapper script
/// that traps INT and TERM and forwards them delivers its SIGTERM in the same millisecond as
/// the terminal's SIGINT, in either order. A SIGQUIT that is not the stop signal forces the
/// exit whenever it comes.
///
/// The stop signal is [`StopSignal`]: set here, else env `LAMEDUCK_STOP_SIGNAL`, else SIGTERM.
/// A signal after a `preStop` hook started the drain is the *first* signal: it forces
/// nothing, it lets [`Drain::run`](crate::Drain::run) return.
///
/// Signals are received on a plain thread (not on the runtime), so the budget counts from
/// their receipt even when the runtime is starved; and once a signal has started the drain, a
/// watchdog thread writes a `forced` report (cause `runtime starved`) and exits with code 1
/// if the drain is not done half a safety margin past the hard deadline. Under
/// [`Drain::run`](crate::Drain::run) it stays armed until the report's last write is over:
/// a drain that is done but whose last write is stuck exits then with the drain's own code.
/// The watchdog's own writes end a quarter of the margin later, before SIGKILL.
///
/// # Examples
///
/// ```
/// use lameduck::{Drain, Signals, StopSignal};
///
/// let drain = Drain::builder()
///     .signals(Signals::default().stop_signal(StopSignal::Sigquit))
///     .build()?;
/// # let _ = drain;
/// # Ok::<(), lameduck::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signals {
    pub(crate) sigterm: bool,
    pub(crate) sigint: bool,
    pub(crate) sigquit: bool,
    /// SIGHUP and SIGUSR1 are recorded and ignored instead of killing the process.
    pub(crate) hup_usr1: bool,
    /// Set by [`Signals::stop_signal`], or resolved from the environment by `build`.
    pub(crate) stop: Option<StopSignal>,
}

impl Default for Signals {
    /// SIGTERM and SIGINT start the drain; SIGQUIT and a second request force the exit.
    fn default() -> Self {
        Self {
            sigterm: true,
            sigint: true,
            sigquit: true,
            hup_usr1: true,
            stop: None,
        }
    }
}

impl Signals {
    /// Listen to no signal: the drain starts only through the API or the admin endpoint.
    pub fn none() -> Self {
        Self {
            sigterm: false,
            sigint: false,
            sigquit: false,
            hup_usr1: false,
            stop: None,
        }
    }

    /// Listen to SIGTERM only.
    pub fn sigterm_only() -> Self {
        Self {
            sigterm: true,
            sigint: false,
            sigquit: false,
            hup_usr1: false,
            stop: None,
        }
    }

    /// The signal that starts the drain (it is always listened to). Default: env
    /// `LAMEDUCK_STOP_SIGNAL`, else SIGTERM.
    pub fn stop_signal(mut self, stop: StopSignal) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Leaves SIGHUP and SIGUSR1 alone (their default action, which ends the process without
    /// a report, unless the application handles them): by default they are recorded and
    /// ignored.
    pub fn without_hup_usr1(mut self) -> Self {
        self.hup_usr1 = false;
        self
    }

    /// `true` if no signal is listened to.
    pub fn is_none(&self) -> bool {
        !(self.sigterm || self.sigint || self.sigquit || self.hup_usr1) && self.stop.is_none()
    }

    /// Fills in the stop signal from `env` (or SIGTERM) when listening at all.
    pub(crate) fn resolve(mut self, env: Option<&str>) -> Result<Self, ConfigError> {
        if self.is_none() || self.stop.is_some() {
            return Ok(self);
        }
        self.stop = Some(match env.filter(|v| !v.trim().is_empty()) {
            Some(raw) => raw.parse().map_err(|e: ConfigError| {
                ConfigError::env(format!("{STOP_SIGNAL_ENV}={raw:?}: {e}"))
            })?,
            None => StopSignal::Sigterm,
        });
        Ok(self)
    }

    /// The stop signal in force (SIGTERM until resolved).
    pub(crate) fn stop(&self) -> StopSignal {
        self.stop.unwrap_or_default()
    }

    fn listens(&self, trigger: Trigger) -> bool {
        let flag = match trigger {
            Trigger::Sigterm => self.sigterm,
            Trigger::Sigint => self.sigint,
            Trigger::Sigquit => self.sigquit,
            _ => false,
        };
        flag || self.stop.map(StopSignal::trigger) == Some(trigger)
    }

    /// Whether the `n`th signal received (1-based), `trigger`, forces the exit.
    pub(crate) fn forces(&self, trigger: Trigger, n: u64) -> bool {
        n >= 2 || (trigger == Trigger::Sigquit && self.stop() != StopSignal::Sigquit)
    }
}

/// How soon a repeat of a request (the same signal, or SIGINT and SIGTERM) is an echo of it,
/// not a second request: longer than any senders' two deliveries of one request (microseconds
/// apart, stretched by a loaded machine), shorter than a person can press a key twice.
pub(crate) const ECHO_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// Counts signals as the table in [`Signals`] sees them, folding echoes.
#[derive(Debug)]
pub(crate) struct SignalCount {
    which: Signals,
    n: u64,
    /// The last signal counted and its receipt.
    last: Option<(Trigger, std::time::Instant)>,
}

impl SignalCount {
    pub(crate) fn new(which: Signals) -> Self {
        Self {
            which,
            n: 0,
            last: None,
        }
    }

    /// The 1-based count of `trigger` received at `at`, or `None` when it is an echo of the
    /// last signal counted (see [`same_request`](Self::same_request)). The window runs from
    /// that counted signal, so a stream of repeats cannot stretch it.
    pub(crate) fn count(&mut self, trigger: Trigger, at: std::time::Instant) -> Option<u64> {
        if let Some((last, last_at)) = self.last {
            if at.saturating_duration_since(last_at) < ECHO_WINDOW
                && self.same_request(last, trigger)
            {
                return None;
            }
        }
        self.n += 1;
        self.last = Some((trigger, at));
        Some(self.n)
    }

    /// Whether `next`, inside the echo window of `last`, is the same request: the same signal
    /// delivered twice, or two signals that both start the drain (a terminal's SIGINT and the
    /// SIGTERM a wrapper forwards for it).
    fn same_request(&self, last: Trigger, next: Trigger) -> bool {
        let drains = |t| self.which.listens(t) && !self.which.forces(t, 1);
        last == next || (drains(last) && drains(next))
    }
}

/// When a signal was received, on the signal thread's clocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Receipt {
    pub(crate) at: std::time::Instant,
    pub(crate) unix_ms: u64,
}

impl Receipt {
    pub(crate) fn now() -> Self {
        Self {
            at: std::time::Instant::now(),
            unix_ms: crate::vocab::phase::unix_ms_now(),
        }
    }
}

/// What a signal is to the coordinator.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Delivery {
    /// A trigger, and whether the signal table says it forces the exit.
    Trigger { trigger: Trigger, force: bool },
    /// SIGHUP or SIGUSR1, by name: recorded, nothing else.
    Ignored(&'static str),
}

/// Installs the handlers now (so the default action no longer applies from this point on)
/// and starts the thread that hands each signal to `deliver` with its receipt. Needs a
/// runtime context: `deliver` runs inside it (it may spawn on that runtime).
#[cfg(unix)]
pub(crate) fn install<F>(which: Signals, deliver: F) -> std::io::Result<()>
where
    F: Fn(Delivery, Receipt) + Send + 'static,
{
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1};

    let handle = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
    let list: Vec<i32> = [
        (Trigger::Sigterm, SIGTERM),
        (Trigger::Sigint, SIGINT),
        (Trigger::Sigquit, SIGQUIT),
    ]
    .into_iter()
    .filter(|(t, _)| which.listens(*t))
    .map(|(_, s)| s)
    .chain(
        which
            .hup_usr1
            .then_some([SIGHUP, SIGUSR1])
            .into_iter()
            .flatten(),
    )
    .collect();
    let mut signals = signal_hook::iterator::Signals::new(&list)?;
    std::thread::Builder::new()
        .name("lameduck-signals".to_owned())
        .spawn(move || {
            let mut count = SignalCount::new(which);
            for sig in signals.forever() {
                let receipt = Receipt::now();
                let trigger = match sig {
                    SIGTERM => Trigger::Sigterm,
                    SIGINT => Trigger::Sigint,
                    SIGQUIT => Trigger::Sigquit,
                    // Never counted: an ignored signal does not make the next one a second.
                    SIGHUP => {
                        deliver(Delivery::Ignored("SIGHUP"), receipt);
                        continue;
                    }
                    _ => {
                        deliver(Delivery::Ignored("SIGUSR1"), receipt);
                        continue;
                    }
                };
                // An echo is recorded like any repeat; it forces nothing of its own.
                let force = count
                    .count(trigger, receipt.at)
                    .is_some_and(|n| which.forces(trigger, n));
                // Spawning the driver from this thread needs the runtime's context.
                let _rt = handle.enter();
                deliver(Delivery::Trigger { trigger, force }, receipt);
            }
        })?;
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn install<F>(which: Signals, deliver: F) -> std::io::Result<()>
where
    F: Fn(Delivery, Receipt) + Send + 'static,
{
    if which.sigint {
        tokio::spawn(async move {
            let mut n = 0;
            while tokio::signal::ctrl_c().await.is_ok() {
                n += 1;
                let d = Delivery::Trigger {
                    trigger: Trigger::Sigint,
                    force: n >= 2,
                };
                deliver(d, Receipt::now());
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_repeat_within_the_echo_window_is_not_counted() {
        let t0 = Instant::now();
        let mut c = SignalCount::new(Signals::default().stop_signal(StopSignal::Sigterm));
        assert_eq!(c.count(Trigger::Sigterm, t0), Some(1));
        assert_eq!(
            c.count(Trigger::Sigterm, t0 + Duration::from_micros(30)),
            None
        );
        // The window runs from the counted signal: repeats do not stretch it.
        assert_eq!(c.count(Trigger::Sigterm, t0 + ECHO_WINDOW / 2), None);
        assert_eq!(c.count(Trigger::Sigterm, t0 + ECHO_WINDOW), Some(2));
        // Past the window of the last one counted, any signal is another request.
        assert_eq!(c.count(Trigger::Sigint, t0 + 2 * ECHO_WINDOW), Some(3));
    }

    #[test]
    fn sigint_and_sigterm_within_the_echo_window_are_one_request() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        for (first, second) in [
            (Trigger::Sigint, Trigger::Sigterm),
            (Trigger::Sigterm, Trigger::Sigint),
        ] {
            let mut c = SignalCount::new(Signals::default().stop_signal(StopSignal::Sigterm));
            assert_eq!(c.count(first, t0), Some(1));
            assert_eq!(c.count(second, t0 + us(50)), None, "{first:?}, {second:?}");
            // A person's second Ctrl-C, later: the window ran from the first.
            assert_eq!(c.count(Trigger::Sigint, t0 + ECHO_WINDOW), Some(2));
        }
        // SIGQUIT forces on its own: never the echo of a signal that drains.
        let mut c = SignalCount::new(Signals::default().stop_signal(StopSignal::Sigterm));
        assert_eq!(c.count(Trigger::Sigterm, t0), Some(1));
        assert_eq!(c.count(Trigger::Sigquit, t0 + us(50)), Some(2));
        // With SIGQUIT as the stop signal, it drains like SIGTERM and folds with it.
        let mut c = SignalCount::new(Signals::default().stop_signal(StopSignal::Sigquit));
        assert_eq!(c.count(Trigger::Sigquit, t0), Some(1));
        assert_eq!(c.count(Trigger::Sigterm, t0 + us(50)), None);
    }
}
