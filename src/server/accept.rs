//! Accepting connections on a listener, with a back-off on failure: one loop for [`serve`] and
//! the admin server.
//!
//! [`serve`]: super::serve

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// First back-off after a failed `accept` (EMFILE and friends); doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A listener's accept loop, less what is done with each connection.
pub(crate) struct Acceptor {
    listener: TcpListener,
    backoff: Duration,
    /// Named in the log lines: `""` for `serve`, `"admin "` for the admin server.
    which: &'static str,
}

impl Acceptor {
    pub(crate) fn new(listener: TcpListener, which: &'static str) -> Self {
        Self {
            listener,
            backoff: MIN_BACKOFF,
            which,
        }
    }

    /// The next accepted connection, or `None` once `stop` resolves (checked first).
    ///
    /// Errors that concern one connection attempt are skipped at once; others (out of file
    /// descriptors and the like) are logged and retried after a back-off (10 ms doubling to
    /// 1 s, back to 10 ms after a success), during which `stop` is still watched.
    pub(crate) async fn next<F>(&mut self, mut stop: Pin<&mut F>) -> Option<(TcpStream, SocketAddr)>
    where
        F: Future<Output = ()>,
    {
        loop {
            let accepted = tokio::select! {
                biased;
                () = stop.as_mut() => return None,
                r = self.listener.accept() => r,
            };
            match accepted {
                Ok(conn) => {
                    self.backoff = MIN_BACKOFF;
                    return Some(conn);
                }
                Err(e) if is_per_connection(&e) => {
                    tracing::debug!(error = %e, "lameduck: {}accept: connection failed before it was accepted", self.which);
                }
                Err(e) => {
                    tracing::warn!(error = %e, backoff_ms = self.backoff.as_millis() as u64, "lameduck: {}accept failed; backing off", self.which);
                    tokio::select! {
                        biased;
                        () = stop.as_mut() => return None,
                        () = tokio::time::sleep(self.backoff) => {}
                    }
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// Errors that concern one connection attempt, not the listener: retry at once.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
