//! The scope of one reconcile of a NestedControlPlane: what every stage reads, built once
//! per pass and handed to each stage (Cluster API's KubeadmControlPlane calls its own the
//! `ControlPlane` scope). The stages write only the status they are given alongside.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::api::{NestedControlPlane, NestedControlPlaneStatus};
use crate::controllers::Context;
use crate::controllers::round::Now;
use crate::controllers::shared::certificates::CertificateStore;
use crate::pki::{RenewalPolicy, SecretNames};
use crate::plan::ClusterSettings;
use crate::status::{ConditionUpdate, set_condition};

/// What a pass knows before it has checked the spec: enough to check it, not yet to touch
/// a certificate.
#[derive(Clone, Copy)]
pub(super) struct Inputs<'a> {
    pub ncp: &'a NestedControlPlane,
    pub ctx: &'a Context,
    pub ns: &'a str,
    pub cluster: &'a ClusterSettings,
    pub now: &'a Now,
}

/// One pass over a NestedControlPlane whose spec passed its checks.
pub(super) struct Round<'a> {
    pub ncp: &'a NestedControlPlane,
    pub ctx: &'a Context,
    pub ns: &'a str,
    pub cluster: &'a ClusterSettings,
    /// The one clock reading of the pass.
    pub now: &'a Now,
    /// The generation of the spec this pass reads; every condition it sets observed it.
    pub generation: Option<i64>,
    /// The names of the cluster's Secrets (docs/design.md §6).
    pub names: SecretNames,
    /// The cluster's certificates and keys, with what this pass has read of them.
    pub store: CertificateStore<'a>,
}

impl<'a> Round<'a> {
    /// The round of `inputs`, whose Secrets capn creates are owned by `owner` and whose
    /// leaves follow `policy`.
    pub fn new(inputs: Inputs<'a>, owner: &'a OwnerReference, policy: RenewalPolicy) -> Self {
        let Inputs {
            ncp,
            ctx,
            ns,
            cluster,
            now,
        } = inputs;
        Self {
            ncp,
            ctx,
            ns,
            cluster,
            now,
            generation: ncp.metadata.generation,
            names: SecretNames::new(&cluster.name),
            store: CertificateStore::new(ctx, ns, &cluster.name, owner, now.time, policy),
        }
    }

    /// Sets the condition `update` in `status`, as observed by this pass.
    pub fn set(&self, status: &mut NestedControlPlaneStatus, update: ConditionUpdate) {
        set_condition(&mut status.conditions, update, self.generation, &self.now.k8s);
    }
}
