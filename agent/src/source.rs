//! Reading the node's rules: `iptables-save` / `ip6tables-save` and `nft list ruleset`, each
//! bounded in time and output, or a file (a harness's, or a test's). Read-only: nothing here
//! writes a rule.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::rules::{parse_iptables, parse_nftables, Mode, Routes};

/// The most output one dump may have: a node with 10,000 Services and 100,000 endpoints
/// writes about 60 MB of iptables rules; past this the read fails and says so.
pub const MAX_DUMP: usize = 128 << 20;
/// How long one dump may take.
pub const DUMP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the rules are read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Both datapaths, whichever exist (kube-proxy writes one of them).
    Auto,
    /// `iptables-save -t nat`, then `ip6tables-save -t nat`.
    Iptables,
    /// `nft list ruleset`.
    Nftables,
    /// A file holding a dump of either kind, read anew each time.
    File(PathBuf),
}

impl std::str::FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Source::Auto),
            "iptables" => Ok(Source::Iptables),
            "nftables" => Ok(Source::Nftables),
            _ => match s.strip_prefix("file:") {
                Some(p) if !p.is_empty() => Ok(Source::File(p.into())),
                _ => Err(format!(
                    "{s:?}: expected auto, iptables, nftables or file:PATH"
                )),
            },
        }
    }
}

/// One read: the dumps' text (to tell a change), the routes parsed from it, and which
/// datapaths had rules.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    /// The dumps as read, concatenated.
    pub text: String,
    /// The datapaths that had rules.
    pub modes: Vec<Mode>,
}

impl Dump {
    /// The routes of every datapath read.
    pub fn routes(&self) -> Routes {
        let mut routes = parse_iptables(&self.text);
        routes.merge(parse_nftables(&self.text));
        routes
    }
}

impl Source {
    /// Reads the rules once. An error says which command failed and why; a datapath that is
    /// absent (no such binary, or no table) is no error under [`Source::Auto`].
    pub async fn read(&self) -> Result<Dump, String> {
        match self {
            Source::File(p) => {
                let text = tokio::time::timeout(DUMP_TIMEOUT, read_file(p.clone()))
                    .await
                    .map_err(|_| format!("{}: timed out", p.display()))??;
                let mut modes = Vec::new();
                if text.contains("-A ") {
                    modes.push(Mode::Iptables);
                }
                if text.contains("table ") {
                    modes.push(Mode::Nftables);
                }
                Ok(Dump { text, modes })
            }
            Source::Iptables => {
                let mut text = run(&["iptables-save", "-t", "nat"]).await?;
                // A node without IPv6 has no ip6tables rules; that is no error.
                if let Ok(v6) = run(&["ip6tables-save", "-t", "nat"]).await {
                    text.push_str(&v6);
                }
                Ok(Dump {
                    text,
                    modes: vec![Mode::Iptables],
                })
            }
            Source::Nftables => Ok(Dump {
                text: run(&["nft", "list", "ruleset"]).await?,
                modes: vec![Mode::Nftables],
            }),
            Source::Auto => {
                let ipt = Box::pin(Source::Iptables.read()).await;
                let nft = Box::pin(Source::Nftables.read()).await;
                match (ipt, nft) {
                    (Err(a), Err(b)) => Err(format!("{a}; {b}")),
                    (a, b) => {
                        let mut dump = Dump::default();
                        for d in [a, b].into_iter().flatten() {
                            dump.text.push_str(&d.text);
                            dump.modes.extend(d.modes);
                        }
                        Ok(dump)
                    }
                }
            }
        }
    }
}

async fn read_file(path: PathBuf) -> Result<String, String> {
    let f = tokio::fs::File::open(&path)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = Vec::new();
    f.take(MAX_DUMP as u64 + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if buf.len() > MAX_DUMP {
        return Err(format!("{}: more than {MAX_DUMP} bytes", path.display()));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Runs `argv`, bounded by [`DUMP_TIMEOUT`] and [`MAX_DUMP`]; its stdout.
async fn run(argv: &[&str]) -> Result<String, String> {
    let what = argv.join(" ");
    let mut child = tokio::process::Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let work = async {
        let mut buf = Vec::new();
        let mut ebuf = Vec::new();
        let mut out = (&mut out).take(MAX_DUMP as u64 + 1);
        let mut err = (&mut err).take(4096);
        let (r, _) = tokio::join!(out.read_to_end(&mut buf), err.read_to_end(&mut ebuf));
        r.map_err(|e| format!("{what}: {e}"))?;
        if buf.len() > MAX_DUMP {
            return Err(format!("{what}: more than {MAX_DUMP} bytes of rules"));
        }
        let status = child.wait().await.map_err(|e| format!("{what}: {e}"))?;
        if !status.success() {
            let msg = String::from_utf8_lossy(&ebuf);
            return Err(format!("{what}: {status}: {}", msg.trim()));
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(DUMP_TIMEOUT, work)
        .await
        .map_err(|_| format!("{what}: timed out after {DUMP_TIMEOUT:?}"))?
}
