//! Real processes for the end-to-end tests: the example service, HAProxy and nginx, each on
//! loopback ports, each killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lameduck::DrainReport;

/// A loopback port that was free a moment ago.
///
/// Never the same port twice in this process: the tests run in parallel threads, and a port
/// one of them picked but has not bound yet (a free HAProxy slot that must be seen DOWN) is
/// free to the kernel until then.
pub(crate) fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
    panic!("no loopback port this process has not handed out before in 1000 tries")
}

/// `Some(path)` if `name` is installed. When it is missing the tests say so loudly, and fail
/// when `LAMEDUCK_E2E=require` (as `.ci/run` sets).
pub(crate) fn require(name: &str) -> Option<PathBuf> {
    let found = ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists());
    if found.is_none() {
        let msg = format!(
            "END-TO-END TEST SKIPPED: `{name}` is not installed (apt-get install -y haproxy nginx-light)"
        );
        if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") {
            panic!("{msg}, and LAMEDUCK_E2E=require");
        }
        eprintln!("\n!!!!!!!! {msg} !!!!!!!!\n");
    }
    found
}

/// Caddy: `LAMEDUCK_CADDY` (what `bash tests/e2e/caddy-build.sh` prints; `.ci/run` sets it),
/// else `caddy` in the usual places. Says so loudly when missing, and fails under
/// `LAMEDUCK_E2E=require`.
pub(crate) fn require_caddy() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LAMEDUCK_CADDY").map(PathBuf::from) {
        if p.exists() {
            return Some(p);
        }
    }
    let found = ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join("caddy"))
        .find(|p| p.exists());
    if found.is_none() {
        let msg = "END-TO-END TEST SKIPPED: Caddy is not built (LAMEDUCK_CADDY=$(bash \
                   tests/e2e/caddy-build.sh))";
        if std::env::var("LAMEDUCK_E2E").as_deref() == Ok("require") {
            panic!("{msg}, and LAMEDUCK_E2E=require");
        }
        eprintln!("\n!!!!!!!! {msg} !!!!!!!!\n");
    }
    found
}

/// A scratch directory under the target dir, fresh for each run.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let dir = target.join("e2e").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `service` example, built by `cargo test` next to this test binary.
pub(crate) fn service_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir.join("examples").join("service");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --all-features` so examples are built",
        bin.display()
    );
    bin
}

/// `examples/baseline` (the shutdowns lameduck is compared against), next to the service.
pub(crate) fn baseline_bin() -> PathBuf {
    let bin = service_bin().with_file_name("baseline");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --all-features` so examples are built",
        bin.display()
    );
    bin
}

/// One instance of the example service.
pub(crate) struct Instance {
    pub(crate) name: String,
    pub(crate) admin: SocketAddr,
    pub(crate) report_file: PathBuf,
    child: Option<Child>,
    /// What the test did to the process and saw of it, on the wall clock: signals sent and
    /// the exit, for `correlate`'s diagnosis rows.
    pub(crate) events: std::sync::Mutex<Vec<lameduck_probe::correlate::ExternalEvent>>,
}

/// Now, in ms since the Unix epoch.
pub(crate) fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

impl Instance {
    /// Starts the service on the given ports and waits for its READY line.
    pub(crate) fn start(
        name: &str,
        listen: u16,
        admin: u16,
        dir: &Path,
        extra: &[&str],
    ) -> Instance {
        let report_file = dir.join(format!("{name}.report.json"));
        let _ = std::fs::remove_file(&report_file);
        let log = std::fs::File::create(dir.join(format!("{name}.stderr"))).unwrap();
        // The baselines' flags belong to examples/baseline.
        let baseline = extra
            .iter()
            .any(|f| *f == "--naive" || *f == "--fixed-sleep");
        let bin = if baseline {
            baseline_bin()
        } else {
            service_bin()
        };
        let mut child = Command::new(bin)
            .args(["--listen", &format!("127.0.0.1:{listen}")])
            .args(["--admin", &format!("127.0.0.1:{admin}")])
            .args(["--instance", name])
            .args(["--report-file", report_file.to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start the service example");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let ok = out.read_line(&mut line).is_ok() && line.starts_with("READY");
        if !ok {
            let _ = child.kill();
            let _ = child.wait();
            panic!("instance {name} did not start: {line:?}");
        }
        Instance {
            name: name.to_owned(),
            admin: ([127, 0, 0, 1], admin).into(),
            report_file,
            child: Some(child),
            events: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Records an event the test caused or saw (`deleted`, `proxy_updated`, ...).
    pub(crate) fn note(&self, event: &str) {
        self.events
            .lock()
            .unwrap()
            .push(lameduck_probe::correlate::ExternalEvent {
                unix_ms: unix_ms(),
                instance: self.name.clone(),
                event: event.to_owned(),
            });
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends a signal with the system `kill`.
    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} {} failed", self.pid());
        self.note(&format!("signal {}", sig.trim_start_matches('-')));
    }

    /// Waits (bounded) for the process to exit; returns its exit code.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> i32 {
        let child = self.child.as_mut().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                let code = status.code().unwrap_or(-1);
                self.note(&format!("exit {code}"));
                return code;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                panic!("instance {} did not exit within {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn report(&self) -> DrainReport {
        let raw = std::fs::read_to_string(&self.report_file)
            .unwrap_or_else(|e| panic!("report of {}: {e}", self.name));
        serde_json::from_str(raw.trim()).expect("report JSON")
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A proxy process (HAProxy or nginx) in the foreground, killed on drop.
pub(crate) struct Proxy {
    child: Child,
    log: PathBuf,
}

impl Proxy {
    pub(crate) fn spawn(name: &'static str, mut cmd: Command, log: PathBuf, port: u16) -> Proxy {
        let err = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let p = Proxy { child, log };
        // Bounded wait for the frontend port.
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{name} did not listen on {port}: {}",
                std::fs::read_to_string(&p.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // SIGTERM first: nginx's master then stops its workers (a SIGKILL would orphan them).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HAProxy: active health checks on each slot's `/readyz` (admin port), keep-alive to the
/// backends, round robin. No retries and no redispatch: a request the backend refused or cut
/// reaches the client as an error, so the verdict is the server's alone.
pub(crate) fn haproxy(dir: &Path, frontend: u16, slots: &[(u16, u16)]) -> Proxy {
    let bin = require("haproxy").expect("checked by the caller");
    let sock = dir.join("haproxy.sock");
    let mut cfg = format!(
        "global\n  maxconn 2000\n  stats socket {sock} mode 600 level admin\n\
         defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  \
         timeout http-keep-alive 10s\n  option http-keep-alive\n  retries 0\n\
         frontend fe\n  bind 127.0.0.1:{frontend}\n  default_backend be\n\
         backend be\n  balance roundrobin\n  option httpchk GET /readyz\n  http-reuse always\n",
        sock = sock.display()
    );
    for (i, (port, admin)) in slots.iter().enumerate() {
        cfg.push_str(&format!(
            "  server s{i} 127.0.0.1:{port} check port {admin} inter 300ms fall 2 rise 2\n"
        ));
    }
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, cfg).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-db").arg("-f").arg(&path);
    Proxy::spawn("haproxy", cmd, dir.join("haproxy.log"), frontend)
}

/// HAProxy's view of one server (`UP`, `DOWN`, …) through its stats socket.
pub(crate) fn haproxy_status(dir: &Path, server: usize) -> String {
    use std::io::{Read, Write};
    let sock = dir.join("haproxy.sock");
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(&sock) else {
        return "NOSOCK".into();
    };
    let _ = s.write_all(b"show stat\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let want = format!("be,s{server},");
    out.lines()
        .find(|l| l.starts_with(&want))
        .and_then(|l| l.split(',').nth(17))
        .unwrap_or("UNKNOWN")
        .to_owned()
}

/// Waits (bounded) until HAProxy reports `server` with the given status prefix.
pub(crate) fn wait_haproxy(dir: &Path, server: usize, status: &str) {
    let start = Instant::now();
    loop {
        let s = haproxy_status(dir, server);
        if s.starts_with(status) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "haproxy server s{server} is {s}, expected {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// nginx as a keep-alive connection-pooling proxy with no readiness awareness. It never
/// retries a request on another upstream (`proxy_next_upstream off`): every error a backend
/// causes reaches the client, so the verdict is the server's alone.
pub(crate) fn nginx(dir: &Path, frontend: u16, backends: &[u16]) -> Proxy {
    let bin = require("nginx").expect("checked by the caller");
    let path = write_nginx_conf(dir, frontend, backends);
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .arg("-g")
        .arg("daemon off;");
    Proxy::spawn("nginx", cmd, dir.join("nginx.log"), frontend)
}

/// Caddy as a reverse proxy with pooled upstream connections (its default transport keeps
/// them alive), round robin, no retries (`lb_retries 0`, no `lb_try_duration`), and its admin
/// API on `admin` for reloads.
pub(crate) fn caddy(dir: &Path, (frontend, admin): (u16, u16), backends: &[u16]) -> Proxy {
    let bin = require_caddy().expect("checked by the caller");
    let path = write_caddyfile(dir, (frontend, admin), backends);
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg("--config")
        .arg(&path)
        .arg("--adapter")
        .arg("caddyfile")
        .env("XDG_DATA_HOME", dir.join("caddy-data"))
        .env("XDG_CONFIG_HOME", dir.join("caddy-config"));
    Proxy::spawn("caddy", cmd, dir.join("caddy.log"), frontend)
}

/// Rewrites Caddy's upstream list and loads it through its admin API (`caddy reload`), as an
/// ingress controller does when the endpoints change: the new configuration takes the new
/// requests, the old one finishes its requests and closes its pooled upstream connections.
pub(crate) fn caddy_reload(dir: &Path, (frontend, admin): (u16, u16), backends: &[u16]) {
    let bin = require_caddy().expect("checked by the caller");
    let path = write_caddyfile(dir, (frontend, admin), backends);
    let out = Command::new(bin)
        .arg("reload")
        .arg("--config")
        .arg(&path)
        .arg("--adapter")
        .arg("caddyfile")
        .arg("--address")
        .arg(format!("127.0.0.1:{admin}"))
        .output()
        .expect("caddy reload");
    assert!(
        out.status.success(),
        "caddy reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write_caddyfile(dir: &Path, (frontend, admin): (u16, u16), backends: &[u16]) -> PathBuf {
    let upstreams: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let cfg = format!(
        "{{\n  admin 127.0.0.1:{admin}\n  auto_https off\n  persist_config off\n}}\n\
         http://127.0.0.1:{frontend} {{\n  reverse_proxy {} {{\n    lb_policy round_robin\n    \
         lb_retries 0\n    flush_interval -1\n  }}\n}}\n",
        upstreams.join(" ")
    );
    let path = dir.join("Caddyfile");
    std::fs::write(&path, cfg).unwrap();
    path
}

/// Rewrites nginx's upstream list and reloads it (SIGHUP to the master), as an ingress
/// controller does when the endpoints change: new workers use the new list, old workers finish
/// the requests they have and close their pooled upstream connections.
pub(crate) fn nginx_reload(proxy: &Proxy, dir: &Path, frontend: u16, backends: &[u16]) {
    write_nginx_conf(dir, frontend, backends);
    let ok = Command::new("kill")
        .args(["-HUP", &proxy.child.id().to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -HUP nginx failed");
}

fn write_nginx_conf(dir: &Path, frontend: u16, backends: &[u16]) -> PathBuf {
    let mut upstream = String::new();
    for p in backends {
        upstream.push_str(&format!("    server 127.0.0.1:{p};\n"));
    }
    let d = dir.display();
    let cfg = format!(
        "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx.error.log warn;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         upstream app {{\n{upstream}    keepalive 16;\n  }}\n\
         server {{\n    listen 127.0.0.1:{frontend};\n    location / {{\n      proxy_pass http://app;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
         proxy_next_upstream off;\n      proxy_read_timeout 30s;\n    }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, cfg).unwrap();
    path
}
