//! `lameduck-testbed`: runs cells of the kube-proxy datapath testbed. See the README.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use lameduck_testbed::cell::{self, CellConfig, CellResult};
use lameduck_testbed::{matrix, net, Server, Stack};

const USAGE: &str = "\
usage: lameduck-testbed [--service-bin PATH] [--out DIR] [--timelines]
                        [--stack model|real|both] [--k8s-bin DIR] COMMAND
commands:
  cell [--server lameduck|naive|graceful|sleep5] [--backend iptables|nftables]
       [--sync-delay DUR] [--slice-delay DUR] [--rate N] [--shape pool|fresh|onoff|bursts] [--evict]
       [--kubelet-stop node-shutdown:DUR|soft-eviction:DUR|hard-eviction]
       [--replicas N] [--grace DUR] [--warmup DUR] [--start-delay DUR] [--publish-not-ready] [--lameduck-flag FLAG]... [--exec-hook]
       [--min-sync-period] [--kube] [--deployment] [--agents]
       [--nodes N [--node-sync DUR,DUR,…] [--slow-nodes K,…] [--clients node1=SHAPE[:RATE][@PODS],node2=…]]
  matrix     sync delay x rate x shape x backend x server, and the single-replica eviction
  table      every server, iptables, 1 s sync, pool, dense
  eviction   the single-replica eviction for every server
  bursty     on/off and burst clients (fresh connections), kube-proxy 6 s and 1 s behind,
             eviction (deleted where a pause begins) and rolling update
  nodes      two and three nodes whose kube-proxies converge at different times, clients
             behind each (dense through the fast, a trickle or a pool through the slow);
             every server, and lameduck with --kube on the real stack
  sweep      remove namespaces left by runs that were killed
--rate is per second while sending (default 50; onoff 10, 5 s on, 5 s off; bursts 100,
200 ms every 3 s). DUR: 300ms, 1s, 1.5s. --service-bin defaults to examples/service next to this binary;
the baselines (naive, graceful, sleep5) run examples/baseline next to the service binary.
--stack real runs every cell on kube-apiserver, kube-controller-manager and kube-proxy built by
testbed/k8s/build.sh (in --k8s-bin, default $LAMEDUCK_K8S_BIN or /var/cache/lameduck-k8s/<v>),
with --sync-delay as kube-proxy's min-sync-period; --stack both runs each cell on the model,
then on the real stack. --min-sync-period: the model's kube-proxy applies --sync-delay as the
real sync runner applies minSyncPeriod. --kube and --deployment: real stack only (README); with
--stack both such a cell runs once, on the real stack.
--nodes N (2 to 8): N nodes joined by a bridge, each with its own kube-proxy (--node-sync: one
delay per node, default --sync-delay for all) and its own clients (--clients: per node a shape
and rate, e.g. node1=fresh:50,node2=pool:0.7, and with @PODS that many client Pods sharing
the rate, each from an address of its own, e.g. node1=fresh:50@20; nodes not named get none;
default: every node the cell's --shape and --rate). --slow-nodes: on the model, these nodes' syncs take their
delay (each writes the slice it read when it began). --agents: a node agent on every node, and
the service asks them (--node-agents).";

fn fail(msg: &str) -> ! {
    eprintln!("lameduck-testbed: {msg}\n{USAGE}");
    std::process::exit(2)
}

fn dur(flag: &str, v: &str) -> Duration {
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        fail(&format!(
            "{flag} {v:?}: expected a duration like 300ms or 1.5s"
        ))
    };
    match num.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && x * scale <= 3600.0 => {
            Duration::from_secs_f64(x * scale)
        }
        _ => fail(&format!(
            "{flag} {v:?}: expected a duration like 300ms or 1.5s"
        )),
    }
}

/// The flags before the command.
struct Global {
    service_bin: Option<PathBuf>,
    out: Option<PathBuf>,
    timelines: bool,
    stacks: Vec<Stack>,
}

/// Reads the flags before the command; `None` after `--help`.
fn parse_global(args: &mut std::iter::Peekable<impl Iterator<Item = String>>) -> Option<Global> {
    let mut g = Global {
        service_bin: None,
        out: None,
        timelines: false,
        stacks: vec![Stack::Model],
    };
    while let Some(a) = args.peek() {
        match a.as_str() {
            "--service-bin" => {
                args.next();
                g.service_bin = Some(
                    args.next()
                        .unwrap_or_else(|| fail("--service-bin needs a path"))
                        .into(),
                );
            }
            "--out" => {
                args.next();
                g.out = Some(
                    args.next()
                        .unwrap_or_else(|| fail("--out needs a directory"))
                        .into(),
                );
            }
            "--timelines" => {
                args.next();
                g.timelines = true;
            }
            "--stack" => {
                args.next();
                g.stacks = match args.next().as_deref() {
                    Some("model") => vec![Stack::Model],
                    Some("real") => vec![Stack::Real],
                    Some("both") => vec![Stack::Model, Stack::Real],
                    _ => fail("--stack: expected model, real or both"),
                };
            }
            "--k8s-bin" => {
                args.next();
                let dir = args
                    .next()
                    .unwrap_or_else(|| fail("--k8s-bin needs a directory"));
                // Read by the cells' node threads (k8s::default_bin_dir).
                std::env::set_var("LAMEDUCK_K8S_BIN", dir);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return None;
            }
            _ => break,
        }
    }
    Some(g)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    let Some(g) = parse_global(&mut args) else {
        return ExitCode::SUCCESS;
    };
    let command = args.next().unwrap_or_else(|| fail("a command is needed"));
    if command == "sweep" {
        for n in net::sweep_stale() {
            println!("removed {n}");
        }
        lameduck_testbed::k8s::sweep_cgroups();
        return ExitCode::SUCCESS;
    }
    let base: Vec<CellConfig> = match command.as_str() {
        "cell" => vec![parse_cell(args.collect())],
        "matrix" => matrix::full(),
        "table" => matrix::baseline_table(),
        "eviction" => matrix::eviction(),
        "bursty" => matrix::bursty(),
        "nodes" => matrix::nodes(),
        other => fail(&format!("unknown command {other:?}")),
    };
    let stacks = &g.stacks;
    let cells: Vec<CellConfig> = base
        .into_iter()
        .flat_map(|c| {
            stacks.iter().map(move |s| CellConfig {
                stack: *s,
                ..c.clone()
            })
        })
        .filter(CellConfig::runs_on_its_stack)
        .collect();
    if cells.is_empty() {
        fail("--kube and --deployment run on the real stack only: add --stack real or both");
    }
    let service_bin = match binaries(&g, &cells) {
        Ok(b) => b,
        Err(code) => return code,
    };
    for n in net::sweep_stale() {
        eprintln!("removed a namespace left by a killed run: {n}");
    }
    lameduck_testbed::k8s::sweep_cgroups();
    install_signal_cleanup();
    let out = g
        .out
        .clone()
        .unwrap_or_else(|| cell::default_out(&service_bin));
    run_cells(&cells, &service_bin, &out, g.timelines)
}

/// The service binary, once it, the baseline (when a cell needs it), the Kubernetes
/// binaries (for the real stack) and the host are there; else the exit code.
fn binaries(g: &Global, cells: &[CellConfig]) -> Result<PathBuf, ExitCode> {
    if g.stacks.contains(&Stack::Real) {
        if let Err(e) =
            lameduck_testbed::k8s::Binaries::find(&lameduck_testbed::k8s::default_bin_dir())
        {
            eprintln!("lameduck-testbed: {e}");
            return Err(ExitCode::from(3));
        }
    }
    let service_bin = g.service_bin.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().unwrap_or_default();
        exe.parent()
            .map(|d| d.join("examples").join("service"))
            .unwrap_or_default()
    });
    if !service_bin.is_file() {
        fail(&format!(
            "no service binary at {} (build it with `cargo build --example service`, or pass --service-bin)",
            service_bin.display()
        ));
    }
    let baseline_bin = cell::baseline_bin(&service_bin);
    if cells.iter().any(|c| c.server != Server::Lameduck) && !baseline_bin.is_file() {
        fail(&format!(
            "no baseline binary at {} (build it with `cargo build --example baseline`)",
            baseline_bin.display()
        ));
    }
    if let Err(e) = net::preflight() {
        eprintln!("lameduck-testbed: {e}");
        return Err(ExitCode::from(3));
    }
    Ok(service_bin)
}

/// Runs the cells one after the other, prints and writes their table.
fn run_cells(cells: &[CellConfig], service_bin: &Path, out: &Path, timelines: bool) -> ExitCode {
    eprintln!("{} cells, files under {}", cells.len(), out.display());
    let mut results: Vec<CellResult> = Vec::new();
    let mut errors = 0;
    for (i, c) in cells.iter().enumerate() {
        eprintln!("[{}/{}] {}", i + 1, cells.len(), c.name());
        match cell::run_cell(c, service_bin, out) {
            Ok(r) => {
                eprint!("{}", cell::table_row(&r));
                if timelines || cells.len() == 1 {
                    eprint!("{}", r.timelines());
                    if let Some(f) = &r.counts.first_failure {
                        eprintln!("  first failure: {f}");
                    }
                }
                results.push(r);
            }
            Err(e) => {
                errors += 1;
                eprintln!("  cell failed to run: {e}");
            }
        }
    }
    let mut table = cell::table_header();
    for r in &results {
        table.push_str(&cell::table_row(r));
    }
    let _ = std::fs::write(out.join("table.txt"), &table);
    print!("{table}");
    if errors > 0 {
        eprintln!("{errors} cells could not run");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// The flags of several nodes, before they are checked against `--nodes`.
#[derive(Default)]
struct NodeFlags {
    nodes: Option<usize>,
    sync: Option<Vec<Duration>>,
    clients: Option<Vec<(usize, cell::ClientSpec)>>,
    slow: Vec<usize>,
}

fn parse_cell(args: Vec<String>) -> CellConfig {
    let mut c = CellConfig::new(cell::Server::Lameduck);
    let mut rate_given = false;
    let mut nf = NodeFlags::default();
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| fail(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--server" => c.server = value().parse().unwrap_or_else(|e: String| fail(&e)),
            "--backend" => c.backend = value().parse().unwrap_or_else(|e: String| fail(&e)),
            "--sync-delay" => c.sync_delay = dur("--sync-delay", &value()),
            "--slice-delay" => c.slice_delay = dur("--slice-delay", &value()),
            "--rate" => {
                rate_given = true;
                c.new_conn_rate = match value().parse::<f64>() {
                    Ok(r) if r > 0.0 && r <= 1000.0 => r,
                    _ => fail("--rate: expected new connections per second in (0, 1000]"),
                }
            }
            "--shape" => c.shape = value().parse().unwrap_or_else(|e: String| fail(&e)),
            "--warmup" => c.warmup = dur("--warmup", &value()),
            "--evict" => c.rollout = cell::Rollout::Evict,
            "--kubelet-stop" => {
                c.rollout =
                    cell::Rollout::Kubelet(value().parse().unwrap_or_else(|e: String| fail(&e)))
            }
            "--replicas" => {
                c.replicas = match value().parse::<usize>() {
                    Ok(n) if (1..=20).contains(&n) => n,
                    _ => fail("--replicas: expected 1 to 20"),
                }
            }
            "--grace" => c.grace = dur("--grace", &value()),
            "--start-delay" => c.start_delay = dur("--start-delay", &value()),
            "--publish-not-ready" => c.publish_not_ready = true,
            "--lameduck-flag" => c.lameduck_flags.push(value()),
            "--exec-hook" => c.exec_hook = true,
            "--kube" => c.kube = true,
            "--agents" => c.agents = true,
            "--deployment" => c.deployment = true,
            "--min-sync-period" => c.min_sync_period = true,
            "--nodes" => {
                nf.nodes = match value().parse::<usize>() {
                    Ok(n) if (1..=net::MAX_NODES).contains(&n) => Some(n),
                    _ => fail(&format!("--nodes: expected 1 to {}", net::MAX_NODES)),
                }
            }
            "--node-sync" => {
                nf.sync = Some(
                    value()
                        .split(',')
                        .map(|d| dur("--node-sync", d.trim()))
                        .collect(),
                )
            }
            "--slow-nodes" => nf.slow.extend(parse_slow_nodes(&value())),
            "--clients" => nf.clients = Some(parse_clients(&value())),
            other => fail(&format!("unknown cell flag {other:?}")),
        }
    }
    if !rate_given {
        c.new_conn_rate = c.shape.default_rate();
    }
    set_nodes(&mut c, nf);
    c
}

/// `--slow-nodes 2,node3`: node numbers, 1-based.
fn parse_slow_nodes(v: &str) -> Vec<usize> {
    v.split(',')
        .map(
            |k| match k.trim().trim_start_matches("node").parse::<usize>() {
                Ok(k) if k >= 1 => k,
                _ => fail(&format!(
                    "--slow-nodes {k:?}: expected node numbers, 1-based"
                )),
            },
        )
        .collect()
}

/// `--clients node1=fresh:50,node2=pool:0.7`.
fn parse_clients(v: &str) -> Vec<(usize, cell::ClientSpec)> {
    v.split(',')
        .map(|part| {
            let Some((node, spec)) = part.split_once('=') else {
                fail(&format!(
                    "--clients {part:?}: expected nodeK=SHAPE[:RATE][@PODS]"
                ))
            };
            let k = node
                .trim()
                .strip_prefix("node")
                .and_then(|k| k.parse::<usize>().ok())
                .filter(|k| *k >= 1)
                .unwrap_or_else(|| fail(&format!("--clients {part:?}: expected node1, node2, …")));
            let spec = spec
                .trim()
                .parse()
                .unwrap_or_else(|e: String| fail(&format!("--clients {part:?}: {e}")));
            (k, spec)
        })
        .collect()
}

/// Checks the node flags against `--nodes` and sets the cell's nodes.
fn set_nodes(c: &mut CellConfig, nf: NodeFlags) {
    let n = nf.nodes.unwrap_or(1);
    if n == 1 && (nf.sync.is_some() || nf.clients.is_some() || !nf.slow.is_empty()) {
        fail("--node-sync, --slow-nodes and --clients need --nodes 2 or more");
    }
    if let Some(k) = nf.slow.iter().find(|k| **k > n) {
        fail(&format!("--slow-nodes: node{k} but --nodes {n}"));
    }
    if n == 1 {
        return;
    }
    let syncs = nf.sync.unwrap_or_else(|| vec![c.sync_delay; n]);
    if syncs.len() != n {
        fail(&format!(
            "--node-sync: {} delays for {n} nodes",
            syncs.len()
        ));
    }
    let cell_clients = cell::ClientSpec::new(c.shape, c.new_conn_rate);
    if let Some((k, _)) = nf.clients.iter().flatten().find(|(k, _)| *k > n) {
        fail(&format!("--clients: node{k} but --nodes {n}"));
    }
    c.nodes = syncs
        .into_iter()
        .enumerate()
        .map(|(i, sync_delay)| cell::NodeSpec {
            sync_delay,
            slow: nf.slow.contains(&(i + 1)),
            clients: match &nf.clients {
                None => Some(cell_clients),
                Some(list) => list.iter().find(|(k, _)| *k == i + 1).map(|(_, s)| *s),
            },
        })
        .collect();
}

/// On SIGINT / SIGTERM: kill the Pods, remove the namespaces, exit 130.
fn install_signal_cleanup() {
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("signal runtime");
        rt.block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        });
        eprintln!("lameduck-testbed: interrupted, removing namespaces");
        net::remove_all_live();
        std::process::exit(130);
    });
}
