//! What the builder hands the driver.

use std::time::Duration;

use super::observer::Observer;
use crate::propagation::Policy;
use crate::readiness::SourceTable;
use crate::report::Sinks;
use crate::vocab::budget::Budget;
use crate::vocab::phase::ReadinessWhileDraining;

/// The settings the builder validated, for the driver.
pub(crate) struct Settings {
    pub(crate) budget: Budget,
    pub(crate) policy: Policy,
    pub(crate) readiness: ReadinessWhileDraining,
    pub(crate) probe_sources: SourceTable,
    pub(crate) sinks: Sinks,
    pub(crate) hurry_lead: Duration,
    /// The shortest grace the Pod may be given, when configured (validated: at least 1 s, at
    /// most the grace period).
    pub(crate) shortest_grace: Option<Duration>,
    pub(crate) proxy_label: Option<String>,
    /// An add-on that follows the lifecycle (the metrics), if one is built in.
    pub(crate) observer: Option<Box<dyn Observer>>,
}
