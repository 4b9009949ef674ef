//! NestedEtcd specifics: the first component (no gate), and the etcd server/peer
//! certificate, whose SANs follow the member count (docs/reference.md "etcd certificate").

pub mod backup;
pub mod membership;
pub mod space;

use std::sync::Arc;

use futures::stream::BoxStream;
use kube::runtime::reflector::ObjectRef;

use crate::api::{NestedControlPlane, NestedEtcd};
use crate::component::ComponentKind;
use crate::controllers::component::etcd::membership::{Membership, reconcile_members};
use crate::controllers::component::{ComponentResource, Round, component_accessors};
use crate::controllers::round::Gate;
use crate::controllers::shared::certificates::{CertificateStore, waiting_for_ca};
use crate::controllers::{Context, ReconcileError};
use crate::pki::{SecretNames, etcd_server_leaf};
use crate::plan::{ClusterSettings, Plan, Upstream};

impl ComponentResource for NestedEtcd {
    component_accessors!(ComponentKind::Etcd, etcd, "etcd", etcds, storage: storage);

    /// etcd comes first: always open.
    fn gate(_ctx: &Context, _ncp: &NestedControlPlane, _cluster: &ClusterSettings, _ns: &str) -> Gate {
        Gate::Open(Upstream::default())
    }

    fn predecessor_changes(
        _ctx: &Arc<Context>,
        _subscriptions: &crate::controllers::shared::cache::Subscriptions,
    ) -> Option<BoxStream<'static, ObjectRef<Self>>> {
        None
    }

    /// A pending restore's snapshot, checked before any member is planned.
    async fn prepare(
        ctx: &Context,
        object: &Self,
        ns: &str,
        cluster: &str,
        channel: &crate::channel::Channel,
        version: &semver::Version,
    ) -> Result<backup::RestorePlan, ReconcileError> {
        backup::plan_restore(ctx, object, ns, cluster, channel, version).await
    }

    /// Scheduled and on-demand snapshots ([`backup::backup_step`]).
    async fn after_apply(
        round: &Round<'_, Self>,
        channel: &crate::channel::Channel,
        ready: bool,
        endpoints: &[String],
    ) -> Result<backup::BackupReport, ReconcileError> {
        let report = backup::backup_step(round, channel, ready, endpoints).await?;
        round.ctx.metrics.set_etcd_backup(
            &round.cluster.namespace,
            &round.cluster.name,
            backup::backup_figures(round.object, &report),
        );
        Ok(report)
    }

    /// Issues `<c>-etcd-server` (server and client usage; every member's names) before the
    /// StatefulSet is applied. Waits while the etcd CA does not exist.
    async fn ensure_certificates(
        store: &CertificateStore<'_>,
        cluster: &ClusterSettings,
        _ncp: &NestedControlPlane,
        plan: &Plan,
        _applied: &[serde_json::Value],
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

    /// Reads the members through etcd and takes at most one step toward `spec.replicas`
    /// ([`membership`]), when the channel's provider declares membership changes.
    async fn membership(round: &Round<'_, Self>) -> Result<Membership, ReconcileError> {
        let supported = crate::plan::resolve(
            &round.ctx.channels,
            round.cluster,
            ComponentKind::Etcd,
            &round.object.spec.component,
        )
        .ok()
        .and_then(|r| {
            r.channel
                .component(ComponentKind::Etcd)
                .map(|c| c.capabilities.membership_changes)
        })
        .unwrap_or(false);
        let mut membership = reconcile_members(round, supported).await?;
        // The space step reads every member too; it rides on this step so that the pass
        // has one etcd stage before planning (docs/guide/etcd-operations.md).
        membership.space = space::space_step(round).await?;
        Ok(membership)
    }
}
