//! Issue 39 item 3 (a KMS v2 plugin encrypts a tenant's writes), on a booted control plane
//! with a real plugin: `capn-test-kms-plugin` (hack/test-kms-plugin, k8s.io/kms's gRPC server
//! with AES-GCM) listens on a socket in a fresh directory, which the runner mounts into the
//! apiserver pod as the rendered `hostPath` volume. A Secret is stored as
//! `k8s:enc:kms:v2:<name>:` in the tenant's etcd; without `kms` in the spec capn's key writes
//! again while the plugin still reads what it wrote; a key rotation then stores every Secret
//! under capn's new key and drops the plugin from the configuration, the status and the
//! apiserver's volumes. A probe lists every Secret through the tenant apiserver all along.
//! A plugin added to a running tenant reads before it writes (the second test).
//!
//! Durations and counts are printed, not asserted; what is asserted is behaviour.

use std::io::BufRead as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use capn::api::{NestedAPIServer, NestedControlPlane};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, etcd_member, say};
use crate::boot_certificates::{
    fresh_client, key_rotation_at, probe_path, request_key_rotation, stored_secrets, tenant,
};
use crate::boot_encryption::stored_value;
use crate::harness::{secret, secret_value};

/// The plugin's name in `spec.encryption.kms`, written into every value it encrypts.
const PLUGIN: &str = "test-kms";
/// How long the plugin may take to create its socket.
const PLUGIN_START: Duration = Duration::from_secs(30);

/// The path of `capn-test-kms-plugin` in the cache of `hack/kube-assets.sh`.
fn plugin_binary() -> PathBuf {
    capn_testkit::runner::fixture_binary(
        "kms-plugin",
        [
            include_bytes!("../../hack/test-kms-plugin/go.mod"),
            include_bytes!("../../hack/test-kms-plugin/go.sum"),
            include_bytes!("../../hack/test-kms-plugin/main.go"),
        ],
    )
}

/// A running `capn-test-kms-plugin` and its directory: `socket/` (the directory the
/// apiservers mount) and the plugin's log. Dropping it kills the plugin and removes the
/// directory.
struct Plugin {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

/// A fresh directory for a plugin under the system's temporary directory, which user 65532
/// (the apiserver's) can traverse. No step of the endpoint may start with `.` (capn's field
/// rules): not tempfile's default `.tmp` prefix.
fn plugin_directory() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("capn-kms-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The endpoint of the plugin [`Plugin::start_in`] `dir` serves, as `spec.encryption.kms`
/// names it: the socket in `dir/socket/`, the directory the apiservers mount.
fn endpoint_in(dir: &Path) -> String {
    format!("unix://{}", dir.join("socket/kms.sock").display())
}

impl Plugin {
    /// [`Plugin::start_in`] a fresh [`plugin_directory`].
    async fn start() -> Self {
        Self::start_in(plugin_directory()).await
    }

    /// Makes `dir/socket/`, starts the plugin on a socket there and waits for the socket to
    /// exist.
    ///
    /// # Panics
    /// When the binary is missing (with the command that builds it), or the plugin exits or
    /// makes no socket within [`PLUGIN_START`].
    async fn start_in(dir: tempfile::TempDir) -> Self {
        let binary = plugin_binary();
        assert!(
            binary.is_file(),
            "MISSING: {} (build it with `hack/kube-assets.sh test-kms-plugin`)",
            binary.display()
        );
        std::fs::create_dir(dir.path().join("socket")).unwrap();
        // The apiserver runs as 65532: it must reach the socket through the directory.
        std::fs::set_permissions(dir.path().join("socket"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = std::fs::File::create(dir.path().join("plugin.log")).unwrap();
        let mut command = std::process::Command::new(&binary);
        command
            .arg("--listen")
            .arg(dir.path().join("socket/kms.sock"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: prctl(2) only, between fork and exec: the plugin dies with this test
        // process should it be killed before the plugin is dropped.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        let mut plugin = Self { child, dir };
        let socket = plugin.socket();
        let started = capn_testkit::poll_until(PLUGIN_START, || {
            let exited = plugin.child.try_wait().ok().flatten();
            let made = socket.exists();
            async move { (made || exited.is_some()).then_some(exited) }
        })
        .await;
        match started {
            Some(None) => plugin,
            other => panic!(
                "the KMS plugin did not make {} ({other:?}); its log:\n{}",
                socket.display(),
                plugin.log()
            ),
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("socket/kms.sock")
    }

    /// The endpoint as `spec.encryption.kms` names it.
    fn endpoint(&self) -> String {
        endpoint_in(self.dir.path())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("plugin.log")).unwrap_or_default()
    }

    /// How many `call`s (`encrypt` or `decrypt`) the plugin has served so far: the count
    /// of its last `<call> count=<n>` line.
    fn calls(&self, call: &str) -> u64 {
        let prefix = format!("{call} count=");
        let file = std::fs::File::open(self.dir.path().join("plugin.log")).unwrap();
        std::io::BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| {
                let (_, rest) = line.split_once(&prefix)?;
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .max()
            .unwrap_or(0)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The TempDir removes the directory, socket and log included.
    }
}

/// `bytes`' beginning, for a message.
fn head(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned()
}

fn holds(stored: &[u8], text: &str) -> bool {
    stored.windows(text.len()).any(|w| w == text.as_bytes())
}

/// Creates Secret `name` in the tenant's `default` namespace holding `value`, with a fresh
/// client each try (a roll may have just replaced the apiserver pod).
async fn create_secret(booted: &Booted, name: &str, value: &str) {
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"value": value}})).unwrap();
    booted
        .runner
        .wait_for(&format!("Secret {name} is created"), BOOTED_STEP, || async {
            let secrets = Api::<Secret>::namespaced(fresh_client(booted).await?, "default");
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(status)) if status.code == 409 => Some(()),
                Err(_) => None,
            }
        })
        .await;
}

/// The value of Secret `name` as the tenant apiserver serves it.
async fn served(booted: &Booted, name: &str) -> Vec<u8> {
    let secrets = Api::<Secret>::namespaced(tenant(booted).await, "default");
    let secret = secrets.get(name).await.unwrap_or_else(|e| panic!("Secret {name}: {e}"));
    secret.data.unwrap_or_default()["value"].0.clone()
}

/// The digest of `<c>-encryption` the NestedAPIServer's status records.
async fn applied_digest(booted: &Booted) -> Option<String> {
    let apiservers = Api::<NestedAPIServer>::namespaced(booted.client.clone(), &booted.ns);
    apiservers
        .get("demo-apiserver")
        .await
        .ok()?
        .status?
        .certificates
        .map(|c| c.digest)
}

/// The names of the apiserver StatefulSet's volumes.
async fn apiserver_volumes(booted: &Booted) -> Option<Vec<String>> {
    let sets = Api::<StatefulSet>::namespaced(booted.client.clone(), &booted.ns);
    let sts = sets.get("demo-apiserver").await.ok()?;
    Some(
        sts.spec?
            .template
            .spec?
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kms_plugin_encrypts_a_booted_tenants_secrets_until_a_key_rotation_drops_it() {
    let plugin = Plugin::start().await;
    let docs = vec![json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
        "kind": "NestedControlPlane",
        "metadata": {"name": "demo"},
        "spec": {"version": "1.36", "encryption": {"kms": {"name": PLUGIN, "endpoint": plugin.endpoint()}}},
    })];
    let booted = boot_with("kms", Some(docs), StartCapn::InProcess).await;
    let ncps = Api::<NestedControlPlane>::namespaced(booted.client.clone(), &booted.ns);
    let encryption = ncps.get("demo").await.unwrap().status.unwrap().encryption.unwrap();
    assert_eq!(
        (encryption.provider.as_str(), encryption.key.as_str()),
        ("kms", PLUGIN),
        "a new control plane's plugin writes from the start"
    );
    let volumes = apiserver_volumes(&booted).await.unwrap();
    assert!(
        volumes.iter().any(|v| v.starts_with("kms-")),
        "the socket directory is a volume: {volumes:?}"
    );

    let done = AtomicBool::new(false);
    // Every Secret through the tenant apiserver: a list fails whole when one value cannot
    // be decrypted.
    let lists = |text: &str| text.contains("\"kind\":\"SecretList\"");
    let steps = async {
        let started = Instant::now();
        let marker = format!("kms-marker-{}", booted.ns);
        create_secret(&booted, "s1", &marker).await;
        let etcd = etcd_member(&booted, "demo-etcd-0").await;
        let s1 = stored_value(&etcd, "/registry/secrets/default/s1")
            .await
            .expect("s1 in etcd");
        let kms_prefix = format!("k8s:enc:kms:v2:{PLUGIN}:");
        assert!(s1.starts_with(kms_prefix.as_bytes()), "s1 stored as {:?}", head(&s1));
        assert!(!holds(&s1, &marker), "the plain text is not in etcd");
        let encrypts = plugin.calls("encrypt");
        assert!(encrypts >= 1, "the plugin encrypted: {}", plugin.log());
        assert_eq!(served(&booted, "s1").await, marker.as_bytes());
        say(&format!(
            "kms: s1 stored as {} bytes behind {kms_prefix:?}; the plugin served {encrypts} Encrypt and {} Decrypt calls",
            s1.len(),
            plugin.calls("decrypt")
        ));

        say("kms: dropped from the spec: capn's key writes, the plugin still reads");
        let before = applied_digest(&booted).await;
        // The apiserver that encrypted s1 holds its data key; a new one must ask the plugin.
        let decrypts = plugin.calls("decrypt");
        let dropped = Instant::now();
        ncps.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"encryption": {"kms": null}}})),
        )
        .await
        .unwrap();
        let reading = booted
            .runner
            .wait_for("capn's key writes again", BOOTED_STEP, || async {
                let encryption = ncps.get("demo").await.ok()?.status?.encryption?;
                (encryption.provider == "secretbox").then_some(encryption)
            })
            .await;
        assert_eq!(reading.key, "key1");
        assert_eq!(
            reading.kms.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            [PLUGIN],
            "the plugin stays as a reader"
        );
        // The apiserver rolls to the new configuration and its roll (surge included) ends.
        booted
            .runner
            .wait_for("the apiserver runs with the new configuration", BOOTED_STEP, || async {
                let digest = applied_digest(&booted).await?;
                (Some(&digest) != before.as_ref()).then_some(())
            })
            .await;
        booted.apiserver_settled().await;
        create_secret(&booted, "s2", &marker).await;
        let s2 = stored_value(&etcd, "/registry/secrets/default/s2")
            .await
            .expect("s2 in etcd");
        assert!(
            s2.starts_with(b"k8s:enc:secretbox:v1:key1:"),
            "s2 stored as {:?}",
            head(&s2)
        );
        assert_eq!(
            served(&booted, "s1").await,
            marker.as_bytes(),
            "the plugin still reads s1"
        );
        let s1 = stored_value(&etcd, "/registry/secrets/default/s1").await.unwrap();
        assert!(s1.starts_with(kms_prefix.as_bytes()), "s1 stays as it was stored");
        let decrypted = plugin.calls("decrypt");
        assert!(
            decrypted > decrypts,
            "the new apiserver read s1 through the plugin: {decrypts} Decrypt calls before the roll, {decrypted} after"
        );
        say(&format!(
            "kms: s2 stored under secretbox key1 {:.1?} after kms left the spec; s1 still read through the plugin ({decrypts} Decrypt calls before the roll, {decrypted} after)",
            dropped.elapsed(),
        ));

        say("kms: a key rotation stores everything under key2 and drops the plugin");
        let rotating = Instant::now();
        request_key_rotation(&booted, "1").await;
        let rotation = key_rotation_at(&booted, "1", "Completed").await;
        assert_eq!(rotation.key, "key2");
        // The plugin's volume goes once the status no longer lists it: one more roll.
        booted
            .runner
            .wait_for("the apiserver has no kms volume", BOOTED_STEP, || async {
                let volumes = apiserver_volumes(&booted).await?;
                (!volumes.iter().any(|v| v.starts_with("kms-"))).then_some(())
            })
            .await;
        booted.apiserver_settled().await;
        say(&format!(
            "kms: rotation completed and the apiserver settled in {:.1?}, {} objects written again",
            rotating.elapsed(),
            rotation.rewritten.unwrap_or_default()
        ));
        let stored = stored_secrets(&booted).await;
        assert!(stored.len() >= 2, "{} Secrets in etcd", stored.len());
        for value in &stored {
            assert!(
                value.starts_with(b"k8s:enc:secretbox:v1:key2:"),
                "every Secret is stored under key2: {:?}",
                head(value)
            );
        }
        let encryption = ncps.get("demo").await.unwrap().status.unwrap().encryption.unwrap();
        assert_eq!(
            (encryption.provider.as_str(), encryption.key.as_str()),
            ("secretbox", "key2")
        );
        assert!(encryption.kms.is_empty(), "status.encryption.kms: {:?}", encryption.kms);
        let config = secret_value(
            &secret(&booted.client, &booted.ns, "demo-encryption").await.unwrap(),
            "encryption-configuration.yaml",
        );
        let parsed: serde_json::Value = serde_saphyr::from_str(&config).unwrap();
        let providers = parsed["resources"][0]["providers"].as_array().unwrap();
        assert!(
            providers.iter().all(|p| p.get("kms").is_none()),
            "demo-encryption holds no kms provider: {providers:?}"
        );
        for name in ["s1", "s2"] {
            assert_eq!(
                served(&booted, name).await,
                marker.as_bytes(),
                "{name} after the rotation"
            );
        }
        say(&format!(
            "kms: {} Secrets stored under key2; the whole test after boot took {:.1?}",
            stored.len(),
            started.elapsed()
        ));
        done.store(true, Ordering::SeqCst);
    };
    let (availability, ()) = tokio::join!(probe_path(&booted, &done, "/api/v1/secrets", lists), steps);
    say(&format!(
        "kms: {} lists of every Secret through the tenant apiserver, {} failed (longest outage {:.1?}); the plugin served {} Encrypt and {} Decrypt calls",
        availability.probes,
        availability.failures,
        availability.longest_outage,
        plugin.calls("encrypt"),
        plugin.calls("decrypt")
    ));
    assert_eq!(availability.failures, 0, "{availability:?}");
    booted.stop().await;
    let dir: PathBuf = plugin.dir.path().to_owned();
    drop(plugin);
    assert!(!Path::new(&dir).exists(), "the plugin's directory is removed");
}

/// The other way in: a plugin added to a running tenant first only reads (every apiserver
/// gets it), then writes; a Secret written before stays under capn's key and is still served.
/// The plugin's directory is missing at first, as on a node without the plugin: the surge
/// apiserver waits with the kubelet's message while the old one keeps serving, and the roll
/// goes on once the plugin runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kms_plugin_added_to_a_running_tenant_reads_before_it_writes() {
    let dir = plugin_directory();
    let endpoint = endpoint_in(dir.path());
    let docs = vec![json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
        "kind": "NestedControlPlane",
        "metadata": {"name": "demo"},
        "spec": {"version": "1.36"},
    })];
    let booted = boot_with("kms added", Some(docs), StartCapn::InProcess).await;
    let ncps = Api::<NestedControlPlane>::namespaced(booted.client.clone(), &booted.ns);
    let done = AtomicBool::new(false);
    let lists = |text: &str| text.contains("\"kind\":\"SecretList\"");
    let steps = async {
        let marker = format!("kms-marker-{}", booted.ns);
        create_secret(&booted, "s0", &marker).await;
        let etcd = etcd_member(&booted, "demo-etcd-0").await;
        let s0 = stored_value(&etcd, "/registry/secrets/default/s0")
            .await
            .expect("s0 in etcd");
        assert!(
            s0.starts_with(b"k8s:enc:secretbox:v1:key1:"),
            "s0 stored as {:?}",
            head(&s0)
        );

        let added = Instant::now();
        ncps.patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"encryption": {"kms": {"name": PLUGIN, "endpoint": endpoint}}}})),
        )
        .await
        .unwrap();
        booted
            .runner
            .wait_for("the plugin is added as a reader", BOOTED_STEP, || async {
                let encryption = ncps.get("demo").await.ok()?.status?.encryption?;
                let listed = encryption.kms.iter().any(|k| k.name == PLUGIN);
                (encryption.provider == "secretbox" && listed).then_some(())
            })
            .await;
        // No plugin directory yet: the new apiserver pod waits as on a kubelet.
        let missing = dir.path().join("socket");
        let why = format!("hostPath type check failed: {} is not a directory", missing.display());
        let (pod, waiting) = booted
            .runner
            .wait_for(
                "an apiserver pod waits for the plugin's directory",
                BOOTED_STEP,
                || async {
                    let pods = booted.runner.pods();
                    let pod = pods
                        .into_iter()
                        .find(|p| p.waiting.as_deref().is_some_and(|w| w.contains(&why)))?;
                    Some((pod.name, pod.waiting.unwrap_or_default()))
                },
            )
            .await;
        say(&format!("kms added: {pod} waits: {waiting}"));
        // Meanwhile the apiserver that was there serves every Secret (and the probe goes on).
        for _ in 0..5 {
            let secrets = Api::<Secret>::namespaced(tenant(&booted).await, "default");
            let listed = secrets.list(&kube::api::ListParams::default()).await.unwrap();
            assert!(listed.items.iter().any(|s| s.metadata.name.as_deref() == Some("s0")));
        }
        let plugin = Plugin::start_in(dir).await;
        booted
            .runner
            .wait_for("the plugin writes", BOOTED_STEP * 2, || async {
                let encryption = ncps.get("demo").await.ok()?.status?.encryption?;
                (encryption.provider == "kms" && encryption.key == PLUGIN).then_some(())
            })
            .await;
        let writing = added.elapsed();
        booted.apiserver_settled().await;
        create_secret(&booted, "s1", &marker).await;
        let s1 = stored_value(&etcd, "/registry/secrets/default/s1")
            .await
            .expect("s1 in etcd");
        let kms_prefix = format!("k8s:enc:kms:v2:{PLUGIN}:");
        assert!(s1.starts_with(kms_prefix.as_bytes()), "s1 stored as {:?}", head(&s1));
        let s0 = stored_value(&etcd, "/registry/secrets/default/s0").await.unwrap();
        assert!(
            s0.starts_with(b"k8s:enc:secretbox:v1:key1:"),
            "s0 stays under capn's key until written again"
        );
        for name in ["s0", "s1"] {
            assert_eq!(served(&booted, name).await, marker.as_bytes(), "{name}");
        }
        say(&format!(
            "kms added: the plugin wrote {writing:.1?} after the spec named it (reader first; its directory missing until {pod} had waited); s1 stored behind {kms_prefix:?}, s0 still under key1; the plugin served {} Encrypt and {} Decrypt calls",
            plugin.calls("encrypt"),
            plugin.calls("decrypt")
        ));
        done.store(true, Ordering::SeqCst);
        plugin
    };
    let (availability, plugin) = tokio::join!(probe_path(&booted, &done, "/api/v1/secrets", lists), steps);
    say(&format!(
        "kms added: {} lists of every Secret, {} failed (longest outage {:.1?})",
        availability.probes, availability.failures, availability.longest_outage,
    ));
    assert_eq!(availability.failures, 0, "{availability:?}");
    booted.stop().await;
    drop(plugin);
}
