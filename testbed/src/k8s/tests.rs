use super::*;

#[test]
fn the_pinned_version_is_go_mods() {
    let gomod = include_str!("../../k8s/go.mod");
    assert!(
        gomod.contains(&format!("k8s.io/kubernetes {PINNED_VERSION}")),
        "testbed/k8s/go.mod does not pin {PINNED_VERSION}"
    );
    assert_eq!(probe_user_agent(), "kube-probe/1.36");
}

#[test]
fn only_the_services_live_endpoints_count() {
    // Large-cluster mode: no comments, and the chain of a removed endpoint (198.18.1.1)
    // still in the table, unreferenced; another Service's endpoint beside.
    let text = "*nat\n\
        -A KUBE-SERVICES -d 198.18.100.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-AAAA\n\
        -A KUBE-SERVICES -d 198.18.96.7/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BBBB\n\
        -A KUBE-SVC-AAAA -m statistic --mode random --probability 0.5 -j KUBE-SEP-TWO\n\
        -A KUBE-SVC-AAAA -j KUBE-SEP-THREE\n\
        -A KUBE-SVC-BBBB -j KUBE-SEP-OTHER\n\
        -A KUBE-SEP-ONE -p tcp -m tcp -j DNAT --to-destination 198.18.1.1:8080\n\
        -A KUBE-SEP-TWO -p tcp -m tcp -j DNAT --to-destination 198.18.1.2:8080\n\
        -A KUBE-SEP-THREE -p tcp -m tcp -j DNAT --to-destination 198.18.1.3:8080\n\
        -A KUBE-SEP-OTHER -p tcp -m tcp -j DNAT --to-destination 198.19.0.1:8080\n\
        COMMIT\n";
    let ips = iptables_service_endpoints(text);
    assert_eq!(
        ips,
        vec![Ipv4Addr::new(198, 18, 1, 2), Ipv4Addr::new(198, 18, 1, 3)]
    );
    assert!(iptables_service_endpoints("*nat\nCOMMIT\n").is_empty());
}

#[test]
fn metrics_parse() {
    let text =
        "# HELP x\nkubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7e+09\n\
                kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1.8e+09\n\
                kubeproxy_sync_proxy_rules_duration_seconds_count 12\n\
                kubeproxy_sync_proxy_rules_duration_seconds_sum 0.25\n\
                kubeproxy_network_programming_duration_seconds_count 3\n\
                kubeproxy_network_programming_duration_seconds_sum 4.5\n";
    let m = ProxyMetrics::parse(text);
    assert_eq!(m.last_sync, 1.7e9);
    assert_eq!((m.sync_count, m.programming_count), (12, 3));
    assert_eq!((m.sync_sum, m.programming_sum), (0.25, 4.5));
}

#[test]
fn dechunks() {
    assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
}

/// A component that dies names its cause, not only the stack's last frames: etcd's
/// structured panic, a Go runtime panic and a klog fatal line are each found.
#[test]
fn a_dead_components_fatal_line_is_found() {
    let etcd = "{\"level\":\"warn\",\"msg\":\"slow\"}\n\
        {\"level\":\"panic\",\"msg\":\"failed to create WAL\",\"error\":\"no space left on device\"}\n\
        panic: failed to create WAL\n\tgo.etcd.io/etcd/server/v3/etcdserver/bootstrap.go:171\n";
    assert_eq!(
        first_fatal_line(etcd),
        Some(
            "{\"level\":\"panic\",\"msg\":\"failed to create WAL\",\"error\":\"no space left on device\"}"
        )
    );
    assert_eq!(
        first_fatal_line("I1206 ok\npanic: runtime error\ngoroutine 1\n"),
        Some("panic: runtime error")
    );
    assert_eq!(
        first_fatal_line("I1206 12:00 ok\nF1206 12:00 server.go:1] bind: address in use\n"),
        Some("F1206 12:00 server.go:1] bind: address in use")
    );
    assert_eq!(first_fatal_line("I1206 fine\nFoo bar\n"), None);
}
