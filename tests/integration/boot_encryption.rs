//! Issue 39 (encryption at rest, its first part), on a booted control plane: the tenant's
//! Secrets are stored encrypted in its etcd with the key capn generated, read back through
//! the apiserver as written, and the key is named in the status, never shown; a key
//! rotation schedule rotates it without a request.

use capn::api::NestedControlPlane;
use k8s_openapi::api::core::v1::Secret;
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
