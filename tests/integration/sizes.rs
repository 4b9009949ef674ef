//! Issue 40 item 3, sizes (docs/guide/sizes.md), on the real apiserver: a `size: small`
//! control plane's StatefulSets carry the small size of the stable channel (resources,
//! `GOMEMLIMIT`/`GOGC`, the apiserver's concurrency flags), explicit fields win over it, a
//! component's own size over its control plane's, and an unknown size is refused with a
//! condition and an Event that name the sizes the channel offers, applying nothing.

use capn::api::{NestedControlPlane, NestedControllerManager, NestedEtcd};
use capn::channel::{ChannelRegistry, ComponentSize};
use capn::component::ComponentKind;
use capn_testkit::wait_until;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::events::v1::Event;
use kube::api::Api;
use serde_json::json;

use crate::harness::*;

const API_VERSION: &str = "controlplane.cluster.x-k8s.io/v1beta1";

/// What the stable channel's size `size` sets for `kind`.
fn preset(size: &str, kind: ComponentKind) -> ComponentSize {
    let channels = ChannelRegistry::load(&[]).unwrap();
    let stable = channels.get("stable").unwrap();
    stable.index.sizes[size].component(kind).cloned().unwrap()
}

fn container(sts: &StatefulSet) -> &Container {
    &sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
}

fn env(sts: &StatefulSet, name: &str) -> Option<String> {
    container(sts)
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

#[tokio::test]
async fn a_small_control_plane_runs_with_the_small_size_explicit_fields_win_and_an_unknown_size_is_refused() {
    let f = Fixture::new().await;
    let (client, ns) = (f.client.clone(), f.ns.clone());
    // The etcd sets its own quota and the apiserver one flag of the size: both win.
    f.apply(
        json!({"apiVersion": API_VERSION, "kind": "NestedEtcd", "metadata": {"name": "sized-etcd"},
                   "spec": {"storage": {"quotaBackendBytes": "100Mi"}}}),
    )
    .await;
    f.apply(
        json!({"apiVersion": API_VERSION, "kind": "NestedAPIServer", "metadata": {"name": "sized-apiserver"},
                   "spec": {"extraArgs": {"max-requests-inflight": "300"}}}),
    )
    .await;
    f.apply(
        json!({"apiVersion": API_VERSION, "kind": "NestedControlPlane", "metadata": {"name": "sized"},
                   "spec": {"version": "1.36", "size": "small"}}),
    )
    .await;
    f.bring_up("sized").await;

    let etcd = statefulset(&client, &ns, "sized-etcd").await.unwrap();
    let small = preset("small", ComponentKind::Etcd);
    assert_eq!(
        container(&etcd).resources,
        small.resources,
        "etcd's resources are small's"
    );
    assert_eq!(env(&etcd, "GOMEMLIMIT").as_deref(), Some("460MiB"));
    assert_eq!(env(&etcd, "GOGC").as_deref(), Some("25"));
    assert_eq!(
        flags(&etcd).get("quota-backend-bytes").map(String::as_str),
        Some("104857600"),
        "the spec's quota (100Mi) wins over small's 256Mi"
    );

    let apiserver = statefulset(&client, &ns, "sized-apiserver").await.unwrap();
    let small = preset("small", ComponentKind::ApiServer);
    assert_eq!(container(&apiserver).resources, small.resources);
    assert_eq!(env(&apiserver, "GOMEMLIMIT").as_deref(), Some("920MiB"));
    let apiserver_flags = flags(&apiserver);
    assert_eq!(
        apiserver_flags.get("max-requests-inflight").map(String::as_str),
        Some("300"),
        "extraArgs win over small's 100"
    );
    assert_eq!(
        apiserver_flags
            .get("max-mutating-requests-inflight")
            .map(String::as_str),
        Some("50")
    );

    let cm = statefulset(&client, &ns, "sized-controller-manager").await.unwrap();
    assert_eq!(
        container(&cm).resources,
        preset("small", ComponentKind::ControllerManager).resources
    );
    assert_eq!(env(&cm, "GOMEMLIMIT").as_deref(), Some("460MiB"));

    // A component's own size wins over its control plane's.
    merge_patch::<NestedControllerManager>(
        &client,
        &ns,
        "sized-controller-manager",
        json!({"spec": {"size": "large"}}),
    )
    .await;
    let large = preset("large", ComponentKind::ControllerManager);
    wait_until(
        "the controller-manager runs with large's resources",
        CONTROLLER_STEP,
        || async {
            let cm = statefulset(&client, &ns, "sized-controller-manager").await?;
            (container(&cm).resources == large.resources).then_some(())
        },
    )
    .await;

    // An unknown size: refused with a condition and an Event naming the sizes, nothing
    // applied. The controller-manager keeps its own size and is not concerned.
    let before = statefulset_versions(&client, &ns).await;
    merge_patch::<NestedControlPlane>(&client, &ns, "sized", json!({"spec": {"size": "huge"}})).await;
    let said = "size \"huge\" is not in channel \"stable\"; available: large, medium, small";
    let etcds: Api<NestedEtcd> = Api::namespaced(client.clone(), &ns);
    let condition = wait_until("the NestedEtcd refuses the unknown size", CONTROLLER_STEP, || async {
        let etcd = etcds.get("sized-etcd").await.ok()?;
        etcd.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Synced" && c.status == "False" && c.reason == "UnknownSize")
    })
    .await;
    assert!(condition.message.contains(said), "{}", condition.message);
    let event = wait_until("a Warning Event says why", CONTROLLER_STEP, || async {
        find_listed(&Api::<Event>::namespaced(client.clone(), &ns), |e| {
            e.reason.as_deref() == Some("UnknownSize")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("sized-etcd")
        })
        .await
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(event.note.as_deref().unwrap_or_default().contains(said), "{event:?}");
    assert_eq!(
        statefulset_versions(&client, &ns).await,
        before,
        "a refused size changed a StatefulSet"
    );
    f.stop().await;
}
