//! What is still running: the requests, stalled responses and tasks named in the report
//! when the deadline (or the force, or the watchdog) cuts them.

use tokio::time::Instant;

use crate::guard::Core;
use crate::report::{Straggler, StragglerKind};
use crate::tasks::Tasks;

/// Everything still running at `now`: described requests, responses stalled on a slow
/// reader, undescribed guards, and tasks.
pub(super) fn collect(core: &Core, tasks: &Tasks, now: Instant, origin: Instant) -> Vec<Straggler> {
    let mut out = in_flight_work(core, now, origin);
    for (name, _, started) in tasks.running() {
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
pub(super) fn in_flight_work(core: &Core, now: Instant, origin: Instant) -> Vec<Straggler> {
    let age = |since: Instant| now.saturating_duration_since(since);
    let mut out = Vec::new();
    let registered = core.registered_requests();
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
    let stalled = core.observed().stalls().snapshot();
    for w in &stalled {
        let mut s = Straggler::new(StragglerKind::Response, w.describe(), age(w.since));
        s.peer = w.peer.map(|p| p.to_string());
        out.push(s);
    }
    let unnamed = core
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

/// Lets the tasks cut at the deadline recover (by `hard`, the hard deadline) before they are
/// aborted, and notes each recovery on its straggler.
pub(super) async fn recover(stragglers: &mut [Straggler], tasks: &Tasks, hard: Instant) {
    for (name, result) in tasks.recover_and_abort(hard).await {
        let task = |s: &&mut Straggler| {
            s.kind == StragglerKind::Task && s.name == name && s.recovery.is_none()
        };
        if let Some(s) = stragglers.iter_mut().find(task) {
            s.recovery = Some(result);
        }
    }
}
