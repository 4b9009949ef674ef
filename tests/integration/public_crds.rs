//! Issue "Public CRDs from the super cluster appear in every nested control plane": two
//! booted nested control planes (real etcd, kube-apiserver and kube-controller-manager run by
//! the runner) and the public CRD sync.

use std::sync::Arc;
use std::time::{Duration, Instant};

use capn::api::NestedControlPlane;
use capn::controllers::{Settings, TenantConfigHook};
use capn_testkit::runner::Runner;
use capn_testkit::{cluster, test_namespace, wait_until};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::harness::{Capn, apply_example, capn_binary, secret, secret_value};

/// From apply to a ready control plane; two boot at once on two cores.
const BOOT: Duration = Duration::from_secs(420);
/// One sync step.
const SYNC: Duration = Duration::from_secs(90);
pub(crate) const PUBLIC_LABEL: &str = "tenancy.x-k8s.io/super.public";

/// One booted tenant: the runner plays its kubelet, capn (with the public CRD sync) reaches
/// its apiserver at the pod address the runner gave it, verifying the certificate for the
/// in-cluster name its kubeconfig names.
struct Tenant {
    ns: String,
    runner: Arc<Runner>,
    _capn: Capn,
}

impl Tenant {
    async fn boot(client: &Client) -> Self {
        let ns = test_namespace(client).await;
        let runner = Arc::new(
            Runner::start(client, &ns, capn_binary())
                .await
                .expect("the runner starts"),
        );
        let resolver = runner.clone();
        let hook = TenantConfigHook(Arc::new(move |_ncp: &NestedControlPlane, config: &mut kube::Config| {
            let url = config.cluster_url.clone();
            if let Some(host) = url.host()
                && host.parse::<std::net::IpAddr>().is_err()
                && let Some(ip) = resolver.resolve(host).first()
            {
                config.tls_server_name.get_or_insert_with(|| host.to_string());
                config.cluster_url = format!("https://{ip}:{}", url.port_u16().unwrap_or(443))
                    .parse()
                    .unwrap();
            }
        }));
        let mut settings = Settings {
            namespace: Some(ns.clone()),
            tenant_config_hook: Some(hook),
            ..Settings::default()
        };
        settings.enabled.public_crds = true;
        let capn = Capn::start_with_settings(client, settings, &[]);
        let started = Instant::now();
        apply_example(client, &ns, "examples/nestedcontrolplane.yaml").await;
        let ncps: Api<NestedControlPlane> = Api::namespaced(client.clone(), &ns);
        runner
            .wait_for("the NestedControlPlane is ready", BOOT, || async {
                ncps.get_opt("demo")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|n| n.status)
                    .filter(|s| s.ready)
                    .map(|_| ())
            })
            .await;
        eprintln!("public-crds: tenant {ns} ready in {:.1?}", started.elapsed());
        Self {
            ns,
            runner,
            _capn: capn,
        }
    }

    /// An admin client of the nested control plane; `None` while its apiserver has no
    /// ready pod.
    async fn client(&self, super_client: &Client) -> Option<Client> {
        let kubeconfig = secret_value(&secret(super_client, &self.ns, "demo-kubeconfig").await?, "value");
        Client::try_from(self.runner.client_config(&kubeconfig).await.ok()?).ok()
    }

    async fn crd(&self, super_client: &Client, name: &str) -> Option<CustomResourceDefinition> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client(super_client).await?);
        api.get_opt(name).await.ok().flatten()
    }

    async fn condition(&self, super_client: &Client) -> Option<(String, String, String)> {
        let ncp = Api::<NestedControlPlane>::namespaced(super_client.clone(), &self.ns)
            .get("demo")
            .await
            .ok()?;
        let c = ncp
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "PublicCRDsSynced")?;
        Some((c.status, c.reason, c.message))
    }
}

pub(crate) fn crd(name: &str, plural: &str, kind: &str, public: bool, versions: &[&str]) -> serde_json::Value {
    let (group, _) = name.split_once('.').map(|(_, g)| (g, ())).unwrap();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "labels": if public { json!({PUBLIC_LABEL: "true"}) } else { json!({}) }},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": versions.iter().enumerate().map(|(i, v)| json!({"name": v, "served": true, "storage": i == 0,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})).collect::<Vec<_>>()}
    })
}

async fn apply_crd(api: &Api<CustomResourceDefinition>, doc: serde_json::Value) {
    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
    api.patch(&name, &PatchParams::apply("platform-team").force(), &Patch::Apply(&doc))
        .await
        .unwrap();
}

#[tokio::test]
async fn public_crds_reach_every_tenant_follow_changes_and_never_touch_a_tenants_own() {
    let client = cluster().client();
    let (a, b) = tokio::join!(Tenant::boot(&client), Tenant::boot(&client));
    let supers: Api<CustomResourceDefinition> = Api::all(client.clone());
    // Unique names: the super cluster's CRDs are cluster-wide and shared with other tests.
    let suffix = a.ns.trim_start_matches("capn-test-").to_string();
    let widgets = format!("widgets.s{suffix}.example.com");
    let gadgets = format!("gadgets.s{suffix}.example.com");

    // A tenant's own CRD of the name a public one will have.
    let tenant_a: Api<CustomResourceDefinition> = Api::all(a.client(&client).await.expect("tenant a serves"));
    apply_crd(&tenant_a, crd(&gadgets, "gadgets", "Gadget", false, &["v7"])).await;

    let started = Instant::now();
    apply_crd(&supers, crd(&widgets, "widgets", "Widget", true, &["v1"])).await;
    apply_crd(&supers, crd(&gadgets, "gadgets", "Gadget", true, &["v1"])).await;
    for t in [&a, &b] {
        wait_until("the public CRD appears in the tenant", SYNC, || async {
            t.crd(&client, &widgets).await.map(|_| ())
        })
        .await;
    }
    eprintln!(
        "public-crds: labelled CRD in both tenants after {:.1?}",
        started.elapsed()
    );
    wait_until("tenant b gets gadgets too", SYNC, || async {
        b.crd(&client, &gadgets).await.map(|_| ())
    })
    .await;

    // The tenant's own gadgets CRD is untouched, and the condition says why.
    let (status, _, message) = wait_until("tenant a reports the conflict", SYNC, || async {
        a.condition(&client).await.filter(|(_, r, _)| r == "TenantOwnsCRD")
    })
    .await;
    assert_eq!(status, "False");
    assert!(message.contains(&gadgets), "{message}");
    let own = a.crd(&client, &gadgets).await.unwrap();
    assert_eq!(
        own.spec.versions.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        vec!["v7"],
        "the tenant's CRD was overwritten"
    );
    assert!(
        !own.labels()
            .contains_key("controlplane.cluster.x-k8s.io/synced-from-super")
    );

    // A new version of the super CRD follows.
    apply_crd(&supers, crd(&widgets, "widgets", "Widget", true, &["v1", "v2"])).await;
    for t in [&a, &b] {
        wait_until("the new version reaches the tenant", SYNC, || async {
            t.crd(&client, &widgets)
                .await
                .filter(|c| c.spec.versions.len() == 2)
                .map(|_| ())
        })
        .await;
    }

    // Stop tenant a's apiserver: tenant b keeps syncing.
    a.runner.pause_pod("demo-apiserver-0").unwrap();
    let late = format!("lates.s{suffix}.example.com");
    apply_crd(&supers, crd(&late, "lates", "Late", true, &["v1"])).await;
    wait_until("tenant b syncs while tenant a is down", SYNC, || async {
        b.crd(&client, &late).await.map(|_| ())
    })
    .await;
    wait_until("tenant a reports it cannot be reached", SYNC, || async {
        a.condition(&client)
            .await
            .filter(|(_, r, _)| r == "TenantUnreachable")
            .map(|_| ())
    })
    .await;
    a.runner.resume_pod("demo-apiserver-0").unwrap();
    wait_until(
        "tenant a catches up after it is back (retried with backoff)",
        Duration::from_secs(180),
        || async { a.crd(&client, &late).await.map(|_| ()) },
    )
    .await;

    // Unlabelling removes the copies, and only the copies.
    apply_crd(&supers, crd(&widgets, "widgets", "Widget", false, &["v1", "v2"])).await;
    for t in [&a, &b] {
        wait_until("the unlabelled CRD leaves the tenant", SYNC, || async {
            t.crd(&client, &widgets).await.is_none().then_some(())
        })
        .await;
    }
    assert!(
        a.crd(&client, &gadgets).await.is_some(),
        "the tenant's own CRD must stay"
    );
    for name in [&widgets, &gadgets, &late] {
        let _ = supers.delete(name, &Default::default()).await;
    }
}
