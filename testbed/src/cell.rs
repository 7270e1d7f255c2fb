//! One cell of the matrix: a server mode, a proxy backend and delay, a client shape and rate,
//! a rollout; and its result: every request counted, per deleted Pod the timeline.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lameduck_probe::{
    ConnectionMode, Failure, HttpVersion, OnOff, Outcome, Probe, ProbeConfig, ProbeResult,
};
use serde::Serialize;

use crate::cluster::{
    unix_ms, Cluster, ControlPlane, Event, Kubelet, NodeSync, PreStop, ServerCmd,
};
use crate::net::{self, NetError, Netns, SERVICE_PORT, SERVICE_VIP};
use crate::proxy::{Backend, Proxy};
use crate::real;

mod config;
mod control;
mod late;
mod result;
mod spec;

pub use crate::rollout::KubeletStop;
pub use config::*;
use control::{control, control_real};
pub use late::{ConnectFailure, LateArrival};
pub use result::*;
pub use spec::*;

/// The baselines' binary (`examples/baseline`: `--naive`, `--fixed-sleep`), next to the
/// service's.
pub fn baseline_bin(service_bin: &Path) -> PathBuf {
    service_bin.with_file_name("baseline")
}

/// The node agent (`agent/`, built beside the service by `cargo build --workspace --bins`):
/// `target/<profile>/lameduck-agent` for `target/<profile>/examples/service`.
pub fn agent_bin(service_bin: &Path) -> PathBuf {
    service_bin.parent().and_then(Path::parent).map_or_else(
        || PathBuf::from("lameduck-agent"),
        |p| p.join("lameduck-agent"),
    )
}

/// The node agents of a cell, one per node namespace, killed when dropped.
struct Agents(Vec<std::process::Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts an agent in each node's namespace, reading that node's rules, listening on
/// [`AGENT_PORT`](net::AGENT_PORT); each has answered once before this returns.
fn start_agents(
    netns: &Netns,
    (nodes, down): (usize, &[usize]),
    backend: Backend,
    bin: &Path,
    dir: &Path,
) -> Result<Agents, NetError> {
    let mut agents = Agents(Vec::new());
    let source = match backend {
        Backend::Iptables => "iptables",
        Backend::Nftables => "nftables",
    };
    for k in (1..=nodes).filter(|k| !down.contains(k)) {
        let log = std::fs::File::create(dir.join(format!("agent-node{k}.log")))
            .map_err(|e| NetError(format!("agent log: {e}")))?;
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &netns.node_of(k)])
            .arg(bin)
            .args(["--listen", &format!("0.0.0.0:{}", net::AGENT_PORT)])
            .args(["--node-name", &format!("node{k}"), "--source", source])
            .args(["--refresh", "100ms"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| NetError(format!("start the agent {}: {e}", bin.display())))?;
        agents.0.push(child);
    }
    Ok(agents)
}

/// Runs one cell end to end and writes its files under `out/<cell>/`.
///
/// `service_bin` is the example service (`target/<profile>/examples/service`); the baselines
/// run `examples/baseline` next to it ([`baseline_bin`]).
pub fn run_cell(
    config: &CellConfig,
    service_bin: &Path,
    out: &Path,
) -> Result<CellResult, NetError> {
    let name = config.name();
    let dir = out.join(name.replace('/', "_"));
    std::fs::create_dir_all(&dir).map_err(|e| NetError(format!("{}: {e}", dir.display())))?;
    let specs = config.node_specs();
    let netns = Netns::create_nodes(specs.len())?;
    for (i, spec) in specs.iter().enumerate() {
        if let Some(c) = spec.clients.filter(|c| c.pods > 1) {
            netns.add_client_pods(i + 1, c.pods)?;
        }
    }
    // The node agents, when the cell asks the proxies: the lameduck service is told where
    // they are (`--node-agents`, in `config.server_cmd`).
    let _agents = if config.agents {
        let bin = agent_bin(service_bin);
        let nodes = (specs.len(), config.agents_down.as_slice());
        Some(start_agents(&netns, nodes, config.backend, &bin, &dir)?)
    } else {
        None
    };
    let node_ns = netns.node();

    // The clients wait for the go (the first Pods created, not yet ready), are counted from
    // the moment every node routes the first Pods (unix ms), run until the stop, then hand
    // their results back.
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let (count_tx, count_rx) = tokio::sync::watch::channel(None::<f64>);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (client_threads, done) = spawn_clients(&specs, &netns, go_rx, count_rx, stop_rx);

    let signals = control::Signals {
        go: go_tx,
        count: count_tx,
        stop: stop_tx,
    };
    // `keep` holds the model's namespaces until the results are read.
    let (control_result, events, keep) = match config.stack {
        Stack::Model => run_model(config, netns, service_bin, &dir, signals, done)?,
        Stack::Real => {
            let cfg = config.clone();
            let bin = config.server_bin(service_bin);
            let d = dir.clone();
            let node = net::spawn_in(&node_ns, move || async move {
                let (r, events) = control_real(netns, cfg, bin, d, signals).await;
                done.await;
                (r, events)
            });
            let (r, events) = node
                .join()
                .map_err(|_| NetError("the node thread panicked".into()))??;
            (Ok(r), events, None)
        }
    };
    let client_result = join_clients(client_threads)?;
    if let Ok(json) = serde_json::to_string_pretty(&events) {
        let _ = std::fs::write(dir.join("events.json"), json);
    }
    let deleted = control_result??;
    let results = client_result.map_err(NetError)?;
    let result = cell_result(config, name, &dir, &results, &deleted, events);
    // Dropping the last reference to the cluster removes the namespaces.
    drop(keep);
    Ok(result)
}

/// The model's side of a cell: its proxies, its cluster, the control loop in the node
/// namespace; what it returned, its events, and the cluster (whose drop removes the
/// namespaces).
#[allow(clippy::type_complexity)]
fn run_model(
    config: &CellConfig,
    netns: Netns,
    service_bin: &Path,
    dir: &Path,
    signals: control::Signals,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<
    (
        Result<Result<Vec<String>, NetError>, NetError>,
        Vec<Event>,
        Option<Arc<Cluster>>,
    ),
    NetError,
> {
    let node_ns = netns.node();
    let proxies = (1..=config.node_specs().len())
        .map(|k| Proxy::install(config.backend, &netns.node_of(k)))
        .collect::<Result<Vec<Proxy>, NetError>>()?;
    let (server, pre_stop) = config.server_cmd(service_bin);
    let cluster = Cluster::new(
        netns,
        config.plane(),
        config.kubelet(pre_stop),
        server,
        dir.to_path_buf(),
    );
    let c = cluster.clone();
    let cfg = config.clone();
    let node = net::spawn_in(&node_ns, move || async move {
        let r = control(c, cfg, proxies, signals).await;
        done.await;
        r
    });
    let r = node
        .join()
        .map_err(|_| NetError("the node thread panicked".into()))?;
    let events = cluster.events();
    Ok((r, events, Some(cluster)))
}

/// The clients behind each node, one thread each in the node's client namespace; and a
/// future that ends when all of them are done (or 30 s after the stop): the Pods live until
/// then, so streams still running end on their own.
#[allow(clippy::type_complexity)]
fn spawn_clients(
    specs: &[NodeSpec],
    netns: &Netns,
    go_rx: tokio::sync::watch::Receiver<bool>,
    count_rx: tokio::sync::watch::Receiver<Option<f64>>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> (
    Vec<std::thread::JoinHandle<Result<Result<Vec<Counted>, String>, NetError>>>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut client_threads = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let Some(clients_spec) = spec.clients else {
            continue;
        };
        let prefix = if specs.len() > 1 {
            format!("node{}-", i + 1)
        } else {
            String::new()
        };
        let (go_rx, count_rx, stop_rx, done_tx) = (
            go_rx.clone(),
            count_rx.clone(),
            stop_rx.clone(),
            done_tx.clone(),
        );
        let node = i + 1;
        client_threads.push(net::spawn_in(&netns.client_of(node), move || async move {
            let r = clients(clients_spec, (node, prefix), go_rx, count_rx, stop_rx).await;
            drop(done_tx);
            r
        }));
    }
    drop(done_tx);
    let done = async move {
        let _ = tokio::time::timeout(Duration::from_secs(30), done_rx.recv()).await;
    };
    (client_threads, done)
}

/// Every client thread's probes, or the first error.
#[allow(clippy::type_complexity)]
fn join_clients(
    threads: Vec<std::thread::JoinHandle<Result<Result<Vec<Counted>, String>, NetError>>>,
) -> Result<Result<Vec<Counted>, String>, NetError> {
    let mut all: Result<Vec<Counted>, String> = Ok(Vec::new());
    for thread in threads {
        let r = thread
            .join()
            .map_err(|_| NetError("a client thread panicked".into()))??;
        all = match (all, r) {
            (Ok(mut all), Ok(more)) => {
                all.extend(more);
                Ok(all)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
    }
    Ok(all)
}

/// The cell's counts and timelines, with each probe's requests and `cell.json` written to
/// `dir`.
fn cell_result(
    config: &CellConfig,
    name: String,
    dir: &Path,
    results: &[Counted],
    deleted: &[String],
    events: Vec<Event>,
) -> CellResult {
    let mut counts = Counts::default();
    for (i, c) in results.iter().enumerate() {
        counts.add(&c.result, c.counted_from, c.not_sent_before);
        let label = &c.result.summary.label;
        if let Ok(file) = std::fs::File::create(dir.join(format!("probe-{i}-{label}.jsonl"))) {
            let _ = c.result.write_json_lines(std::io::BufWriter::new(file));
        }
    }
    let pods = deleted
        .iter()
        .map(|p| pod_timeline(p, &events, dir, config.stack.as_str()))
        .collect();
    let result = CellResult {
        name,
        config: config.clone(),
        counts,
        pods,
        events,
        dir: dir.to_path_buf(),
    };
    if let Ok(json) = serde_json::to_string_pretty(&result) {
        let _ = std::fs::write(dir.join("cell.json"), json);
    }
    result
}

/// One probe's run, and from when it counts.
struct Counted {
    result: ProbeResult,
    /// Unix ms from which its requests count: every node routed the first Pods (`None`: the
    /// cell ended before that, so everything counts).
    counted_from: Option<f64>,
    /// What its in-flight cap refused before then.
    not_sent_before: u64,
}

/// The probes of a client spec, labels prefixed with `prefix`.
fn probe_configs(spec: ClientSpec, prefix: &str) -> Vec<ProbeConfig> {
    let target = format!("{SERVICE_VIP}:{SERVICE_PORT}");
    let base = |label: &str, mode: ConnectionMode, http: HttpVersion| {
        let mut c = ProbeConfig::new(target.clone());
        c.label = format!("{prefix}{label}");
        c.connections = mode;
        c.http = http;
        c.duration = Duration::from_secs(600);
        c.drain_wait = Duration::from_secs(5);
        c.connect_timeout = Duration::from_secs(2);
        // They start before any Pod is ready: the Service has no endpoint yet.
        c.allow_unreachable_start = true;
        c.slow = Duration::from_secs(1);
        c.stream = Duration::from_secs(2);
        c.short_rate = 0.0;
        c.slow_rate = 0.0;
        c
    };
    let mut configs = Vec::new();
    let mut fresh = base("fresh", ConnectionMode::Fresh, HttpVersion::Http1);
    match spec.shape {
        Shape::Pool => {
            let mut pool = base("pool-h1", ConnectionMode::KeepAlive, HttpVersion::Http1);
            pool.short_rate = 20.0;
            pool.slow_rate = 1.0;
            pool.stream_rate = 0.5;
            configs.push(pool);
            let mut h2 = base("pool-h2c", ConnectionMode::KeepAlive, HttpVersion::Http2);
            h2.short_rate = 5.0;
            configs.push(h2);
            // The heavier keep-alive load: a busy pooling client with several connections.
            let mut heavy = base("heavy-h1", ConnectionMode::KeepAlive, HttpVersion::Http1);
            heavy.short_rate = 100.0;
            heavy.slow_rate = 10.0;
            heavy.slow = Duration::from_millis(300);
            configs.push(heavy);
            fresh.short_rate = spec.rate;
        }
        Shape::Fresh => {
            fresh.short_rate = spec.rate * 0.8;
            fresh.slow_rate = spec.rate * 0.2;
        }
        Shape::OnOff | Shape::Bursts => {
            // Short requests only: every connection is one routing decision, nothing else.
            fresh.label = format!("{prefix}{}", spec.shape.as_str());
            fresh.short_rate = spec.rate;
            fresh.on_off = spec.shape.on_off();
        }
    }
    configs.push(fresh);
    configs
}

/// The probes of node `node`'s clients: with one client Pod, [`probe_configs`]; with several,
/// each Pod's share of them, from its own address (labels end with `-p<i>`).
fn pod_configs(spec: ClientSpec, node: usize, prefix: &str) -> Vec<ProbeConfig> {
    if spec.pods <= 1 {
        return probe_configs(spec, prefix);
    }
    let share = 1.0 / f64::from(spec.pods);
    let mut out = Vec::new();
    for i in 0..spec.pods {
        for mut c in probe_configs(spec, prefix) {
            c.short_rate *= share;
            c.slow_rate *= share;
            c.stream_rate *= share;
            c.label = format!("{}-p{i}", c.label);
            c.bind = Some(net::client_pod_ip(node, i).into());
            out.push(c);
        }
    }
    out
}

/// The client side behind one node: the probes, retry-free, at the VIP; their labels start
/// with `prefix`. They start at `go` (the first Pods created, none ready yet), so each Pod
/// sees its proxies start routing to it on live traffic; `count` says from when their
/// requests count.
async fn clients(
    spec: ClientSpec,
    (node, prefix): (usize, String),
    mut go: tokio::sync::watch::Receiver<bool>,
    mut count: tokio::sync::watch::Receiver<Option<f64>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<Counted>, String> {
    if go.wait_for(|g| *g).await.is_err() {
        return Ok(Vec::new());
    }
    let configs = pod_configs(spec, node, &prefix);
    let mut probes = Vec::new();
    for c in configs {
        let p = Probe::new(c).map_err(|e| format!("probe config: {e}"))?;
        probes.push((p.handle(), tokio::spawn(p.run())));
    }
    // What each probe's cap refused before the count starts; the stop may come first.
    let mut counted_from = None;
    tokio::select! {
        from = count.wait_for(Option::is_some) => {
            counted_from = from.ok().and_then(|f| *f);
        }
        _ = stop.wait_for(|s| *s) => {}
    }
    let not_sent_before: Vec<u64> = probes
        .iter()
        .map(|(h, _)| {
            if counted_from.is_some() {
                h.progress().not_sent
            } else {
                0
            }
        })
        .collect();
    let _ = stop.wait_for(|s| *s).await;
    let mut out = Vec::new();
    for (h, _) in &probes {
        h.stop();
    }
    for ((_, task), not_sent_before) in probes.into_iter().zip(not_sent_before) {
        match task.await {
            Ok(Ok(result)) => out.push(Counted {
                result,
                counted_from,
                not_sent_before,
            }),
            Ok(Err(e)) => return Err(format!("probe: {e}")),
            Err(e) => return Err(format!("probe task: {e}")),
        }
    }
    Ok(out)
}

/// `target/testbed/<unix-seconds>` next to the service binary's `target/`, or `./target/…`.
pub fn default_out(service_bin: &Path) -> PathBuf {
    let target = service_bin
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf);
    target.join("testbed").join(format!("{}", unix_ms() / 1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lameduck runs the service; the baselines run `examples/baseline` next to it, with the
    /// flags the baseline binary takes.
    #[test]
    fn baselines_run_the_baseline_binary_next_to_the_service() {
        let service = Path::new("/t/examples/service");
        for server in Server::ALL {
            let (cmd, _) = CellConfig::new(server).server_cmd(service);
            match server {
                Server::Lameduck => {
                    assert_eq!(cmd.bin, service);
                    assert!(cmd
                        .flags
                        .iter()
                        .all(|f| f != "--naive" && f != "--fixed-sleep"));
                }
                Server::Naive => {
                    assert_eq!(cmd.bin, Path::new("/t/examples/baseline"));
                    assert_eq!(cmd.flags, ["--naive"]);
                }
                Server::Graceful | Server::Sleep5 => {
                    assert_eq!(cmd.bin, Path::new("/t/examples/baseline"));
                    assert_eq!(cmd.flags, ["--fixed-sleep", "0"]);
                }
            }
        }
    }
}
