//! The window before the trigger, per path, copied at the trigger: what the fits read.

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::{fit, slot_of, Arrivals, SLOT, WINDOW_SLOTS};
use crate::hot::observed::PathId;
use crate::hot::observed::{RING, SLOTS_PER_SECOND};

/// One path's slots in the window before the trigger.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct PathWindow {
    pub(super) path: PathId,
    pub(super) peer: Option<IpAddr>,
    /// Bit i: slot `first + i` saw a new connection or a request.
    pub(super) activity: u128,
    /// Bit i: slot `first + i` saw a new connection that closed while Serving (a
    /// fresh-connection client's; a pool's are open at the trigger).
    pub(super) fresh: u128,
    /// Connections of the path open at the trigger.
    pub(super) open: u32,
}

/// The window before the trigger, per path, copied at the trigger (the ring turns over during
/// a long drain).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Window {
    pub(super) first: u64,
    pub(super) trigger_slot: u64,
    /// Where slot 0 begins: the grid the required silence is counted on.
    pub(super) base: Instant,
    pub(super) paths: Vec<PathWindow>,
}

impl Window {
    /// A path's slots from the trigger's up to `end` (its last new connection's), each as
    /// (activity, a fresh connection): in the trigger's slot, what came before the trigger counts
    /// as before it. After the trigger, activity is a new connection — or, with `requests`
    /// (a declared per-request router, each of whose requests is a routing decision), any
    /// arrival. The newest are kept, should the drain outlast the buffer; slots older than a
    /// turn of the ring read as empty.
    pub(super) fn samples_after(
        &self,
        arrivals: &Arrivals,
        path: PathId,
        (end, now): (u64, u64),
        requests: bool,
    ) -> Vec<(bool, bool)> {
        let room = (fit::MAX_SEQ - self.slots() as usize) as u64;
        let start = self.trigger_slot.max((end + 1).saturating_sub(room));
        (start..=end)
            .map(|k| {
                let a = if k + RING as u64 <= now {
                    Default::default()
                } else {
                    arrivals.activity(path, k)
                };
                let at_trigger = k == self.trigger_slot;
                (
                    if at_trigger || requests {
                        a.active
                    } else {
                        a.connection
                    },
                    a.connection || (at_trigger && a.fresh),
                )
            })
            .collect()
    }

    /// The window at `at` from what `arrivals` counted, slots numbered from `base`. `None`: no
    /// connection data at all.
    pub(crate) fn at(
        arrivals: &Arrivals,
        base: Instant,
        at: Instant,
        serving_since: Option<Instant>,
    ) -> Option<Self> {
        let since = match arrivals.observing_since() {
            0 => return None,
            stamp => base + Duration::from_nanos(stamp - 1),
        };
        let since = serving_since.map_or(since, |s| s.max(since));
        let trigger_slot = slot_of(base, at);
        // The first slot observed from its start.
        let since_ns = since.saturating_duration_since(base).as_nanos();
        let first = since_ns.div_ceil(SLOT.as_nanos()) as u64;
        let first = first
            .max(trigger_slot.saturating_sub(WINDOW_SLOTS))
            .min(trigger_slot);
        let mut paths = Vec::new();
        for (path, peer) in arrivals.paths() {
            let (mut activity, mut fresh) = (0u128, 0u128);
            for (i, k) in (first..trigger_slot).enumerate() {
                let a = arrivals.activity(path, k);
                activity |= u128::from(a.active) << i;
                fresh |= u128::from(a.fresh) << i;
            }
            let open = arrivals.open_count(path);
            if activity != 0 || open > 0 {
                paths.push(PathWindow {
                    path,
                    peer,
                    activity,
                    fresh,
                    open,
                });
            }
        }
        Some(Self {
            first,
            trigger_slot,
            base,
            paths,
        })
    }

    pub(super) fn slots(&self) -> u64 {
        self.trigger_slot - self.first
    }

    /// The whole seconds of the window, the buckets of the request counts (the trigger's own
    /// second, partly after it, left out).
    pub(super) fn seconds(&self) -> std::ops::Range<u64> {
        self.first.div_ceil(SLOTS_PER_SECOND)..self.trigger_slot / SLOTS_PER_SECOND
    }
}
