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
