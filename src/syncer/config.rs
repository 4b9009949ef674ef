//! ConfigMaps and Secrets (docs/design.md §11 "Pods"): copied into the workload namespace
//! while a pod uses them, not one per tenant object. A tenant namespace holds many that no
//! pod mounts (Helm release records, certificates of controllers); copying those would put
//! tenant secrets where nothing needs them. The pod's pass copies what its pod refers to
//! ([`ResourceSyncer::references`]) before the pod, through these two syncers' rules; the
//! patrol deletes a copy no super pod refers to any more.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::diff::metadata_drift;
use super::names::tenancy::{MissingField, super_metadata};
use super::names::{ControlPlaneRef, NameLimit};
use super::resource::ResourceSyncer;

/// The legacy service-account token Secret type: a copy of one is made `Opaque`, so that
/// the super cluster's token controller never fills it with a super-cluster token.
const SERVICE_ACCOUNT_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

/// The syncer of the ConfigMaps pods use: data and binary data as the tenant's.
pub struct ConfigMaps;

impl ResourceSyncer for ConfigMaps {
    type Object = ConfigMap;

    fn dynamic_type(&self) {}

    fn api(&self, client: kube::Client, namespace: &str) -> kube::Api<ConfigMap> {
        kube::Api::namespaced(client, namespace)
    }

    fn name_limit(&self) -> NameLimit {
        NameLimit::Subdomain
    }

    /// The copy is never `immutable`: a tenant that deletes and re-makes an immutable
    /// ConfigMap of the same name with other data needs its copy applied again.
    fn copy(&self, control_plane: &ControlPlaneRef, source: &ConfigMap) -> Result<Option<ConfigMap>, MissingField> {
        Ok(Some(ConfigMap {
            metadata: super_metadata(control_plane, NameLimit::Subdomain, &source.metadata)?,
            data: source.data.clone(),
            binary_data: source.binary_data.clone(),
            immutable: None,
        }))
    }

    fn is_current(&self, desired: &ConfigMap, live: &ConfigMap) -> bool {
        live.data == desired.data
            && live.binary_data == desired.binary_data
            && metadata_drift(&desired.metadata, &live.metadata).is_empty()
    }
}

/// The syncer of the Secrets pods use: data and type as the tenant's, except that a legacy
/// service-account token Secret becomes `Opaque` (its data is the *tenant's* token).
pub struct Secrets;

impl ResourceSyncer for Secrets {
    type Object = Secret;

    fn dynamic_type(&self) {}

    fn api(&self, client: kube::Client, namespace: &str) -> kube::Api<Secret> {
        kube::Api::namespaced(client, namespace)
    }

    fn name_limit(&self) -> NameLimit {
        NameLimit::Subdomain
    }

    fn copy(&self, control_plane: &ControlPlaneRef, source: &Secret) -> Result<Option<Secret>, MissingField> {
        let type_ = source
            .type_
            .clone()
            .filter(|t| t != SERVICE_ACCOUNT_TOKEN_TYPE)
            .or_else(|| Some("Opaque".to_owned()));
        Ok(Some(Secret {
            metadata: super_metadata(control_plane, NameLimit::Subdomain, &source.metadata)?,
            data: source.data.clone(),
            type_,
            ..Secret::default()
        }))
    }

    fn is_current(&self, desired: &Secret, live: &Secret) -> bool {
        live.data == desired.data
            && live.type_ == desired.type_
            && metadata_drift(&desired.metadata, &live.metadata).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn control_plane() -> ControlPlaneRef {
        ControlPlaneRef::new("tenants", "demo")
    }

    fn secret(type_: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "default", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "web"}},
            "type": type_,
            "data": {"token": "dGVuYW50"},
        }))
        .unwrap()
    }

    #[test]
    fn a_legacy_token_secret_is_copied_opaque_and_others_keep_their_type() {
        let copy = Secrets
            .copy(&control_plane(), &secret(SERVICE_ACCOUNT_TOKEN_TYPE))
            .unwrap()
            .unwrap();
        assert_eq!(copy.type_.as_deref(), Some("Opaque"));
        assert_eq!(copy.data, secret("x").data);
        assert_eq!(
            copy.metadata.namespace.as_deref(),
            Some(control_plane().workload_namespace().as_str())
        );
        let tls = Secrets
            .copy(&control_plane(), &secret("kubernetes.io/tls"))
            .unwrap()
            .unwrap();
        assert_eq!(tls.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_ne!(tls.metadata.name.as_deref(), Some("s"), "copies carry the mapped name");
    }

    #[test]
    fn a_copy_is_current_until_the_tenant_data_or_labels_change_and_super_additions_do_not_count() {
        let desired = Secrets.copy(&control_plane(), &secret("Opaque")).unwrap().unwrap();
        let mut live = desired.clone();
        live.metadata.resource_version = Some("99".to_owned());
        live.metadata.uid = Some("super-uid".to_owned());
        assert!(Secrets.is_current(&desired, &live));
        let mut changed = secret("Opaque");
        changed.data = Some(BTreeMap::from([("token".to_owned(), ByteString(b"other".to_vec()))]));
        let wanted = Secrets.copy(&control_plane(), &changed).unwrap().unwrap();
        assert!(!Secrets.is_current(&wanted, &live), "new tenant data goes down");
        let mut relabelled = secret("Opaque");
        relabelled.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "db".to_owned())]));
        let wanted = Secrets.copy(&control_plane(), &relabelled).unwrap().unwrap();
        assert!(!Secrets.is_current(&wanted, &live), "a tenant label change goes down");
    }

    #[test]
    fn a_config_map_copy_is_never_immutable_and_compares_both_kinds_of_data() {
        let source: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "default", "uid": "u2"},
            "immutable": true,
            "data": {"a": "1"},
            "binaryData": {"b": "AA=="},
        }))
        .unwrap();
        let copy = ConfigMaps.copy(&control_plane(), &source).unwrap().unwrap();
        assert_eq!(copy.immutable, None);
        assert!(ConfigMaps.is_current(&copy, &copy.clone()));
        let mut live = copy.clone();
        live.binary_data = None;
        assert!(!ConfigMaps.is_current(&copy, &live));
    }

    #[test]
    fn an_object_without_its_identity_is_not_copied() {
        let mut nameless = secret("Opaque");
        nameless.metadata.uid = None;
        assert!(Secrets.copy(&control_plane(), &nameless).is_err());
    }
}
