//! Issue 39 (encryption at rest, its first part), on a booted control plane: the tenant's
//! Secrets are stored encrypted in its etcd with the key capn generated, read back through
//! the apiserver as written, and the key is named in the status, never shown; a key
//! rotation schedule rotates it without a request. `spec.encryption.resources` adds
//! ConfigMaps: one written after is stored encrypted, one written before stays plain text
//! until the rotation's rewrite stage stores it under the new key.

use capn::api::{NestedAPIServer, NestedControlPlane};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, etcd_call, etcd_member, say};
use crate::boot_syncer::tenant_client;
use crate::harness::{secret, secret_value};

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

/// The value etcd holds under `key`, read with the apiserver's own etcd client certificate;
/// `None` when absent or etcd does not answer.
pub(crate) async fn stored_value(etcd: &kube::Client, key: &str) -> Option<Vec<u8>> {
    let range = etcd_call(etcd, "/v3/kv/range", json!({"key": b64(key.as_bytes())}))
        .await
        .ok()?;
    Some(unb64(range["kvs"][0]["value"].as_str()?))
}

fn config_map(name: &str, marker: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"value": marker}})).unwrap()
}

fn holds(stored: &[u8], text: &str) -> bool {
    stored.windows(text.len()).any(|w| w == text.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_secrets_are_encrypted_in_its_etcd_with_the_key_capn_keeps() {
    let booted = boot_with("encryption at rest", None, StartCapn::InProcess).await;
    let ncps = Api::<NestedControlPlane>::namespaced(booted.client.clone(), &booted.ns);
    let encryption = booted
        .runner
        .wait_for("the status names the encryption key", BOOTED_STEP, || async {
            ncps.get("demo").await.ok()?.status?.encryption
        })
        .await;
    assert_eq!(
        (encryption.provider.as_str(), encryption.key.as_str()),
        ("secretbox", "key1")
    );
    assert_eq!(encryption.resources, ["secrets"]);

    let marker = format!("plain-text-marker-{}", booted.ns);
    let tenant = tenant_client(&booted).await;
    let secrets = Api::<Secret>::namespaced(tenant.clone(), "default");
    let written: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s1"},
        "stringData": {"token": marker},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &written).await.unwrap();
    let read = secrets.get("s1").await.unwrap();
    assert_eq!(
        read.data.unwrap()["token"].0,
        marker.as_bytes(),
        "the apiserver decrypts it"
    );

    // The value as etcd holds it, read with the apiserver's own etcd client certificate.
    let etcd = etcd_member(&booted, "demo-etcd-0").await;
    let range = etcd_call(
        &etcd,
        "/v3/kv/range",
        json!({"key": b64(b"/registry/secrets/default/s1")}),
    )
    .await
    .unwrap();
    let stored = unb64(range["kvs"][0]["value"].as_str().expect("the Secret is in etcd"));
    let prefix = b"k8s:enc:secretbox:v1:key1:";
    assert!(
        stored.starts_with(prefix),
        "stored as {:?}",
        String::from_utf8_lossy(&stored[..stored.len().min(40)])
    );
    assert!(
        !stored.windows(marker.len()).any(|w| w == marker.as_bytes()),
        "the plain text is not in etcd"
    );
    say(&format!(
        "encryption at rest: the Secret is stored as {} bytes behind {:?}",
        stored.len(),
        String::from_utf8_lossy(prefix)
    ));

    say(
        "spec.encryption.resources adds configmaps: one written before stays plain text, one written after is encrypted",
    );
    let config_maps = Api::<ConfigMap>::namespaced(tenant.clone(), "default");
    config_maps
        .create(&PostParams::default(), &config_map("before", &marker))
        .await
        .unwrap();
    let apiservers = Api::<NestedAPIServer>::namespaced(booted.client.clone(), &booted.ns);
    let digest = |a: NestedAPIServer| a.status.and_then(|s| s.certificates).map(|c| c.digest);
    let applied = digest(apiservers.get("demo-apiserver").await.unwrap());
    let added = std::time::Instant::now();
    ncps.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"encryption": {"resources": ["secrets", "configmaps"]}}})),
    )
    .await
    .unwrap();
    booted
        .runner
        .wait_for("the status lists configmaps", BOOTED_STEP, || async {
            let resources = ncps.get("demo").await.ok()?.status?.encryption?.resources;
            (resources == ["secrets", "configmaps"]).then_some(())
        })
        .await;
    // The apiserver rolls to the new configuration (the digest of <c>-encryption on its pod
    // template changed) and is ready again on it.
    booted
        .runner
        .wait_for("the apiserver runs with the new configuration", BOOTED_STEP, || async {
            let apiserver = apiservers.get("demo-apiserver").await.ok()?;
            let generation = apiserver.metadata.generation;
            let status = apiserver.status.clone()?;
            let current = status.ready && status.observed_generation == generation;
            (current && digest(apiserver) != applied).then_some(())
        })
        .await;
    // A new client finds the new pod.
    let config_maps = Api::<ConfigMap>::namespaced(tenant_client(&booted).await, "default");
    config_maps
        .create(&PostParams::default(), &config_map("after", &marker))
        .await
        .unwrap();
    let after = stored_value(&etcd, "/registry/configmaps/default/after").await.unwrap();
    assert!(
        after.starts_with(prefix),
        "stored as {:?}",
        String::from_utf8_lossy(&after[..after.len().min(40)])
    );
    assert!(!holds(&after, &marker), "the plain text is not in etcd");
    let before = stored_value(&etcd, "/registry/configmaps/default/before")
        .await
        .unwrap();
    assert!(
        holds(&before, &marker),
        "a ConfigMap written before configmaps were added stays as stored until written again"
    );
    say(&format!(
        "configmaps encrypted {:.1} s after the spec named them (one apiserver roll)",
        added.elapsed().as_secs_f64()
    ));

    // The key is in <c>-encryption only: not in the status.
    let config = secret_value(
        &secret(&booted.client, &booted.ns, "demo-encryption").await.unwrap(),
        "encryption-configuration.yaml",
    );
    let parsed: serde_json::Value = serde_saphyr::from_str(&config).unwrap();
    let key = parsed["resources"][0]["providers"][0]["secretbox"]["keys"][0]["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let status = serde_json::to_string(&ncps.get("demo").await.unwrap().status).unwrap();
    assert!(!status.contains(&key), "the status holds the key");

    say("a key rotation schedule (every minute here) starts a rotation at its next run, without the annotation");
    ncps.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"encryption": {"keyRotationSchedule": "* * * * *"}}})),
    )
    .await
    .unwrap();
    let rotated = booted
        .runner
        .wait_for("a scheduled rotation completes", BOOTED_STEP * 3, || async {
            let encryption = ncps.get("demo").await.ok()?.status?.encryption?;
            let rotation = encryption.rotation?;
            (rotation.phase == "Completed").then_some((encryption.key, rotation))
        })
        .await;
    assert_eq!(rotated.0, "key2");
    let (run, started) = (
        rotated.1.scheduled.expect("the schedule's run is recorded"),
        rotated.1.start_time,
    );
    assert!(run.0 <= started.0, "started at or after its run");
    assert_eq!(rotated.1.request, "", "no annotation asked for it");
    // The rewrite stage wrote every ConfigMap too: the one stored plain is now under key2.
    let before = stored_value(&etcd, "/registry/configmaps/default/before")
        .await
        .unwrap();
    assert!(
        before.starts_with(b"k8s:enc:secretbox:v1:key2:") && !holds(&before, &marker),
        "after the rotation: {:?}",
        String::from_utf8_lossy(&before[..before.len().min(40)])
    );
    say(&format!(
        "the rotation's rewrite stage wrote {} objects of secrets and configmaps again",
        rotated.1.rewritten.unwrap_or_default()
    ));
    // Off again, so the test ends between rotations; the Secret reads back under key2.
    ncps.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"encryption": null}})),
    )
    .await
    .unwrap();
    // Each phase rolled the apiserver: a new client finds the new pod.
    let secrets = Api::<Secret>::namespaced(tenant_client(&booted).await, "default");
    assert_eq!(
        secrets.get("s1").await.unwrap().data.unwrap()["token"].0,
        marker.as_bytes()
    );
    booted.stop().await;
}
