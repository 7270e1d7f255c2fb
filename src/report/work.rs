//! Work the drain waited on or cut: the stragglers at the deadline, and what was in flight when
//! the propagation window held.

use serde::{Deserialize, Serialize};

use super::ActionResult;

/// What a straggler was: [`Straggler::kind`].
///
/// In JSON: `request`, `task`, `response`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StragglerKind {
    /// A request whose guard was still held.
    Request,
    /// A background task.
    Task,
    /// Response bytes handed to a connection of `lameduck::serve`, still waiting for the peer
    /// to read them; or an admin answer its peer had not taken when the process was about to
    /// exit (that connection was cut).
    Response,
}

impl StragglerKind {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

/// Work still running at the quiesce deadline or when the exit was forced, or an admin
/// connection cut at the exit with an answer its peer had not taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Straggler {
    /// `request`, `task`, or `response` (a connection of `lameduck::serve` whose response
    /// bytes were still waiting for the peer to read them, or an admin connection cut at the
    /// exit).
    pub kind: StragglerKind,
    /// For a request `METHOD /path`; for a task its name; for a response the peer and the
    /// bytes written on its connection so far.
    pub name: String,
    /// Age at the deadline, in milliseconds (for requests that started before the drain and
    /// were described late, a lower bound: the drain's age).
    pub age_ms: u64,
    /// The peer address, for requests whose connection is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// For tasks with a recovery action: `ok`, `error: <message>`, `panicked`, `aborted` or
    /// `timed_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<ActionResult>,
}

impl Straggler {
    /// The report names at most this many stragglers of each kind, the oldest; the rest are
    /// counted ([`StragglerCounts`]): a peer that leaves thousands of streams hanging must not
    /// make the report too large to write before the exit.
    pub const NAMED_PER_KIND: usize = 10;

    pub(crate) fn new(kind: StragglerKind, name: String, age: std::time::Duration) -> Self {
        Self {
            kind,
            name,
            age_ms: age.as_millis() as u64,
            peer: None,
            recovery: None,
        }
    }
}

/// How many stragglers of each kind there were: the report's `stragglers` names at most
/// [`Straggler::NAMED_PER_KIND`] of each, the oldest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StragglerCounts {
    /// Requests whose guard was still held (described or not).
    pub requests: u64,
    /// Background tasks.
    pub tasks: u64,
    /// Responses waiting for their peer, and admin answers cut at the exit.
    pub responses: u64,
}

impl StragglerCounts {
    /// Every straggler, named or not.
    pub fn total(&self) -> u64 {
        self.requests + self.tasks + self.responses
    }

    /// The count of `kind`.
    pub fn of(&self, kind: StragglerKind) -> u64 {
        match kind {
            StragglerKind::Request => self.requests,
            StragglerKind::Task => self.tasks,
            StragglerKind::Response => self.responses,
        }
    }

    /// `n` more of `kind`.
    pub(crate) fn add(&mut self, kind: StragglerKind, n: u64) {
        let c = match kind {
            StragglerKind::Request => &mut self.requests,
            StragglerKind::Task => &mut self.tasks,
            StragglerKind::Response => &mut self.responses,
        };
        *c += n;
    }
}

/// In-flight work that held the propagation commit: the quiet window and the evidence were
/// satisfied at `since_ms`, and the policy, which commits only with nothing in flight, waited
/// for what was in flight then. Part of [`EvidenceReport`](super::EvidenceReport) (`in_flight_hold`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InFlightHold {
    /// When the window and the evidence held, in milliseconds after the trigger.
    pub since_ms: u64,
    /// How long the commit then waited on in-flight work, in milliseconds: to the release of
    /// the last guard, or to `max`.
    pub waited_ms: u64,
    /// Guards in flight at `since_ms`: requests (until their response body is finished or
    /// dropped, so an open stream counts), and guards taken with `Drain::enter`.
    pub in_flight: u64,
    /// What was in flight at `since_ms`, the oldest first, at most [`InFlightHold::LISTED`]:
    /// requests by method and path (`(undescribed guard)` for one that started before the
    /// drain on a layer without `describe_requests`, or a `Drain::enter` guard) and responses
    /// still waiting for their peer to read them. `age_ms` is the age at `since_ms` (for work
    /// that started before the drain and was described late, a lower bound: the drain's age).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub work: Vec<Straggler>,
}

impl InFlightHold {
    /// The most entries [`work`](Self::work) lists; `in_flight` counts them all.
    pub const LISTED: usize = 16;

    /// One clause for the evidence line: how long, and what (the oldest three named).
    pub(crate) fn describe(&self) -> String {
        let mut what: Vec<String> = self
            .work
            .iter()
            .take(3)
            .map(|w| {
                let from = w
                    .peer
                    .as_ref()
                    .map_or_else(String::new, |p| format!(" from {p}"));
                // An age of the drain's own is a lower bound: the work began before it.
                let age = if w.age_ms >= self.since_ms {
                    "begun before the drain".to_owned()
                } else {
                    format!("open {:.1} s then", w.age_ms as f64 / 1000.0)
                };
                match (w.kind, w.name.as_str()) {
                    (StragglerKind::Request, "(undescribed guard)") => {
                        "an unnamed guard (a request begun before the drain: \
                         DrainLayer::describe_requests names it; or a Drain::enter guard)"
                            .to_owned()
                    }
                    (StragglerKind::Response, n) => {
                        format!("a response waiting for its peer to read it ({n}), {age}")
                    }
                    (_, n) => format!("{n}{from}, {age}"),
                }
            })
            .collect();
        let listed = self.work.len().min(3) as u64;
        if self.in_flight > listed {
            what.push(format!("{} more", self.in_flight - listed));
        }
        format!(
            "held {} ms by in-flight work after the window held at {} ms: {} in flight then ({})",
            self.waited_ms,
            self.since_ms,
            self.in_flight,
            what.join("; ")
        )
    }
}
