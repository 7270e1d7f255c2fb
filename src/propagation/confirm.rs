//! The proxies' confirmations: each node's agent (`lameduck-agent`, a DaemonSet that reads
//! the node's kube-proxy rules) says whether that node still sends this Pod new connections.
//! Only the component that routes knows when it stopped; asking it replaces a guess from
//! arrivals for every path kube-proxy routes.
//!
//! From the trigger on, every agent is asked every [`POLL`] (each question bounded by
//! [`ASK_TIMEOUT`], at most [`CONCURRENT_ASKS`] at once, and at most [`QUESTIONS_PER_SECOND`]
//! in all: a large cluster's nodes are each asked less often) until the commit. An agent *confirms* when its answer — about this
//! process's own address, the source of the question — says its rules no longer route here.
//! Such an answer is evidence by itself: the rules it read after the trigger no longer DNAT
//! to this Pod, which kube-proxy does only once the EndpointSlice stopped listing it ready
//! (an answer from before the trigger is never used). A later answer that routes again (kube-proxy's
//! fallback to terminating endpoints when every endpoint is terminating) withdraws it.
//!
//! # Invariants
//!
//! * One task asks, for one drain; the state behind one lock, written by that task, read by
//!   the policy's check and the report.
//! * An agent that does not answer, or answers that it cannot read its rules, never confirms:
//!   the drain goes on without it (as without agents), and the report names it and why.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::report::NodeConfirmation;
use crate::vocab::sync::MutexExt;

mod client;

/// The environment variable that names the node agents when the code names none: addresses
/// (`host:port`, `http://host:port`) separated by commas.
pub const NODE_AGENTS_ENV: &str = "LAMEDUCK_NODE_AGENTS";

/// How often every agent is asked.
pub(crate) const POLL: Duration = Duration::from_millis(250);
/// At most this many questions in flight at once.
pub(crate) const CONCURRENT_ASKS: usize = 64;
/// At most this many questions a second, all agents together: a cluster of many nodes is
/// asked less often per node.
pub(crate) const QUESTIONS_PER_SECOND: u32 = 1_000;

/// How often each of `agents` agents is asked: every [`POLL`], or less often where that would
/// be more than [`QUESTIONS_PER_SECOND`] (every 5 s with 5,000 nodes).
pub(crate) fn poll_interval(agents: usize) -> Duration {
    let n = u32::try_from(agents).unwrap_or(u32::MAX);
    POLL.max(Duration::from_secs(1) * n / QUESTIONS_PER_SECOND)
}

/// How long one question may take.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// The node agents to ask: where each answers. A name that resolves to several addresses (a
/// headless Service over the agents' DaemonSet) is one agent per address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeAgents(Arc<[String]>);

impl NodeAgents {
    /// Parses `items` (`host:port` or `http://host:port`, a trailing `/` allowed, empty items
    /// skipped); the error names the first bad one.
    pub(crate) fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut out = Vec::new();
        for item in items.into_iter().map(str::trim).filter(|s| !s.is_empty()) {
            let addr = item
                .strip_prefix("http://")
                .unwrap_or(item)
                .trim_end_matches('/');
            let ok = addr.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return Err(format!(
                    "{item:?} is not an agent address (host:port, http://host:port)"
                ));
            }
            out.push(addr.to_owned());
        }
        Ok(NodeAgents(out.into()))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What the agents say, as the policy reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodesSay {
    /// No agent configured.
    Nothing,
    /// Some agent has not confirmed yet; `routed`: one still says its rules route here.
    Waiting { routed: bool },
    /// Every agent confirmed; the last confirmation came then.
    Confirmed(Instant),
}

/// One agent's state in this drain.
#[derive(Clone, Debug)]
struct Agent {
    addr: String,
    node: Option<String>,
    first_asked: Option<Instant>,
    answered: Option<Instant>,
    /// The latest answer's verdict: `Some(true)` routed, `Some(false)` not, `None` unknown.
    routed: Option<bool>,
    /// Since when its answers say it no longer routes here.
    confirmed: Option<Instant>,
    /// The Services its latest answer still routes through, and whether this Pod is the last
    /// endpoint of one of them.
    services: Vec<String>,
    last_endpoint: bool,
    rules_changed_unix_ms: Option<u64>,
    error: Option<String>,
}

/// The agents' answers in one drain: asked by one task, read by the policy.
#[derive(Debug)]
pub(crate) struct Confirmations {
    agents: Mutex<Vec<Agent>>,
    changed: watch::Sender<()>,
}

impl Agent {
    fn new(addr: String) -> Self {
        Agent {
            addr,
            node: None,
            first_asked: None,
            answered: None,
            routed: None,
            confirmed: None,
            services: Vec::new(),
            last_endpoint: false,
            rules_changed_unix_ms: None,
            error: None,
        }
    }
}

impl Confirmations {
    pub(crate) fn new(agents: &NodeAgents) -> Arc<Self> {
        let agents = agents.0.iter().map(|a| Agent::new(a.clone())).collect();
        Arc::new(Self {
            agents: Mutex::new(agents),
            changed: watch::channel(()).0,
        })
    }

    /// Each configured name that resolves to several addresses (a headless Service over the
    /// agents' DaemonSet) becomes one agent per address; a name that does not resolve stays,
    /// with the error, and confirms nothing.
    async fn resolve(&self) {
        let configured: Vec<String> = self
            .agents
            .locked()
            .iter()
            .map(|a| a.addr.clone())
            .collect();
        let mut agents = Vec::new();
        for name in configured {
            let looked = tokio::time::timeout(ASK_TIMEOUT, tokio::net::lookup_host(name.clone()))
                .await
                .map_err(|_| "resolving: timed out".to_owned())
                .and_then(|r| r.map_err(|e| format!("resolving: {e}")))
                .map(|addrs| {
                    let mut seen: Vec<std::net::SocketAddr> = Vec::new();
                    for a in addrs {
                        if !seen.contains(&a) {
                            seen.push(a);
                        }
                    }
                    seen
                });
            match looked {
                Ok(addrs) if !addrs.is_empty() => {
                    agents.extend(addrs.into_iter().map(|a| Agent::new(a.to_string())));
                }
                Ok(_) => {
                    let mut a = Agent::new(name);
                    a.error = Some("the name resolves to no address".to_owned());
                    agents.push(a);
                }
                Err(e) => {
                    let mut a = Agent::new(name);
                    a.error = Some(e);
                    agents.push(a);
                }
            }
        }
        *self.agents.locked() = agents;
        self.changed.send_replace(());
    }

    /// Wakes when an agent's verdict changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// What the agents say now.
    pub(crate) fn say(&self) -> NodesSay {
        let agents = self.agents.locked();
        if agents.is_empty() {
            return NodesSay::Nothing;
        }
        match agents
            .iter()
            .map(|a| a.confirmed)
            .collect::<Option<Vec<_>>>()
        {
            Some(all) => NodesSay::Confirmed(all.into_iter().max().expect("not empty")),
            None => NodesSay::Waiting {
                routed: agents.iter().any(|a| a.routed == Some(true)),
            },
        }
    }

    /// Asks every agent every [`POLL`] until dropped (the caller aborts the task).
    pub(crate) async fn ask_until_dropped(self: Arc<Self>) {
        self.resolve().await;
        let addrs: Vec<String> = self
            .agents
            .locked()
            .iter()
            .map(|a| a.addr.clone())
            .collect();
        let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_ASKS));
        let round = poll_interval(addrs.len());
        loop {
            let asked = Instant::now();
            // Each bounded by its own timeout, at most `CONCURRENT_ASKS` at a time.
            let asks: Vec<_> = addrs
                .iter()
                .map(|a| {
                    let (a, limit) = (a.clone(), Arc::clone(&limit));
                    tokio::spawn(async move {
                        let _slot = limit.acquire_owned().await;
                        client::ask(&a, ASK_TIMEOUT).await
                    })
                })
                .collect();
            let mut answers = Vec::with_capacity(asks.len());
            for ask in asks {
                answers.push(ask.await.unwrap_or_else(|e| Err(format!("asking: {e}"))));
            }
            let mut changed = false;
            {
                let mut agents = self.agents.locked();
                for (agent, answer) in agents.iter_mut().zip(answers) {
                    changed |= agent.note(asked, answer);
                }
            }
            if changed {
                self.changed.send_replace(());
            }
            tokio::time::sleep_until(asked + round).await;
        }
    }

    /// The agents as the report shows them, instants counted from `origin` (unix ms of the
    /// origin: `origin_unix_ms`).
    pub(crate) fn report(&self, origin: Instant, origin_unix_ms: u64) -> Vec<NodeConfirmation> {
        let ms =
            |t: Option<Instant>| t.map(|t| t.saturating_duration_since(origin).as_millis() as u64);
        self.agents
            .locked()
            .iter()
            .map(|a| NodeConfirmation {
                agent: a.addr.clone(),
                node: a.node.clone(),
                first_asked_ms: ms(a.first_asked),
                last_answer_ms: ms(a.answered),
                confirmed_at_ms: ms(a.confirmed),
                rules_changed_ms: a
                    .rules_changed_unix_ms
                    .map(|u| u as i64 - origin_unix_ms as i64),
                still_routing: a.services.clone(),
                last_endpoint: a.last_endpoint,
                error: a.error.clone(),
            })
            .collect()
    }
}

impl Agent {
    /// Notes an answer to the question asked at `asked`; `true` when the verdict changed.
    fn note(&mut self, asked: Instant, answer: Result<client::Answer, String>) -> bool {
        self.first_asked.get_or_insert(asked);
        let before = (self.routed, self.confirmed.is_some());
        match answer {
            Ok(a) => {
                self.answered = Some(Instant::now());
                self.node = a.node.or(self.node.take());
                self.routed = a.routed;
                self.error = a.error.filter(|_| a.routed.is_none());
                self.rules_changed_unix_ms = a.rules_changed_unix_ms;
                self.services = a.routes.iter().map(|r| r.service.clone()).collect();
                self.last_endpoint = a.routes.iter().any(|r| r.others == 0);
                self.confirmed = match a.routed {
                    Some(false) => self.confirmed.or(Some(asked)),
                    _ => None,
                };
            }
            Err(e) => {
                // No answer is no confirmation; an earlier one stands only until routed again.
                self.error = Some(e);
                self.routed = None;
            }
        }
        before != (self.routed, self.confirmed.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::{Confirmations, NodeAgents, NodesSay};

    #[test]
    fn many_agents_are_asked_less_often_each() {
        use std::time::Duration;
        assert_eq!(super::poll_interval(3), Duration::from_millis(250));
        assert_eq!(super::poll_interval(250), Duration::from_millis(250));
        assert_eq!(super::poll_interval(1_000), Duration::from_secs(1));
        assert_eq!(super::poll_interval(5_000), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_name_is_one_agent_per_address_it_resolves_to() {
        let c =
            Confirmations::new(&NodeAgents::parse(["localhost:9902", "127.0.0.7:9902"]).unwrap());
        c.resolve().await;
        let addrs: Vec<String> = c
            .agents
            .lock()
            .unwrap()
            .iter()
            .map(|a| a.addr.clone())
            .collect();
        assert!(addrs.contains(&"127.0.0.1:9902".to_owned()), "{addrs:?}");
        assert!(addrs.contains(&"127.0.0.7:9902".to_owned()), "{addrs:?}");
        assert!(
            addrs
                .iter()
                .all(|a| a.parse::<std::net::SocketAddr>().is_ok()),
            "{addrs:?}"
        );
        // Nobody has confirmed.
        assert_eq!(c.say(), NodesSay::Waiting { routed: false });
    }

    #[test]
    fn agent_addresses_parse_and_a_bad_one_is_named() {
        let a = NodeAgents::parse(["10.0.0.5:9902", " http://node-2.local:9902/ ", ""]).unwrap();
        assert_eq!(&*a.0, ["10.0.0.5:9902", "node-2.local:9902"]);
        for bad in [
            "10.0.0.5",
            "http://:9902",
            "node:0",
            "node:99999",
            "http://node:9902/x",
        ] {
            let e = NodeAgents::parse(["10.0.0.5:9902", bad]).unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
