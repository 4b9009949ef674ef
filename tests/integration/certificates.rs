//! Issue "Certificates that reach the running processes": on the real super cluster with the
//! StatefulSet stand-in — a re-issued Secret rolls exactly the components that read it at
//! start, a deleted CA is reported at once and nothing is invented, short validities renew,
//! and a requested CA rotation walks every phase. The booted proofs are in `boot.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use capn::controllers::Settings;
use capn::controllers::control_plane::rotation::ROTATE_ANNOTATION;
use capn::plan::CERTIFICATES_DIGEST_ANNOTATION;
use capn_testkit::{cluster, mark_statefulset_ready, test_namespace, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};

use crate::harness::*;

/// The certificates digest on each StatefulSet's pod template.
async fn digests(client: &Client, ns: &str) -> BTreeMap<String, String> {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let digest = s
                .spec
                .as_ref()
                .and_then(|spec| spec.template.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(CERTIFICATES_DIGEST_ANNOTATION).cloned())
                .unwrap_or_default();
            (s.name_any(), digest)
        })
        .collect()
}

/// Stands in for the StatefulSet controller and kubelet for as long as it lives: whenever a
/// StatefulSet's template changes (a roll), its pods are "rolled" and ready again.
struct RollingStandIn(Arc<AtomicBool>, tokio::task::JoinHandle<()>);

impl RollingStandIn {
    fn start(client: &Client, ns: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (client, ns, flag) = (client.clone(), ns.to_string(), stop.clone());
        let task = tokio::spawn(async move {
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
            while !flag.load(Ordering::SeqCst) {
                for sts in api
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    let observed = sts.status.as_ref().and_then(|s| s.observed_generation);
                    if observed != sts.metadata.generation {
                        let _ = mark_statefulset_ready(&client, &ns, &sts.name_any()).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self(stop, task)
    }

    async fn stop(self) {
        self.0.store(true, Ordering::SeqCst);
        let _ = self.1.await;
    }
}

async fn ready_demo(client: &Client, ns: &str) {
    wait_until("the NestedControlPlane is ready", CONTROLLER_STEP, || async {
        control_plane(client, ns, "demo")
            .await
            .status
            .filter(|s| s.ready)
            .map(|_| ())
    })
    .await;
}

/// A test namespace with capn and the rolling stand-in running, and the example control
/// plane in it ready.
async fn rolling_demo(client: &Client) -> (String, Capn, RollingStandIn) {
    let ns = test_namespace(client).await;
    let capn = Capn::start(client, &ns);
    let stand_in = RollingStandIn::start(client, &ns);
    apply_example(client, &ns, "examples/nestedcontrolplane.yaml").await;
    ready_demo(client, &ns).await;
    (ns, capn, stand_in)
}

#[tokio::test]
async fn a_reissued_secret_rolls_exactly_the_components_that_read_it_at_start() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let capn = Capn::start(&client, &ns);
    apply_example(&client, &ns, "examples/nestedcontrolplane.yaml").await;
    bring_up(&client, &ns, "demo").await;
    let before = digests(&client, &ns).await;
    assert_eq!(before.len(), 3);
    for (name, digest) in &before {
        assert_eq!(digest.len(), 32, "{name} carries a digest, not the placeholder");
    }
    let fingerprints = secret_fingerprints(&client, &ns).await;

    // kube-apiserver reads its etcd client certificate only at start.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .delete("demo-apiserver-etcd-client", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the apiserver's pod template changes", CONTROLLER_STEP, || async {
        let now = digests(&client, &ns).await;
        (now["demo-apiserver"] != before["demo-apiserver"]).then_some(now)
    })
    .await;
    let reissued = secret_fingerprints(&client, &ns).await;
    assert_ne!(
        reissued["demo-apiserver-etcd-client"], fingerprints["demo-apiserver-etcd-client"],
        "re-issued from the etcd CA"
    );
    let after = digests(&client, &ns).await;
    assert_eq!(after["demo-etcd"], before["demo-etcd"], "etcd does not mount it");
    assert_eq!(
        after["demo-controller-manager"], before["demo-controller-manager"],
        "the controller-manager does not mount it"
    );
    // The status is written after the apply: wait for it to name the digest applied.
    let apiservers = Api::<capn::api::NestedAPIServer>::namespaced(client.clone(), &ns);
    let applied = wait_until("the status names the applied digest", CONTROLLER_STEP, || async {
        apiservers
            .get("demo-apiserver")
            .await
            .ok()?
            .status?
            .certificates
            .filter(|c| c.digest == after["demo-apiserver"])
    })
    .await;
    assert!(applied.secrets.contains(&"demo-apiserver-etcd-client".to_string()));
    assert!(
        !applied.secrets.contains(&"demo-apiserver".to_string()),
        "the serving certificate is reloaded by the apiserver: the channel says so"
    );

    // The serving certificate is reloaded by kube-apiserver itself: re-issued, no roll.
    make_ready(&client, &ns, "demo-apiserver").await;
    ready_demo(&client, &ns).await;
    let before = digests(&client, &ns).await;
    let serving = secret_fingerprints(&client, &ns).await["demo-apiserver"].clone();
    secrets
        .delete("demo-apiserver", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the serving certificate is re-issued", CONTROLLER_STEP, || async {
        secret_fingerprints(&client, &ns)
            .await
            .get("demo-apiserver")
            .filter(|f| **f != serving)
            .map(|_| ())
    })
    .await;
    assert_eq!(digests(&client, &ns).await, before, "nothing rolls");
    capn.stop().await;
}

#[tokio::test]
async fn a_deleted_ca_is_reported_at_once_changes_nothing_and_its_restore_reissues_nothing() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let capn = Capn::start(&client, &ns);
    apply_example(&client, &ns, "examples/nestedcontrolplane.yaml").await;
    bring_up(&client, &ns, "demo").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let ca = secrets.get("demo-ca").await.unwrap();
    let fingerprints = secret_fingerprints(&client, &ns).await;
    let workloads = statefulset_versions(&client, &ns).await;

    secrets.delete("demo-ca", &DeleteParams::default()).await.unwrap();
    // Within the step bound (seconds), not at the hourly re-check.
    let condition = wait_until("CertificatesAvailable turns False", CONTROLLER_STEP, || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "CertificatesAvailable" && c.status == "False")
    })
    .await;
    assert_eq!(condition.reason, "CertificateAuthorityMissing");
    assert!(
        condition.message.contains("restoring the Secret from a backup")
            && condition.message.contains(ROTATE_ANNOTATION),
        "the message says how to recover: {}",
        condition.message
    );
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    wait_until("a Warning Event says so", CONTROLLER_STEP, || async {
        find_listed(&events, |e| e.reason.as_deref() == Some("CertificateAuthorityMissing"))
            .await
            .map(|_| ())
    })
    .await;
    // Nothing is invented or changed while it is missing: the components are woken by the
    // deletion too, and must leave everything as it is.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(secrets.get_opt("demo-ca").await.unwrap().is_none(), "no CA was minted");
    let mut now = secret_fingerprints(&client, &ns).await;
    now.remove("demo-ca");
    let mut expected = fingerprints.clone();
    expected.remove("demo-ca");
    assert_eq!(now, expected, "no certificate was re-issued");
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        workloads,
        "no workload was touched"
    );

    // Restoring the Secret from a backup converges with no re-issue.
    let mut restored = ca.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: Some("demo-ca".into()),
        labels: ca.metadata.labels.clone(),
        ..Default::default()
    };
    secrets.create(&PostParams::default(), &restored).await.unwrap();
    wait_until("CertificatesAvailable turns True again", CONTROLLER_STEP, || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "CertificatesAvailable" && c.status == "True")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        secret_fingerprints(&client, &ns).await,
        fingerprints,
        "nothing re-issued"
    );
    assert_eq!(moved_statefulsets(&client, &ns, &workloads).await, Vec::<String>::new());
    capn.stop().await;
}

/// The encryption-at-rest key, once recorded, is never made again: deleting it stops the
/// pass with `EncryptionKeyMissing` and leaves every Secret and workload as it is; restoring
/// it converges.
#[tokio::test]
async fn a_deleted_encryption_key_is_reported_and_never_replaced() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let capn = Capn::start(&client, &ns);
    apply_example(&client, &ns, "examples/nestedcontrolplane.yaml").await;
    bring_up(&client, &ns, "demo").await;
    let recorded = wait_until("the status records the key", CONTROLLER_STEP, || async {
        control_plane(&client, &ns, "demo").await.status?.encryption
    })
    .await;
    assert_eq!(recorded.key, "key1");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let key = secrets.get("demo-encryption").await.unwrap();
    let workloads = statefulset_versions(&client, &ns).await;

    secrets
        .delete("demo-encryption", &DeleteParams::default())
        .await
        .unwrap();
    let condition = wait_until("CertificatesAvailable turns False", CONTROLLER_STEP, || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "CertificatesAvailable" && c.status == "False")
    })
    .await;
    assert_eq!(condition.reason, "EncryptionKeyMissing");
    assert!(
        condition.message.contains("will not make a new one"),
        "{}",
        condition.message
    );
    assert!(
        secrets.get_opt("demo-encryption").await.unwrap().is_none(),
        "no key was made"
    );
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        workloads,
        "no workload was touched"
    );

    let mut restored = key.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: Some("demo-encryption".into()),
        labels: key.metadata.labels.clone(),
        ..Default::default()
    };
    secrets.create(&PostParams::default(), &restored).await.unwrap();
    wait_until("CertificatesAvailable turns True again", CONTROLLER_STEP, || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "CertificatesAvailable" && c.status == "True")
    })
    .await;
    assert_eq!(
        secrets.get("demo-encryption").await.unwrap().data,
        key.data,
        "the key is the one restored"
    );
    capn.stop().await;
}

/// The StatefulSets whose resourceVersion moved since `before`.
async fn moved_statefulsets(client: &Client, ns: &str, before: &[(String, Option<String>)]) -> Vec<String> {
    let now = statefulset_versions(client, ns).await;
    now.iter()
        .zip(before)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.0.clone())
        .collect()
}

#[tokio::test]
async fn short_validity_renews_every_leaf_and_status_names_the_next_renewal() {
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let mut settings = Settings {
        namespace: Some(ns.clone()),
        certificate_validity: Some(Duration::from_secs(30)),
        ..Settings::default()
    };
    settings.enabled.public_crds = false;
    settings.enabled.syncer = false;
    let capn = Capn::start_with_settings(&client, settings, &[]);
    let stand_in = RollingStandIn::start(&client, &ns);
    apply_example(&client, &ns, "examples/nestedcontrolplane.yaml").await;
    ready_demo(&client, &ns).await;
    let status = control_plane(&client, &ns, "demo").await.status.unwrap();
    let renewal = status.next_certificate_renewal.expect("the next renewal is named");
    let expiry = status.certificates_expiry_date.expect("the earliest expiry is named");
    let now = k8s_openapi::jiff::Timestamp::now();
    let in_secs = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| (t.0 - now).get_seconds();
    assert!(
        in_secs(&renewal.time) <= 21,
        "renewed at two thirds of 30 s: {renewal:?}"
    );
    assert!(in_secs(&expiry) <= 31, "leaves expire within 30 s: {expiry:?}");
    let first = secret_fingerprints(&client, &ns).await;
    let digests_first = digests(&client, &ns).await;
    // Every leaf and kubeconfig is renewed, CAs are not.
    let renewed = wait_until("every leaf is renewed", Duration::from_secs(60), || async {
        let now = secret_fingerprints(&client, &ns).await;
        let leaves = now
            .keys()
            .filter(|k| !["demo-ca", "demo-etcd", "demo-proxy", "demo-sa"].contains(&k.as_str()));
        leaves.clone().all(|k| now[k] != first[k]).then_some(now)
    })
    .await;
    for ca in ["demo-ca", "demo-etcd", "demo-proxy", "demo-sa"] {
        assert_eq!(renewed[ca], first[ca], "{ca} is not renewed");
    }
    // A StatefulSet is applied with the new digest after its Secrets were renewed: on a
    // loaded machine the test can look in between (seen once in a full run).
    let digests_now = wait_until(
        "the apiserver (etcd client renewed) and controller-manager (kubeconfig renewed) roll",
        CONTROLLER_STEP,
        || async {
            let now = digests(&client, &ns).await;
            let rolled = |c: &str| now[c] != digests_first[c];
            (rolled("demo-apiserver") && rolled("demo-controller-manager")).then_some(now)
        },
    )
    .await;
    assert_eq!(
        digests_now["demo-etcd"], digests_first["demo-etcd"],
        "etcd reloads its own certificate"
    );
    ready_demo(&client, &ns).await;
    stand_in.stop().await;
    capn.stop().await;
}

#[tokio::test]
async fn a_requested_ca_rotation_walks_every_phase_and_ends_with_only_the_new_ca() {
    let client = cluster().client();
    let (ns, capn, stand_in) = rolling_demo(&client).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let old_ca = secret_value(&secrets.get("demo-ca").await.unwrap(), "tls.crt");
    request_rotation(&client, &ns, "demo", "ca").await;
    let rotation = wait_until("the rotation completes", Duration::from_secs(120), || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .certificate_authority_rotation
            .filter(|r| r.phase == "Completed")
    })
    .await;
    assert_eq!(
        rotation.phases.iter().map(|p| p.phase.as_str()).collect::<Vec<_>>(),
        ["NewAuthority", "TrustBoth", "SignWithNew", "DropOld"]
    );
    let new_ca = secret_value(&secrets.get("demo-ca").await.unwrap(), "tls.crt");
    assert_ne!(new_ca, old_ca);
    assert_eq!(
        new_ca.matches("BEGIN CERTIFICATE").count(),
        1,
        "only the new CA is trusted"
    );
    assert!(
        secrets.get_opt("demo-ca-next").await.unwrap().is_none(),
        "the staging Secret is gone"
    );
    let new_der = pem_to_der(&new_ca);
    for leaf in ["demo-apiserver", "demo-apiserver-kubelet-client"] {
        let der = pem_to_der(&secret_value(&secrets.get(leaf).await.unwrap(), "tls.crt"));
        assert!(signed_by(&der, &new_der), "{leaf} is signed by the new CA");
    }
    for kubeconfig in ["demo-kubeconfig", "demo-controller-manager-kubeconfig"] {
        let text = secret_value(&secrets.get(kubeconfig).await.unwrap(), "value");
        let value: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        let decode = |p: &str| {
            use base64::Engine;
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(value.pointer(p).and_then(|v| v.as_str()).unwrap())
                    .unwrap(),
            )
            .unwrap()
        };
        assert_eq!(
            decode("/clusters/0/cluster/certificate-authority-data"),
            new_ca,
            "{kubeconfig}"
        );
        let client_der = pem_to_der(&decode("/users/0/user/client-certificate-data"));
        assert!(
            signed_by(&client_der, &new_der),
            "{kubeconfig}'s client is signed by the new CA"
        );
    }
    let signer = secret_value(
        &secrets.get("demo-controller-manager-kubeconfig").await.unwrap(),
        "ca-signing.crt",
    );
    assert_eq!(signer, new_ca, "the controller-manager signs CSRs with the new CA");
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    for phase in ["TrustBoth", "SignWithNew", "DropOld", "Completed"] {
        assert!(reasons.iter().any(|r| r == phase), "an Event for {phase}: {reasons:?}");
    }
    // The same request again does nothing; an unknown authority is refused with a condition.
    request_rotation(&client, &ns, "demo", "kubelet").await;
    let refused = wait_until("an unknown authority is refused", CONTROLLER_STEP, || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "CertificateAuthorityRotation" && c.reason == "InvalidRotationRequest")
    })
    .await;
    assert!(
        refused.message.contains("ca, etcd, front-proxy, sa"),
        "{}",
        refused.message
    );
    stand_in.stop().await;
    capn.stop().await;
}

/// Requests a rotation of `authority` and waits for `phase` (or completion).
async fn rotate_until(
    client: &Client,
    ns: &str,
    request: &str,
    phase: &str,
) -> capn::api::CertificateAuthorityRotation {
    request_rotation(client, ns, "demo", request).await;
    wait_until(
        &format!("the rotation reaches {phase}"),
        Duration::from_secs(120),
        || async {
            control_plane(client, ns, "demo")
                .await
                .status?
                .certificate_authority_rotation
                .filter(|r| r.request == request && (r.phase == phase || r.phase == "Completed"))
                .map(|r| *r)
        },
    )
    .await
}

#[tokio::test]
async fn every_authority_rotates_and_an_interrupted_rotation_resumes() {
    let client = cluster().client();
    let (ns, mut capn, stand_in) = rolling_demo(&client).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    for (request, secret, block) in [
        ("etcd", "demo-etcd", "CERTIFICATE"),
        ("front-proxy", "demo-proxy", "CERTIFICATE"),
        ("sa", "demo-sa", "PUBLIC KEY"),
    ] {
        let old = secret_value(&secrets.get(secret).await.unwrap(), "tls.crt");
        // capn stops in the middle of the rotation (after trusting both), and a new one
        // takes over from what the status and the Secrets say.
        let midway = rotate_until(&client, &ns, request, "SignWithNew").await;
        capn.stop().await;
        let trusted = secret_value(&secrets.get(secret).await.unwrap(), "tls.crt");
        if midway.phase != "Completed" {
            assert_eq!(
                trusted.matches(&format!("BEGIN {block}")).count(),
                2,
                "{request}: old and new are trusted together mid-rotation"
            );
        }
        capn = Capn::start(&client, &ns);
        let done = rotate_until(&client, &ns, request, "Completed").await;
        assert_eq!(
            done.phases.iter().map(|p| p.phase.as_str()).collect::<Vec<_>>(),
            ["NewAuthority", "TrustBoth", "SignWithNew", "DropOld"],
            "{request}"
        );
        let new = secret_value(&secrets.get(secret).await.unwrap(), "tls.crt");
        assert_ne!(new, old, "{request}");
        assert_eq!(
            new.matches(&format!("BEGIN {block}")).count(),
            1,
            "{request}: only the new one"
        );
        assert!(secrets.get_opt(&format!("{secret}-next")).await.unwrap().is_none());
        ready_demo(&client, &ns).await;
    }
    // Leaves follow their new CAs.
    let etcd_ca = pem_to_der(&secret_value(&secrets.get("demo-etcd").await.unwrap(), "tls.crt"));
    for leaf in ["demo-etcd-server", "demo-apiserver-etcd-client"] {
        let der = pem_to_der(&secret_value(&secrets.get(leaf).await.unwrap(), "tls.crt"));
        assert!(signed_by(&der, &etcd_ca), "{leaf} is signed by the new etcd CA");
    }
    let proxy_ca = pem_to_der(&secret_value(&secrets.get("demo-proxy").await.unwrap(), "tls.crt"));
    let proxy = pem_to_der(&secret_value(
        &secrets.get("demo-front-proxy-client").await.unwrap(),
        "tls.crt",
    ));
    assert!(signed_by(&proxy, &proxy_ca), "the front-proxy client follows its CA");
    stand_in.stop().await;
    capn.stop().await;
}

/// The KMS providers in the configuration `secret` (`demo-encryption`) holds, as (writer,
/// readers) names.
fn kms_layout(secret: &Secret) -> (Option<String>, Vec<String>) {
    let config = secret_value(secret, "encryption-configuration.yaml");
    let kms = capn::pki::encryption::kms_providers(&config).unwrap();
    (
        kms.writer.map(|w| w.name),
        kms.readers.into_iter().map(|r| r.name).collect(),
    )
}

/// Issue 39 item 3's KMS v2 plugin on a running control plane: the plugin is added as a
/// reader, made the writer only once every apiserver runs with it (the stand-in's readiness),
/// its socket directory mounted into the apiservers; dropped from the spec it stops writing at
/// once and keeps reading. (The plugin itself is not run here: nothing dials the socket.)
#[tokio::test]
async fn a_kms_plugin_reads_before_it_writes_and_keeps_reading_once_dropped() {
    let client = cluster().client();
    let (ns, capn, stand_in) = rolling_demo(&client).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    // Every configuration the Secret holds from here on, in order, as its watch delivers
    // them (every version, however short-lived: a poll could miss a stage).
    let (sent, mut layouts) = tokio::sync::mpsc::unbounded_channel();
    let watch = tokio::spawn({
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;
        let config = kube::runtime::watcher::Config::default().fields("metadata.name=demo-encryption");
        let events = kube::runtime::watcher(secrets.clone(), config).applied_objects();
        async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                if let Ok(secret) = event
                    && sent.send(kms_layout(&secret)).is_err()
                {
                    break;
                }
            }
        }
    });
    // The watch holds the configuration before the plugin is named (no stage is missed).
    let first = tokio::time::timeout(CONTROLLER_STEP, layouts.recv()).await.unwrap();
    assert_eq!(first, Some((None, vec![])));
    let ncps = Api::<capn::api::NestedControlPlane>::namespaced(client.clone(), &ns);
    let set_kms = |kms: serde_json::Value| {
        let ncps = ncps.clone();
        async move {
            ncps.patch(
                "demo",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"encryption": {"kms": kms}}})),
            )
            .await
            .unwrap();
        }
    };
    set_kms(serde_json::json!({"name": "vault", "endpoint": "unix:///var/run/kmsplugin/socket.sock"})).await;
    let encryption = wait_until("the plugin writes", Duration::from_secs(180), || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .encryption
            .filter(|e| e.provider == "kms")
    })
    .await;
    assert_eq!(encryption.key, "vault");
    assert_eq!(
        encryption.kms.iter().map(|k| k.endpoint.as_str()).collect::<Vec<_>>(),
        ["unix:///var/run/kmsplugin/socket.sock"]
    );
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .get("demo-apiserver")
        .await
        .unwrap();
    let pod = sts.spec.unwrap().template.spec.unwrap();
    let volume = pod.volumes.unwrap_or_default().into_iter().find(|v| v.name == "kms-0");
    let host_path = volume.and_then(|v| v.host_path).expect("a kms-0 hostPath volume");
    assert_eq!(
        (host_path.path.as_str(), host_path.type_.as_deref()),
        ("/var/run/kmsplugin", Some("Directory"))
    );
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "kms-0")
        .cloned()
        .expect("the apiserver mounts kms-0");
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/var/run/kmsplugin", Some(true))
    );

    // Dropped: capn's key writes again, the plugin reads on.
    set_kms(serde_json::Value::Null).await;
    let encryption = wait_until("capn's key writes again", Duration::from_secs(180), || async {
        control_plane(&client, &ns, "demo")
            .await
            .status?
            .encryption
            .filter(|e| e.provider == "secretbox")
    })
    .await;
    assert_eq!(encryption.key, "key1");
    assert_eq!(encryption.kms.len(), 1, "the plugin still reads: {encryption:?}");
    // The configuration is written before the status: its last version is in the watch.
    let reader = || (None, vec!["vault".to_owned()]);
    let expected = [(None, vec![]), reader(), (Some("vault".to_owned()), vec![]), reader()];
    let mut seen = vec![(None, vec![])];
    let _ = tokio::time::timeout(CONTROLLER_STEP, async {
        while seen.len() < expected.len() {
            match layouts.recv().await {
                Some(layout) if seen.last() != Some(&layout) => seen.push(layout),
                Some(_) => {}
                None => break,
            }
        }
    })
    .await;
    watch.abort();
    assert_eq!(
        seen, expected,
        "added as a reader, then the writer, then a reader again"
    );
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .get("demo-apiserver")
        .await
        .unwrap();
    let volumes = sts.spec.unwrap().template.spec.unwrap().volumes.unwrap_or_default();
    assert!(
        volumes.iter().any(|v| v.name == "kms-0"),
        "a plugin that reads stays mounted"
    );
    stand_in.stop().await;
    capn.stop().await;
}
