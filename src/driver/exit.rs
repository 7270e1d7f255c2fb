//! The end of the process: the wait for the stop signal after a `preStop` drain, the last
//! write of the report, and the watchdog that exits when the runtime is starved.
//!
//! What the exit waits for, the answers owed to admin callers, is in `holds`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Driver, EMIT_NONE, EMIT_WATCHDOG};
use crate::phase::{unix_ms_now, Event, EventKind, Phase, Trigger};
use crate::report::{
    stderr_bounded, Advice, AdviceLevel, AdviceRule, DrainReport, Outcome, StopSignalWait,
    STDERR_WAIT,
};

mod holds;

pub(crate) use holds::ExitHolds;

impl Driver {
    /// After a drain a `preStop` call started and that ended before the stop signal came:
    /// waits for the stop signal named `stop` (`SIGTERM`; at most until the hard deadline) and
    /// records the wait in `report`. The signal source tells the driver that it arrived.
    pub(crate) async fn wait_for_stop_signal(&self, report: &mut DrainReport, stop: &str) {
        let waiting = {
            let st = self.lock();
            st.trigger == Some(Trigger::PreStop) && !st.stop_seen
        };
        if !waiting || self.is_forced() {
            return;
        }
        let since = Instant::now();
        let until = self.hard_deadline().unwrap_or(since);
        tracing::info!(
            stop_signal = stop,
            "lameduck: drained after preStop; waiting for the stop signal to exit"
        );
        if !tracing::dispatcher::has_been_set() {
            let line = format!(
                "lameduck: drained after preStop; waiting for the stop signal ({stop}) to exit, \
                 at most {} ms: kubelet sends it once the hook has returned; outside Kubernetes \
                 send it yourself (kill -{} {})\n",
                until.saturating_duration_since(since).as_millis(),
                stop.trim_start_matches("SIG"),
                std::process::id()
            );
            let _ = tokio::task::spawn_blocking(move || stderr_bounded(line, STDERR_WAIT)).await;
        }
        let mut arrived = true;
        loop {
            let n = self.terminate_seen.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.lock().stop_seen || self.is_forced() {
                break;
            }
            tokio::select! {
                () = n => {}
                () = self.tokens.force.cancelled() => break,
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
            report.advice.insert(
                0,
                Advice::new(
                    AdviceLevel::Warn,
                    AdviceRule::StopSignalMissing,
                    waited_ms,
                    format!(
                        "stop signal ({stop}) did not arrive {waited_ms} ms after the preStop \
                         drain: is the entrypoint forwarding signals? run the binary as PID 1 \
                         or use an init that forwards"
                    ),
                ),
            );
        }
    }

    /// Completes the report for the exit (signals received after Done, the `exit` event) and
    /// writes it to every sink for the last time.
    pub(crate) async fn finish(&self, mut report: DrainReport) -> DrainReport {
        let (late, origin) = {
            let st = self.lock();
            (st.timeline.late().to_vec(), st.origin)
        };
        report.timeline.extend(late);
        let at = origin.map_or(Duration::ZERO, |o| o.at.elapsed());
        let unix_ms = origin.map_or_else(unix_ms_now, |o| o.unix_ms + at.as_millis() as u64);
        let mut e = Event::new(EventKind::Exit, at, unix_ms);
        e.code = Some(report.exit_code);
        report.timeline.push(e);
        let emitted = self.emit_off_runtime(&report, true).await;
        emitted.apply_to(&mut report);
        self.lock().report = Some(report.clone());
        // Release: the watchdog that reads it sees the report stored above.
        self.released.store(true, Ordering::Release);
        report
    }

    /// Called on the watchdog thread once the hard deadline (plus half the safety margin) has
    /// passed, with `until` for its own writes (a quarter of the margin later, still before
    /// SIGKILL). If the drain is not Done, the runtime is starved: writes a `forced` report
    /// with what is known and exits the process with code 1. If it is Done but `run` has not
    /// finished its last write (a sink or the runtime is stuck), exits with the drain's code.
    fn watchdog_fire(&self, until: std::time::Instant) {
        // Acquire: pairs with `finish`; `run` returned, the application owns its exit.
        if self.released.load(Ordering::Acquire) {
            return;
        }
        let (owned_by_run, code) = {
            let st = self.lock();
            (st.owned_by_run, st.report.as_ref().map(|r| r.exit_code))
        };
        if self.phase() == Phase::Done && !owned_by_run {
            // `drained` without `run`: the report was written before Done; the rest is the
            // application's.
            return;
        }
        let wait = until.saturating_duration_since(std::time::Instant::now());
        // AcqRel: whoever wins writes; the driver checks the same flag before writing.
        if self
            .emission
            .compare_exchange(
                EMIT_NONE,
                EMIT_WATCHDOG,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // The driver is writing the report (at Done, or for the last time at the exit)
            // and has not finished by now: exit anyway, with the drain's code once it is known.
            let code = code.unwrap_or(1);
            let _ = stderr_bounded(
                format!(
                    "lameduck: the drain report was still being written at the hard deadline; \
                     exiting with code {code}\n"
                ),
                wait,
            );
            std::process::exit(code);
        }
        let Some(origin) = self.origin() else {
            return;
        };
        let now = Instant::now();
        let stragglers = self.collect_stragglers(now, origin.at);
        let used = now.saturating_duration_since(origin.at);
        let unix_ms = origin.unix_ms + used.as_millis() as u64;
        {
            // Not through `push`: its log line may go to the very stderr that stalls.
            let mut st = self.lock();
            let mut e = Event::new(EventKind::Done, used, unix_ms);
            e.detail = Some("forced: runtime starved".to_owned());
            st.timeline.push(e);
            st.timeline.freeze();
        }
        self.forced.store(true, Ordering::Release);
        // Those not yet taken by the driver never ran.
        let closers = self.closers.skipped_by_force();
        let mut report = self.build_report(origin.at, Outcome::Forced, stragglers, closers);
        report.cause = Some(format!(
            "runtime starved: the drain had not finished {} ms after the trigger (hard deadline \
             {} ms); something blocks the runtime's worker threads",
            used.as_millis(),
            self.budget().hard_deadline().as_millis()
        ));
        let mut e = Event::new(EventKind::Exit, used, unix_ms);
        e.code = Some(1);
        report.timeline.push(e);
        let _ = self.sinks.emit(&report, true, until);
        std::process::exit(1);
    }
}

/// Arms the watchdog: at `origin + at`, unless the drain is Done (and, under `run`, its last
/// write is over), it writes a `forced` report and exits the process with code 1; its own
/// writes are bounded by `writes` (a share of the safety margin). A plain thread, so a
/// starved runtime cannot delay it.
pub(super) fn arm_watchdog(
    driver: Arc<Driver>,
    origin: std::time::Instant,
    at: Duration,
    writes: Duration,
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
            driver.watchdog_fire(fire_at + writes);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "lameduck: cannot start the watchdog thread");
    }
}
