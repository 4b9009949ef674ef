//! NestedEtcd membership: read the members through etcd's API,
//! plan one step ([`crate::etcd::members`]), take it, and say what the StatefulSet and the
//! `<c>-etcd-membership` ConfigMap render this round.
//!
//! Reads: the member list from the first member that answers, then each member's Status
//! (in parallel), with capn's in-memory client certificate ([`crate::etcd`]). Writes: at most
//! one member change (MemberAdd as learner, MemberPromote, MemberRemove) per reconcile, then
//! the reconcile looks again within seconds. A settled membership whose pods are all ready
//! costs nothing: etcd is not called until the StatefulSet reports a member not ready (which
//! wakes the reconcile) or `spec.replicas` changes.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::api::{EtcdClusterStatus, EtcdMemberStatus, MemberRemediation, NestedEtcd};
use crate::component::ComponentKind;
use crate::controllers::component::Round;
use crate::controllers::{Context, events};
use crate::etcd::members::{MemberView, Observed, Refusal, Step, even_warning, next_step, ordinal_of};
use crate::etcd::{EtcdCluster, ListedMember, MemberStatus};
use crate::pki::SecretNames;
use crate::plan::{EtcdMember, EtcdMembership, InitialClusterState, etcd_members};
use crate::status::{ConditionUpdate, MEMBERS_SYNCED, Reason};

/// How soon the next step is looked at after one was taken or while one is under way.
pub const STEP_RECHECK: Duration = Duration::from_secs(2);

/// What the membership step decided for this round.
#[derive(Debug, Default)]
pub struct Membership {
    /// What the plan renders; `None`: a new cluster of `spec.replicas` members.
    pub render: Option<EtcdMembership>,
    /// The members as etcd listed them.
    pub status: Option<EtcdClusterStatus>,
    /// [`MEMBERS_SYNCED`].
    pub condition: Option<ConditionUpdate>,
    /// The membership is as desired: the apiserver may be given every member's URL.
    pub settled: bool,
    /// When to look again.
    pub requeue: Option<Duration>,
    /// etcd's space and `NOSPACE` recovery ([`super::space`]), read in the same stage.
    pub space: super::space::SpaceReport,
}

/// Reads the members, takes at most one step, and returns what to render. A new etcd (never
/// applied), or a channel whose provider does not declare `membershipChanges`, renders
/// `spec.replicas` members as before. Failing to reach etcd changes nothing: the last known
/// members are rendered again and the condition says why.
///
/// # Errors
/// API errors reading the etcd CA.
pub async fn reconcile_members(
    round: &Round<'_, NestedEtcd>,
    supported: bool,
) -> Result<Membership, crate::controllers::ReconcileError> {
    let applied = round.object.status.as_ref().is_some_and(|s| s.version.is_some());
    if !applied || !supported {
        return Ok(Membership::default());
    }
    let known = Known::read(round);
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    // Every member ready, the members as last listed and nothing asked: etcd is not called
    // (a lost member's pod is not ready, which wakes this reconcile through the StatefulSet).
    if !known.change_pending && known.all_ready && known.synced && known.listed_before {
        // Nor kept connected: a cluster's clients cost about 100 KiB (tonic channels, TLS
        // state), and a settled etcd needs none until something changes.
        round.ctx.etcd.forget(ns, c);
        return Ok(Membership {
            render: Some(unchanged_render(c, ns, known.statefulset_replicas, &known.previous)),
            status: None,
            condition: None,
            settled: true,
            requeue: None,
            space: Default::default(),
        });
    }
    let (etcd, listed) = match connect(round, &known).await? {
        Ok(connected) => connected,
        Err(membership) => return Ok(membership),
    };
    let read = read_members(round, &known, &etcd, &listed).await;
    Ok(step(round, &known, &etcd, read).await)
}

/// What the caches and the NestedEtcd's status say about the members, before etcd is asked.
struct Known {
    desired: i32,
    /// The StatefulSet's replicas (at least 1).
    statefulset_replicas: i32,
    all_ready: bool,
    /// The members as last listed (empty when never listed).
    previous: EtcdClusterStatus,
    listed_before: bool,
    /// `MembersSynced` is True.
    synced: bool,
    /// A size change or a learner is under way.
    change_pending: bool,
}

impl Known {
    fn read(round: &Round<'_, NestedEtcd>) -> Self {
        let status = round.object.status.as_ref();
        let desired = round.object.spec.component.replicas.unwrap_or(1);
        let statefulset = ComponentKind::Etcd.object_name(&round.cluster.name);
        let live = round
            .ctx
            .caches
            .statefulsets
            .get(&ObjectRef::new(&statefulset).within(&round.cluster.namespace));
        // A StatefulSet at zero was put to sleep (capn renders at least one member
        // otherwise): waking, it has the members it had, not one.
        let statefulset_replicas = live
            .as_ref()
            .and_then(|s| s.spec.as_ref().and_then(|s| s.replicas))
            .filter(|r| *r > 0)
            .or_else(|| status.and_then(|s| s.replicas))
            .unwrap_or(desired)
            .max(1);
        let all_ready = live
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some_and(|s| s.ready_replicas.unwrap_or(0) >= statefulset_replicas);
        let previous_status = status.and_then(|s| s.etcd.clone());
        let listed_before = previous_status.is_some();
        let previous = previous_status.unwrap_or_default();
        let change_pending = desired != statefulset_replicas || previous.members.iter().any(|m| m.learner);
        Known {
            desired,
            statefulset_replicas,
            all_ready,
            listed_before,
            synced: status.is_some_and(|s| crate::status::is_true(&s.conditions, MEMBERS_SYNCED)),
            change_pending,
            previous,
        }
    }
}

/// The etcd client and the member list, or (`Err`) the membership to report when etcd
/// cannot be asked: its CA missing, no client, no member answering.
async fn connect<'r>(
    round: &'r Round<'_, NestedEtcd>,
    known: &Known,
) -> Result<Result<(EtcdCluster<'r>, Vec<ListedMember>), Membership>, crate::controllers::ReconcileError> {
    let Round { ctx, store, now, .. } = *round;
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    let unchanged = |condition| unchanged(c, ns, known.statefulset_replicas, &known.previous, condition);
    let names = SecretNames::new(c);
    let Some(ca) = store.require_ca(&names.etcd_ca).await? else {
        return Ok(Err(unchanged(ConditionUpdate::new(
            MEMBERS_SYNCED,
            false,
            Reason::WaitingForCertificates,
            format!("secret {} does not exist", names.etcd_ca),
        ))));
    };
    let ca = store.load_ca(&ca).await?;
    let etcd = match ctx.etcd.cluster(ns, c, &ca, now.time) {
        Ok(etcd) => etcd,
        Err(e) => {
            return Ok(Err(unchanged(ConditionUpdate::error(
                MEMBERS_SYNCED,
                false,
                e.reason(),
                e.to_string(),
            ))));
        }
    };
    let highest = known
        .previous
        .members
        .iter()
        .filter_map(|m| ordinal_of(&m.peer_url, c))
        .map(|o| i32::try_from(o).unwrap_or(0) + 1)
        .max()
        .unwrap_or(0);
    let candidates: Vec<String> = etcd_members(c, ns, known.statefulset_replicas.max(known.desired).max(highest))
        .into_iter()
        .map(|m| m.client_url)
        .collect();
    let listed = match etcd.member_list(&candidates).await {
        Ok(listed) => listed,
        // No member answered: keep no clients for it either (the next call dials anew, as
        // tonic would have); an unreachable etcd then costs no memory while it is away.
        Err(_) if !known.listed_before && !known.change_pending => {
            // Never reached and nothing asked (a new etcd still starting): render as created.
            ctx.etcd.forget(ns, c);
            return Ok(Err(Membership::default()));
        }
        Err(e) => {
            ctx.etcd.forget(ns, c);
            let mut outcome = unchanged(ConditionUpdate::new(
                MEMBERS_SYNCED,
                false,
                Reason::EtcdUnreachable,
                format!("no member answered ({e}); capn changes nothing until etcd answers again"),
            ));
            outcome.requeue = Some(Duration::from_secs(10));
            return Ok(Err(outcome));
        }
    };
    Ok(Ok((etcd, listed)))
}

/// What etcd said: each member's view, the status to show and the observation the next
/// step is planned from.
struct Read {
    views: Vec<MemberView>,
    status: EtcdClusterStatus,
    observed: Observed,
}

/// Each listed member's health (asked in parallel) and the leader.
async fn read_members(
    round: &Round<'_, NestedEtcd>,
    known: &Known,
    etcd: &EtcdCluster<'_>,
    listed: &[ListedMember],
) -> Read {
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    let spec = &round.object.spec;
    let health = read_health(etcd, c, ns, listed).await;
    let timeout = MemberRemediation::unreachable_timeout(spec.member_remediation.as_ref());
    let replace_lost = MemberRemediation::enabled(spec.member_remediation.as_ref());
    let (views, members_status) = views(c, listed, &health, &known.previous, round.now.time, timeout);
    let observed = Observed {
        members: views.clone(),
        statefulset_replicas: u32::try_from(known.statefulset_replicas).unwrap_or(1),
        desired: known.desired,
        replace_lost,
    };
    let leader = health
        .iter()
        .filter_map(|h| h.as_ref().ok())
        .map(|s| s.leader)
        .find(|l| *l != 0)
        .and_then(|id| listed.iter().find(|m| m.id == id))
        .map(|m| m.name.clone());
    Read {
        views,
        status: EtcdClusterStatus {
            members: members_status,
            leader,
        },
        observed,
    }
}

/// Plans the next step from what etcd said, takes it (at most one), and says what to
/// render and report.
async fn step(round: &Round<'_, NestedEtcd>, known: &Known, etcd: &EtcdCluster<'_>, read: Read) -> Membership {
    let (ns, c) = (&round.cluster.namespace, &round.cluster.name);
    let Read {
        views,
        status: cluster_status,
        observed,
    } = read;
    let warning = even_warning(known.desired)
        .map(|w| format!(" ({w})"))
        .unwrap_or_default();
    let mut proposed = Proposed {
        members: views.clone(),
        statefulset_replicas: known.statefulset_replicas,
    };
    let (condition, requeue) = match next_step(&observed) {
        Err(refusal) => (
            refused(&refusal, &warning),
            Some(if matches!(refusal, Refusal::QuorumLost { .. }) {
                Duration::from_secs(10)
            } else {
                Duration::from_secs(5)
            }),
        ),
        Ok(Step::Done) => {
            let unhealthy = views.iter().any(|m| !m.healthy);
            (
                ConditionUpdate::new(
                    MEMBERS_SYNCED,
                    true,
                    Step::Done.reason(),
                    format!("{} members as desired{warning}", views.len()),
                ),
                // While a member is unhealthy, look often enough to time its remediation.
                unhealthy.then_some(Duration::from_secs(5)),
            )
        }
        Ok(step) => {
            let via = via(c, ns, &views, &cluster_status, &step);
            let taken = take_step(round, etcd, &step, via.as_deref(), &mut proposed).await;
            let stuck = match &step {
                Step::WaitForLearner { ordinal, .. } => {
                    views.iter().any(|m| m.learner && m.ordinal == Some(*ordinal) && m.lost)
                }
                _ => false,
            };
            let hint = if stuck {
                "; it has not come up within the remediation timeout: if its data directory holds other data, delete its PersistentVolumeClaim and pod"
            } else {
                ""
            };
            let message = match taken {
                Ok(()) => format!("{step}{hint}{warning}"),
                Err(why) => format!("{step}: {why}{hint}{warning}"),
            };
            (
                ConditionUpdate::new(MEMBERS_SYNCED, false, step.reason(), message),
                Some(STEP_RECHECK),
            )
        }
    };
    let settled = condition.status;
    Membership {
        render: Some(render(c, ns, proposed.statefulset_replicas, &proposed.members)),
        status: Some(cluster_status),
        condition: Some(condition),
        settled,
        requeue,
        space: Default::default(),
    }
}

/// What this round renders after its step: the members and the StatefulSet's size.
struct Proposed {
    members: Vec<MemberView>,
    statefulset_replicas: i32,
}

/// The member capn asks for a change: the leader if it is healthy and not the target, else
/// another healthy voter.
fn via(c: &str, ns: &str, views: &[MemberView], status: &EtcdClusterStatus, step: &Step) -> Option<String> {
    let target = match step {
        Step::Remove { id, .. } | Step::Promote { id, .. } => Some(*id),
        _ => None,
    };
    let usable = |m: &&MemberView| m.healthy && !m.learner && Some(m.id) != target;
    let leader = status
        .leader
        .as_ref()
        .and_then(|name| views.iter().filter(usable).find(|m| &m.name == name));
    let chosen = leader.or_else(|| views.iter().find(usable))?;
    let ordinal = chosen.ordinal?;
    etcd_members(c, ns, i32::try_from(ordinal).unwrap_or(0) + 1)
        .pop()
        .map(|m| m.client_url)
}

/// Takes one step through etcd, updating the member list and StatefulSet size to render.
/// `Err` is why the step did not happen (it is tried again at the next look); a Normal
/// Event records each change made.
async fn take_step(
    round: &Round<'_, NestedEtcd>,
    etcd: &EtcdCluster<'_>,
    step: &Step,
    via: Option<&str>,
    proposed: &mut Proposed,
) -> Result<(), String> {
    let Round { ctx, object, .. } = *round;
    let (ns, c) = (round.cluster.namespace.as_str(), round.cluster.name.as_str());
    let need_via = || via.ok_or_else(|| "no healthy voting member to ask".to_string());
    match step {
        Step::ScaleStatefulSet { replicas } => {
            proposed.statefulset_replicas = i32::try_from(*replicas).unwrap_or(1);
            Ok(())
        }
        Step::WaitForLearner { .. } | Step::Done => Ok(()),
        Step::AddLearner { ordinal } => {
            let member = etcd_members(c, ns, i32::try_from(*ordinal).unwrap_or(0) + 1)
                .pop()
                .ok_or("no such member")?;
            let id = etcd
                .add_learner(need_via()?, &member.peer_url)
                .await
                .map_err(|e| e.to_string())?;
            // The new member starts on empty data: a pod of this ordinal may still hold a
            // removed member's data (a replaced lost member), with which it would refuse to
            // start ("the member has been permanently removed"). Until the membership
            // ConfigMap applied after this step names it, a restarted pod stops at once
            // ("couldn't find local name"), before writing anything.
            clear_data(ctx, ns, &member.name).await?;
            proposed.members.push(MemberView {
                id,
                ordinal: Some(*ordinal),
                name: member.name.clone(),
                peer_url: member.peer_url,
                learner: true,
                started: false,
                healthy: false,
                lost: false,
            });
            let note = format!("added {} as a learner (ID {id:x})", member.name);
            events::publish(
                ctx,
                object,
                Some(member_pod(ns, &member.name)),
                Reason::AddedLearner,
                note,
                "MemberAdd",
            )
            .await;
            Ok(())
        }
        Step::Promote { id, name } => {
            // etcd refuses until the learner has caught up with the leader: tried again soon.
            etcd.promote(need_via()?, *id)
                .await
                .map_err(|e| format!("not yet: {e}"))?;
            if let Some(m) = proposed.members.iter_mut().find(|m| m.id == *id) {
                m.learner = false;
            }
            let note = format!("promoted learner {name} (ID {id:x}) to a voting member");
            events::publish(
                ctx,
                object,
                Some(member_pod(ns, name)),
                Reason::PromotedLearner,
                note,
                "MemberPromote",
            )
            .await;
            Ok(())
        }
        Step::Remove { id, name, lost } => {
            etcd.remove(need_via()?, *id).await.map_err(|e| e.to_string())?;
            proposed.members.retain(|m| m.id != *id);

            if let Some(url) = etcd_members(c, ns, 64)
                .into_iter()
                .find(|m| m.name == *name)
                .map(|m| m.client_url)
            {
                etcd.forget_member(&url);
            }
            let (reason, note) = if *lost {
                (
                    Reason::RemovedLostMember,
                    format!("removed lost member {name} (ID {id:x}); it is added back as a learner"),
                )
            } else {
                (
                    Reason::RemovedMember,
                    format!("removed member {name} (ID {id:x}); its pod goes next"),
                )
            };
            events::publish(ctx, object, Some(member_pod(ns, name)), reason, note, "MemberRemove").await;
            Ok(())
        }
    }
}

/// The claim template of the members' data directories in the `stable` channel
/// (`volumeClaimTemplates[0].metadata.name`): a member's claim is `data-<pod>`.
pub const DATA_CLAIM: &str = "data";

/// The Pod of the member named `name` (capn names a member after its pod), as the
/// `related` object of a membership Event: it tells the steps on different members apart,
/// so that they are not folded into one series.
fn member_pod(ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// Clears a removed member's data the way a super cluster allows: deletes its claim
/// (`data-<pod>`; it goes once the pod no longer uses it) and then its pod, which the
/// StatefulSet controller creates again with a new, empty claim. Missing objects are fine.
async fn clear_data(ctx: &Context, ns: &str, pod: &str) -> Result<(), String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let claim = format!("{DATA_CLAIM}-{pod}");
    let gone = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map_err(|e| e.to_string()),
    };
    gone(claims.delete(&claim, &DeleteParams::default()).await.map(drop))?;
    gone(pods.delete(pod, &DeleteParams::default()).await.map(drop))?;
    Ok(())
}

/// The Status of every listed member, in list order.
/// A member's client URL comes from its ordinal (capn's naming), not from the list: a
/// learner that has not published its attributes yet lists none.
async fn read_health(
    etcd: &EtcdCluster<'_>,
    c: &str,
    ns: &str,
    listed: &[ListedMember],
) -> Vec<Result<MemberStatus, String>> {
    join_all(listed.iter().map(|m| async move {
        let peer_url = m.peer_urls.first().map(String::as_str).unwrap_or_default();
        let url = ordinal_of(peer_url, c)
            .and_then(|o| etcd_members(c, ns, i32::try_from(o).ok()? + 1).pop())
            .map(|m| m.client_url)
            .or_else(|| m.client_urls.first().cloned());
        let Some(url) = url else {
            return Err("no client URL".to_string());
        };
        etcd.status(&url).await.map_err(|e| e.to_string())
    }))
    .await
}

/// The planner's view and the status of each listed member. A member is healthy when its
/// Status answered, it knows a leader and reports no error (alarms, which every member
/// lists for the cluster, are not its errors); it is lost when it has been
/// unhealthy for `timeout` (the time it became unhealthy is kept in status across
/// reconciles and restarts of capn).
fn views(
    c: &str,
    listed: &[ListedMember],
    health: &[Result<MemberStatus, String>],
    previous: &EtcdClusterStatus,
    now: OffsetDateTime,
    timeout: Duration,
) -> (Vec<MemberView>, Vec<EtcdMemberStatus>) {
    let mut views = Vec::new();
    let mut statuses = Vec::new();
    for (m, h) in listed.iter().zip(health) {
        let peer_url = m.peer_urls.first().cloned().unwrap_or_default();
        let ordinal = ordinal_of(&peer_url, c);
        let name = if m.name.is_empty() {
            ordinal.map(|o| format!("{c}-etcd-{o}")).unwrap_or_default()
        } else {
            m.name.clone()
        };
        let healthy = h
            .as_ref()
            .is_ok_and(|s| s.leader != 0 && !crate::etcd::space::reports_member_errors(&s.errors));
        let id = format!("{:x}", m.id);
        let since = if healthy {
            None
        } else {
            previous
                .members
                .iter()
                .find(|p| p.id == id)
                .and_then(|p| p.unhealthy_since.clone())
                .or_else(|| now.format(&Rfc3339).ok())
        };
        let lost = since
            .as_deref()
            .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok())
            .is_some_and(|t| now - t >= timeout);
        views.push(MemberView {
            id: m.id,
            ordinal,
            name: name.clone(),
            peer_url: peer_url.clone(),
            learner: m.learner,
            // etcd lists a name once the member has published it; one that answers Status
            // has started in any case.
            started: !m.name.is_empty() || healthy,
            healthy,
            lost,
        });
        statuses.push(EtcdMemberStatus {
            name,
            id,
            peer_url,
            learner: m.learner,
            healthy,
            unhealthy_since: since,
        });
    }
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    (views, statuses)
}

/// What the StatefulSet and the membership ConfigMap render for these members: `existing`
/// while a member capn added has not started (it must join), `new` otherwise (a member that
/// lost its data then refuses to start instead of rejoining empty under its old identity).
fn render(c: &str, ns: &str, statefulset_replicas: i32, members: &[MemberView]) -> EtcdMembership {
    let all = etcd_members(c, ns, 64);
    let mut listed: Vec<EtcdMember> = members
        .iter()
        .filter_map(|m| m.ordinal)
        .filter_map(|o| all.get(usize::try_from(o).ok()?).cloned())
        .collect();
    listed.sort_by_key(|m| m.name.clone());
    let joining = members.iter().any(|m| !m.started);
    EtcdMembership {
        statefulset_replicas,
        members: listed,
        initial_cluster_state: if joining {
            InitialClusterState::Existing
        } else {
            InitialClusterState::New
        },
    }
}

/// The render of the last known members at the StatefulSet's current size.
fn unchanged_render(c: &str, ns: &str, statefulset_replicas: i32, previous: &EtcdClusterStatus) -> EtcdMembership {
    let views: Vec<MemberView> = previous
        .members
        .iter()
        .map(|m| MemberView {
            id: u64::from_str_radix(&m.id, 16).unwrap_or_default(),
            ordinal: ordinal_of(&m.peer_url, c),
            name: m.name.clone(),
            peer_url: m.peer_url.clone(),
            learner: m.learner,
            started: true,
            healthy: m.healthy,
            lost: false,
        })
        .collect();
    if views.is_empty() {
        // Never listed: the members as first rendered.
        let members = etcd_members(c, ns, statefulset_replicas);
        EtcdMembership {
            statefulset_replicas,
            members,
            initial_cluster_state: InitialClusterState::New,
        }
    } else {
        render(c, ns, statefulset_replicas, &views)
    }
}

/// Renders the last known members again and reports why nothing was changed (`condition`,
/// a False MembersSynced).
fn unchanged(
    c: &str,
    ns: &str,
    statefulset_replicas: i32,
    previous: &EtcdClusterStatus,
    condition: ConditionUpdate,
) -> Membership {
    Membership {
        render: Some(unchanged_render(c, ns, statefulset_replicas, previous)),
        status: None,
        condition: Some(condition),
        settled: false,
        requeue: Some(Duration::from_secs(5)),
        space: Default::default(),
    }
}

fn refused(refusal: &Refusal, warning: &str) -> ConditionUpdate {
    ConditionUpdate::error(MEMBERS_SYNCED, false, refusal.reason(), format!("{refusal}{warning}"))
}
