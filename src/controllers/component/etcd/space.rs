//! NestedEtcd space: every pass reads each member's Status (database size, in-use size,
//! alarms), records the sizes against the quota, and recovers from a `NOSPACE` alarm the way
//! etcd documents it: compact the history to the current revision, defragment the members one
//! at a time (followers first, the leader last, each only while every other member answers),
//! then disarm the alarm. If the data itself still fills the quota after compaction, nothing
//! is defragmented or disarmed, and the condition says how to make room
//! (docs/guide/etcd-operations.md "NOSPACE"). Without an alarm, it defragments the members
//! the same way when `spec.defragmentation` makes it due: the schedule's run came, or a
//! member's free pages reached the threshold (docs/guide/etcd-operations.md
//! "Defragmentation").
//!
//! Noticed within [`SPACE_POLL`]: the pass is looked at again that often. There is no alarm
//! watch in etcd's API; a Status call per member every 10 s is small next to what a tenant's
//! apiserver asks of its etcd.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::ObjectReference;
use time::format_description::well_known::Rfc3339;

use crate::api::{DefragmentationPolicy, EtcdDefragmentation, EtcdMemberSpace, EtcdSpaceStatus, NestedEtcd};
use crate::controllers::component::Round;
use crate::controllers::events;
use crate::etcd::space::{
    Defragmentable, DefragmentationDue, NOSPACE, defragmentation_due, defragmentation_order,
    fits_after_defragmentation, human, reports_nospace, worth_recording,
};
use crate::etcd::{EtcdCluster, MemberStatus};
use crate::pki::SecretNames;
use crate::plan::etcd_members;
use crate::plan::etcd_quota_bytes;
use crate::status::{ConditionUpdate, ETCD_SPACE_EXHAUSTED, Reason};

/// How often the members' space and alarms are read.
pub const SPACE_POLL: Duration = Duration::from_secs(10);

/// What the space step found and did this pass.
#[derive(Debug, Default)]
pub struct SpaceReport {
    /// `status.etcdSpace` to write (`None`: keep what is recorded).
    pub status: Option<EtcdSpaceStatus>,
    /// [`ETCD_SPACE_EXHAUSTED`], when etcd answered.
    pub condition: Option<ConditionUpdate>,
    /// When to look again.
    pub requeue: Option<Duration>,
}

/// One member as read this pass.
struct Read {
    name: String,
    client_url: String,
    status: Result<MemberStatus, String>,
}

/// Reads the members' space and recovers from `NOSPACE`. An etcd that was never applied,
/// or whose members do not answer, is left alone (the membership step reports that).
///
/// # Errors
/// API errors reading the etcd CA.
pub async fn space_step(round: &Round<'_, NestedEtcd>) -> Result<SpaceReport, crate::controllers::ReconcileError> {
    let Round {
        ctx,
        object,
        store,
        now,
        ..
    } = *round;
    let recorded = object.status.as_ref().and_then(|s| s.etcd_space.as_deref());
    let Some(replicas) = object
        .status
        .as_ref()
        .filter(|s| s.version.is_some())
        .and_then(|s| s.replicas)
    else {
        return Ok(SpaceReport::default());
    };
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    let later = SpaceReport {
        requeue: Some(SPACE_POLL),
        ..SpaceReport::default()
    };
    let names = SecretNames::new(c);
    let Some(ca) = store.require_ca(&names.etcd_ca).await? else {
        return Ok(later);
    };
    let ca = store.load_ca(&ca).await?;
    let etcd = match ctx.etcd.cluster(ns, c, &ca, now.time) {
        Ok(etcd) => etcd,
        Err(e) => {
            tracing::debug!(namespace = %ns, cluster = %c, error = %e, "etcd space: no client");
            return Ok(later);
        }
    };
    // The quota as the members were rendered with it: the spec's, else sized from the
    // volume under the ceiling of the NestedEtcd's size (the same function `plan` uses).
    let Ok(quota) = etcd_quota_bytes(
        &ctx.channels,
        round.cluster,
        &kube::ResourceExt::name_any(object),
        &object.spec.component,
        object.spec.storage.as_ref(),
    ) else {
        return Ok(later);
    };
    let quota = i64::try_from(quota).unwrap_or(i64::MAX);
    let reads = read_all(&etcd, c, ns, replicas).await;
    let answered: Vec<(&Read, &MemberStatus)> = reads
        .iter()
        .filter_map(|r| r.status.as_ref().ok().map(|s| (r, s)))
        .collect();
    let statuses: Vec<&MemberStatus> = answered.iter().map(|(_, s)| *s).collect();
    ctx.metrics.set_etcd_members(ns, c, member_figures(replicas, &statuses));
    if answered.is_empty() {
        tracing::debug!(namespace = %ns, cluster = %c, "etcd space: no member answered Status");
        return Ok(later);
    }
    tracing::debug!(namespace = %ns, cluster = %c, members = answered.len(), "etcd space: read");
    // A member that reports its own quota (etcd 3.6+) is believed over the spec: it is the
    // one etcd enforces (members not yet rolled to a new quota keep the old one).
    let quota = answered
        .iter()
        .map(|(_, s)| s.db_size_quota)
        .filter(|q| *q > 0)
        .max()
        .unwrap_or(quota);
    let mut report = later;
    let sizes = member_spaces(&answered);
    let nospace = answered.iter().any(|(_, s)| reports_nospace(&s.errors));
    ctx.metrics.set_etcd_space(
        ns,
        c,
        crate::telemetry::EtcdSpaceFigures {
            db_size: sizes.iter().map(|m| m.db_size).max().unwrap_or_default(),
            db_size_in_use: sizes.iter().map(|m| m.db_size_in_use).max().unwrap_or_default(),
            quota,
            nospace,
        },
    );
    let mut last_defragmentation = recorded.and_then(|r| r.last_defragmentation.clone());
    let already_told = object
        .status
        .as_ref()
        .is_some_and(|s| crate::status::is_true(&s.conditions, ETCD_SPACE_EXHAUSTED));
    if nospace && !already_told {
        // Told at once, even when the recovery below ends it in this same pass.
        events::publish(
            ctx,
            object,
            None,
            Reason::EtcdNoSpace,
            format!(
                "etcd raised NOSPACE: its database reached the {} quota ({} on the largest member); writes are refused until capn compacts, defragments and disarms it",
                human(quota),
                human(sizes.iter().map(|m| m.db_size).max().unwrap_or_default())
            ),
            "AlarmList",
        )
        .await;
    }
    report.condition = Some(if nospace {
        match recover(round, &etcd, &reads, quota).await {
            Recovery::Disarmed(defragmentation) => {
                last_defragmentation = Some(defragmentation);
                ConditionUpdate::new(
                    ETCD_SPACE_EXHAUSTED,
                    false,
                    Reason::EtcdSpaceAvailable,
                    format!(
                        "capn compacted, defragmented and disarmed NOSPACE; the quota is {}",
                        human(quota)
                    ),
                )
            }
            Recovery::DataExceedsQuota { in_use } => ConditionUpdate::new(
                ETCD_SPACE_EXHAUSTED,
                true,
                Reason::EtcdDataExceedsQuota,
                format!(
                    "etcd raised NOSPACE: after compaction the data takes {} of the {} quota (more than {}%), so defragmenting cannot make room; delete data through the tenant's apiserver (deletes are accepted; capn compacts, defragments and disarms once it fits), or raise spec.storage.quotaBackendBytes (at most spec.storage.size; raise that too)",
                    human(in_use),
                    human(quota),
                    crate::etcd::space::DISARM_BELOW_PERCENT
                ),
            ),
            Recovery::Failed(message) => ConditionUpdate::new(
                ETCD_SPACE_EXHAUSTED,
                true,
                Reason::EtcdNoSpace,
                format!(
                    "etcd raised NOSPACE: its database reached the {} quota ({} on the largest member); recovering: {message}",
                    human(quota),
                    human(sizes.iter().map(|m| m.db_size).max().unwrap_or_default())
                ),
            ),
        }
    } else {
        if let Some(done) = maintain(round, &etcd, &reads, quota, &sizes, last_defragmentation.as_ref()).await {
            last_defragmentation = Some(done);
        }
        ConditionUpdate::new(
            ETCD_SPACE_EXHAUSTED,
            false,
            Reason::EtcdSpaceAvailable,
            format!("no NOSPACE alarm; the quota is {}", human(quota)),
        )
    });
    tracing::debug!(namespace = %ns, cluster = %c, nospace, condition = ?report.condition, "etcd space: judged");
    let defragmented = last_defragmentation.as_ref() != recorded.and_then(|r| r.last_defragmentation.as_ref());
    if defragmented || worth_recording(recorded, quota, &sizes) {
        report.status = Some(EtcdSpaceStatus {
            quota_backend_bytes: quota,
            members: if defragmented {
                member_spaces(
                    &read_all(&etcd, c, ns, replicas)
                        .await
                        .iter()
                        .filter_map(|r| r.status.as_ref().ok().map(|s| (r, s)))
                        .collect::<Vec<_>>(),
                )
            } else {
                sizes
            },
            last_defragmentation,
        });
    }
    Ok(report)
}

fn member_spaces(answered: &[(&Read, &MemberStatus)]) -> Vec<EtcdMemberSpace> {
    answered
        .iter()
        .map(|(r, s)| EtcdMemberSpace {
            name: r.name.clone(),
            db_size: s.db_size,
            db_size_in_use: s.db_size_in_use,
        })
        .collect()
}

/// The members as this pass read them: of `replicas` wanted, those whose Status `answered`
/// and that are healthy by the membership step's rule (a leader known, no error besides
/// alarms), and whether any knows a leader.
fn member_figures(replicas: i32, answered: &[&MemberStatus]) -> crate::telemetry::EtcdMemberFigures {
    let healthy = answered
        .iter()
        .filter(|s| s.leader != 0 && !crate::etcd::space::reports_member_errors(&s.errors))
        .count();
    crate::telemetry::EtcdMemberFigures {
        members: i64::from(replicas),
        healthy: i64::try_from(healthy).unwrap_or(i64::MAX),
        has_leader: answered.iter().any(|s| s.leader != 0),
    }
}

/// Every member's Status, in ordinal order.
async fn read_all(etcd: &EtcdCluster<'_>, c: &str, ns: &str, replicas: i32) -> Vec<Read> {
    join_all(etcd_members(c, ns, replicas.max(1)).into_iter().map(|m| async move {
        let status = etcd.status(&m.client_url).await.map_err(|e| e.to_string());
        Read {
            name: m.name,
            client_url: m.client_url,
            status,
        }
    }))
    .await
}

/// How a recovery from `NOSPACE` ended.
enum Recovery {
    Disarmed(EtcdDefragmentation),
    DataExceedsQuota { in_use: i64 },
    Failed(String),
}

/// Every member's Status, with the leader among them.
struct Led<'r> {
    answered: Vec<(&'r Read, &'r MemberStatus)>,
    leader: u64,
    /// The leader's client URL.
    via: String,
}

/// The members that answered with the leader's id and client URL, when every member
/// answered and one of them is the leader; otherwise why a defragmentation must wait.
fn led(reads: &[Read]) -> Result<Led<'_>, String> {
    let answered: Vec<(&Read, &MemberStatus)> = reads
        .iter()
        .filter_map(|r| r.status.as_ref().ok().map(|s| (r, s)))
        .collect();
    if answered.len() < reads.len() {
        return Err("waiting until every member answers".into());
    }
    let leader = answered.iter().map(|(_, s)| s.leader).find(|l| *l != 0).unwrap_or(0);
    if leader == 0 {
        return Err("waiting for a leader".into());
    }
    let via = answered
        .iter()
        .find(|(_, s)| s.member_id == leader)
        .map(|(r, _)| r.client_url.clone())
        .ok_or_else(|| "the leader is not one of the members capn dials".to_string())?;
    Ok(Led { answered, leader, via })
}

/// Compaction to the current revision, then (if the data then fits) defragmentation one
/// member at a time, followers first and the leader last, then the alarm disarmed.
async fn recover(round: &Round<'_, NestedEtcd>, etcd: &EtcdCluster<'_>, reads: &[Read], quota: i64) -> Recovery {
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    let Led { answered, leader, via } = match led(reads) {
        Ok(led) => led,
        Err(wait) => return Recovery::Failed(wait),
    };
    // Compaction drops every revision but the newest of each key; etcd answers an error for
    // a revision already compacted, which leaves nothing to do.
    let revision = answered.iter().map(|(_, s)| s.revision).max().unwrap_or(0);
    if let Err(e) = etcd.compact(&via, revision).await
        && !e.to_string().contains("compacted")
    {
        return Recovery::Failed(format!("compaction to revision {revision}: {e}"));
    }
    // Each member applies the compaction itself; its in-use size tells what its file would
    // shrink to.
    let after = read_all(etcd, c, ns, i32::try_from(reads.len()).unwrap_or(1)).await;
    let in_use: Vec<i64> = after
        .iter()
        .filter_map(|r| r.status.as_ref().ok().map(|s| s.db_size_in_use))
        .collect();
    if in_use.len() < reads.len() {
        return Recovery::Failed("a member stopped answering after compaction".into());
    }
    if !fits_after_defragmentation(&in_use, quota) {
        return Recovery::DataExceedsQuota {
            in_use: in_use.iter().copied().max().unwrap_or_default(),
        };
    }
    let defragmentation = match defragment(round, etcd, reads, &answered, leader, NOSPACE, "NOSPACE recovery").await {
        Ok(defragmentation) => defragmentation,
        Err(e) => return Recovery::Failed(e),
    };
    let alarmed = match etcd.nospace_alarms(&via).await {
        Ok(alarmed) => alarmed,
        Err(e) => return Recovery::Failed(format!("listing the alarms: {e}")),
    };
    for member in alarmed {
        if let Err(e) = etcd.disarm_nospace(&via, member).await {
            return Recovery::Failed(format!("disarming NOSPACE of member {member:x}: {e}"));
        }
    }
    Recovery::Disarmed(defragmentation)
}

/// A defragmentation outside `NOSPACE`, when `spec.defragmentation` makes one due
/// ([`defragmentation_due`]); `None` when none is due, or when it must wait (the members
/// are read again next pass, so it runs once they allow it).
async fn maintain(
    round: &Round<'_, NestedEtcd>,
    etcd: &EtcdCluster<'_>,
    reads: &[Read],
    quota: i64,
    sizes: &[EtcdMemberSpace],
    last: Option<&EtcdDefragmentation>,
) -> Option<EtcdDefragmentation> {
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    let policy = round.object.spec.defragmentation.as_deref();
    let schedule = DefragmentationPolicy::schedule(policy);
    let created = round
        .object
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(round.now.k8s.0, |t| t.0);
    let last_time = last.and_then(|d| d.time.parse().ok());
    let due = match defragmentation_due(
        schedule,
        DefragmentationPolicy::threshold_percent(policy),
        quota,
        sizes,
        last_time,
        created,
        round.now.k8s.0,
    ) {
        Ok(due) => due?,
        Err(invalid) => {
            // The rule table refuses this at admission and in `capn render`; a value its
            // pattern lets through and the cron parser does not ends here.
            events::publish(
                round.ctx,
                round.object,
                None,
                Reason::InvalidDefragmentationSchedule,
                format!(
                    "{}; no defragmentation runs on it until it is mended",
                    invalid.message_at("spec.defragmentation.schedule")
                ),
                "Defragment",
            )
            .await;
            return None;
        }
    };
    let why = match &due {
        DefragmentationDue::Schedule(run) => format!("the schedule's run at {run}"),
        DefragmentationDue::Threshold { member, free } => format!(
            "{member} has {} of free pages, at least {}% of the {} quota",
            human(*free),
            DefragmentationPolicy::threshold_percent(policy).unwrap_or_default(),
            human(quota)
        ),
    };
    let ran = match led(reads) {
        Ok(Led { answered, leader, .. }) => {
            defragment(round, etcd, reads, &answered, leader, due.trigger(), &why).await
        }
        Err(wait) => Err(wait),
    };
    match ran {
        Ok(done) => Some(done),
        Err(e) => {
            tracing::info!(namespace = %ns, cluster = %c, trigger = due.trigger(), error = %e, "etcd defragmentation: not now");
            None
        }
    }
}

/// Defragments every member, one at a time, followers first and the leader last, each only
/// while every other member answers with a leader; an Event per member says why (`why`).
///
/// # Errors
/// What stopped it: a member without a leader, a failed call (the members done so far are
/// named; the next pass starts again from the first follower).
async fn defragment(
    round: &Round<'_, NestedEtcd>,
    etcd: &EtcdCluster<'_>,
    reads: &[Read],
    answered: &[(&Read, &MemberStatus)],
    leader: u64,
    trigger: &str,
    why: &str,
) -> Result<EtcdDefragmentation, String> {
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    let members = answered
        .iter()
        .map(|(r, s)| Defragmentable {
            name: r.name.clone(),
            id: s.member_id,
            client_url: r.client_url.clone(),
        })
        .collect();
    let leader_name = answered
        .iter()
        .find(|(_, s)| s.member_id == leader)
        .map(|(r, _)| r.name.clone());
    let mut done = Vec::new();
    for member in defragmentation_order(members, leader) {
        // Only while every other member answers: a defragmenting member does not serve, and
        // with another one down the cluster would lose its quorum meanwhile.
        let others = join_all(
            reads
                .iter()
                .filter(|r| r.client_url != member.client_url)
                .map(|r| etcd.status(&r.client_url)),
        )
        .await;
        if others.iter().any(|s| s.as_ref().map_or(true, |s| s.leader == 0)) {
            return Err(format!(
                "defragmented {done:?}; waiting to defragment {} until every other member answers with a leader",
                member.name
            ));
        }
        if let Err(e) = etcd.defragment(&member.client_url).await {
            events::publish(
                round.ctx,
                round.object,
                Some(member_pod(ns, &member.name)),
                Reason::DefragmentationFailed,
                format!(
                    "defragmenting {} ({why}): {e}; capn tries again at its next look",
                    member.name
                ),
                "Defragment",
            )
            .await;
            return Err(format!("defragmenting {}: {e}", member.name));
        }
        events::publish(
            round.ctx,
            round.object,
            Some(member_pod(ns, &member.name)),
            Reason::DefragmentedMember,
            format!(
                "defragmented {} ({why}{})",
                member.name,
                if member.id == leader { "; the leader, last" } else { "" }
            ),
            "Defragment",
        )
        .await;
        round.ctx.metrics.count_etcd_defragmentation(ns, c);
        done.push(member.name);
    }
    Ok(EtcdDefragmentation {
        // When it finished (the schedule's next run is counted from it), not when the pass began.
        time: time::OffsetDateTime::now_utc().format(&Rfc3339).unwrap_or_default(),
        trigger: trigger.into(),
        members: done,
        leader: leader_name,
    })
}

fn member_pod(ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, leader: u64, errors: &[&str]) -> MemberStatus {
        MemberStatus {
            member_id: id,
            leader,
            raft_term: 2,
            raft_index: 10,
            raft_applied_index: 10,
            learner: false,
            db_size: 0,
            db_size_in_use: 0,
            db_size_quota: 0,
            revision: 1,
            errors: errors.iter().map(|e| (*e).to_owned()).collect(),
            version: "3.6.8".to_owned(),
        }
    }

    #[test]
    fn member_figures_count_healthy_members_by_the_membership_rule() {
        let (a, b) = (member(1, 1, &[]), member(2, 1, &["memberID:2 alarm:NOSPACE"]));
        let figures = member_figures(3, &[&a, &b]);
        assert_eq!(
            figures,
            crate::telemetry::EtcdMemberFigures {
                members: 3,
                healthy: 2,
                has_leader: true
            },
            "an alarm is the cluster's, not the member's; the third did not answer"
        );
        let (lost, broken) = (member(1, 0, &[]), member(2, 0, &["raft: corrupted"]));
        assert_eq!(
            member_figures(3, &[&lost, &broken]),
            crate::telemetry::EtcdMemberFigures {
                members: 3,
                healthy: 0,
                has_leader: false
            }
        );
        assert!(!member_figures(1, &[]).has_leader, "no member answered");
    }
}
