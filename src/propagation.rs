//! When to commit to leaving: the quiet window weighed by evidence (default) or a fixed delay.

use std::time::Duration;

use crate::propagation::evidence::DEFAULT_EPSILON;
use crate::vocab::budget::{Budget, DurationDisplay};
use crate::vocab::error::ConfigError;

pub(crate) mod confirm;
pub(crate) mod evidence;
pub(crate) mod link;
mod policy;
#[doc(hidden)]
pub mod sim;

pub(crate) use crate::propagation::evidence::PeerSet;
pub use crate::propagation::evidence::PER_REQUEST_PEERS_ENV;
pub use confirm::NODE_AGENTS_ENV;
pub(crate) use policy::{silence, Check, Commit, Limits, Policy, Seen};

// The confidence rule guards sparse traffic and decides the silence needed, so `quiet` is only
// a floor on it (what the evidence cannot see: a last connection already in the kernel's accept
// queue, a proxy's last retry) and `min` the floor on the whole wait. At 50 arrivals/s the
// evidence itself asks for 0.5–1 s of silence, so a `quiet` of 500 ms changes no loss in the
// simulation (BENCHMARKS.md §8) and ends dense drains where the evidence says.
const DEFAULT_QUIET: Duration = Duration::from_millis(500);
const DEFAULT_MIN: Duration = Duration::from_secs(1);

/// The propagation policy: how long to keep accepting after the trigger, while load balancers
/// catch up with the readiness flip.
///
/// * [`Propagation::quiet`] (the default, with `quiet = 500ms`, `min = 1s`, `max = grace/2`,
///   ε = 10⁻³): commit once at least `min` has passed since the trigger **and** no new
///   connection has arrived for `quiet` (no new request either, when there is no connection
///   data: requests on open connections are not routing decisions) **and** nothing is in flight
///   **and** no new *connection* has arrived for `T_conf` — commit anyway at `max`.
///   This *measures* propagation instead of guessing it.
/// * [`Propagation::fixed`]: commit a fixed time after the trigger (a `sleep` in `preStop`,
///   done inside the process).
///
/// # Silence is evidence only in proportion to traffic
///
/// `T_conf` is the silence that, had the proxies still routed here, would have been broken by
/// a new connection with probability ≥ 1 − ε at any time before `max`. It is counted from the
/// later of the trigger and the last new connection. It comes from 250 ms slots in which a
/// new connection or a request arrived — in the 30 s before the trigger, and during the drain
/// up to the last new connection (every reused connection is told to close then, so a proxy
/// that still routes here shows up as new connections) — fitted as a busy/empty chain, so that
/// traffic that pauses for seconds is judged by its pauses, with a tail no lighter than a
/// power law, and never shorter than the longest gap seen while routing was unchanged. The
/// report's [`EvidenceReport::rule`](crate::report::EvidenceReport::rule) names the bound that set it;
/// the Kubernetes guide has the model, what it cannot see, and the simulation that checks ε.
/// Connections are counted by `lameduck::serve`, `lameduck::axum_serve`, or
/// `ConnMeta::accepted` in an accept loop of one's own; requests by the first two. Plain
/// `axum::serve` counts nothing here: its connect-info hook cannot name a coordinator.
///
/// With too little evidence — no connection data (the layer alone sees requests, not
/// connections), less than 15 s of slots, or a `T_conf` beyond `max` — the policy waits to
/// `max`, or to the fallback set with [`quiet_suffices_after`](Self::quiet_suffices_after),
/// and the report says so. `min` is the floor: never before it. The report's
/// [`EvidenceReport`](crate::report::EvidenceReport) names the evidence that committed.
///
/// With the `kube` feature and an `EndpointWatch` started, the EndpointSlice is the
/// authoritative step: no commit before every slice that lists the Pod shows it not ready,
/// plus the proxy allowance; strong arrival evidence still adds its `T_conf`. Weak evidence no
/// longer waits to `max` when the allowance was measured or set; the unmeasured default is
/// only a floor. A Pod deletion with a shorter grace than `grace_period` shrinks
/// `max` with the other deadlines.
///
/// `max` is clamped to the quiesce deadline when it is left at its default; an explicit `max`
/// beyond it is a [`ConfigError`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::{Drain, Propagation};
///
/// let drain = Drain::builder()
///     .grace_period(Duration::from_secs(60))
///     .propagation(
///         Propagation::quiet(Duration::from_secs(3))
///             .min(Duration::from_secs(5))
///             .max(Duration::from_secs(40)),
///     )
///     .build()?;
/// # Ok::<(), lameduck::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Propagation {
    kind: PropagationMode,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PropagationMode {
    Quiet {
        quiet: Option<Duration>,
        min: Option<Duration>,
        max: Option<Duration>,
        fallback: Option<Duration>,
        /// ε as `f64` bits, so the type stays `Eq`.
        epsilon_bits: Option<u64>,
        /// The declared per-request peers, as given (parsed by `resolve`).
        per_request: Option<Vec<String>>,
        /// The node agents to ask, as given (parsed by `resolve`).
        agents: Option<Vec<String>>,
    },
    Fixed {
        delay: Duration,
        /// An evidence setting given to a fixed delay, refused by `resolve`.
        misplaced: Option<&'static str>,
    },
}

impl Default for Propagation {
    fn default() -> Self {
        Self {
            kind: PropagationMode::Quiet {
                quiet: None,
                min: None,
                max: None,
                fallback: None,
                epsilon_bits: None,
                per_request: None,
                agents: None,
            },
        }
    }
}

impl Propagation {
    /// The quiet-window policy with the given quiet period; `min` and `max` keep their defaults
    /// until set.
    pub fn quiet(quiet: Duration) -> Self {
        Self {
            kind: PropagationMode::Quiet {
                quiet: Some(quiet),
                min: None,
                max: None,
                fallback: None,
                epsilon_bits: None,
                per_request: None,
                agents: None,
            },
        }
    }

    /// The earliest commit, counted from the trigger. [`Propagation::fixed`] takes none: `build`
    /// refuses it there.
    pub fn min(mut self, d: Duration) -> Self {
        match &mut self.kind {
            PropagationMode::Quiet { min, .. } => *min = Some(d),
            PropagationMode::Fixed { misplaced, .. } => *misplaced = Some("min"),
        }
        self
    }

    /// The latest commit, counted from the trigger. [`Propagation::fixed`] takes none: `build`
    /// refuses it there.
    pub fn max(mut self, d: Duration) -> Self {
        match &mut self.kind {
            PropagationMode::Quiet { max, .. } => *max = Some(d),
            PropagationMode::Fixed { misplaced, .. } => *misplaced = Some("max"),
        }
        self
    }

    /// A **fallback, not a floor**: from `d` after the trigger, silence for `quiet` is
    /// enough, even when the arrival evidence cannot show convergence yet (too little
    /// traffic, or a silence it asks for that is longer). Without it, a drain with too little
    /// evidence waits to `max`. The drain may still commit *before* `d` when the evidence is
    /// strong: the floor — never before — is [`min`](Self::min). With
    /// [`Propagation::fixed`], `build` refuses it (a fixed delay takes no evidence).
    ///
    /// Set it to the slowest proxy's convergence time you have measured (kube-proxy's sync
    /// period plus the EndpointSlice delay, an ingress's refresh interval), not to a hope;
    /// if your proxies are known to need `d`, set `min(d)` as well.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use lameduck::{Drain, Propagation};
    ///
    /// // A quiet service behind proxies known to converge within 4 s: never before 2 s, and
    /// // from 4 s on a quiet second is enough whatever the evidence says.
    /// let drain = Drain::builder()
    ///     .propagation(
    ///         Propagation::default()
    ///             .min(Duration::from_secs(2))
    ///             .quiet_suffices_after(Duration::from_secs(4)),
    ///     )
    ///     .build()?;
    /// # Ok::<(), lameduck::ConfigError>(())
    /// ```
    pub fn quiet_suffices_after(mut self, d: Duration) -> Self {
        match &mut self.kind {
            PropagationMode::Quiet { fallback, .. } => *fallback = Some(d),
            PropagationMode::Fixed { misplaced, .. } => *misplaced = Some("quiet_suffices_after"),
        }
        self
    }

    /// ε: the accepted chance that, had the proxies still routed here, no new connection would
    /// have arrived during the silence the policy takes for proof (default 10⁻³). Smaller is
    /// safer and slower: the silence needed grows with `ln(1/ε)`. Must be in (0, 1); with
    /// [`Propagation::fixed`], `build` refuses it.
    ///
    /// # Examples
    ///
    /// ```
    /// use lameduck::{Drain, Propagation};
    ///
    /// let drain = Drain::builder()
    ///     .propagation(Propagation::default().miss_probability(1e-4))
    ///     .build()?;
    /// # Ok::<(), lameduck::ConfigError>(())
    /// ```
    pub fn miss_probability(mut self, epsilon: f64) -> Self {
        match &mut self.kind {
            PropagationMode::Quiet { epsilon_bits, .. } => *epsilon_bits = Some(epsilon.to_bits()),
            PropagationMode::Fixed { misplaced, .. } => *misplaced = Some("miss_probability"),
        }
        self
    }

    /// Declares the peers that choose an endpoint for **every request**: an L7 proxy or a
    /// gateway (HAProxy, nginx, Envoy, an ingress controller, a cloud L7 load balancer with
    /// its addresses), given as addresses or CIDR blocks (`10.0.3.17`, `10.1.0.0/16`).
    /// Default: env `LAMEDUCK_PER_REQUEST_PEERS` (comma-separated), else none.
    ///
    /// Such a peer keeps connections alive, as a client pool does, but it sends nothing more
    /// once its own health check or endpoint watch has dropped this Pod: its silence is
    /// evidence. So its path is judged by the silence of its requests and new connections, and
    /// is never held to `max` for its kept connections (`kept_connections`), which a client
    /// pool's is: a pool connects again when its demand needs it, however late. A declared
    /// peer that behaves like a pool (it kept connections alive and came back on no more new
    /// connections than a pool's reconnect wave) gets advice `declared_peer_like_a_pool`.
    ///
    /// Declare only what routes per request. A mesh sidecar does for HTTP (the address the
    /// application sees its inbound connections from is in the Kubernetes guide), not for
    /// opaque TCP; a client pool behind kube-proxy does not. BENCHMARKS.md says what a pool
    /// declared by mistake loses. With [`Propagation::fixed`], `build` refuses it.
    ///
    /// # Errors
    ///
    /// `build` refuses an item that is neither an address nor a CIDR block, naming it.
    ///
    /// # Examples
    ///
    /// ```
    /// use lameduck::{Drain, Propagation};
    ///
    /// // The ingress controller's Pods, and HAProxy on the node.
    /// let drain = Drain::builder()
    ///     .propagation(Propagation::default().per_request_peers(["10.1.0.0/16", "10.0.3.17"]))
    ///     .build()?;
    /// # Ok::<(), lameduck::ConfigError>(())
    /// ```
    pub fn per_request_peers<I, S>(mut self, peers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        match &mut self.kind {
            PropagationMode::Quiet { per_request, .. } => {
                *per_request = Some(peers.into_iter().map(Into::into).collect());
            }
            PropagationMode::Fixed { misplaced, .. } => *misplaced = Some("per_request_peers"),
        }
        self
    }

    /// Asks the **node agents** (`lameduck-agent`, one per node, a DaemonSet that reads the
    /// node's kube-proxy rules) whether their node still sends this Pod new connections, and
    /// commits once every one has said it no longer does: the proxies' own word, where the
    /// arrivals can only be inferred from — a drain behind client pools ends when the slowest
    /// node's kube-proxy updated, not at `max`. Given as `host:port` (or `http://host:port`),
    /// one per node. Default: env `LAMEDUCK_NODE_AGENTS` (comma-separated), else none.
    ///
    /// A confirmation covers every path kube-proxy routes; paths declared with
    /// [`per_request_peers`](Self::per_request_peers) (an ingress controller or a gateway that
    /// routes to Pod IPs itself, not through kube-proxy) still need their own silence. An
    /// agent that does not answer, or cannot read its rules, confirms nothing: the drain then
    /// goes on as without agents, and the report names it. A node that still routes here at
    /// `max` is served past it, up to the cap ([`EvidenceReport::past_max_ms`](crate::report::EvidenceReport::past_max_ms)).
    /// With [`Propagation::fixed`], `build` refuses it.
    ///
    /// # Errors
    ///
    /// `build` refuses an item that is not `host:port`, naming it.
    ///
    /// # Examples
    ///
    /// ```
    /// use lameduck::{Drain, Propagation};
    ///
    /// let drain = Drain::builder()
    ///     .propagation(Propagation::default().node_agents(["10.0.0.11:9902", "10.0.0.12:9902"]))
    ///     .build()?;
    /// # Ok::<(), lameduck::ConfigError>(())
    /// ```
    pub fn node_agents<I, S>(mut self, agents: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        match &mut self.kind {
            PropagationMode::Quiet { agents: a, .. } => {
                *a = Some(agents.into_iter().map(Into::into).collect())
            }
            PropagationMode::Fixed { misplaced, .. } => *misplaced = Some("node_agents"),
        }
        self
    }

    /// Commit exactly `d` after the trigger, whatever the traffic.
    pub fn fixed(d: Duration) -> Self {
        Self {
            kind: PropagationMode::Fixed {
                delay: d,
                misplaced: None,
            },
        }
    }

    /// [`resolve`](Self::resolve) with the process's environment.
    pub(crate) fn resolve_with_env(&self, budget: &Budget) -> Result<Policy, ConfigError> {
        let peers = std::env::var(PER_REQUEST_PEERS_ENV).ok();
        let agents = std::env::var(NODE_AGENTS_ENV).ok();
        let env = Env {
            peers: peers.as_deref(),
            agents: agents.as_deref(),
        };
        self.resolve(budget, env)
    }

    /// The validated policy; `env` is what the environment says, used where the code set
    /// nothing.
    pub(crate) fn resolve(&self, budget: &Budget, env: Env<'_>) -> Result<Policy, ConfigError> {
        let window = budget.quiesce_deadline();
        match &self.kind {
            PropagationMode::Fixed {
                misplaced: Some(setting),
                ..
            } => Err(ConfigError::propagation(format!(
                "{setting} does not apply to Propagation::fixed, which commits at its one delay \
                 whatever the evidence: remove it, or use the default policy"
            ))),
            &PropagationMode::Fixed { delay: d, .. } => {
                if d > window {
                    return Err(ConfigError::propagation(format!(
                        "fixed propagation delay ({}) is past the quiesce deadline ({} after the trigger): \
                         lower the delay or raise grace_period",
                        DurationDisplay(d),
                        DurationDisplay(window)
                    )));
                }
                Ok(Policy::Fixed(d))
            }
            PropagationMode::Quiet {
                quiet,
                min,
                max,
                fallback,
                epsilon_bits,
                per_request,
                agents,
            } => {
                let peers = match (per_request, env.peers) {
                    (Some(given), _) => PeerSet::parse(given.iter().map(String::as_str))
                        .map_err(|e| ConfigError::propagation(format!("per_request_peers: {e}")))?,
                    (None, Some(env)) => PeerSet::parse(env.split(','))
                        .map_err(|e| ConfigError::env(format!("{PER_REQUEST_PEERS_ENV}: {e}")))?,
                    (None, None) => PeerSet::default(),
                };
                let node_agents = match (agents, env.agents) {
                    (Some(given), _) => {
                        confirm::NodeAgents::parse(given.iter().map(String::as_str))
                            .map_err(|e| ConfigError::propagation(format!("node_agents: {e}")))?
                    }
                    (None, Some(env)) => confirm::NodeAgents::parse(env.split(','))
                        .map_err(|e| ConfigError::env(format!("{NODE_AGENTS_ENV}: {e}")))?,
                    (None, None) => confirm::NodeAgents::default(),
                };
                let mut policy =
                    resolve_quiet(budget, *quiet, *min, *max, *fallback, *epsilon_bits)?;
                if let Policy::Quiet {
                    per_request,
                    agents,
                    ..
                } = &mut policy
                {
                    *per_request = peers;
                    *agents = node_agents;
                }
                Ok(policy)
            }
        }
    }
}

/// What the environment says of the propagation: `LAMEDUCK_PER_REQUEST_PEERS` and
/// `LAMEDUCK_NODE_AGENTS`, used where the code set none.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Env<'a> {
    pub(crate) peers: Option<&'a str>,
    pub(crate) agents: Option<&'a str>,
}

/// The default policy's settings, checked against the budget and each other, defaults filled.
fn resolve_quiet(
    budget: &Budget,
    quiet: Option<Duration>,
    min: Option<Duration>,
    max: Option<Duration>,
    fallback: Option<Duration>,
    epsilon_bits: Option<u64>,
) -> Result<Policy, ConfigError> {
    let window = budget.quiesce_deadline();
    let max = match max {
        Some(m) if m > window => {
            return Err(ConfigError::propagation(format!(
                "propagation max ({}) is past the quiesce deadline ({} after the trigger \
                 = grace_period − safety_margin − close_budget): lower max or raise grace_period",
                DurationDisplay(m),
                DurationDisplay(window)
            )))
        }
        Some(m) => m,
        None => (budget.grace_period / 2).min(window),
    };
    let min = match min {
        Some(m) if m > max => {
            return Err(ConfigError::propagation(format!(
                "propagation min ({}) is above max ({}): lower min or raise max",
                DurationDisplay(m),
                DurationDisplay(max)
            )))
        }
        Some(m) => m,
        None => DEFAULT_MIN.min(max),
    };
    let quiet = quiet.unwrap_or(DEFAULT_QUIET.min(max));
    if quiet.is_zero() {
        return Err(ConfigError::propagation(
            "propagation quiet window is zero: use Propagation::fixed for a fixed delay, \
             or set quiet to e.g. 2s",
        ));
    }
    if let Some(f) = fallback {
        if f > max {
            return Err(ConfigError::propagation(format!(
                "quiet_suffices_after ({}) is above max ({}): lower it or raise max",
                DurationDisplay(f),
                DurationDisplay(max)
            )));
        }
    }
    let epsilon = epsilon_bits.map_or(DEFAULT_EPSILON, f64::from_bits);
    if !(epsilon > 0.0 && epsilon < 1.0) {
        return Err(ConfigError::propagation(format!(
            "miss_probability ({epsilon}) is not between 0 and 1 (exclusive): use e.g. 0.001"
        )));
    }
    Ok(Policy::Quiet {
        quiet,
        min,
        max,
        fallback,
        epsilon,
        per_request: PeerSet::default(),
        agents: confirm::NodeAgents::default(),
    })
}
