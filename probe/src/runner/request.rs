//! Sending: the schedule per kind, and one request from its first attempt to its stored
//! record.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::MissedTickBehavior;

use super::{ms, Control, Shared};
use crate::config::{ConnectionMode, Kind};
use crate::record::{Failure, Outcome, Record, Retry};
use crate::request::{exchange, Plan, Seen};

/// Sends `kind` requests at `rate` per second until `deadline` or a stop.
pub(super) async fn schedule(
    kind: Kind,
    rate: f64,
    deadline: tokio::time::Instant,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
) {
    let mut control = shared.handle.control();
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::from_std(shared.origin), period);
    // Catch up on ticks missed under load so the rate holds; the in-flight cap bounds a burst.
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    loop {
        tokio::select! {
            biased;
            _ = control.wait_for(|c| *c >= Control::StopSending) => return,
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tick.tick() => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        // Ticks keep coming while off and are skipped, so each phase starts on the beat.
        if let Some(o) = shared.config.on_off {
            if !o.sending(shared.origin.elapsed()) {
                continue;
            }
        }
        let stats = shared.handle.stats();
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                stats.request_sent();
                tokio::spawn(one_request(kind, shared.clone(), permit));
            }
            Err(_) => stats.request_not_sent(),
        }
    }
}

/// Runs one request and stores its record; the permit is released after the store.
async fn one_request(kind: Kind, shared: Arc<Shared>, permit: OwnedSemaphorePermit) {
    // Relaxed: the sequence number only has to be unique.
    let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
    let id = format!("{}-{seq:06}", shared.run_tag);
    let keepalive = match shared.config.connections {
        ConnectionMode::KeepAlive => true,
        ConnectionMode::Fresh => false,
        ConnectionMode::Mixed => seq % 2 == 0,
    };
    let kind_index = Kind::ALL.iter().position(|&k| k == kind).unwrap_or(0);
    let plan = Plan {
        id: &id,
        kind,
        path: &shared.parsed.paths[kind_index],
        host: &shared.parsed.host,
        label: &shared.config.label,
        http: shared.config.http,
        keepalive,
    };
    let first = attempt(&shared, &plan).await;
    let retry = if first.outcome == Outcome::Failed && shared.config.retry_idempotent {
        Some(retry(&shared, &plan).await)
    } else {
        None
    };
    let record = first.into_record(&shared, &plan, retry);
    let draining = record.served_by_draining().then_some(record.reused);
    let stats = shared.handle.stats();
    stats.request_ended(record.outcome, draining);
    shared.records.lock().expect("records lock").push(record);
    stats.request_stored();
    drop(permit);
}

/// Like a client retrying an idempotent GET: once, on a connection of its own, under an id
/// of its own so a server log tells the two attempts apart.
async fn retry(shared: &Shared, plan: &Plan<'_>) -> Retry {
    let retry_id = format!("{}-retry", plan.id);
    let retry_plan = Plan {
        id: &retry_id,
        keepalive: false,
        ..*plan
    };
    let second = attempt(shared, &retry_plan).await;
    Retry {
        id: retry_id,
        start_ms: second.start_ms,
        end_ms: second.end_ms,
        latency_us: second.latency_us(),
        status: second.seen.status,
        outcome: second.outcome,
        failure: second.failure,
        error: second.error,
        conn: second.seen.conn,
        instance: second.seen.instance,
        phase: second.seen.phase,
    }
}

/// One attempt at a request, as it ended.
struct Attempt {
    start_ms: f64,
    end_ms: Option<f64>,
    outcome: Outcome,
    failure: Option<Failure>,
    error: Option<String>,
    seen: Seen,
}

impl Attempt {
    fn latency_us(&self) -> Option<u64> {
        self.end_ms
            .map(|end| ((end - self.start_ms).max(0.0) * 1000.0).round() as u64)
    }
    /// The record of the request `plan` describes, this being its first attempt.
    fn into_record(self, shared: &Shared, plan: &Plan<'_>, retry: Option<Retry>) -> Record {
        let latency_us = self.latency_us();
        let seen = self.seen;
        Record {
            id: plan.id.to_owned(),
            kind: plan.kind,
            label: shared.config.label.clone(),
            mode: if plan.keepalive {
                ConnectionMode::KeepAlive
            } else {
                ConnectionMode::Fresh
            },
            start_ms: self.start_ms,
            end_ms: self.end_ms,
            status: seen.status,
            outcome: self.outcome,
            failure: self.failure,
            error: self.error,
            reused: seen.reused,
            conn: seen.conn,
            instance: seen.instance,
            phase: seen.phase,
            bytes: seen.bytes,
            rerouted: seen.rerouted,
            latency_us,
            window: None,
            start_unix_ms: None,
            proxy_label: shared.config.proxy_label.clone(),
            retry,
            connection_close: seen.told_close,
        }
    }
}

/// Sends `plan` once; an abort makes it `unfinished`.
async fn attempt(shared: &Shared, plan: &Plan<'_>) -> Attempt {
    let start_ms = ms(shared.origin.elapsed());
    let mut seen = Seen::default();
    let mut control = shared.handle.control();
    let result = {
        let request = exchange(&shared.conns, plan, &mut seen);
        tokio::pin!(request);
        tokio::select! {
            result = &mut request => Some(result),
            _ = control.wait_for(|c| *c == Control::Abort) => None,
        }
    };
    let end_ms = ms(shared.origin.elapsed());
    let (outcome, failure, error, end_ms) = match result {
        Some(Ok(())) => (Outcome::Ok, None, None, Some(end_ms)),
        Some(Err((failure, error))) => (Outcome::Failed, Some(failure), Some(error), Some(end_ms)),
        None => (
            Outcome::Unfinished,
            None,
            Some(unfinished_reason(&seen)),
            None,
        ),
    };
    Attempt {
        start_ms,
        end_ms,
        outcome,
        failure,
        error,
        seen,
    }
}

fn unfinished_reason(seen: &Seen) -> String {
    match (seen.conn, seen.status) {
        (None, _) => "still connecting when the probe stopped waiting".to_owned(),
        (Some(_), None) => "no response yet when the probe stopped waiting".to_owned(),
        (Some(_), Some(status)) => format!(
            "status {status} received, body still streaming ({} bytes) when the probe stopped waiting",
            seen.bytes
        ),
    }
}
