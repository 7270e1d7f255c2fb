//! What a drain layer does with a request that arrives after `stopped_accepting`:
//! [`Refusal`], [`ServeAfterStop`] (the default) and [`RefuseAfterStop`].
//!
//! The choice is a type, not a flag, so that a layer that never refuses carries no refused
//! state: its response future and body have no variant to tell apart, and `call` has no branch
//! to take (the refused state's marker is uninhabited, so the compiler removes it).

use std::convert::Infallible;

pub(crate) mod sealed {
    use std::fmt;

    pub trait SealedRefusal: Copy + Send + Sync + Unpin + 'static {
        /// The marker a refused response's future and body hold: uninhabited
        /// ([`Infallible`](std::convert::Infallible)) for a layer that never refuses.
        type Refused: Copy + Send + Sync + Unpin + fmt::Debug + 'static;
        /// `Some` if the layer may refuse: the value to mark a refused response with.
        const REFUSED: Option<Self::Refused>;
    }
}

/// What a [`DrainLayer`](crate::DrainLayer) does with requests that arrive after
/// `stopped_accepting`: serve them ([`ServeAfterStop`], the default) or answer `503`
/// ([`RefuseAfterStop`], chosen with
/// [`refuse_after_stop`](crate::DrainLayer::refuse_after_stop)).
///
/// Sealed: implemented by these two types only.
pub trait Refusal: sealed::SealedRefusal {}

/// Serves every request, whatever the phase (the default): a request that still arrives after
/// `stopped_accepting` is in-flight work, and refusing it would lose it for a client that does
/// not retry.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServeAfterStop;

impl sealed::SealedRefusal for ServeAfterStop {
    type Refused = Infallible;
    const REFUSED: Option<Infallible> = None;
}

impl Refusal for ServeAfterStop {}

/// From `stopped_accepting` on, answers `503` + `Retry-After` + `Connection: close` instead
/// of calling the inner service; see
/// [`DrainLayer::refuse_after_stop`](crate::DrainLayer::refuse_after_stop).
#[derive(Clone, Copy, Debug, Default)]
pub struct RefuseAfterStop;

impl sealed::SealedRefusal for RefuseAfterStop {
    type Refused = ();
    const REFUSED: Option<()> = Some(());
}

impl Refusal for RefuseAfterStop {}
