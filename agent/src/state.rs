//! What the agent knows: the routes of the last read of the rules, parsed once per change, and
//! when they were read and changed; refreshed by one task.

use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::rules::{Mode, Routes};
use crate::source::Source;

#[derive(Debug, Default)]
struct Known {
    routes: Routes,
    modes: Vec<Mode>,
    /// The text the routes were parsed from: a read that finds the same text parses nothing.
    text: String,
    read_unix_ms: Option<u64>,
    changed_unix_ms: Option<u64>,
    error: Option<String>,
}

/// What the agent says to a caller about the caller.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Answer {
    /// This node's name (`--node-name`, env `NODE_NAME` from the downward API).
    pub node: String,
    /// The caller's address, the only one this answer is about.
    pub caller: IpAddr,
    /// Whether this node's rules still send new connections to the caller; `null` when the
    /// rules could not be read (`error` says why): not a confirmation.
    pub routed: Option<bool>,
    /// The Services whose rules still pick the caller, with the endpoint and how many other
    /// endpoints each still picks among (0: the caller is its last — kube-proxy's fallback to
    /// terminating endpoints, or the only replica).
    pub routes: Vec<crate::rules::Route>,
    /// Which datapaths had rules (`iptables`, `nftables`).
    pub modes: Vec<crate::rules::Mode>,
    /// When the rules answered from were read, unix milliseconds (this node's clock).
    pub rules_read_unix_ms: Option<u64>,
    /// When a read first saw the rules as they are now: they were written between the read
    /// before it and this one (`refresh_ms` apart at most), unix milliseconds.
    pub rules_changed_unix_ms: Option<u64>,
    /// How often the rules are read, in milliseconds.
    pub refresh_ms: u64,
    /// Why the last read failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The agent's state, shared by the server and the refresh task.
#[derive(Debug)]
pub struct State {
    node: String,
    refresh: Duration,
    known: Mutex<Known>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl State {
    /// Nothing read yet, for node `node`, reading every `refresh`.
    pub fn new(node: String, refresh: Duration) -> Self {
        Self {
            node,
            refresh,
            known: Mutex::new(Known::default()),
        }
    }

    fn known(&self) -> MutexGuard<'_, Known> {
        // A panic cannot leave `Known` half-written (each update is a few assignments).
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the rules once and keeps what they say (parsed only when they changed).
    pub async fn refresh_once(&self, source: &Source) {
        let read = source.read().await;
        let now = unix_ms();
        match read {
            Ok(dump) => {
                let same = self.known().text == dump.text;
                // Parsed outside the lock: the server keeps answering from the last routes.
                let parsed = (!same).then(|| dump.routes());
                let mut k = self.known();
                if let Some(routes) = parsed {
                    k.routes = routes;
                    k.text = dump.text;
                    k.changed_unix_ms = Some(now);
                }
                k.modes = dump.modes;
                k.read_unix_ms = Some(now);
                k.error = None;
            }
            Err(e) => self.known().error = Some(e),
        }
    }

    /// Reads the rules every `refresh`, forever.
    pub async fn refresh(&self, source: Source) {
        loop {
            self.refresh_once(&source).await;
            tokio::time::sleep(self.refresh).await;
        }
    }

    /// What the last read says about `caller`.
    pub fn answer(&self, caller: IpAddr) -> Answer {
        let k = self.known();
        let caller = caller.to_canonical();
        let readable = k.error.is_none() && k.read_unix_ms.is_some();
        let routes = k.routes.to(caller).to_vec();
        Answer {
            node: self.node.clone(),
            caller,
            routed: readable.then_some(!routes.is_empty()),
            routes,
            modes: k.modes.clone(),
            rules_read_unix_ms: k.read_unix_ms,
            rules_changed_unix_ms: k.changed_unix_ms,
            refresh_ms: self.refresh.as_millis() as u64,
            error: k.error.clone().or_else(|| {
                (k.read_unix_ms.is_none()).then(|| "the rules were not read yet".to_owned())
            }),
        }
    }

    /// Why the last read failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.known().error.clone()
    }
}
