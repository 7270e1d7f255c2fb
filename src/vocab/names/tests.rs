//! Every JSON name of the report's enums against its documentation: the rustdoc of the type
//! and its variants names each value in backticks, and the report table of the Kubernetes
//! guide lists the values it promises. A variant added, renamed or re-spelled by serde
//! without its docs fails here.
//!
//! The variants come from the code: [`all!`] lists them and matches them exhaustively, so a
//! new variant stops this test from compiling until it is listed. The docs are read from the
//! crate's source with `syn`, wherever the enum is declared.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::report::*;
use crate::*;

const KUBERNETES_GUIDE: &str = include_str!("../../docs/kubernetes.md");

/// Every variant of `$ty`, as values. The `match` has no wildcard: a variant added to the enum
/// and not to the list is a compile error here (crate-internal, so `#[non_exhaustive]` does
/// not apply). A variant with data takes one example value in parentheses.
macro_rules! all {
    ($ty:ident { $($variant:ident $(($example:expr))?),+ $(,)? }) => {{
        fn exhaustive(v: &$ty) {
            match v {
                $($ty::$variant { .. } => {})+
            }
        }
        let values = vec![$($ty::$variant $(($example))?),+];
        values.iter().for_each(exhaustive);
        values
    }};
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The public enums named `name` in `items`, inline modules included.
fn find_enums<'a>(items: &'a [syn::Item], name: &str, out: &mut Vec<&'a syn::ItemEnum>) {
    for item in items {
        match item {
            syn::Item::Enum(e)
                if e.ident == name && matches!(e.vis, syn::Visibility::Public(_)) =>
            {
                out.push(e)
            }
            syn::Item::Mod(m) => {
                if let Some((_, inner)) = &m.content {
                    find_enums(inner, name, out);
                }
            }
            _ => {}
        }
    }
}

/// The text of the `#[doc]` attributes (`///` lines) among `attrs`, one line each.
fn doc_lines(attrs: &[syn::Attribute], out: &mut Vec<String>) {
    for attr in attrs.iter().filter(|a| a.path().is_ident("doc")) {
        if let syn::Meta::NameValue(nv) = &attr.meta {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            {
                out.push(s.value());
            }
        }
    }
}

/// The rustdoc of the public enum `T` and of its variants and their fields, read from the one
/// declaration of it under `src/`.
fn enum_docs<T>() -> String {
    // `lameduck::phase::Phase` → `Phase`; the module path does not matter, the file may move.
    let name = std::any::type_name::<T>().rsplit("::").next().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let file = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", path.display()));
        let mut enums = Vec::new();
        find_enums(&file.items, name, &mut enums);
        for e in enums {
            let mut docs = Vec::new();
            doc_lines(&e.attrs, &mut docs);
            for v in &e.variants {
                doc_lines(&v.attrs, &mut docs);
                for f in &v.fields {
                    doc_lines(&f.attrs, &mut docs);
                }
            }
            found.push((path.display().to_string(), docs.join("\n")));
        }
    }
    match found.len() {
        1 => found.pop().unwrap().1,
        _ => panic!(
            "`pub enum {name}` declared {} times under src/: {:?}",
            found.len(),
            found.iter().map(|f| &f.0).collect::<Vec<_>>()
        ),
    }
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

/// Checks one enum: each of `values` (all its variants, from [`all!`]) has `as_str` equal to
/// its JSON name, and that name is in the enum's docs in backticks.
fn check<T: Serialize>(values: &[T], as_str: impl Fn(&T) -> String) {
    let ty = std::any::type_name::<T>();
    let docs = enum_docs::<T>();
    for v in values {
        let name = json(v);
        assert_eq!(as_str(v), name, "{ty}: as_str and serde disagree");
        assert!(
            docs.contains(&format!("`{name}`")),
            "{ty}: the docs do not name `{name}`:\n{docs}"
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
    let phases = all!(Phase {
        Starting,
        Serving,
        Draining,
        StoppedAccepting,
        Closing,
        Done,
    });
    check(&phases, |v| v.as_str().to_owned());
    let triggers = all!(Trigger {
        Api,
        PreStop,
        Sigterm,
        Sigint,
        Sigquit,
        TaskPanic,
    });
    check(&triggers, |v| v.as_str().to_owned());
    let reasons = all!(CommitReason {
        Quiet,
        Max,
        Fixed,
        Forced,
        NeverServed,
    });
    check(&reasons, |v| v.as_str().to_owned());
    let events = all!(EventKind {
        DrainStarted,
        ReadinessFlipped,
        SignalReceived,
        PropagationDone,
        StoppedAccepting,
        InFlightZero,
        TasksDone,
        DeadlineExceeded,
        ResourceClosed,
        Done,
        EndpointChanged,
        BudgetTightened,
        Exit,
    });
    check(&events, |v| v.as_str().to_owned());
    assert_eq!(missing_in_guide("trigger", &triggers), Vec::<String>::new());
    assert_eq!(missing_in_guide("timeline", &reasons), Vec::<String>::new());
}

#[test]
fn report_names_are_documented() {
    let outcomes = all!(Outcome {
        Clean,
        DeadlineExceeded,
        CloserFailed,
        Forced,
    });
    check(&outcomes, |v| v.as_str().to_owned());
    check(&all!(PolicyKind { Quiet, Fixed }), |v| {
        v.as_str().to_owned()
    });
    check(
        &all!(StragglerKind {
            Request,
            Task,
            Response
        }),
        |v| v.as_str().to_owned(),
    );
    assert_eq!(missing_in_guide("outcome", &outcomes), Vec::<String>::new());
}

#[test]
fn advice_names_are_documented() {
    check(&all!(AdviceLevel { Warn, Info }), |v| v.as_str().to_owned());
    let rules = all!(AdviceRule {
        NotEnoughTraffic,
        PropagationAfterMin,
        PropagationAfterFixed,
        PropagationObserved,
        NoNewConnections,
        NoConnectionData,
        WeakEvidence,
        Confidence,
        Fallback,
        QuietWindowNeverHeld,
        OnePeer,
        RequestsCut,
        TasksCut,
        TasksPanicked,
        ClosersSkipped,
        ClosersFailed,
        InFlightLate,
        ServerIdleTimeoutShort,
        GraceHeadroom,
        GraceUsed,
        BudgetShortened,
        StopSignalMissing,
        NeverServed,
        EndpointSlice,
        EndpointSliceStillRouting,
        PublishNotReadyAddresses,
        EndpointSliceUnavailable,
        DeclaredPeerLikeAPool,
        NodeAgentUnanswered,
    });
    check(&rules, |v| v.as_str().to_owned());
}

#[test]
fn evidence_names_are_documented() {
    let kinds = all!(EvidenceKind {
        Confidence,
        Fallback,
        Max,
        Fixed,
        Cut,
        EndpointSlice,
        NeverServed,
        Confirmed,
    });
    check(&kinds, |v| v.as_str().to_owned());
    let reasons = all!(MaxReason {
        NotEnoughEvidence,
        TrafficNeverWentQuiet,
        EndpointSliceStillRouting,
    });
    check(&reasons, |v| v.as_str().to_owned());
    // Exhaustive where it is defined (`WeakEvidence::place`): a new reason needs no line here.
    let weak = WeakEvidence::ALL.to_vec();
    check(&weak, |v| v.as_str().to_owned());
    let routing = all!(PathRouting {
        PerRequest,
        Connections,
        Pool,
        New,
    });
    check(&routing, |v| v.as_str().to_owned());
    assert_eq!(
        missing_in_guide("propagation.evidence", &routing),
        Vec::<String>::new()
    );
    let rules = all!(SilenceRule { Markov, LongestGap });
    check(&rules, |v| v.as_str().to_owned());
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
    check(&all!(TaskResult { Panicked, Aborted }), |v| {
        v.as_str().to_owned()
    });
    check(
        &all!(ReadinessWhileDraining {
            Auto,
            NotReady,
            ServingUntilStop,
        }),
        |v| v.as_str().to_owned(),
    );
    // `error: <message>` carries its message; the other names are fixed.
    check(
        &all!(ActionResult {
            Ok,
            Error("<message>".to_owned()),
            Panicked,
            Aborted,
            TimedOut,
            Skipped,
        }),
        ToString::to_string,
    );
}
