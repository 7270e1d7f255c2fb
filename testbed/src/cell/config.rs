//! One cell's configuration, its validation and its name.

use super::*;

/// Everything one cell needs.
#[derive(Debug, Clone, Serialize)]
pub struct CellConfig {
    /// The model or the real components.
    pub stack: Stack,
    /// Server under test.
    pub server: Server,
    /// Rule backend.
    pub backend: Backend,
    /// Model: kube-proxy's sync delay after each slice change, or with `min_sync_period` its
    /// `minSyncPeriod`. Real: kube-proxy's `minSyncPeriod` (its rate limit: a change after a
    /// quiet spell syncs at once).
    pub sync_delay: Duration,
    /// Model only: `sync_delay` as kube-proxy's `minSyncPeriod` (the real sync runner's
    /// timing) instead of a delay after each change.
    pub min_sync_period: bool,
    /// EndpointSlice delay.
    pub slice_delay: Duration,
    /// New connections per second (fresh).
    pub new_conn_rate: f64,
    /// Client shape.
    pub shape: Shape,
    /// Rollout kind.
    pub rollout: Rollout,
    /// Replicas (rolling).
    pub replicas: usize,
    /// `terminationGracePeriodSeconds`, also the service's `--grace-period`.
    pub grace: Duration,
    /// Client traffic before the rollout starts, counted from the moment every node routes
    /// the first Pods (the clients run from before they are ready). The default, [`WARM`],
    /// lets the Pods serve past the whole evidence window, so their drains are judged on
    /// their traffic; a Pod younger than 15 s waits to `max` (`too_few_slots`) and "0 lost"
    /// would only show that `max` outlasted the proxy. With an on/off client the rollout
    /// then waits for the next pause to begin.
    pub warmup: Duration,
    /// `publishNotReadyAddresses`.
    pub publish_not_ready: bool,
    /// From a Pod's creation to its process starting (sandbox, image, container).
    pub start_delay: Duration,
    /// Extra flags for the lameduck server (e.g. `--readiness-policy auto`).
    pub lameduck_flags: Vec<String>,
    /// Runs a node agent (`lameduck-agent`) in every node namespace and tells the lameduck
    /// service where they are (`--node-agents`): the drain asks the proxies themselves.
    pub agents: bool,
    /// Nodes (1-based) whose agent is not started though the service is told of it: an agent
    /// down before the drain, which answers nothing.
    pub agents_down: Vec<usize>,
    /// The lameduck server's hook as `exec` of `service prestop` instead of `httpGet /drain`.
    pub exec_hook: bool,
    /// Real stack only: the Pods run as `examples/k8s/`'s ServiceAccount with its RBAC, get
    /// the projected token, CA and namespace files, so a service built with the `kube`
    /// feature reads its EndpointSlices from the real API.
    pub kube: bool,
    /// Two or more nodes, each with its kube-proxy and its clients (node 1 first); empty: one
    /// node with `sync_delay`, `shape` and `new_conn_rate`.
    pub nodes: Vec<NodeSpec>,
    /// Real stack only: the rollout by the real Deployment and ReplicaSet controllers (a
    /// Deployment, maxSurge 1, maxUnavailable 0, its template changed; the eviction through
    /// the Eviction API), the testbed binding the Pods to its node as the scheduler would.
    /// Otherwise the testbed plays the Deployment controller.
    pub deployment: bool,
}

/// Real stack, a cell with a slow node: the other Services the cluster carries (each with two
/// endpoints), whose rules every kube-proxy writes.
pub const SLOW_NODE_SERVICES: usize = 2000;
/// Real stack: the share of one CPU a slow node's kube-proxy gets (a busy node).
pub const SLOW_NODE_CPU: f64 = 0.1;

/// The default warm-up, counted from the moment every node routes the first Pods: past the
/// whole 30 s evidence window, so a Pod's window holds its traffic and not the empty slots
/// before its proxies routed to it (which it would read as a pause of its traffic: a dense
/// fresh-connection cell behind a 1 s proxy needed `t_conf` 2.5 s with 20 s, 500 ms with
/// 32 s). A Pod that has served for minutes, as most do, has no such slots in its window.
pub const WARM: Duration = Duration::from_secs(32);

impl CellConfig {
    /// Defaults: lameduck, iptables, 1 s sync, 0.1 s slice, 50/s fresh, pool, rolling 2,
    /// grace 15 s, warm-up [`WARM`] (past the evidence window), Pod start 2 s.
    pub fn new(server: Server) -> Self {
        CellConfig {
            stack: Stack::Model,
            server,
            backend: Backend::Iptables,
            sync_delay: Duration::from_secs(1),
            min_sync_period: false,
            slice_delay: Duration::from_millis(100),
            new_conn_rate: 50.0,
            shape: Shape::Pool,
            rollout: Rollout::Rolling,
            replicas: 2,
            grace: Duration::from_secs(15),
            warmup: WARM,
            publish_not_ready: false,
            start_delay: Duration::from_secs(2),
            lameduck_flags: Vec::new(),
            agents: false,
            agents_down: Vec::new(),
            exec_hook: false,
            kube: false,
            deployment: false,
            nodes: Vec::new(),
        }
    }

    /// The nodes: `nodes`, or the one node the single-node fields describe.
    pub fn node_specs(&self) -> Vec<NodeSpec> {
        if self.nodes.is_empty() {
            vec![NodeSpec {
                sync_delay: self.sync_delay,
                slow: false,
                clients: Some(ClientSpec::new(self.shape, self.new_conn_rate)),
            }]
        } else {
            self.nodes.clone()
        }
    }

    /// Whether the cell means anything on its stack: the `kube` feature and `--deployment`
    /// need the real API, so on the model such a cell would only repeat its plain twin.
    pub fn runs_on_its_stack(&self) -> bool {
        self.stack == Stack::Real
            || !(self.kube || self.deployment || matches!(self.rollout, Rollout::Kubelet(_)))
    }

    /// A short name: `lameduck/iptables/sync1000ms/50.0ps/pool`; with several nodes
    /// `lameduck/iptables/n1:1000ms:fresh50,n2:6000ms:fresh0.7`.
    pub fn name(&self) -> String {
        let minsync = self.stack == Stack::Real || self.min_sync_period;
        let mut n = format!(
            "{}{}/{}/",
            if self.stack == Stack::Real {
                "real/"
            } else {
                ""
            },
            self.server.as_str(),
            self.backend.as_str()
        );
        if self.nodes.len() > 1 {
            let nodes: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    format!(
                        "n{}:{}{}ms:{}",
                        i + 1,
                        if s.slow { "slow" } else { "" },
                        s.sync_delay.as_millis(),
                        s.clients.map_or("none".to_owned(), |c| c.short())
                    )
                })
                .collect();
            if minsync {
                n.push_str("minsync/");
            }
            n.push_str(&nodes.join(","));
        } else {
            let _ = write!(
                n,
                "{}{}ms/{}ps/{}",
                if minsync { "minsync" } else { "sync" },
                self.sync_delay.as_millis(),
                self.new_conn_rate,
                self.shape.as_str()
            );
        }
        match self.rollout {
            Rollout::Evict => n.push_str("/evict"),
            Rollout::Kubelet(stop) => {
                let _ = write!(n, "/kubelet:{}", stop.name());
            }
            Rollout::Rolling => {}
        }
        if self.exec_hook && self.server == Server::Lameduck {
            n.push_str("/exec");
        }
        if self.kube && self.stack == Stack::Real {
            n.push_str("/kube");
        }
        if self.deployment && self.stack == Stack::Real {
            n.push_str("/deployment");
        }
        if self.agents && self.server == Server::Lameduck {
            n.push_str("/agents");
            for k in &self.agents_down {
                let _ = write!(n, "-down{k}");
            }
        }
        n
    }

    pub(super) fn kubelet(&self, pre_stop: PreStop) -> Kubelet {
        Kubelet {
            period: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            failure_threshold: 1,
            success_threshold: 1,
            pre_stop,
            start_delay: self.start_delay,
            stop_signal: nix::sys::signal::Signal::SIGTERM,
            grace: self.grace,
        }
    }

    pub(super) fn plane(&self) -> ControlPlane {
        ControlPlane {
            slice_delay: self.slice_delay,
            nodes: self
                .node_specs()
                .iter()
                .map(|n| NodeSync {
                    delay: n.sync_delay,
                    slow: n.slow,
                })
                .collect(),
            sync_jitter: 0.2,
            min_sync_period: self.min_sync_period,
            publish_not_ready: self.publish_not_ready,
            backend: self.backend,
        }
    }

    /// The Pod template of the real mode: the same server flags and hook as the model's.
    pub(super) fn pod_template(&self) -> real::PodTemplate {
        let (cmd, pre_stop) = self.server_cmd(Path::new("service"));
        let mut args: Vec<String> = vec![
            "--listen".into(),
            format!("0.0.0.0:{}", net::POD_PORT),
            "--admin".into(),
            format!("0.0.0.0:{}", net::ADMIN_PORT),
        ];
        args.extend(cmd.flags);
        real::PodTemplate {
            args,
            pre_stop,
            grace: self.grace,
            env: Vec::new(),
            service_account: self.kube.then(|| "lameduck-example".to_owned()),
        }
    }

    /// The binary this cell's server runs: the service (`service_bin`) for lameduck, the
    /// baseline next to it ([`baseline_bin`]) for the others.
    pub fn server_bin(&self, service_bin: &Path) -> PathBuf {
        match self.server {
            Server::Lameduck => service_bin.to_owned(),
            Server::Naive | Server::Graceful | Server::Sleep5 => baseline_bin(service_bin),
        }
    }

    /// The server's binary (see [`server_bin`](Self::server_bin)), flags and `preStop` hook.
    pub(super) fn server_cmd(&self, service_bin: &Path) -> (ServerCmd, PreStop) {
        let grace = format!("{}ms", self.grace.as_millis());
        let (flags, hook): (Vec<String>, PreStop) = match self.server {
            Server::Lameduck => {
                let mut f = vec!["--grace-period".to_owned(), grace];
                if self.agents {
                    let n = self.node_specs().len();
                    let addrs: Vec<String> = (1..=n)
                        .map(|k| crate::net::agent_addr(k, n).to_string())
                        .collect();
                    f.extend(["--node-agents".to_owned(), addrs.join(",")]);
                }
                f.extend(self.lameduck_flags.iter().cloned());
                let hook = if self.exec_hook {
                    PreStop::Exec
                } else {
                    PreStop::HttpGet("/drain?wait=drained".to_owned())
                };
                (f, hook)
            }
            Server::Naive => (vec!["--naive".to_owned()], PreStop::None),
            Server::Graceful => (vec!["--fixed-sleep".into(), "0".into()], PreStop::None),
            Server::Sleep5 => (
                vec!["--fixed-sleep".into(), "0".into()],
                PreStop::Sleep(Duration::from_secs(5)),
            ),
        };
        (
            ServerCmd {
                bin: self.server_bin(service_bin),
                flags,
            },
            hook,
        )
    }
}
