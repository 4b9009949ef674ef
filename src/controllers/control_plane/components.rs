//! The control plane's component resources (NestedEtcd, NestedAPIServer,
//! NestedControllerManager): found, adopted or created with defaults, the apiserver's replicas
//! following the control plane's scale subresource, and the endpoint, which capn records
//! in the control plane's spec with the references to them in one patch.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::scope::Round;
use crate::api::{
    ApiEndpoint, CLUSTER_NAME_LABEL, NestedAPIServer, NestedControlPlane, NestedControllerManager, NestedEtcd,
};
use crate::apply::applyset::{CONTAINS_GROUP_KINDS_ANNOTATION, ID_LABEL, TOOLING_ANNOTATION, tooling};
use crate::apply::{create_params, update_params};
use crate::controllers::component::ComponentResource;
use crate::controllers::shared::read::controller_reference;
use crate::controllers::{ReconcileError, WATCH_FILTER_LABEL};
use crate::pki::apiserver_service_host;
use crate::plan::{APISERVER_PORT, ComponentRequest, Plan, Running, component_applyset_id, first_plan};

/// The component resources of one control plane, as this pass found, created or adopted
/// them; `None` for one the spec names that does not exist.
#[derive(Default)]
pub(super) struct Components {
    pub etcd: Option<NestedEtcd>,
    pub apiserver: Option<NestedAPIServer>,
    pub controller_manager: Option<NestedControllerManager>,
}

/// The fields of capn's own patch to the control plane's spec: the references to the
/// components this pass named, and the endpoint once it is known.
pub(super) type SpecPatch = serde_json::Map<String, serde_json::Value>;

/// Finds, adopts or creates the three components, at once (they are independent of one
/// another). Returns them, and the references to those this pass named.
///
/// # Errors
/// API errors.
pub(super) async fn ensure(round: &Round<'_>) -> Result<(Components, SpecPatch), ReconcileError> {
    let ((etcd, etcd_named), (apiserver, apiserver_named), (controller_manager, controller_manager_named)) = futures::try_join!(
        ensure_component::<NestedEtcd>(round),
        ensure_component::<NestedAPIServer>(round),
        ensure_component::<NestedControllerManager>(round),
    )?;
    let mut references = SpecPatch::new();
    references.extend(etcd_named);
    references.extend(apiserver_named);
    references.extend(controller_manager_named);
    let components = Components {
        etcd,
        apiserver,
        controller_manager,
    };
    Ok((components, references))
}

/// The scale subresource: the control plane's replicas are the apiserver's.
///
/// # Errors
/// API errors.
pub(super) async fn follow_replicas(round: &Round<'_>, components: &mut Components) -> Result<(), ReconcileError> {
    if let (Some(replicas), Some(a)) = (round.ncp.spec.replicas, components.apiserver.as_ref())
        && a.spec.component.replicas != Some(replicas)
    {
        let api: Api<NestedAPIServer> = Api::namespaced(round.ctx.client.clone(), round.ns);
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        components.apiserver = Some(
            api.patch(&a.name_any(), &update_params(), &Patch::Merge(&patch))
                .await?,
        );
    }
    Ok(())
}

/// `spec.replicas` when the user left it unset: the apiserver's replicas (its own, else 1),
/// recorded in capn's spec patch. The scale subresource reads `.spec.replicas`, and the API
/// server answers a GET of `/scale` with an error while that field is absent, so without
/// this `kubectl get --subresource=scale`, a HorizontalPodAutoscaler and Cluster API could
/// not read a new control plane's scale (found by the HPA test). From then on the control
/// plane's replicas are the apiserver's ([`follow_replicas`]), as in Cluster API's
/// KubeadmControlPlane, whose webhook defaults `replicas` to 1.
pub(super) fn record_replicas(round: &Round<'_>, components: &Components, references: &mut SpecPatch) {
    if round.ncp.spec.replicas.is_some() {
        return;
    }
    if let Some(apiserver) = components.apiserver.as_ref() {
        let replicas = apiserver.spec.component.replicas.unwrap_or(1);
        references.insert("replicas".into(), serde_json::json!(replicas));
    }
}

/// The endpoint (CAPI contract: the control plane provider fills it): the apiserver
/// Service's name and port, once the apiserver reports its Service or, for an apiserver
/// this pass named, once its first plan renders that Service. Both are known before the
/// Service exists, and so a new endpoint goes into `references`, out in the same patch.
pub(super) fn endpoint(round: &Round<'_>, components: &Components, references: &mut SpecPatch) -> Option<ApiEndpoint> {
    if let Some(endpoint) = &round.ncp.spec.control_plane_endpoint {
        return Some(endpoint.clone());
    }
    let named_now = references.contains_key(NestedAPIServer::REFERENCE_FIELD);
    let port = apiserver_service_port(round, components.apiserver.as_ref()?, named_now)?;
    let endpoint = ApiEndpoint {
        host: apiserver_service_host(&round.cluster.name, round.ns),
        port,
    };
    references.insert(
        "controlPlaneEndpoint".into(),
        serde_json::to_value(&endpoint).unwrap_or_default(),
    );
    Some(endpoint)
}

/// capn's one patch to the control plane's spec, when it has something to record. Returns
/// the generation of the patched spec when the patch was its only change since this pass
/// read it (exactly one more: nobody else changed the spec meanwhile).
///
/// # Errors
/// API errors.
pub(super) async fn record(round: &Round<'_>, references: SpecPatch) -> Result<Option<i64>, ReconcileError> {
    if references.is_empty() {
        return Ok(None);
    }
    let api: Api<NestedControlPlane> = Api::namespaced(round.ctx.client.clone(), round.ns);
    let patched = api
        .patch(
            &round.ncp.name_any(),
            &update_params(),
            &Patch::Merge(serde_json::json!({"spec": references})),
        )
        .await?;
    Ok(patched.meta().generation.filter(|g| Some(*g - 1) == round.generation))
}

/// The port of the apiserver's Service (`<c>-apiserver`): as the apiserver reports it, or,
/// for an apiserver the control plane named in this pass (`named_now`: created, or found by
/// its owner reference) that has no status yet,
/// [`APISERVER_PORT`] when its first plan renders that Service. `None` otherwise (a
/// provider's channel may render none).
fn apiserver_service_port(round: &Round<'_>, apiserver: &NestedAPIServer, named_now: bool) -> Option<i32> {
    if let Some(service) = apiserver.status.as_ref().and_then(|s| s.service.as_ref()) {
        return Some(service.port);
    }
    if !named_now || apiserver.status.is_some() {
        return None;
    }
    let name = crate::component::ComponentKind::ApiServer.object_name(&round.cluster.name);
    first_plan_of(round, apiserver)?
        .objects
        .iter()
        .any(|o| o["kind"] == "Service" && o["metadata"]["name"] == name.as_str())
        .then_some(APISERVER_PORT)
}

/// The first round's plan of a component about to be created, or just created
/// ([`first_plan`]), with the settings its own reconcile uses.
fn first_plan_of<K: ComponentResource>(round: &Round<'_>, fresh: &K) -> Option<Plan> {
    let mut cluster = round.cluster.clone();
    cluster.network_policy.capn = round.ctx.settings.capn_pods.clone();
    cluster.kubernetes_version = crate::upgrade::components_version(round.ncp);
    let name = fresh.name_any();
    let request = ComponentRequest {
        kind: K::KIND,
        resource_name: &name,
        spec: fresh.component(),
        etcd_storage: fresh.etcd_storage(),
        etcd_restore: None,
        // Without a uid (perhaps not created yet): nothing the control plane reads from
        // this plan, its kinds and Services, depends on it.
        owner: OwnerReference {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            name: name.clone(),
            uid: String::new(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
        running: Running::default(),
        audit: None,
        authentication: None,
        authorization: None,
        referenced: Default::default(),
    };
    first_plan(&round.ctx.channels, &cluster, &request)
}

/// Finds, adopts or creates the component of kind `K`. Returns it (`None` when the spec
/// names one that does not exist: reported, not created, since the user asked for that
/// one), and the reference to record when this pass named it.
async fn ensure_component<K: ComponentResource>(
    round: &Round<'_>,
) -> Result<(Option<K>, Option<(String, serde_json::Value)>), ReconcileError> {
    let owner = controller_reference(round.ncp).ok_or(ReconcileError::NoNamespace)?;
    let cache = K::cache(&round.ctx.caches);
    let (component, named) = match K::reference(round.ncp) {
        Some(name) => (
            cache.get(&ObjectRef::new(name).within(round.ns)).map(|c| (*c).clone()),
            None,
        ),
        None => {
            let component = match owned_by_control_plane::<K>(round) {
                Some(c) => c,
                None => create(round, fresh::<K>(round, &owner)).await?,
            };
            let reference = serde_json::json!({"name": component.name_any()});
            (Some(component), Some((K::REFERENCE_FIELD.to_string(), reference)))
        }
    };
    match component {
        Some(component) => Ok((Some(adopt(round, component, owner).await?), named)),
        None => Ok((None, named)),
    }
}

/// A component in the namespace that points back at this control plane, from the cache.
fn owned_by_control_plane<K: ComponentResource>(round: &Round<'_>) -> Option<K> {
    let uid = round.ncp.uid().unwrap_or_default();
    K::cache(&round.ctx.caches)
        .find(|c| c.namespace().as_deref() == Some(round.ns) && c.owner_references().iter().any(|o| o.uid == uid))
        .map(|c| (*c).clone())
}

/// A new component with defaults, owned by the control plane and labelled as its own: the
/// cluster's name, the control plane's watch filter (components go to the same capn
/// instance as their control plane), and its ApplySet when its first plan has objects.
fn fresh<K: ComponentResource>(round: &Round<'_>, owner: &OwnerReference) -> K {
    let mut fresh = K::with_defaults(&format!("{}-{}", round.ncp.name_any(), K::KIND.as_str()));
    fresh.meta_mut().owner_references = Some(vec![owner.clone()]);
    let mut labels = BTreeMap::from([(CLUSTER_NAME_LABEL.to_string(), round.cluster.name.clone())]);
    if let Some(filter) = round.ncp.labels().get(WATCH_FILTER_LABEL) {
        labels.insert(WATCH_FILTER_LABEL.to_string(), filter.clone());
    }
    if let Some(group_kinds) = first_plan_of(round, &fresh).map(|p| p.contains_group_kinds()) {
        labels.insert(
            ID_LABEL.to_string(),
            component_applyset_id(K::KIND, &fresh.name_any(), round.ns),
        );
        fresh.meta_mut().annotations = Some(BTreeMap::from([
            (TOOLING_ANNOTATION.to_string(), tooling()),
            (CONTAINS_GROUP_KINDS_ANNOTATION.to_string(), group_kinds),
        ]));
    }
    fresh.meta_mut().labels = Some(labels);
    fresh
}

/// Creates `fresh`; one of its name created meanwhile (the cache had not shown it yet) is
/// read instead.
async fn create<K: ComponentResource>(round: &Round<'_>, fresh: K) -> Result<K, ReconcileError> {
    let api: Api<K> = Api::namespaced(round.ctx.client.clone(), round.ns);
    match api.create(&create_params(), &fresh).await {
        Ok(c) => Ok(c),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(api.get(&fresh.name_any()).await?),
        Err(e) => Err(e.into()),
    }
}

/// Adopts `component`: like a ReplicaSet re-associating with its Deployment, unless another
/// controller owns it. A component follows its control plane's watch filter, so that the
/// same capn instance reconciles both.
async fn adopt<K: ComponentResource>(
    round: &Round<'_>,
    component: K,
    owner: OwnerReference,
) -> Result<K, ReconcileError> {
    let uid = round.ncp.uid().unwrap_or_default();
    let needs_owner = !component.owner_references().iter().any(|o| o.uid == uid)
        && !component.owner_references().iter().any(|o| o.controller == Some(true));
    let filter = round.ncp.labels().get(WATCH_FILTER_LABEL);
    let needs_label = filter.is_some() && component.labels().get(WATCH_FILTER_LABEL) != filter;
    if !needs_owner && !needs_label {
        return Ok(component);
    }
    let mut metadata = serde_json::json!({"resourceVersion": component.resource_version()});
    if needs_owner {
        let mut owners = component.owner_references().to_vec();
        owners.push(owner);
        metadata["ownerReferences"] = serde_json::to_value(owners).unwrap_or_default();
    }
    if let Some(filter) = filter.filter(|_| needs_label) {
        metadata["labels"] = serde_json::json!({WATCH_FILTER_LABEL: filter});
    }
    let api: Api<K> = Api::namespaced(round.ctx.client.clone(), round.ns);
    let adopted = api
        .patch(
            &component.name_any(),
            &update_params(),
            &Patch::Merge(&serde_json::json!({"metadata": metadata})),
        )
        .await?;
    tracing::info!(kind = K::KIND.resource_kind(), name = %adopted.name_any(), "adopted component");
    Ok(adopted)
}
