//! The numbers a rollout is judged by, computed from the records.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{ConnectionMode, HttpVersion, Kind};
use crate::latency::{self, LatencyRow};
use crate::record::{Outcome, Record};

mod table;

/// Request counts by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// All requests sent.
    pub total: u64,
    /// Outcome `ok`.
    pub succeeded: u64,
    /// Outcome `failed`.
    pub failed: u64,
    /// Outcome `unfinished`.
    pub unfinished: u64,
}

impl Counts {
    fn add(&mut self, outcome: Outcome) {
        self.total += 1;
        match outcome {
            Outcome::Ok => self.succeeded += 1,
            Outcome::Failed => self.failed += 1,
            Outcome::Unfinished => self.unfinished += 1,
        }
    }
}

/// Requests one instance answered (by its `x-instance` header).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceCounts {
    /// The `x-instance` value.
    pub instance: String,
    /// Requests it answered (any status).
    pub requests: u64,
    /// Of those, answered while it was draining (phase header present and not `serving`).
    pub draining: u64,
    /// Of those, with a non-2xx status or a broken body.
    pub failed: u64,
    /// Start of the first request it answered, ms since the probe started.
    pub first_ms: f64,
    /// Start of the last request it answered, ms since the probe started.
    pub last_ms: f64,
}

/// The first request that failed, by the time it failed. The probe never retries, so this is
/// the first failure a client without retries would have seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstFailure {
    /// When it failed, ms since the probe started.
    pub at_ms: f64,
    /// Its request id.
    pub id: String,
    /// Its kind.
    pub kind: Kind,
    /// The error.
    pub error: String,
    /// Whether it went on a reused connection.
    pub reused: bool,
    /// The probe's connection id, if it got a connection.
    pub conn: Option<u64>,
    /// The instance that answered, if any did.
    pub instance: Option<String>,
}

/// The run in numbers; [`Summary::table`] prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Summary {
    /// The target as configured.
    pub target: String,
    /// The traffic-path label.
    pub label: String,
    /// What sat between the probe and the service, as the user named it (`--proxy-label`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_label: Option<String>,
    /// HTTP version spoken.
    pub http: HttpVersion,
    /// Connection mode configured.
    pub connections: ConnectionMode,
    /// Wall-clock time the probe started (ms since the Unix epoch); record offsets count from it.
    pub started_unix_ms: u64,
    /// From start until the last record was settled, in ms.
    pub elapsed_ms: f64,
    /// `true` when sending stopped before `duration` ([`ProbeHandle::stop`] or Ctrl-C).
    ///
    /// [`ProbeHandle::stop`]: crate::ProbeHandle::stop
    pub stopped_early: bool,
    /// All requests by outcome.
    pub all: Counts,
    /// Short requests by outcome.
    pub short: Counts,
    /// Slow requests by outcome.
    pub slow: Counts,
    /// Streaming requests by outcome.
    pub stream: Counts,
    /// Requests that went on a connection opened for them.
    pub on_new_connection: Counts,
    /// Requests that went on a connection that had carried a request before.
    pub on_reused_connection: Counts,
    /// Connections the probe opened.
    pub connections_opened: u64,
    /// Requests answered by a draining instance on a reused connection.
    pub draining_reused: u64,
    /// Requests answered by a draining instance on a new connection: some path still routed
    /// new connections to it.
    pub draining_new: u64,
    /// Requests moved to another connection before anything was sent (see
    /// [`Record::rerouted`]).
    pub rerouted: u64,
    /// Requests not sent because `max_in_flight` requests were already running.
    pub not_sent: u64,
    /// Failed requests retried (`retry_idempotent`); they stay counted as failed above.
    #[serde(default)]
    pub retried: u64,
    /// Of those, failed, then succeeded on retry.
    #[serde(default)]
    pub retry_succeeded: u64,
    /// Of those, failed again on retry (or were left unfinished).
    #[serde(default)]
    pub retry_failed: u64,
    /// Failures by where they failed and the error's first words (`status: status 503 ...`).
    pub failures: BTreeMap<String, u64>,
    /// Per instance, in order of first appearance.
    pub instances: Vec<InstanceCounts>,
    /// The first failure, when there was one.
    pub first_failure: Option<FirstFailure>,
    /// First draining answer's start to last draining answer's end, ms since the probe
    /// started; `None` when no answer said draining. Bounds the latency windows.
    #[serde(default)]
    pub drain_span_ms: Option<[f64; 2]>,
    /// Latency of `ok` requests per kind and drain window (p50, p99, max).
    #[serde(default)]
    pub latency: Vec<LatencyRow>,
}

/// Everything about the run that is not in the records.
#[derive(Debug, Clone)]
pub(crate) struct RunFacts {
    pub(crate) target: String,
    pub(crate) label: String,
    pub(crate) proxy_label: Option<String>,
    pub(crate) http: HttpVersion,
    pub(crate) connections: ConnectionMode,
    pub(crate) started_unix_ms: u64,
    pub(crate) elapsed_ms: f64,
    pub(crate) stopped_early: bool,
    pub(crate) connections_opened: u64,
    pub(crate) not_sent: u64,
}

impl Summary {
    pub(crate) fn new(records: &[Record], facts: RunFacts) -> Self {
        let mut summary = Summary {
            target: facts.target,
            label: facts.label,
            proxy_label: facts.proxy_label,
            http: facts.http,
            connections: facts.connections,
            started_unix_ms: facts.started_unix_ms,
            elapsed_ms: facts.elapsed_ms,
            stopped_early: facts.stopped_early,
            all: Counts::default(),
            short: Counts::default(),
            slow: Counts::default(),
            stream: Counts::default(),
            on_new_connection: Counts::default(),
            on_reused_connection: Counts::default(),
            connections_opened: facts.connections_opened,
            draining_reused: 0,
            draining_new: 0,
            rerouted: 0,
            not_sent: facts.not_sent,
            retried: 0,
            retry_succeeded: 0,
            retry_failed: 0,
            failures: BTreeMap::new(),
            instances: Vec::new(),
            first_failure: None,
            drain_span_ms: latency::drain_span(records).map(|(a, b)| [a, b]),
            latency: latency::latency_rows(records),
        };
        let mut instance_index: BTreeMap<&str, usize> = BTreeMap::new();
        for r in records {
            summary.count_outcome(r);
            if let Some(instance) = &r.instance {
                summary.count_instance(&mut instance_index, instance, r);
            }
            if r.outcome == Outcome::Failed {
                summary.note_failure(r);
            }
        }
        summary
    }

    /// Adds one record to the outcome counts: by kind, by connection, draining, rerouted and
    /// retried.
    fn count_outcome(&mut self, r: &Record) {
        self.all.add(r.outcome);
        match r.kind {
            Kind::Short => self.short.add(r.outcome),
            Kind::Slow => self.slow.add(r.outcome),
            Kind::Stream => self.stream.add(r.outcome),
        }
        if r.conn.is_some() {
            if r.reused {
                self.on_reused_connection.add(r.outcome);
            } else {
                self.on_new_connection.add(r.outcome);
            }
        }
        if r.served_by_draining() {
            if r.reused {
                self.draining_reused += 1;
            } else {
                self.draining_new += 1;
            }
        }
        self.rerouted += u64::from(r.rerouted > 0);
        if let Some(retry) = &r.retry {
            self.retried += 1;
            if retry.outcome == Outcome::Ok {
                self.retry_succeeded += 1;
            } else {
                self.retry_failed += 1;
            }
        }
    }

    /// Adds one record to the counts of the instance that answered it; `index` keeps where
    /// each instance is in `instances` (order of first appearance).
    fn count_instance<'r>(
        &mut self,
        index: &mut BTreeMap<&'r str, usize>,
        instance: &'r str,
        r: &Record,
    ) {
        let i = *index.entry(instance).or_insert_with(|| {
            self.instances.push(InstanceCounts {
                instance: instance.to_owned(),
                requests: 0,
                draining: 0,
                failed: 0,
                first_ms: r.start_ms,
                last_ms: r.start_ms,
            });
            self.instances.len() - 1
        });
        let counts = &mut self.instances[i];
        counts.requests += 1;
        counts.draining += u64::from(r.served_by_draining());
        counts.failed += u64::from(r.outcome == Outcome::Failed);
        counts.first_ms = counts.first_ms.min(r.start_ms);
        counts.last_ms = counts.last_ms.max(r.start_ms);
    }

    /// Adds a failed record to the failure groups, and keeps it if it failed first.
    fn note_failure(&mut self, r: &Record) {
        *self.failures.entry(failure_key(r)).or_default() += 1;
        let at_ms = r.end_ms.unwrap_or(r.start_ms);
        let earlier = self
            .first_failure
            .as_ref()
            .is_none_or(|first| at_ms < first.at_ms);
        if earlier {
            self.first_failure = Some(FirstFailure {
                at_ms,
                id: r.id.clone(),
                kind: r.kind,
                error: r.error.clone().unwrap_or_default(),
                reused: r.reused,
                conn: r.conn,
                instance: r.instance.clone(),
            });
        }
    }

    /// `true` when nothing failed and nothing was left unfinished.
    pub fn is_clean(&self) -> bool {
        self.all.failed == 0 && self.all.unfinished == 0
    }

    /// Counts for one kind.
    pub fn kind(&self, kind: Kind) -> Counts {
        match kind {
            Kind::Short => self.short,
            Kind::Slow => self.slow,
            Kind::Stream => self.stream,
        }
    }
}

/// Groups failures by where they failed and the error without the addresses and numbers
/// that would make every line unique.
fn failure_key(r: &Record) -> String {
    let failure = r.failure.map(|f| f.as_str()).unwrap_or("unknown");
    let error = r.error.as_deref().unwrap_or("");
    // The last cause is the most specific ("Connection refused (os error 111)").
    let cause = error.rsplit(": ").next().unwrap_or(error);
    let cause: String = cause.chars().take(80).collect();
    format!("{failure}: {cause}")
}
