//! Locks that shrug off poisoning, written once; and the oldest few of a collection walked
//! under a lock.
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

/// The `keep` items of `items` with the smallest `key` (the oldest, for a start instant; `None`
/// sorts first), oldest first. One pass, holding only those kept: for the straggler list,
/// walked under a lock over however many entries a hostile peer made.
pub(crate) fn oldest<'a, T, K: Ord>(
    items: impl Iterator<Item = &'a T>,
    keep: usize,
    key: impl Fn(&T) -> K,
) -> Vec<&'a T> {
    let mut kept: Vec<(K, &'a T)> = Vec::with_capacity(keep.min(64));
    for item in items {
        let k = key(item);
        if kept.len() == keep && kept.last().is_none_or(|(last, _)| k >= *last) {
            continue;
        }
        let at = kept.partition_point(|(other, _)| *other <= k);
        kept.insert(at, (k, item));
        kept.truncate(keep);
    }
    kept.into_iter().map(|(_, item)| item).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn oldest_keeps_the_smallest_keys_in_order() {
        let items = [5, 1, 9, 3, 7, 2, 8];
        let kept: Vec<i32> = super::oldest(items.iter(), 3, |&x| x)
            .into_iter()
            .copied()
            .collect();
        assert_eq!(kept, vec![1, 2, 3]);
        assert!(super::oldest(items.iter(), 0, |&x| x).is_empty());
        assert_eq!(super::oldest(items.iter(), 10, |&x| x).len(), items.len());
    }
}
