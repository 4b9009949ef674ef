//! Issue 5, "Proven against real Cluster API" and "clusterctl artifacts": capn next to Cluster
//! API's real core controller manager and CRDs, and the real `clusterctl` against a local
//! provider repository holding capn's `clusterctl/` files. Both binaries are built from
//! `sigs.k8s.io/cluster-api` by `hack/capi-assets.sh` (see `capn_testkit::capi`).

use std::path::Path;
use std::time::{Duration, Instant};

use capn::api::NestedCluster;
use capn_testkit::capi::{CAPI_VERSION, Capi, ProviderRepository, capi};
use capn_testkit::counting::RequestCounter;
use capn_testkit::poll_until;
use capn_testkit::{cluster, mark_statefulset_ready, test_namespace, wait_until};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::Value;

use crate::harness::*;

/// How long a test waits for Cluster API: it looks again at a Cluster whose infrastructure or
/// control plane object it could not find only after 30 s.
const CAPI_STEP: Duration = Duration::from_secs(90);
/// Deleting a Cluster: Cluster API deletes the control plane, waits for it to go, deletes
/// the infrastructure object, then the garbage collector removes what capn created.
const DELETION: Duration = Duration::from_secs(120);

fn capi_cluster_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"));
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn capi_cluster(client: &kube::Client, ns: &str, name: &str) -> Option<Value> {
    capi_cluster_api(client, ns)
        .get_opt(name)
        .await
        .unwrap()
        .map(|c| serde_json::to_value(c).unwrap())
}

/// Waits until Cluster API reports what `accept` looks for on Cluster `name`.
///
/// # Panics
/// On timeout, with [`state_report`].
async fn wait_for_cluster(
    capi: &Capi,
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    accept: impl Fn(&Value) -> bool,
) -> Value {
    let accept = &accept;
    let found = poll_until(CAPI_STEP, || async move {
        capi_cluster(client, ns, name).await.filter(accept)
    })
    .await;
    match found {
        Some(cluster) => cluster,
        None => panic!(
            "timed out after {CAPI_STEP:?} waiting until {what}\n{}",
            state_report(capi, client, ns).await
        ),
    }
}

/// For failure messages: the Clusters and capn's provider objects in `ns` as the apiserver
/// holds them (read untyped, so that what capn cannot decode still shows), and the Cluster
/// API manager's log about `ns`.
async fn state_report(capi: &Capi, client: &kube::Client, ns: &str) -> String {
    let mut objects = Vec::new();
    for (group, version, kind) in [
        ("cluster.x-k8s.io", "v1beta2", "Cluster"),
        ("controlplane.cluster.x-k8s.io", "v1beta1", "NestedControlPlane"),
        ("infrastructure.cluster.x-k8s.io", "v1beta1", "NestedCluster"),
    ] {
        for o in list(client, ns, group, version, kind).await {
            objects.push(serde_json::json!({
                "kind": kind, "name": o.name_any(), "owners": o.owner_references(),
                "spec": o.data["spec"], "status": o.data["status"],
            }));
        }
    }
    format!(
        "objects in {ns}:\n{}\n{}",
        serde_json::to_string_pretty(&objects).unwrap_or_default(),
        capi.log_report(ns)
    )
}

/// Every object of one kind in `ns`, untyped.
async fn list(client: &kube::Client, ns: &str, group: &str, version: &str, kind: &str) -> Vec<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing {kind}: {e}"))
        .items
}

/// A v1beta2 (metav1) condition of `object` as (status, reason).
fn condition(object: &Value, type_: &str) -> Option<(String, String)> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// Waits for a StatefulSet (capn names them after the Cluster, which it learns only once
/// Cluster API owns the control plane) and marks it ready as the kubelet would.
async fn make_ready_for_capi(capi: &Capi, client: &kube::Client, ns: &str, name: &str) {
    capi.wait_until(ns, &format!("StatefulSet {name} exists"), CAPI_STEP, || async {
        statefulset(client, ns, name).await.map(|_| ())
    })
    .await;
    mark_statefulset_ready(client, ns, name).await.unwrap();
}

/// `examples/cluster.yaml` with capn and Cluster API running, brought to an available
/// control plane; returns the Cluster as Cluster API last reported it.
async fn bring_up_example_cluster(capi: &Capi, client: &kube::Client, ns: &str) -> Value {
    apply_example(client, ns, "examples/cluster.yaml").await;
    make_ready_for_capi(capi, client, ns, "tenant-1-etcd").await;
    make_ready_for_capi(capi, client, ns, "tenant-1-apiserver").await;
    // The apiserver runs: initialized. The controller-manager does not yet, so the control
    // plane's Available condition is False, and Cluster API mirrors it rather than deriving
    // availability from initialization.
    let initialized = wait_for_cluster(
        capi,
        client,
        ns,
        "tenant-1",
        "Cluster API reports the control plane initialized",
        |c| c["status"]["initialization"]["controlPlaneInitialized"] == true,
    )
    .await;
    let available = condition(&initialized, "ControlPlaneAvailable");
    assert_eq!(
        available.as_ref().map(|(s, _)| s.as_str()),
        Some("False"),
        "ControlPlaneAvailable before the controller-manager runs: {available:?}"
    );
    make_ready_for_capi(capi, client, ns, "tenant-1-controller-manager").await;
    // The example's NestedCluster has no spec, which its CRD allows.
    let provisioned = poll_until(CAPI_STEP, || async {
        list(
            client,
            ns,
            "infrastructure.cluster.x-k8s.io",
            "v1beta1",
            "NestedCluster",
        )
        .await
        .into_iter()
        .find(|c| c.name_any() == "tenant-1" && c.data["status"]["initialization"]["provisioned"] == true)
    })
    .await;
    assert!(
        provisioned.is_some(),
        "capn did not report NestedCluster tenant-1 provisioned within {CAPI_STEP:?}\n{}",
        state_report(capi, client, ns).await
    );
    wait_for_cluster(
        capi,
        client,
        ns,
        "tenant-1",
        "Cluster API reports the control plane available",
        |c| {
            condition(c, "ControlPlaneAvailable").is_some_and(|(s, _)| s == "True")
                && c["status"]["initialization"]["infrastructureProvisioned"] == true
                && c["spec"]["controlPlaneEndpoint"]["host"].is_string()
        },
    )
    .await
}

#[tokio::test]
async fn cluster_api_reports_the_example_cluster_provisioned_initialized_and_available() {
    let capi = capi();
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    let capi_cluster = bring_up_example_cluster(capi, &client, &ns).await;

    let ncp = control_plane(&client, &ns, "tenant-1-control-plane").await;
    assert!(ncp.status.as_ref().is_some_and(|s| s.ready), "{:?}", ncp.status);
    let endpoint = ncp
        .spec
        .control_plane_endpoint
        .clone()
        .expect("capn filled the endpoint");
    assert_eq!(endpoint.host, format!("tenant-1-apiserver.{ns}.svc"));
    assert_eq!(endpoint.port, 6443);
    // Cluster API copied the endpoint from the control plane.
    assert_eq!(
        capi_cluster["spec"]["controlPlaneEndpoint"]["host"],
        endpoint.host.as_str()
    );
    assert_eq!(capi_cluster["spec"]["controlPlaneEndpoint"]["port"], endpoint.port);
    assert_eq!(
        capi_cluster["status"]["initialization"]["infrastructureProvisioned"],
        true
    );
    assert_eq!(
        capi_cluster["status"]["initialization"]["controlPlaneInitialized"],
        true
    );
    assert_eq!(
        condition(&capi_cluster, "InfrastructureReady").map(|(s, _)| s),
        Some("True".to_owned())
    );
    // Mirrored from the NestedControlPlane's own Available condition (its reason), not a
    // fallback Cluster API invents.
    let ncp_available = ncp
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Available"))
        .expect("the NestedControlPlane has an Available condition");
    assert_eq!(
        condition(&capi_cluster, "ControlPlaneAvailable"),
        Some(("True".to_owned(), ncp_available.reason.clone()))
    );
    assert_eq!(
        capi_cluster["status"]["phase"], "Provisioned",
        "{:#}",
        capi_cluster["status"]
    );

    // Cluster API owns both provider objects, and capn named everything after the Cluster.
    let nested_cluster = Api::<NestedCluster>::namespaced(client.clone(), &ns)
        .get("tenant-1")
        .await
        .unwrap();
    for owners in [ncp.owner_references(), nested_cluster.owner_references()] {
        assert!(
            owners.iter().any(|o| o.kind == "Cluster" && o.name == "tenant-1"),
            "{owners:?}"
        );
    }
    let mut statefulsets: Vec<String> = Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    statefulsets.sort();
    assert_eq!(
        statefulsets,
        ["tenant-1-apiserver", "tenant-1-controller-manager", "tenant-1-etcd"]
    );
    let kubeconfig = secret(&client, &ns, "tenant-1-kubeconfig")
        .await
        .expect("tenant-1-kubeconfig exists");
    assert_eq!(kubeconfig.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(
        kubeconfig
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("tenant-1")
    );
    assert!(
        secret_value(&kubeconfig, "value").contains(&format!("server: https://tenant-1-apiserver.{ns}.svc:6443")),
        "{}",
        secret_value(&kubeconfig, "value")
    );
}

/// What of the example cluster is still in `ns`, as `Kind/name`.
async fn remaining(client: &kube::Client, ns: &str) -> Vec<String> {
    let mut left = Vec::new();
    for (group, version, kind) in [
        ("cluster.x-k8s.io", "v1beta2", "Cluster"),
        ("infrastructure.cluster.x-k8s.io", "v1beta1", "NestedCluster"),
        ("controlplane.cluster.x-k8s.io", "v1beta1", "NestedControlPlane"),
        ("controlplane.cluster.x-k8s.io", "v1beta1", "NestedEtcd"),
        ("controlplane.cluster.x-k8s.io", "v1beta1", "NestedAPIServer"),
        ("controlplane.cluster.x-k8s.io", "v1beta1", "NestedControllerManager"),
        ("apps", "v1", "StatefulSet"),
        ("", "v1", "Service"),
        ("", "v1", "Secret"),
    ] {
        for o in list(client, ns, group, version, kind).await {
            left.push(format!("{kind}/{}", o.name_any()));
        }
    }
    left
}

#[tokio::test]
async fn deleting_the_cluster_deletes_everything() {
    let capi = capi();
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    bring_up_example_cluster(capi, &client, &ns).await;
    let before = remaining(&client, &ns).await;
    for kind in [
        "Cluster/",
        "NestedCluster/",
        "NestedControlPlane/",
        "NestedEtcd/",
        "NestedAPIServer/",
        "NestedControllerManager/",
        "StatefulSet/",
        "Service/",
        "Secret/tenant-1-kubeconfig",
    ] {
        assert!(
            before.iter().any(|o| o.starts_with(kind)),
            "no {kind} before the deletion: {before:?}"
        );
    }

    capi_cluster_api(&client, &ns)
        .delete("tenant-1", &DeleteParams::default())
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let left = remaining(&client, &ns).await;
        if left.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < DELETION,
            "{DELETION:?} after deleting the Cluster these remain: {left:?}\n{}",
            state_report(capi, &client, &ns).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A local clusterctl repository with capn's two providers as `clusterctl/` ships them, and
/// the cluster template next to the infrastructure provider's components.
fn nested_repository() -> ProviderRepository {
    let read = |path: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
            .unwrap_or_else(|e| panic!("reading {path}: {e}"))
    };
    let version = capn_version();
    let mut repository = ProviderRepository::new();
    repository
        .add(
            "nested",
            "ControlPlaneProvider",
            &version,
            &[
                (
                    "control-plane-components.yaml",
                    read("clusterctl/control-plane-components.yaml"),
                ),
                ("metadata.yaml", read("clusterctl/metadata.yaml")),
            ],
        )
        .add(
            "nested",
            "InfrastructureProvider",
            &version,
            &[
                (
                    "infrastructure-components.yaml",
                    read("clusterctl/infrastructure-components.yaml"),
                ),
                ("metadata.yaml", read("clusterctl/metadata.yaml")),
                ("cluster-template.yaml", read("templates/cluster-template.yaml")),
            ],
        );
    repository
}

/// The `providers:` entries of the clusterctl configuration in docs/guide/cluster-api.md, with
/// each release URL (`https://github.com/capn/capn/releases/latest/<file>`) pointed at
/// `<root>/<provider-label>/latest/<file>`.
fn documented_providers(root: &Path) -> String {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guide/cluster-api.md")).unwrap();
    let start = page
        .find("```yaml\nproviders:\n")
        .expect("docs/guide/cluster-api.md shows a clusterctl.yaml with providers")
        + "```yaml\nproviders:\n".len();
    let block = &page[start..start + page[start..].find("```").unwrap()];
    let releases = "https://github.com/capn/capn/releases/latest/";
    let mut entries = String::new();
    for line in block.lines() {
        let line = line.strip_prefix("  ").unwrap_or(line);
        let line = match line.split_once(releases) {
            Some((head, file)) => {
                let label = match file {
                    "control-plane-components.yaml" => "control-plane-nested",
                    "infrastructure-components.yaml" => "infrastructure-nested",
                    other => panic!("the documented clusterctl.yaml names an unknown file {other}"),
                };
                format!("{head}file://{}/{label}/latest/{file}", root.display())
            }
            None => line.to_owned(),
        };
        entries.push_str(&line);
        entries.push('\n');
    }
    assert_eq!(entries.matches(releases).count(), 0);
    assert_eq!(entries.matches("file://").count(), 2, "{entries}");
    entries
}

fn capn_version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

#[tokio::test]
async fn clusterctl_generate_cluster_output_applies_and_reaches_a_ready_control_plane() {
    let capi = capi();
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let repository = nested_repository();
    let infrastructure = format!("nested:{}", capn_version());
    let (ok, stdout, stderr) = repository
        .clusterctl(
            capi,
            &[
                "generate",
                "cluster",
                "t1",
                "--kubernetes-version",
                "v1.36.3",
                "--infrastructure",
                &infrastructure,
                "--target-namespace",
                &ns,
            ],
        )
        .await;
    assert!(ok, "clusterctl generate cluster failed:\n{stderr}");
    assert!(!stdout.contains("${"), "unsubstituted variables:\n{stdout}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["Cluster", "NestedCluster", "NestedControlPlane", "NestedEtcd"],
        "{stdout}"
    );
    assert!(
        docs.iter().all(|d| d["metadata"]["namespace"] == ns.as_str()),
        "{stdout}"
    );

    let _capn = Capn::start(&client, &ns);
    for doc in docs {
        apply_doc(&client, &ns, doc).await;
    }
    for name in ["t1-etcd", "t1-apiserver", "t1-controller-manager"] {
        make_ready_for_capi(capi, &client, &ns, name).await;
    }
    let ncp = capi
        .wait_until(&ns, "the generated NestedControlPlane is ready", CAPI_STEP, || async {
            Some(control_plane(&client, &ns, "t1").await).filter(|n| n.status.as_ref().is_some_and(|s| s.ready))
        })
        .await;
    assert_eq!(ncp.status.unwrap().version.as_deref(), Some("1.36.3"));
    wait_for_cluster(
        capi,
        &client,
        &ns,
        "t1",
        "Cluster API reports t1's control plane available",
        |c| condition(c, "ControlPlaneAvailable").is_some_and(|(s, _)| s == "True"),
    )
    .await;
    assert!(secret(&client, &ns, "t1-kubeconfig").await.is_some());
}

/// A core provider for `clusterctl init`: Cluster API's real CRDs from the assets and the
/// manager's Deployment (nothing runs its pods: the test cluster has no kubelet; the tests
/// run the same manager as a process).
fn core_components(capi: &Capi) -> String {
    let mut docs = vec![serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "capi-system"}
    })];
    docs.extend(capn_testkit::capi::crds(capi.assets_dir()).unwrap());
    docs.push(stand_in_deployment(
        "capi-system",
        "capi-controller-manager",
        &format!("registry.k8s.io/cluster-api/cluster-api-controller:{CAPI_VERSION}"),
    ));
    yaml_stream(&docs)
}

/// clusterctl installs a bootstrap provider with the first core provider, kubeadm unless
/// told otherwise; the assets hold no kubeadm bootstrap CRDs, and capn needs none.
fn kubeadm_bootstrap_components() -> String {
    yaml_stream(&[
        serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "capi-kubeadm-bootstrap-system"}
        }),
        stand_in_deployment(
            "capi-kubeadm-bootstrap-system",
            "capi-kubeadm-bootstrap-controller-manager",
            &format!("registry.k8s.io/cluster-api/kubeadm-bootstrap-controller:{CAPI_VERSION}"),
        ),
    ])
}

/// What `clusterctl init` checks of cert-manager before installing providers: that an
/// `Issuer` and a `Certificate` can be created. Only those two CRDs (no controller, no
/// webhook: nothing would run their pods).
fn cert_manager_components() -> String {
    let crd = |kind: &str, plural: &str| {
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cert-manager.io")},
            "spec": {
                "group": "cert-manager.io", "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        })
    };
    yaml_stream(&[
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cert-manager"}}),
        crd("Issuer", "issuers"),
        crd("Certificate", "certificates"),
    ])
}

fn stand_in_deployment(ns: &str, name: &str, image: &str) -> Value {
    let labels = serde_json::json!({"control-plane": name});
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [{"name": "manager", "image": image}]}},
        },
    })
}

/// clusterctl's `metadata.yaml` of a Cluster API release.
fn capi_metadata() -> String {
    let minor = CAPI_VERSION.split('.').nth(1).unwrap();
    format!(
        "apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3\nkind: Metadata\nreleaseSeries:\n- major: 1\n  minor: {minor}\n  contract: v1beta2\n"
    )
}

fn yaml_stream(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| format!("---\n{}", serde_saphyr::to_string(d).unwrap()))
        .collect()
}

#[tokio::test]
async fn clusterctl_init_installs_capn_into_the_super_cluster() {
    let capi = capi();
    let client = cluster().client();
    let mut repository = nested_repository();
    // The providers as docs/guide/cluster-api.md tells users to declare them, their release
    // URLs pointed at this repository's `latest` (clusterctl's local-repository rule).
    let documented = documented_providers(&repository.root());
    repository
        .declare("nested", &documented)
        .add(
            "cluster-api",
            "CoreProvider",
            CAPI_VERSION,
            &[
                ("core-components.yaml", core_components(capi)),
                ("metadata.yaml", capi_metadata()),
            ],
        )
        .add(
            "kubeadm",
            "BootstrapProvider",
            CAPI_VERSION,
            &[
                ("bootstrap-components.yaml", kubeadm_bootstrap_components()),
                ("metadata.yaml", capi_metadata()),
            ],
        )
        .cert_manager("v1.21.1", &[("cert-manager.yaml", cert_manager_components())]);
    let nested = format!("nested:{}", capn_version());
    let core = format!("cluster-api:{CAPI_VERSION}");
    let bootstrap = format!("kubeadm:{CAPI_VERSION}");
    let kubeconfig = cluster().kubeconfig_path().display().to_string();
    let (ok, stdout, stderr) = repository
        .clusterctl(
            capi,
            &[
                "init",
                "--core",
                &core,
                "--bootstrap",
                &bootstrap,
                "--control-plane",
                &nested,
                "--infrastructure",
                &nested,
                "--kubeconfig",
                &kubeconfig,
            ],
        )
        .await;
    let output = format!("{stdout}\n{stderr}");
    assert!(ok, "clusterctl init failed:\n{output}");
    assert!(
        output.contains("Your management cluster has been initialized successfully!"),
        "{output}"
    );

    let components = |file: &str| -> Vec<Value> {
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("clusterctl").join(file)).unwrap();
        serde_saphyr::from_multiple(&text).unwrap()
    };
    for (file, label, namespace) in [
        (
            "control-plane-components.yaml",
            "control-plane-nested",
            "capn-control-plane-system",
        ),
        (
            "infrastructure-components.yaml",
            "infrastructure-nested",
            "capn-infrastructure-system",
        ),
    ] {
        let objects = components(file);
        // clusterctl labels what it installs with the provider's name: the CRDs carry it, so
        // clusterctl (not the test cluster's start-up) wrote them.
        for crd in objects.iter().filter(|o| o["kind"] == "CustomResourceDefinition") {
            let name = crd["metadata"]["name"].as_str().unwrap();
            let installed = Api::<CustomResourceDefinition>::all(client.clone())
                .get(name)
                .await
                .unwrap();
            assert_eq!(
                installed.labels().get("cluster.x-k8s.io/provider").map(String::as_str),
                Some(label),
                "CRD {name}"
            );
        }
        let role = objects.iter().find(|o| o["kind"] == "ClusterRole").unwrap();
        let installed = Api::<ClusterRole>::all(client.clone())
            .get(role["metadata"]["name"].as_str().unwrap())
            .await
            .unwrap();
        assert_eq!(
            serde_json::to_value(&installed.rules).unwrap(),
            role["rules"],
            "ClusterRole {}",
            installed.name_any()
        );
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let installed = Api::<Deployment>::namespaced(client.clone(), namespace)
            .get(deployment["metadata"]["name"].as_str().unwrap())
            .await
            .unwrap_or_else(|e| panic!("Deployment of {label} in {namespace}: {e}"));
        let container = &installed.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some("ghcr.io/capn/capn:v0.1.0"));
        let args = container.args.clone().unwrap_or_default();
        assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
        assert!(args.iter().all(|a| !a.contains("${")), "{args:?}");
    }
    // clusterctl's inventory lists both providers at capn's version.
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "clusterctl.cluster.x-k8s.io",
        "v1alpha3",
        "Provider",
    ));
    let mut providers: Vec<(String, String)> = Api::<DynamicObject>::all_with(client.clone(), &ar)
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|p| (p.name_any(), p.data["version"].as_str().unwrap_or_default().to_owned()))
        .collect();
    providers.sort();
    let version = capn_version();
    for provider in ["control-plane-nested", "infrastructure-nested"] {
        assert!(
            providers.contains(&(provider.to_owned(), version.clone())),
            "{provider} {version} not in {providers:?}"
        );
    }
}

/// Issue 11: capn reads the Cluster that owns a control plane from its watch cache, not
/// with a GET per reconcile of the control plane and of each component, and the
/// NestedCluster controller reads the control planes from theirs; and the cache wakes
/// the control plane when the Cluster's spec changes, so that unpausing a Cluster
/// (`spec.paused`, CAPI contract) resumes it at once rather than at its next change.
#[tokio::test]
async fn the_owning_cluster_is_read_from_the_cache_and_unpausing_it_resumes_at_once() {
    let capi = capi();
    let f = Fixture::without_capn().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    let counter = RequestCounter::default();
    let capn = Capn::start(&counter.client(cluster().config()), &ns);
    bring_up_example_cluster(capi, &client, &ns).await;
    let tally = counter.tally();
    // Before the caches: 10 GETs of the Cluster, and 11 LISTs of the namespace's control
    // planes by the NestedCluster controller (one per reconcile).
    assert_eq!(
        (
            tally.count("get", "clusters"),
            tally.count("list", "nestedcontrolplanes")
        ),
        (0, 1),
        "capn read what its caches hold:\n{}",
        tally.breakdown()
    );

    let paused = |value: bool| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            capi_cluster_api(&client, &ns)
                .patch(
                    "tenant-1",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"spec": {"paused": value}})),
                )
                .await
                .unwrap();
        }
    };
    let paused_condition = |status: &str| {
        let (client, ns, status) = (client.clone(), ns.clone(), status.to_owned());
        async move {
            control_plane(&client, &ns, "tenant-1-control-plane")
                .await
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Paused" && c.status == status)
                .map(|_| ())
        }
    };
    paused(true).await;
    wait_until("the control plane reports Paused", Duration::from_secs(30), || {
        paused_condition("True")
    })
    .await;
    paused(false).await;
    wait_until("the control plane resumes", Duration::from_secs(30), || {
        paused_condition("False")
    })
    .await;
    capn.stop().await;
}

/// Under `--watch-filter` the Cluster cache holds the Clusters of its own shard only, as
/// the control plane caches do (Cluster API's sharding convention labels a cluster's
/// objects alike); another shard's Cluster is neither cached nor read.
#[tokio::test]
async fn the_cluster_cache_keeps_only_the_clusters_the_watch_filter_selects() {
    let _ = capi();
    let client = cluster().client();
    let ns = test_namespace(&client).await;
    let filter = capn::controllers::WATCH_FILTER_LABEL;
    for (name, shard) in [("in-shard", "a"), ("other-shard", "b")] {
        let cluster: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns, "labels": {filter: shard}},
            "spec": {"paused": true},
        }))
        .unwrap();
        capi_cluster_api(&client, &ns)
            .create(&Default::default(), &cluster)
            .await
            .unwrap();
    }
    let primary = kube::runtime::watcher::Config::default().labels(&format!("{filter}=a"));
    let (caches, _subscriptions, _drivers) = capn::controllers::shared::cache::Caches::start(
        &client,
        Some(&ns),
        primary,
        true,
        &std::sync::Arc::new(capn::telemetry::Metrics::default()),
    )
    .await;
    let clusters = caches.clusters.as_ref().expect("Cluster API's Cluster is served");
    wait_until("the Cluster of shard a is cached", Duration::from_secs(30), || async {
        clusters.get(&ns, "in-shard").map(|_| ())
    })
    .await;
    // The cache fills from one LIST: what it does not hold now, it never held.
    assert!(clusters.get(&ns, "other-shard").is_none());
}
