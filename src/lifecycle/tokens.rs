//! The tokens the drain fires as it goes, and the [`TaskContext`] handed to tasks.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::work::tasks::TaskContext;

/// The tokens the drain fires as it goes.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    /// The drain started: stop taking new work.
    pub(crate) drain: CancellationToken,
    /// `stopped_accepting`: listeners close, streams end.
    pub(crate) stop: CancellationToken,
    /// `hurry_lead` before the quiesce deadline.
    pub(crate) hurry: CancellationToken,
    /// The quiesce deadline (or forced): force-close what is left.
    pub(crate) deadline: CancellationToken,
    /// Exit now.
    pub(crate) force: CancellationToken,
}

impl Tokens {
    /// What a task is given: the drain's moments, and the quiesce deadline it reads.
    pub(super) fn task_context(&self, quiesce_at: Arc<Mutex<Option<Instant>>>) -> TaskContext {
        TaskContext {
            drain: self.drain.clone(),
            stop: self.stop.clone(),
            hurry: self.hurry.clone(),
            deadline: self.deadline.clone(),
            quiesce_at,
        }
    }
}
