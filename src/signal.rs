//! OS signal triggers.
//!
//! SIGTERM and SIGINT start the drain (kubelet sends SIGTERM; SIGINT is Ctrl-C). A second SIGINT
//! or a SIGQUIT during the drain means "exit now", for a human at a terminal.

use crate::{Drain, Trigger};

/// Which OS signals the coordinator listens to, set with
/// [`DrainBuilder::signals`](crate::DrainBuilder::signals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signals {
    pub(crate) sigterm: bool,
    pub(crate) sigint: bool,
    pub(crate) sigquit: bool,
}

impl Default for Signals {
    /// SIGTERM and SIGINT start the drain; a second SIGINT and SIGQUIT force the exit.
    fn default() -> Self {
        Self {
            sigterm: true,
            sigint: true,
            sigquit: true,
        }
    }
}

impl Signals {
    /// Listen to no signal: the drain starts only through the API or the admin endpoint.
    pub fn none() -> Self {
        Self {
            sigterm: false,
            sigint: false,
            sigquit: false,
        }
    }

    /// Listen to SIGTERM only.
    pub fn sigterm_only() -> Self {
        Self {
            sigterm: true,
            sigint: false,
            sigquit: false,
        }
    }

    /// `true` if no signal is listened to.
    pub fn is_none(&self) -> bool {
        !(self.sigterm || self.sigint || self.sigquit)
    }
}

/// Installs the handlers now (so the default action no longer applies from this point on)
/// and spawns the task that turns signals into triggers.
#[cfg(unix)]
pub(crate) fn install(drain: &Drain, which: Signals) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};

    let mut term = which
        .sigterm
        .then(|| signal(SignalKind::terminate()))
        .transpose()?;
    let mut int = which
        .sigint
        .then(|| signal(SignalKind::interrupt()))
        .transpose()?;
    let mut quit = which
        .sigquit
        .then(|| signal(SignalKind::quit()))
        .transpose()?;
    let drain = drain.clone();
    tokio::spawn(async move {
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    if s.recv().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
        let mut sigints = 0u32;
        loop {
            tokio::select! {
                () = recv(&mut term) => drain.on_signal(Trigger::Sigterm),
                () = recv(&mut int) => {
                    sigints += 1;
                    if sigints >= 2 {
                        drain.on_signal(Trigger::Sigint);
                        drain.force();
                    } else {
                        drain.on_signal(Trigger::Sigint);
                    }
                }
                () = recv(&mut quit) => {
                    drain.on_signal(Trigger::Sigquit);
                    drain.force();
                }
            }
        }
    });
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn install(drain: &Drain, which: Signals) -> std::io::Result<()> {
    if which.sigint {
        let drain = drain.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while tokio::signal::ctrl_c().await.is_ok() {
                n += 1;
                drain.on_signal(Trigger::Sigint);
                if n >= 2 {
                    drain.force();
                }
            }
        });
    }
    Ok(())
}
