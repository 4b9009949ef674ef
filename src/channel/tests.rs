use semver::Version;

use super::*;

fn stable() -> Channel {
    ChannelRegistry::load(&[])
        .expect("built-in channels load")
        .get("stable")
        .expect("stable exists")
        .clone()
}

fn tiny_channel(extra_versions: &[&str]) -> Channel {
    let mut files = vec![(
        "channel.yaml".to_string(),
        format!(
            "name: tiny\ncomponents:\n  apiserver:\n    versions: [{}]\n  etcd:\n    versions: [\"3.5.21\", \"3.6.8\"]\ndefaults:\n  kubernetes: \"1.36.3\"\ncompatibility:\n  - kubernetes: \"1.35\"\n    etcd: \"3.5.21\"\n  - kubernetes: \"1.36\"\n    etcd: \"3.6.8\"\n",
            extra_versions
                .iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )];
    for v in extra_versions {
        files.push((format!("{v}/apiserver/a.yaml"), "kind: ConfigMap".into()));
    }
    for v in ["3.5.21", "3.6.8"] {
        files.push((format!("{v}/etcd/a.yaml"), "kind: ConfigMap".into()));
    }
    Channel::from_files("tiny", "test", files).expect("tiny channel is valid")
}

#[test]
fn builtin_stable_channel_carries_kubernetes_1_36_and_etcd_3_6() {
    let ch = stable();
    assert!(
        ch.versions(ComponentKind::ApiServer)
            .iter()
            .any(|v| v.major == 1 && v.minor == 36)
    );
    assert!(
        ch.versions(ComponentKind::ControllerManager)
            .iter()
            .any(|v| v.major == 1 && v.minor == 36)
    );
    assert!(
        ch.versions(ComponentKind::Etcd)
            .iter()
            .any(|v| v.major == 3 && v.minor == 6)
    );
}

/// (component, requested, NCP Kubernetes version, expected version or error reason)
type ResolutionCase<'a> = (
    ComponentKind,
    Option<&'a str>,
    Option<&'a Version>,
    Result<&'a str, &'a str>,
);

#[test]
fn resolution_table() {
    let ch = tiny_channel(&["1.35.4", "1.36.1", "1.36.3"]);
    let k136 = Version::new(1, 36, 3);
    let k135 = Version::new(1, 35, 4);
    let cases: &[ResolutionCase] = &[
        (ComponentKind::ApiServer, Some("1.36.1"), None, Ok("1.36.1")),
        (ComponentKind::ApiServer, Some("1.36"), None, Ok("1.36.3")),
        (ComponentKind::ApiServer, Some("v1.35"), None, Ok("1.35.4")),
        (ComponentKind::ApiServer, Some("1"), None, Ok("1.36.3")),
        (ComponentKind::ApiServer, None, None, Ok("1.36.3")),
        (ComponentKind::ApiServer, Some("  "), None, Ok("1.36.3")),
        (ComponentKind::ApiServer, Some("1.37"), None, Err("UnknownVersion")),
        (ComponentKind::ApiServer, Some("1.36.2"), None, Err("UnknownVersion")),
        (ComponentKind::ApiServer, Some("latest"), None, Err("InvalidVersion")),
        (ComponentKind::Etcd, Some("3.6.8-0"), None, Ok("3.6.8")),
        (ComponentKind::Etcd, None, Some(&k136), Ok("3.6.8")),
        (ComponentKind::Etcd, None, Some(&k135), Ok("3.5.21")),
        (ComponentKind::Etcd, None, None, Ok("3.6.8")),
        (
            ComponentKind::Etcd,
            None,
            Some(&Version::new(1, 30, 0)),
            Err("UnknownVersion"),
        ),
    ];
    for (kind, requested, k8s, want) in cases {
        let got = ch.resolve(*kind, *requested, *k8s);
        match (want, &got) {
            (Ok(v), Ok(g)) => assert_eq!(g.to_string(), *v, "{kind} {requested:?}"),
            (Err(reason), Err(e)) => assert_eq!(e.reason(), *reason, "{kind} {requested:?}: {e}"),
            _ => panic!("{kind} {requested:?} with k8s {k8s:?}: want {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn unknown_version_error_lists_what_exists() {
    let ch = tiny_channel(&["1.36.1", "1.36.3"]);
    let err = ch.resolve(ComponentKind::ApiServer, Some("1.99"), None).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("1.36.1") && msg.contains("1.36.3"), "{msg}");
}

#[test]
fn unknown_channel_error_lists_channels() {
    let reg = ChannelRegistry::load(&[]).unwrap();
    let err = reg.get("nope").unwrap_err();
    assert_eq!(err.reason(), "UnknownChannel");
    assert!(err.to_string().contains("stable"), "{err}");
}

#[test]
fn listed_version_without_templates_is_invalid() {
    let files = vec![(
        "channel.yaml".to_string(),
        "name: c\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\ndefaults:\n  kubernetes: \"1.36.3\"\n".to_string(),
    )];
    let err = Channel::from_files("c", "test", files).unwrap_err();
    assert!(err.to_string().contains("3.6.8/etcd/ has no templates"), "{err}");
}

#[test]
fn unlisted_template_directory_is_invalid() {
    let files = vec![
        (
            "channel.yaml".to_string(),
            "name: c\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\ndefaults:\n  kubernetes: \"1.36.3\"\n"
                .to_string(),
        ),
        ("3.6.8/etcd/a.yaml".to_string(), "kind: ConfigMap".to_string()),
        ("3.6.9/etcd/a.yaml".to_string(), "kind: ConfigMap".to_string()),
    ];
    let err = Channel::from_files("c", "test", files).unwrap_err();
    assert!(err.to_string().contains("3.6.9/etcd/ is not listed"), "{err}");
}

#[test]
fn channel_dir_overrides_builtin_of_same_name() {
    let dir = std::env::temp_dir().join(format!("capn-channel-test-{}", std::process::id()));
    let stable_dir = dir.join("stable");
    std::fs::create_dir_all(stable_dir.join("9.9.9/etcd")).unwrap();
    std::fs::write(
        stable_dir.join("channel.yaml"),
        "name: stable\ncomponents:\n  etcd:\n    versions: [\"9.9.9\"]\ndefaults:\n  kubernetes: \"1.36.3\"\n",
    )
    .unwrap();
    std::fs::write(stable_dir.join("9.9.9/etcd/a.yaml"), "kind: ConfigMap").unwrap();
    let reg = ChannelRegistry::load(std::slice::from_ref(&dir)).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let ch = reg.get("stable").unwrap();
    assert_eq!(ch.versions(ComponentKind::Etcd), vec![&Version::new(9, 9, 9)]);
    assert_ne!(ch.origin, "built-in");
}

/// A channel of one etcd release whose `channel.yaml` ends with `sizes_yaml`.
fn channel_with_sizes(sizes_yaml: &str) -> Result<Channel, ChannelError> {
    let index = format!(
        "name: sized\ncomponents:\n  etcd:\n    versions: [\"3.6.8\"]\ndefaults:\n  kubernetes: \"1.36.3\"\n{sizes_yaml}"
    );
    Channel::from_files(
        "sized",
        "test",
        [
            ("channel.yaml".to_string(), index),
            ("3.6.8/etcd/a.yaml".to_string(), "kind: ConfigMap".to_string()),
        ],
    )
}

#[test]
fn a_size_resolves_to_the_requested_one_else_the_channels_default_and_an_unknown_one_lists_the_sizes() {
    let ch =
        channel_with_sizes("  size: medium\nsizes:\n  small:\n    etcd: {quotaBackendBytes: 256Mi}\n  medium: {}\n")
            .unwrap();
    let name = |requested| ch.resolve_size(requested).map(|s| s.map(|(n, _)| n.to_string()));
    assert_eq!(name(None), Ok(Some("medium".into())));
    assert_eq!(name(Some(" ")), Ok(Some("medium".into())), "empty means unset");
    assert_eq!(name(Some("small")), Ok(Some("small".into())));
    let e = ch.resolve_size(Some("huge")).unwrap_err();
    assert_eq!(e.reason(), "UnknownSize");
    assert_eq!(
        e.to_string(),
        "size \"huge\" is not in channel \"sized\"; available: medium, small"
    );
    // A channel without sizes: nothing by default, and any size is refused.
    let plain = channel_with_sizes("").unwrap();
    assert_eq!(plain.resolve_size(None), Ok(None));
    let e = plain.resolve_size(Some("small")).unwrap_err();
    assert!(e.to_string().contains("which defines no sizes"), "{e}");
}

#[test]
fn the_stable_channel_offers_small_medium_and_large_and_defaults_to_medium() {
    let ch = stable();
    assert_eq!(
        ch.index.sizes.keys().map(String::as_str).collect::<Vec<_>>(),
        ["large", "medium", "small"]
    );
    assert_eq!(ch.index.defaults.size.as_deref(), Some("medium"));
}

#[test]
fn sizes_are_checked_when_the_channel_loads() {
    for (yaml, says) in [
        ("sizes:\n  small: {}\n", "defaults.size is missing"),
        (
            "  size: big\nsizes:\n  small: {}\n",
            "defaults.size \"big\" is not one of the channel's sizes: small",
        ),
        ("  size: small\n", "the channel has no sizes"),
        (
            "  size: Small\nsizes:\n  Small: {}\n",
            "size name \"Small\" must be a DNS label",
        ),
        (
            "  size: s\nsizes:\n  s:\n    etcd: {maxRequestsInflight: 10}\n",
            "sizes.s.etcd.maxRequestsInflight is a setting of apiserver only",
        ),
        ("  size: s\nsizes:\n  s:\n    etcd: {cpu: 1}\n", "unknown field"),
        ("  size: s\nsizes:\n  s:\n    scheduler: {}\n", "unknown field"),
    ] {
        let e = channel_with_sizes(yaml).unwrap_err();
        assert_eq!(e.reason(), "InvalidChannel", "{yaml}");
        assert!(e.to_string().contains(says), "{yaml}: {e}");
    }
}
