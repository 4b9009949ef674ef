use k8s_openapi::api::core::v1::Service;
use serde_json::json;

use super::*;

fn control_plane() -> ControlPlaneRef {
    ControlPlaneRef::new("teams", "demo")
}

/// A tenant Service as the tenant apiserver stores it (defaults filled in).
fn tenant_service() -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "t-web", "resourceVersion": "9",
            "labels": {"app": "web"}},
        "spec": {"type": "NodePort", "clusterIP": "10.96.4.4", "clusterIPs": ["10.96.4.4"],
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}],
            "externalIPs": ["203.0.113.9"], "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
            "externalTrafficPolicy": "Cluster", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}
    }))
    .unwrap()
}

fn copy() -> Service {
    service_copy(&control_plane(), &tenant_service(), false)
        .unwrap()
        .expect("copied")
}

/// The copy as the super cluster stores it: its own uid and ClusterIP, its defaults.
fn stored(copy: &Service, ip: &str) -> Service {
    let mut stored = copy.clone();
    stored.metadata.uid = Some("s-web".into());
    let spec = stored.spec.as_mut().unwrap();
    if spec.cluster_ip.is_none() {
        spec.cluster_ip = Some(ip.into());
        spec.cluster_ips = Some(vec![ip.into()]);
    }
    spec.ip_families = Some(vec!["IPv4".into()]);
    spec.ip_family_policy = Some("SingleStack".into());
    stored
}

#[test]
fn the_copy_selects_only_its_namespace_pods_and_asks_for_nothing_beyond_the_tenant() {
    let copy = copy();
    assert_eq!(copy.metadata.name.as_deref(), Some("web-x-shop-x-demo"));
    assert_eq!(copy.metadata.namespace.as_deref(), Some("teams-demo-workloads"));
    let spec = copy.spec.unwrap();
    assert_eq!(
        spec.type_.as_deref(),
        Some("ClusterIP"),
        "no node port in the super cluster"
    );
    assert_eq!(spec.cluster_ip, None, "the super cluster allocates its own");
    assert_eq!(spec.external_ips, None, "CVE-2020-8554");
    assert_eq!(spec.external_traffic_policy, None);
    assert_eq!(spec.ip_families, None);
    assert_eq!(
        spec.selector,
        Some(BTreeMap::from([
            ("app".to_owned(), "web".to_owned()),
            ("tenancy.x-k8s.io/namespace".to_owned(), "shop".to_owned()),
        ]))
    );
    let port = &spec.ports.unwrap()[0];
    assert_eq!((port.port, port.node_port), (80, None));
    assert_eq!(port.target_port, Some(IntOrString::Int(8080)));
}

#[test]
fn headless_stays_headless_and_a_selector_less_service_selects_nothing() {
    let mut headless = tenant_service();
    let spec = headless.spec.as_mut().unwrap();
    spec.cluster_ip = Some("None".into());
    spec.cluster_ips = Some(vec!["None".into()]);
    spec.selector = Some(BTreeMap::new());
    let copy = service_copy(&control_plane(), &headless, false).unwrap().unwrap();
    let spec = copy.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(
        spec.selector, None,
        "an empty selector must not become the namespace's pods"
    );
}

#[test]
fn external_names_and_the_tenant_apiserver_service_are_not_copied() {
    let mut alias = tenant_service();
    alias.spec = Some(serde_json::from_value(json!({"type": "ExternalName", "externalName": "example.com"})).unwrap());
    assert_eq!(service_copy(&control_plane(), &alias, false), Ok(None));
    let mut apiserver = tenant_service();
    apiserver.metadata.namespace = Some("default".into());
    apiserver.metadata.name = Some("kubernetes".into());
    assert_eq!(service_copy(&control_plane(), &apiserver, false), Ok(None));
    let mut incomplete = tenant_service();
    incomplete.metadata.uid = None;
    assert!(service_copy(&control_plane(), &incomplete, false).is_err());
}

#[test]
fn a_stored_copy_is_current_and_changes_on_the_super_side_are_drift() {
    let desired = copy();
    let live = stored(&desired, "10.0.0.17");
    assert_eq!(copy_state(&desired, &live), CopyState::Current);

    let mut widened = live.clone();
    widened.spec.as_mut().unwrap().selector = Some(BTreeMap::from([("app".to_owned(), "web".to_owned())]));
    assert_eq!(copy_state(&desired, &widened), CopyState::Update);

    let mut ported = live.clone();
    ported.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].target_port = Some(IntOrString::Int(9090));
    assert_eq!(copy_state(&desired, &ported), CopyState::Update);

    let mut labelled = live.clone();
    labelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("app".into(), "other".into());
    assert_eq!(copy_state(&desired, &labelled), CopyState::Update);

    let mut headless = live;
    headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    assert_eq!(copy_state(&desired, &headless), CopyState::Replace);
}

#[test]
fn links_name_the_services_of_the_pod_namespace_with_their_copies_addresses() {
    let web = tenant_service();
    let mut db = tenant_service();
    db.metadata.name = Some("db".into());
    db.metadata.uid = Some("t-db".into());
    let mut elsewhere = tenant_service();
    elsewhere.metadata.namespace = Some("other".into());
    elsewhere.metadata.uid = Some("t-other".into());
    let mut headless = tenant_service();
    headless.metadata.name = Some("peers".into());
    headless.metadata.uid = Some("t-peers".into());
    headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    // A copy of another control plane's Service of the same identity gives no address.
    let foreign = stored(
        &service_copy(&ControlPlaneRef::new("teams", "other"), &db, false)
            .unwrap()
            .unwrap(),
        "10.0.0.66",
    );
    let copies = [
        stored(&copy(), "10.0.0.17"),
        stored(
            &service_copy(&control_plane(), &elsewhere, false).unwrap().unwrap(),
            "10.0.0.18",
        ),
        foreign,
    ];
    let (links, waiting) = service_links(&control_plane(), "shop", &[web, db, elsewhere, headless], &copies);
    assert_eq!(waiting, vec!["db".to_owned()]);
    assert_eq!(links.len(), 1);
    assert_eq!((links[0].name.as_str(), links[0].host.as_str()), ("web", "10.0.0.17"));
    assert_eq!(
        links[0].ports[0].node_port,
        Some(30080),
        "the tenant's ports, as its pods know them"
    );
}

#[test]
fn the_super_address_is_written_where_the_tenant_service_does_not_show_it() {
    let copies = [stored(&copy(), "10.0.0.17")];
    let unshown = tenant_service();
    let changes = cluster_ip_changes(&control_plane(), std::slice::from_ref(&unshown), &copies);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].1, "10.0.0.17");

    let mut shown = tenant_service();
    shown
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(SUPER_CLUSTER_IP.into(), "10.0.0.17".into());
    assert!(cluster_ip_changes(&control_plane(), &[shown.clone()], &copies).is_empty());

    let mut stale = shown;
    stale
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(SUPER_CLUSTER_IP.into(), "10.0.0.3".into());
    assert_eq!(
        cluster_ip_changes(&control_plane(), &[stale], &copies)[0].1,
        "10.0.0.17"
    );
    let none: [Service; 0] = [];
    assert!(cluster_ip_changes(&control_plane(), &[tenant_service()], &none).is_empty());
}

#[test]
fn a_new_copy_asks_for_the_tenant_address_and_an_existing_one_keeps_its_own() {
    let asking = asking_tenant_address(&copy(), &tenant_service()).expect("the tenant Service has an address");
    let spec = asking.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.4.4"));
    assert_eq!(spec.cluster_ips, Some(vec!["10.96.4.4".to_owned()]));
    // Headless, or not allocated yet: nothing to ask for.
    let headless = with_spec(&tenant_service(), json!({"clusterIP": "None"}));
    assert_eq!(asking_tenant_address(&copy(), &headless), None);
    let unallocated = with_spec(&tenant_service(), json!({"clusterIP": null}));
    assert_eq!(asking_tenant_address(&copy(), &unallocated), None);

    let live = stored(&copy(), "10.0.0.77");
    let kept = keeping_live_address(copy(), &live).spec.unwrap();
    assert_eq!(kept.cluster_ip.as_deref(), Some("10.0.0.77"));
    assert_eq!(kept.cluster_ips, Some(vec!["10.0.0.77".to_owned()]));
    assert_eq!(
        copy_state(&keeping_live_address(copy(), &live), &live),
        CopyState::Current
    );
}

/// `service` with `fields` merged into its spec.
fn with_spec(service: &Service, fields: serde_json::Value) -> Service {
    let mut value = serde_json::to_value(service).unwrap();
    json_patch::merge(&mut value["spec"], &fields);
    serde_json::from_value(value).unwrap()
}

#[test]
fn node_ports_open_only_where_the_control_plane_allows_them() {
    let copy = service_copy(&control_plane(), &tenant_service(), true)
        .unwrap()
        .unwrap();
    let spec = copy.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("NodePort"));
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(
        spec.ports.as_ref().unwrap()[0].node_port,
        None,
        "the super cluster's to allocate"
    );
    assert_eq!(spec.external_ips, None, "never, node ports or not");
    // A new copy asks for the tenant's node ports with its address, then alone.
    let asking = asking_tenant_address(&copy, &tenant_service()).unwrap();
    assert_eq!(asking.spec.unwrap().ports.unwrap()[0].node_port, Some(30080));
    let ports_only = asking_tenant_node_ports(&copy, &tenant_service())
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(ports_only.ports.unwrap()[0].node_port, Some(30080));
    assert_eq!(ports_only.cluster_ip, None, "the super cluster's address to give");
    let cluster_ip_copy = service_copy(&control_plane(), &tenant_service(), false)
        .unwrap()
        .unwrap();
    assert_eq!(asking_tenant_node_ports(&cluster_ip_copy, &tenant_service()), None);
    // A live copy keeps the node ports it was given, and shows them.
    let mut live = stored(&copy, "10.0.0.77");
    live.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(31999);
    let kept = keeping_live_address(copy.clone(), &live);
    assert_eq!(
        kept.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port,
        Some(31999)
    );
    assert_eq!(copy_state(&kept, &live), CopyState::Current);
    assert_eq!(super_node_ports(&live).as_deref(), Some("80/TCP=31999"));
    let tenant = [tenant_service()];
    let changes = node_port_changes(&control_plane(), &tenant, &[live.clone()]);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].1, "80/TCP=31999");
    let mut shown = tenant_service();
    shown.metadata.annotations = Some([(SUPER_NODE_PORTS.to_owned(), "80/TCP=31999".to_owned())].into());
    assert!(node_port_changes(&control_plane(), &[shown], &[live.clone()]).is_empty());
    // Turned off again: a ClusterIP copy, without the live node ports, is an update.
    let off = service_copy(&control_plane(), &tenant_service(), false)
        .unwrap()
        .unwrap();
    let off = keeping_live_address(off, &live);
    assert_eq!(off.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port, None);
    assert_eq!(copy_state(&off, &live), CopyState::Update);
    assert_eq!(super_node_ports(&stored(&off, "10.0.0.77")), None);
}
