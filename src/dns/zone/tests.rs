use serde_json::json;

use super::*;

fn service(value: serde_json::Value) -> Arc<Service> {
    Arc::new(serde_json::from_value(value).unwrap())
}

fn slice(value: serde_json::Value) -> Arc<EndpointSlice> {
    Arc::new(serde_json::from_value(value).unwrap())
}

/// A tenant with a ClusterIP Service `web` (tenant address 10.96.0.20, reached at
/// 10.128.0.7), a headless `db` with two ready pods (one named by hostname) and a not-ready
/// one, and an ExternalName `docs` (outside) and `alias` (to `web`).
fn view() -> View {
    View {
        domain: "cluster.local".into(),
        services: vec![
            service(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"clusterIP": "10.96.0.20", "ports": [
                    {"name": "http", "port": 8080, "protocol": "TCP"},
                    {"name": "dns", "port": 53, "protocol": "UDP"}
                ]}
            })),
            service(json!({
                "metadata": {"name": "db", "namespace": "default"},
                "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}
            })),
            service(json!({
                "metadata": {"name": "docs", "namespace": "default"},
                "spec": {"type": "ExternalName", "externalName": "docs.example.com"}
            })),
            service(json!({
                "metadata": {"name": "alias", "namespace": "default"},
                "spec": {"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}
            })),
        ],
        slices: vec![
            slice(json!({
                "metadata": {"name": "db-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["198.18.3.4"], "hostname": "db-0", "conditions": {"ready": true}},
                    {"addresses": ["198.18.3.5"]},
                    {"addresses": ["198.18.3.6"], "conditions": {"ready": false}}
                ],
                "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]
            })),
            // A second slice repeating an address (slices overlap while they change).
            slice(json!({
                "metadata": {"name": "db-2", "namespace": "default", "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["198.18.3.5"]}],
                "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]
            })),
        ],
        addresses: BTreeMap::from([(("default".into(), "web".into()), "10.128.0.7".parse().unwrap())]),
        apiserver: vec!["10.128.0.1".parse().unwrap()],
        super_domain: Some("super.local".into()),
    }
}

fn name(text: &str) -> Name {
    Name::from_ascii(text).unwrap()
}

/// The answer's records as `(kind, data)` text, in order.
fn answered(resolution: &Resolution) -> Vec<String> {
    match resolution {
        Resolution::Answer { answers, .. } => answers
            .iter()
            .map(|r| format!("{} {}", r.record_type(), r.data))
            .collect(),
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[test]
fn a_cluster_ip_service_is_answered_with_the_address_pods_reach_it_at() {
    let view = view();
    let a = resolve(&view, &name("web.default.svc.cluster.local."), RecordType::A);
    assert_eq!(
        answered(&a),
        ["A 10.128.0.7"],
        "the super copy's address, not 10.96.0.20"
    );
    // Names are case-insensitive; AAAA of an IPv4 Service is an empty answer, not NXDOMAIN
    // (a client asking both must not take the name for missing).
    let upper = resolve(&view, &name("WEB.Default.svc.cluster.local."), RecordType::A);
    assert_eq!(answered(&upper), ["A 10.128.0.7"]);
    let aaaa = resolve(&view, &name("web.default.svc.cluster.local."), RecordType::AAAA);
    assert!(answered(&aaaa).is_empty());
    let srv = resolve(&view, &name("web.default.svc.cluster.local."), RecordType::SRV);
    assert_eq!(
        answered(&srv),
        [
            "SRV 0 100 8080 web.default.svc.cluster.local.",
            "SRV 0 100 53 web.default.svc.cluster.local."
        ]
    );
    let Resolution::Answer { additionals, .. } = srv else {
        unreachable!()
    };
    assert_eq!(additionals.len(), 1, "the target's address as an additional record");
}

#[test]
fn named_ports_answer_srv_for_their_protocol_only() {
    let view = view();
    let http = resolve(
        &view,
        &name("_http._tcp.web.default.svc.cluster.local."),
        RecordType::SRV,
    );
    assert_eq!(answered(&http), ["SRV 0 100 8080 web.default.svc.cluster.local."]);
    let dns = resolve(
        &view,
        &name("_dns._udp.web.default.svc.cluster.local."),
        RecordType::SRV,
    );
    assert_eq!(answered(&dns), ["SRV 0 100 53 web.default.svc.cluster.local."]);
    for missing in [
        "_http._udp.web.default.svc.cluster.local.",
        "_ftp._tcp.web.default.svc.cluster.local.",
    ] {
        assert_eq!(
            resolve(&view, &name(missing), RecordType::SRV),
            Resolution::NxDomain,
            "{missing}"
        );
    }
    let headless = resolve(&view, &name("_pg._tcp.db.default.svc.cluster.local."), RecordType::SRV);
    assert_eq!(
        answered(&headless),
        [
            "SRV 0 100 5432 db-0.db.default.svc.cluster.local.",
            "SRV 0 100 5432 198-18-3-5.db.default.svc.cluster.local."
        ]
    );
}

#[test]
fn a_headless_service_is_answered_with_its_ready_endpoints_and_each_by_its_name() {
    let view = view();
    let all = resolve(&view, &name("db.default.svc.cluster.local."), RecordType::A);
    assert_eq!(
        answered(&all),
        ["A 198.18.3.4", "A 198.18.3.5"],
        "ready (or unset) endpoints, each address once"
    );
    let by_hostname = resolve(&view, &name("db-0.db.default.svc.cluster.local."), RecordType::A);
    assert_eq!(answered(&by_hostname), ["A 198.18.3.4"], "pod DNS: hostname.subdomain");
    let by_address = resolve(&view, &name("198-18-3-5.db.default.svc.cluster.local."), RecordType::A);
    assert_eq!(answered(&by_address), ["A 198.18.3.5"]);
    for missing in [
        "198-18-3-6.db.default.svc.cluster.local.",
        "db-9.db.default.svc.cluster.local.",
        "x.web.default.svc.cluster.local.",
    ] {
        assert_eq!(
            resolve(&view, &name(missing), RecordType::A),
            Resolution::NxDomain,
            "{missing}"
        );
    }
}

#[test]
fn external_names_are_aliases_followed_inside_the_zone() {
    let view = view();
    match resolve(&view, &name("docs.default.svc.cluster.local."), RecordType::A) {
        Resolution::Alias { cname, target } => {
            assert_eq!(cname.data.to_string(), "docs.example.com.");
            assert_eq!(target, name("docs.example.com."));
        }
        other => panic!("expected an alias, got {other:?}"),
    }
    let inside = resolve(&view, &name("alias.default.svc.cluster.local."), RecordType::A);
    assert_eq!(
        answered(&inside),
        ["CNAME web.default.svc.cluster.local.", "A 10.128.0.7"]
    );
}

#[test]
fn the_apiserver_pods_and_the_zones_own_names_are_answered_and_the_rest_is_nxdomain() {
    let view = view();
    let apiserver = resolve(&view, &name("kubernetes.default.svc.cluster.local."), RecordType::A);
    assert_eq!(answered(&apiserver), ["A 10.128.0.1"]);
    let pod = resolve(&view, &name("198-18-3-9.default.pod.cluster.local."), RecordType::A);
    assert_eq!(answered(&pod), ["A 198.18.3.9"]);
    for empty in [
        "cluster.local.",
        "svc.cluster.local.",
        "default.svc.cluster.local.",
        "default.pod.cluster.local.",
    ] {
        assert!(
            answered(&resolve(&view, &name(empty), RecordType::A)).is_empty(),
            "{empty}"
        );
    }
    for missing in [
        "nope.default.svc.cluster.local.",
        "web.other.svc.cluster.local.",
        "web.default.cluster.local.",
        "not-an-ip.default.pod.cluster.local.",
    ] {
        assert_eq!(
            resolve(&view, &name(missing), RecordType::A),
            Resolution::NxDomain,
            "{missing}"
        );
    }
    assert_eq!(
        resolve(&view, &name("kube-dns.kube-system.svc.super.local."), RecordType::A),
        Resolution::NxDomain,
        "the super cluster's Services are not forwarded"
    );
    for outside in [
        "example.com.",
        "web.default.svc.cluster.localhost.",
        "local.",
        "super.local.",
    ] {
        assert_eq!(
            resolve(&view, &name(outside), RecordType::A),
            Resolution::Outside,
            "{outside}"
        );
    }
}

#[test]
fn a_service_whose_copy_has_no_address_yet_has_no_records() {
    let mut view = view();
    view.addresses.clear();
    let a = resolve(&view, &name("web.default.svc.cluster.local."), RecordType::A);
    assert!(answered(&a).is_empty(), "NOERROR without records: the name exists");
}

#[test]
fn a_search_path_through_a_namespace_without_services_is_nxdomain_not_empty() {
    let view = view();
    // `intranet` searched through `<ns>.svc.<zone>`: an empty answer would end musl's search.
    for missing in [
        "intranet.svc.cluster.local.",
        "nobody.svc.cluster.local.",
        "nobody.pod.cluster.local.",
    ] {
        assert_eq!(
            resolve(&view, &name(missing), RecordType::A),
            Resolution::NxDomain,
            "{missing}"
        );
    }
    assert!(answered(&resolve(&view, &name("default.svc.cluster.local."), RecordType::A)).is_empty());
}

#[test]
fn reverse_lookups_name_the_tenants_own_addresses_and_no_other() {
    let view = view();
    let service = resolve(&view, &name("7.0.128.10.in-addr.arpa."), RecordType::PTR);
    assert_eq!(answered(&service), ["PTR web.default.svc.cluster.local."]);
    let endpoint = resolve(&view, &name("4.3.18.198.in-addr.arpa."), RecordType::PTR);
    assert_eq!(answered(&endpoint), ["PTR db-0.db.default.svc.cluster.local."]);
    let unnamed = resolve(&view, &name("5.3.18.198.in-addr.arpa."), RecordType::PTR);
    assert_eq!(answered(&unnamed), ["PTR 198-18-3-5.db.default.svc.cluster.local."]);
    // Another tenant's (or the super cluster's) address is not forwarded, whatever it is.
    for other in [
        "20.0.96.10.in-addr.arpa.",
        "8.8.8.8.in-addr.arpa.",
        "in-addr.arpa.",
        "1.0.ip6.arpa.",
    ] {
        assert_eq!(
            resolve(&view, &name(other), RecordType::PTR),
            Resolution::NxDomain,
            "{other}"
        );
    }
}

#[test]
fn an_answer_holds_a_bounded_number_of_records() {
    let mut view = view();
    let endpoints: Vec<serde_json::Value> = (0..5000)
        .map(|i| json!({"addresses": [format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)]}))
        .collect();
    view.slices = vec![slice(json!({
        "metadata": {"name": "db-big", "namespace": "default", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}, {"name": "x", "port": 1, "protocol": "TCP"}]
    }))];
    for kind in [RecordType::A, RecordType::SRV] {
        let all = resolve(&view, &name("db.default.svc.cluster.local."), kind);
        assert_eq!(answered(&all).len(), MAX_ANSWERS, "{kind}");
    }
}
