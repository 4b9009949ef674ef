//! NestedEtcd specifics: the etcd server/peer certificate, whose SANs follow the member
//! count (reference.md "etcd certificate").

use super::ReconcileError;
use super::certificates::{CertificateStore, waiting_for_ca};
use super::component::Gate;
use crate::pki::{SecretNames, etcd_server_leaf};
use crate::plan::{ClusterSettings, Plan, Upstream};

/// Issues `<c>-etcd-server` (server and client usage; every member's names) before the
/// StatefulSet is applied. Waits while the etcd CA does not exist.
///
/// # Errors
/// API and PKI errors.
pub async fn ensure_certificates(
    store: &CertificateStore<'_>,
    cluster: &ClusterSettings,
    plan: &Plan,
) -> Result<Gate, ReconcileError> {
    let names = SecretNames::new(&cluster.name);
    let Some(etcd_ca) = store.require_ca(&names.etcd_ca).await? else {
        return Ok(waiting_for_ca(&names.etcd_ca));
    };
    let replicas = u32::try_from(plan.replicas).unwrap_or(1);
    let leaf = etcd_server_leaf(&cluster.name, &cluster.namespace, &cluster.super_dns_domain, replicas);
    store.ensure_leaf(&names.etcd_server, &etcd_ca, &leaf).await?;
    Ok(Gate::Open(Upstream::default()))
}
