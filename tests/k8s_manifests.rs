//! The example manifests in `examples/k8s/` agree with each other and with the admin router:
//! grace period, env, ports, probes, the preStop hook. (Schema validity is `.ci/k8s-validate.sh`.)

mod common;

use std::time::Duration;

use lameduck::parse_duration;
use lameduck::AdminBuilder;
use yaml_rust2::{Yaml, YamlLoader};

const DEPLOYMENT: &str = include_str!("../examples/k8s/deployment.yaml");
const SERVICE: &str = include_str!("../examples/k8s/service.yaml");
const SERVICE_ACCOUNT: &str = include_str!("../examples/k8s/serviceaccount.yaml");
const ROLE: &str = include_str!("../examples/k8s/role.yaml");
const ROLE_BINDING: &str = include_str!("../examples/k8s/rolebinding.yaml");

/// A manifest as the checks read it: mappings (in document order), sequences and scalars, the
/// scalars as their YAML text. Parsed by a YAML 1.2 parser (yaml-rust2); a file with more than
/// one document, or a value of a kind the checks do not read, fails loudly.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Map(Vec<(String, Node)>),
    Seq(Vec<Node>),
    Scalar(String),
}

impl Node {
    /// Follows a dotted path of keys (and `[n]` indexes for sequences).
    fn at(&self, path: &str) -> &Node {
        let mut node = self;
        for step in path.split('.') {
            let (key, index) = match step.split_once('[') {
                Some((k, rest)) => (
                    k,
                    Some(rest.trim_end_matches(']').parse::<usize>().unwrap()),
                ),
                None => (step, None),
            };
            if !key.is_empty() {
                node = node
                    .get(key)
                    .unwrap_or_else(|| panic!("no `{key}` on the way to `{path}`"));
            }
            if let Some(i) = index {
                node = &node.items()[i];
            }
        }
        node
    }

    fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn str(&self, path: &str) -> &str {
        match self.at(path) {
            Node::Scalar(s) => s,
            other => panic!("`{path}` is not a scalar: {other:?}"),
        }
    }

    fn items(&self) -> &[Node] {
        match self {
            Node::Seq(items) => items,
            other => panic!("not a sequence: {other:?}"),
        }
    }

    fn list(&self, path: &str) -> &[Node] {
        self.at(path).items()
    }

    /// The entry of a sequence of maps whose `name` is `name`.
    fn named<'a>(items: &'a [Node], name: &str) -> &'a Node {
        items
            .iter()
            .find(|n| n.get("name") == Some(&Node::Scalar(name.to_owned())))
            .unwrap_or_else(|| panic!("no entry named `{name}`"))
    }
}

fn parse(text: &str) -> Node {
    let docs = YamlLoader::load_from_str(text).unwrap_or_else(|e| panic!("not YAML: {e}"));
    assert_eq!(docs.len(), 1, "one document per file");
    node(&docs[0])
}

fn node(yaml: &Yaml) -> Node {
    match yaml {
        Yaml::Hash(entries) => Node::Map(
            entries
                .iter()
                .map(|(k, v)| match node(k) {
                    Node::Scalar(key) => (key, node(v)),
                    other => panic!("a mapping key that is not a scalar: {other:?}"),
                })
                .collect(),
        ),
        Yaml::Array(items) => Node::Seq(items.iter().map(node).collect()),
        Yaml::String(s) | Yaml::Real(s) => Node::Scalar(s.clone()),
        Yaml::Integer(i) => Node::Scalar(i.to_string()),
        Yaml::Boolean(b) => Node::Scalar(b.to_string()),
        Yaml::Null => Node::Scalar(String::new()),
        other => panic!("YAML this test does not read (alias or bad value): {other:?}"),
    }
}

/// What the manifests say, gathered once.
struct Manifests {
    deployment: Node,
    service: Node,
}

impl Manifests {
    fn load() -> Self {
        let m = Self {
            deployment: parse(DEPLOYMENT),
            service: parse(SERVICE),
        };
        assert_eq!(m.deployment.str("kind"), "Deployment");
        assert_eq!(m.service.str("kind"), "Service");
        m
    }

    fn pod(&self) -> &Node {
        self.deployment.at("spec.template.spec")
    }

    fn container(&self) -> &Node {
        let containers = self.pod().list("containers");
        assert_eq!(containers.len(), 1, "one container");
        &containers[0]
    }

    fn env(&self, name: &str) -> &Node {
        Node::named(self.container().list("env"), name)
    }

    /// The value after `flag` in the container's args.
    fn arg(&self, flag: &str) -> Option<&str> {
        let args = self.container().list("args");
        let at = args
            .iter()
            .position(|a| *a == Node::Scalar(flag.to_owned()))?;
        match args.get(at + 1) {
            Some(Node::Scalar(v)) => Some(v),
            _ => panic!("`{flag}` has no value"),
        }
    }

    fn container_port(&self, name: &str) -> u16 {
        Node::named(self.container().list("ports"), name)
            .str("containerPort")
            .parse()
            .unwrap()
    }

    /// A probe's or hook's `port`, resolved to a number.
    fn resolve_port(&self, port: &str) -> u16 {
        port.parse().unwrap_or_else(|_| self.container_port(port))
    }

    // Only the admin-router checks read the token.
    #[cfg(feature = "admin")]
    fn admin_token(&self) -> &str {
        self.env("LAMEDUCK_ADMIN_TOKEN").str("value")
    }
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn grace_period_and_env_agree() {
    let m = Manifests::load();
    let grace: u64 = m
        .pod()
        .str("terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    let env = parse_duration(m.env("LAMEDUCK_GRACE_PERIOD").str("value")).unwrap();
    assert_eq!(
        env,
        Duration::from_secs(grace),
        "LAMEDUCK_GRACE_PERIOD vs terminationGracePeriodSeconds"
    );
    if let Some(flag) = m.arg("--grace-period") {
        assert_eq!(
            parse_duration(flag).unwrap(),
            env,
            "--grace-period vs the env"
        );
    }
    // The defaults of the budget must fit the grace period the Pod gets.
    lameduck::Drain::builder()
        .grace_period(env)
        .build()
        .expect("the manifest's grace period makes a valid budget");
}

#[test]
fn downward_api_env_names_the_pod() {
    let m = Manifests::load();
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_UID", "metadata.uid"),
        ("POD_IP", "status.podIP"),
    ] {
        assert_eq!(
            m.env(name).str("valueFrom.fieldRef.fieldPath"),
            field,
            "{name}"
        );
    }
    // Left at its default so the drain summary lands where kubelet reads it.
    assert!(m.container().get("terminationMessagePath").is_none());
    assert!(m.container().get("terminationMessagePolicy").is_none());
}

#[test]
fn ports_agree_and_the_admin_port_stays_out_of_the_service() {
    let m = Manifests::load();
    let http = port_of(m.arg("--listen").expect("--listen in args"));
    let admin = port_of(m.arg("--admin").expect("--admin in args"));
    assert_ne!(http, admin);
    assert_eq!(
        m.container_port("http"),
        http,
        "containerPort http vs --listen"
    );
    assert_eq!(
        m.container_port("admin"),
        admin,
        "containerPort admin vs --admin"
    );

    let ports = m.service.list("spec.ports");
    assert!(!ports.is_empty());
    for p in ports {
        let target = m.resolve_port(p.str("targetPort"));
        assert_eq!(target, http, "the Service targets the service port only");
        assert_ne!(p.str("port").parse::<u16>().unwrap(), admin);
    }

    // The Service and the Deployment select the Pods the template labels.
    let labels = m.deployment.at("spec.template.metadata.labels");
    for selector in [
        m.service.at("spec.selector"),
        m.deployment.at("spec.selector.matchLabels"),
    ] {
        let Node::Map(entries) = selector else {
            panic!("selector is not a map")
        };
        assert!(!entries.is_empty());
        for (k, v) in entries {
            assert_eq!(labels.get(k), Some(v), "selector {k}");
        }
    }
}

/// With `publishNotReadyAddresses: true` an endpoint stays `ready=true` while its Pod
/// terminates, so flipping `/readyz` removes nothing for consumers that follow `ready`
/// (headless DNS, most proxies): the drain would serve new connections until it stops
/// accepting and then refuse them.
#[test]
fn the_service_does_not_publish_not_ready_addresses() {
    fn publishes_not_ready(service: &Node) -> bool {
        service
            .at("spec")
            .get("publishNotReadyAddresses")
            .is_some_and(|n| matches!(n, Node::Scalar(v) if v == "true"))
    }
    let m = Manifests::load();
    assert!(
        !publishes_not_ready(&m.service),
        "examples/k8s/service.yaml sets publishNotReadyAddresses: true; a draining Pod would stay \
         ready=true in its EndpointSlice (see guide::kubernetes, Probes)"
    );
    // The check sees the setting when it is there.
    let bad = SERVICE.replace("spec:\n", "spec:\n  publishNotReadyAddresses: true\n");
    assert!(publishes_not_ready(&parse(&bad)));
}

#[cfg(feature = "admin")]
#[test]
fn probes_and_prestop_use_the_admin_port() {
    let m = Manifests::load();
    let admin = port_of(m.arg("--admin").unwrap());
    let c = m.container();
    assert_eq!(c.str("readinessProbe.httpGet.path"), "/readyz");
    assert_eq!(c.str("livenessProbe.httpGet.path"), "/livez");
    for probe in ["readinessProbe", "livenessProbe", "lifecycle.preStop"] {
        let port = c.str(&format!("{probe}.httpGet.port"));
        assert_eq!(m.resolve_port(port), admin, "{probe} port");
    }

    let grace: u64 = m
        .pod()
        .str("terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    let path = c.str("lifecycle.preStop.httpGet.path");
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    assert_eq!(route, "/drain");
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "wait" => {
                v.parse::<lameduck::admin::Wait>().unwrap();
            }
            // A hook still waiting at the grace period is killed with the container.
            "timeout" => assert!(parse_duration(v).unwrap() < Duration::from_secs(grace)),
            other => panic!("/drain does not take `{other}`"),
        }
    }

    let headers = c.list("lifecycle.preStop.httpGet.httpHeaders");
    let auth = Node::named(headers, "Authorization").str("value");
    assert_eq!(
        auth,
        format!("Bearer {}", m.admin_token()),
        "the preStop header carries the token the app reads"
    );
}

/// The manifest's own probe and hook requests, sent to a live admin router configured as the
/// manifest configures the app: probes answer 200 and the preStop request drains.
#[cfg(feature = "admin")]
#[tokio::test]
async fn the_manifest_requests_work_against_the_admin_router() {
    use http_body_util::Empty;

    let m = Manifests::load();
    let c = m.container();
    let drain = common::drain(
        Duration::from_secs(20),
        lameduck::Propagation::fixed(Duration::from_millis(50)),
    );
    drain.readiness().mark_serving();
    let router = AdminBuilder::new(&drain)
        .token(m.admin_token())
        .unwrap()
        .router();
    let (listener, addr) = common::bind().await;
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let call = |action: &str| {
        let path = c.str(&format!("{action}.httpGet.path")).to_owned();
        let headers: Vec<(String, String)> = c
            .at(action)
            .at("httpGet")
            .get("httpHeaders")
            .map(|h| {
                h.items()
                    .iter()
                    .map(|n| (n.str("name").to_owned(), n.str("value").to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        async move {
            let (mut tx, _conn) = common::h1(addr).await;
            let mut req = http::Request::get(format!("http://{addr}{path}"))
                .header("host", addr.to_string())
                .header("user-agent", "kube-probe/1.37");
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let fut = tx.send_request(req.body(Empty::new()).unwrap());
            let res = common::within("the admin's answer", fut).await.unwrap();
            let (status, _, body) = common::text(res).await;
            (status.as_u16(), body)
        }
    };

    assert_eq!(call("readinessProbe").await, (200, "ok".to_owned()));
    assert_eq!(call("livenessProbe").await, (200, "ok".to_owned()));
    let (status, body) = call("lifecycle.preStop").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(drain.phase(), lameduck::Phase::Done);
    assert_eq!(
        drain.report().unwrap().trigger,
        Some(lameduck::Trigger::PreStop)
    );
    assert_eq!(call("readinessProbe").await.0, 503);
    assert_eq!(call("livenessProbe").await.0, 200);
}

#[test]
fn the_reader_keeps_yaml_meaning_and_refuses_what_it_cannot_read() {
    let doc = parse(
        "a: 1 # trailing\nb:\n  - name: x\n    value: \"q # not a comment\"\n  - plain\nc: [\"--f\", 2]\nd:\n- y\ne: {f: true}\n",
    );
    assert_eq!(doc.str("a"), "1");
    assert_eq!(doc.str("b[0].value"), "q # not a comment");
    assert_eq!(doc.str("b[1]"), "plain");
    assert_eq!(doc.list("c").len(), 2);
    assert_eq!(doc.str("d[0]"), "y");
    assert_eq!(doc.str("e.f"), "true");
    for refused in ["a: 1\n---\nb: 2\n", "a: [1\n"] {
        assert!(
            std::panic::catch_unwind(|| parse(refused)).is_err(),
            "{refused:?} was read"
        );
    }
}

/// The `kube` feature's EndpointWatch: the Deployment runs as the ServiceAccount the
/// RoleBinding grants the Role to, and the Role allows exactly what the watch does (get, list,
/// watch its Pod; list, watch EndpointSlices; get Services) and nothing that writes.
#[test]
fn rbac_grants_the_endpoint_watch_what_it_reads_and_nothing_more() {
    let m = Manifests::load();
    let account = parse(SERVICE_ACCOUNT);
    let role = parse(ROLE);
    let binding = parse(ROLE_BINDING);
    assert_eq!(account.str("kind"), "ServiceAccount");
    assert_eq!(role.str("kind"), "Role");
    assert_eq!(binding.str("kind"), "RoleBinding");

    // Without the `kube` feature the Pod runs as the default account: the Deployment names
    // none, and says in a comment which to name with the feature.
    assert!(m.pod().get("serviceAccountName").is_none());
    assert!(
        DEPLOYMENT.contains(&format!(
            "# serviceAccountName: {}",
            account.str("metadata.name")
        )),
        "the Deployment's comment names the account the kube feature uses"
    );
    assert_eq!(binding.str("roleRef.kind"), "Role");
    assert_eq!(binding.str("roleRef.apiGroup"), "rbac.authorization.k8s.io");
    assert_eq!(binding.str("roleRef.name"), role.str("metadata.name"));
    let subjects = binding.list("subjects");
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].str("kind"), "ServiceAccount");
    assert_eq!(subjects[0].str("name"), account.str("metadata.name"));
    // Namespaced and in the Pod's own namespace: none of the three pins one.
    for doc in [&account, &role, &binding] {
        assert!(doc.at("metadata").get("namespace").is_none());
    }

    let scalars = |n: &Node| -> Vec<String> {
        n.items()
            .iter()
            .map(|x| match x {
                Node::Scalar(s) => s.clone(),
                other => panic!("not a scalar: {other:?}"),
            })
            .collect()
    };
    let mut granted: Vec<(String, String, Vec<String>)> = Vec::new();
    for rule in role.list("rules") {
        for group in scalars(rule.at("apiGroups")) {
            for resource in scalars(rule.at("resources")) {
                granted.push((group.clone(), resource, scalars(rule.at("verbs"))));
            }
        }
    }
    let verbs = |group: &str, resource: &str| -> Vec<String> {
        let mut v: Vec<String> = granted
            .iter()
            .filter(|(g, r, _)| g == group && r == resource)
            .flat_map(|(_, _, v)| v.clone())
            .collect();
        v.sort();
        v
    };
    assert_eq!(verbs("", "pods"), ["get", "list", "watch"]);
    assert_eq!(
        verbs("discovery.k8s.io", "endpointslices"),
        ["list", "watch"]
    );
    assert_eq!(verbs("", "services"), ["get"]);
    assert_eq!(granted.len(), 3, "no other resource: {granted:?}");
}
