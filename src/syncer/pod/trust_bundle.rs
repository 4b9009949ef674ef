//! Projected `clusterTrustBundle` sources: the *tenant's* ClusterTrustBundles, through a
//! ConfigMap.
//!
//! The kubelet fills a `clusterTrustBundle` source from the ClusterTrustBundles of its own
//! cluster (KEP-3257); the super kubelet would mount the super cluster's, which a tenant
//! neither wrote nor may read. So, as for tokens ([`super::token`]), the controller resolves
//! each source against the tenant's ClusterTrustBundles ([`resolve`], the rules of the
//! kubelet's `pkg/kubelet/clustertrustbundle`) and writes the result into one ConfigMap per
//! pod, which the super pod mounts.
//!
//! Each source becomes a projected `configMap` source in the *same* volume (so it can share
//! the mount with the volume's other sources), of key `<volume name>.<source index>` and the
//! source's `path`, never `optional`: a source the tenant's bundles do not satisfy has no
//! key, so the super kubelet refuses to mount the volume and the pod waits in
//! `ContainerCreating`, as on a kubelet of the tenant; an `optional` one that matches nothing
//! gets an empty file, as there. The ConfigMap is owned by the super pod (it goes with it),
//! and its name is no mapped name (`ControlPlaneRef::trust_bundle_config_map_name`), so the
//! orphan search among synced ConfigMaps never takes it for a copy.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMapProjection, KeyToPath, PodSpec, VolumeProjection};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use crate::syncer::names::ControlPlaneRef;
use crate::syncer::names::tenancy::TenantObject;

/// The ConfigMap that carries a pod's trust bundles, and what goes in it.
#[derive(Clone, Debug, PartialEq)]
pub struct TrustBundles {
    /// Its name in the workload namespace ([`ControlPlaneRef::trust_bundle_config_map_name`]).
    pub name: String,
    /// One source per key.
    pub sources: Vec<TrustBundleSource>,
}

/// One projected `clusterTrustBundle` source of the tenant pod.
#[derive(Clone, Debug, PartialEq)]
pub struct TrustBundleSource {
    /// The ConfigMap key its file comes from.
    pub key: String,
    /// Which of the tenant's ClusterTrustBundles it takes.
    pub selection: Selection,
    /// `optional`: an empty file, rather than no mount, when nothing matches.
    pub optional: bool,
}

/// How a source picks ClusterTrustBundles (the API's `name`, or `signerName` with
/// `labelSelector`).
#[derive(Clone, Debug, PartialEq)]
pub enum Selection {
    /// The bundle of this name, whatever its signer.
    Name(String),
    /// Every bundle of `signer_name` whose labels `selector` matches; no selector matches
    /// nothing, an empty one everything (the API reference of ClusterTrustBundleProjection).
    Signer {
        signer_name: String,
        selector: Option<LabelSelector>,
    },
}

/// A tenant ClusterTrustBundle, as resolution needs it (`certificates.k8s.io`, whichever
/// version the tenant serves: the fields are the same in v1alpha1, v1beta1 and v1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bundle {
    pub name: String,
    /// `spec.signerName`, empty for a bundle without one.
    pub signer_name: String,
    pub labels: BTreeMap<String, String>,
    /// `spec.trustBundle`: PEM `CERTIFICATE` blocks.
    pub trust_bundle: String,
}

/// What the ConfigMap holds: the file of every source that resolved, and why the others did
/// not (by key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    pub data: BTreeMap<String, String>,
    pub missing: BTreeMap<String, String>,
}

/// Replaces every projected `clusterTrustBundle` source of `spec` by a source of the trust
/// bundle ConfigMap of the tenant pod `identity`; `None` when the pod projects none.
pub(super) fn replace(
    spec: &mut PodSpec,
    control_plane: &ControlPlaneRef,
    identity: &TenantObject,
) -> Option<TrustBundles> {
    let name = control_plane.trust_bundle_config_map_name(&identity.namespace, &identity.name, &identity.uid);
    let mut found = Vec::new();
    for (key, source) in super::projected_sources_mut(spec) {
        let Some(projection) = source.cluster_trust_bundle.take() else {
            continue;
        };
        let selection = match (projection.name, projection.signer_name) {
            (Some(name), _) => Selection::Name(name),
            (None, signer_name) => Selection::Signer {
                signer_name: signer_name.unwrap_or_default(),
                selector: projection.label_selector,
            },
        };
        found.push(TrustBundleSource {
            key: key.clone(),
            selection,
            optional: projection.optional.unwrap_or(false),
        });
        *source = VolumeProjection {
            config_map: Some(ConfigMapProjection {
                name: name.clone(),
                items: Some(vec![KeyToPath {
                    key,
                    path: projection.path,
                    mode: None,
                }]),
                optional: Some(false),
            }),
            ..VolumeProjection::default()
        };
    }
    (!found.is_empty()).then_some(TrustBundles { name, sources: found })
}

/// The file of each source among the tenant's `bundles`, as the kubelet writes it
/// (`normalizeTrustAnchors`): the distinct certificates of every selected bundle, each as a
/// PEM `CERTIFICATE` block. The kubelet shuffles them once per start so that nothing comes
/// to depend on their order; they are sorted here (by DER, the kubelet's order before the
/// shuffle), so that the ConfigMap changes only when the bundles do. A source that selects
/// nothing is an empty file when `optional`, else `missing` with the kubelet's reason.
pub fn resolve(sources: &[TrustBundleSource], bundles: &[Bundle]) -> Resolved {
    let mut resolved = Resolved::default();
    for source in sources {
        match select(&source.selection, bundles) {
            Ok(selected) if !selected.is_empty() => {
                resolved.data.insert(source.key.clone(), normalize(&selected));
            }
            Ok(_) if source.optional => {
                resolved.data.insert(source.key.clone(), String::new());
            }
            Ok(_) => {
                let why = match &source.selection {
                    Selection::Name(name) => format!("ClusterTrustBundle {name:?} not found"),
                    Selection::Signer { .. } => {
                        "combination of signerName and labelSelector matched zero ClusterTrustBundles".to_owned()
                    }
                };
                resolved.missing.insert(source.key.clone(), why);
            }
            Err(why) => {
                resolved.missing.insert(source.key.clone(), why);
            }
        }
    }
    resolved
}

/// The bundles `selection` takes. Errors: a label selector that does not parse.
fn select<'a>(selection: &Selection, bundles: &'a [Bundle]) -> Result<Vec<&'a Bundle>, String> {
    match selection {
        Selection::Name(name) => Ok(bundles.iter().filter(|b| &b.name == name).collect()),
        Selection::Signer { selector: None, .. } => Ok(Vec::new()),
        Selection::Signer {
            signer_name,
            selector: Some(selector),
        } => {
            let selector = Selector::try_from(selector.clone()).map_err(|e| format!("invalid labelSelector: {e}"))?;
            Ok(bundles
                .iter()
                .filter(|b| &b.signer_name == signer_name && selector.matches(&b.labels))
                .collect())
        }
    }
}

/// The distinct certificates of `bundles`, sorted by DER, as LF-ended PEM blocks (Go's
/// `pem.EncodeToMemory`). A bundle's text that does not parse contributes what parsed of
/// it (the tenant apiserver has validated it already).
fn normalize(bundles: &[&Bundle]) -> String {
    let certificates: BTreeSet<Vec<u8>> = bundles
        .iter()
        .flat_map(|b| pem::parse_many(&b.trust_bundle).unwrap_or_default())
        .map(pem::Pem::into_contents)
        .collect();
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    certificates
        .into_iter()
        .map(|der| pem::encode_config(&pem::Pem::new("CERTIFICATE", der), config))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ClusterTrustBundleProjection, ProjectedVolumeSource};
    use serde_json::json;

    use super::*;

    /// A PEM certificate block of `der` (the resolution never parses the DER itself).
    fn block(der: &[u8]) -> String {
        pem::encode_config(
            &pem::Pem::new("CERTIFICATE", der.to_vec()),
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        )
    }

    fn bundle(name: &str, signer: &str, labels: &[(&str, &str)], certs: &[&[u8]]) -> Bundle {
        Bundle {
            name: name.to_owned(),
            signer_name: signer.to_owned(),
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            trust_bundle: certs.iter().map(|c| block(c)).collect(),
        }
    }

    fn source(selection: Selection, optional: bool) -> TrustBundleSource {
        TrustBundleSource {
            key: "k".to_owned(),
            selection,
            optional,
        }
    }

    fn by_signer(selector: Option<serde_json::Value>) -> Selection {
        Selection::Signer {
            signer_name: "example.com/one".to_owned(),
            selector: selector.map(|s| serde_json::from_value(s).unwrap()),
        }
    }

    fn bundles() -> Vec<Bundle> {
        vec![
            bundle(
                "one-a",
                "example.com/one",
                &[("alive", "true")],
                &[b"cert-b", b"cert-a"],
            ),
            // cert-a again: the file holds it once.
            bundle(
                "one-b",
                "example.com/one",
                &[("alive", "true")],
                &[b"cert-a", b"cert-c"],
            ),
            bundle("one-dead", "example.com/one", &[("alive", "false")], &[b"cert-d"]),
            bundle("two", "example.com/two", &[("alive", "true")], &[b"cert-e"]),
            bundle("plain", "", &[], &[b"cert-f"]),
        ]
    }

    #[test]
    fn a_signer_and_selector_take_the_distinct_certificates_of_every_match_sorted() {
        let sources = [source(
            by_signer(Some(json!({"matchLabels": {"alive": "true"}}))),
            false,
        )];
        let resolved = resolve(&sources, &bundles());
        let want = [block(b"cert-a"), block(b"cert-b"), block(b"cert-c")].concat();
        assert_eq!(resolved.data["k"], want);
        assert!(resolved.missing.is_empty());
        // The bundles' order does not change the file.
        let mut reversed = bundles();
        reversed.reverse();
        assert_eq!(resolve(&sources, &reversed), resolved);
    }

    #[test]
    fn an_empty_selector_takes_every_bundle_of_the_signer_and_none_takes_nothing() {
        let all = resolve(&[source(by_signer(Some(json!({}))), false)], &bundles());
        let want = [b"cert-a", b"cert-b", b"cert-c", b"cert-d"].map(|c| block(c)).concat();
        assert_eq!(all.data["k"], want, "signer two's bundle is not taken");
        let none = resolve(&[source(by_signer(None), false)], &bundles());
        assert!(none.data.is_empty());
        assert_eq!(
            none.missing["k"],
            "combination of signerName and labelSelector matched zero ClusterTrustBundles"
        );
    }

    #[test]
    fn an_optional_source_that_matches_nothing_is_an_empty_file() {
        for selection in [
            by_signer(None),
            by_signer(Some(json!({"matchLabels": {"alive": "unknown"}}))),
            Selection::Name("absent".to_owned()),
        ] {
            let resolved = resolve(&[source(selection.clone(), true)], &bundles());
            assert_eq!(resolved.data["k"], "", "{selection:?}");
            assert!(resolved.missing.is_empty());
        }
    }

    #[test]
    fn a_name_takes_that_bundle_whatever_its_signer() {
        let resolved = resolve(&[source(Selection::Name("plain".to_owned()), false)], &bundles());
        assert_eq!(resolved.data["k"], block(b"cert-f"));
        let absent = resolve(&[source(Selection::Name("absent".to_owned()), false)], &bundles());
        assert_eq!(absent.missing["k"], "ClusterTrustBundle \"absent\" not found");
    }

    #[test]
    fn every_source_becomes_a_key_of_the_pods_config_map_in_its_own_volume() {
        let mut spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "c"}],
            "volumes": [{"name": "ctb", "projected": {"defaultMode": 0o400, "sources": [
                {"configMap": {"name": "other"}},
                {"clusterTrustBundle": {"name": "plain", "path": "a.pem"}},
                {"clusterTrustBundle": {"signerName": "example.com/one", "labelSelector": {}, "path": "b.pem", "optional": true}},
            ]}}],
        }))
        .unwrap();
        let control_plane = ControlPlaneRef::new("default", "t1");
        let identity = TenantObject {
            namespace: "web".to_owned(),
            name: "p".to_owned(),
            uid: "uid-1".to_owned(),
        };
        let bundles = replace(&mut spec, &control_plane, &identity).expect("two sources");
        assert_eq!(
            bundles.name,
            control_plane.trust_bundle_config_map_name("web", "p", "uid-1")
        );
        assert_eq!(
            bundles.sources,
            [
                TrustBundleSource {
                    key: "ctb.1".to_owned(),
                    selection: Selection::Name("plain".to_owned()),
                    optional: false
                },
                TrustBundleSource {
                    key: "ctb.2".to_owned(),
                    selection: Selection::Signer {
                        signer_name: "example.com/one".to_owned(),
                        selector: Some(LabelSelector::default())
                    },
                    optional: true
                },
            ]
        );
        let projected: &ProjectedVolumeSource = spec.volumes.as_ref().unwrap()[0].projected.as_ref().unwrap();
        let sources = projected.sources.as_ref().unwrap();
        assert_eq!(
            sources[0].config_map.as_ref().unwrap().name,
            "other",
            "other sources stay"
        );
        for (source, (key, path)) in sources[1..].iter().zip([("ctb.1", "a.pem"), ("ctb.2", "b.pem")]) {
            assert_eq!(source.cluster_trust_bundle, None::<ClusterTrustBundleProjection>);
            let config_map = source.config_map.as_ref().unwrap();
            assert_eq!(config_map.name, bundles.name);
            assert_eq!(
                config_map.optional,
                Some(false),
                "a missing key keeps the volume from mounting"
            );
            let item = &config_map.items.as_ref().unwrap()[0];
            assert_eq!((item.key.as_str(), item.path.as_str()), (key, path));
        }
        assert_eq!(projected.default_mode, Some(0o400));
        let mut plain: PodSpec = serde_json::from_value(json!({"containers": [{"name": "c"}]})).unwrap();
        assert_eq!(replace(&mut plain, &control_plane, &identity), None);
    }
}
