//! What the propagation commit went on, as the report and `/status` show it: data, filled in
//! by the evidence (`evidence/report.rs`) and the EndpointSlice link.

use serde::{Deserialize, Serialize};

/// Why the arrival data cannot say how long to wait.
///
/// In JSON: `no_connection_data`, `too_few_slots`, `too_sparse`, `new_path`,
/// `kept_connections`, `too_many_peers`.
///
/// A new reason touches three files: this one (the variant, its place in `ALL` and
/// `BINDING_ORDER`, its [`cause`](Self::cause)), the path fit that finds it
/// (`propagation/evidence/path.rs`), and its advice if it has its own
/// (`report/rules/evidence.rs`); the names check and the evidence's choice of the binding path
/// read the lists here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WeakEvidence {
    /// No connection was ever counted: no server counted them (`lameduck::serve`,
    /// `lameduck::axum_serve` and `ConnMeta::accepted` do; axum's own `ConnectInfo` hook
    /// cannot) — a worker with no HTTP, or a raw `axum::serve`.
    NoConnectionData,
    /// The process had been serving for less than 15 s before the trigger: too short a window
    /// to have seen the traffic's slower phases.
    TooFewSlots,
    /// New connections were too rare before the trigger: the silence needed for confidence
    /// is longer than `max`.
    TooSparse,
    /// A peer that sent nothing in the window before the trigger kept opening connections
    /// after it (more than a reconnect wave of the connections it had open): some proxy still
    /// routes it here, and there is no rate of its own to weigh its silence by.
    NewPath,
    /// A path kept connections alive at the trigger (a client pool, or a proxy that pools its
    /// upstream connections): once the drain closes them, the client opens new ones when its
    /// own demand needs them — a pool that takes its most recent idle connection first at its
    /// next concurrency peak, however late — so no silence bounds when it next connects
    /// through a proxy that may still route here, whatever it did since the trigger (an L4
    /// pool whose demand grows opens as many new connections as an L7 router).
    /// [`PathEvidence::kept_alive`] and `open_now` say how many. Only the EndpointSlice
    /// (feature `kube`) with a configured proxy allowance, or a fallback, can end such a drain
    /// before `max`.
    KeptConnections,
    /// More peers were live at once (active within the last 32 s, or holding a connection)
    /// than the arrival table tells apart (63), or connections came with no peer address (a
    /// custom accept loop that passes none): those share one row (`peer` = `other`), whose
    /// silence proves nothing about its sparsest peer — a dense peer that stopped would hide a
    /// sparse one still routed here.
    TooManyPeers,
}

/// How a path (a peer address) reaches the process, as its arrivals show.
///
/// In JSON: `per_request`, `connections`, `pool`, `new`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PathRouting {
    /// After the trigger it kept opening connections beyond the reconnect wave of those it had
    /// open: each of its requests is a routing decision (an L7 proxy such as HAProxy or
    /// Envoy, which comes back on a new connection for as long as it routes here). Judged by
    /// its request rate — unless it kept connections alive at the trigger (`weak` =
    /// `kept_connections`): an L4 pool whose demand grew looks the same.
    PerRequest,
    /// Before the trigger it opened connections that also closed before it: fresh
    /// connections, which keep coming through a proxy that still routes here. Judged by its rate of new connections and by its
    /// activity, whichever needs the longer silence.
    Connections,
    /// Only requests on kept connections before the trigger, and no more since than their
    /// reconnect wave: a client pool, which moves away on the drain's `Connection: close`
    /// (or GOAWAY) whatever the proxies do, and connects again when its own demand needs it.
    /// Its silence proves nothing: it holds the drain to `max` (`weak` =
    /// `kept_connections`) unless it shows it routes per request.
    Pool,
    /// Nothing before the trigger: it holds the drain (`weak` = `new_path`) once it sends
    /// more than a reconnect wave.
    New,
}

impl PathRouting {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

/// One path's evidence: a peer address (or `other`, the peers beyond the table's 63 live ones
/// and connections of no known peer), how it is routed, and what its silence needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PathEvidence {
    /// The peer address, or `other`.
    pub peer: String,
    /// How the path reaches the process.
    pub routing: PathRouting,
    /// Whether the path held the commit: it carried traffic before the trigger, or (a new
    /// path) sent more than a reconnect wave since.
    pub counted: bool,
    /// Slots of the window before the trigger with activity (requests or new connections).
    pub active_slots: u64,
    /// Slots of the window before the trigger in which a connection was accepted that closed
    /// before the trigger (a fresh connection).
    pub connection_slots: u64,
    /// Connections of the path open at the trigger.
    pub open_at_trigger: u32,
    /// New connections of the path since the trigger.
    pub new_after_trigger: u32,
    /// Connections of the path open at the commit (or now): a pool holds the commit while
    /// its kept connections are open.
    #[serde(default)]
    pub open_now: u32,
    /// A pool's wait after its last new connection for its kept connections to be used again
    /// (and so to have reconnected elsewhere, or here), in milliseconds: see the Kubernetes
    /// guide's paths. Absent for a path that kept no connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_wait_ms: Option<u64>,
    /// Of the connections open at the trigger, how many were used since (and told to close):
    /// the samples `pool_wait_ms` is computed from — one sample gives a wait about 100 times
    /// the time it took, 32 about 1.6 times. Absent for a path that kept no connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_reused: Option<u32>,
    /// Of the connections open at the trigger, how many had carried more requests than a
    /// fresh connection (four) when told to close or when they closed: kept alive by their
    /// client (`weak` = `kept_connections`).
    #[serde(default)]
    pub kept_alive: u32,
    /// λ̂ of the fit that set the path's silence, in arrivals per 1000 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_1000s: Option<u64>,
    /// Its requests per 1000 s, counted, over the whole seconds of the window before the
    /// trigger (`EvidenceReport::counted_seconds`); `None` when no request was counted (a
    /// server that counts only connections, or none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_1000s: Option<u64>,
    /// The silence the path needs, in milliseconds (see [`EvidenceReport::t_conf_ms`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_conf_ms: Option<u64>,
    /// Why the path's data could not say, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weak: Option<WeakEvidence>,
    /// The peer was declared to route per request
    /// ([`Propagation::per_request_peers`](crate::Propagation::per_request_peers)): judged by
    /// the silence of all its arrivals, requests on kept connections included, and never held
    /// for its kept connections.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub declared_per_request: bool,
    /// A declared per-request peer that behaved like a client pool (advice
    /// `declared_peer_like_a_pool`): it kept connections alive and came back on no more new
    /// connections than a pool's reconnect wave.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub like_a_pool: bool,
    /// Silence of the path so far: since the later of the trigger and its last new
    /// connection, in milliseconds.
    pub silence_ms: u64,
}

/// One node agent's answers during the drain: the proxy itself saying when it stopped routing
/// here. Times in milliseconds after the trigger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NodeConfirmation {
    /// Where the agent answers (`host:port`).
    pub agent: String,
    /// The node, as the agent names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The first question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_asked_ms: Option<u64>,
    /// The last answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer_ms: Option<u64>,
    /// When its answers started saying its rules no longer route here (absent: they never
    /// did before the commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_at_ms: Option<u64>,
    /// When the rules it last read were written, by its clock against this process's (within
    /// its read interval): the node's proxy update, said by the node itself. Negative: before
    /// the trigger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_changed_ms: Option<i64>,
    /// The Services whose rules still sent new connections here at its last answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub still_routing: Vec<String>,
    /// This Pod was the last endpoint of one of them: routed as kube-proxy's fallback when
    /// every endpoint is terminating, or as the only replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_endpoint: bool,
    /// Why it could not say (no answer, its rules unreadable), when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PathEvidence {
    /// The most paths a report lists.
    pub const LISTED: usize = 16;
}

impl WeakEvidence {
    /// Every reason, each at its [`place`](Self::place).
    pub(crate) const ALL: [Self; 6] = [
        Self::NoConnectionData,
        Self::TooFewSlots,
        Self::TooManyPeers,
        Self::NewPath,
        Self::KeptConnections,
        Self::TooSparse,
    ];

    /// The reasons a single path can have, in the order they bind the commit: the first path
    /// that cannot say, in this order, is the one the evidence reports.
    pub(crate) const BINDING_ORDER: [Self; 5] = [
        Self::TooFewSlots,
        Self::TooManyPeers,
        Self::NewPath,
        Self::KeptConnections,
        Self::TooSparse,
    ];

    /// Its index in [`ALL`](Self::ALL). Exhaustive: a new reason does not compile until it has
    /// a place, and the check below fails until `ALL` holds it there.
    const fn place(self) -> usize {
        match self {
            Self::NoConnectionData => 0,
            Self::TooFewSlots => 1,
            Self::TooManyPeers => 2,
            Self::NewPath => 3,
            Self::KeptConnections => 4,
            Self::TooSparse => 5,
        }
    }

    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }

    /// Why the evidence cannot end the wait before `max`, in a phrase a log line can carry:
    /// each kind its own cause, not one text for all.
    pub fn cause(self) -> &'static str {
        match self {
            WeakEvidence::NoConnectionData => {
                "no connection was counted (serve with lameduck::serve or axum_serve, or call \
                 ConnMeta::accepted in your accept loop)"
            }
            WeakEvidence::TooFewSlots => {
                "the process served less than 15 s before the trigger: too short to have seen \
                 its traffic's slower phases"
            }
            WeakEvidence::TooSparse => {
                "new connections were too rare before the trigger for a silence within max to \
                 prove anything"
            }
            WeakEvidence::NewPath => {
                "a peer silent before the trigger kept connecting after it: something still \
                 routes it here"
            }
            WeakEvidence::KeptConnections => {
                "a client kept connections alive (a pool): it reconnects when its own demand \
                 needs it, which no silence bounds; node agents, the EndpointSlice (feature \
                 kube), or per_request_peers for a proxy that routes each request can end the \
                 wait sooner"
            }
            WeakEvidence::TooManyPeers => {
                "more peers were live at once than the arrival table tells apart: a shared \
                 row's silence proves nothing"
            }
        }
    }
}

// `ALL` holds every reason at its place, and `BINDING_ORDER` only reasons from `ALL`, once each.
const _: () = {
    let mut i = 0;
    while i < WeakEvidence::ALL.len() {
        assert!(WeakEvidence::ALL[i].place() == i);
        i += 1;
    }
    let mut seen = [false; WeakEvidence::ALL.len()];
    let mut k = 0;
    while k < WeakEvidence::BINDING_ORDER.len() {
        let at = WeakEvidence::BINDING_ORDER[k].place();
        assert!(!seen[at]);
        seen[at] = true;
        k += 1;
    }
};

/// What the propagation policy went on when it committed (or, while draining, what it waits
/// for).
///
/// In JSON: `confidence`, `fallback`, `max`, `fixed`, `cut`, `endpoint_slice`, `never_served`,
/// `confirmed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EvidenceKind {
    /// Silence long enough, by the arrivals measured before the trigger and during the
    /// drain, that a new connection would have come with probability ≥ 1 − ε had the proxies
    /// still routed here; [`EvidenceReport::rule`] names the bound that set it.
    Confidence,
    /// The user's fallback
    /// ([`Propagation::quiet_suffices_after`](crate::Propagation::quiet_suffices_after))
    /// passed before the evidence could say, and the quiet window held. A fallback, not a
    /// floor: `min` is the floor.
    Fallback,
    /// `max` was reached; [`EvidenceReport::max_reason`] says why.
    Max,
    /// A fixed delay ([`Propagation::fixed`](crate::Propagation::fixed)): no evidence taken.
    Fixed,
    /// The drain was forced or the quiesce deadline came first.
    Cut,
    /// Every EndpointSlice listing this Pod showed it not ready (feature `kube`), the proxy
    /// allowance passed and the quiet window held: [`EvidenceReport::endpoint_slice`] has the
    /// numbers.
    EndpointSlice,
    /// The process was never ready (the drain started while it was Starting): nothing
    /// routed here, nothing to wait for.
    NeverServed,
    /// Every node's agent said its rules no longer route here
    /// ([`Propagation::node_agents`](crate::Propagation::node_agents)), and every path
    /// declared to route per request had been silent long enough:
    /// [`EvidenceReport::nodes`] has each node's answers.
    Confirmed,
}

impl EvidenceKind {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

/// Why the policy waited until `max`.
///
/// In JSON: `not_enough_evidence`, `traffic_never_went_quiet`, `endpoint_slice_still_routing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MaxReason {
    /// The arrival data could not say how long to wait ([`EvidenceReport::weak`] says why) and
    /// no fallback was set.
    NotEnoughEvidence,
    /// The evidence was good, but new connections, requests or in-flight work went on until
    /// `max` — and, when new connections still arrived then, past it
    /// ([`EvidenceReport::past_max_ms`]).
    TrafficNeverWentQuiet,
    /// An EndpointSlice still listed this Pod as ready at `max`, or the Kubernetes API had
    /// not answered (feature `kube`).
    EndpointSliceStillRouting,
}

impl MaxReason {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

/// The evidence behind the propagation commit, with its numbers. Part of
/// [`PolicyReport`](crate::report::PolicyReport); while draining, [`Status`](crate::Status) shows the
/// evidence the policy is waiting on.
///
/// Fractions and rates are integers so the report stays exactly comparable: `p_empty_ppm` is
/// p̂ in millionths, `rate_per_1000s` is λ̂ in arrivals per 1000 s. A slot is *active* when a
/// new connection or a request arrived in it before the trigger, and when a new connection
/// arrived in it after (every reused connection is told to close then, so a proxy that still
/// routes here shows up as new connections).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EvidenceReport {
    /// What the commit went on (or, before it, what the policy waits for).
    pub kind: EvidenceKind,
    /// With [`EvidenceKind::Max`]: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reason: Option<MaxReason>,
    /// Why the arrival data was not enough, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weak: Option<WeakEvidence>,
    /// The slot length, in milliseconds.
    pub slot_ms: u64,
    /// Slots observed before the trigger (at most the 30 s window).
    pub slots_observed: u64,
    /// Slots fitted from the trigger's on: up to the last one with a new connection (the
    /// silence after it is what is being tested).
    #[serde(default)]
    pub slots_after_trigger: u64,
    /// Of the slots observed before and fitted after the trigger, those without activity.
    pub empty_slots: u64,
    /// Requests were counted, not only new connections (`lameduck::serve` and
    /// `lameduck::axum_serve` count both; `ConnMeta` under `axum::serve` only connections).
    #[serde(default)]
    pub requests_seen: bool,
    /// p̂ = (empty + ½) / (slots + 1), in millionths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_empty_ppm: Option<u64>,
    /// λ̂ = −ln p̂ / slot, the equivalent Poisson rate, in arrivals per 1000 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_1000s: Option<u64>,
    /// Requests per 1000 s of every path, counted (not inferred from busy slots), over the
    /// `counted_seconds` whole seconds of the window before the trigger; `None` when no
    /// request was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_1000s: Option<u64>,
    /// The whole seconds of the window before the trigger that `requests_per_1000s` is
    /// counted over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_seconds: Option<u64>,
    /// â, the estimated chance that an empty slot follows an empty slot, in millionths: near
    /// p̂ for independent arrivals, near 1 for traffic that pauses for many slots at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stay_empty_ppm: Option<u64>,
    /// The longest run of empty slots seen while routing was unchanged, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_gap_ms: Option<u64>,
    /// ε, the accepted chance that a connection would still have come, in millionths.
    pub epsilon_ppm: u64,
    /// The silence the evidence asks for, in milliseconds (before `max` bounds it): whole
    /// empty slots, counted from the end of the slot of the later of the trigger and the last
    /// new connection (so `silence_ms` at the commit is up to one slot more). Absent when even
    /// four times `max` would not be enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_conf_ms: Option<u64>,
    /// The bound that set `t_conf_ms`: `markov` or `longest_gap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<SilenceRule>,
    /// The user's fallback
    /// ([`Propagation::quiet_suffices_after`](crate::Propagation::quiet_suffices_after)), in
    /// milliseconds after the trigger, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_ms: Option<u64>,
    /// Silence observed when the policy committed (or so far): time since the later of the
    /// trigger and the last new connection, in milliseconds.
    pub silence_ms: u64,
    /// The EndpointSlice evidence (feature `kube`), when the slices were watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_slice: Option<crate::report::EndpointSliceEvidence>,
    /// Why the EndpointSlice was not the evidence, when it was not: the feature is not built,
    /// no watch was started, the API refused or could not be reached, no slice lists the Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_slice_unused: Option<String>,
    /// The path whose evidence set the commit (its silence came last, or its data could not
    /// say): a peer address, or `other`. The slot counts, rates and `t_conf_ms` above are
    /// this path's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// The paths seen, the busiest first: at most [`PathEvidence::LISTED`], the one that held
    /// the commit always among them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathEvidence>,
    /// How long the drain served past `max` because new connections kept arriving (a path
    /// still routed here: `max` caps how long the policy guesses, it does not end a drain
    /// that can see it is still routed), in milliseconds. Absent when it committed by `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_max_ms: Option<u64>,
    /// The cap on serving past `max` (the quiesce deadline less what is in flight needs) came
    /// before the silence of the path whose new connections kept arriving showed that it had
    /// stopped (a silence it shows by chance less than once in 1/ε drains, at most 10 s): it
    /// stopped accepting while that path may still have been routed here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub still_routed_at_cap: bool,
    /// Each node agent asked ([`Propagation::node_agents`](crate::Propagation::node_agents)):
    /// when it confirmed, which Services still routed here at its last answer, or why it
    /// could not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeConfirmation>,
    /// The peers declared to route per request
    /// ([`Propagation::per_request_peers`](crate::Propagation::per_request_peers)), as
    /// addresses and CIDR blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_request_peers: Vec<String>,
    /// When in-flight work, not the silence, set the commit's time: the window and the
    /// evidence held while something was in flight, and the policy waited for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_hold: Option<super::InFlightHold>,
}

impl EvidenceReport {
    /// λ̂ in arrivals per second, for display.
    pub fn rate_per_s(&self) -> Option<f64> {
        self.rate_per_1000s.map(|r| r as f64 / 1000.0)
    }

    /// One line for `/readyz?verbose` and the `propagation_done` event: the evidence and its
    /// numbers.
    pub(crate) fn describe(&self) -> String {
        if self.kind == EvidenceKind::NeverServed {
            return "never_served: the drain started before the process was ever ready; no \
                    proxy routed here, nothing to wait for"
                .to_owned();
        }
        if self.kind == EvidenceKind::Fixed {
            // A set delay reads no evidence: saying what evidence was missing would be noise
            // (a worker with no HTTP was told to use `serve`).
            return format!(
                "fixed: a set delay, no evidence read; silent for {} ms",
                self.silence_ms
            );
        }
        let work = self
            .in_flight_hold
            .as_ref()
            .map_or_else(String::new, |h| format!("; {}", h.describe()));
        let past = match (self.past_max_ms, self.still_routed_at_cap) {
            (Some(ms), _) if self.kind == EvidenceKind::Confirmed => format!(
                "; served {ms} ms past max until every node's agent said its rules no longer \
                 route here"
            ),
            (Some(ms), false) => format!(
                "; served {ms} ms past max while new connections kept arriving, until they stopped"
            ),
            (Some(ms), true) => format!(
                "; served {ms} ms past max while new connections kept arriving, and stopped \
                 accepting at the cap (the quiesce deadline less a reserve for what is in \
                 flight) before their silence showed they had stopped"
            ),
            (None, _) => String::new(),
        };
        format!(
            "{}: {}; {}; silent for {} ms{}{}{}{work}{past}",
            self.kind.as_str(),
            self.describe_rate(),
            self.describe_need(),
            self.silence_ms,
            self.describe_held(),
            self.describe_slices(),
            self.describe_nodes(),
        )
    }

    /// The rate part of [`describe`](Self::describe).
    fn describe_rate(&self) -> String {
        match (self.rate_per_s(), self.weak) {
            (_, Some(WeakEvidence::NoConnectionData)) => {
                "no connection counted (no server counts them here)".to_owned()
            }
            // The rate is read from busy slots (λ̂ = −ln p̂_empty / slot): with no slot empty it
            // is only the most that slots can show, so it is printed as the bound it is.
            (Some(r), _) => {
                format!(
                "{}{r:.2} {}/s ({} of {} slots empty, {} before the trigger; longest gap {} ms, \
                 empty after empty {} ppm)",
                if self.empty_slots == 0 { "at least " } else { "" },
                if self.requests_seen {
                    "arrivals (connections or requests)"
                } else {
                    "new connections"
                },
                self.empty_slots,
                self.slots_observed + self.slots_after_trigger,
                self.slots_observed,
                self.longest_gap_ms.unwrap_or(0),
                self.stay_empty_ppm.unwrap_or(0),
            ) + &self.describe_counted()
            }
            (None, _) => "no rate".to_owned() + &self.describe_counted(),
        }
    }

    /// The requests counted over the window's whole seconds, where the busy slots give only a
    /// bound or a rate of arrivals of either kind.
    fn describe_counted(&self) -> String {
        match (self.requests_per_1000s, self.counted_seconds) {
            (Some(r), Some(s)) => format!(
                "; {:.2} requests/s counted over the {s} s before the trigger",
                r as f64 / 1000.0
            ),
            _ => String::new(),
        }
    }

    /// The silence needed, or why the data cannot say.
    fn describe_need(&self) -> String {
        match (self.t_conf_ms, self.weak) {
            (Some(t), None) => format!(
                "needs {t} ms of silence ({})",
                self.rule.map_or("no rule", SilenceRule::as_str)
            ),
            (_, Some(w)) => format!("not enough evidence ({})", w.as_str()),
            (None, None) => String::new(),
        }
    }

    /// What the node agents said, one clause per node.
    fn describe_nodes(&self) -> String {
        if self.nodes.is_empty() {
            return String::new();
        }
        let each: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let name = n.node.clone().unwrap_or_else(|| n.agent.clone());
                let rules = n
                    .rules_changed_ms
                    .map_or_else(String::new, |c| format!(", its rules written at {c} ms"));
                match (n.confirmed_at_ms, &n.error) {
                    (Some(at), _) => format!("{name} confirmed at {at} ms{rules}"),
                    (None, Some(e)) => format!("{name} could not say ({e})"),
                    (None, None) if !n.still_routing.is_empty() => {
                        format!("{name} still routed here ({})", n.still_routing.join(", "))
                    }
                    (None, None) => format!("{name} not asked yet"),
                }
            })
            .collect();
        format!("; node agents: {}", each.join("; "))
    }

    /// What the EndpointSlices said, or why they were not used.
    fn describe_slices(&self) -> String {
        match (&self.endpoint_slice, &self.endpoint_slice_unused) {
            (Some(s), None) => match (s.changed_at_ms, s.allowed_at_ms) {
                (Some(c), Some(a)) => format!(
                    "; EndpointSlice {} at {c} ms, allowed from {a} ms ({} ms allowance)",
                    s.condition, s.allowance_ms
                ),
                _ => format!("; waiting for the EndpointSlice to show {}", s.condition),
            },
            // A watch that was started and could not be used is worth the line; a build
            // without the feature is a choice.
            (_, Some(why))
                if !why.starts_with("the kube feature") && !why.starts_with("no EndpointWatch") =>
            {
                format!("; no EndpointSlice evidence: {why}")
            }
            _ => String::new(),
        }
    }

    /// Which path held the commit and why, when there is more than one path or a pool.
    fn describe_held(&self) -> String {
        let Some(peer) = self.held_by.as_deref() else {
            return String::new();
        };
        let pool = |p: &PathEvidence| p.open_at_trigger > 0 && p.routing != PathRouting::PerRequest;
        if self.paths.len() <= 1 && !self.paths.iter().any(pool) {
            return String::new();
        }
        match self.paths.iter().find(|p| p.peer == peer) {
            Some(p) if p.weak == Some(WeakEvidence::KeptConnections) => format!(
                "; held by {peer} ({}: {} kept-alive connection(s) closed, {} open; its client \
                 opens new ones when its own demand needs them, which no silence here bounds)",
                p.routing.as_str(),
                p.kept_alive,
                p.open_now
            ),
            Some(p) if p.weak == Some(WeakEvidence::TooManyPeers) => format!(
                "; held by the shared row of peers beyond the table or of no address \
                 ({} new connection(s) since the trigger; mixed peers prove no silence)",
                p.new_after_trigger
            ),
            Some(p) if p.open_now > 0 && p.open_at_trigger > 0 => format!(
                "; held by {peer} ({}, {} kept connection(s) still open)",
                p.routing.as_str(),
                p.open_now
            ),
            // The wait is printed only where it passed within the path's silence, so within
            // the drain: one computed from one slow reuse can be an hour.
            Some(p) if p.pool_wait_ms.is_some_and(|w| w <= p.silence_ms) => format!(
                "; held by {peer} ({}: {} ms after its last new connection for its kept \
                 connections to be reused, judged from {} of {} reused)",
                p.routing.as_str(),
                p.pool_wait_ms.unwrap_or(0),
                p.kept_reused.unwrap_or(0),
                p.open_at_trigger
            ),
            Some(p) if p.pool_wait_ms.is_some() => format!(
                "; held by {peer} ({}: its kept connections were reused too slowly, {} of {} \
                 since the trigger, for the wait they ask after its last new connection to \
                 pass within the drain)",
                p.routing.as_str(),
                p.kept_reused.unwrap_or(0),
                p.open_at_trigger
            ),
            Some(p) => format!("; held by {peer} ({})", p.routing.as_str()),
            None => format!("; held by {peer}"),
        }
    }
}

/// Which bound set the required silence.
///
/// In JSON: `markov`, `longest_gap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SilenceRule {
    /// The busy/empty chain fitted to the slots: had routing gone on, a gap this long would
    /// have begun before `max` with probability at most ε.
    Markov,
    /// A gap nearly this long already happened while routing was unchanged: the silence must
    /// be longer than the longest gap seen.
    LongestGap,
}

impl SilenceRule {
    /// The name as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        crate::vocab::names::of(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_path(pool_wait_ms: u64, silence_ms: u64) -> PathEvidence {
        PathEvidence {
            peer: "10.0.0.7".to_owned(),
            routing: PathRouting::Connections,
            counted: true,
            active_slots: 40,
            connection_slots: 12,
            open_at_trigger: 4,
            new_after_trigger: 0,
            open_now: 0,
            pool_wait_ms: Some(pool_wait_ms),
            kept_reused: Some(1),
            kept_alive: 0,
            rate_per_1000s: Some(500),
            requests_per_1000s: None,
            t_conf_ms: Some(900),
            weak: None,
            declared_per_request: false,
            like_a_pool: false,
            silence_ms,
        }
    }

    fn held(path: PathEvidence) -> EvidenceReport {
        EvidenceReport {
            kind: EvidenceKind::Confidence,
            max_reason: None,
            weak: None,
            slot_ms: 250,
            slots_observed: 60,
            slots_after_trigger: 10,
            empty_slots: 20,
            requests_seen: false,
            rate_per_1000s: Some(500),
            requests_per_1000s: None,
            counted_seconds: None,
            p_empty_ppm: None,
            stay_empty_ppm: None,
            longest_gap_ms: None,
            epsilon_ppm: 1000,
            t_conf_ms: Some(900),
            rule: Some(SilenceRule::Markov),
            fallback_ms: None,
            silence_ms: path.silence_ms,
            endpoint_slice: None,
            endpoint_slice_unused: None,
            held_by: Some(path.peer.clone()),
            paths: vec![path],
            past_max_ms: None,
            still_routed_at_cap: false,
            nodes: Vec::new(),
            per_request_peers: Vec::new(),
            in_flight_hold: None,
        }
    }

    /// Every number in `s` (digits, commas and dots dropped).
    fn numbers(s: &str) -> Vec<u64> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect()
    }

    /// A pool's wait computed from one slow reuse (an hour at most) is no figure of a 2.7 s
    /// drain: the text says the wait did not pass instead of printing it.
    #[test]
    fn a_pool_wait_longer_than_the_drain_is_not_printed_as_a_figure() {
        let long = held(pool_path(1_050_867, 2_700)).describe();
        assert!(!long.contains("1050867"), "{long}");
        assert!(numbers(&long).iter().all(|&n| n <= 2_700), "{long}");
        assert!(long.contains("reused too slowly"), "{long}");
        // One that passed within the path's silence is printed: the reader can check it.
        let short = held(pool_path(1_800, 2_700)).describe();
        assert!(
            short.contains("1800 ms after its last new connection"),
            "{short}"
        );
    }

    /// A rate read from busy slots cannot show more than every slot busy: with none empty the
    /// figure is the bound it is, "at least", so a reader who counted more is not misled.
    #[test]
    fn a_rate_from_slots_all_busy_is_printed_as_a_lower_bound() {
        let mut r = held(pool_path(1_800, 2_700));
        r.empty_slots = 0;
        r.rate_per_1000s = Some(21_960);
        let all_busy = r.describe();
        assert!(
            all_busy.contains(": at least 21.96 new connections/s (0 of 70 slots empty"),
            "{all_busy}"
        );
        r.empty_slots = 20;
        r.rate_per_1000s = Some(500);
        let some_empty = r.describe();
        assert!(
            some_empty.contains(": 0.50 new connections/s (20 of 70"),
            "{some_empty}"
        );
    }
}
