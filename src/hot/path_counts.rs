//! Requests by traffic-path label (`x-traffic-path`) after the drain started, in bounded
//! memory that no client can squat: the labels kept are the most frequent over the drain, not
//! the first to arrive.
//!
//! A Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005): at most [`MAX_PATHS`] entries,
//! each with a *weight*; a new label when the table is full replaces the entry of least weight
//! and takes that weight plus one. Junk labels sent early each weigh 1 and are the first to
//! go; a label that carries more than `1/MAX_PATHS` of the labelled requests is always kept.
//!
//! # Invariants
//!
//! * At most [`MAX_PATHS`] labels plus `other`, each label at most [`MAX_PATH_LABEL`] bytes.
//! * Every labelled request is counted once: in its label's entry, or in `other`. An evicted
//!   entry's counts move to `other`, so a label's counts are exact from its (last) admission.

// Only the drain layer (feature `http`) writes the counts; every build reads them (empty
// without it) into the report, and every build compiles and tests the sketch.
#![cfg_attr(not(feature = "http"), allow(dead_code))]

/// Distinct traffic-path labels kept.
pub(crate) const MAX_PATHS: usize = 16;
/// Longest label kept; a longer one counts as `other`.
const MAX_PATH_LABEL: usize = 64;
/// Where what is not kept is counted.
const OTHER: &str = "other";

#[derive(Debug)]
struct Entry {
    label: String,
    /// Requests since admission plus the weight of the entry it replaced: the sketch's
    /// over-estimate, used only to choose what to evict.
    weight: u64,
    on_new: u64,
    on_reused: u64,
}

/// The traffic-path counts of one drain; see the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct PathCounts {
    entries: Vec<Entry>,
    /// `other`: (on new connections, on reused ones).
    other: (u64, u64),
}

impl PathCounts {
    /// Counts one request that carried `label` (raw header bytes).
    pub(crate) fn note(&mut self, label: &[u8], on_new_connection: bool) {
        let bump = |on_new: &mut u64, on_reused: &mut u64| {
            if on_new_connection {
                *on_new += 1;
            } else {
                *on_reused += 1;
            }
        };
        let label = std::str::from_utf8(label)
            .ok()
            .map(str::trim)
            .filter(|l| !l.is_empty() && l.len() <= MAX_PATH_LABEL && *l != OTHER);
        let Some(label) = label else {
            let (n, r) = &mut self.other;
            bump(n, r);
            return;
        };
        if let Some(e) = self.entries.iter_mut().find(|e| e.label == label) {
            e.weight += 1;
            bump(&mut e.on_new, &mut e.on_reused);
            return;
        }
        let mut entry = Entry {
            label: label.to_owned(),
            weight: 1,
            on_new: 0,
            on_reused: 0,
        };
        bump(&mut entry.on_new, &mut entry.on_reused);
        if self.entries.len() < MAX_PATHS {
            self.entries.push(entry);
            return;
        }
        // The least weight goes (the earliest of equals); its requests stay counted, as
        // `other`.
        let (i, min) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.weight)
            .map(|(i, e)| (i, e.weight))
            .expect("the table is full");
        entry.weight = min + 1;
        let gone = std::mem::replace(&mut self.entries[i], entry);
        self.other.0 += gone.on_new;
        self.other.1 += gone.on_reused;
    }

    /// `(label, on new connections, on reused ones)`, most requests first, then `other`.
    pub(crate) fn counts(&self) -> Vec<(String, u64, u64)> {
        let mut out: Vec<(String, u64, u64)> = self
            .entries
            .iter()
            .map(|e| (e.label.clone(), e.on_new, e.on_reused))
            .collect();
        out.sort_by(|a, b| (b.1 + b.2).cmp(&(a.1 + a.2)).then_with(|| a.0.cmp(&b.0)));
        if self.other != (0, 0) {
            out.push((OTHER.to_owned(), self.other.0, self.other.1));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frequent_label_survives_any_order_of_junk() {
        let mut p = PathCounts::default();
        for i in 0..MAX_PATHS {
            p.note(format!("junk-{i}").as_bytes(), true);
        }
        for round in 0..100 {
            p.note(b"ingress", round % 2 == 0);
            // Two fresh junk labels per real request: ingress still has a third of it all.
            p.note(format!("j{round}a").as_bytes(), true);
            p.note(format!("j{round}b").as_bytes(), true);
        }
        let counts = p.counts();
        assert_eq!(counts[0], ("ingress".to_owned(), 50, 50));
        assert!(counts.len() <= MAX_PATHS + 1);
        let total: u64 = counts.iter().map(|c| c.1 + c.2).sum();
        assert_eq!(total, MAX_PATHS as u64 + 300, "every request counted once");
        // Not a label: empty, too long, or the reserved name.
        let mut q = PathCounts::default();
        for bad in [
            &b""[..],
            b"  ",
            &[b'x'; 65][..],
            b"other",
            &[0xff, 0xfe][..],
        ] {
            q.note(bad, false);
        }
        assert_eq!(q.counts(), [("other".to_owned(), 0, 5)]);
    }
}
