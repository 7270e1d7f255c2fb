//! The service handed to [`serve`](super::serve), prepared once: an axum `Router` gets its state.

/// Gives an `axum::Router` handed to [`serve`](super::serve) its state, as `axum::serve` does
/// once (through `into_make_service`): until then axum builds each handler into a route, and
/// applies each `Router::layer` to it, anew on every request (allocations and instructions on
/// every request; BENCHMARKS.md has the figures). The router as it is and the
/// router inside a `DrainService` are recognised; any other service is left as it is, and a
/// router wrapped in a service of the caller's is the caller's to prepare
/// (`router.with_state(())`).
#[cfg(feature = "axum")]
pub(super) fn with_state<S: 'static>(mut service: S) -> S {
    use crate::server::DrainService;
    use crate::server::{RefuseAfterStop, RequestLine, Unnamed};
    use axum::Router;

    fn give(router: &mut Router) {
        *router = router.clone().with_state(());
    }
    let any = &mut service as &mut dyn std::any::Any;
    // The router as it is, or wrapped in the drain layer (the guides' other placement).
    if let Some(r) = any.downcast_mut::<Router>() {
        give(r);
    } else if let Some(s) = any.downcast_mut::<DrainService<Router>>() {
        give(s.get_mut());
    } else if let Some(s) = any.downcast_mut::<DrainService<Router, RequestLine>>() {
        give(s.get_mut());
    } else if let Some(s) = any.downcast_mut::<DrainService<Router, Unnamed, RefuseAfterStop>>() {
        give(s.get_mut());
    } else if let Some(s) = any.downcast_mut::<DrainService<Router, RequestLine, RefuseAfterStop>>()
    {
        give(s.get_mut());
    }
    service
}

#[cfg(not(feature = "axum"))]
pub(super) fn with_state<S>(service: S) -> S {
    service
}
