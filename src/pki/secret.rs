//! Encoding of PKI material as Cluster API Secrets (docs/design.md §6, docs/reference.md "Cluster API
//! secrets"). Owner references are set by the caller.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{KeyPairPem, PkiError};

/// Secret type of every PKI Secret, the one Cluster API uses for its certificate and
/// kubeconfig Secrets.
pub const SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// Label naming the cluster a Secret belongs to (Cluster API contract).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// Data key of the certificate (or, in `<c>-sa`, the public key) PEM.
pub const TLS_CERT_KEY: &str = "tls.crt";

/// Data key of the private key PEM.
pub const TLS_KEY_KEY: &str = "tls.key";

/// Data key of a kubeconfig Secret's kubeconfig (Cluster API's `<c>-kubeconfig` convention).
pub const KUBECONFIG_KEY: &str = "value";

/// Names of a cluster's PKI Secrets (docs/design.md §6 table), all `<c>-<suffix>` in the cluster's
/// namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretNames {
    /// `<c>-ca`: cluster CA.
    pub ca: String,
    /// `<c>-etcd`: etcd CA.
    pub etcd_ca: String,
    /// `<c>-proxy`: front-proxy CA.
    pub proxy_ca: String,
    /// `<c>-sa`: service-account key pair (`tls.crt` = public key).
    pub sa: String,
    /// `<c>-apiserver`: apiserver serving certificate.
    pub apiserver: String,
    /// `<c>-apiserver-etcd-client`: the apiserver's etcd client certificate.
    pub apiserver_etcd_client: String,
    /// `<c>-etcd-server`: etcd server and peer certificate.
    pub etcd_server: String,
    /// `<c>-apiserver-kubelet-client`: the apiserver's kubelet client certificate.
    pub apiserver_kubelet_client: String,
    /// `<c>-front-proxy-client`: the apiserver's front-proxy client certificate.
    pub front_proxy_client: String,
    /// `<c>-controller-manager-kubeconfig`: the controller-manager's kubeconfig.
    pub controller_manager_kubeconfig: String,
    /// `<c>-kubeconfig`: the admin kubeconfig Cluster API hands to users.
    pub kubeconfig: String,
    /// `<c>-encryption`: the apiserver's `EncryptionConfiguration` with its keys
    /// ([`super::encryption`]).
    pub encryption: String,
}

impl SecretNames {
    /// The suffixes after `<c>-`, in the table's order (docs/design.md §6).
    pub const SUFFIXES: [&'static str; 12] = [
        "ca",
        "etcd",
        "proxy",
        "sa",
        "apiserver",
        "apiserver-etcd-client",
        "etcd-server",
        "apiserver-kubelet-client",
        "front-proxy-client",
        "controller-manager-kubeconfig",
        "kubeconfig",
        "encryption",
    ];

    /// The Secret names of cluster `cluster_name` (docs/design.md §6).
    pub fn new(cluster_name: &str) -> Self {
        let [
            ca,
            etcd_ca,
            proxy_ca,
            sa,
            apiserver,
            apiserver_etcd_client,
            etcd_server,
            apiserver_kubelet_client,
            front_proxy_client,
            controller_manager_kubeconfig,
            kubeconfig,
            encryption,
        ] = Self::SUFFIXES.map(|suffix| format!("{cluster_name}-{suffix}"));
        SecretNames {
            ca,
            etcd_ca,
            proxy_ca,
            sa,
            apiserver,
            apiserver_etcd_client,
            etcd_server,
            apiserver_kubelet_client,
            front_proxy_client,
            controller_manager_kubeconfig,
            kubeconfig,
            encryption,
        }
    }

    /// Every name, in the table's order.
    pub fn all(&self) -> [&str; 12] {
        [
            &self.ca,
            &self.etcd_ca,
            &self.proxy_ca,
            &self.sa,
            &self.apiserver,
            &self.apiserver_etcd_client,
            &self.etcd_server,
            &self.apiserver_kubelet_client,
            &self.front_proxy_client,
            &self.controller_manager_kubeconfig,
            &self.kubeconfig,
            &self.encryption,
        ]
    }

    /// The cluster names that have a Secret called `secret_name` in the table above
    /// (`demo-etcd-server` → `demo`). A name can fit more than one cluster
    /// (`p-controller-manager-kubeconfig` is cluster `p`'s controller-manager kubeconfig and
    /// cluster `p-controller-manager`'s admin kubeconfig), so every fit is listed.
    pub fn clusters_of(secret_name: &str) -> impl Iterator<Item = &str> {
        Self::SUFFIXES.into_iter().filter_map(move |suffix| {
            secret_name
                .strip_suffix(suffix)
                .and_then(|rest| rest.strip_suffix('-'))
                .filter(|cluster| !cluster.is_empty())
        })
    }
}

pub(super) fn secret(name: &str, namespace: &str, cluster_name: &str, data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_string(),
                cluster_name.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.to_string()),
        data: Some(data),
        ..Secret::default()
    }
}

/// A Secret holding `pair` as `tls.crt` and `tls.key`, of type [`SECRET_TYPE`] and labelled
/// [`CLUSTER_NAME_LABEL`]`: <cluster_name>` (docs/design.md §6). Used for CAs, leaves and the
/// service-account pair. No owner reference: the caller sets it.
pub fn tls_secret(name: &str, namespace: &str, cluster_name: &str, pair: &KeyPairPem) -> Secret {
    secret(
        name,
        namespace,
        cluster_name,
        BTreeMap::from([
            (TLS_CERT_KEY.to_string(), ByteString(pair.cert_pem.as_bytes().to_vec())),
            (TLS_KEY_KEY.to_string(), ByteString(pair.key_pem.as_bytes().to_vec())),
        ]),
    )
}

/// A Secret holding `kubeconfig` under the single key `value`, of type [`SECRET_TYPE`] and
/// labelled [`CLUSTER_NAME_LABEL`]`: <cluster_name>` (Cluster API's `<c>-kubeconfig`
/// convention, docs/design.md §6). No owner reference: the caller sets it.
pub fn kubeconfig_secret(name: &str, namespace: &str, cluster_name: &str, kubeconfig: &str) -> Secret {
    secret(
        name,
        namespace,
        cluster_name,
        BTreeMap::from([(KUBECONFIG_KEY.to_string(), ByteString(kubeconfig.as_bytes().to_vec()))]),
    )
}

/// Reads `key` from `data`, falling back to `stringData` (set on Secrets built locally, never
/// returned by the API server).
pub(super) fn value(secret: &Secret, key: &str) -> Result<String, PkiError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
        .filter(|b| !b.is_empty())
        .ok_or_else(|| PkiError::MissingKey {
            secret: name.clone(),
            key: key.to_string(),
        })?;
    String::from_utf8(bytes).map_err(|_| PkiError::invalid_pem(&format!("secret {name:?} key {key:?}"), "not UTF-8"))
}

/// The PEM pair stored in a Secret's `tls.crt` and `tls.key` (CA, leaf or service-account
/// Secret). The contents are not parsed here: [`super::CertificateAuthority::from_pem`] and
/// [`super::needs_reissue`] do that.
///
/// Errors: [`PkiError::MissingKey`] when `tls.crt` or `tls.key` is absent or empty;
/// [`PkiError::InvalidPem`] when a value is not UTF-8.
pub fn key_pair_from_secret(secret: &Secret) -> Result<KeyPairPem, PkiError> {
    Ok(KeyPairPem {
        cert_pem: value(secret, TLS_CERT_KEY)?,
        key_pem: value(secret, TLS_KEY_KEY)?,
    })
}

/// The kubeconfig stored in a kubeconfig Secret's `value`.
///
/// Errors: [`PkiError::MissingKey`] when `value` is absent or empty; [`PkiError::InvalidPem`]
/// when it is not UTF-8.
pub fn kubeconfig_from_secret(secret: &Secret) -> Result<String, PkiError> {
    value(secret, KUBECONFIG_KEY)
}
