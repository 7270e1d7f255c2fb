//! The admin endpoint's seam (feature `admin`): the part of the coordinator the router and
//! its server are handed when built — the exit holds, the probe-source table and the weak
//! evidence a `/drain` caller waits on. What else they do goes through the public handle.

use std::sync::Arc;

use super::{Drain, Readiness};
use crate::lifecycle::{Driver, ExitHolds};
use crate::readiness::sources::classify::ProbeCaller;
use crate::readiness::ReadinessAnswer;
use crate::vocab::phase::Phase;

/// What the admin router and [`AdminServe`](crate::admin::AdminServe) reach beyond the public
/// handle. Built from it by [`AdminBuilder::new`](crate::AdminBuilder::new), owned by the
/// router's state and the server.
#[derive(Clone)]
pub(crate) struct AdminSeam {
    driver: Arc<Driver>,
    readiness: Readiness,
}

impl AdminSeam {
    /// The parts of `drain` the admin endpoint reaches.
    pub(crate) fn new(drain: &Drain) -> Self {
        Self {
            driver: Arc::clone(&drain.inner.driver),
            readiness: drain.readiness(),
        }
    }

    /// Says, once per call, that a `/drain` caller is about to wait on weak evidence: the
    /// propagation policy cannot commit before `max`, so the answer comes `max` after the
    /// trigger. A tracing event, and one stderr line when no subscriber would print it.
    pub(crate) fn say_weak_wait(&self, wait: &str) {
        if self.driver.progress().phase() >= Phase::StoppedAccepting {
            return;
        }
        let driver = &self.driver;
        let Some(e) = driver.evidence_now() else {
            return;
        };
        let (crate::report::EvidenceKind::Max, Some(weak)) = (e.kind, e.weak) else {
            return;
        };
        let max_ms = driver.policy_report().max_ms;
        tracing::info!(
            wait,
            weak = weak.as_str(),
            cause = weak.cause(),
            max_ms,
            "lameduck: /drain waits for the propagation max unless the traffic during the drain says more"
        );
        if !tracing::dispatcher::has_been_set() {
            let line = format!(
                "lameduck: /drain (wait={wait}) answers when the drain is done: the evidence so \
                 far is weak ({}: {}), so it waits for max, {max_ms} ms after the trigger, \
                 unless the traffic during the drain says more; `/drain?wait=none` answers at \
                 once, `/status` shows the drain\n",
                weak.as_str(),
                weak.cause()
            );
            // Bounded, and off the runtime: a stalled stderr must not hold the answer.
            tokio::task::spawn_blocking(move || {
                crate::report::stderr_bounded(line, crate::report::STDERR_WAIT)
            });
        }
    }

    /// Answers owed to admin callers before the process exits.
    pub(crate) fn exit_holds(&self) -> &ExitHolds {
        self.driver.exit().holds()
    }

    /// Readiness as a classified `/readyz` caller sees it; the caller is counted in the table
    /// of probe sources.
    pub(crate) fn readiness_for_probe(&self, probe: &ProbeCaller) -> ReadinessAnswer {
        let phase = self.driver.progress().phase();
        self.driver
            .record()
            .probe_sources()
            .record(probe, phase == Phase::Draining);
        self.readiness
            .readiness_in(phase, probe.caller(), &probe.describe())
    }
}
