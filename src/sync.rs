//! Locks that shrug off poisoning, written once.
//!
//! Every lock in the crate guards state that no panic can leave half-updated (a push, a
//! remove, a field set under the lock), so a lock poisoned by a panic elsewhere is taken as it
//! is: a drain must still finish, and report, after one task panicked.

use std::sync::{Mutex, MutexGuard};

/// [`Mutex::lock`] that ignores poisoning (see the module docs).
pub(crate) trait MutexExt<T: ?Sized> {
    /// Takes the lock, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> MutexExt<T> for Mutex<T> {
    #[inline]
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}
