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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::MissedTickBehavior;

use crate::config::{ConfigError, ConnectionMode, Kind, Parsed, ProbeConfig};
use crate::conn::Connections;
use crate::latency;
use crate::record::{Failure, Outcome, Record, Retry};
use crate::request::{exchange, Plan, Seen};
use crate::summary::{RunFacts, Summary};

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

/// Controls a running probe and reads its progress; cheap to clone.
#[derive(Debug, Clone)]
pub struct ProbeHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug)]
struct HandleInner {
    /// `Running` → `StopSending` → `Abort`; only ever moves forward.
    control: watch::Sender<Control>,
    stats: Stats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Control {
    Running,
    StopSending,
    Abort,
}

/// Live counters. Relaxed everywhere: they are statistics read for display, and the final
/// numbers come from the records, not from here.
#[derive(Debug, Default)]
struct Stats {
    started: Mutex<Option<Instant>>,
    sent: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    unfinished: AtomicU64,
    in_flight: AtomicU64,
    not_sent: AtomicU64,
    draining_reused: AtomicU64,
    draining_new: AtomicU64,
    connections_opened: Arc<AtomicU64>,
    sending_done: AtomicBool,
}

/// A snapshot of a running probe, for a progress line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Progress {
    /// Since the run started.
    pub elapsed: Duration,
    /// Requests started.
    pub sent: u64,
    /// Requests that ended `ok`.
    pub succeeded: u64,
    /// Requests that ended `failed`.
    pub failed: u64,
    /// Requests recorded `unfinished` (only at the end).
    pub unfinished: u64,
    /// Requests running now.
    pub in_flight: u64,
    /// Requests skipped because `max_in_flight` were running.
    pub not_sent: u64,
    /// Requests answered by a draining instance on a reused connection.
    pub draining_reused: u64,
    /// Requests answered by a draining instance on a new connection.
    pub draining_new: u64,
    /// Connections opened.
    pub connections_opened: u64,
    /// `true` once sending has stopped and the probe waits for running requests.
    pub sending_done: bool,
}

impl Progress {
    /// One line for a terminal:
    /// `  12s  sent 265  ok 263  failed 0  in flight 2  conns 4  draining: 17 reused, 1 new`.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{:>5}s  sent {}  ok {}  failed {}  in flight {}  conns {}  draining: {} reused, {} new",
            self.elapsed.as_secs(),
            self.sent,
            self.succeeded,
            self.failed,
            self.in_flight,
            self.connections_opened,
            self.draining_reused,
            self.draining_new
        );
        if self.not_sent > 0 {
            line.push_str(&format!("  not sent {}", self.not_sent));
        }
        if self.sending_done && self.in_flight > 0 {
            line.push_str("  (waiting for running requests)");
        }
        line
    }
}

impl ProbeHandle {
    fn new() -> Self {
        ProbeHandle {
            inner: Arc::new(HandleInner {
                control: watch::Sender::new(Control::Running),
                stats: Stats::default(),
            }),
        }
    }

    /// Stops sending new requests; requests still running get `drain_wait` to finish, then
    /// the run ends as it would at the end of `duration`. Idempotent.
    pub fn stop(&self) {
        self.advance(Control::StopSending);
    }

    /// Stops sending and stops waiting: requests still running are recorded `unfinished` at
    /// once and the run ends. Idempotent.
    pub fn abort(&self) {
        self.advance(Control::Abort);
    }

    fn advance(&self, to: Control) {
        self.inner.control.send_if_modified(|now| {
            if *now < to {
                *now = to;
                true
            } else {
                false
            }
        });
    }

    /// What the probe has done so far.
    pub fn progress(&self) -> Progress {
        let s = &self.inner.stats;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Progress {
            elapsed: s
                .started
                .lock()
                .expect("stats lock")
                .map_or(Duration::ZERO, |t| t.elapsed()),
            sent: r(&s.sent),
            succeeded: r(&s.succeeded),
            failed: r(&s.failed),
            unfinished: r(&s.unfinished),
            in_flight: r(&s.in_flight),
            not_sent: r(&s.not_sent),
            draining_reused: r(&s.draining_reused),
            draining_new: r(&s.draining_new),
            connections_opened: r(&s.connections_opened),
            sending_done: s.sending_done.load(Ordering::Relaxed),
        }
    }
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
        let Probe {
            config,
            parsed,
            handle,
        } = self;
        let (conns_shutdown, conns_shutdown_rx) = watch::channel(false);
        let _cleanup = Cleanup {
            handle: handle.clone(),
            conns_shutdown: conns_shutdown.clone(),
        };
        let conns = Connections::new(
            parsed.connect_to.clone(),
            config.http,
            config.connect_timeout,
            config.max_idle,
            handle.inner.stats.connections_opened.clone(),
            conns_shutdown_rx,
        );
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
        *handle.inner.stats.started.lock().expect("stats lock") = Some(origin);
        let shared = Arc::new(Shared {
            run_tag: run_tag(started_unix_ms),
            config,
            parsed,
            conns,
            origin,
            next_seq: AtomicU64::new(0),
            records: Mutex::new(Vec::new()),
            handle: handle.clone(),
        });
        let cap = shared.config.max_in_flight;
        let permits = Arc::new(Semaphore::new(cap));
        let deadline = tokio::time::Instant::from_std(origin) + shared.config.duration;

        let progress_task = shared.config.progress.then(|| {
            let handle = handle.clone();
            // Ends with the run, also when the run's future is dropped (the cleanup aborts).
            let mut control = handle.inner.control.subscribe();
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
        });

        // Sending: one open-loop schedule per kind, so a slow kind never delays a fast one.
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
        let stopped_early = *handle.inner.control.borrow() >= Control::StopSending
            && tokio::time::Instant::now() < deadline;
        handle
            .inner
            .stats
            .sending_done
            .store(true, Ordering::Relaxed);

        // Waiting: all permits back means every request task stored its record.
        let all_back = permits.clone().acquire_many_owned(cap as u32);
        let mut control = handle.inner.control.subscribe();
        tokio::select! {
            _ = all_back => {}
            _ = tokio::time::sleep(shared.config.drain_wait) => {}
            _ = control.wait_for(|c| *c == Control::Abort) => {}
        }
        handle.abort();
        let _ = tokio::time::timeout(ABORT_GRACE, permits.acquire_many(cap as u32)).await;

        if let Some(task) = progress_task {
            task.abort();
            eprintln!("{}", handle.progress().line());
        }
        conns_shutdown.send_replace(true);
        shared.conns.clear().await;

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
                elapsed_ms: ms(origin.elapsed()),
                stopped_early,
                connections_opened: shared.conns.opened(),
                not_sent: handle.inner.stats.not_sent.load(Ordering::Relaxed),
            },
        );
        Ok(ProbeResult { records, summary })
    }
}

/// Sends `kind` requests at `rate` per second until `deadline` or a stop.
async fn schedule(
    kind: Kind,
    rate: f64,
    deadline: tokio::time::Instant,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
) {
    let mut control = shared.handle.inner.control.subscribe();
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::from_std(shared.origin), period);
    // Catch up on ticks missed under load so the rate holds; the in-flight cap bounds a burst.
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    loop {
        tokio::select! {
            biased;
            _ = control.wait_for(|c| *c >= Control::StopSending) => return,
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tick.tick() => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        // Ticks keep coming while off and are skipped, so each phase starts on the beat.
        if let Some(o) = shared.config.on_off {
            if !o.sending(shared.origin.elapsed()) {
                continue;
            }
        }
        let stats = &shared.handle.inner.stats;
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                stats.sent.fetch_add(1, Ordering::Relaxed);
                stats.in_flight.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(one_request(kind, shared.clone(), permit));
            }
            Err(_) => {
                stats.not_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Runs one request and stores its record; the permit is released after the store.
async fn one_request(kind: Kind, shared: Arc<Shared>, permit: OwnedSemaphorePermit) {
    // Relaxed: the sequence number only has to be unique.
    let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
    let id = format!("{}-{seq:06}", shared.run_tag);
    let keepalive = match shared.config.connections {
        ConnectionMode::KeepAlive => true,
        ConnectionMode::Fresh => false,
        ConnectionMode::Mixed => seq % 2 == 0,
    };
    let kind_index = Kind::ALL.iter().position(|&k| k == kind).unwrap_or(0);
    let plan = Plan {
        id: &id,
        kind,
        path: &shared.parsed.paths[kind_index],
        host: &shared.parsed.host,
        label: &shared.config.label,
        http: shared.config.http,
        keepalive,
    };
    let first = attempt(&shared, &plan).await;
    let retry = if first.outcome == Outcome::Failed && shared.config.retry_idempotent {
        // Like a client retrying an idempotent GET: once, on a connection of its own, under
        // an id of its own so a server log tells the two attempts apart.
        let retry_id = format!("{id}-retry");
        let retry_plan = Plan {
            id: &retry_id,
            keepalive: false,
            ..plan
        };
        let second = attempt(&shared, &retry_plan).await;
        Some(Retry {
            id: retry_id,
            start_ms: second.start_ms,
            end_ms: second.end_ms,
            latency_us: second.latency_us(),
            status: second.seen.status,
            outcome: second.outcome,
            failure: second.failure,
            error: second.error,
            conn: second.seen.conn,
            instance: second.seen.instance,
            phase: second.seen.phase,
        })
    } else {
        None
    };
    let stats = &shared.handle.inner.stats;
    let latency_us = first.latency_us();
    let Attempt {
        start_ms,
        end_ms,
        outcome,
        failure,
        error,
        seen,
    } = first;
    match outcome {
        Outcome::Ok => &stats.succeeded,
        Outcome::Failed => &stats.failed,
        Outcome::Unfinished => &stats.unfinished,
    }
    .fetch_add(1, Ordering::Relaxed);
    let record = Record {
        id,
        kind,
        label: shared.config.label.clone(),
        mode: if keepalive {
            ConnectionMode::KeepAlive
        } else {
            ConnectionMode::Fresh
        },
        start_ms,
        end_ms,
        status: seen.status,
        outcome,
        failure,
        error,
        reused: seen.reused,
        conn: seen.conn,
        instance: seen.instance,
        phase: seen.phase,
        bytes: seen.bytes,
        rerouted: seen.rerouted,
        latency_us,
        window: None,
        start_unix_ms: None,
        proxy_label: shared.config.proxy_label.clone(),
        retry,
        connection_close: seen.told_close,
    };
    if record.served_by_draining() {
        if record.reused {
            &stats.draining_reused
        } else {
            &stats.draining_new
        }
        .fetch_add(1, Ordering::Relaxed);
    }
    shared.records.lock().expect("records lock").push(record);
    stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
}

/// One attempt at a request, as it ended.
struct Attempt {
    start_ms: f64,
    end_ms: Option<f64>,
    outcome: Outcome,
    failure: Option<Failure>,
    error: Option<String>,
    seen: Seen,
}

impl Attempt {
    fn latency_us(&self) -> Option<u64> {
        self.end_ms
            .map(|end| ((end - self.start_ms).max(0.0) * 1000.0).round() as u64)
    }
}

/// Sends `plan` once; an abort makes it `unfinished`.
async fn attempt(shared: &Shared, plan: &Plan<'_>) -> Attempt {
    let start_ms = ms(shared.origin.elapsed());
    let mut seen = Seen::default();
    let mut control = shared.handle.inner.control.subscribe();
    let result = {
        let request = exchange(&shared.conns, plan, &mut seen);
        tokio::pin!(request);
        tokio::select! {
            result = &mut request => Some(result),
            _ = control.wait_for(|c| *c == Control::Abort) => None,
        }
    };
    let end_ms = ms(shared.origin.elapsed());
    let (outcome, failure, error, end_ms) = match result {
        Some(Ok(())) => (Outcome::Ok, None, None, Some(end_ms)),
        Some(Err((failure, error))) => (Outcome::Failed, Some(failure), Some(error), Some(end_ms)),
        None => (
            Outcome::Unfinished,
            None,
            Some(unfinished_reason(&seen)),
            None,
        ),
    };
    Attempt {
        start_ms,
        end_ms,
        outcome,
        failure,
        error,
        seen,
    }
}

fn unfinished_reason(seen: &Seen) -> String {
    match (seen.conn, seen.status) {
        (None, _) => "still connecting when the probe stopped waiting".to_owned(),
        (Some(_), None) => "no response yet when the probe stopped waiting".to_owned(),
        (Some(_), Some(status)) => format!(
            "status {status} received, body still streaming ({} bytes) when the probe stopped waiting",
            seen.bytes
        ),
    }
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
