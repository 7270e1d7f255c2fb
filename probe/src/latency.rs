//! Latency percentiles per kind and per drain window, from the records.
//!
//! # Windows
//!
//! Each record is put in one window relative to the drain the probe saw:
//!
//! - **during**: answered with a drain-phase header other than `serving`
//!   ([`Record::served_by_draining`]), or, for a request with no such answer (failed,
//!   unfinished, or answered by another instance), started between the first draining answer's
//!   start and the last draining answer's end;
//! - **before**: started before the first draining answer's start;
//! - **after**: started after the last draining answer's end.
//!
//! When no answer said draining (a service without the phase header, or no drain during the
//! run), every record is **before** and the table says so. Histograms hold the latency of
//! requests that ended `ok`; failed requests carry `latency_us` in their record but are not
//! mixed into the percentiles.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::config::Kind;
use crate::record::{Outcome, Record, Window};

/// The longest latency the histograms hold, in µs (one hour); longer values count as this.
const MAX_TRACKED_US: u64 = 3_600_000_000;

/// The span of draining answers: first draining answer's start to the last one's end, in ms
/// since the probe started. `None` when no answer said draining.
pub(crate) fn drain_span(records: &[Record]) -> Option<(f64, f64)> {
    let mut span: Option<(f64, f64)> = None;
    for r in records.iter().filter(|r| r.served_by_draining()) {
        let end = r.end_ms.unwrap_or(r.start_ms);
        span = Some(match span {
            None => (r.start_ms, end),
            Some((a, b)) => (a.min(r.start_ms), b.max(end)),
        });
    }
    span
}

/// The window of one record given the drain span.
pub(crate) fn window_of(r: &Record, span: Option<(f64, f64)>) -> Window {
    if r.served_by_draining() {
        return Window::During;
    }
    match span {
        None => Window::Before,
        Some((first, _)) if r.start_ms < first => Window::Before,
        Some((_, last)) if r.start_ms > last => Window::After,
        Some(_) => Window::During,
    }
}

/// Latency of the `ok` requests of one kind in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyRow {
    /// The request kind.
    pub kind: Kind,
    /// The drain window.
    pub window: Window,
    /// `ok` requests measured.
    pub count: u64,
    /// Median, in µs.
    pub p50_us: u64,
    /// 99th percentile, in µs.
    pub p99_us: u64,
    /// Slowest, in µs.
    pub max_us: u64,
}

/// One row per kind and window that has at least one `ok` request, in kind then window order.
/// Values are exact to three significant digits (an HDR histogram per row).
pub(crate) fn latency_rows(records: &[Record]) -> Vec<LatencyRow> {
    let mut rows = Vec::new();
    for kind in Kind::ALL {
        for window in Window::ALL {
            let mut hist = Histogram::<u64>::new_with_bounds(1, MAX_TRACKED_US, 3)
                .expect("constant histogram bounds are valid");
            for r in records
                .iter()
                .filter(|r| r.kind == kind && r.window == Some(window) && r.outcome == Outcome::Ok)
            {
                if let Some(us) = r.latency_us {
                    hist.saturating_record(us.clamp(1, MAX_TRACKED_US));
                }
            }
            if hist.is_empty() {
                continue;
            }
            rows.push(LatencyRow {
                kind,
                window,
                count: hist.len(),
                p50_us: hist.value_at_quantile(0.5),
                p99_us: hist.value_at_quantile(0.99),
                max_us: hist.max(),
            });
        }
    }
    rows
}

/// `850µs`, `12.3ms`, `2.01s`.
pub(crate) fn format_us(us: u64) -> String {
    if us < 1000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1000.0)
    } else {
        format!("{:.2}s", us as f64 / 1_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_in_a_readable_unit() {
        assert_eq!(format_us(850), "850µs");
        assert_eq!(format_us(12_345), "12.3ms");
        assert_eq!(format_us(2_010_000), "2.01s");
    }
}
