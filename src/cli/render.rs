//! `capn render`: what the controllers would apply for the resources in a file, computed
//! offline through the same [`crate::plan::plan`] the controllers call.

use anyhow::{Context as _, bail};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::api::{NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd};
use crate::channel::ChannelRegistry;
use crate::controllers::component::ComponentResource;
use crate::controllers::read::{CAPI_GROUP, cluster_settings, controller_reference};
use crate::pki::{SECRET_TYPE, SecretNames};
use crate::plan::{ClusterSettings, ComponentRequest, Plan, Upstream, plan};

fn kind_of(doc: &Value) -> (&str, &str) {
    let s = |k: &str| doc.get(k).and_then(Value::as_str).unwrap_or_default();
    (s("apiVersion"), s("kind"))
}

fn find<K: ComponentResource>(docs: &[Value], name: &str) -> anyhow::Result<Option<K>> {
    for doc in docs {
        let (api_version, kind) = kind_of(doc);
        if kind == K::kind(&())
            && api_version == K::api_version(&())
            && doc.pointer("/metadata/name") == Some(&Value::from(name))
        {
            return Ok(Some(
                serde_json::from_value(doc.clone()).with_context(|| format!("{kind} {name}"))?,
            ));
        }
    }
    Ok(None)
}

/// The component of kind `K` for `ncp`: the one the file holds under the referenced name,
/// else the default one the NestedControlPlane controller would create.
fn component<K: ComponentResource>(docs: &[Value], ncp: &NestedControlPlane) -> anyhow::Result<(K, bool)> {
    let name = K::reference(ncp)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}-{}", ncp.name_any(), K::KIND.as_str()));
    if let Some(found) = find::<K>(docs, &name)? {
        return Ok((found, false));
    }
    if K::reference(ncp).is_some() {
        bail!(
            "NestedControlPlane {} references {} {name}, which is not in the file",
            ncp.name_any(),
            K::kind(&())
        );
    }
    let mut fresh = K::with_defaults(&name);
    fresh.meta_mut().namespace = ncp.namespace();
    Ok((fresh, true))
}

/// The controllers' owner reference; an offline object without a uid gets an empty one.
fn owner_of<K: Resource<DynamicType = ()>>(object: &K) -> OwnerReference {
    controller_reference(object).unwrap_or_else(|| OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: object.name_any(),
        uid: String::new(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

fn plan_component<K: ComponentResource>(
    channels: &ChannelRegistry,
    cluster: &ClusterSettings,
    component: &K,
    upstream: &Upstream,
) -> anyhow::Result<Plan> {
    let name = component.name_any();
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &name,
        spec: component.component(),
        etcd_storage: component.etcd_storage(),
        owner: owner_of(component),
        running: Default::default(),
    };
    plan(channels, cluster, &request, upstream).with_context(|| format!("{} {name}", K::kind(&())))
}

/// Renders every NestedControlPlane in `docs`: the component resources the controller
/// would create, the certificate Secrets (name, type and labels only: their contents are
/// generated in the cluster), and every object of every component. The apiserver is
/// rendered against the etcd endpoints the etcd plan publishes, as if etcd were ready.
///
/// A CAPI `Cluster` in `docs` whose `spec.controlPlaneRef` names a NestedControlPlane is
/// treated as its owner (as Cluster API will make it): its name is the cluster name and its
/// `spec.clusterNetwork` applies.
///
/// # Errors
/// A document that is not the kind it says, a reference to a component not in `docs`, or
/// any plan error (unknown version or channel, a failing patch, ...).
pub fn render_documents(
    channels: &ChannelRegistry,
    docs: Vec<Value>,
    super_dns_domain: &str,
) -> anyhow::Result<Vec<Value>> {
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let mut out = Vec::new();
    for doc in &docs {
        if kind_of(doc) != (NestedControlPlane::api_version(&()).as_ref(), "NestedControlPlane") {
            continue;
        }
        let mut ncp: NestedControlPlane = serde_json::from_value(doc.clone()).context("NestedControlPlane")?;
        if ncp.namespace().is_none() {
            ncp.meta_mut().namespace = Some("default".into());
        }
        let capi_cluster = docs.iter().find(|d| {
            let (api_version, kind) = kind_of(d);
            kind == "Cluster"
                && api_version.starts_with(&format!("{CAPI_GROUP}/"))
                && d.pointer("/spec/controlPlaneRef/name") == Some(&Value::from(ncp.name_any()))
        });
        let capi_cluster: Option<DynamicObject> =
            capi_cluster.map(|c| serde_json::from_value(c.clone())).transpose()?;
        if let Some(c) = &capi_cluster
            && ncp.owner_references().is_empty()
        {
            ncp.meta_mut().owner_references = Some(vec![OwnerReference {
                api_version: c.types.as_ref().map(|t| t.api_version.clone()).unwrap_or_default(),
                kind: "Cluster".into(),
                name: c.name_any(),
                uid: c.uid().unwrap_or_default(),
                ..Default::default()
            }]);
        }
        let cluster = cluster_settings(&ncp, capi_cluster.as_ref(), super_dns_domain);

        let (etcd, etcd_new) = component::<NestedEtcd>(&docs, &ncp)?;
        let (apiserver, apiserver_new) = component::<NestedAPIServer>(&docs, &ncp)?;
        let (controller_manager, cm_new) = component::<NestedControllerManager>(&docs, &ncp)?;
        let ncp_owner = owner_of(&ncp);
        for (new, value) in [
            (etcd_new, serde_json::to_value(&etcd)?),
            (apiserver_new, serde_json::to_value(&apiserver)?),
            (cm_new, serde_json::to_value(&controller_manager)?),
        ] {
            if new {
                let mut value = value;
                value["metadata"]["ownerReferences"] = serde_json::to_value(vec![&ncp_owner])?;
                out.push(value);
            }
        }
        for name in SecretNames::new(&cluster.name).all() {
            out.push(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": name,
                    "namespace": cluster.namespace,
                    "labels": {crate::api::CLUSTER_NAME_LABEL: cluster.name},
                },
                "type": SECRET_TYPE,
            }));
        }
        let etcd_plan = plan_component(channels, &cluster, &etcd, &Upstream::default())?;
        let upstream = Upstream {
            etcd_endpoints: etcd_plan.etcd_endpoints.clone(),
        };
        let apiserver_plan = plan_component(channels, &cluster, &apiserver, &upstream)?;
        let cm_plan = plan_component(channels, &cluster, &controller_manager, &Upstream::default())?;
        for p in [etcd_plan, apiserver_plan, cm_plan] {
            out.extend(p.objects);
        }
    }
    if out.is_empty() {
        bail!("no NestedControlPlane (controlplane.cluster.x-k8s.io/v1beta1) in the input");
    }
    Ok(out)
}
