//! Every JSON name of the report's enums against its documentation: the rustdoc of the type
//! and its variants names each value in backticks, and the report table of the Kubernetes
//! guide lists the values it promises. A variant added, renamed or re-spelled by serde
//! without its docs fails here.

use serde::Serialize;

use crate::*;

const KUBERNETES_GUIDE: &str = include_str!("../docs/kubernetes.md");

/// The doc comments on `decl` (`pub enum Phase`) and on everything inside its body, and the
/// names of its variants, read from `src`.
fn enum_docs(src: &str, decl: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = src.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(decl) && l.ends_with('{'))
        .unwrap_or_else(|| panic!("`{decl}` not found"));
    let mut docs: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.starts_with("///") || l.starts_with("#["))
        .copied()
        .collect();
    docs.reverse();
    let mut variants = Vec::new();
    for l in &lines[at + 1..] {
        if *l == "}" {
            break;
        }
        let t = l.trim();
        if t.starts_with("///") {
            docs.push(t);
        } else if l.starts_with("    ") && !l.starts_with("     ") && !t.starts_with("#[") {
            let name: String = t.chars().take_while(char::is_ascii_alphanumeric).collect();
            if !name.is_empty() {
                variants.push(name);
            }
        }
    }
    (docs.join("\n"), variants)
}

/// The JSON string of a value.
fn json<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v).unwrap() {
        serde_json::Value::String(s) => s,
        other => panic!("{other} is not a string"),
    }
}

/// The row of the guide's report table that starts with `` | `field` ``.
fn guide_row(field: &str) -> &'static str {
    let start = format!("| `{field}`");
    KUBERNETES_GUIDE
        .lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no row for `{field}` in the Kubernetes guide"))
}

/// Checks one enum: `values` are all its variants (as many as the source declares), each
/// one's `as_str` is its JSON name, and that name is in the enum's docs in backticks.
fn check<T: Serialize>(src: &str, decl: &str, values: &[T], as_str: impl Fn(&T) -> String) {
    let (docs, variants) = enum_docs(src, decl);
    assert_eq!(
        values.len(),
        variants.len(),
        "{decl}: the test lists {} values, the source declares {variants:?}",
        values.len()
    );
    for v in values {
        let name = json(v);
        assert_eq!(as_str(v), name, "{decl}: as_str and serde disagree");
        assert!(
            docs.contains(&format!("`{name}`")),
            "{decl}: the docs do not name `{name}`:\n{docs}"
        );
    }
}

/// The names of `values` that the guide's row for `field` does not list.
fn missing_in_guide<T: Serialize>(field: &str, values: &[T]) -> Vec<String> {
    let row = guide_row(field);
    values
        .iter()
        .map(json)
        .filter(|name| !row.contains(&format!("`{name}`")))
        .collect()
}

#[test]
fn phase_trigger_reason_and_event_names_are_documented() {
    let src = include_str!("../phase.rs");
    use EventKind as E;
    check(
        src,
        "pub enum Phase",
        &[
            Phase::Starting,
            Phase::Serving,
            Phase::Draining,
            Phase::StoppedAccepting,
            Phase::Closing,
            Phase::Done,
        ],
        |v| v.as_str().to_owned(),
    );
    let triggers = [
        Trigger::Api,
        Trigger::PreStop,
        Trigger::Sigterm,
        Trigger::Sigint,
        Trigger::Sigquit,
        Trigger::TaskPanic,
    ];
    check(src, "pub enum Trigger", &triggers, |v| {
        v.as_str().to_owned()
    });
    let reasons = [
        CommitReason::Quiet,
        CommitReason::Max,
        CommitReason::Fixed,
        CommitReason::Forced,
        CommitReason::NeverServed,
    ];
    check(src, "pub enum CommitReason", &reasons, |v| {
        v.as_str().to_owned()
    });
    check(
        src,
        "pub enum EventKind",
        &[
            E::DrainStarted,
            E::ReadinessFlipped,
            E::SignalReceived,
            E::PropagationDone,
            E::StoppedAccepting,
            E::InFlightZero,
            E::TasksDone,
            E::DeadlineExceeded,
            E::ResourceClosed,
            E::Done,
            E::EndpointChanged,
            E::BudgetTightened,
            E::Exit,
        ],
        |v| v.as_str().to_owned(),
    );
    assert_eq!(missing_in_guide("trigger", &triggers), Vec::<String>::new());
    assert_eq!(missing_in_guide("timeline", &reasons), Vec::<String>::new());
}

#[test]
fn report_names_are_documented() {
    let src = include_str!("../report.rs");
    let outcomes = [
        Outcome::Clean,
        Outcome::DeadlineExceeded,
        Outcome::CloserFailed,
        Outcome::Forced,
    ];
    check(src, "pub enum Outcome", &outcomes, |v| {
        v.as_str().to_owned()
    });
    check(
        src,
        "pub enum PolicyKind",
        &[PolicyKind::Quiet, PolicyKind::Fixed],
        |v| v.as_str().to_owned(),
    );
    check(
        src,
        "pub enum StragglerKind",
        &[
            StragglerKind::Request,
            StragglerKind::Task,
            StragglerKind::Response,
        ],
        |v| v.as_str().to_owned(),
    );
    assert_eq!(missing_in_guide("outcome", &outcomes), Vec::<String>::new());
}

#[test]
fn advice_names_are_documented() {
    let src = include_str!("../report/advice.rs");
    use AdviceRule as R;
    check(
        src,
        "pub enum AdviceLevel",
        &[AdviceLevel::Warn, AdviceLevel::Info],
        |v| v.as_str().to_owned(),
    );
    check(
        src,
        "pub enum AdviceRule",
        &[
            R::NotEnoughTraffic,
            R::PropagationAfterMin,
            R::PropagationAfterFixed,
            R::PropagationObserved,
            R::NoNewConnections,
            R::NoConnectionData,
            R::WeakEvidence,
            R::Confidence,
            R::Fallback,
            R::QuietWindowNeverHeld,
            R::OnePeer,
            R::RequestsCut,
            R::TasksCut,
            R::TasksPanicked,
            R::ClosersSkipped,
            R::ClosersFailed,
            R::InFlightLate,
            R::ServerIdleTimeoutShort,
            R::GraceHeadroom,
            R::GraceUsed,
            R::StopSignalMissing,
            R::NeverServed,
            R::EndpointSlice,
            R::EndpointSliceStillRouting,
            R::PublishNotReadyAddresses,
            R::EndpointSliceUnavailable,
        ],
        |v| v.as_str().to_owned(),
    );
}

#[test]
fn evidence_names_are_documented() {
    let src = include_str!("../evidence.rs");
    let kinds = [
        EvidenceKind::Confidence,
        EvidenceKind::Fallback,
        EvidenceKind::Max,
        EvidenceKind::Fixed,
        EvidenceKind::Cut,
        EvidenceKind::EndpointSlice,
        EvidenceKind::NeverServed,
    ];
    check(src, "pub enum EvidenceKind", &kinds, |v| {
        v.as_str().to_owned()
    });
    let reasons = [
        MaxReason::NotEnoughEvidence,
        MaxReason::TrafficNeverWentQuiet,
        MaxReason::EndpointSliceStillRouting,
    ];
    check(src, "pub enum MaxReason", &reasons, |v| {
        v.as_str().to_owned()
    });
    let weak = [
        WeakEvidence::NoConnectionData,
        WeakEvidence::TooFewSlots,
        WeakEvidence::TooSparse,
    ];
    check(src, "pub enum WeakEvidence", &weak, |v| {
        v.as_str().to_owned()
    });
    let rules = [SilenceRule::Markov, SilenceRule::LongestGap];
    check(
        include_str!("../evidence/fit.rs"),
        "pub enum SilenceRule",
        &rules,
        |v| v.as_str().to_owned(),
    );
    assert_eq!(
        missing_in_guide("propagation.evidence", &rules),
        Vec::<String>::new()
    );
    assert_eq!(
        missing_in_guide("propagation.evidence", &kinds),
        Vec::<String>::new()
    );
    assert_eq!(
        missing_in_guide("propagation.evidence", &reasons),
        Vec::<String>::new()
    );
    assert_eq!(
        missing_in_guide("propagation.evidence", &weak),
        Vec::<String>::new()
    );
}

#[test]
fn task_closer_and_readiness_names_are_documented() {
    check(
        include_str!("../tasks.rs"),
        "pub enum TaskResult",
        &[TaskResult::Panicked, TaskResult::Aborted],
        |v| v.as_str().to_owned(),
    );
    check(
        include_str!("../readiness.rs"),
        "pub enum ReadinessWhileDraining",
        &[
            ReadinessWhileDraining::Auto,
            ReadinessWhileDraining::NotReady,
            ReadinessWhileDraining::ServingUntilStop,
        ],
        |v| v.as_str().to_owned(),
    );
    // `error: <message>` carries its message; the other names are fixed.
    check(
        include_str!("../action.rs"),
        "pub enum ActionResult",
        &[
            ActionResult::Ok,
            ActionResult::Error("<message>".to_owned()),
            ActionResult::Panicked,
            ActionResult::Aborted,
            ActionResult::TimedOut,
            ActionResult::Skipped,
        ],
        ToString::to_string,
    );
}
