//! What the watch tells the startup measurement: when it started, and when it first saw a
//! slice list this Pod ready (or that it could not see that moment).

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::Startup;

impl Startup {
    /// The watch started: peers are remembered from now on.
    pub(crate) fn arm(&self) {
        // Relaxed: a connection that misses the flag by a few nanoseconds is one the watch
        // could not have placed before or after the listing anyway.
        self.measuring.store(true, Ordering::Relaxed);
    }

    /// The watch saw a slice list this Pod ready for the first time.
    pub(crate) fn listed(&self, at: Instant) {
        let mut st = self.lock();
        if st.listed_at.is_none() && st.unmeasurable.is_none() {
            st.listed_at = Some(at);
        }
    }

    /// The slices already listed this Pod ready when the watch first read them.
    pub(crate) fn unmeasurable(&self, why: String) {
        let mut st = self.lock();
        if st.listed_at.is_none() && st.unmeasurable.is_none() {
            st.unmeasurable = Some(why);
            self.measuring.store(false, Ordering::Relaxed);
        }
    }
}
