//! The drive, step by step: propagation, stopping, the wait for zero, closing, Done.

use std::sync::Arc;

use tokio::time::Instant;

use super::Driver;
use crate::closers::CloserResult;
use crate::phase::{CommitReason, EventKind, Phase};
use crate::propagation::Commit;
use crate::readiness::ReadinessWhileDraining;
use crate::report::EvidenceKind;
use crate::report::{InFlightHold, Outcome, Straggler, StragglerKind};

impl Driver {
    /// The one driver task, spawned by the first trigger with its origin: each step below in
    /// turn, then the report.
    ///
    /// The deadlines are re-read at each step (`Deadlines`): a Pod deletion with a shorter
    /// grace (feature `kube`) moves them earlier, also mid-drain. `build` proved
    /// `now + grace` representable; should the clock still refuse, a deadline is now (the
    /// drain ends early, named) rather than a panic in the driver.
    pub(super) async fn drive(self: Arc<Self>, origin: Instant) {
        // Events the Kubernetes watch saw before the trigger (feature `kube`).
        self.flush_early_events(origin);
        self.arm_hurry(origin);
        let reason = self.propagate(origin).await;
        self.stop_accepting(reason);
        let (stragglers, deadline_hit) = self.wait_for_zero(origin).await;
        self.set_phase(Phase::Closing);
        let closers = self.close(self.deadlines.hard(origin)).await;
        let outcome = if self.is_forced() {
            Outcome::Forced
        } else if deadline_hit {
            // Exit 1 even if every cut task's recovery worked: a drain that needs a salvage at
            // the deadline did not fit its budget, and alerting should see that (a task that
            // returns on `hurry` keeps it clean).
            Outcome::DeadlineExceeded
        } else if closers.iter().any(|c| !c.is_ok()) {
            Outcome::CloserFailed
        } else {
            Outcome::Clean
        };
        self.done(origin, outcome, stragglers, closers).await;
    }

    /// Fires the hurry token `hurry_lead` before the quiesce deadline (or with the deadline).
    fn arm_hurry(self: &Arc<Self>, origin: Instant) {
        let hurry = self.tokens.hurry.clone();
        let deadline = self.tokens.deadline.clone();
        let driver = Arc::clone(self);
        tokio::spawn(async move {
            let mut phase = driver.subscribe();
            tokio::select! {
                () = driver.deadlines.until_hurry(origin) => hurry.cancel(),
                () = deadline.cancelled() => hurry.cancel(),
                // Holds the driver (to re-read the deadlines): not past the end of the drain.
                _ = phase.wait_for(|p| *p == Phase::Done) => {}
            }
        });
    }

    /// Step 1: waits for the propagation policy (or the force), records what it went on.
    async fn propagate(&self, origin: Instant) -> CommitReason {
        let (mut evidence, never_served) = {
            let st = self.lock();
            let evidence = st
                .evidence
                .clone()
                .expect("the evidence is taken with the origin");
            (evidence, st.never_served)
        };
        // What was in flight when the window held, should the commit wait for it.
        let mut in_flight_then = None;
        let commit = if never_served {
            // Never ready, so never in any proxy's endpoints: nothing to wait for.
            Commit::new(CommitReason::NeverServed, EvidenceKind::NeverServed, None)
        } else {
            let on_hold = |at: Instant| {
                in_flight_then = Some((self.core.counter.count(), self.in_flight_work(at, origin)));
            };
            tokio::select! {
            r = self.policy.commit(self.core, origin, &mut evidence, self.deadlines.link(), || self.deadlines.max_at(origin), on_hold) => r,
            () = self.tokens.force.cancelled() => Commit::new(CommitReason::Forced, EvidenceKind::Cut, None),
            }
        };
        let (reason, kind) = (commit.reason, commit.kind);
        // What arrived up to the commit is part of what it went on.
        crate::propagation::Policy::refit(self.core, origin, &mut evidence);
        let mut committed = evidence.report(kind, crate::propagation::silence(self.core, origin));
        if let (Some(since), Some((count, mut work))) = (commit.held_since, in_flight_then) {
            work.sort_by_key(|w| std::cmp::Reverse(w.age_ms));
            work.truncate(InFlightHold::LISTED);
            committed.in_flight_hold = Some(InFlightHold {
                since_ms: since.saturating_duration_since(origin).as_millis() as u64,
                waited_ms: since.elapsed().as_millis() as u64,
                in_flight: count as u64,
                work,
            });
        }
        self.endpoint_evidence(&mut committed, origin);
        let committed = crate::report::evidence_json::fixed_only(committed);
        let mut e = self.event(EventKind::PropagationDone);
        e.reason = Some(reason);
        // The evidence rides on its event's log line and in the timeline.
        e.detail = Some(committed.describe());
        self.lock().committed = Some(committed);
        self.push(e);
        reason
    }

    /// Step 2: `stopped_accepting`, the late readiness flip, the stop token.
    fn stop_accepting(&self, reason: CommitReason) {
        let mut e = self.event(EventKind::StoppedAccepting);
        e.reason = Some(reason);
        self.push(e);
        match self.readiness {
            ReadinessWhileDraining::ServingUntilStop => {
                self.push(self.event(EventKind::ReadinessFlipped));
            }
            ReadinessWhileDraining::Auto => {
                self.push_detail(EventKind::ReadinessFlipped, "for kubelet's probe");
            }
            _ => {}
        }
        self.set_phase(Phase::StoppedAccepting);
        self.tokens.stop.cancel();
        self.tasks.tracker.close();
    }

    /// Step 3: waits for zero (requests and tasks), or the quiesce deadline, where what is
    /// left is named and cut. Returns the stragglers and whether the deadline hit.
    async fn wait_for_zero(&self, origin: Instant) -> (Vec<Straggler>, bool) {
        let mut stragglers = Vec::new();
        let mut deadline_hit = false;
        if !self.is_forced() {
            let requests = async {
                self.core.wait_zero().await;
                self.push(self.event(EventKind::InFlightZero));
            };
            let tasks = async {
                self.tasks.tracker.wait().await;
                self.push(self.event(EventKind::TasksDone));
            };
            let both = async { tokio::join!(requests, tasks) };
            tokio::select! {
                _ = both => {}
                () = self.deadlines.until_quiesce(origin) => deadline_hit = true,
                () = self.tokens.force.cancelled() => {}
            }
        }
        if deadline_hit {
            stragglers = self.collect_stragglers(self.deadlines.quiesce(origin), origin);
            self.push_detail(
                EventKind::DeadlineExceeded,
                format!("{} stragglers", stragglers.len()),
            );
            self.tokens.deadline.cancel();
            let hard = self.deadlines.hard(origin);
            for (name, result) in self.tasks.recover_and_abort(hard).await {
                if let Some(s) = stragglers.iter_mut().find(|s| {
                    s.kind == StragglerKind::Task && s.name == name && s.recovery.is_none()
                }) {
                    s.recovery = Some(result);
                }
            }
        }
        if self.is_forced() {
            // What the force cuts is named, as at the deadline (unless the deadline came first).
            if !deadline_hit {
                stragglers = self.collect_stragglers(Instant::now(), origin);
            }
            self.tokens.deadline.cancel();
            self.tasks.abort_all();
        }
        (stragglers, deadline_hit)
    }

    /// Step 4: the closers, in reverse order (recorded `skipped` once forced).
    async fn close(&self, hard: Instant) -> Vec<CloserResult> {
        self.closers
            .run(hard, &self.tokens.force, |r: &CloserResult| {
                let mut e = self.event(EventKind::ResourceClosed);
                e.name = Some(r.name.clone());
                e.detail = Some(r.result.to_string());
                self.push(e);
            })
            .await
    }

    /// Step 5: the Done event, the report, its emission, then the phase.
    async fn done(
        &self,
        origin: Instant,
        outcome: Outcome,
        stragglers: Vec<Straggler>,
        closers: Vec<CloserResult>,
    ) {
        self.push_detail(EventKind::Done, outcome.as_str());
        self.lock().timeline.freeze();
        let mut report = self.build_report(origin, outcome, stragglers, closers);
        // Under `run`, the stderr line waits for the exit, so it is written once and complete.
        let stderr = !self.exit.is_owned();
        if !self.exit.emit(&mut report, stderr, self.sink_deadline()).await {
            // The watchdog took over: it writes the report and exits the process.
            return;
        }
        // Before the phase turns Done, so whoever awaits Done finds the histograms recorded.
        if let Some(o) = &self.observer {
            o.done(&report);
        }
        self.lock().report = Some(report);
        self.set_phase(Phase::Done);
        // The report holds them now; the core block is leaked, its growth must not be.
        self.core.release_drain_state();
    }
}
