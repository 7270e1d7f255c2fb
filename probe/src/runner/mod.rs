//! The run: schedules per kind, the in-flight cap, the drain wait, the progress line.
//!
//! Invariants: every request task holds one in-flight permit from before it starts until
//! after its record is stored, so "all permits back" means "every record is in". Sending
//! stops at `duration` or [`ProbeHandle::stop`]; requests then get `drain_wait`;
//! [`ProbeHandle::abort`] or the end of the wait make the rest record themselves `unfinished`;
//! only then are the connections shut down, so no request is cut by the probe's own cleanup.

use std::fmt;
use std::future::Future;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::config::{ConfigError, Kind, Parsed, ProbeConfig};
use crate::conn::Connections;
use crate::latency;
use crate::record::Record;
use crate::summary::{RunFacts, Summary};

mod handle;
mod request;

use handle::Control;
pub use handle::{ProbeHandle, Progress};
use request::schedule;

/// After an abort, how long request tasks get to write their `unfinished` record. They only
/// have to notice the signal, so this is a safety bound, not a wait anyone should see.
const ABORT_GRACE: Duration = Duration::from_secs(5);

/// A validated probe, ready to [`run`](Probe::run).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lameduck_probe::{Probe, ProbeConfig};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let mut config = ProbeConfig::new("127.0.0.1:8080");
/// config.duration = Duration::from_secs(20);
/// let probe = Probe::new(config)?;
/// let handle = probe.handle();
/// tokio::spawn(async move {
///     tokio::signal::ctrl_c().await.ok();
///     handle.stop(); // stop sending; running requests get drain_wait
/// });
/// let result = probe.run().await?;
/// println!("{}", result.summary.table());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Probe {
    config: ProbeConfig,
    parsed: Parsed,
    handle: ProbeHandle,
}

/// What a run produced.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProbeResult {
    /// One record per request sent, ordered by start.
    pub records: Vec<Record>,
    /// The numbers.
    pub summary: Summary,
}

impl ProbeResult {
    /// Writes one JSON object per line per record, in start order.
    pub fn write_json_lines(&self, mut out: impl Write) -> io::Result<()> {
        for record in &self.records {
            serde_json::to_writer(&mut out, record)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }
}

/// Why a run could not start.
///
/// `Display` says what to change, in lowercase, e.g. `target 127.0.0.1:9 is unreachable:
/// connect to 127.0.0.1:9: Connection refused (os error 111); check the address and that the
/// service listens there, or pass --allow-unreachable-start to start anyway`.
#[derive(Debug)]
pub struct ProbeError {
    kind: ErrorKind,
}

#[derive(Debug)]
enum ErrorKind {
    Config(ConfigError),
    Unreachable { target: String, error: String },
}

impl ProbeError {
    /// `true` when a setting was invalid.
    pub fn is_config(&self) -> bool {
        matches!(self.kind, ErrorKind::Config(_))
    }

    /// `true` when the first connection attempt failed and `allow_unreachable_start` was off.
    pub fn is_unreachable(&self) -> bool {
        matches!(self.kind, ErrorKind::Unreachable { .. })
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Config(e) => write!(f, "invalid setting {e}"),
            ErrorKind::Unreachable { target, error } => write!(
                f,
                "target {target} is unreachable: {error}; check the address and that the service \
                 listens there, or pass --allow-unreachable-start to start anyway"
            ),
        }
    }
}

impl std::error::Error for ProbeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Config(e) => Some(e),
            ErrorKind::Unreachable { .. } => None,
        }
    }
}

impl From<ConfigError> for ProbeError {
    fn from(e: ConfigError) -> Self {
        ProbeError {
            kind: ErrorKind::Config(e),
        }
    }
}

/// Runs a probe until `duration` is over or `stop` completes (then running requests get
/// `drain_wait`), and returns the records and the summary.
///
/// A shortcut for [`Probe::new`], [`Probe::handle`] and [`Probe::run`].
///
/// # Examples
///
/// ```no_run
/// use lameduck_probe::{run, ProbeConfig};
///
/// # async fn demo() -> Result<(), lameduck_probe::ProbeError> {
/// let result = run(ProbeConfig::new("127.0.0.1:8080"), async {
///     tokio::signal::ctrl_c().await.ok();
/// })
/// .await?;
/// assert!(result.summary.is_clean(), "{}", result.summary.table());
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// When the config is invalid, or the target is unreachable at the start (see
/// [`ProbeConfig::allow_unreachable_start`]).
pub async fn run<F>(config: ProbeConfig, stop: F) -> Result<ProbeResult, ProbeError>
where
    F: Future + Send + 'static,
{
    let probe = Probe::new(config)?;
    let handle = probe.handle();
    let watcher = tokio::spawn(async move {
        stop.await;
        handle.stop();
    });
    let result = probe.run().await;
    watcher.abort();
    result
}

/// Fires the connection and request shutdown when the run ends or its future is dropped.
struct Cleanup {
    handle: ProbeHandle,
    conns_shutdown: watch::Sender<bool>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.handle.abort();
        self.conns_shutdown.send_replace(true);
    }
}

/// What every request task shares.
#[derive(Debug)]
struct Shared {
    config: ProbeConfig,
    parsed: Parsed,
    conns: Connections,
    origin: Instant,
    run_tag: String,
    next_seq: AtomicU64,
    records: Mutex<Vec<Record>>,
    handle: ProbeHandle,
}

impl Probe {
    /// Validates `config`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting to change.
    pub fn new(config: ProbeConfig) -> Result<Self, ConfigError> {
        let parsed = config.parse()?;
        Ok(Probe {
            config,
            parsed,
            handle: ProbeHandle::new(),
        })
    }

    /// The config this probe runs with.
    pub fn config(&self) -> &ProbeConfig {
        &self.config
    }

    /// A handle to stop the run and read its progress, from another task.
    pub fn handle(&self) -> ProbeHandle {
        self.handle.clone()
    }

    /// Sends for `duration` (or until [`ProbeHandle::stop`]), waits up to `drain_wait` for
    /// requests still running, and returns every record and the summary.
    ///
    /// # Errors
    ///
    /// When the first connection attempt fails and `allow_unreachable_start` is off: nothing
    /// is sent then.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops everything it started: requests and connections end.
    pub async fn run(self) -> Result<ProbeResult, ProbeError> {
        let handle = self.handle.clone();
        let (conns_shutdown, conns_shutdown_rx) = watch::channel(false);
        let _cleanup = Cleanup {
            handle: handle.clone(),
            conns_shutdown: conns_shutdown.clone(),
        };
        let (shared, started_unix_ms) = self.start(conns_shutdown_rx).await?;
        let cap = shared.config.max_in_flight;
        let permits = Arc::new(Semaphore::new(cap));
        let deadline = tokio::time::Instant::from_std(shared.origin) + shared.config.duration;
        let progress_task = shared
            .config
            .progress
            .then(|| progress_lines(handle.clone()));

        let stopped_early = send(&shared, &permits, deadline).await;
        wait(&shared, &permits, cap).await;
        if let Some(task) = progress_task {
            task.abort();
            eprintln!("{}", handle.progress().line());
        }
        conns_shutdown.send_replace(true);
        shared.conns.clear().await;
        Ok(finish(&shared, started_unix_ms, stopped_early))
    }

    /// Opens the connection pool, checks the target answers (unless told not to) and starts
    /// the clock: the state every request task shares, and the start's wall-clock time.
    async fn start(
        self,
        conns_shutdown: watch::Receiver<bool>,
    ) -> Result<(Arc<Shared>, u64), ProbeError> {
        let Probe {
            config,
            parsed,
            handle,
        } = self;
        let conns = Connections::new(
            parsed.connect_to.clone(),
            config.http,
            config.connect_timeout,
            config.max_idle,
            handle.stats().connections_opened(),
            conns_shutdown,
        )
        .bound_to(config.bind);
        if !config.allow_unreachable_start {
            if let Err(error) = conns.preflight().await {
                return Err(ProbeError {
                    kind: ErrorKind::Unreachable {
                        target: config.target.clone(),
                        error,
                    },
                });
            }
        }
        let origin = Instant::now();
        let started_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        handle.stats().mark_serving(origin);
        let shared = Arc::new(Shared {
            run_tag: run_tag(started_unix_ms),
            config,
            parsed,
            conns,
            origin,
            next_seq: AtomicU64::new(0),
            records: Mutex::new(Vec::new()),
            handle,
        });
        Ok((shared, started_unix_ms))
    }
}

/// A progress line on stderr every second until the run ends, also when the run's future is
/// dropped (the cleanup aborts).
fn progress_lines(handle: ProbeHandle) -> JoinHandle<()> {
    let mut control = handle.control();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => eprintln!("{}", handle.progress().line()),
                _ = control.wait_for(|c| *c == Control::Abort) => return,
            }
        }
    })
}

/// Sending: one open-loop schedule per kind, so a slow kind never delays a fast one. `true`
/// when a stop ended it before `deadline`.
async fn send(
    shared: &Arc<Shared>,
    permits: &Arc<Semaphore>,
    deadline: tokio::time::Instant,
) -> bool {
    let mut schedules = Vec::new();
    for kind in Kind::ALL {
        let rate = shared.config.rate(kind);
        if rate > 0.0 {
            schedules.push(tokio::spawn(schedule(
                kind,
                rate,
                deadline,
                shared.clone(),
                permits.clone(),
            )));
        }
    }
    for s in schedules {
        let _ = s.await;
    }
    let stopped_early = shared.handle.stopping() && tokio::time::Instant::now() < deadline;
    shared.handle.stats().sending_done();
    stopped_early
}

/// Waiting: until every request stored its record, `drain_wait` is over or an abort; then
/// the rest are aborted and get [`ABORT_GRACE`] to record themselves `unfinished`.
async fn wait(shared: &Shared, permits: &Arc<Semaphore>, cap: usize) {
    // All permits back means every request task stored its record.
    let all_back = permits.clone().acquire_many_owned(cap as u32);
    let mut control = shared.handle.control();
    tokio::select! {
        _ = all_back => {}
        _ = tokio::time::sleep(shared.config.drain_wait) => {}
        _ = control.wait_for(|c| *c == Control::Abort) => {}
    }
    shared.handle.abort();
    let _ = tokio::time::timeout(ABORT_GRACE, permits.acquire_many(cap as u32)).await;
}

/// The records in start order with their latency window and wall-clock start, and the
/// summary.
fn finish(shared: &Shared, started_unix_ms: u64, stopped_early: bool) -> ProbeResult {
    let mut records = std::mem::take(&mut *shared.records.lock().expect("records lock"));
    records.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    let span = latency::drain_span(&records);
    for r in &mut records {
        r.window = Some(latency::window_of(r, span));
        r.start_unix_ms = Some(started_unix_ms as f64 + r.start_ms);
    }
    let summary = Summary::new(
        &records,
        RunFacts {
            target: shared.config.target.clone(),
            label: shared.config.label.clone(),
            proxy_label: shared.config.proxy_label.clone(),
            http: shared.config.http,
            connections: shared.config.connections,
            started_unix_ms,
            elapsed_ms: ms(shared.origin.elapsed()),
            stopped_early,
            connections_opened: shared.conns.opened(),
            not_sent: shared.handle.stats().not_sent(),
        },
    );
    ProbeResult { records, summary }
}

fn ms(d: Duration) -> f64 {
    // Microsecond precision is plenty and keeps the JSON short.
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// A short tag that makes request ids unique across runs: 8 hex digits from the start time,
/// the process id and a per-process run counter.
fn run_tag(started_unix_ms: u64) -> String {
    // Two probes started in the same millisecond by one process still differ.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let mut x = started_unix_ms ^ (u64::from(std::process::id()) << 32) ^ run.rotate_right(7);
    // splitmix64 finaliser: spreads close start times apart.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    format!("{:08x}", x as u32)
}
