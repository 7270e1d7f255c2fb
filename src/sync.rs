//! Locks that shrug off poisoning, written once.
//!
//! Every lock in the crate guards state that no panic can leave half-updated (a push, a
//! remove, a field set under the lock), so a lock poisoned by a panic elsewhere is taken as it
//! is: a drain must still finish, and report, after one task panicked.

use std::sync::{Mutex, MutexGuard};
#[cfg(feature = "http")]
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

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

/// [`RwLock::read`] and [`RwLock::write`] that ignore poisoning (see the module docs).
#[cfg(feature = "http")] // the layer options' table is the only `RwLock`
pub(crate) trait RwLockExt<T: ?Sized> {
    /// Takes the lock for reading, poisoned or not.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Takes the lock for writing, poisoned or not.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

#[cfg(feature = "http")]
impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    #[inline]
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|e| e.into_inner())
    }
}
