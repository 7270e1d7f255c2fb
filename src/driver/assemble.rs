//! The report: what is still running at the deadline, and the document put together from
//! every part's record.

use tokio::time::Instant;

use super::Driver;
use crate::closers::CloserResult;
use crate::report::{
    AfterFlipReport, BudgetReport, DrainReport, Outcome, PodInfo, SignalReceipt,
    Straggler, StragglerKind,
};

impl Driver {
    /// Everything still running at `now`: described requests, responses stalled on a slow
    /// reader, undescribed guards, and tasks.
    pub(super) fn collect_stragglers(&self, now: Instant, origin: Instant) -> Vec<Straggler> {
        let mut out = self.in_flight_work(now, origin);
        for (name, _, started) in self.tasks.running() {
            out.push(Straggler::new(
                StragglerKind::Task,
                name,
                now.saturating_duration_since(started),
            ));
        }
        out
    }

    /// What holds in-flight guards at `now`: requests (named, or an undescribed guard each),
    /// and responses waiting for their peer to read them, with their ages.
    pub(super) fn in_flight_work(&self, now: Instant, origin: Instant) -> Vec<Straggler> {
        let age = |since: Instant| now.saturating_duration_since(since);
        let mut out = Vec::new();
        let registered = self.core.registered_requests();
        let named = registered.len();
        for r in registered {
            let mut s = Straggler::new(
                StragglerKind::Request,
                format!("{} {}", r.method, r.path),
                age(r.started.unwrap_or(origin)),
            );
            s.peer = r.peer.map(|p| p.to_string());
            out.push(s);
        }
        // Responses handed to the connection whose bytes still wait for the peer to read them.
        let stalled = self.core.observed().stalls().snapshot();
        for w in &stalled {
            let mut s = Straggler::new(StragglerKind::Response, w.describe(), age(w.since));
            s.peer = w.peer.map(|p| p.to_string());
            out.push(s);
        }
        let unnamed = self
            .core
            .counter
            .count()
            .saturating_sub(named)
            .saturating_sub(stalled.len());
        for _ in 0..unnamed {
            out.push(Straggler::new(
                StragglerKind::Request,
                "(undescribed guard)".to_owned(),
                age(origin),
            ));
        }
        out
    }

    /// The report of a drain that started at `origin`, with its advice.
    pub(super) fn build_report(
        &self,
        origin: Instant,
        outcome: Outcome,
        stragglers: Vec<Straggler>,
        closers: Vec<CloserResult>,
    ) -> DrainReport {
        let after_flip = AfterFlipReport::from_core(self.core, origin);
        let used = origin.elapsed();
        let mut propagation = self.policy.report();
        let (trigger, timeline, receipt, noticed, server) = {
            let st = self.lock();
            propagation.evidence = st.committed.clone();
            (
                st.trigger,
                st.timeline.events().to_vec(),
                st.receipt,
                st.noticed,
                st.server.clone(),
            )
        };
        let signal_receipt = receipt.map(|received| SignalReceipt {
            received_unix_ms: received,
            noticed_unix_ms: noticed,
            notice_delay_ms: noticed.map(|n| n.saturating_sub(received)),
        });
        let mut report = DrainReport {
            outcome,
            trigger,
            exit_code: outcome.exit_code(),
            readiness_policy: self.readiness,
            budget: BudgetReport::new(&self.deadlines.budget(), used),
            propagation,
            timeline,
            after_flip,
            stragglers,
            tasks: self.tasks.ended(),
            closers,
            pod: PodInfo::from_env(),
            advice: Vec::new(),
            cause: None,
            signal_receipt,
            stop_signal_wait: None,
            sink_errors: Vec::new(),
            proxy_label: self.proxy_label.clone(),
            server,
            probe_sources: self.probe_sources.snapshot(),
        };
        report.budget.deletion = self.deadlines.deletion(origin);
        report.advice = crate::advice::advise(&report);
        report
    }
}
