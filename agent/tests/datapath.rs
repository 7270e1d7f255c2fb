//! The agent reading real rules: kube-proxy-shaped iptables and nftables rules loaded in a
//! network namespace this test creates (and removes, also on failure), the agent run inside
//! it with `--source iptables` and `--source nftables`, asked from inside it.
//!
//! Needs root, `ip`, `iptables-restore` and `nft`. Without them it says so loudly and passes —
//! unless `LAMEDUCK_E2E=require` (as `.ci/run` sets), where it fails.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace, removed on drop.
struct Netns(String);

impl Netns {
    fn create(tag: &str) -> Netns {
        let name = format!("ldag{}-{tag}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name}");
        let ns = Netns(name);
        ns.run(&["ip", "link", "set", "lo", "up"], None);
        ns
    }

    fn run(&self, argv: &[&str], stdin: Option<&str>) -> String {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Agent(Child, u16);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ready() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let tools = ["ip", "iptables-restore", "iptables-save", "nft"]
        .iter()
        .all(|t| {
            Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
    if root && tools {
        return true;
    }
    let msg =
        "AGENT DATAPATH TEST SKIPPED: needs root, ip, iptables-restore, iptables-save and nft";
    if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") {
        panic!("{msg}, and LAMEDUCK_E2E=require");
    }
    eprintln!("\n!!!!!!!! {msg} !!!!!!!!\n");
    false
}

fn start(ns: &Netns, source: &str) -> Agent {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_lameduck-agent")])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--source",
            source,
            "--refresh",
            "50ms",
        ])
        .args(["--node-name", "node-ns"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no READY line: {line:?}"));
    Agent(child, port)
}

/// The agent's answer to a caller inside the namespace (127.0.0.1), as JSON.
fn ask(ns: &Netns, port: u16) -> serde_json::Value {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET /v1/routes HTTP/1.1\\r\\n\\r\\n' >&3; cat <&3"
    );
    let out = ns.run(&["bash", "-c", &script], None);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn iptables(endpoints: &[&str]) -> String {
    let mut s = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-WEB - [0:0]\n",
    );
    for i in 0..endpoints.len() {
        s.push_str(&format!(":KUBE-SEP-{i} - [0:0]\n"));
    }
    s.push_str("-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -d 198.18.100.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-WEB\n");
    for (i, ep) in endpoints.iter().enumerate() {
        s.push_str(&format!(
            "-A KUBE-SVC-WEB -m comment --comment \"shop/web:http -> {ep}:8080\" -j KUBE-SEP-{i}\n\
             -A KUBE-SEP-{i} -p tcp -m comment --comment \"shop/web:http\" -m tcp -j DNAT --to-destination {ep}:8080\n"
        ));
    }
    s.push_str("COMMIT\n");
    s
}

fn nftables(endpoints: &[&str]) -> String {
    let mut s = String::from("flush ruleset\ntable ip kube-proxy {\n");
    let chain = |ep: &str| format!("endpoint-AAAA-shop/web/tcp/http__{ep}/8080");
    for ep in endpoints {
        s.push_str(&format!(
            "  chain {} {{\n    meta l4proto tcp dnat to {ep}:8080\n  }}\n",
            chain(ep)
        ));
    }
    let vmap: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", chain(ep)))
        .collect();
    s.push_str("  chain service-WEB-shop/web/tcp/http {\n");
    if !vmap.is_empty() {
        s.push_str(&format!(
            "    numgen random mod {} vmap {{ {} }}\n",
            vmap.len(),
            vmap.join(", ")
        ));
    }
    s.push_str("  }\n}\n");
    s
}

#[test]
fn the_agent_reads_kube_proxy_iptables_rules_in_a_namespace() {
    if !ready() {
        return;
    }
    let ns = Netns::create("ipt");
    ns.run(
        &["iptables-restore"],
        Some(&iptables(&["127.0.0.1", "198.18.7.9"])),
    );
    let agent = start(&ns, "iptables");
    let a = ask(&ns, agent.1);
    assert_eq!(a["routed"], true, "{a}");
    assert_eq!(a["modes"][0], "iptables");
    assert_eq!(a["routes"][0]["service"], "shop/web:http");
    assert_eq!(a["routes"][0]["others"], 1);
    // kube-proxy drops this endpoint: the agent's next read says so.
    ns.run(&["iptables-restore"], Some(&iptables(&["198.18.7.9"])));
    eventually("the removal", || ask(&ns, agent.1)["routed"] == false);
}

#[test]
fn the_agent_reads_kube_proxy_nftables_rules_in_a_namespace() {
    if !ready() {
        return;
    }
    let ns = Netns::create("nft");
    ns.run(
        &["nft", "-f", "-"],
        Some(&nftables(&["127.0.0.1", "198.18.7.9"])),
    );
    let agent = start(&ns, "nftables");
    let a = ask(&ns, agent.1);
    assert_eq!(a["routed"], true, "{a}");
    assert_eq!(a["modes"][0], "nftables");
    assert_eq!(a["routes"][0]["service"], "shop/web/tcp/http");
    ns.run(&["nft", "-f", "-"], Some(&nftables(&["198.18.7.9"])));
    eventually("the removal", || ask(&ns, agent.1)["routed"] == false);
}
