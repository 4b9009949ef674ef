//! Projected sources that the kubelet fills from its own cluster, filled from the *tenant*:
//! ClusterTrustBundles (KEP-3257) and pod certificates (KEP-4317), both GA in 1.37. Booted on
//! Kubernetes 1.37.2, through capn's syncer and the test node.

use std::collections::BTreeSet;

use capn::syncer::names::ControlPlaneRef;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::boot::{BOOTED_STEP, Booted, StartCapn, boot_with, release_docs};
use crate::boot_syncer::{default_service_account, tenant_client};
use crate::harness::find_listed;

/// A one-replica tenant at Kubernetes 1.37.2 with the test node up, its client, and its
/// `default` namespace's pods (once pods can run there).
async fn boot_1_37(test: &str) -> (Booted, Client, Api<Pod>) {
    let booted = boot_with(test, Some(release_docs("1.37.2")), StartCapn::InProcess).await;
    let tenant = tenant_client(&booted).await;
    tokio::task::spawn_blocking(capn_testkit::node).await.unwrap();
    default_service_account(&booted, &tenant).await;
    let pods = Api::namespaced(tenant.clone(), "default");
    (booted, tenant, pods)
}

/// The parameters and key of a CA named `name`.
fn ca_params(name: &str) -> (rcgen::CertificateParams, rcgen::KeyPair) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    (params, rcgen::KeyPair::generate().unwrap())
}

/// A self-signed CA certificate (ClusterTrustBundles hold only CA certificates): its PEM and
/// its DER.
fn ca(name: &str) -> (String, Vec<u8>) {
    let (params, key) = ca_params(name);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), cert.der().to_vec())
}

fn bundles_api(tenant: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("certificates.k8s.io", "v1", "ClusterTrustBundle");
    Api::all_with(tenant.clone(), &ApiResource::from_gvk(&gvk))
}

/// Creates the ClusterTrustBundle `name` (of `signer`, with `labels`) holding `pem`.
async fn create_bundle(tenant: &Client, name: &str, signer: Option<&str>, labels: serde_json::Value, pem: &str) {
    let mut spec = json!({"trustBundle": pem});
    if let Some(signer) = signer {
        spec["signerName"] = json!(signer);
    }
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle",
        "metadata": {"name": name, "labels": labels}, "spec": spec,
    }))
    .unwrap();
    bundles_api(tenant)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("ClusterTrustBundle {name}: {e}"));
}

/// An agnhost pod that prints the file `file` of its projected volume of `sources`.
fn reader(name: &str, file: &str, sources: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "reader",
                "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
                "args": ["mounttest", format!("--file_content=/ctb/{file}")],
                "volumeMounts": [{"name": "ctb", "mountPath": "/ctb"}],
            }],
            "volumes": [{"name": "ctb", "projected": {"sources": sources}}],
        },
    }))
    .unwrap()
}

/// The certificates (DER) of the PEM blocks in `text`.
fn certificates(text: &str) -> BTreeSet<Vec<u8>> {
    pem::parse_many(text)
        .unwrap_or_default()
        .into_iter()
        .map(pem::Pem::into_contents)
        .collect()
}

/// Waits until the tenant pod `name` has succeeded, and returns its log.
async fn log_once_succeeded(booted: &Booted, pods: &Api<Pod>, name: &str) -> String {
    booted
        .runner
        .wait_for(&format!("the pod {name} succeeds"), BOOTED_STEP * 2, || async {
            let pod = pods.get(name).await.ok()?;
            (pod.status?.phase.as_deref() == Some("Succeeded")).then_some(())
        })
        .await;
    pods.logs(name, &Default::default()).await.unwrap()
}

/// Waits for an Event about the tenant pod `pod` in `default` with `reason` and a message
/// that contains `needle`.
async fn event_about(booted: &Booted, tenant: &Client, pod: &str, reason: &str, needle: &str) {
    let events: Api<Event> = Api::namespaced(tenant.clone(), "default");
    let what = format!("an Event {reason} about {pod} saying {needle:?}");
    booted
        .runner
        .wait_for(&what, BOOTED_STEP, || async {
            find_listed(&events, |e| {
                e.involved_object.name.as_deref() == Some(pod)
                    && e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.contains(needle))
            })
            .await
            .map(drop)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_pods_mount_the_tenants_cluster_trust_bundles() {
    let (booted, tenant, pods) = boot_1_37("syncer, trust bundles").await;
    let (a, a_der) = ca("signer one a");
    let (b, b_der) = ca("signer one b");
    let (dead, _) = ca("signer one, not alive");
    let (plain, plain_der) = ca("no signer");
    create_bundle(
        &tenant,
        "example.com:one:a",
        Some("example.com/one"),
        json!({"alive": "true"}),
        &a,
    )
    .await;
    // b's bundle holds a again: the file holds it once.
    let b_and_a = format!("{b}{a}");
    create_bundle(
        &tenant,
        "example.com:one:b",
        Some("example.com/one"),
        json!({"alive": "true"}),
        &b_and_a,
    )
    .await;
    create_bundle(
        &tenant,
        "example.com:one:dead",
        Some("example.com/one"),
        json!({"alive": "false"}),
        &dead,
    )
    .await;
    create_bundle(&tenant, "plain", None, json!({}), &plain).await;

    // By signer and labels: the distinct certificates of both live bundles, none of the
    // dead one's; by name: that bundle's.
    let by_signer = json!([{"clusterTrustBundle": {
        "signerName": "example.com/one", "labelSelector": {"matchLabels": {"alive": "true"}}, "path": "live.pem"}}]);
    pods.create(&PostParams::default(), &reader("by-signer", "live.pem", by_signer))
        .await
        .unwrap();
    let by_name = json!([
        {"clusterTrustBundle": {"name": "plain", "path": "plain.pem"}},
        {"clusterTrustBundle": {"name": "absent", "path": "absent.pem", "optional": true}},
    ]);
    pods.create(&PostParams::default(), &reader("by-name", "plain.pem", by_name))
        .await
        .unwrap();
    let log = log_once_succeeded(&booted, &pods, "by-signer").await;
    assert_eq!(certificates(&log), BTreeSet::from([a_der.clone(), b_der]), "{log}");
    assert_eq!(log.matches("BEGIN CERTIFICATE").count(), 2, "a is there once: {log}");
    let log = log_once_succeeded(&booted, &pods, "by-name").await;
    assert_eq!(certificates(&log), BTreeSet::from([plain_der]), "{log}");

    // The super side: each pod's bundles are in a ConfigMap of its own, owned by its super
    // pod; the tenant's bundles are nowhere else in the super cluster.
    let workload_namespace = ControlPlaneRef::new(&booted.ns, "demo").workload_namespace();
    let super_config_maps: Api<ConfigMap> = Api::namespaced(booted.client.clone(), &workload_namespace);
    let bundle_maps: Vec<ConfigMap> = super_config_maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.name_any().contains("-trust-bundles"))
        .collect();
    assert_eq!(
        bundle_maps.len(),
        2,
        "{:?}",
        bundle_maps.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    for map in &bundle_maps {
        let owner = &map.owner_references()[0];
        assert_eq!(owner.kind, "Pod", "{}", map.name_any());
    }
    // A changed bundle reaches the ConfigMap of the pod that projects it (the watch of the
    // tenant's bundles wakes it), as a kubelet refreshes a mounted bundle.
    let (replaced, replaced_der) = ca("no signer, replaced");
    let patch = kube::api::Patch::Merge(json!({"spec": {"trustBundle": replaced}}));
    bundles_api(&tenant)
        .patch("plain", &kube::api::PatchParams::default(), &patch)
        .await
        .unwrap();
    booted
        .runner
        .wait_for(
            "the changed bundle reaches its pod's ConfigMap",
            BOOTED_STEP,
            || async {
                let maps = super_config_maps.list(&ListParams::default()).await.ok()?;
                maps.items
                    .iter()
                    .filter(|c| c.name_any().contains("-trust-bundles"))
                    .flat_map(|c| c.data.iter().flatten())
                    .any(|(_, pem)| certificates(pem).contains(&replaced_der))
                    .then_some(())
            },
        )
        .await;

    // A bundle that does not exist yet keeps the pod from starting, as a kubelet would: it
    // waits, not ready, and hears why; once the bundle is made, it runs with it.
    let later = json!([{"clusterTrustBundle": {"name": "later", "path": "later.pem"}}]);
    pods.create(&PostParams::default(), &reader("waits", "later.pem", later))
        .await
        .unwrap();
    event_about(&booted, &tenant, "waits", "FailedMount", "\"later\" not found").await;
    booted
        .runner
        .wait_for("the waiting pod shows its container not ready", BOOTED_STEP, || async {
            let pod = pods.get("waits").await.ok()?;
            let status = pod.status?;
            let ready = status.conditions?.into_iter().find(|c| c.type_ == "Ready")?;
            (status.phase.as_deref() == Some("Pending")
                && ready.status == "False"
                && ready.reason.as_deref() == Some("ContainersNotReady")
                && ready.message.as_deref() == Some("containers with unready status: [reader]"))
            .then_some(())
        })
        .await;
    let (later_pem, later_der) = ca("later");
    create_bundle(&tenant, "later", None, json!({}), &later_pem).await;
    let log = log_once_succeeded(&booted, &pods, "waits").await;
    assert_eq!(certificates(&log), BTreeSet::from([later_der]), "{log}");

    // The ConfigMaps go with their pods.
    for name in ["by-signer", "by-name", "waits"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    booted
        .runner
        .wait_for(
            "the trust bundle ConfigMaps go with their pods",
            BOOTED_STEP * 2,
            || async {
                let maps = super_config_maps.list(&ListParams::default()).await.ok()?;
                (!maps.items.iter().any(|c| c.name_any().contains("-trust-bundles"))).then_some(())
            },
        )
        .await;
    booted.stop().await;
}

/// The test's signer `example.com/test` (the role of the e2e tests' hermetic signer): it
/// issues every request of its signer for the key the request proves, for the request's
/// longest lifetime (an hour when unset), naming the pod in a DNS SAN; it denies those
/// whose user annotations say `test.example.com/deny: "true"`. Runs until dropped.
async fn test_signer(tenant: Client, ca: (rcgen::CertificateParams, rcgen::KeyPair)) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let gvk = GroupVersionKind::gvk("certificates.k8s.io", "v1", "PodCertificateRequest");
    let resource = ApiResource::from_gvk(&gvk);
    let all = Api::<DynamicObject>::all_with(tenant.clone(), &resource);
    let issuer = rcgen::Issuer::new(ca.0, ca.1);
    let mut requests = watcher(all, watcher::Config::default()).applied_objects().boxed();
    while let Some(request) = requests.next().await {
        let Ok(request) = request else { continue };
        let spec = &request.data["spec"];
        let answered = request.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        if answered || spec["signerName"] != "example.com/test" {
            continue;
        }
        let namespace = request.namespace().unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now();
        let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap();
        let status = if spec["unverifiedUserAnnotations"]["test.example.com/deny"] == "true" {
            json!({"conditions": [{"type": "Denied", "status": "True", "reason": "TestDenied",
                "message": "the test signer denies it", "lastTransitionTime": now.to_string()}]})
        } else {
            use base64::Engine as _;
            let proof = base64::engine::general_purpose::STANDARD
                .decode(spec["stubPKCS10Request"].as_str().unwrap_or_default())
                .unwrap();
            let mut csr = rcgen::CertificateSigningRequestParams::from_der(&proof.into()).unwrap();
            let lifetime = spec["maxExpirationSeconds"].as_i64().unwrap_or(3600);
            let not_after = now + k8s_openapi::jiff::SignedDuration::from_secs(lifetime);
            let to_time =
                |t: k8s_openapi::jiff::Timestamp| time::OffsetDateTime::from_unix_timestamp(t.as_second()).unwrap();
            csr.params.not_before = to_time(now);
            csr.params.not_after = to_time(not_after);
            let pod = spec["podName"].as_str().unwrap_or_default();
            csr.params.subject_alt_names = vec![rcgen::SanType::DnsName(
                format!("{pod}.{namespace}.pod").try_into().unwrap(),
            )];
            let leaf = csr.signed_by(&issuer).unwrap();
            let refresh = now + k8s_openapi::jiff::SignedDuration::from_secs(lifetime / 2);
            json!({"conditions": [{"type": "Issued", "status": "True", "reason": "Issued",
                    "message": "issued by the test signer", "lastTransitionTime": now.to_string()}],
                "certificateChain": leaf.pem(), "notBefore": now.to_string(),
                "beginRefreshAt": refresh.to_string(), "notAfter": not_after.to_string()})
        };
        let api = Api::<DynamicObject>::namespaced_with(tenant.clone(), &namespace, &resource);
        let patch = kube::api::Patch::Merge(json!({"status": status}));
        if let Err(e) = api
            .patch_status(&request.name_any(), &kube::api::PatchParams::default(), &patch)
            .await
        {
            crate::boot::say(&format!("the test signer could not answer {}: {e}", request.name_any()));
        }
    }
}

/// A pod that prints the credential bundle of a `podCertificate` source with `extra`
/// fields.
fn certificate_reader(name: &str, extra: serde_json::Value) -> Pod {
    let mut source = json!({"signerName": "example.com/test", "keyType": "ECDSAP256",
        "credentialBundlePath": "bundle.pem", "keyPath": "key.pem", "certificateChainPath": "chain.pem"});
    json_patch::merge(&mut source, &extra);
    reader(name, "bundle.pem", json!([{"podCertificate": source}]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_pods_get_certificates_from_the_tenants_signers() {
    let (booted, tenant, pods) = boot_1_37("syncer, pod certificates").await;
    let (params, key) = ca_params("test signer");
    let ca_der = params.self_signed(&key).unwrap().der().to_vec();
    let signer = tokio::spawn(test_signer(tenant.clone(), (params, key)));

    // The pod's bundle: its key, then the chain the tenant's signer issued for that key,
    // naming the pod.
    pods.create(
        &PostParams::default(),
        &certificate_reader("holder", json!({"maxExpirationSeconds": 3600})),
    )
    .await
    .unwrap();
    let log = log_once_succeeded(&booted, &pods, "holder").await;
    let blocks = pem::parse_many(&log[log.find("-----BEGIN").expect(&log)..]).unwrap();
    let tags: Vec<_> = blocks.iter().map(pem::Pem::tag).collect();
    assert_eq!(tags, ["PRIVATE KEY", "CERTIFICATE"], "{log}");
    use rcgen::PublicKeyData as _;
    let key = rcgen::KeyPair::try_from(blocks[0].contents()).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(blocks[1].contents()).unwrap();
    assert_eq!(
        leaf.public_key().raw,
        key.subject_public_key_info(),
        "the chain is for the pod's key"
    );
    let (_, issuer) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
    leaf.verify_signature(Some(issuer.public_key()))
        .expect("signed by the tenant's signer");
    let lifetime = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
    assert_eq!(lifetime, 3600, "the lifetime asked for");
    let sans = format!(
        "{:?}",
        leaf.subject_alternative_name().unwrap().unwrap().value.general_names
    );
    assert!(sans.contains("holder.default.pod"), "{sans}");

    // In the super cluster: a Secret owned by the super pod; no request.
    let workload_namespace = ControlPlaneRef::new(&booted.ns, "demo").workload_namespace();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(booted.client.clone(), &workload_namespace);
    let secret = secrets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.name_any().contains("-pod-certificates"))
        .expect("the pod's certificate Secret");
    assert_eq!(secret.owner_references()[0].kind, "Pod");
    let keys: Vec<_> = secret.data.unwrap_or_default().into_keys().collect();
    assert_eq!(
        keys,
        ["ctb.0.certificate-chain", "ctb.0.credential-bundle", "ctb.0.key"],
        "one item per path, under the volume and source"
    );

    // A request the signer denies: the pod waits, and hears why, as from a kubelet.
    pods.create(
        &PostParams::default(),
        &certificate_reader("refused", json!({"userAnnotations": {"test.example.com/deny": "true"}})),
    )
    .await
    .unwrap();
    event_about(&booted, &tenant, "refused", "Denied", "TestDenied").await;
    let phase = pods.get("refused").await.unwrap().status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Pending"));

    // A key type the syncer cannot generate is refused at the door, naming the field.
    pods.create(
        &PostParams::default(),
        &certificate_reader("rsa", json!({"keyType": "RSA3072"})),
    )
    .await
    .unwrap();
    let refused = crate::boot_syncer::refusal(&booted, &pods, "rsa").await;
    assert!(
        refused
            .message
            .as_deref()
            .is_some_and(|m| m.contains("podCertificate.keyType") && m.contains("ECDSAP256")),
        "{refused:?}"
    );
    signer.abort();
    booted.stop().await;
}
