use serde_json::json;

use super::*;

fn ok(syntax: Syntax, value: Value) {
    assert_eq!(syntax.check(&value), Ok(()), "{syntax:?} should accept {value}");
}

fn bad(syntax: Syntax, value: Value) {
    assert!(syntax.check(&value).is_err(), "{syntax:?} should refuse {value}");
}

#[test]
fn ports_are_1_to_65535() {
    ok(Syntax::Port, json!(1));
    ok(Syntax::Port, json!(6443));
    ok(Syntax::Port, json!(65535));
    bad(Syntax::Port, json!(0));
    bad(Syntax::Port, json!(70000));
    bad(Syntax::Port, json!(-1));
}

#[test]
fn hosts_are_dns_names_or_ips() {
    for good in [
        "api.example.com",
        "localhost",
        "10.0.0.1",
        "fd00::1",
        "2001:db8::abcd",
        "a-b.c",
    ] {
        ok(Syntax::Host, json!(good));
    }
    for wrong in [
        "",
        "API.example.com",
        "-api.example.com",
        "api..example.com",
        "https://api.example.com",
        "[fd00::1]",
        "api.example.com:6443",
        "*.example.com",
        "::ffff:10.0.0.1",
        "fe80::1%eth0",
        "under_score.example.com",
    ] {
        bad(Syntax::Host, json!(wrong));
    }
    bad(Syntax::Host, json!(format!("{}.com", "a".repeat(64))));
    bad(Syntax::Host, json!(vec!["a"; 130].join(".")));
}

#[test]
fn sans_allow_a_wildcard_first_label() {
    ok(Syntax::San, json!("*.example.com"));
    ok(Syntax::San, json!("api.example.com"));
    ok(Syntax::San, json!("192.0.2.7"));
    ok(Syntax::San, json!("fd00::7"));
    bad(Syntax::San, json!("api.*.example.com"));
    bad(Syntax::San, json!("*"));
    bad(Syntax::San, json!("exa mple.com"));
}

#[test]
fn service_cidrs_are_networks_with_room_and_at_most_20_host_bits() {
    for good in [
        "10.96.0.0/12",
        "10.96.0.0/24",
        "192.168.0.0/30",
        "fd00::/108",
        "fd00:10:96::/112",
    ] {
        ok(Syntax::ServiceCidr, json!(good));
    }
    let size = CIDR_SIZE_MESSAGE;
    let syntax = CIDR_MESSAGE;
    for (wrong, message) in [
        ("10.96.0.0", syntax),
        ("10.96.0.1/12", syntax),
        ("10.96.0.0/33", syntax),
        ("010.96.0.0/12", syntax),
        ("10.96.0.0/012", syntax),
        ("nonsense", syntax),
        ("10.0.0.0/8", size),
        ("10.96.0.0/31", size),
        ("10.96.0.0/32", size),
        ("fd00::/64", size),
        ("fd00::/127", size),
    ] {
        assert_eq!(Syntax::ServiceCidr.check(&json!(wrong)), Err(message), "{wrong}");
    }
}

#[test]
fn quantities_follow_the_kubernetes_grammar() {
    for good in ["100m", "128Mi", "1", "1.5", "2Gi", "1e3", "0", "500k", "1E"] {
        ok(Syntax::Quantity, json!(good));
    }
    ok(Syntax::Quantity, json!(2));
    for wrong in ["", "lots", "1KB", "1K", "-1", "1.2.3", "Mi", "1 Gi"] {
        bad(Syntax::Quantity, json!(wrong));
    }
    ok(Syntax::StorageSize, json!("1Gi"));
    bad(Syntax::StorageSize, json!("0"));
    bad(Syntax::StorageSize, json!("0Gi"));
    bad(Syntax::StorageSize, json!("-1Gi"));
    bad(Syntax::StorageSize, json!("big"));
}

#[test]
fn versions_are_what_the_channel_resolver_parses() {
    for good in ["", "1.36.3", "1.36", "1", "v1.36.3", "v1.36", "3.6.8-0"] {
        ok(Syntax::Version, json!(good));
        if !good.is_empty() {
            assert!(
                crate::channel::RequestedVersion::parse(good).is_some(),
                "{good} passes the rule but not the resolver"
            );
        }
    }
    for wrong in ["latest", "1.36.x", "1.36.3.4", "v", "1.36.3-rc.1", " 1.36", "V1.36"] {
        bad(Syntax::Version, json!(wrong));
    }
}

#[test]
fn channel_names_are_names_never_paths() {
    for good in ["", "stable", "etcd-operator", "prune-test", "v1.2"] {
        ok(Syntax::ChannelName, json!(good));
    }
    for wrong in ["../etc", "/abs", "a/b", ".", "..", "Stable", "-x", &"a".repeat(64)] {
        bad(Syntax::ChannelName, json!(wrong));
    }
}

#[test]
fn size_names_are_dns_labels_or_empty() {
    for good in ["", "small", "x-large", "2xl", &"a".repeat(63)] {
        ok(Syntax::SizeName, json!(good));
        assert!(good.is_empty() || crate::channel::is_size_name(good), "{good}");
    }
    for wrong in ["Small", "-small", "small-", "a.b", "a/b", "a_b", &"a".repeat(64)] {
        bad(Syntax::SizeName, json!(wrong));
        assert!(!crate::channel::is_size_name(wrong), "{wrong}");
    }
}

#[test]
fn extra_args_keys_are_flag_names() {
    ok(
        Syntax::FlagName,
        json!({"v": "2", "feature-gates": "A=true", "quota_backend.bytes": "1"}),
    );
    ok(Syntax::FlagName, json!({}));
    for wrong in ["--v", "-v", "v=2", "a b", "", "ü"] {
        bad(Syntax::FlagName, json!({ wrong: "x" }));
    }
    bad(Syntax::FlagName, json!({ "a".repeat(129): "x" }));
}

#[test]
fn replicas_have_bounds_per_kind() {
    let etcd = Syntax::Replicas { max: MAX_ETCD_MEMBERS };
    ok(etcd, json!(1));
    ok(etcd, json!(7));
    bad(etcd, json!(8));
    bad(etcd, json!(0));
    let other = Syntax::Replicas { max: MAX_REPLICAS };
    ok(other, json!(10));
    bad(other, json!(11));
    bad(other, json!(-3));
}

#[test]
fn cluster_names_fit_every_derived_name() {
    let longest = format!("a{}", "b".repeat(MAX_CLUSTER_NAME - 1));
    ok(Syntax::ClusterName, json!(longest));
    // Every name capn derives from it fits its own limit.
    assert!(format!("{longest}-controller-manager").len() <= 52, "StatefulSet name");
    assert!(format!("{longest}-apiserver").len() <= 63, "Service name");
    assert!(format!("{longest}-etcd-6.{longest}-etcd").len() <= 253, "member host");
    bad(Syntax::ClusterName, json!(format!("{longest}b")));
    for wrong in ["1abc", "a.b", "A", "a_b", "a-"] {
        bad(Syntax::ClusterName, json!(wrong));
    }
}

#[test]
fn image_repositories_are_registry_paths() {
    for good in [
        "registry.k8s.io",
        "localhost:5000/mirror",
        "ghcr.io/org/images",
        "my-registry.local/a_b",
    ] {
        ok(Syntax::ImageRepository, json!(good));
    }
    for wrong in [
        "https://registry.k8s.io",
        "registry.k8s.io/",
        "Registry.io",
        "a b",
        "r.io/x:tag",
    ] {
        bad(Syntax::ImageRepository, json!(wrong));
    }
}

#[test]
fn check_object_names_every_broken_field_with_its_path() {
    let ncp = json!({
        "metadata": {"name": "demo"},
        "spec": {
            "certSANs": ["ok.example.com", "bad_san"],
            "controlPlaneEndpoint": {"host": "api.example.com", "port": 70000},
            "clusterNetwork": {"services": {"cidrBlocks": ["10.0.0.0/8"]}},
        }
    });
    let errors = check_object(Kind::NestedControlPlane, &ncp);
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.certSANs[1]",
            "spec.clusterNetwork.services.cidrBlocks[0]",
            "spec.controlPlaneEndpoint.port"
        ]
    );
    assert_eq!(errors[2].reason(), "InvalidEndpoint");
    assert_eq!(
        errors[2].to_string(),
        format!("NestedControlPlane demo: spec.controlPlaneEndpoint.port: Invalid value: 70000: {PORT_MESSAGE}")
    );
    let etcd = json!({
        "metadata": {"name": "e"},
        "spec": {"replicas": 9, "resources": {"requests": {"cpu": "lots"}}, "extraArgs": {"--v": "2"}}
    });
    let errors = check_object(Kind::NestedEtcd, &etcd);
    let found: Vec<(&str, &str)> = errors.iter().map(|e| (e.path.as_str(), e.reason())).collect();
    assert_eq!(
        found,
        [
            ("spec.replicas", "InvalidReplicas"),
            ("spec.resources.requests[cpu]", "InvalidResources"),
            ("spec.extraArgs", "InvalidExtraArgs"),
        ]
    );
    assert!(check_object(Kind::NestedAPIServer, &json!({"metadata": {"name": "a"}})).is_empty());
}

#[test]
fn sleep_schedules_are_cron_schedules_named_by_what_they_schedule() {
    let ncp = json!({
        "metadata": {"name": "demo"},
        "spec": {"hibernation": {"enabled": false, "schedules": [
            {"start": "0 20 * * 1-5", "end": "0 7 * * 1-5"},
            {"start": "every evening"},
            {"end": "@daily"},
        ]}},
    });
    let errors = check_object(Kind::NestedControlPlane, &ncp);
    let found: Vec<(&str, &str)> = errors.iter().map(|e| (e.path.as_str(), e.reason())).collect();
    assert_eq!(
        found,
        [("spec.hibernation.schedules[1].start", "InvalidHibernationSchedule")]
    );
}

#[test]
fn backup_schedules_are_five_cron_fields_or_an_alias() {
    for good in ["0 3 * * *", "*/15 8-17 * * mon-fri", "@hourly", "@annually"] {
        ok(Syntax::CronSchedule, json!(good));
    }
    for wrong in ["", "* * * *", "*/5 * * * * *", "@every 5m", "@reboot", "0 3 * * *\n"] {
        bad(Syntax::CronSchedule, json!(wrong));
    }
}

#[test]
fn backup_destinations_are_s3_urls_and_bucket_names() {
    for good in [
        "https://s3.eu-west-1.amazonaws.com",
        "http://minio.backup:9000",
        "http://127.0.0.1:9000/",
        "http://[fd00::1]:9000",
    ] {
        ok(Syntax::S3Endpoint, json!(good));
    }
    for wrong in [
        "s3.amazonaws.com",
        "ftp://x",
        "https://host/bucket",
        "https://host:9000?x=1",
        "https://",
    ] {
        bad(Syntax::S3Endpoint, json!(wrong));
    }
    for good in ["capn-backups", "a.b.c", "abc"] {
        ok(Syntax::BucketName, json!(good));
    }
    for wrong in ["ab", "Backups", "-backups", "backups-", "b_ckups", &"a".repeat(64)] {
        bad(Syntax::BucketName, json!(wrong));
    }
    ok(Syntax::Retention { max: 1000 }, json!(1));
    ok(Syntax::Retention { max: 1000 }, json!(1000));
    bad(Syntax::Retention { max: 1000 }, json!(0));
    bad(Syntax::Retention { max: 1000 }, json!(1001));
}

#[test]
fn encrypted_resources_are_named_as_kube_apiserver_accepts_them_without_wildcards() {
    for good in [
        "secrets",
        "configmaps",
        "events",
        "deployments.apps",
        "widgets.example.com",
        "leases.coordination.k8s.io",
    ] {
        ok(Syntax::EncryptedResource, json!(good));
    }
    // Each with the message of the rule it breaks (kube-apiserver's refusal, or capn's).
    for (wrong, message) in [
        ("Secrets", ENCRYPTED_RESOURCE_MESSAGE),
        ("*.apps", ENCRYPTED_RESOURCE_MESSAGE),
        ("*.*", ENCRYPTED_RESOURCE_MESSAGE),
        ("*.", ENCRYPTED_RESOURCE_MESSAGE),
        ("*", ENCRYPTED_RESOURCE_MESSAGE),
        ("secrets.*", ENCRYPTED_RESOURCE_MESSAGE),
        ("", ENCRYPTED_RESOURCE_MESSAGE),
        (".apps", ENCRYPTED_RESOURCE_MESSAGE),
        ("servicenodeportallocations", NON_REST_RESOURCE_MESSAGE),
        ("apiserveripinfo", NON_REST_RESOURCE_MESSAGE),
        ("events.events.k8s.io", EVENTS_GROUP_MESSAGE),
        ("deployments.extensions", EXTENSIONS_GROUP_MESSAGE),
    ] {
        assert_eq!(Syntax::EncryptedResource.check(&json!(wrong)), Err(message), "{wrong}");
    }
    ok(Syntax::EncryptedResources, json!(["secrets", "configmaps"]));
    assert_eq!(
        Syntax::EncryptedResources.check(&json!(["configmaps"])),
        Err(ENCRYPTED_SECRETS_MESSAGE)
    );
    assert_eq!(
        Syntax::EncryptedResources.check(&json!(["secrets", "configmaps", "configmaps"])),
        Err(ENCRYPTED_DUPLICATE_MESSAGE)
    );
    let ncp = json!({
        "metadata": {"name": "demo"},
        "spec": {"encryption": {"resources": ["secrets", "*.apps", "configmaps"]}},
    });
    let errors = check_object(Kind::NestedControlPlane, &ncp);
    let found: Vec<(&str, &str)> = errors.iter().map(|e| (e.path.as_str(), e.reason())).collect();
    assert_eq!(found, [("spec.encryption.resources[1]", "InvalidEncryptionResources")]);
}
