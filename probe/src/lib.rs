//! `lameduck-probe`: a rollout probe.
//!
//! Run it against a service during `kubectl rollout restart` (or any rolling update): it sends
//! short, slow and optionally streaming requests at fixed rates, each with a unique
//! `x-request-id` and a traffic-path label (`x-traffic-path`), over keep-alive or fresh
//! connections, HTTP/1.1 or HTTP/2 (h2c). For every request it records the outcome, whether its
//! connection was reused and which connection it was, and which instance (`x-instance`) in
//! which drain phase (`x-lameduck-phase`) answered. At the end it prints a summary — total,
//! succeeded, failed, unfinished, requests served while draining on reused versus new
//! connections, and the first failure — and can write one JSON line per request.
//!
//! By default the probe never retries, so every failure a client without retries would have
//! seen is counted. With [`ProbeConfig::retry_idempotent`] it retries a failed request once on
//! a new connection, like a real client, but the record keeps the first failure and the
//! summary counts "failed, then succeeded on retry" apart. It only moves a request to another connection when the first one could not take
//! it *before anything was sent* (see [`Record::rerouted`]).
//!
//! The library is what the binary runs, so tests and demos can drive it in-process:
//!
//! ```no_run
//! use std::time::Duration;
//! use lameduck_probe::{Probe, ProbeConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = ProbeConfig::new("127.0.0.1:8080");
//! config.short_rate = 50.0;
//! config.slow_rate = 5.0;
//! config.duration = Duration::from_secs(10);
//! config.drain_wait = Duration::from_secs(5);
//! let probe = Probe::new(config)?;
//! let handle = probe.handle(); // stop(), abort(), progress() from another task
//! let result = probe.run().await?;
//! print!("{}", result.summary.table());
//! result.write_json_lines(std::fs::File::create("probe.jsonl")?)?;
//! assert!(result.summary.is_clean());
//! # Ok(()) }
//! ```
//!
//! It does not depend on `lameduck`: it speaks plain HTTP and reads two optional response
//! headers, so it works against any service.

// `deny`, not `forbid`: one function allows it, `check::process::die_with_check` (a
// parent-death signal set between fork and exec, which no dependency wraps).
#![deny(unsafe_code)]

#[cfg(unix)]
pub mod check;
pub mod cli;
mod config;
mod conn;
pub mod correlate;
pub mod flags;
mod latency;
mod record;
mod request;
mod runner;
mod summary;
mod svg;

pub use config::{
    ConfigError, ConnectionMode, HttpVersion, Kind, OnOff, ProbeConfig, MAX_DURATION,
    MAX_PLANNED_REQUESTS, MAX_RATE,
};
pub use latency::LatencyRow;
pub use record::Window;
pub use record::{Failure, Outcome, Record, Retry};
pub use request::{INSTANCE_HEADER, PHASE_HEADER, REQUEST_ID_HEADER, TRAFFIC_PATH_HEADER};
pub use runner::{run, Probe, ProbeError, ProbeHandle, ProbeResult, Progress};
pub use summary::{Counts, FirstFailure, InstanceCounts, Summary};

// Compile-checks the README's Rust example.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
