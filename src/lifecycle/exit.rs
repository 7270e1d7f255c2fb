//! The end of the process: who writes the report, the watchdog that exits when the runtime is
//! starved, and under `run` the exit itself ([`Exit::conclude`]): the wait for the stop signal
//! after a `preStop` drain, the answers owed to admin callers (`holds`), the last write.
//!
//! # Invariants
//!
//! * A report is written to the sinks at one site, [`Exit::write`]: the driver's at Done and
//!   `run`'s last one go through [`Exit::emit`], the watchdog's through
//!   [`Exit::write_starved`].
//! * The final report is written by exactly one of the driver and the watchdog thread: each
//!   claims `claim` with a compare-exchange before writing (the driver once, and its later
//!   writes find the claim its own). Under `run` the watchdog stays armed until the report's
//!   last write (after Done) is over (`released`), so no sink can hold the exit past it.
//! * The stop signal's arrival is a flag set before `stop_arrived` is notified, and the wait
//!   enables its notification before it reads the flag, so no arrival is missed.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::deadlines::Deadlines;
use super::record::Lifecycle;
use crate::report::{
    stderr_bounded, Advice, AdviceLevel, AdviceRule, DrainReport, Emitted, Sinks, StopSignalWait,
    STDERR_WAIT,
};
use crate::vocab::phase::{unix_ms_now, Event, EventKind, Trigger};
use crate::vocab::sync::MutexExt;

mod holds;

pub(crate) use holds::ExitHolds;

// Who writes the final report: the driver and the watchdog must not both write it.
const EMIT_NONE: u8 = 0;
const EMIT_DRIVER: u8 = 1;
const EMIT_WATCHDOG: u8 = 2;

/// The end of the process: the sinks, the claim on the report's writing, the watchdog, the
/// stop signal's arrival and the exit holds.
#[derive(Debug)]
pub(crate) struct Exit {
    sinks: Sinks,
    /// `EMIT_*`: who writes the final report (the loser of the swap backs off).
    claim: AtomicU8,
    /// `run`'s last write of the report is over: the watchdog stands down.
    released: AtomicBool,
    /// The signal handlers are installed: the first trigger arms the watchdog.
    watched: AtomicBool,
    /// `run` owns the process: the stderr line is written once, at exit, with the exit event.
    owned_by_run: AtomicBool,
    /// A signal arrived (any kind): after a `preStop` drain, `run` may return.
    stop_seen: AtomicBool,
    stop_arrived: Notify,
    holds: ExitHolds,
    /// The summary line of the report being written: what the watchdog leaves on stderr when
    /// it exits before the write is done.
    writing: std::sync::Mutex<Option<String>>,
}

impl Exit {
    pub(crate) fn new(sinks: Sinks) -> Self {
        Self {
            sinks,
            claim: AtomicU8::new(EMIT_NONE),
            released: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            owned_by_run: AtomicBool::new(false),
            stop_seen: AtomicBool::new(false),
            stop_arrived: Notify::new(),
            holds: ExitHolds::default(),
            writing: std::sync::Mutex::new(None),
        }
    }

    /// Answers owed to admin callers before the process exits.
    #[cfg(feature = "admin")]
    pub(crate) fn holds(&self) -> &ExitHolds {
        &self.holds
    }

    /// The signal handlers are installed: the first trigger arms the watchdog. Returns
    /// `false` if they already were.
    pub(crate) fn watch(&self) -> bool {
        // AcqRel: one caller installs; the trigger that reads it sees the handlers' owner.
        !self.watched.swap(true, Ordering::AcqRel)
    }

    /// Whether the watchdog watches this process (the handlers are installed).
    pub(crate) fn is_watched(&self) -> bool {
        self.watched.load(Ordering::Acquire)
    }

    /// `run` owns the process: the stderr line waits for the exit.
    pub(crate) fn own(&self) {
        self.owned_by_run.store(true, Ordering::Release);
    }

    pub(crate) fn is_owned(&self) -> bool {
        self.owned_by_run.load(Ordering::Acquire)
    }

    /// A signal arrived: a wait for the stop signal after a `preStop` drain ends.
    pub(crate) fn stop_arrived(&self) {
        // Release: the waiter that is woken (or checks first) sees the flag.
        self.stop_seen.store(true, Ordering::Release);
        self.stop_arrived.notify_waiters();
    }

    /// The one place a report is written to the sinks, bounded by `until` on the real clock.
    fn write(
        sinks: &Sinks,
        report: &DrainReport,
        json: &str,
        stderr: bool,
        until: std::time::Instant,
    ) -> Emitted {
        sinks.emit(report, json, stderr, until)
    }

    /// When the sinks must be done, on the real clock (see `Deadlines::sink_deadline`).
    pub(crate) fn sink_deadline(&self, deadlines: &Deadlines) -> std::time::Instant {
        deadlines.sink_deadline(self.is_watched())
    }

    /// The exit under `run`, once Done: after a drain a `preStop` call started, the wait for
    /// the stop signal named `stop` (when a signal source is installed and the drain was not
    /// forced); the answers owed to admin callers; then the report completed for the exit
    /// (signals received after Done, the `exit` event) and written for the last time.
    pub(crate) async fn conclude(
        &self,
        mut report: DrainReport,
        stop: Option<&str>,
        (state, deadlines): (&Lifecycle, &Deadlines),
        force: &CancellationToken,
    ) -> DrainReport {
        // The hard deadline is read after each wait: a shorter deletion grace moves it.
        if let Some(stop) = stop.filter(|_| state.trigger() == Some(Trigger::PreStop)) {
            let hard = deadlines.hard_deadline();
            self.wait_for_stop_signal(&mut report, stop, hard, force)
                .await;
        }
        let cap = deadlines.settle_cap().filter(|_| self.is_watched());
        self.settle(
            &mut report,
            (deadlines.hard_deadline(), deadlines.delivery_wait()),
            cap,
        )
        .await;
        report.timeline.extend(state.late_signals());
        let mut e = match state.origin() {
            Some(o) => o.event_at(EventKind::Exit, Instant::now()),
            None => Event::new(EventKind::Exit, Duration::ZERO, unix_ms_now()),
        };
        e.code = Some(report.exit_code);
        report.timeline.push(e);
        // The budget as the exit leaves it: a process that waited for its stop signal after a
        // preStop drain used the grace until now, not until Done.
        refresh_budget(&mut report, deadlines);
        // The driver's claim, taken at Done, still holds: the watchdog cannot have this one.
        let until = self.sink_deadline(deadlines);
        self.emit(&mut report, true, until).await;
        state.set_report(report.clone());
        self.release();
        report
    }

    /// The driver writes `report` (the stderr line when `stderr`), on a blocking thread: a
    /// slow disk or a stalled stderr must not hold a runtime worker. Records what failed in
    /// `report`. Returns `false`, writing nothing, when the watchdog claimed the writing: it
    /// writes the report and exits the process.
    pub(crate) async fn emit(
        &self,
        report: &mut DrainReport,
        stderr: bool,
        until: std::time::Instant,
    ) -> bool {
        // AcqRel: pairs with the watchdog's claim; only one of them writes the report.
        let claimed = self.claim.compare_exchange(
            EMIT_NONE,
            EMIT_DRIVER,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if claimed == Err(EMIT_WATCHDOG) {
            return false;
        }
        // Serialised once; logged here, in the drain's span and the caller's subscriber;
        // written over there.
        let json = report.to_json();
        crate::report::log_report(report, &json);
        *self.writing.locked() = Some(report.headline());
        let sinks = self.sinks.clone();
        let r = report.clone();
        let emitted =
            tokio::task::spawn_blocking(move || Self::write(&sinks, &r, &json, stderr, until))
                .await
                .unwrap_or_else(|e| Emitted {
                    file_failed: false,
                    errors: vec![format!("report writer: {e}")],
                });
        // Each failure once: the report already holds those of an earlier emission.
        for e in emitted
            .errors
            .iter()
            .filter(|e| !report.sink_errors.contains(e))
        {
            tracing::warn!(error = %e, "lameduck: a report sink failed");
        }
        emitted.apply_to(report);
        true
    }

    /// `run`'s last write is over: the watchdog stands down, the application owns its exit.
    fn release(&self) {
        // Release: the watchdog that reads it sees the report stored before.
        self.released.store(true, Ordering::Release);
    }

    /// Arms the watchdog: at `origin + at` it calls `fire` with the end of its own writes
    /// (`writes` later). A plain thread, so a starved runtime cannot delay it.
    pub(crate) fn arm_watchdog(
        &self,
        origin: std::time::Instant,
        at: Duration,
        writes: Duration,
        fire: impl FnOnce(std::time::Instant) + Send + 'static,
    ) {
        let Some(fire_at) = origin.checked_add(at) else {
            // Unreachable with a validated budget (at most 24 h); never arm a wrong deadline.
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("lameduck-watchdog".to_owned())
            .spawn(move || {
                loop {
                    let now = std::time::Instant::now();
                    if now >= fire_at {
                        break;
                    }
                    std::thread::sleep(fire_at - now);
                }
                fire(fire_at + writes);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "lameduck: cannot start the watchdog thread");
        }
    }

    /// The watchdog fired: `true` if it is to write a `forced` report. Not when `run` has
    /// returned, nor when the drain is `done` without `run` (the report was written before
    /// Done; the rest is the application's). When the driver is still writing, exits the
    /// process at once, with the drain's `code` once it is known.
    pub(crate) fn watchdog_claims(
        &self,
        done: bool,
        code: Option<i32>,
        until: std::time::Instant,
    ) -> bool {
        // Acquire: pairs with `release`; `run` returned, the application owns its exit.
        if self.released.load(Ordering::Acquire) || (done && !self.is_owned()) {
            return false;
        }
        // AcqRel: whoever wins writes; the driver checks the same flag before writing.
        if self
            .claim
            .compare_exchange(
                EMIT_NONE,
                EMIT_WATCHDOG,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            return true;
        }
        // The driver is writing the report (at Done, or for the last time at the exit) and
        // has not finished by now: exit anyway, leaving at least the report's summary.
        let code = code.unwrap_or(1);
        // `try_lock`: the watchdog never waits on a thread it is there to outlast.
        let summary = self
            .writing
            .try_lock()
            .ok()
            .and_then(|mut w| w.take())
            .map_or_else(String::new, |h| format!("{h}\n"));
        let _ = stderr_bounded(
            format!(
                "{summary}lameduck: the drain report was still being written at the hard \
                 deadline; exiting with code {code}\n"
            ),
            until.saturating_duration_since(std::time::Instant::now()),
        );
        std::process::exit(code);
    }

    /// The watchdog's write of its `forced` report of a starved runtime, `used` after the
    /// trigger (the hard deadline at `hard`), by `until`; then the process exits with code 1.
    pub(crate) fn write_starved(
        &self,
        mut report: DrainReport,
        (used, hard): (Duration, Duration),
        mut exit: Event,
        until: std::time::Instant,
    ) -> ! {
        report.cause = Some(format!(
            "runtime starved: the drain had not finished {} ms after the trigger (hard deadline \
             {} ms); something blocks the runtime's worker threads",
            used.as_millis(),
            hard.as_millis()
        ));
        exit.code = Some(1);
        report.timeline.push(exit);
        let json = report.to_json();
        let _ = Self::write(&self.sinks, &report, &json, true, until);
        std::process::exit(1);
    }

    /// After a drain a `preStop` call started and that ended before the stop signal came:
    /// waits for the stop signal named `stop` (`SIGTERM`; at most until `hard`, the hard
    /// deadline, or the force) and records the wait in `report`.
    async fn wait_for_stop_signal(
        &self,
        report: &mut DrainReport,
        stop: &str,
        hard: Option<Instant>,
        force: &CancellationToken,
    ) {
        if self.stop_seen.load(Ordering::Acquire) {
            return;
        }
        let since = Instant::now();
        let until = hard.unwrap_or(since);
        say_waiting(stop, until.saturating_duration_since(since)).await;
        let mut arrived = true;
        loop {
            let n = self.stop_arrived.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            // Acquire: pairs with `stop_arrived`.
            if self.stop_seen.load(Ordering::Acquire) || force.is_cancelled() {
                break;
            }
            tokio::select! {
                () = n => {}
                () = force.cancelled() => break,
                () = tokio::time::sleep_until(until) => {
                    arrived = false;
                    break;
                }
            }
        }
        let waited_ms = since.elapsed().as_millis() as u64;
        report.stop_signal_wait = Some(StopSignalWait { waited_ms, arrived });
        if !arrived {
            tracing::warn!(
                waited_ms,
                "lameduck: the stop signal did not arrive after the preStop drain"
            );
            report
                .advice
                .insert(0, stop_signal_missing(stop, waited_ms));
        }
    }

    /// The last step of `run` before the last write: lets admin servers finish what they owe
    /// (bounded by `hard`, and by `cap` when the watchdog watches), then adds the admin
    /// connections whose peer did not take its answer to the report's stragglers.
    async fn settle(
        &self,
        report: &mut DrainReport,
        (hard, deliver): (Option<Instant>, Duration),
        cap: Option<Instant>,
    ) {
        let settle = self.holds.settle(hard, deliver);
        match cap {
            // Admin answers get what is left before the report's last write, which the
            // watchdog waits for no longer than half the safety margin past the hard deadline.
            Some(cap) => {
                let _ = tokio::time::timeout_at(cap, settle).await;
            }
            None => settle.await,
        }
        let cut = self.holds.take_cut();
        report
            .straggler_counts
            .add(crate::report::StragglerKind::Response, cut.len() as u64);
        report.stragglers.extend(cut);
    }
}

/// The log line (and without a subscriber, the stderr line) of the wait for the stop signal.
async fn say_waiting(stop: &str, at_most: Duration) {
    tracing::info!(
        stop_signal = stop,
        "lameduck: drained after preStop; waiting for the stop signal to exit"
    );
    if !tracing::dispatcher::has_been_set() {
        let line = format!(
            "lameduck: drained after preStop; waiting for the stop signal ({stop}) to exit, \
             at most {} ms: kubelet sends it once the hook has returned; outside Kubernetes \
             send it yourself (kill -{} {})\n",
            at_most.as_millis(),
            stop.trim_start_matches("SIG"),
            std::process::id()
        );
        let _ = tokio::task::spawn_blocking(move || stderr_bounded(line, STDERR_WAIT)).await;
    }
}

/// The advice when the stop signal did not come after a `preStop` drain.
fn stop_signal_missing(stop: &str, waited_ms: u64) -> Advice {
    Advice::new(
        AdviceLevel::Warn,
        AdviceRule::StopSignalMissing,
        waited_ms,
        format!(
            "stop signal ({stop}) did not arrive {waited_ms} ms after the preStop drain: is the \
             entrypoint forwarding signals? run the binary as PID 1 or use an init that forwards"
        ),
    )
}

/// Counts `report`'s budget to now (the exit) and redoes the advice that reads it, in place.
fn refresh_budget(report: &mut DrainReport, deadlines: &Deadlines) {
    use crate::report::AdviceRule::{BudgetShortened, GraceHeadroom, GraceUsed};
    let reads_budget =
        |r: crate::report::AdviceRule| matches!(r, GraceUsed | GraceHeadroom | BudgetShortened);
    report.budget = deadlines.report();
    report.advice.retain(|a| !reads_budget(a.rule));
    let fresh = crate::report::rules::advise(report);
    report
        .advice
        .extend(fresh.into_iter().filter(|a| reads_budget(a.rule)));
    // Warnings first, as `advise` orders them; stable, so the rest keep their order.
    report.advice.sort_by_key(|a| a.level);
}
