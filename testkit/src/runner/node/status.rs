//! A pod's status as the kubelet writes it, from what the node knows of its containers.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::super::{ContainerReport, PodShared, lock};
use super::objects::time;

/// What the status of one pod is computed from.
pub(super) struct Seen<'a> {
    pub pod: &'a Pod,
    /// The node's address (`hostIP`).
    pub host_ip: Ipv4Addr,
    /// The running pod, or `None` when the node refused it.
    pub running: Option<&'a PodShared>,
    /// Why the node refused to run it: `(reason, message)` for every container.
    pub refused: Option<&'a (String, String)>,
    /// When the node first took the pod on (`startTime`).
    pub start_time: SystemTime,
}

/// The pod's `status`, as the kubelet would write it now.
pub(super) fn pod_status(seen: &Seen<'_>) -> Value {
    let pod = seen.pod;
    let spec = pod.spec.clone().unwrap_or_default();
    let reports: BTreeMap<String, ContainerReport> =
        seen.running.map(|p| lock(&p.containers).clone()).unwrap_or_default();
    let ip = seen.running.and_then(|p| *lock(&p.ip));
    let waiting = seen.running.and_then(|p| lock(&p.waiting).clone());
    let initialized = spec.containers.iter().all(|c| reports.contains_key(&c.name));
    let containers: Vec<Option<&ContainerReport>> = spec.containers.iter().map(|c| reports.get(&c.name)).collect();
    let init_failed = seen.running.is_some_and(|p| p.init_failed.load(Ordering::SeqCst));
    let all_finished = initialized && containers.iter().all(|c| c.is_some_and(|c| c.finished));
    let phase = if init_failed {
        "Failed"
    } else if all_finished {
        let failed = containers
            .iter()
            .flatten()
            .any(|c| c.terminated.as_ref().is_some_and(|t| t.exit_code != 0));
        if failed { "Failed" } else { "Succeeded" }
    } else if initialized
        && containers
            .iter()
            .flatten()
            .any(|c| c.pid.is_some() || c.terminated.is_some())
    {
        "Running"
    } else {
        "Pending"
    };
    let ready = initialized && containers.iter().all(|c| c.is_some_and(|c| c.ready));
    let old_conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = time(SystemTime::now());
    // The kubelet's message for unready containers (`pkg/kubelet/status/generate.go`: Go's
    // `%s` of the names, `[a b]`).
    let unready: Vec<&str> = spec
        .containers
        .iter()
        .filter(|c| !reports.get(&c.name).is_some_and(|r| r.ready))
        .map(|c| c.name.as_str())
        .collect();
    let unready = format!("containers with unready status: [{}]", unready.join(" "));
    let condition = |kind: &str, status: bool, reason: Option<&str>| {
        let status = if status { "True" } else { "False" };
        // The transition time stays while the status does.
        let since = old_conditions
            .iter()
            .find(|c| c.type_ == kind && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .and_then(|t| serde_json::to_value(t).ok())
            .unwrap_or_else(|| json!(now));
        let mut c = json!({"type": kind, "status": status, "lastTransitionTime": since});
        if let Some(reason) = reason.filter(|_| status == "False") {
            c["reason"] = json!(reason);
            if reason == "ContainersNotReady" {
                c["message"] = json!(unready);
            }
        }
        c
    };
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let sandbox = ip.is_some() && !terminal;
    let conditions = json!([
        condition("PodReadyToStartContainers", sandbox, None),
        condition("Initialized", initialized, Some("ContainersNotInitialized")),
        condition(
            "Ready",
            ready && !terminal,
            Some(if terminal { "PodCompleted" } else { "ContainersNotReady" })
        ),
        condition(
            "ContainersReady",
            ready && !terminal,
            Some(if terminal { "PodCompleted" } else { "ContainersNotReady" })
        ),
        condition("PodScheduled", true, None),
    ]);
    let statuses: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            container_status(&c.name, &image, reports.get(&c.name), seen.refused, waiting.as_deref())
        })
        .collect();
    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "hostIP": seen.host_ip.to_string(),
        "hostIPs": [{"ip": seen.host_ip.to_string()}],
        "startTime": time(seen.start_time),
        "containerStatuses": statuses,
    });
    if let Some(qos) = pod.status.as_ref().and_then(|s| s.qos_class.clone()) {
        status["qosClass"] = json!(qos);
    }
    if let Some(ip) = ip {
        status["podIP"] = json!(ip.to_string());
        status["podIPs"] = json!([{"ip": ip.to_string()}]);
    }
    status
}

/// One entry of `containerStatuses`.
fn container_status(
    name: &str,
    image: &str,
    report: Option<&ContainerReport>,
    refused: Option<&(String, String)>,
    pod_waiting: Option<&str>,
) -> Value {
    let waiting = |reason: &str, message: Option<&str>| {
        let mut w = json!({"reason": reason});
        if let Some(m) = message {
            w["message"] = json!(m);
        }
        json!({ "waiting": w })
    };
    let terminated = |t: &super::super::Termination| {
        json!({"terminated": {
            "exitCode": t.exit_code,
            "reason": if t.exit_code == 0 { "Completed" } else { "Error" },
            "startedAt": time(t.started),
            "finishedAt": time(t.finished),
        }})
    };
    let (state, last_state) = match (report, refused) {
        (_, Some((reason, message))) => (waiting(reason, Some(message)), json!({})),
        (None, None) => (waiting("PodInitializing", pod_waiting), json!({})),
        (Some(r), None) => {
            let last = r.terminated.as_ref().map(terminated).unwrap_or_else(|| json!({}));
            match (r.running_since, &r.terminated) {
                (Some(since), _) => (json!({"running": {"startedAt": time(since)}}), last),
                (None, Some(t)) if r.finished => (terminated(t), json!({})),
                (None, Some(_)) => (waiting("CrashLoopBackOff", r.last_exit.as_deref()), last),
                (None, None) => match pod_waiting {
                    Some(why) if why.starts_with("CreateContainerConfigError") => {
                        (waiting("CreateContainerConfigError", Some(why)), last)
                    }
                    other => (waiting("ContainerCreating", other), last),
                },
            }
        }
    };
    let report = report.cloned().unwrap_or_default();
    json!({
        "name": name,
        "image": image,
        // No image is pulled: the node says which local binary stands for it (adaptation 1).
        "imageID": format!("capn-node://{image}"),
        "containerID": format!("capn-node://{name}-{}", report.restarts),
        "ready": report.ready,
        "started": report.started && report.pid.is_some(),
        "restartCount": report.restarts,
        "state": state,
        "lastState": last_state,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::runner::{Termination, lock};

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            "status": {"qosClass": "BestEffort"},
        }))
        .expect("a Pod")
    }

    fn seen<'a>(pod: &'a Pod, running: Option<&'a PodShared>, refused: Option<&'a (String, String)>) -> Value {
        pod_status(&Seen {
            pod,
            host_ip: Ipv4Addr::new(198, 18, 0, 1),
            running,
            refused,
            start_time: SystemTime::UNIX_EPOCH,
        })
    }

    fn shared(policy: &str) -> std::sync::Arc<PodShared> {
        PodShared::new(
            ("ns/web", "web", "ns"),
            String::new(),
            policy,
            "ns/web",
            PathBuf::from("/nonexistent"),
        )
    }

    #[test]
    fn a_running_ready_container_makes_a_running_ready_pod() {
        let pod = pod();
        let running = shared("Always");
        *lock(&running.ip) = Some(Ipv4Addr::new(198, 18, 0, 7));
        lock(&running.containers).insert(
            "c".into(),
            ContainerReport {
                name: "c".into(),
                pid: Some(42),
                ready: true,
                started: true,
                running_since: Some(SystemTime::UNIX_EPOCH),
                ..ContainerReport::default()
            },
        );
        let status = seen(&pod, Some(&running), None);
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["podIP"], "198.18.0.7");
        assert_eq!(status["hostIP"], "198.18.0.1");
        assert_eq!(status["qosClass"], "BestEffort");
        assert_eq!(status["startTime"], "1970-01-01T00:00:00Z");
        for condition in status["conditions"].as_array().expect("conditions") {
            assert_eq!(condition["status"], "True", "{condition}");
        }
        let container = &status["containerStatuses"][0];
        assert_eq!(container["ready"], true);
        assert_eq!(container["state"]["running"]["startedAt"], "1970-01-01T00:00:00Z");
    }

    #[test]
    fn finished_containers_end_the_pod_by_their_exit_codes() {
        let pod = pod();
        for (code, phase, reason) in [(0, "Succeeded", "Completed"), (3, "Failed", "Error")] {
            let ended = shared("Never");
            lock(&ended.containers).insert(
                "c".into(),
                ContainerReport {
                    name: "c".into(),
                    finished: true,
                    terminated: Some(Termination {
                        exit_code: code,
                        started: SystemTime::UNIX_EPOCH,
                        finished: SystemTime::UNIX_EPOCH,
                    }),
                    ..ContainerReport::default()
                },
            );
            let status = seen(&pod, Some(&ended), None);
            assert_eq!(status["phase"], phase);
            assert_eq!(status["containerStatuses"][0]["state"]["terminated"]["reason"], reason);
            assert_eq!(status["containerStatuses"][0]["state"]["terminated"]["exitCode"], code);
        }
    }

    #[test]
    fn a_refused_pod_stays_pending_with_the_reason_on_each_container() {
        let pod = pod();
        let refusal = ("ErrImagePull".to_owned(), "only agnhost and pause".to_owned());
        let status = seen(&pod, None, Some(&refusal));
        assert_eq!(status["phase"], "Pending");
        assert_eq!(
            status["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ErrImagePull"
        );
        assert_eq!(
            status["containerStatuses"][0]["state"]["waiting"]["message"],
            "only agnhost and pause"
        );
        assert!(status.get("podIP").is_none());
    }
}
