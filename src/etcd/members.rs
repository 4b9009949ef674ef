//! The membership step planner: from the member list as etcd reports it, the health of
//! each member, the StatefulSet's size and the desired member count, the one next step that
//! moves the cluster toward the desired count without ever risking quorum, or the reason
//! no step may be taken. Pure: no client, no clock (the caller decides which members are
//! lost from how long they have been unreachable).
//!
//! The rules (etcd's "Runtime reconfiguration" guide, and docs/design.md §9):
//! - one member at a time; a new member joins as a **learner** (etcd 3.4+: it receives the
//!   log without voting), is started with `--initial-cluster-state=existing`, and is promoted
//!   once it has caught up;
//! - a member is removed through etcd **before** its pod goes, the highest ordinal first;
//! - no change while a member is unhealthy, nor one that would leave fewer healthy voters
//!   than a quorum; with quorum lost nothing changes at all;
//! - a lost member (its data gone: see [`MemberView::lost`]) is removed and added back as a
//!   learner, which starts on an empty data directory as a new member;
//! - fewer than one member is refused; an even count is allowed with a warning (etcd's
//!   guidance: an even count tolerates no more failures than the odd count below it).

use crate::status::Reason;
use std::fmt;

/// One member as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    /// etcd's member ID.
    pub id: u64,
    /// The StatefulSet ordinal its peer URL names (`https://<c>-etcd-<i>.<c>-etcd...`); `None`
    /// for a member capn did not add (a peer URL of another shape).
    pub ordinal: Option<u32>,
    /// Its name (`<c>-etcd-<i>`), or the name its pod will have while it has not started.
    pub name: String,
    pub peer_url: String,
    pub learner: bool,
    /// The member has started (etcd lists a name for it); a learner just added has not.
    pub started: bool,
    /// It answered a Status call and knows a leader.
    pub healthy: bool,
    /// Its data is considered gone (unreachable for longer than the remediation timeout, or
    /// a precise signal): remove it and add it back.
    pub lost: bool,
}

/// What the planner looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub members: Vec<MemberView>,
    /// `spec.replicas` of the etcd StatefulSet as applied.
    pub statefulset_replicas: u32,
    /// `spec.replicas` of the NestedEtcd.
    pub desired: i32,
    /// Whether lost members are replaced (`spec.memberRemediation`).
    pub replace_lost: bool,
}

/// The next step toward the desired membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Add the member of this ordinal as a learner (MemberAdd with its peer URL).
    AddLearner { ordinal: u32 },
    /// Set the StatefulSet's replicas (grow to start an added learner's pod, shrink after a
    /// removal).
    ScaleStatefulSet { replicas: u32 },
    /// Wait for the learner of this ordinal to start and catch up.
    WaitForLearner { ordinal: u32, name: String },
    /// Promote the learner to a voting member (etcd refuses until it has caught up).
    Promote { id: u64, name: String },
    /// Remove a member: the highest ordinal when scaling down, or a lost member.
    Remove { id: u64, name: String, lost: bool },
    /// The membership is as desired.
    Done,
}

impl Step {
    /// A short stable reason for the condition and the Event of this step.
    pub fn reason(&self) -> Reason {
        match self {
            Step::AddLearner { .. } => Reason::AddingLearner,
            Step::ScaleStatefulSet { .. } => Reason::ScalingStatefulSet,
            Step::WaitForLearner { .. } => Reason::WaitingForLearner,
            Step::Promote { .. } => Reason::PromotingLearner,
            Step::Remove { lost: true, .. } => Reason::ReplacingLostMember,
            Step::Remove { lost: false, .. } => Reason::RemovingMember,
            Step::Done => Reason::MembersSynced,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::AddLearner { ordinal } => write!(f, "adding member {ordinal} as a learner"),
            Step::ScaleStatefulSet { replicas } => write!(f, "setting the StatefulSet to {replicas} replicas"),
            Step::WaitForLearner { name, .. } => write!(f, "waiting for learner {name} to start and catch up"),
            Step::Promote { name, .. } => write!(f, "promoting learner {name} to a voting member"),
            Step::Remove { name, lost: true, .. } => {
                write!(
                    f,
                    "removing lost member {name}, to add it back as a learner with empty data"
                )
            }
            Step::Remove { name, lost: false, .. } => write!(f, "removing member {name}"),
            Step::Done => f.write_str("the members are as desired"),
        }
    }
}

/// Why no step may be taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("spec.replicas is {0}; etcd needs at least 1 member")]
    BelowOne(i32),
    #[error(
        "quorum is lost: {healthy} of {voters} voting members are healthy and {quorum} are needed; capn changes nothing until quorum is back (restore the members, or restore from a backup)"
    )]
    QuorumLost {
        healthy: usize,
        voters: usize,
        quorum: usize,
    },
    #[error(
        "member(s) {names} are unhealthy; the membership changes only while every member is healthy (etcd runtime reconfiguration guide)"
    )]
    MemberUnhealthy { names: String },
    #[error(
        "removing {name} would leave {remaining_healthy} healthy of {remaining} voting members, below the quorum of {quorum}"
    )]
    WouldLoseQuorum {
        name: String,
        remaining_healthy: usize,
        remaining: usize,
        quorum: usize,
    },
    #[error(
        "member {name} (peer URL {peer_url}) was not added by capn; remove it with etcdctl before changing the membership"
    )]
    ForeignMember { name: String, peer_url: String },
}

impl Refusal {
    /// A short stable reason for the condition and the Event.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::BelowOne(_) => "ReplicasBelowOne",
            Refusal::QuorumLost { .. } => "EtcdQuorumLost",
            Refusal::MemberUnhealthy { .. } => "EtcdMemberUnhealthy",
            Refusal::WouldLoseQuorum { .. } => "WouldLoseQuorum",
            Refusal::ForeignMember { .. } => "ForeignEtcdMember",
        }
    }
}

/// The quorum of `voters` voting members: ⌊voters/2⌋ + 1.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

/// etcd's guidance on even member counts, for the condition message; `None` for odd counts.
pub fn even_warning(desired: i32) -> Option<String> {
    (desired > 0 && desired % 2 == 0).then(|| {
        format!(
            "warning: {desired} members tolerate as many failures as {} (etcd FAQ: an odd member count is recommended)",
            desired - 1
        )
    })
}

/// The ordinal a peer URL names: `https://<cluster>-etcd-<i>.<cluster>-etcd.<ns>.svc:2380`.
pub fn ordinal_of(peer_url: &str, cluster: &str) -> Option<u32> {
    let host = peer_url.strip_prefix("https://")?;
    let rest = host.strip_prefix(&format!("{cluster}-etcd-"))?;
    let (ordinal, tail) = rest.split_once('.')?;
    tail.starts_with(&format!("{cluster}-etcd."))
        .then(|| ordinal.parse().ok())
        .flatten()
}

/// The next step, or why none may be taken. See the module documentation for the rules.
///
/// # Errors
/// A [`Refusal`] when the desired count is below one, quorum is lost, a member is
/// unhealthy while a change is needed, a removal would lose quorum, or a member was not
/// added by capn.
pub fn next_step(observed: &Observed) -> Result<Step, Refusal> {
    if observed.desired < 1 {
        return Err(Refusal::BelowOne(observed.desired));
    }
    let desired = u32::try_from(observed.desired).unwrap_or(1);
    let members = &observed.members;
    let voters: Vec<&MemberView> = members.iter().filter(|m| !m.learner).collect();
    let healthy_voters = voters.iter().filter(|m| m.healthy).count();
    let needed = quorum(voters.len());
    if healthy_voters < needed {
        return Err(Refusal::QuorumLost {
            healthy: healthy_voters,
            voters: voters.len(),
            quorum: needed,
        });
    }
    if let Some(foreign) = members.iter().find(|m| m.ordinal.is_none()) {
        return Err(Refusal::ForeignMember {
            name: foreign.name.clone(),
            peer_url: foreign.peer_url.clone(),
        });
    }
    let ordinal = |m: &MemberView| m.ordinal.unwrap_or(u32::MAX);
    // A lost voter goes first: removing it keeps the cluster able to add it back.
    if observed.replace_lost
        && let Some(lost) = voters
            .iter()
            .filter(|m| m.lost && !m.healthy)
            .max_by_key(|m| ordinal(m))
    {
        let remaining = voters.len() - 1;
        let needed = quorum(remaining);
        if healthy_voters < needed {
            return Err(Refusal::WouldLoseQuorum {
                name: lost.name.clone(),
                remaining_healthy: healthy_voters,
                remaining,
                quorum: needed,
            });
        }
        return Ok(Step::Remove {
            id: lost.id,
            name: lost.name.clone(),
            lost: true,
        });
    }
    let highest = members.iter().map(|m| ordinal(m) + 1).max().unwrap_or(0);
    // A learner in flight: start its pod, wait for it, promote it.
    if let Some(learner) = members.iter().find(|m| m.learner) {
        let at = ordinal(learner);
        if observed.statefulset_replicas <= at {
            return Ok(Step::ScaleStatefulSet { replicas: at + 1 });
        }
        if !(learner.started && learner.healthy) {
            // A learner that does not come up is not removed and added again: whatever keeps
            // it from starting (for example a data directory of another cluster) would keep
            // the next one from starting too. The condition says it is stuck.
            return Ok(Step::WaitForLearner {
                ordinal: at,
                name: learner.name.clone(),
            });
        }
        return Ok(Step::Promote {
            id: learner.id,
            name: learner.name.clone(),
        });
    }
    let count = u32::try_from(members.len()).unwrap_or(u32::MAX);
    let change_needed = count != desired || observed.statefulset_replicas != highest;
    if change_needed {
        let unhealthy: Vec<&str> = members.iter().filter(|m| !m.healthy).map(|m| m.name.as_str()).collect();
        if !unhealthy.is_empty() {
            return Err(Refusal::MemberUnhealthy {
                names: unhealthy.join(", "),
            });
        }
    }
    if count < desired {
        // The lowest free ordinal: after a lost member was removed, its own ordinal.
        let free = (0..)
            .find(|i| !members.iter().any(|m| m.ordinal == Some(*i)))
            .unwrap_or(count);
        return Ok(Step::AddLearner { ordinal: free });
    }
    if count > desired {
        let Some(target) = voters.iter().max_by_key(|m| ordinal(m)) else {
            return Ok(Step::Done);
        };
        let remaining = voters.len() - 1;
        let remaining_healthy = healthy_voters - usize::from(target.healthy);
        let needed = quorum(remaining);
        if remaining_healthy < needed {
            return Err(Refusal::WouldLoseQuorum {
                name: target.name.clone(),
                remaining_healthy,
                remaining,
                quorum: needed,
            });
        }
        return Ok(Step::Remove {
            id: target.id,
            name: target.name.clone(),
            lost: false,
        });
    }
    if observed.statefulset_replicas != highest {
        return Ok(Step::ScaleStatefulSet { replicas: highest });
    }
    Ok(Step::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(ordinal: u32) -> MemberView {
        MemberView {
            id: 100 + u64::from(ordinal),
            ordinal: Some(ordinal),
            name: format!("demo-etcd-{ordinal}"),
            peer_url: format!("https://demo-etcd-{ordinal}.demo-etcd.ns.svc:2380"),
            learner: false,
            started: true,
            healthy: true,
            lost: false,
        }
    }

    fn voters(n: u32) -> Vec<MemberView> {
        (0..n).map(member).collect()
    }

    fn observed(members: Vec<MemberView>, statefulset_replicas: u32, desired: i32) -> Observed {
        Observed {
            members,
            statefulset_replicas,
            desired,
            replace_lost: true,
        }
    }

    #[test]
    fn ordinals_come_from_peer_urls_of_this_cluster_only() {
        assert_eq!(ordinal_of("https://demo-etcd-3.demo-etcd.ns.svc:2380", "demo"), Some(3));
        assert_eq!(ordinal_of("https://demo-etcd-x.demo-etcd.ns.svc:2380", "demo"), None);
        assert_eq!(ordinal_of("https://other-etcd-0.other-etcd.ns.svc:2380", "demo"), None);
        assert_eq!(ordinal_of("https://10.0.0.1:2380", "demo"), None);
    }

    #[test]
    fn scale_up_adds_one_learner_then_starts_its_pod_then_promotes_it() {
        // 1 → 3, first member.
        assert_eq!(
            next_step(&observed(voters(1), 1, 3)),
            Ok(Step::AddLearner { ordinal: 1 })
        );
        let mut added = member(1);
        added.learner = true;
        added.started = false;
        added.healthy = false;
        let members = vec![member(0), added.clone()];
        assert_eq!(
            next_step(&observed(members.clone(), 1, 3)),
            Ok(Step::ScaleStatefulSet { replicas: 2 })
        );
        assert_eq!(
            next_step(&observed(members, 2, 3)),
            Ok(Step::WaitForLearner {
                ordinal: 1,
                name: "demo-etcd-1".into()
            })
        );
        added.started = true;
        added.healthy = true;
        assert_eq!(
            next_step(&observed(vec![member(0), added], 2, 3)),
            Ok(Step::Promote {
                id: 101,
                name: "demo-etcd-1".into()
            })
        );
        // Promoted: the next member.
        assert_eq!(
            next_step(&observed(voters(2), 2, 3)),
            Ok(Step::AddLearner { ordinal: 2 })
        );
        assert_eq!(next_step(&observed(voters(3), 3, 3)), Ok(Step::Done));
    }

    #[test]
    fn scale_down_removes_the_highest_ordinal_before_its_pod_goes() {
        assert_eq!(
            next_step(&observed(voters(5), 5, 3)),
            Ok(Step::Remove {
                id: 104,
                name: "demo-etcd-4".into(),
                lost: false
            })
        );
        assert_eq!(
            next_step(&observed(voters(4), 5, 3)),
            Ok(Step::Remove {
                id: 103,
                name: "demo-etcd-3".into(),
                lost: false
            }),
            "members before the StatefulSet: one removal at a time, pods follow"
        );
        assert_eq!(
            next_step(&observed(voters(3), 5, 3)),
            Ok(Step::ScaleStatefulSet { replicas: 3 })
        );
        assert_eq!(
            next_step(&observed(voters(2), 2, 1)),
            Ok(Step::Remove {
                id: 101,
                name: "demo-etcd-1".into(),
                lost: false
            })
        );
    }

    #[test]
    fn an_unhealthy_member_blocks_a_change_but_not_the_steady_state() {
        let mut members = voters(3);
        members[2].healthy = false;
        assert_eq!(
            next_step(&observed(members.clone(), 3, 5)),
            Err(Refusal::MemberUnhealthy {
                names: "demo-etcd-2".into()
            })
        );
        assert_eq!(next_step(&observed(members.clone(), 3, 3)), Ok(Step::Done));
        assert_eq!(
            next_step(&observed(members, 3, 1)).unwrap_err().reason(),
            "EtcdMemberUnhealthy"
        );
    }

    #[test]
    fn quorum_lost_changes_nothing_not_even_a_lost_member() {
        let mut members = voters(3);
        members[1].healthy = false;
        members[2].healthy = false;
        members[2].lost = true;
        assert_eq!(
            next_step(&observed(members, 3, 3)),
            Err(Refusal::QuorumLost {
                healthy: 1,
                voters: 3,
                quorum: 2
            })
        );
    }

    #[test]
    fn a_removal_that_would_lose_quorum_is_refused() {
        // Two voters, one unhealthy but not lost: quorum (2 of 2) is already gone.
        let mut two = voters(2);
        two[0].healthy = false;
        assert_eq!(next_step(&observed(two, 2, 1)).unwrap_err().reason(), "EtcdQuorumLost");
        // Four voters, one lost: removing it leaves 3 healthy of 3.
        let mut four = voters(4);
        four[3].healthy = false;
        four[3].lost = true;
        assert_eq!(
            next_step(&observed(four, 4, 4)),
            Ok(Step::Remove {
                id: 103,
                name: "demo-etcd-3".into(),
                lost: true
            })
        );
    }

    #[test]
    fn a_lost_member_is_removed_and_added_back_at_its_own_ordinal() {
        let mut members = voters(3);
        members[1].healthy = false;
        members[1].lost = true;
        assert_eq!(
            next_step(&observed(members.clone(), 3, 3)),
            Ok(Step::Remove {
                id: 101,
                name: "demo-etcd-1".into(),
                lost: true
            })
        );
        // Switched off: it is only unhealthy, and nothing changes.
        let mut off = observed(members, 3, 3);
        off.replace_lost = false;
        assert_eq!(next_step(&off), Ok(Step::Done));
        // Removed: added back at ordinal 1, whose pod exists already.
        let remaining = vec![member(0), member(2)];
        assert_eq!(
            next_step(&observed(remaining, 3, 3)),
            Ok(Step::AddLearner { ordinal: 1 })
        );
        let mut learner = member(1);
        learner.id = 999;
        learner.learner = true;
        learner.started = false;
        learner.healthy = false;
        assert_eq!(
            next_step(&observed(vec![member(0), learner, member(2)], 3, 3)),
            Ok(Step::WaitForLearner {
                ordinal: 1,
                name: "demo-etcd-1".into()
            })
        );
    }

    #[test]
    fn below_one_and_foreign_members_are_refused_and_even_counts_warned() {
        assert_eq!(next_step(&observed(voters(1), 1, 0)), Err(Refusal::BelowOne(0)));
        let mut members = voters(1);
        let mut stranger = member(1);
        stranger.ordinal = None;
        stranger.peer_url = "https://10.1.1.1:2380".into();
        members.push(stranger);
        assert_eq!(
            next_step(&observed(members, 1, 1)).unwrap_err().reason(),
            "ForeignEtcdMember"
        );
        assert!(even_warning(4).unwrap().contains("as many failures as 3"));
        assert_eq!(even_warning(3), None);
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }
}
