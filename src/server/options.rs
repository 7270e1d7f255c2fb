//! The drain layer's options, and the tag a guard carries: read by the layer, its service and
//! its future, below all three.
//!
//! # Invariants
//!
//! * A layer holds a `&'static` entry of its coordinator's table of leaked, deduplicated
//!   option sets, not a reference count, so copying a layer or a service costs nothing but the
//!   copy. The tables are this module's, by coordinator (the address of its leaked hot-path
//!   block, never reused): the hot block knows nothing of them. Two coordinators in one
//!   process have two tables: a guard's tag indexes its own coordinator's.
//! * Each entry has the two sites its layer's guards count at (HTTP/1.x and the rest), whose
//!   tag is the entry's index and the version bit: a guard finds its layer's options by index.
//! * The table is written when a layer is built and read by index only while draining.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use http::{HeaderName, HeaderValue};

use crate::hot::guard::{Core, Site};

/// Bit 0 of a guard's tag: the request is HTTP/1.x, so `Connection: close` may be added while
/// draining. The bits above hold the layer's options index (see [`LayerEntry`]).
pub(crate) const TAG_HTTP1: u32 = 1;

/// The options index kept in a guard's tag.
#[inline]
pub(crate) fn tag_options(tag: u32) -> u32 {
    tag >> 1
}

/// What the options add; read only while draining.
#[derive(Clone, Default)]
pub(crate) struct Options {
    pub(crate) phase_header: Option<HeaderName>,
    pub(crate) instance_header: Option<(HeaderName, HeaderValue)>,
    /// `Retry-After` value, when refusal mode is on.
    pub(crate) refuse_retry_after: Option<HeaderValue>,
}

impl Options {
    fn same(&self, other: &Options) -> bool {
        self.phase_header == other.phase_header
            && self.instance_header == other.instance_header
            && self.refuse_retry_after == other.refuse_retry_after
    }
}

/// One distinct set of options, and the sites of its layer's guards.
#[derive(Debug)]
pub(crate) struct LayerEntry {
    pub(crate) options: Options,
    /// Where the layer's guards count: `[HTTP/1.x, HTTP/2 and later]`.
    pub(crate) sites: [Site; 2],
}

/// Largest option index: the guard's tag keeps it in 31 bits.
const MAX_OPTIONS: usize = (u32::MAX >> 1) as usize;

/// Every coordinator's table: the distinct sets of options its layers were built with, an
/// entry's tag index its position + 1. Keyed by the address of the coordinator's hot-path
/// block (leaked, so never reused). Written when a layer is built, read only while draining.
static TABLES: RwLock<BTreeMap<usize, Vec<&'static LayerEntry>>> = RwLock::new(BTreeMap::new());

fn key(core: &Core) -> usize {
    std::ptr::from_ref(core) as usize
}

fn tables_read() -> RwLockReadGuard<'static, BTreeMap<usize, Vec<&'static LayerEntry>>> {
    // Poisoning ignored, as everywhere (`vocab::sync`): the tables are only pushed to.
    TABLES.read().unwrap_or_else(|e| e.into_inner())
}

fn tables_write() -> RwLockWriteGuard<'static, BTreeMap<usize, Vec<&'static LayerEntry>>> {
    TABLES.write().unwrap_or_else(|e| e.into_inner())
}

/// The table's entry for `opts` (counting at `core`), added if no equal set is there yet.
pub(super) fn register(opts: Options, core: &'static Core) -> &'static LayerEntry {
    let mut tables = tables_write();
    let table = tables.entry(key(core)).or_default();
    if let Some(e) = table.iter().find(|e| e.options.same(&opts)) {
        return e;
    }
    assert!(
        table.len() < MAX_OPTIONS,
        "lameduck: too many distinct drain layer option sets; build layers once, at startup"
    );
    let index = table.len() as u32 + 1;
    let entry: &'static LayerEntry = Box::leak(Box::new(LayerEntry {
        options: opts,
        sites: [
            Site::new(core, index << 1 | TAG_HTTP1),
            Site::new(core, index << 1),
        ],
    }));
    table.push(entry);
    entry
}

/// The options at `index` (from 1) of `core`'s table; `None` for 0.
pub(crate) fn options(core: &Core, index: u32) -> Option<&'static Options> {
    let i = (index as usize).checked_sub(1)?;
    let entry: &'static LayerEntry = tables_read().get(&key(core))?.get(i)?;
    Some(&entry.options)
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("phase_header", &self.phase_header)
            .field("instance_header", &self.instance_header)
            .field("refuse_retry_after", &self.refuse_retry_after)
            .finish_non_exhaustive()
    }
}
