//! Who asks `/readyz`: each caller classified from its headers, and a bounded table of the
//! sources seen, for `/status` and the report.
//!
//! # Invariants
//!
//! * The table holds at most [`MAX_SOURCES`] rows, so a caller that varies its `User-Agent`
//!   cannot grow memory; and no such caller can squat it: kubelet's and known load balancers'
//!   rows are never evicted for another class's row, and a new caller when the table is full
//!   replaces the row of least weight (a Space-Saving sketch: it takes that weight plus one),
//!   kubelet and load balancers first from the other callers' rows, so the sources that
//!   matter, and any that makes more than 1/16 of the calls, stay listed.
//! * Every call is counted once: in its row (exact from the row's admission), or in
//!   `unlisted_requests` (calls that found no row, and the calls of an evicted row).
//! * The table's lock is held for one lookup and one increment, never across an await or user
//!   code.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

#[cfg(feature = "admin")]
use super::Caller;
use crate::sync::MutexExt;

/// The header a probe's `httpHeaders` can set to say who it is, whatever its `User-Agent`
/// became on the way (a mesh that rewrites probes): `X-Lameduck-Probe: kubelet` or
/// `X-Lameduck-Probe: load-balancer`.
pub const PROBE_HEADER: &str = "x-lameduck-probe";

/// Knative's header for kubelet's probes (any non-empty value): its queue-proxy rewrites the
/// probe and marks it so.
///
/// Any client can send it (or `X-Lameduck-Probe: kubelet`): it is read-only. It changes only
/// the answer that caller gets from `/readyz` (under
/// [`Auto`](super::ReadinessWhileDraining::Auto), `200` while draining until accepting
/// stops), never the drain or what anyone else is told; `/status` says as much to anyone.
pub const KNATIVE_PROBE_HEADER: &str = "k-kubelet-probe";

// What follows up to `ProbeSources` classifies callers of the admin router's `/readyz`.

/// Rows kept in the table of probe sources.
#[cfg(feature = "admin")]
pub(crate) const MAX_SOURCES: usize = 16;

/// Longest `User-Agent` product kept in a row.
#[cfg(feature = "admin")]
const MAX_AGENT: usize = 40;

/// The `User-Agent` prefixes of load balancers' and service discovery's health checkers that
/// probe the Pod directly.
#[cfg(feature = "admin")]
const LOAD_BALANCER_AGENTS: &[&str] = &[
    "GoogleHC/",
    "ELB-HealthChecker/",
    "Amazon-Route53-Health-Check-Service",
    "Envoy/HC",
    "Consul Health Check",
];

/// How a readiness caller was classified.
///
/// In JSON: `kubelet`, `load_balancer`, `other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProbeClass {
    /// kubelet's probe: under [`Auto`](super::ReadinessWhileDraining::Auto) it sees "ready"
    /// until `stopped_accepting`.
    Kubelet,
    /// A load balancer's health checker, known by its `User-Agent` or said by the header: it
    /// sees "not ready" from the trigger.
    LoadBalancer,
    /// Anyone else (a monitor, a person, an unrecognised checker): "not ready" from the
    /// trigger.
    Other,
}

/// One caller, classified: what [`ReadinessWhileDraining::Auto`](super::ReadinessWhileDraining::Auto)
/// goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg(feature = "admin")]
pub(crate) struct ProbeCaller {
    class: ProbeClass,
    rule: &'static str,
    header: Option<&'static str>,
    agent: String,
}

#[cfg(feature = "admin")]
impl ProbeCaller {
    /// Classifies by, in order: `X-Lameduck-Probe` (`kubelet` or `load-balancer`),
    /// `K-Kubelet-Probe` (any non-empty value), `User-Agent: kube-probe/…`, a known load
    /// balancer's `User-Agent`; anything else is [`ProbeClass::Other`].
    pub(crate) fn classify(
        user_agent: Option<&[u8]>,
        knative: Option<&[u8]>,
        lameduck: Option<&[u8]>,
    ) -> Self {
        let agent = agent_product(user_agent);
        let said = lameduck.map(|v| v.trim_ascii());
        let (class, rule, header) = if said.is_some_and(|v| v.eq_ignore_ascii_case(b"kubelet")) {
            (
                ProbeClass::Kubelet,
                "header X-Lameduck-Probe: kubelet",
                Some("X-Lameduck-Probe: kubelet"),
            )
        } else if said.is_some_and(|v| v.eq_ignore_ascii_case(b"load-balancer")) {
            (
                ProbeClass::LoadBalancer,
                "header X-Lameduck-Probe: load-balancer",
                Some("X-Lameduck-Probe: load-balancer"),
            )
        } else if knative.is_some_and(|v| !v.trim_ascii().is_empty()) {
            (
                ProbeClass::Kubelet,
                "header K-Kubelet-Probe (Knative)",
                Some("K-Kubelet-Probe"),
            )
        } else if user_agent.is_some_and(|ua| ua.starts_with(b"kube-probe/")) {
            (ProbeClass::Kubelet, "User-Agent kube-probe/", None)
        } else if user_agent.is_some_and(|ua| {
            LOAD_BALANCER_AGENTS
                .iter()
                .any(|p| ua.starts_with(p.as_bytes()))
        }) {
            (
                ProbeClass::LoadBalancer,
                "User-Agent of a known load-balancer checker",
                None,
            )
        } else {
            (
                ProbeClass::Other,
                "no probe header, User-Agent not kubelet's",
                None,
            )
        };
        ProbeCaller {
            class,
            rule,
            header,
            agent,
        }
    }

    /// What the readiness rule needs: kubelet's probe or anyone else.
    pub(crate) fn caller(&self) -> Caller {
        match self.class {
            ProbeClass::Kubelet => Caller::Kubelet,
            ProbeClass::LoadBalancer | ProbeClass::Other => Caller::Other,
        }
    }

    /// For `/readyz?verbose`: `kubelet's probe (header K-Kubelet-Probe (Knative))`.
    pub(crate) fn describe(&self) -> String {
        let who = match self.class {
            ProbeClass::Kubelet => "kubelet's probe",
            ProbeClass::LoadBalancer => "a load balancer's checker",
            ProbeClass::Other => "not kubelet's probe",
        };
        format!("{who} ({})", self.rule)
    }
}

/// The product of a `User-Agent` (`kube-probe/1.31` → `kube-probe/1.31`, cut at the first
/// space and at [`MAX_AGENT`] characters), printable ASCII only; `(none)` when absent.
#[cfg(feature = "admin")]
fn agent_product(ua: Option<&[u8]>) -> String {
    let Some(ua) = ua else {
        return "(none)".to_owned();
    };
    let first = ua.split(|b| *b == b' ').next().unwrap_or_default();
    let text: String = first
        .iter()
        .take(MAX_AGENT)
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '?' })
        .collect();
    if text.is_empty() {
        "(empty)".to_owned()
    } else {
        text
    }
}

/// One kind of caller `/readyz` saw, and how it was classified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeSource {
    /// The `User-Agent`'s first product (`kube-probe/1.31`, `GoogleHC/1.0`), at most 40
    /// printable characters; `(none)` when absent.
    pub user_agent: String,
    /// The probe header that decided, when one did (`K-Kubelet-Probe`,
    /// `X-Lameduck-Probe: kubelet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// How it was classified.
    pub classified_as: ProbeClass,
    /// The rule that classified it.
    pub rule: String,
    /// Calls seen.
    pub requests: u64,
    /// Of those, calls while draining (before `stopped_accepting` they are answered by class
    /// under [`Auto`](super::ReadinessWhileDraining::Auto)).
    pub while_draining: u64,
}

/// The probe sources `/readyz` saw: at most 16 rows in order of first call, and
/// the calls beyond them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeSources {
    /// One row per (user agent, header, class).
    pub sources: Vec<ProbeSource>,
    /// Calls from sources that are not listed: they did not fit in the table, or their row
    /// was replaced by a busier source's (kubelet's and load balancers' rows are kept first).
    #[serde(default)]
    pub unlisted_requests: u64,
}

impl ProbeSources {
    /// `true` when no caller was seen.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.unlisted_requests == 0
    }
}

/// The coordinator's table of probe sources, shared by the readiness part (which writes it)
/// and the driver (which reads it into `/status` and the report).
#[derive(Debug, Default)]
pub(crate) struct SourceTable {
    seen: Mutex<Seen>,
}

/// The rows, and beside each its eviction weight (the sketch's over-estimate of its calls).
#[derive(Debug, Default)]
struct Seen {
    table: ProbeSources,
    #[cfg(feature = "admin")]
    weights: Vec<u64>,
}

/// Kubelet's and load balancers' rows are kept before anyone else's.
#[cfg(feature = "admin")]
fn reserved(class: ProbeClass) -> bool {
    matches!(class, ProbeClass::Kubelet | ProbeClass::LoadBalancer)
}

impl SourceTable {
    #[cfg(feature = "admin")]
    pub(crate) fn record(&self, caller: &ProbeCaller, draining: bool) {
        // Every write is a push, an increment or a row replaced whole: a panic elsewhere leaves
        // the table consistent.
        let mut seen = self.seen.locked();
        let Seen { table, weights } = &mut *seen;
        let header = caller.header.map(str::to_owned);
        let row = table.sources.iter().position(|s| {
            s.classified_as == caller.class && s.user_agent == caller.agent && s.header == header
        });
        if let Some(i) = row {
            let row = &mut table.sources[i];
            row.requests += 1;
            row.while_draining += u64::from(draining);
            weights[i] += 1;
            return;
        }
        let new = ProbeSource {
            user_agent: caller.agent.clone(),
            header,
            classified_as: caller.class,
            rule: caller.rule.to_owned(),
            requests: 1,
            while_draining: u64::from(draining),
        };
        if table.sources.len() < MAX_SOURCES {
            table.sources.push(new);
            weights.push(1);
            return;
        }
        // Full: the lightest row of another caller; for kubelet or a load balancer, when only
        // reserved rows are left, the lightest of those.
        let lightest = |keep_reserved: bool| {
            (0..table.sources.len())
                .filter(|&i| !(keep_reserved && reserved(table.sources[i].classified_as)))
                .min_by_key(|&i| weights[i])
        };
        let victim = match lightest(true) {
            Some(i) => Some(i),
            None if reserved(caller.class) => lightest(false),
            None => None,
        };
        match victim {
            Some(i) => {
                let old = std::mem::replace(&mut table.sources[i], new);
                table.unlisted_requests += old.requests;
                weights[i] += 1;
            }
            None => table.unlisted_requests += 1,
        }
    }

    pub(crate) fn snapshot(&self) -> ProbeSources {
        self.seen.locked().table.clone()
    }
}

#[cfg(all(test, feature = "admin"))]
mod tests {
    use super::*;

    fn class(ua: Option<&str>, knative: Option<&str>, lameduck: Option<&str>) -> ProbeClass {
        ProbeCaller::classify(
            ua.map(str::as_bytes),
            knative.map(str::as_bytes),
            lameduck.map(str::as_bytes),
        )
        .class
    }

    #[test]
    fn headers_win_over_a_rewritten_user_agent() {
        assert_eq!(
            class(Some("Go-http-client/1.1"), Some("queue"), None),
            ProbeClass::Kubelet
        );
        assert_eq!(
            class(Some("Go-http-client/1.1"), None, Some("kubelet")),
            ProbeClass::Kubelet
        );
        assert_eq!(
            class(Some("Go-http-client/1.1"), None, Some(" Kubelet ")),
            ProbeClass::Kubelet
        );
        assert_eq!(
            class(Some("kube-probe/1.31"), None, Some("load-balancer")),
            ProbeClass::LoadBalancer
        );
        assert_eq!(
            class(Some("kube-probe/1.31"), None, None),
            ProbeClass::Kubelet
        );
        assert_eq!(
            class(Some("Go-http-client/1.1"), Some(""), None),
            ProbeClass::Other
        );
        assert_eq!(
            class(Some("Go-http-client/1.1"), None, Some("maybe")),
            ProbeClass::Other
        );
        assert_eq!(class(None, None, None), ProbeClass::Other);
    }

    #[test]
    fn known_checkers_are_load_balancers() {
        for ua in ["GoogleHC/1.0", "ELB-HealthChecker/2.0", "Envoy/HC"] {
            assert_eq!(
                class(Some(ua), None, None),
                ProbeClass::LoadBalancer,
                "{ua}"
            );
        }
        assert_eq!(class(Some("curl/8.5.0"), None, None), ProbeClass::Other);
    }

    #[test]
    fn the_table_is_bounded_and_counts_the_rest() {
        let table = SourceTable::default();
        for i in 0..(MAX_SOURCES + 5) {
            let ua = format!("agent-{i}/1");
            table.record(
                &ProbeCaller::classify(Some(ua.as_bytes()), None, None),
                false,
            );
        }
        let kube = ProbeCaller::classify(Some(b"kube-probe/1.31"), None, None);
        table.record(&kube, true);
        let seen = table.snapshot();
        assert_eq!(seen.sources.len(), MAX_SOURCES);
        // Each newcomer replaced a row of weight 1; kubelet replaced one more.
        assert_eq!(seen.unlisted_requests, 6);
        assert!(seen
            .sources
            .iter()
            .any(|s| s.classified_as == ProbeClass::Kubelet));
        assert_eq!(agent_product(Some(b"a\x01b c")), "a?b");
    }
}
