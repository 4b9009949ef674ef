//! Kubernetes Events for condition changes and failures.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use super::Context;

/// Publishes one Event on `object`. Failures are logged, never fatal: an Event is a
/// courtesy, the status is the record.
pub(crate) async fn publish<K>(ctx: &Context, object: &K, warning: bool, reason: &str, note: String, action: &str)
where
    K: Resource<DynamicType = ()>,
{
    let event = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(object = %object.name_any(), error = %e, "could not publish event");
    }
}

/// Publishes an Event for every condition whose status or reason changed between `old`
/// and `new` (Normal when it became True, Warning when a failure reason appeared).
pub(crate) async fn publish_condition_changes<K>(ctx: &Context, object: &K, old: &[Condition], new: &[Condition])
where
    K: Resource<DynamicType = ()>,
{
    for c in new {
        let before = old.iter().find(|o| o.type_ == c.type_);
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        let warning = c.status != "True" && !c.reason.starts_with("Waiting") && c.reason != "Provisioning";
        // A condition appearing for the first time as False without a failure (`Paused`
        // False, `Ready` False while provisioning...) is no news: the status says it, and an
        // Event per condition per object would cost the super cluster a write each.
        if before.is_none() && c.status == "False" && !warning {
            continue;
        }
        let note = format!("{} is {}: {}", c.type_, c.status, c.message);
        publish(ctx, object, warning, &c.reason, note, "Reconcile").await;
    }
}
