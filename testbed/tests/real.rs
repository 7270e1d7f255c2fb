//! The CI subset on the real components: etcd, kube-apiserver, kube-controller-manager and
//! kube-proxy built from Kubernetes' source by `testbed/k8s/build.sh`, the testbed as kubelet
//! and Deployment controller through the real API.
//!
//! Needs root, `ip`, `iptables-restore`, `nft`, `conntrack`, `openssl` and the component
//! binaries (`LAMEDUCK_K8S_BIN`, else `/var/cache/lameduck-k8s/<version>`). Without them these
//! tests print a SKIPPED banner and pass — unless `LAMEDUCK_E2E=require` (as `.ci/run` sets),
//! where they fail. The service binary is `target/<profile>/examples/service` (the baselines
//! run `examples/baseline` next to it), which the tests build first
//! (`lameduck_testbed::test_service_bin`); `LAMEDUCK_TESTBED_SERVICE` overrides it.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use lameduck_testbed::cell::{self, CellConfig, CellResult, KubeletStop, Rollout};
use lameduck_testbed::matrix::DENSE;
use lameduck_testbed::{k8s, net, Backend, Server, Shape, Stack};

/// One cell at a time: each runs a control plane, and cells measure timing.
static SERIAL: Mutex<()> = Mutex::new(());

fn service_bin() -> Result<PathBuf, String> {
    lameduck_testbed::test_service_bin()
}

/// `None` (after a loud banner) when the real stack cannot run here and that is allowed.
fn ready() -> Option<PathBuf> {
    let problem = match net::preflight() {
        Err(e) => Some(e.to_string()),
        Ok(()) => match service_bin() {
            Err(e) => Some(e),
            Ok(_) => k8s::Binaries::find(&k8s::default_bin_dir())
                .err()
                .map(|e| e.to_string()),
        },
    };
    match problem {
        None => {
            net::sweep_stale();
            k8s::sweep_cgroups();
            service_bin().ok()
        }
        Some(p) if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") => {
            panic!("real-stack testbed cannot run: {p}, and LAMEDUCK_E2E=require")
        }
        Some(p) => {
            use std::io::Write;
            let _ = write!(
                std::io::stderr(),
                "\n======================================================================\n\
                 SKIPPED: real-stack testbed: {p}\n\
                 (set LAMEDUCK_E2E=require to make this a failure)\n\
                 ======================================================================\n"
            );
            None
        }
    }
}

fn run(cells: &[CellConfig]) -> Vec<CellResult> {
    let Some(bin) = ready() else {
        return Vec::new();
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = cell::default_out(&bin).join("ci-real");
    let mut results = Vec::new();
    for c in cells {
        let r = cell::run_cell(c, &bin, &out)
            .unwrap_or_else(|e| panic!("cell {} could not run: {e}", c.name()));
        println!("{}{}", cell::table_row(&r), r.timelines());
        results.push(r);
    }
    results
}

fn real(server: Server, backend: Backend) -> CellConfig {
    let mut c = CellConfig::new(server);
    c.stack = Stack::Real;
    c.backend = backend;
    c.sync_delay = Duration::from_secs(1);
    c.new_conn_rate = DENSE;
    c.shape = Shape::Pool;
    c
}

/// A lameduck cell's drains: no connection arrived through a proxy that still routed to a
/// Pod whose drain had committed (each named, with its node), and nothing lost at all.
fn assert_drains_clean(r: &CellResult) {
    if let Err(e) = r.check_drains() {
        panic!("{e}: {}", describe(r));
    }
}

/// Whether the service binary was built with the `kube` feature.
fn built_with_kube(bin: &std::path::Path) -> bool {
    std::fs::read(bin)
        .map(|b| {
            // Printed only by the service's `#[cfg(feature = "kube")]` EndpointWatch start.
            let mark: &[u8] = b"service: no EndpointSlice evidence: ";
            b.windows(mark.len()).any(|w| w == mark)
        })
        .unwrap_or(false)
}

fn describe(r: &CellResult) -> String {
    format!(
        "{}{}first failure: {:?}\nfiles: {}",
        cell::table_row(r),
        r.timelines(),
        r.counts.first_failure,
        r.dir.display()
    )
}

/// A rolling replacement through the real API, the real EndpointSlice controller and the real
/// kube-proxy (iptables with the real Deployment controller, then nftables with the testbed
/// as that controller): lameduck loses nothing, and every deleted Pod's four
/// steps are seen in order — the endpoint change from the API's watch, the proxy update from
/// kube-proxy's own sync timestamp, the exit after both.
#[test]
fn real_stack_lameduck_loses_nothing() {
    // iptables with the real Deployment controller rolling, nftables with the testbed's.
    let mut by_deployment = real(Server::Lameduck, Backend::Iptables);
    by_deployment.deployment = true;
    let results = run(&[by_deployment, real(Server::Lameduck, Backend::Nftables)]);
    for r in &results {
        assert!(
            r.counts.requests > 100,
            "too little traffic: {}",
            describe(r)
        );
        assert_drains_clean(r);
        assert_eq!(r.pods.len(), 2, "two Pods rolled: {}", describe(r));
        for p in &r.pods {
            let s = &p.steps;
            let (Some(ep), Some(px), Some(exit)) =
                (s.endpoint_change_ms, s.proxy_update_ms, s.exit_ms)
            else {
                panic!("{}: a step was not seen: {}", p.pod, describe(r));
            };
            assert!(
                ep <= px && px <= exit,
                "{}: expected endpoint change <= proxy update <= exit: {}",
                p.pod,
                describe(r)
            );
        }
    }
}

/// The same rollout with `--naive` (exit on SIGTERM): the real kube-proxy still sends new
/// connections to the Pod after it exited, so requests are lost — the cell can tell.
#[test]
fn real_stack_naive_loses_requests() {
    for r in &run(&[real(Server::Naive, Backend::Iptables)]) {
        assert!(
            r.counts.requests > 100,
            "too little traffic: {}",
            describe(r)
        );
        assert!(
            r.counts.lost() > 0,
            "naive lost nothing on the real stack, so the cell cannot tell: {}",
            describe(r)
        );
    }
}

/// The `kube` feature in-cluster: the Pods run as `examples/k8s/`'s ServiceAccount with its
/// RBAC applied unchanged, get a real token, CA and namespace, reach the API through the
/// `kubernetes` Service (the real kube-proxy's rules), and the drain report's evidence is the
/// EndpointSlice read from the real API. Needs the service built with the `kube` feature, as
/// `cargo test --workspace --all-features` builds it.
#[test]
fn real_stack_kube_feature_reads_the_real_endpoint_slices() {
    let Some(bin) = ready() else {
        return;
    };
    if !built_with_kube(&bin) {
        let p = format!(
            "{} was built without the `kube` feature (cargo build --example service --features kube)",
            bin.display()
        );
        if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") {
            panic!("{p}, and LAMEDUCK_E2E=require");
        }
        eprintln!("SKIPPED: {p}");
        return;
    }
    let mut c = real(Server::Lameduck, Backend::Iptables);
    c.kube = true;
    // Fresh connections only: a path that kept connections alive (the pool shape's clients)
    // proves nothing by its silence (`kept_connections`), so the measured allowance would be
    // a floor and every drain wait to `max`; a fresh client's path judges its own silence,
    // which is what makes the measured allowance proof.
    c.shape = Shape::Fresh;
    // `max` 15 s: the fresh client's silence needs up to 3.5 s per Pod (its arrivals show
    // gaps of a second), so that both ways a drain may end are seen on their own evidence,
    // not on where `max` happens to fall.
    c.grace = Duration::from_secs(30);
    let mut on_slices = 0;
    for r in &run(&[c]) {
        assert_drains_clean(r);
        for p in &r.pods {
            let path = r.dir.join(format!("{}.report.json", p.pod));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}: {}", path.display(), describe(r)));
            let v: serde_json::Value = serde_json::from_str(&text).expect("report JSON");
            let ev = &v["propagation"]["evidence"];
            // The slices were read from the real API: the change is in the report. The
            // watch's startup gate holds readiness until it has listed, so it sees the slices
            // list the Pod ready and measures the proxies' delay from there: the commit rests
            // on the slices plus that measured allowance when the path's own arrivals judge
            // its silence; when they cannot, the allowance is a floor and the drain waits to
            // max, and says why.
            assert_eq!(
                ev["endpoint_slice"]["condition"],
                "ready=false",
                "{}: the report did not read the EndpointSlice: {ev}\n{}",
                p.pod,
                describe(r)
            );
            assert!(
                ev["endpoint_slice"]["changed_at_ms"].is_i64(),
                "{}: no slice change in the report: {ev}",
                p.pod
            );
            assert_eq!(
                ev["endpoint_slice"]["allowance_source"],
                "measured",
                "{}: the proxy allowance was not measured at startup: {ev}\n{}",
                p.pod,
                describe(r)
            );
            let kind = ev["kind"].as_str().unwrap_or_default();
            let proof = ev["endpoint_slice"]["allowance_proof"].as_bool();
            match kind {
                "endpoint_slice" => {
                    assert_eq!(proof, Some(true), "{}: {ev}", p.pod);
                    assert!(ev["weak"].is_null(), "{}: {ev}", p.pod);
                    on_slices += 1;
                }
                "max" => {
                    assert_eq!(proof, Some(false), "{}: {ev}", p.pod);
                    assert!(
                        ev["weak"].is_string(),
                        "{}: max, evidence not weak: {ev}",
                        p.pod
                    );
                }
                _ => panic!("{}: committed on {kind}: {ev}", p.pod),
            }
            let (changed, allowance) = (
                ev["endpoint_slice"]["changed_at_ms"].as_i64().unwrap(),
                ev["endpoint_slice"]["allowance_ms"].as_i64().unwrap(),
            );
            let done = v["timeline"]
                .as_array()
                .and_then(|t| t.iter().find(|e| e["event"] == "propagation_done"))
                .and_then(|e| e["at_ms"].as_i64())
                .expect("propagation_done in the timeline");
            assert!(
                done >= changed + allowance,
                "{}: committed at {done} ms, before the slice change ({changed} ms) + {allowance} ms",
                p.pod
            );
        }
    }
    // A cell meant to test the slices' evidence does not end every drain at max.
    assert!(on_slices > 0, "no drain committed on the slices");
}

/// Issue 33's cell on the real components: two nodes, each with its own real kube-proxy
/// (`--hostname-override`, its own configuration) writing its rules in its own namespace.
/// Node 1's `minSyncPeriod` is 1 s and carries dense fresh connections; node 2's is 6 s (slow
/// by configuration) and carries a trickle of fresh connections from its own clients. The
/// drain must outlast node 2's update, read from its own sync timestamp; no request may be
/// lost.
#[test]
fn real_stack_two_nodes_the_drain_outlasts_the_slowest_proxy() {
    let mut c = real(Server::Lameduck, Backend::Iptables);
    c.grace = Duration::from_secs(30);
    c.nodes = vec![
        cell::NodeSpec {
            sync_delay: Duration::from_secs(1),
            slow: false,
            clients: Some(cell::ClientSpec::new(Shape::Fresh, DENSE)),
        },
        cell::NodeSpec {
            sync_delay: Duration::from_secs(6),
            slow: false,
            clients: Some(cell::ClientSpec::new(Shape::Fresh, 2.0)),
        },
    ];
    for r in &run(&[c]) {
        assert!(
            r.counts.requests > 100,
            "too little traffic: {}",
            describe(r)
        );
        assert_drains_clean(r);
        for p in &r.pods {
            assert_eq!(
                p.steps.per_node.len(),
                2,
                "{}: both kube-proxies' syncs are seen: {}",
                p.pod,
                describe(r)
            );
            let after = p.steps.exit_after_proxy_ms().unwrap_or_else(|| {
                panic!(
                    "{}: no slowest proxy update or no exit: {}",
                    p.pod,
                    describe(r)
                )
            });
            assert!(
                after >= 0,
                "{}: the drain committed while node 2's kube-proxy still routed to it: {}",
                p.pod,
                describe(r)
            );
        }
    }
}

/// Issue 47's many peers on the real components: four nodes, each with its own real
/// kube-proxy and 20 client Pods (an address each, 80 peers: more than the drain's 63 rows),
/// three nodes converging within 1 s with dense fresh connections, the fourth 6 s behind with a
/// trickle. With a table of 16 rows never freed, the later peers shared one row fitted as one
/// path, and a dense peer's silence passed for a sparse one's; now each live peer has its row
/// or the shared row proves nothing. Every drain must outlast the slowest kube-proxy's update,
/// with nothing lost.
#[test]
fn real_stack_twenty_client_pods_per_node_never_commit_before_the_slowest_proxy() {
    let mut c = real(Server::Lameduck, Backend::Iptables);
    c.grace = Duration::from_secs(30);
    let node = |sync: u64, rate: f64| cell::NodeSpec {
        sync_delay: Duration::from_secs(sync),
        slow: false,
        clients: Some(cell::ClientSpec {
            pods: 20,
            ..cell::ClientSpec::new(Shape::Fresh, rate)
        }),
    };
    c.nodes = vec![node(1, DENSE), node(1, DENSE), node(1, DENSE), node(6, 4.0)];
    for r in &run(&[c]) {
        assert!(
            r.counts.requests > 100,
            "too little traffic: {}",
            describe(r)
        );
        assert_drains_clean(r);
        for p in &r.pods {
            assert_eq!(p.steps.per_node.len(), 4, "{}: {}", p.pod, describe(r));
            let after = p.steps.exit_after_proxy_ms().unwrap_or_else(|| {
                panic!(
                    "{}: no slowest proxy update or no exit: {}",
                    p.pod,
                    describe(r)
                )
            });
            assert!(
                after >= 0,
                "{}: the drain committed while the slow node's kube-proxy still routed to it: {}",
                p.pod,
                describe(r)
            );
        }
    }
}

/// Issue 45's cells on the real components: the node agent reads the real kube-proxy's rules in
/// each node's namespace, and the drain asks it. Pool + fresh behind kube-proxy
/// (`minSyncPeriod`) 4 s, iptables then nftables; two nodes 1 s and 6 s behind with pools and
/// fresh connections through both; warm Pods, grace 30 s. Every drain commits when the slowest
/// node's rules stopped routing to it (`confirmed`), not at `max`, and loses nothing.
#[test]
fn real_stack_node_agents_confirm_each_nodes_update() {
    let mut cells = Vec::new();
    for backend in [Backend::Iptables, Backend::Nftables] {
        let mut c = real(Server::Lameduck, backend);
        c.grace = Duration::from_secs(30);
        c.sync_delay = Duration::from_secs(4);
        c.agents = true;
        cells.push(c);
    }
    let mut two = real(Server::Lameduck, Backend::Iptables);
    two.grace = Duration::from_secs(30);
    two.agents = true;
    let node = |sync: u64, rate: f64| cell::NodeSpec {
        sync_delay: Duration::from_secs(sync),
        slow: false,
        clients: Some(cell::ClientSpec::new(Shape::Pool, rate)),
    };
    two.nodes = vec![node(1, DENSE), node(6, 2.0)];
    cells.push(two);
    for r in &run(&cells) {
        assert!(
            r.counts.requests > 100,
            "too little traffic: {}",
            describe(r)
        );
        assert_drains_clean(r);
        for p in &r.pods {
            assert!(p.confirmed(), "{}: {}", p.pod, describe(r));
            let after = p.steps.exit_after_proxy_ms().unwrap_or_else(|| {
                panic!(
                    "{}: no slowest proxy update or no exit: {}",
                    p.pod,
                    describe(r)
                )
            });
            assert!(
                (0..=3_000).contains(&after),
                "{}: exit {after} ms after the slowest proxy update: {}",
                p.pod,
                describe(r)
            );
        }
    }
}

/// A node slower than `max`: kube-proxy 20 s behind (`minSyncPeriod`), grace 30 s (`max`
/// 15 s). With the agent the drain serves until that node's rules stop routing to it (past
/// `max`); without it, on the arrivals alone, until its fresh connections stop — inside the
/// grace either way, and nothing lost.
#[test]
fn real_stack_a_node_slower_than_max_is_outlasted() {
    let mut cells = Vec::new();
    for agents in [true, false] {
        let mut c = real(Server::Lameduck, Backend::Iptables);
        c.grace = Duration::from_secs(30);
        c.sync_delay = Duration::from_secs(20);
        c.shape = Shape::Fresh;
        c.new_conn_rate = 2.0;
        c.agents = agents;
        cells.push(c);
    }
    for r in &run(&cells) {
        assert_drains_clean(r);
        for p in &r.pods {
            let after = p.steps.exit_after_proxy_ms().unwrap_or_else(|| {
                panic!("{}: no proxy update or no exit: {}", p.pod, describe(r))
            });
            assert!(
                after >= 0,
                "{}: exit before the update: {}",
                p.pod,
                describe(r)
            );
            assert!(
                p.drain_ms.is_some_and(|d| d < 29_000),
                "{}: past the grace: {}",
                p.pod,
                describe(r)
            );
        }
    }
}

/// Issue 48's cells: the kubelet terminates a Pod on its own — the `DisruptionTarget`
/// condition through the real API, no deletion, `preStop`, SIGTERM, SIGKILL when the node's
/// budget ends — with the Pod's grace at 30 s, two replicas, pool + fresh traffic, warm Pods.
///
/// - Node shutdown, 15 s, with the `kube` feature: the watch reads the condition, the drain
///   plans for the node's budget and answers kubelet's probe "not ready" (no `terminating`
///   condition will take the Pod out of its slices); the report is written, every closer ran,
///   nothing is lost, the exit comes before the kill.
/// - The negative control, the same termination without the feature (what every release before
///   this one did): the drain plans for its 30 s and the kubelet's SIGKILL at 15 s finds it
///   still waiting: no report, no closer.
/// - Hard node-pressure eviction (2 s, the watch's default for an eviction): the report is
///   written and the closers ran before the kill; what was still in flight when the 1–2 s
///   ran out may be cut, and the report counts it.
#[test]
fn real_stack_kubelet_terminations_fit_their_budget() {
    let Some(bin) = ready() else {
        return;
    };
    if !built_with_kube(&bin) {
        let p = format!("{} was built without the `kube` feature", bin.display());
        if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") {
            panic!("{p}, and LAMEDUCK_E2E=require");
        }
        eprintln!("SKIPPED: {p}");
        return;
    }
    let cell = |stop: KubeletStop, kube: bool| {
        let mut c = real(Server::Lameduck, Backend::Iptables);
        c.replicas = 2;
        c.grace = Duration::from_secs(30);
        c.rollout = Rollout::Kubelet(stop);
        c.kube = kube;
        c
    };
    let shutdown = KubeletStop::NodeShutdown(Duration::from_secs(15));
    let results = run(&[
        cell(shutdown, true),
        cell(shutdown, false),
        cell(KubeletStop::HardEviction, true),
    ]);
    let [fitted, control, hard] = results.as_slice() else {
        return;
    };
    let report = |r: &CellResult| -> Option<serde_json::Value> {
        let path = r.dir.join(format!("{}.report.json", r.pods[0].pod));
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok()
    };
    let killed = |r: &CellResult| {
        r.events
            .iter()
            .any(|e| e.what == "killed" && e.pod.as_deref() == Some(r.pods[0].pod.as_str()))
    };

    // Fitted: clean, inside the budget, the report names it, the closers ran.
    assert_eq!(fitted.pods.len(), 1, "{}", describe(fitted));
    assert!(
        fitted.counts.requests > 100,
        "too little traffic: {}",
        describe(fitted)
    );
    assert_drains_clean(fitted);
    assert!(!killed(fitted), "SIGKILLed: {}", describe(fitted));
    let drain_ms = fitted.pods[0].drain_ms.expect("an exit");
    assert!(
        drain_ms < 15_000,
        "exit at {drain_ms} ms: {}",
        describe(fitted)
    );
    let v = report(fitted).unwrap_or_else(|| panic!("no report: {}", describe(fitted)));
    assert_eq!(v["budget"]["deletion"]["source"], "node_shutdown", "{v}");
    assert!(
        v["budget"]["deletion"]["kill_at_ms"].as_u64().unwrap() <= 15_000,
        "{v}"
    );
    let closers = v["closers"].as_array().expect("closers");
    assert!(
        !closers.is_empty() && closers.iter().all(|c| c["result"] == "ok"),
        "{v}"
    );
    assert!(
        v["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"] == "readiness_flipped"
                && e["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("sets no deletion"))),
        "{v}"
    );

    // The control: killed at the node's budget, no report, so no closer ran.
    assert!(killed(control), "not SIGKILLed: {}", describe(control));
    assert!(
        report(control).is_none(),
        "a report was written: {}",
        describe(control)
    );

    // Hard eviction: the report and the closers before the kill.
    assert!(!killed(hard), "SIGKILLed: {}", describe(hard));
    let v = report(hard).unwrap_or_else(|| panic!("no report: {}", describe(hard)));
    assert_eq!(
        v["budget"]["deletion"]["source"], "node_pressure_eviction",
        "{v}"
    );
    let closers = v["closers"].as_array().expect("closers");
    assert!(
        !closers.is_empty() && closers.iter().all(|c| c["result"] == "ok"),
        "{v}"
    );
    println!(
        "node shutdown 15 s: fitted {} lost, exit {drain_ms} ms; control {} lost, killed; hard \
         eviction {} lost, exit {} ms",
        fitted.counts.lost(),
        control.counts.lost(),
        hard.counts.lost(),
        hard.pods[0].drain_ms.unwrap_or(0)
    );
}
