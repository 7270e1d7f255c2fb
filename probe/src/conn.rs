//! The probe's own connection management.
//!
//! A pooling client hides which connection a request went on; the probe must not. So it
//! manages connections itself, on hyper's low-level `client::conn` API:
//!
//! - HTTP/1.1 keep-alive: a LIFO stack of idle connections. A request takes the most recently
//!   used idle connection that is still open and ready, or opens a new one; after its body was
//!   read to the end the connection goes back, unless the server said `Connection: close`.
//! - HTTP/2 keep-alive: one shared connection, multiplexed, as HTTP/2 clients do; a new one is
//!   opened when it is closed or has announced GOAWAY.
//! - Fresh: a new connection per request, dropped after it.
//!
//! Invariants: a connection's id is unique in a run and fixed at opening; `reused` is `true`
//! exactly when the connection had already been handed a request before this one, which is
//! what a server-side per-connection request index > 0 means. Every connection's driver task
//! ends when the run shuts the connections down, so nothing outlives [`Probe::run`].
//!
//! [`Probe::run`]: crate::Probe::run

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::{http1, http2, TrySendError};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::HttpVersion;

/// Requests carry no body.
pub(crate) type ReqBody = Empty<Bytes>;

/// Opens connections to the target and keeps the reusable ones.
#[derive(Debug)]
pub(crate) struct Connections {
    connect_to: String,
    /// The local address connections are opened from, when set.
    bind: Option<std::net::IpAddr>,
    http: HttpVersion,
    connect_timeout: Duration,
    /// Connections opened so far; ids count from 1 in opening order. Shared with the live
    /// progress counters.
    opened: Arc<AtomicU64>,
    /// Driver tasks end when this turns `true` (or its sender is dropped).
    shutdown: watch::Receiver<bool>,
    idle: Mutex<Vec<H1Conn>>,
    max_idle: usize,
    /// The shared HTTP/2 connection. An async lock, because opening a replacement happens
    /// under it: concurrent requests wait for the one new connection instead of each opening
    /// their own.
    shared: tokio::sync::Mutex<Option<H2Conn>>,
}

#[derive(Debug)]
struct H1Conn {
    id: u64,
    handed: u64,
    sender: http1::SendRequest<ReqBody>,
}

#[derive(Debug, Clone)]
struct H2Conn {
    id: u64,
    handed: Arc<AtomicU64>,
    sender: http2::SendRequest<ReqBody>,
}

#[derive(Debug)]
enum Sender {
    H1(http1::SendRequest<ReqBody>),
    H2(http2::SendRequest<ReqBody>),
}

/// A connection handed to one request.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) reused: bool,
    /// `false` for a fresh connection, which is dropped after the request.
    pub(crate) keepalive: bool,
    handed: u64,
    sender: Sender,
}

impl Lease {
    /// Sends `req`; on an error the request comes back when it was never written.
    pub(crate) async fn send(
        &mut self,
        req: Request<ReqBody>,
    ) -> Result<Response<Incoming>, TrySendError<Request<ReqBody>>> {
        match &mut self.sender {
            Sender::H1(s) => s.try_send_request(req).await,
            Sender::H2(s) => s.try_send_request(req).await,
        }
    }
}

impl Connections {
    pub(crate) fn new(
        connect_to: String,
        http: HttpVersion,
        connect_timeout: Duration,
        max_idle: usize,
        opened: Arc<AtomicU64>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Connections {
            connect_to,
            http,
            connect_timeout,
            opened,
            shutdown,
            idle: Mutex::new(Vec::new()),
            max_idle,
            bind: None,
            shared: tokio::sync::Mutex::new(None),
        }
    }

    /// How many connections were opened so far.
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// One TCP connect, to fail fast when the target is not there at all.
    pub(crate) async fn preflight(&self) -> Result<(), String> {
        self.tcp().await.map(drop)
    }

    /// Connections are opened from `bind` (see [`ProbeConfig::bind`](crate::ProbeConfig::bind)).
    pub(crate) fn bound_to(mut self, bind: Option<std::net::IpAddr>) -> Self {
        self.bind = bind;
        self
    }

    /// A TCP connection to the target, from `bind` when set.
    async fn connect(&self) -> std::io::Result<TcpStream> {
        let Some(local) = self.bind else {
            return TcpStream::connect(&self.connect_to).await;
        };
        let mut last = None;
        for addr in tokio::net::lookup_host(&self.connect_to).await? {
            let socket = match addr {
                std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            socket.bind(std::net::SocketAddr::new(local, 0))?;
            match socket.connect(addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no address to connect to")
        }))
    }

    async fn tcp(&self) -> Result<TcpStream, String> {
        match tokio::time::timeout(self.connect_timeout, self.connect()).await {
            Ok(Ok(stream)) => {
                // Small requests; don't let Nagle hold them back.
                let _ = stream.set_nodelay(true);
                Ok(stream)
            }
            Ok(Err(e)) => Err(format!("connect to {}: {e}", self.connect_to)),
            Err(_) => Err(format!(
                "connect to {}: timed out after {:?}",
                self.connect_to, self.connect_timeout
            )),
        }
    }

    async fn open(&self) -> Result<(u64, Sender), String> {
        let io = TokioIo::new(self.tcp().await?);
        let mut shutdown = self.shutdown.clone();
        let sender = match self.http {
            HttpVersion::Http1 => {
                let (sender, conn) = http1::handshake(io)
                    .await
                    .map_err(|e| format!("HTTP/1.1 handshake with {}: {e}", self.connect_to))?;
                tokio::spawn(async move {
                    tokio::select! {
                        _ = conn => {}
                        _ = shutdown.wait_for(|stop| *stop) => {}
                    }
                });
                Sender::H1(sender)
            }
            HttpVersion::Http2 => {
                let handshake = http2::Builder::new(TokioExecutor::new()).handshake(io);
                let (sender, conn) =
                    match tokio::time::timeout(self.connect_timeout, handshake).await {
                        Ok(Ok(pair)) => pair,
                        Ok(Err(e)) => {
                            return Err(format!(
                                "HTTP/2 handshake with {}: {}",
                                self.connect_to,
                                error_text(&e)
                            ))
                        }
                        Err(_) => {
                            return Err(format!(
                                "HTTP/2 handshake with {}: timed out after {:?}",
                                self.connect_to, self.connect_timeout
                            ))
                        }
                    };
                tokio::spawn(async move {
                    tokio::select! {
                        _ = conn => {}
                        _ = shutdown.wait_for(|stop| *stop) => {}
                    }
                });
                Sender::H2(sender)
            }
        };
        // Relaxed: the id only has to be unique, not ordered with anything else.
        let id = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
        Ok((id, sender))
    }

    /// A connection for one request: pooled/shared when `keepalive`, else a new one.
    pub(crate) async fn lease(&self, keepalive: bool) -> Result<Lease, String> {
        if !keepalive {
            let (id, sender) = self.open().await?;
            return Ok(Lease {
                id,
                reused: false,
                keepalive: false,
                handed: 1,
                sender,
            });
        }
        match self.http {
            HttpVersion::Http1 => {
                if let Some(conn) = self.checkout_idle().await {
                    return Ok(Lease {
                        id: conn.id,
                        reused: conn.handed > 0,
                        keepalive: true,
                        handed: conn.handed + 1,
                        sender: Sender::H1(conn.sender),
                    });
                }
                let (id, sender) = self.open().await?;
                Ok(Lease {
                    id,
                    reused: false,
                    keepalive: true,
                    handed: 1,
                    sender,
                })
            }
            HttpVersion::Http2 => {
                let mut shared = self.shared.lock().await;
                let usable = shared.as_ref().is_some_and(|c| !c.sender.is_closed());
                if !usable {
                    let (id, sender) = self.open().await?;
                    let Sender::H2(sender) = sender else {
                        unreachable!("an HTTP/2 probe opens HTTP/2 connections")
                    };
                    *shared = Some(H2Conn {
                        id,
                        handed: Arc::new(AtomicU64::new(0)),
                        sender,
                    });
                }
                let conn = shared.as_ref().expect("set above").clone();
                drop(shared);
                // Relaxed: the counter is only read by the lease that incremented it.
                let before = conn.handed.fetch_add(1, Ordering::Relaxed);
                Ok(Lease {
                    id: conn.id,
                    reused: before > 0,
                    keepalive: true,
                    handed: before + 1,
                    sender: Sender::H2(conn.sender),
                })
            }
        }
    }

    /// Pops idle connections until one is ready; closed or stuck ones are dropped.
    async fn checkout_idle(&self) -> Option<H1Conn> {
        loop {
            let mut conn = self.idle.lock().expect("idle pool lock").pop()?;
            if conn.sender.is_closed() {
                continue;
            }
            // A pooled connection's previous response was read to its end, so it is ready at
            // once unless the server closed it meanwhile; the limit only guards against a stuck
            // connection holding the request back.
            match tokio::time::timeout(Duration::from_secs(1), conn.sender.ready()).await {
                Ok(Ok(())) => return Some(conn),
                Ok(Err(_)) | Err(_) => continue,
            }
        }
    }

    /// Gives a connection back after its request's body was read to the end.
    ///
    /// `server_keeps_it` is `false` when the response said `Connection: close`.
    pub(crate) fn release(&self, lease: Lease, server_keeps_it: bool) {
        if !lease.keepalive || !server_keeps_it {
            return;
        }
        if let Sender::H1(sender) = lease.sender {
            if sender.is_closed() {
                return;
            }
            let mut idle = self.idle.lock().expect("idle pool lock");
            if idle.len() < self.max_idle {
                idle.push(H1Conn {
                    id: lease.id,
                    handed: lease.handed,
                    sender,
                });
            }
        }
        // HTTP/2: the shared connection stays in `shared`; this clone of its sender just goes.
    }

    /// Stops handing out the shared HTTP/2 connection `id` (it announced GOAWAY).
    pub(crate) async fn retire(&self, id: u64) {
        let mut shared = self.shared.lock().await;
        if shared.as_ref().is_some_and(|c| c.id == id) {
            *shared = None;
        }
    }

    /// Drops every kept connection (idle and shared).
    pub(crate) async fn clear(&self) {
        self.idle.lock().expect("idle pool lock").clear();
        *self.shared.lock().await = None;
    }
}

/// An error with its causes, `outer: inner: innermost`, skipping causes the outer text already
/// spells out.
pub(crate) fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    text
}
