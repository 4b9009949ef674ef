//! The CustomResourceDefinitions generated from the [`crate::api`] types: what `capn crds`
//! prints and `crds/` holds. The schemas carry the admission rules of [`crate::validate`]
//! (CEL, patterns), so that the apiserver refuses what the controllers would.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSON};
use kube::CustomResourceExt;

use crate::api::{
    CONTRACT_LABELS, CONTROL_PLANE_GROUP, NestedAPIServer, NestedCluster, NestedClusterTemplate, NestedControlPlane,
    NestedControlPlaneTemplate, NestedControllerManager, NestedEtcd,
};

/// Every CRD capn serves, in a stable order (what `capn crds` prints and `crds/` holds).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        NestedControlPlane::crd(),
        NestedEtcd::crd(),
        NestedAPIServer::crd(),
        NestedControllerManager::crd(),
        NestedCluster::crd(),
        NestedControlPlaneTemplate::crd(),
        NestedClusterTemplate::crd(),
    ];
    for crd in &mut crds {
        // Every spec field is optional, so an object without `spec` is valid too
        // (kube-derive marks `spec` required).
        for version in &mut crd.spec.versions {
            if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
                if let Some(required) = schema.required.as_mut() {
                    required.retain(|r| r != "spec");
                }
                // ...and the apiserver fills in `spec: {}`, which the Rust types need.
                if let Some(spec) = schema.properties.as_mut().and_then(|p| p.get_mut("spec"))
                    && spec.required.as_ref().is_none_or(|r| r.is_empty())
                {
                    spec.default = Some(JSON(serde_json::json!({})));
                }
                // Admission-time validation from the one rule table (crate::validate).
                if let Some(kind) = crate::validate::Kind::from_name(&crd.spec.names.kind)
                    && let Ok(mut json) = serde_json::to_value(&*schema)
                {
                    crate::validate::extend_schema(kind, &mut json);
                    if let Ok(extended) = serde_json::from_value(json) {
                        *schema = extended;
                    }
                }
            }
        }
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        for (k, v) in CONTRACT_LABELS {
            labels.insert(k.to_string(), v.to_string());
        }
        // Component resources are the parents of their objects' ApplySets (KEP-3659).
        if crd.spec.group == CONTROL_PLANE_GROUP
            && crd.spec.names.kind.starts_with("Nested")
            && !crd.spec.names.kind.starts_with("NestedControlPlane")
        {
            labels.insert("applyset.kubernetes.io/is-parent-type".into(), "true".into());
        }
    }
    crds
}

/// Renders [`crds`] as one multi-document YAML stream, as kept in `crds/`.
///
/// # Errors
/// Only if serialization fails, which would be a bug in the types.
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

/// The file name of `crd` in `crds/`: `<group>_<plural>.yaml` (kubebuilder's layout).
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{Kind, RULES};

    /// `crds/` must be exactly what the code generates. Regenerate with
    /// `UPDATE_CRDS=1 cargo test --lib crds_directory`.
    #[test]
    fn crds_directory_matches_generated_crds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
        let mut expected = std::collections::BTreeSet::new();
        for crd in crds() {
            let name = crd_file_name(&crd);
            let text = format!("---\n{}", serde_saphyr::to_string(&crd).unwrap());
            crate::generated::assert_current(
                &format!("crds/{name}"),
                &text,
                "UPDATE_CRDS",
                "cargo test --lib crds_directory",
            );
            expected.insert(name);
        }
        let present: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(present, expected, "crds/ holds files the code does not generate");
    }

    #[test]
    fn crds_carry_contract_labels_status_and_printer_columns() {
        for crd in crds() {
            let labels = crd.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
                Some("v1beta1"),
                "{}",
                crd.spec.names.kind
            );
            let version = &crd.spec.versions[0];
            if crd.spec.names.kind.ends_with("Template") {
                continue;
            }
            assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
            let columns: Vec<String> = version
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect();
            assert!(
                columns.contains(&"Ready".to_string()) && columns.contains(&"Age".to_string()),
                "{columns:?}"
            );
        }
    }

    #[test]
    fn component_spec_flattens_into_the_kind_spec() {
        let etcd: NestedEtcd = serde_json::from_value(serde_json::json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "NestedEtcd",
            "metadata": {"name": "e"},
            "spec": {"version": "3.6", "replicas": 3, "extraArgs": {"quota-backend-bytes": "8589934592"},
                     "storage": {"size": "5Gi"}}
        }))
        .unwrap();
        assert_eq!(etcd.spec.component.replicas, Some(3));
        assert_eq!(etcd.spec.component.extra_args["quota-backend-bytes"], "8589934592");
        assert_eq!(etcd.spec.storage.unwrap().size.unwrap().0, "5Gi");
    }

    /// Every NestedControlPlane and component object lives in a watch cache for as long as
    /// it exists (the caches are the larger half of capn's heap at a
    /// thousand control planes). What few objects set (backups, restores, resources,
    /// upgrades, CA rotations) is boxed, so an object without it keeps no room for it; each
    /// bound is the jemalloc size class the object fits (1792, 1280 and 1536 bytes unboxed).
    /// `size` (issue 40 item 3) took the apiserver's and controller-manager's from 896 to
    /// the next class, 1024: 128 bytes more per object, 250 KiB at a thousand control
    /// planes, for a field every component has (a box would still have crossed 896). With
    /// `size` and `defragmentation` (boxed) the NestedEtcd crossed 1024 by 8 bytes: the
    /// next class, 1280, costs 256 bytes per tenant (one NestedEtcd each), 250 KiB at a
    /// thousand. `size` and `hibernation` (boxed, spec and status) took the
    /// NestedControlPlane past 1280 by 16 bytes, to 1536: another 250 KiB at a thousand.
    #[test]
    fn cached_kinds_keep_what_few_objects_set_out_of_line() {
        use std::mem::size_of;
        assert!(size_of::<NestedEtcd>() <= 1280, "{}", size_of::<NestedEtcd>());
        assert!(size_of::<NestedAPIServer>() <= 1024, "{}", size_of::<NestedAPIServer>());
        assert!(
            size_of::<NestedControllerManager>() <= 1024,
            "{}",
            size_of::<NestedControllerManager>()
        );
        assert!(
            size_of::<NestedControlPlane>() <= 1536,
            "{}",
            size_of::<NestedControlPlane>()
        );
    }

    #[test]
    fn every_rule_path_exists_in_the_generated_schema() {
        for crd in crds() {
            let Some(kind) = Kind::from_name(&crd.spec.names.kind) else {
                continue;
            };
            let mut schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap()["openAPIV3Schema"].clone();
            for rule in RULES.iter().filter(|r| r.kinds.contains(&kind)) {
                if rule.path.starts_with("metadata.") {
                    continue;
                }
                assert!(
                    crate::validate::schema_at(&mut schema, rule.path).is_some(),
                    "{} has no {} in its schema",
                    kind.as_str(),
                    rule.path
                );
            }
        }
    }

    #[test]
    fn crds_carry_every_rule_with_its_message() {
        for crd in crds() {
            let Some(kind) = Kind::from_name(&crd.spec.names.kind) else {
                continue;
            };
            let text = serde_json::to_string(&crd).unwrap();
            for rule in RULES.iter().filter(|r| r.kinds.contains(&kind)) {
                for cel in rule.syntax.cel() {
                    let escaped = serde_json::to_string(cel.message).unwrap();
                    assert!(
                        text.contains(escaped.trim_matches('"')),
                        "{} lacks the rule of {}",
                        kind.as_str(),
                        rule.path
                    );
                }
            }
        }
    }
}
