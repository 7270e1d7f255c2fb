//! A drain that asks this agent: lameduck's `Propagation::node_agents` against the agent as a
//! process over loopback, its rules a file the test rewrites as kube-proxy would. The drain's
//! questions come from 127.0.0.1, the address the rules route to.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lameduck::report::{EvidenceKind, WeakEvidence};
use lameduck::{Drain, EventKind, Propagation, Signals, Trigger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Agent(Child, SocketAddr);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(rules: &Path) -> Agent {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lameduck-agent"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--node-name",
            "node-a",
            "--refresh",
            "50ms",
        ])
        .arg("--source")
        .arg(format!("file:{}", rules.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("READY listen=")
        .unwrap()
        .parse()
        .unwrap();
    Agent(child, addr)
}

fn rules(routed: bool) -> String {
    let mut s = String::from("*nat\n");
    for (i, ep) in ["127.0.0.1", "10.9.9.9"].iter().enumerate() {
        if *ep == "127.0.0.1" && !routed {
            continue;
        }
        s.push_str(&format!(
            "-A KUBE-SVC-WEB -j KUBE-SEP-{i}\n-A KUBE-SEP-{i} -m comment --comment \"shop/web:http\" -j DNAT --to-destination {ep}:8080\n"
        ));
    }
    s + "COMMIT\n"
}

fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lameduck-confirm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("rules")
}

fn drain(p: Propagation) -> Drain {
    Drain::builder()
        .grace_period(Duration::from_secs(30))
        .propagation(p)
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .unwrap()
}

/// Serves `drain` on loopback; its address.
async fn serve(drain: &Drain) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(drain.layer());
    tokio::spawn(lameduck::serve(listener, app, drain));
    addr
}

/// A client pool behind kube-proxy: `conns` kept-alive connections from 127.0.0.2, a request on
/// each every 50 ms, each connection closed (and not replaced: the pool moved elsewhere) once
/// told to. Bounded by `rounds` requests a connection.
async fn pool(addr: SocketAddr, conns: usize, rounds: usize) {
    let mut tasks = Vec::new();
    for _ in 0..conns {
        tasks.push(tokio::spawn(async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::from(([127, 0, 0, 2], 0))).unwrap();
            let mut s = socket.connect(addr).await.unwrap();
            let mut buf = vec![0u8; 4096];
            for _ in 0..rounds {
                if s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                if n == 0 || head.contains("connection: close") {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_behind_a_pool_commits_when_the_nodes_agent_confirms() {
    // Without the agent this drain waits to `max` (a kept-alive pool: `kept_connections`).
    // The node's rules stop routing here 2 s after the trigger; the agent says so, and the
    // drain commits on it.
    let path = scratch("confirm");
    write(&path, &rules(true));
    let agent = start_agent(&path);
    let d = drain(
        Propagation::default()
            .max(Duration::from_secs(12))
            .node_agents([agent.1.to_string()]),
    );
    let addr = serve(&d).await;
    let clients = tokio::spawn(pool(addr, 4, 400));
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert!(d.start(Trigger::Api));
    tokio::time::sleep(Duration::from_secs(2)).await;
    write(&path, &rules(false));
    let report = tokio::time::timeout(Duration::from_secs(20), d.drained())
        .await
        .unwrap();
    clients.await.unwrap();
    let json = report.to_json();
    let ev = report.propagation.evidence.clone().unwrap();
    assert_eq!(ev.kind, EvidenceKind::Confirmed, "{json}");
    let node = &ev.nodes[0];
    assert_eq!(node.node.as_deref(), Some("node-a"), "{json}");
    let confirmed = node.confirmed_at_ms.unwrap();
    assert!((2_000..3_500).contains(&confirmed), "{json}");
    assert!(node.still_routing.is_empty(), "{json}");
    let changed = node.rules_changed_ms.unwrap();
    assert!(
        (1_900..3_000).contains(&changed),
        "the node's own update: {json}"
    );
    let stop = report.event(EventKind::StoppedAccepting).unwrap().at_ms;
    assert!(stop >= confirmed && stop < 5_000, "{json}");
    let line = report
        .event(EventKind::PropagationDone)
        .unwrap()
        .detail
        .clone()
        .unwrap();
    assert!(line.contains("node agents: node-a confirmed at"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_does_not_answer_confirms_nothing_and_is_named() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = listener.local_addr().unwrap();
    // Accepts and never answers.
    let _hold = std::thread::spawn(move || {
        let kept: Vec<_> = listener.incoming().take(200).collect();
        drop(kept);
    });
    let d = drain(
        Propagation::default()
            .max(Duration::from_secs(4))
            .node_agents([silent.to_string()]),
    );
    let addr = serve(&d).await;
    let clients = tokio::spawn(pool(addr, 4, 400));
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert!(d.start(Trigger::Api));
    let report = tokio::time::timeout(Duration::from_secs(20), d.drained())
        .await
        .unwrap();
    clients.await.unwrap();
    let json = report.to_json();
    let ev = report.propagation.evidence.clone().unwrap();
    assert_eq!(ev.kind, EvidenceKind::Max, "{json}");
    assert_eq!(ev.weak, Some(WeakEvidence::KeptConnections), "{json}");
    assert!(ev.nodes[0].confirmed_at_ms.is_none(), "{json}");
    assert!(
        ev.nodes[0].error.as_deref().unwrap().contains("no answer"),
        "{json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_still_routing_at_max_is_served_until_it_stops() {
    // `max` 4 s; the node's rules route here until 7 s: the drain serves past `max` until the
    // agent confirms, rather than refuse what that node still sends.
    let path = scratch("past-max");
    write(&path, &rules(true));
    let agent = start_agent(&path);
    let d = drain(
        Propagation::default()
            .max(Duration::from_secs(4))
            .node_agents([agent.1.to_string()]),
    );
    let addr = serve(&d).await;
    let clients = tokio::spawn(pool(addr, 4, 400));
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert!(d.start(Trigger::Api));
    tokio::time::sleep(Duration::from_secs(7)).await;
    write(&path, &rules(false));
    let report = tokio::time::timeout(Duration::from_secs(25), d.drained())
        .await
        .unwrap();
    clients.await.unwrap();
    let json = report.to_json();
    let ev = report.propagation.evidence.clone().unwrap();
    let stop = report.event(EventKind::StoppedAccepting).unwrap().at_ms;
    assert!((7_000..9_000).contains(&stop), "{json}");
    // The commit rests on the agent's word, not on `max`: labelled `confirmed`, with how long
    // it served past `max` for it.
    assert_eq!(ev.kind, EvidenceKind::Confirmed, "{json}");
    assert!(ev.past_max_ms.unwrap() >= 3_000, "{json}");
    assert!(!ev.still_routed_at_cap, "{json}");
    let done = report.event(EventKind::PropagationDone).unwrap();
    assert!(
        done.detail
            .as_deref()
            .is_some_and(|d| d.contains("ms past max until every node's agent said")),
        "{json}"
    );
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_during_the_drain_confirms_nothing_and_its_node_is_named() {
    // The agent answers "still routed" after the trigger, then dies 1 s in while its node's
    // rules still route here: nothing confirms that node, so the drain does not commit on the
    // agents' word; it waits to `max` as without them, and the report names the node, its
    // last answer and why it stopped answering.
    let path = scratch("killed");
    write(&path, &rules(true));
    let agent = start_agent(&path);
    let d = drain(
        Propagation::default()
            .max(Duration::from_secs(4))
            .node_agents([agent.1.to_string()]),
    );
    let addr = serve(&d).await;
    let clients = tokio::spawn(pool(addr, 4, 400));
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert!(d.start(Trigger::Api));
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(agent);
    let report = tokio::time::timeout(Duration::from_secs(20), d.drained())
        .await
        .unwrap();
    clients.await.unwrap();
    let json = report.to_json();
    let ev = report.propagation.evidence.clone().unwrap();
    assert_eq!(ev.kind, EvidenceKind::Max, "{json}");
    let node = &ev.nodes[0];
    assert_eq!(node.node.as_deref(), Some("node-a"), "{json}");
    assert!(node.confirmed_at_ms.is_none(), "{json}");
    // Its answers before it died said the node still routed here.
    let last = node.last_answer_ms.unwrap();
    assert!(last < 1_500, "{json}");
    assert!(!node.still_routing.is_empty(), "{json}");
    assert!(node.error.is_some(), "{json}");
    let stop = report.event(EventKind::StoppedAccepting).unwrap().at_ms;
    assert!(stop >= 4_000, "{json}");
    assert!(
        report
            .advice
            .iter()
            .any(|a| a.rule.as_str() == "node_agent_unanswered"),
        "{json}"
    );
}
