//! Classifying the callers of the admin router's `/readyz` (feature `admin`), and their rows
//! in the table of probe sources.

use super::super::Caller;
use super::{SourceTable, SourcesSeen};
use crate::report::{ProbeClass, ProbeSource};
use crate::vocab::sync::MutexExt;

/// Rows kept in the table of probe sources.
pub(crate) const MAX_SOURCES: usize = 16;

/// Longest `User-Agent` product kept in a row.
const MAX_AGENT: usize = 40;

/// The `User-Agent` prefixes of load balancers' and service discovery's health checkers that
/// probe the Pod directly.
const LOAD_BALANCER_AGENTS: &[&str] = &[
    "GoogleHC/",
    "ELB-HealthChecker/",
    "Amazon-Route53-Health-Check-Service",
    "Envoy/HC",
    "Consul Health Check",
];

/// One caller, classified: what [`ReadinessWhileDraining::Auto`](super::ReadinessWhileDraining::Auto)
/// goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProbeCaller {
    class: ProbeClass,
    rule: &'static str,
    header: Option<&'static str>,
    agent: String,
}

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

/// Kubelet's and load balancers' rows are kept before anyone else's.
fn reserved(class: ProbeClass) -> bool {
    matches!(class, ProbeClass::Kubelet | ProbeClass::LoadBalancer)
}

impl SourceTable {
    pub(crate) fn record(&self, caller: &ProbeCaller, draining: bool) {
        // Every write is a push, an increment or a row replaced whole: a panic elsewhere leaves
        // the table consistent.
        let mut seen = self.seen.locked();
        let SourcesSeen { table, weights } = &mut *seen;
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
}

#[cfg(test)]
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
