//! What a cell is made of: the server, the client shape, the rollout, the stack, the clients
//! behind each node.

use super::*;

/// The server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// The example service with its documented settings; kubelet's `preStop` is
    /// `httpGet /drain?wait=drained` on the admin port, as in `examples/k8s/deployment.yaml`.
    Lameduck,
    /// `--naive`: exits at once on SIGTERM, no hook.
    Naive,
    /// `--fixed-sleep 0` with no hook: axum's documented `with_graceful_shutdown`.
    Graceful,
    /// `preStop: sleep 5s`, then `--fixed-sleep 0`: the "sleep, then stop gracefully" recipe.
    Sleep5,
}

impl Server {
    /// The name in tables and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Server::Lameduck => "lameduck",
            Server::Naive => "naive",
            Server::Graceful => "graceful",
            Server::Sleep5 => "sleep5",
        }
    }

    /// Every server, lameduck first.
    pub const ALL: [Server; 4] = [
        Server::Lameduck,
        Server::Naive,
        Server::Graceful,
        Server::Sleep5,
    ];
}

impl std::str::FromStr for Server {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Server::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                format!("server: expected lameduck, naive, graceful or sleep5, got {s:?}")
            })
    }
}

/// The client shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Keep-alive pools (HTTP/1.1: 20 short/s, 1 slow/s of 1 s, a 2 s stream every 2 s;
    /// h2c: 5 short/s; a heavier HTTP/1.1 pool: 100 short/s and 10 slow/s of 0.3 s) plus
    /// fresh connections at the cell's rate.
    Pool,
    /// Fresh connections only, at the cell's rate (short and slow).
    Fresh,
    /// Fresh connections only, short requests at the cell's rate for 5 s, then a 5 s pause,
    /// over and over: a poller or batch client whose silences come while routing is unchanged.
    OnOff,
    /// Fresh connections only, short requests at the cell's rate for 200 ms every 3 s (at
    /// 100/s, bursts of 20): a cron-like caller or a pool reconnecting in waves.
    Bursts,
}

impl Shape {
    /// `pool` or `fresh`.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Pool => "pool",
            Shape::Fresh => "fresh",
            Shape::OnOff => "onoff",
            Shape::Bursts => "bursts",
        }
    }

    /// Send phase and pause of the dependent shapes; `None` for steady ones.
    pub fn on_off(self) -> Option<OnOff> {
        let ms = Duration::from_millis;
        match self {
            Shape::Pool | Shape::Fresh => None,
            Shape::OnOff => Some(OnOff {
                on: ms(5000),
                off: ms(5000),
            }),
            Shape::Bursts => Some(OnOff {
                on: ms(200),
                off: ms(2800),
            }),
        }
    }

    /// The new-connection rate (per second, while sending) these cells use by default.
    pub fn default_rate(self) -> f64 {
        match self {
            Shape::Pool | Shape::Fresh => 50.0,
            Shape::OnOff => 10.0,
            Shape::Bursts => 100.0,
        }
    }
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pool" => Ok(Shape::Pool),
            "fresh" => Ok(Shape::Fresh),
            "onoff" => Ok(Shape::OnOff),
            "bursts" => Ok(Shape::Bursts),
            _ => Err(format!(
                "shape: expected pool, fresh, onoff or bursts, got {s:?}"
            )),
        }
    }
}

/// The rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rollout {
    /// Rolling update of `replicas` Pods, maxSurge 1, maxUnavailable 0.
    Rolling,
    /// One replica, deleted while its replacement is created at the same moment.
    Evict,
    /// The first of `replicas` Pods terminated by the kubelet itself, with no deletion (real
    /// stack): the `DisruptionTarget` condition through the API, the `preStop` hook, SIGTERM,
    /// SIGKILL when the budget ends whatever the Pod's grace, then the terminal phase.
    Kubelet(KubeletStop),
}

/// What plays Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stack {
    /// The testbed's own model of the EndpointSlice controller, kube-proxy and kubelet (fast).
    Model,
    /// etcd, kube-apiserver, kube-controller-manager and kube-proxy built from Kubernetes'
    /// source (`testbed/k8s/build.sh`), the testbed as kubelet and Deployment controller
    /// through the real API ([`crate::real`]).
    Real,
}

impl Stack {
    /// `model` or `real`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stack::Model => "model",
            Stack::Real => "real",
        }
    }
}

/// The clients behind one node: their shape, new-connection rate, and how many client Pods
/// (source addresses) share it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClientSpec {
    /// The shape.
    pub shape: Shape,
    /// New connections per second while sending, all the node's client Pods together.
    pub rate: f64,
    /// Client Pods, each from an address of its own (the server sees a peer per Pod), each
    /// with a share of the rate; 1 by default.
    pub pods: u32,
}

impl ClientSpec {
    /// The clients of `shape` at `rate`, from one address.
    pub fn new(shape: Shape, rate: f64) -> Self {
        Self {
            shape,
            rate,
            pods: 1,
        }
    }

    /// `fresh50`, `pool0.7`, `fresh50x20` (20 client Pods).
    pub fn short(&self) -> String {
        if self.pods > 1 {
            format!("{}{}x{}", self.shape.as_str(), self.rate, self.pods)
        } else {
            format!("{}{}", self.shape.as_str(), self.rate)
        }
    }
}

impl std::str::FromStr for ClientSpec {
    type Err = String;
    /// `fresh`, `fresh:0.7`, `pool:5` (the rate defaults to the shape's); `fresh:50@20`: 20
    /// client Pods sharing 50 connections/s.
    fn from_str(s: &str) -> Result<Self, String> {
        let (s, pods) = match s.split_once('@') {
            Some((s, pods)) => match pods.parse::<u32>() {
                Ok(n) if (1..=MAX_CLIENT_PODS).contains(&n) => (s, n),
                _ => {
                    return Err(format!(
                        "client Pods {pods:?}: expected 1 to {MAX_CLIENT_PODS}"
                    ))
                }
            },
            None => (s, 1),
        };
        let (shape, rate) = match s.split_once(':') {
            Some((shape, rate)) => (shape, Some(rate)),
            None => (s, None),
        };
        let shape: Shape = shape.parse()?;
        let rate = match rate {
            None => shape.default_rate(),
            Some(r) => match r.trim_end_matches("/s").parse::<f64>() {
                Ok(r) if r > 0.0 && r <= 1000.0 => r,
                _ => {
                    return Err(format!(
                        "client rate {r:?}: expected per second in (0, 1000]"
                    ))
                }
            },
        };
        Ok(ClientSpec { shape, rate, pods })
    }
}

/// The most client Pods behind one node: addresses .2 to .201 of its client /24.
pub const MAX_CLIENT_PODS: u32 = 200;

/// One node of a cell with several: its kube-proxy's delay and the clients behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeSpec {
    /// Its kube-proxy's sync delay (model) or `minSyncPeriod` (real).
    pub sync_delay: Duration,
    /// Model: its syncs take `sync_delay` (a kube-proxy with thousands of Services): each
    /// writes the slice it read when it began, so a change lands one to two delays later.
    /// Real: the node's kube-proxy carries that many Services for real.
    pub slow: bool,
    /// The clients whose connections this node's kube-proxy routes; `None`: no clients.
    pub clients: Option<ClientSpec>,
}
