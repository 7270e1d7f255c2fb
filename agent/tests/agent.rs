//! The agent as a process, over real sockets on loopback: it answers about the caller only,
//! follows the rules as they change, and keeps its bounds against hostile clients.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The agent, killed on drop.
struct Agent {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(source: &str, extra: &[&str]) -> Agent {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lameduck-agent"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--node-name",
            "node-a",
            "--source",
            source,
        ])
        .args(["--refresh", "50ms"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the agent");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("READY listen=")
        .unwrap_or_else(|| panic!("no READY line: {line:?}"))
        .parse()
        .unwrap();
    Agent { child, addr }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lameduck-agent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A kube-proxy iptables dump whose Service routes to `endpoints`.
fn iptables_rules(endpoints: &[&str]) -> String {
    let mut s = String::from("*nat\n");
    for (i, ep) in endpoints.iter().enumerate() {
        s.push_str(&format!(
            "-A KUBE-SVC-WEB -m comment --comment \"shop/web:http -> {ep}:8080\" -j KUBE-SEP-{i}\n\
             -A KUBE-SEP-{i} -p tcp -m comment --comment \"shop/web:http\" -m tcp -j DNAT --to-destination {ep}:8080\n"
        ));
    }
    s.push_str("COMMIT\n");
    s
}

fn write(path: &Path, text: &str) {
    // Written to a side file and renamed: the agent reads either the old or the new rules.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `GET path` from the local address `from`; the status code and the body.
fn get_from(from: [u8; 4], addr: SocketAddr, path: &str) -> (u16, String) {
    let socket = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5));
    let _ = socket;
    let s = socket2_connect(from, addr);
    exchange(s, &format!("GET {path} HTTP/1.1\r\nhost: agent\r\n\r\n"))
}

/// A TCP connection to `addr` from the loopback address `from`.
fn socket2_connect(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    // std cannot bind before connect; tokio can, on a throwaway runtime.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        socket.connect(addr).await.unwrap()
    });
    let std = stream.into_std().unwrap();
    std.set_nonblocking(false).unwrap();
    std
}

fn exchange(mut s: TcpStream, request: &str) -> (u16, String) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (code, body)
}

fn answer(from: [u8; 4], addr: SocketAddr) -> serde_json::Value {
    let (code, body) = get_from(from, addr, "/v1/routes");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls `cond` every 20 ms, at most 10 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn it_answers_about_the_caller_only_and_follows_the_rules_as_they_change() {
    let dir = scratch("follow");
    let rules = dir.join("rules");
    write(&rules, &iptables_rules(&["127.0.0.2", "127.0.0.3"]));
    let agent = start(&format!("file:{}", rules.display()), &[]);

    let a = answer([127, 0, 0, 2], agent.addr);
    assert_eq!(a["node"], "node-a");
    assert_eq!(a["caller"], "127.0.0.2");
    assert_eq!(a["routed"], true, "{a}");
    assert_eq!(a["routes"][0]["service"], "shop/web:http");
    assert_eq!(a["routes"][0]["endpoint"], "127.0.0.2:8080");
    assert_eq!(a["routes"][0]["others"], 1);
    assert!(
        !a.to_string().contains("127.0.0.3"),
        "nothing about another address: {a}"
    );
    let b = answer([127, 0, 0, 4], agent.addr);
    assert_eq!(b["routed"], false, "{b}");
    assert_eq!(b["routes"].as_array().unwrap().len(), 0);

    // kube-proxy removes 127.0.0.2: the next read says so, and when the rules changed.
    let before = a["rules_changed_unix_ms"].as_u64().unwrap();
    write(&rules, &iptables_rules(&["127.0.0.3"]));
    eventually("the agent to see the change", || {
        answer([127, 0, 0, 2], agent.addr)["routed"] == false
    });
    let now = answer([127, 0, 0, 2], agent.addr);
    assert!(
        now["rules_changed_unix_ms"].as_u64().unwrap() > before,
        "{now}"
    );
    assert!(now["rules_read_unix_ms"].as_u64() >= now["rules_changed_unix_ms"].as_u64());
    assert_eq!(answer([127, 0, 0, 3], agent.addr)["routes"][0]["others"], 0);
}

#[test]
fn unreadable_rules_are_no_confirmation() {
    let dir = scratch("unreadable");
    let agent = start(&format!("file:{}", dir.join("missing").display()), &[]);
    let a = answer([127, 0, 0, 2], agent.addr);
    assert_eq!(a["routed"], serde_json::Value::Null, "{a}");
    assert!(a["error"].as_str().unwrap().contains("missing"), "{a}");
    let (code, body) = get_from([127, 0, 0, 2], agent.addr, "/healthz");
    assert_eq!(code, 503, "{body}");
}

#[test]
fn hostile_requests_get_an_error_or_nothing_and_change_nothing() {
    let dir = scratch("hostile");
    let rules = dir.join("rules");
    write(&rules, &iptables_rules(&["127.0.0.2"]));
    let agent = start(&format!("file:{}", rules.display()), &[]);
    let send = |req: &[u8]| {
        let mut s = TcpStream::connect(agent.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(req);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(send(b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(send(b"GET /v1/routes HTTP/9.9\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(send(b"POST /v1/routes HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    assert!(send(b"GET /../../etc/passwd HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    // 20,000 headers: past the head's bound, the connection closes unanswered.
    let mut big = b"GET /v1/routes HTTP/1.1\r\n".to_vec();
    for i in 0..20_000 {
        big.extend_from_slice(format!("x-h{i}: v\r\n").as_bytes());
    }
    big.extend_from_slice(b"\r\n");
    assert_eq!(send(&big), "", "no answer to an oversized head");
    // A head that never ends is dropped at the head timeout.
    let mut slow = TcpStream::connect(agent.addr).unwrap();
    slow.write_all(b"GET /v1/routes HTTP/1.1\r\nx-slow: ")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(
        slow.read(&mut buf).unwrap_or(0),
        0,
        "closed without an answer"
    );
    assert!(started.elapsed() < Duration::from_secs(9));
    // And the caller still gets its answer.
    assert_eq!(answer([127, 0, 0, 2], agent.addr)["routed"], true);
}

/// How many descriptors this process may open.
fn fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_owned))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

#[test]
fn a_flood_of_idle_connections_is_bounded_and_answers_resume_after_the_head_timeout() {
    let dir = scratch("flood");
    let rules = dir.join("rules");
    write(&rules, &iptables_rules(&["127.0.0.2"]));
    let agent = start(
        &format!("file:{}", rules.display()),
        &["--max-connections", "64"],
    );
    // 10,000 idle connections (fewer where the descriptor limit would not allow them).
    let n = 10_000.min(fd_limit().saturating_sub(200));
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = agent.addr;
    // Opened 500 at a time, concurrently: sequential connects wait out each SYN retry.
    let idle: Vec<tokio::net::TcpStream> = rt.block_on(async move {
        let mut idle = Vec::with_capacity(n);
        for _ in 0..n.div_ceil(500) {
            let batch = (0..500.min(n - idle.len()))
                .map(|_| tokio::spawn(tokio::net::TcpStream::connect(addr)))
                .collect::<Vec<_>>();
            for t in batch {
                if let Ok(Ok(s)) = t.await {
                    idle.push(s);
                }
            }
        }
        idle
    });
    assert!(
        idle.len() >= n.min(1000),
        "only {} connections opened",
        idle.len()
    );
    println!("opened {} in {:?}", idle.len(), t0.elapsed());
    let t1 = Instant::now();
    let rss = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    // Served within the head timeout (2 s) once the idle ones at the bound are dropped: the
    // bound holds the agent's memory and its descriptors, not its answers.
    eventually("an answer during the flood", || {
        let (code, _) = get_from([127, 0, 0, 2], agent.addr, "/v1/routes");
        code == 200
    });
    println!("answered after {:?}", t1.elapsed());
    let _rt = rt;
    let kb = rss(agent.child.id());
    println!("{} idle connections; the agent's RSS {kb} kB", idle.len());
    assert!(kb < 64 * 1024, "RSS {kb} kB");
    drop(idle);
}
