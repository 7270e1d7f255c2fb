//! Connections that arrived after a drain committed while a proxy still routed to its Pod:
//! what the evidence exists to prevent, checked per drain and per node.

use super::*;

/// A request that found no connection: when it tried, which client, the error.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectFailure {
    /// When the request started (it had to open a connection first), unix ms.
    pub at_unix_ms: f64,
    /// The client's label: `nodeK-…` for a client behind node K of several.
    pub label: String,
    /// The error (`connect: Connection refused (os error 111)`, …).
    pub error: String,
}

/// A new connection that reached a drained Pod's address after its drain committed (its
/// listeners closed), through a node whose proxy had not yet stopped routing to it: a client
/// of that node failed to connect between the commit and that node's update.
#[derive(Debug, Clone, PartialEq)]
pub struct LateArrival {
    /// The drained Pod.
    pub pod: String,
    /// The node the client sits behind (`None`: the one node).
    pub node: Option<String>,
    /// The drain's commit, ms from the Pod's deletion.
    pub commit_ms: i64,
    /// That node's proxy update, ms from the deletion (`i64::MAX`: never seen).
    pub update_ms: i64,
    /// The failed connection, ms from the deletion.
    pub at_ms: i64,
    /// The client.
    pub label: String,
    /// Its error.
    pub error: String,
}

impl std::fmt::Display for LateArrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: committed at +{} ms while {} still routed to it until +{} ms; {} failed to \
             connect at +{} ms ({})",
            self.pod,
            self.commit_ms,
            self.node
                .as_deref()
                .map_or("kube-proxy".to_owned(), |n| format!("{n}'s kube-proxy")),
            self.update_ms,
            self.label,
            self.at_ms,
            self.error
        )
    }
}

/// The node of a client label: `node2` for `node2-fresh`, `None` for a client of the one node.
fn node_of(label: &str) -> Option<&str> {
    let (node, _) = label.split_once('-')?;
    (node.starts_with("node") && node[4..].parse::<u32>().is_ok()).then_some(node)
}

impl Steps {
    /// Until when `node`'s proxy routed new connections to the Pod (its first sync without
    /// it), ms from the deletion; `None` while it had not updated. With one node, its update.
    pub fn routed_until(&self, node: Option<&str>) -> Option<i64> {
        match node {
            Some(n) if !self.per_node.is_empty() => self
                .per_node
                .iter()
                .find(|(m, _)| m == n)
                .and_then(|(_, at)| *at),
            _ => self.proxy_update_ms,
        }
    }
}

impl CellResult {
    /// Every drain that committed while some node's proxy still routed to its Pod *and* a
    /// client of that node failed to connect in between: a connection that arrived and found
    /// the listener closed. A drain that commits before a proxy converged loses nothing when
    /// no connection comes through it meanwhile (that is what its evidence weighs); one that
    /// does is what the evidence must prevent. A failure in that interval is counted against
    /// the drain even when the proxy's random pick sent that connection to another Pod: the
    /// client cannot tell, and the check errs towards failing. A node whose update was never
    /// seen counts as routing to the end.
    pub fn late_arrivals(&self) -> Vec<LateArrival> {
        let mut late = Vec::new();
        for p in &self.pods {
            let Some(commit) = p.steps.commit_ms else {
                continue;
            };
            for f in &self.counts.connect_failures {
                let node = node_of(&f.label);
                let at = f.at_unix_ms as i64 - p.deleted_unix_ms as i64;
                let until = p.steps.routed_until(node).unwrap_or(i64::MAX);
                if at >= commit && at < until {
                    late.push(LateArrival {
                        pod: p.pod.clone(),
                        node: node.map(str::to_owned),
                        commit_ms: commit,
                        update_ms: until,
                        at_ms: at,
                        label: f.label.clone(),
                        error: f.error.clone(),
                    });
                }
            }
        }
        late
    }

    /// `Err` naming every late arrival (see [`late_arrivals`](Self::late_arrivals)), else
    /// `Err` when anything was lost or left unfinished: what a lameduck cell must pass.
    pub fn check_drains(&self) -> Result<(), String> {
        let late = self.late_arrivals();
        if !late.is_empty() {
            let lines: Vec<String> = late.iter().map(|a| format!("  {a}")).collect();
            return Err(format!(
                "a drain committed while a proxy still routed to it and a connection \
                 arrived:\n{}",
                lines.join("\n")
            ));
        }
        if !self.clean() {
            return Err("lameduck lost requests".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_labels_name_their_node() {
        assert_eq!(node_of("node2-fresh"), Some("node2"));
        assert_eq!(node_of("node12-pool-h1"), Some("node12"));
        assert_eq!(node_of("pool-h1"), None);
        assert_eq!(node_of("fresh"), None);
        assert_eq!(node_of("nodex-fresh"), None);
    }

    #[test]
    fn a_node_routes_until_its_own_update() {
        let steps = Steps {
            proxy_update_ms: Some(6_000),
            per_node: vec![("node1".into(), Some(1_000)), ("node2".into(), Some(6_000))],
            ..Steps::default()
        };
        assert_eq!(steps.routed_until(Some("node1")), Some(1_000));
        assert_eq!(steps.routed_until(Some("node2")), Some(6_000));
        let one = Steps {
            proxy_update_ms: Some(2_000),
            ..Steps::default()
        };
        assert_eq!(one.routed_until(None), Some(2_000));
    }
}
