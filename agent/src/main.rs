//! `lameduck-agent [--listen ADDR] [--node-name NAME] [--source auto|iptables|nftables|file:PATH]
//! [--refresh DUR] [--max-connections N]`

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use lameduck_agent::server::{serve, DEFAULT_MAX_CONNECTIONS};
use lameduck_agent::source::Source;
use lameduck_agent::state::State;

const USAGE: &str = "usage: lameduck-agent [--listen ADDR] [--node-name NAME] \
                     [--source auto|iptables|nftables|file:PATH] [--refresh DUR] \
                     [--max-connections N]
  --listen ADDR          where to answer (default 0.0.0.0:9902)
  --node-name NAME       this node's name (default: env NODE_NAME, else the hostname)
  --source SRC           the rules to read (default auto: iptables and nftables, whichever exist)
  --refresh DUR          how often to read them (default 250ms; 50ms to 10s)
  --max-connections N    connections served at once (default 256)";

struct Args {
    listen: SocketAddr,
    node: String,
    source: Source,
    refresh: Duration,
    max_connections: usize,
}

fn duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected e.g. 250ms or 1s"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(format!("{s:?}: expected e.g. 250ms or 1s")),
    }
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        listen: ([0, 0, 0, 0], 9902).into(),
        node: std::env::var("NODE_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned()),
        source: Source::Auto,
        refresh: Duration::from_millis(250),
        max_connections: DEFAULT_MAX_CONNECTIONS,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => {
                let v = value()?;
                a.listen = v.parse().map_err(|e| format!("--listen {v:?}: {e}"))?;
            }
            "--node-name" => a.node = value()?,
            "--source" => a.source = value()?.parse().map_err(|e| format!("--source {e}"))?,
            "--refresh" => {
                let d = duration(&value()?).map_err(|e| format!("--refresh {e}"))?;
                if !(Duration::from_millis(50)..=Duration::from_secs(10)).contains(&d) {
                    return Err(format!("--refresh {d:?}: expected 50ms to 10s"));
                }
                a.refresh = d;
            }
            "--max-connections" => {
                let v = value()?;
                a.max_connections = v.parse().ok().filter(|&n: &usize| n > 0).ok_or(format!(
                    "--max-connections {v:?}: expected a positive number"
                ))?;
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(a)
}

/// The listener, with a backlog deeper than the default: a burst of callers (or a flood) waits
/// in the kernel's queue rather than in SYN retries.
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("lameduck-agent: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lameduck-agent: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let listener = match listen(args.listen) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("lameduck-agent: listen on {}: {e}", args.listen);
                return ExitCode::FAILURE;
            }
        };
        let state = Arc::new(State::new(args.node, args.refresh));
        // The first read before the first answer: until then every answer says "not read yet".
        state.refresh_once(&args.source).await;
        if let Some(e) = state.error() {
            eprintln!("lameduck-agent: reading the rules: {e}");
        }
        println!(
            "READY listen={}",
            listener.local_addr().map_or(args.listen, |a| a)
        );
        let refresher = Arc::clone(&state);
        tokio::spawn(async move { refresher.refresh(args.source).await });
        tokio::select! {
            () = serve(listener, state, args.max_connections) => ExitCode::SUCCESS,
            _ = tokio::signal::ctrl_c() => ExitCode::SUCCESS,
        }
    })
}
