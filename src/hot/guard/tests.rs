use super::*;

#[test]
fn the_leaked_block_is_small() {
    // `DrainBuilder::build` documents the leak's size; keep it honest.
    let size = std::mem::size_of::<Core>();
    assert!(size <= 2048, "Core is {size} bytes");
}

/// Describing guards, as the HTTP layer does.
#[cfg(feature = "http")]
mod described {
    use super::*;

    #[tokio::test]
    async fn done_frees_what_the_drain_accumulated() {
        let core = Core::leak();
        core.start_draining();
        core.observed().note_connection(
            Some("127.0.0.1:1".parse().unwrap()),
            crate::hot::observed::PathId::OTHER,
        );
        core.observed().note_path(b"ingress", true);
        let (mut guard, draining) = core.plain().enter();
        assert!(draining);
        guard.describe(RequestInfo {
            method: "GET".into(),
            path: "/".into(),
            peer: None,
            started: None,
        });
        assert_eq!(core.registered_requests().len(), 1);
        core.release_drain_state();
        assert!(core.observed().peers().is_empty());
        assert!(core.observed().paths().is_empty());
        assert!(core.registered_requests().is_empty());
        // The described guard's slot is gone; dropping it only leaves the counter.
        drop(guard);
        assert_eq!(core.counter.count(), 0);
        assert_eq!(
            core.observed().after_flip().new_connections,
            1,
            "the counters the report reads stay"
        );
        // A request described after Done gets an entry of its own, which the old guard's drop
        // (above) did not free twice.
        let (mut late, _) = core.plain().enter();
        late.describe(info("/late"));
        assert_eq!(core.registered_requests().len(), 1);
        drop(late);
        assert!(core.registered_requests().is_empty());
    }

    fn info(path: &str) -> RequestInfo {
        RequestInfo {
            method: "GET".into(),
            path: path.into(),
            peer: None,
            started: None,
        }
    }

    #[test]
    fn entry_sites_are_reused_and_keep_the_tag() {
        let core = Core::leak();
        core.start_draining();
        let site: &'static Site = Box::leak(Box::new(Site::new(core, 7)));
        let describe = |n: usize| -> Vec<InFlightGuard> {
            (0..n)
                .map(|i| {
                    let (mut g, draining) = site.enter();
                    assert!(draining);
                    g.describe(info(&format!("/{i}")));
                    assert!(g.is_described());
                    assert_eq!(g.tag(), 7, "an entry site carries its guard's tag");
                    g
                })
                .collect()
        };
        let first = describe(3);
        assert_eq!(core.registered_requests().len(), 3);
        assert_eq!(core.counter.count(), 3);
        drop(first);
        assert!(core.registered_requests().is_empty());
        assert_eq!(core.counter.count(), 0);

        // Three described at once again: the same three entry sites, none leaked anew.
        let second = describe(3);
        assert_eq!(core.requests.lock().unwrap().sites.len(), 3);
        // Describing twice keeps the first entry; adopting a second one releases it at once.
        let mut g = second.into_iter().next().unwrap();
        g.describe(info("/again"));
        let extra = core.register(info("/extra"), 7);
        g.adopt(extra);
        let paths: Vec<String> = core
            .registered_requests()
            .into_iter()
            .map(|r| r.path)
            .collect();
        assert!(paths.contains(&"/0".to_owned()), "{paths:?}");
        assert!(!paths.contains(&"/again".to_owned()), "{paths:?}");
        assert!(!paths.contains(&"/extra".to_owned()), "{paths:?}");
        drop(g);
        assert!(core.registered_requests().is_empty());
        assert_eq!(core.counter.count(), 0);
    }
}
