//! Kubernetes Events for condition changes and failures, and capn's recorder of them.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Resource, ResourceExt};

pub use self::recorder::{Occurrence, Recorder};
use crate::controllers::Context;
use crate::status::Reason;

mod recorder;

/// Publishes one Event on `object` for a step capn took, with `secondary` as its `related`
/// object (for example the Pod of the etcd member a membership step changed). The Event is
/// a Warning when `reason` is a failure ([`Reason::is_failure`]).
pub(crate) async fn publish<K>(
    ctx: &Context,
    object: &K,
    secondary: Option<ObjectReference>,
    reason: Reason,
    note: String,
    action: &str,
) where
    K: Resource<DynamicType = ()>,
{
    send(
        ctx,
        object,
        secondary,
        reason.is_failure(),
        reason.as_str(),
        note,
        action,
    )
    .await;
}

/// Sends one Event through capn's [`Recorder`] (a repeat within six minutes is patched as a
/// series). Failures are logged, never fatal: an Event is a courtesy, the status is the
/// record.
async fn send<K>(
    ctx: &Context,
    object: &K,
    secondary: Option<ObjectReference>,
    warning: bool,
    reason: &str,
    note: String,
    action: &str,
) where
    K: Resource<DynamicType = ()>,
{
    let occurrence = Occurrence {
        warning,
        reason,
        action,
        note,
        regarding: object.object_ref(&()),
        related: secondary,
    };
    if let Err(e) = ctx.recorder.publish(&occurrence).await {
        tracing::warn!(object = %object.name_any(), error = %e, "could not publish event");
    }
}

/// The milestones a user waits for: an Event when they flip.
const NOTABLE: &[&str] = &[crate::status::READY, crate::status::AVAILABLE];

/// Publishes an Event for the condition changes between `old` and `new` that a user would
/// want told about: a Warning for every failure that appears, and a Normal Event when a
/// milestone ([`NOTABLE`]) flips, a CA rotation moves, or a condition recovers from a failure.
/// Progress in between (waiting, provisioning, rolling out) is in the status only: an Event
/// is a write to the super cluster, and a provisioning should cost only a few (at most 10
/// per control plane).
pub(crate) async fn publish_condition_changes<K>(ctx: &Context, object: &K, old: &[Condition], new: &[Condition])
where
    K: Resource<DynamicType = ()>,
{
    for c in new {
        let before = old.iter().find(|o| o.type_ == c.type_);
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        let warning = crate::status::failing(c);
        let recovered = before.is_some_and(crate::status::failing) && !warning;
        // A milestone is news when it flips (or first appears True); a rotation with every
        // phase.
        let flipped = match before {
            Some(b) => b.status != c.status,
            None => c.status == "True",
        };
        let notable = c.type_ == crate::status::CA_ROTATION || (NOTABLE.contains(&c.type_.as_str()) && flipped);
        if !(warning || recovered || notable) {
            continue;
        }
        send(
            ctx,
            object,
            None,
            warning,
            &c.reason,
            condition_note(c, warning),
            "Reconcile",
        )
        .await;
    }
}

/// The note of a condition's Event. A failure says the condition is not what it should be
/// (`Ready is False: …`); anything else says what happened by its reason, since a condition
/// may be False without anything being wrong (a rotation that completed, a member count
/// reached while the rest rolls): `CertificateAuthorityRotation: Completed (…)`.
fn condition_note(c: &Condition, warning: bool) -> String {
    if warning {
        format!("{} is {}: {}", c.type_, c.status, c.message)
    } else {
        format!("{}: {} ({})", c.type_, c.reason, c.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        }
    }

    #[test]
    fn only_a_failure_reads_as_one() {
        let completed = condition(
            "CertificateAuthorityRotation",
            "False",
            "Completed",
            "the rotation finished",
        );
        let note = condition_note(&completed, crate::status::failing(&completed));
        assert_eq!(note, "CertificateAuthorityRotation: Completed (the rotation finished)");
        let failed = condition("Ready", "False", "EtcdUnreachable", "no member answered");
        let note = condition_note(&failed, crate::status::failing(&failed));
        assert_eq!(note, "Ready is False: no member answered");
    }
}
