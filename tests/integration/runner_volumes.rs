//! The runner keeps Secret and ConfigMap volumes up to date while a pod runs, the way the
//! kubelet does (issue 9, item 3): a real process (etcd) in a runner pod sees, through its
//! own mounts, every change of the objects its volumes project, and keeps running.
//!
//! Latencies (API write → file changed inside the container) are printed, not asserted
//! beyond the polling deadline.

use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use capn_testkit::runner::{Runner, VolumeReport};
use capn_testkit::{cluster, test_namespace};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::{capn_binary, local_etcd_release};

/// The deadline for a change to reach a running pod's files: the runner's bound (2 s after
/// its watch has the change) with room for a machine shared with other tests.
const REFRESH: Duration = Duration::from_secs(15);
/// From creating the StatefulSet to its process running.
const START: Duration = Duration::from_secs(60);

const POD: &str = "refresh-0";
const SECRET_DIR: &str = "/etc/refresh/secret";
const CONFIG_DIR: &str = "/etc/refresh/config";

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "runner volumes: {line}");
}

/// A one-member etcd on the pod's loopback, as user 65532 with fsGroup 65532, mounting Secret
/// `refresh` (every key, 0440) and ConfigMap `refresh` (key `a` at `nested/a`, 0400).
fn statefulset() -> StatefulSet {
    let image = format!("registry.k8s.io/etcd:{}-0", local_etcd_release());
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "refresh", "labels": {"app.kubernetes.io/managed-by": "capn"}},
        "spec": {
            "serviceName": "refresh",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "refresh"}},
            "template": {
                "metadata": {"labels": {"app": "refresh"}},
                "spec": {
                    "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532},
                    "containers": [{
                        "name": "etcd",
                        "image": image,
                        "command": ["etcd"],
                        "args": [
                            "--name=refresh",
                            "--data-dir=/var/lib/etcd/data",
                            "--listen-client-urls=http://127.0.0.1:2379",
                            "--advertise-client-urls=http://127.0.0.1:2379",
                            "--listen-peer-urls=http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                            "--initial-cluster=refresh=http://127.0.0.1:2380",
                        ],
                        "volumeMounts": [
                            {"name": "secret", "mountPath": SECRET_DIR, "readOnly": true},
                            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": true},
                            {"name": "data", "mountPath": "/var/lib/etcd"},
                        ],
                    }],
                    "volumes": [
                        {"name": "secret", "secret": {"secretName": "refresh", "defaultMode": 0o440}},
                        {"name": "config", "configMap": {
                            "name": "refresh",
                            "items": [{"key": "a", "path": "nested/a", "mode": 0o400}],
                        }},
                        {"name": "data", "emptyDir": {}},
                    ],
                },
            },
        },
    }))
    .expect("a StatefulSet")
}

fn secret(data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("refresh".into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

fn config_map(data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("refresh".into()),
            ..Default::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..ConfigMap::default()
    }
}

/// A path as the process `pid` sees it, through its own mount namespace and root.
fn in_container(pid: i32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The pod's only container's pid, once it runs.
fn running_pid(runner: &Runner) -> Option<i32> {
    runner
        .pods()
        .into_iter()
        .find(|p| p.name == POD)?
        .containers
        .first()?
        .pid
}

fn volume(runner: &Runner, name: &str) -> VolumeReport {
    runner
        .pods()
        .into_iter()
        .find(|p| p.name == POD)
        .and_then(|p| p.volumes.into_iter().find(|v| v.name == name))
        .unwrap_or_else(|| panic!("{POD} has no volume {name}:\n{}", runner.report()))
}

/// The payload directories (`..<timestamp>`) and other entries of a volume directory.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Waits until `path` (inside the container) reads `want` (`None`: does not exist), and
/// returns how long that took (polled every 10 ms, to measure the delay).
async fn wait_for_file(runner: &Runner, path: &Path, want: Option<&str>) -> Duration {
    let since = Instant::now();
    while read(path).as_deref() != want {
        if let Err(problems) = runner.check() {
            panic!("while waiting for {}: {problems}\n{}", path.display(), runner.report());
        }
        assert!(
            since.elapsed() < REFRESH,
            "{} does not read {want:?} after {REFRESH:?} (it reads {:?})\n{}",
            path.display(),
            read(path),
            runner.report()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_and_config_map_volumes_follow_their_sources_while_the_pod_runs() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let runner = Runner::start(&client, &ns, capn_binary())
        .await
        .unwrap_or_else(|e| panic!("the runner did not start: {e}"));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let pp = PostParams::default();
    secrets
        .create(&pp, &secret(&[("tls.crt", "cert 1"), ("tls.key", "key 1")]))
        .await
        .unwrap();
    config_maps.create(&pp, &config_map(&[("a", "one")])).await.unwrap();
    Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .create(&pp, &statefulset())
        .await
        .unwrap();
    let pid = runner
        .wait_for("the pod's process runs", START, || async { running_pid(&runner) })
        .await;
    let crt = in_container(pid, &format!("{SECRET_DIR}/tls.crt"));
    let key = in_container(pid, &format!("{SECRET_DIR}/tls.key"));
    let ca = in_container(pid, &format!("{SECRET_DIR}/ca.crt"));
    let a = in_container(pid, &format!("{CONFIG_DIR}/nested/a"));
    assert_eq!(read(&crt).as_deref(), Some("cert 1"));
    assert_eq!(read(&a).as_deref(), Some("one"));

    // The kubelet's layout, seen from inside the container: links into ..data, which links
    // to the one payload directory; the modes asked for, group fsGroup.
    let secret_dir = in_container(pid, SECRET_DIR);
    let report = volume(&runner, "secret");
    assert_eq!(report.source, "Secret refresh");
    let host_dir = report.dir;
    assert_eq!(
        std::fs::metadata(&secret_dir).unwrap().ino(),
        std::fs::metadata(&host_dir).unwrap().ino(),
        "the container sees the volume directory through a bind mount"
    );
    // The writer publishes the new payload, then removes the old one: a reader may see both
    // for a moment, so give the removal a few seconds before judging.
    let layout = |dir: &Path| {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut names = entries(dir);
        while names.iter().filter(|n| n.starts_with("..2")).count() > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            names = entries(dir);
        }
        let payloads: Vec<String> = names.iter().filter(|n| n.starts_with("..2")).cloned().collect();
        assert_eq!(payloads.len(), 1, "one payload directory: {names:?}");
        assert_eq!(
            std::fs::read_link(dir.join("..data")).unwrap().to_string_lossy(),
            payloads[0],
            "{names:?}"
        );
        names
    };
    assert_eq!(layout(&secret_dir)[1..], ["..data", "tls.crt", "tls.key"]);
    assert_eq!(
        std::fs::read_link(secret_dir.join("tls.crt")).unwrap(),
        Path::new("..data/tls.crt")
    );
    let key_meta = std::fs::metadata(&key).unwrap();
    assert_eq!((key_meta.mode() & 0o7777, key_meta.gid()), (0o440, 65532));
    let a_meta = std::fs::metadata(&a).unwrap();
    assert_eq!(
        (a_meta.mode() & 0o7777, a_meta.gid()),
        (0o440, 65532),
        "0400 + fsGroup's r--r-----"
    );
    let first_payload = std::fs::read_link(secret_dir.join("..data")).unwrap();

    // A renewal: new certificate and key, and a new key in the Secret.
    let written = Instant::now();
    secrets
        .replace(
            "refresh",
            &pp,
            &secret(&[("tls.crt", "cert 2"), ("tls.key", "key 2"), ("ca.crt", "ca 2")]),
        )
        .await
        .unwrap();
    wait_for_file(&runner, &ca, Some("ca 2")).await;
    let took = written.elapsed();
    assert_eq!(read(&crt).as_deref(), Some("cert 2"));
    assert_eq!(read(&key).as_deref(), Some("key 2"));
    assert_ne!(std::fs::read_link(secret_dir.join("..data")).unwrap(), first_payload);
    assert_eq!(
        layout(&secret_dir)[1..],
        ["..data", "ca.crt", "tls.crt", "tls.key"],
        "the old payload directory is gone"
    );
    assert_eq!(
        std::fs::metadata(&secret_dir).unwrap().ino(),
        std::fs::metadata(&host_dir).unwrap().ino(),
        "still the same directory"
    );
    let key_meta = std::fs::metadata(&key).unwrap();
    assert_eq!((key_meta.mode() & 0o7777, key_meta.gid()), (0o440, 65532));
    say(&format!(
        "Secret replaced → files changed in the container after {took:.1?}"
    ));

    // A key removed from the Secret: its file goes.
    secrets
        .replace("refresh", &pp, &secret(&[("tls.crt", "cert 3"), ("tls.key", "key 3")]))
        .await
        .unwrap();
    let took = wait_for_file(&runner, &ca, None).await;
    assert_eq!(read(&crt).as_deref(), Some("cert 3"));
    assert_eq!(layout(&secret_dir)[1..], ["..data", "tls.crt", "tls.key"]);
    say(&format!("a key removed → its file gone after {took:.1?}"));

    // A metadata-only change writes nothing; the data change after it is one update. (Events
    // of one object arrive in order, so the label was seen before the new data.)
    let updates = volume(&runner, "config").updates;
    assert_eq!(updates, 0);
    let config_payload = std::fs::read_link(in_container(pid, &format!("{CONFIG_DIR}/..data"))).unwrap();
    config_maps
        .patch(
            "refresh",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    config_maps
        .patch(
            "refresh",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "two", "unprojected": "x"}})),
        )
        .await
        .unwrap();
    let took = wait_for_file(&runner, &a, Some("two")).await;
    assert_eq!(volume(&runner, "config").updates, 1, "the label alone wrote nothing");
    assert_ne!(
        std::fs::read_link(in_container(pid, &format!("{CONFIG_DIR}/..data"))).unwrap(),
        config_payload
    );
    assert_eq!(entries(&in_container(pid, CONFIG_DIR))[1..], ["..data", "nested"]);
    say(&format!("ConfigMap patched → item changed after {took:.1?}"));

    // The item's key removed from the ConfigMap, then the Secret deleted: the kubelet keeps
    // the last content of both (their volumes are not optional) and says why.
    config_maps
        .replace("refresh", &pp, &config_map(&[("unprojected", "x")]))
        .await
        .unwrap();
    secrets.delete("refresh", &DeleteParams::default()).await.unwrap();
    for (name, why) in [
        ("config", "ConfigMap refresh has no key a"),
        ("secret", "Secret refresh does not exist"),
    ] {
        runner
            .wait_for(
                &format!("volume {name} reports why it is not refreshed"),
                REFRESH,
                || async { (volume(&runner, name).failing.as_deref() == Some(why)).then_some(()) },
            )
            .await;
    }
    assert_eq!(read(&crt).as_deref(), Some("cert 3"));
    assert_eq!(read(&key).as_deref(), Some("key 3"));
    assert_eq!(read(&a).as_deref(), Some("two"));

    // Back again: refreshed again.
    secrets
        .create(&pp, &secret(&[("tls.crt", "cert 4"), ("tls.key", "key 4")]))
        .await
        .unwrap();
    wait_for_file(&runner, &crt, Some("cert 4")).await;
    assert_eq!(volume(&runner, "secret").failing, None);

    // The same process ran throughout, never restarted, and the runner saw no problem.
    assert_eq!(running_pid(&runner), Some(pid), "the process is still the first one");
    let pods = runner.pods();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].containers[0].restarts, 0, "{:?}", pods[0]);
    assert_eq!(runner.processes().len(), 1);
    runner.check().unwrap_or_else(|e| panic!("{e}\n{}", runner.report()));
    assert_eq!(volume(&runner, "secret").updates, 3);
}

/// Where the hostPath volume is mounted in the container.
const HOST_DIR: &str = "/run/kms";

/// [`statefulset`] with only its emptyDir and a hostPath volume of type `Directory` for
/// `path`, mounted read-only at [`HOST_DIR`] (as capn mounts a KMS plugin's socket directory).
fn host_path_statefulset(path: &Path) -> StatefulSet {
    let mut sts = serde_json::to_value(statefulset()).unwrap();
    let spec = &mut sts["spec"]["template"]["spec"];
    spec["volumes"] = json!([
        {"name": "data", "emptyDir": {}},
        {"name": "kms", "hostPath": {"path": path, "type": "Directory"}},
    ]);
    spec["containers"][0]["volumeMounts"] = json!([
        {"name": "data", "mountPath": "/var/lib/etcd"},
        {"name": "kms", "mountPath": HOST_DIR, "readOnly": true},
    ]);
    serde_json::from_value(sts).unwrap()
}

/// Runner adaptation 5's hostPath volumes: a `Directory` that does not exist keeps the pod
/// from starting, waiting with the kubelet's message; once made, it is bind-mounted read-only,
/// and what the host writes into it later (a plugin's socket) shows in the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_path_directory_is_mounted_read_only_once_it_exists() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let runner = Runner::start(&client, &ns, capn_binary())
        .await
        .unwrap_or_else(|e| panic!("the runner did not start: {e}"));
    let base = tempfile::tempdir().unwrap();
    let host = base.path().join("kms");
    Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &host_path_statefulset(&host))
        .await
        .unwrap();
    let why = format!("hostPath type check failed: {} is not a directory", host.display());
    let waiting = runner
        .wait_for("the pod waits for its hostPath directory", START, || async {
            let pod = runner.pods().into_iter().find(|p| p.name == POD)?;
            pod.waiting.filter(|w| w.contains(&why))
        })
        .await;
    say(&format!("a missing hostPath directory: {waiting}"));
    assert_eq!(running_pid(&runner), None, "no container starts");
    assert!(!host.exists(), "type Directory makes nothing");

    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("before"), "made before the start").unwrap();
    let made = Instant::now();
    let pid = runner
        .wait_for("the pod's process runs", START, || async { running_pid(&runner) })
        .await;
    say(&format!(
        "the directory made → the container started after {:.1?}",
        made.elapsed()
    ));
    assert_eq!(
        read(&in_container(pid, &format!("{HOST_DIR}/before"))).as_deref(),
        Some("made before the start")
    );
    assert_eq!(
        std::fs::metadata(in_container(pid, HOST_DIR)).unwrap().ino(),
        std::fs::metadata(&host).unwrap().ino(),
        "the container sees the host's directory through a bind mount"
    );
    // The host's later writes show inside; the container cannot write (readOnly).
    std::fs::write(host.join("after"), "made while it runs").unwrap();
    assert_eq!(
        read(&in_container(pid, &format!("{HOST_DIR}/after"))).as_deref(),
        Some("made while it runs")
    );
    let refused = std::fs::write(in_container(pid, &format!("{HOST_DIR}/written")), "x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    runner.check().unwrap_or_else(|e| panic!("{e}\n{}", runner.report()));

    drop(runner);
    assert!(
        host.join("before").exists() && host.join("after").exists(),
        "the runner leaves the host's directory as it was"
    );
}
