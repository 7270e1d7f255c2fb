//! What is still running: the requests, stalled responses and tasks named in the report
//! when the deadline (or the force, or the watchdog) cuts them — the oldest few of each kind,
//! and how many of each there were.

use tokio::time::Instant;

use crate::hot::guard::Core;
use crate::report::{Straggler, StragglerCounts, StragglerKind};
use crate::work::tasks::TaskSet;

/// What was cut: the named stragglers (at most [`Straggler::NAMED_PER_KIND`] of each kind,
/// the oldest) and the counts of all.
#[derive(Debug, Default)]
pub(super) struct Cut {
    pub(super) named: Vec<Straggler>,
    pub(super) counts: StragglerCounts,
}

/// Everything still running at `now`: described requests, responses stalled on a slow
/// reader, undescribed guards, and tasks.
pub(super) fn collect(core: &Core, tasks: &TaskSet, now: Instant, origin: Instant) -> Cut {
    let mut cut = in_flight_work(core, now, origin, Straggler::NAMED_PER_KIND);
    let (running, total) = tasks.oldest_running(Straggler::NAMED_PER_KIND);
    cut.counts.add(StragglerKind::Task, total as u64);
    for (name, _, started) in running {
        cut.named.push(Straggler::new(
            StragglerKind::Task,
            name,
            now.saturating_duration_since(started),
        ));
    }
    cut
}

/// What holds in-flight guards at `now`, the `keep` oldest of each kind named: requests
/// (described, or an undescribed guard each), and responses waiting for their peer to read
/// them, with their ages.
pub(super) fn in_flight_work(core: &Core, now: Instant, origin: Instant, keep: usize) -> Cut {
    let age = |since: Instant| now.saturating_duration_since(since);
    let mut cut = Cut::default();
    let (registered, described) = core.oldest_registered(keep);
    let shown = registered.len();
    for r in registered {
        let mut s = Straggler::new(
            StragglerKind::Request,
            format!("{} {}", r.method, r.path),
            age(r.started.unwrap_or(origin)),
        );
        s.peer = r.peer.map(|p| p.to_string());
        cut.named.push(s);
    }
    // Responses handed to the connection whose bytes still wait for the peer to read them.
    let (stalled, stalls) = core.observed().stalls().oldest(keep);
    for w in &stalled {
        let mut s = Straggler::new(StragglerKind::Response, w.describe(), age(w.since));
        s.peer = w.peer.map(|p| p.to_string());
        cut.named.push(s);
    }
    let unnamed = core
        .counter
        .count()
        .saturating_sub(described)
        .saturating_sub(stalls);
    for _ in 0..unnamed.min(keep - shown) {
        cut.named.push(Straggler::new(
            StragglerKind::Request,
            "(undescribed guard)".to_owned(),
            age(origin),
        ));
    }
    cut.counts
        .add(StragglerKind::Request, (described + unnamed) as u64);
    cut.counts.add(StragglerKind::Response, stalls as u64);
    cut
}

/// Lets the tasks cut at the deadline recover (by `hard`, the hard deadline) before they are
/// aborted, and notes each recovery on its straggler (those named).
pub(super) async fn recover(stragglers: &mut [Straggler], tasks: &TaskSet, hard: Instant) {
    for (name, result) in tasks.recover_and_abort(hard).await {
        let task = |s: &&mut Straggler| {
            s.kind == StragglerKind::Task && s.name == name && s.recovery.is_none()
        };
        if let Some(s) = stragglers.iter_mut().find(task) {
            s.recovery = Some(result);
        }
    }
}
