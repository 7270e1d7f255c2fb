//! The evidence in JSON, without what a `fixed` policy did not measure: a set delay reads no
//! arrival rate, so its `weak`, `epsilon_ppm`, slot counts and the like would only mislead.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{EvidenceKind, EvidenceReport};

/// What a `fixed` policy's evidence says.
#[derive(Serialize)]
struct Fixed<'a> {
    kind: EvidenceKind,
    silence_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint_slice_unused: Option<&'a str>,
}

pub(crate) fn serialize<S: Serializer>(
    e: &Option<EvidenceReport>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match e {
        Some(e) if e.kind == EvidenceKind::Fixed => Some(Fixed {
            kind: e.kind,
            silence_ms: e.silence_ms,
            endpoint_slice_unused: e.endpoint_slice_unused.as_deref(),
        })
        .serialize(s),
        e => e.serialize(s),
    }
}

/// A `fixed` policy's evidence as the report keeps it: its kind and the silence, nothing
/// it did not measure (so the report reads back from its JSON unchanged), and why a started
/// `EndpointWatch` failed, if it did.
pub(crate) fn fixed_only(mut e: EvidenceReport) -> EvidenceReport {
    if e.kind == EvidenceKind::Fixed {
        e.max_reason = None;
        e.weak = None;
        e.slot_ms = 0;
        e.slots_observed = 0;
        e.empty_slots = 0;
        e.p_empty_ppm = None;
        e.rate_per_1000s = None;
        e.epsilon_ppm = 0;
        e.t_conf_ms = None;
        e.fallback_ms = None;
        e.slots_after_trigger = 0;
        e.requests_seen = false;
        e.stay_empty_ppm = None;
        e.longest_gap_ms = None;
        e.rule = None;
        e.endpoint_slice = None;
        e.held_by = None;
        e.paths.clear();
        // A watch that was started and failed is worth keeping whatever the policy; a
        // build without the feature, or no watch, is a choice.
        e.endpoint_slice_unused = e.endpoint_slice_unused.filter(|why| {
            !why.starts_with("the kube feature is not built")
                && !why.starts_with("no EndpointWatch was started")
        });
    }
    e
}

/// Reads both shapes: the numbers a fixed policy's JSON leaves out read as zero.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<EvidenceReport>, D::Error> {
    let Some(mut v) = Option::<serde_json::Value>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(map) = v.as_object_mut() {
        for key in [
            "slot_ms",
            "slots_observed",
            "empty_slots",
            "epsilon_ppm",
            "silence_ms",
        ] {
            map.entry(key).or_insert(serde_json::Value::from(0u64));
        }
    }
    serde_json::from_value(v)
        .map(Some)
        .map_err(serde::de::Error::custom)
}
