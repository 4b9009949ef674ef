//! Proves the test support itself: each test fails if the super cluster is not what the other
//! tests rely on.

use std::collections::BTreeMap;
use std::time::Duration;

use capn_testkit::{cluster, mark_statefulset_ready, test_namespace, wait_until};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, PodSpec, PodTemplateSpec, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[tokio::test]
async fn apiserver_reports_kubernetes_1_36() {
    let version = cluster().client().apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "36"),
        "{version:?}"
    );
    assert!(version.git_version.starts_with("v1.36."), "{version:?}");
}

#[tokio::test]
async fn test_namespaces_are_distinct_and_exist() {
    let client = cluster().client();
    let first = test_namespace(&client).await;
    let second = test_namespace(&client).await;
    assert_ne!(first, second);
    for name in [&first, &second] {
        assert!(name.starts_with("capn-test-"), "{name}");
        Api::<Namespace>::all(client.clone()).get(name).await.unwrap();
    }
}

#[tokio::test]
async fn anonymous_requests_are_denied_by_rbac() {
    let mut config = cluster().config();
    config.auth_info = kube::config::AuthInfo::default();
    let anonymous = kube::Client::try_from(config).unwrap();
    let error = Api::<Namespace>::all(anonymous)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 403),
        "{error:?}"
    );
}

#[tokio::test]
async fn kubeconfig_file_reaches_the_cluster_as_admin() {
    let cluster = cluster();
    assert!(cluster.assets_dir().join("kube-apiserver").is_file());
    let kubeconfig = Kubeconfig::read_from(cluster.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    // Only an admin may list Secrets in every namespace.
    Api::<Secret>::all(client).list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn garbage_collector_deletes_a_configmap_whose_owner_is_deleted() {
    let client = cluster().client();
    let namespace = test_namespace(&client).await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let owner = api
        .create(&PostParams::default(), &config_map("owner", None))
        .await
        .unwrap();
    let owner_reference = OwnerReference {
        api_version: "v1".to_owned(),
        kind: "ConfigMap".to_owned(),
        name: "owner".to_owned(),
        uid: owner.metadata.uid.unwrap(),
        ..OwnerReference::default()
    };
    api.create(&PostParams::default(), &config_map("dependent", Some(owner_reference)))
        .await
        .unwrap();

    api.delete("owner", &DeleteParams::default()).await.unwrap();

    wait_until(
        "the garbage collector deletes the dependent ConfigMap",
        Duration::from_secs(60),
        || async { matches!(api.get_opt("dependent").await, Ok(None)).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn mark_statefulset_ready_writes_what_the_statefulset_controller_reports() {
    let client = cluster().client();
    let namespace = test_namespace(&client).await;
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let created = api
        .create(&PostParams::default(), &statefulset("demo-etcd", 3))
        .await
        .unwrap();

    mark_statefulset_ready(&client, &namespace, "demo-etcd").await.unwrap();

    let status = api.get_status("demo-etcd").await.unwrap().status.unwrap();
    let revision = status.update_revision.clone().unwrap();
    assert!(revision.starts_with("demo-etcd-"), "{revision}");
    assert_eq!(
        status,
        StatefulSetStatus {
            observed_generation: created.metadata.generation,
            replicas: 3,
            ready_replicas: Some(3),
            available_replicas: Some(3),
            current_replicas: Some(3),
            updated_replicas: Some(3),
            current_revision: Some(revision.clone()),
            update_revision: Some(revision),
            ..StatefulSetStatus::default()
        }
    );
    assert!(created.metadata.generation.is_some());

    // No StatefulSet controller runs to overwrite what the test wrote (it would report the
    // pods it found: none, as no kubelet runs).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = api.get_status("demo-etcd").await.unwrap().status.unwrap();
    assert_eq!(later, status);

    // The revision names the template, so marking again changes nothing.
    mark_statefulset_ready(&client, &namespace, "demo-etcd").await.unwrap();
    let again = api.get_status("demo-etcd").await.unwrap().status.unwrap();
    assert_eq!(again, status);
}

#[tokio::test]
async fn capn_crds_are_established_and_served() {
    let client = cluster().client();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = api
        .get("nestedcontrolplanes.controlplane.cluster.x-k8s.io")
        .await
        .unwrap();
    assert!(is_established(&crd), "{:?}", crd.status);
    for expected in capn::crds::crds() {
        let name = expected.metadata.name.unwrap();
        let installed = api.get(&name).await.unwrap();
        assert!(is_established(&installed), "{name}: {:?}", installed.status);
    }

    let version = crd.spec.versions.iter().find(|v| v.served).unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind),
        &crd.spec.names.plural,
    );
    Api::<DynamicObject>::all_with(client, &resource)
        .list(&ListParams::default())
        .await
        .unwrap();
}

fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

fn config_map(name: &str, owner: Option<OwnerReference>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: owner.map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

fn statefulset(name: &str, replicas: i32) -> StatefulSet {
    let labels = BTreeMap::from([("app".to_owned(), name.to_owned())]);
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "main".to_owned(),
                        image: Some("registry.k8s.io/pause:3.10".to_owned()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}
