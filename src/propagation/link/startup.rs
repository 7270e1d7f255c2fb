//! This Pod's own proxy delay, measured at startup (feature `kube`): from the moment the
//! watch first saw a slice list this Pod ready to the first new connection from each peer
//! that had not connected before. The proxies that took that long to start routing here run
//! the same programming, in reverse, when the Pod leaves, so the largest of these delays is
//! the allowance the drain grants them.
//!
//! Invariants:
//! - Only connections accepted before the trigger count (the accept hook calls this only
//!   while not draining); each peer counts once, with its first connection after the listing.
//! - A peer that connected before the listing reached this Pod another way (its IP, a Service
//!   that publishes not-ready addresses, a port-forward): it says nothing about the proxies
//!   and is left out.
//! - Bounded: at most `BEFORE_LIMIT` peers remembered before the listing, `PEER_LIMIT`
//!   delays, within [`WINDOW`] of the listing; then measuring stops and each connection costs
//!   one relaxed load.
//! - What it cannot see: a proxy whose clients did not connect in the window. The delay also
//!   includes the client's own wait for its next connection, so on sparse traffic it is an
//!   overestimate (safe: the drain waits longer, never past `max`). Only `lameduck::serve`'s
//!   accept loop reports connections here; under `axum::serve` nothing is measured and the
//!   default applies, as a floor.

// It measures with both features: the watch (`kube`) marks the listing, the accept loop
// (`http`) the connections. Every build compiles it and reports why nothing was measured.
#![cfg_attr(not(all(feature = "http", feature = "kube")), allow(dead_code))]

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::report::{PeerDelay, StartupMeasurement};
use crate::vocab::sync::MutexExt;

#[cfg(feature = "http")]
mod http;
#[cfg(feature = "kube")]
mod kube;

/// Connections later than this after the listing are not the proxies catching up.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
struct StartupState {
    listed_at: Option<Instant>,
    before: Vec<IpAddr>,
    left_out: Vec<IpAddr>,
    delays: Vec<(IpAddr, Duration)>,
    unmeasurable: Option<String>,
}

#[derive(Default)]
pub(crate) struct Startup {
    /// Cheap gate for the accept hook: `false` once nothing more can be measured.
    measuring: AtomicBool,
    state: Mutex<StartupState>,
}

impl Startup {
    fn lock(&self) -> std::sync::MutexGuard<'_, StartupState> {
        self.state.locked()
    }

    /// The largest delay measured, if any.
    pub(crate) fn measured(&self) -> Option<Duration> {
        self.lock().delays.iter().map(|(_, d)| *d).max()
    }

    /// The measurement for the report.
    pub(crate) fn report(&self) -> StartupMeasurement {
        let st = self.lock();
        let unmeasured = if !st.delays.is_empty() {
            None
        } else if let Some(why) = &st.unmeasurable {
            Some(why.clone())
        } else if st.listed_at.is_none() {
            Some("the watch has not seen a slice list this Pod ready".to_owned())
        } else if !st.left_out.is_empty() {
            Some(
                "every peer that connected after the slices listed this Pod ready had \
                 connected before, so not through the proxies"
                    .to_owned(),
            )
        } else {
            Some(format!(
                "no new connection came within {} s of the slices listing this Pod ready, \
                 before the trigger (connections are seen by lameduck::serve's accept loop)",
                WINDOW.as_secs()
            ))
        };
        StartupMeasurement {
            peers: st
                .delays
                .iter()
                .map(|(ip, d)| PeerDelay {
                    peer: ip.to_string(),
                    delay_ms: d.as_millis() as u64,
                })
                .collect(),
            peers_left_out: st.left_out.len() as u64,
            unmeasured,
        }
    }
}

#[cfg(all(test, feature = "kube", feature = "http", not(lameduck_loom)))]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn peer(s: &str) -> Option<SocketAddr> {
        Some(format!("{s}:40000").parse().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn each_new_peer_counts_once_and_earlier_peers_are_left_out() {
        let s = Startup::default();
        s.arm();
        s.note(peer("10.0.0.1"));
        s.listed(Instant::now());
        tokio::time::sleep(Duration::from_millis(700)).await;
        s.note(peer("10.0.0.1"));
        s.note(peer("10.0.0.2"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.note(peer("10.0.0.2"));
        s.note(peer("10.0.0.3"));
        assert_eq!(s.measured(), Some(Duration::from_millis(1200)));
        let r = s.report();
        assert_eq!(r.peers_left_out, 1);
        assert_eq!(
            r.peers
                .iter()
                .map(|p| (p.peer.as_str(), p.delay_ms))
                .collect::<Vec<_>>(),
            [("10.0.0.2", 700), ("10.0.0.3", 1200)]
        );
        assert_eq!(r.unmeasured, None);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_after_the_window_and_nothing_when_already_listed() {
        let s = Startup::default();
        s.arm();
        s.listed(Instant::now());
        tokio::time::sleep(WINDOW + Duration::from_millis(1)).await;
        s.note(peer("10.0.0.2"));
        assert_eq!(s.measured(), None);
        assert!(s
            .report()
            .unmeasured
            .unwrap()
            .starts_with("no new connection"));

        let s = Startup::default();
        s.arm();
        s.unmeasurable("already listed".into());
        s.listed(Instant::now());
        s.note(peer("10.0.0.2"));
        assert_eq!(s.measured(), None);
        assert_eq!(s.report().unmeasured.as_deref(), Some("already listed"));
    }
}
