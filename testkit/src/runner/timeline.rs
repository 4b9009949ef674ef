//! Where a boot's time goes (issue 11, "Real boot": the time each component takes from
//! process start to ready, and capn's share of the total). The runner records a
//! [`Milestone`] at each step it plays the kubelet and StatefulSet controller for; the
//! breakdown splits the time from apply to Ready between the components' own start-up, the
//! runner's pod starts and status writes, and capn (rendering, certificates, applies, status,
//! and the wake-ups from one component's readiness to the next one's apply).

use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

/// One step of a pod's start, as the runner saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Milestone {
    pub at: Instant,
    /// The StatefulSet the pod belongs to.
    pub set: String,
    /// The pod (`<set>-<ordinal>`).
    pub pod: String,
    pub stage: Stage,
}

/// The steps, in the order they happen for one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The runner created the pod (the StatefulSet controller's and the scheduler's part).
    PodCreated,
    /// The pod's first main container process started (the kubelet's part before it:
    /// network, volumes, mounts).
    ProcessStarted,
    /// Every container of the pod passed its readiness probe.
    Ready,
    /// The StatefulSet status that counts the pod ready was written.
    StatusWritten,
}

/// One pod's first start, from the milestones of its StatefulSet's first pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodStart {
    pub set: String,
    pub created: Instant,
    pub process: Option<Instant>,
    pub ready: Option<Instant>,
    pub status: Option<Instant>,
}

/// The first start of each StatefulSet's pod 0, in the order the pods were created. Later
/// starts (restarts, rolls) are left out: the breakdown is about the first boot.
pub fn first_starts(milestones: &[Milestone]) -> Vec<PodStart> {
    let mut starts: Vec<PodStart> = Vec::new();
    for m in milestones.iter().filter(|m| m.pod == format!("{}-0", m.set)) {
        let index = starts.iter().position(|s| s.set == m.set);
        match (m.stage, index) {
            (Stage::PodCreated, None) => starts.push(PodStart {
                set: m.set.clone(),
                created: m.at,
                process: None,
                ready: None,
                status: None,
            }),
            (Stage::ProcessStarted, Some(i)) => {
                starts[i].process.get_or_insert(m.at);
            }
            (Stage::Ready, Some(i)) => {
                starts[i].ready.get_or_insert(m.at);
            }
            (Stage::StatusWritten, Some(i)) if starts[i].ready.is_some() => {
                starts[i].status.get_or_insert(m.at);
            }
            _ => {}
        }
    }
    starts.sort_by_key(|s| s.created);
    starts
}

/// The breakdown of a boot from `applied` to `ready` (the NestedControlPlane's Ready seen),
/// one line per component and a closing line with the three shares. The components boot one
/// after the other (each waits for its predecessor), so their start-to-ready times add up on
/// the critical path; what the runner and the components do not account for is capn's.
pub fn breakdown(applied: Instant, ready: Instant, starts: &[PodStart]) -> String {
    let at = |t: Instant| t.saturating_duration_since(applied).as_secs_f64();
    let span = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    };
    let mut out = String::new();
    let (mut components, mut runner) = (Duration::ZERO, Duration::ZERO);
    for s in starts {
        let process_to_ready = span(s.process, s.ready);
        components += process_to_ready;
        runner += span(Some(s.created), s.process) + span(s.ready, s.status);
        let show = |t: Option<Instant>| t.map_or_else(|| "-".to_owned(), |t| format!("+{:.2}s", at(t)));
        let _ = writeln!(
            out,
            "{:<28} pod {}  process {}  ready {}  status {}  (process start → ready {:.2}s)",
            s.set,
            show(Some(s.created)),
            show(s.process),
            show(s.ready),
            show(s.status),
            process_to_ready.as_secs_f64()
        );
    }
    let total = ready.saturating_duration_since(applied);
    let capn = total.saturating_sub(components + runner);
    let share = |d: Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64().max(f64::EPSILON);
    let _ = writeln!(
        out,
        "apply → Ready {:.2}s: components' start-up {:.2}s ({:.0}%), runner (pod starts, status writes) {:.2}s ({:.0}%), capn {:.2}s ({:.0}%)",
        total.as_secs_f64(),
        components.as_secs_f64(),
        share(components),
        runner.as_secs_f64(),
        share(runner),
        capn.as_secs_f64(),
        share(capn)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(at: Instant, set: &str, pod: &str, stage: Stage) -> Milestone {
        Milestone {
            at,
            set: set.to_owned(),
            pod: pod.to_owned(),
            stage,
        }
    }

    #[test]
    fn the_shares_add_up_to_the_total_and_later_starts_are_left_out() {
        let t0 = Instant::now();
        let s = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let milestones = vec![
            m(s(1.0), "demo-etcd", "demo-etcd-0", Stage::PodCreated),
            m(s(1.5), "demo-etcd", "demo-etcd-0", Stage::ProcessStarted),
            m(s(2.5), "demo-etcd", "demo-etcd-0", Stage::Ready),
            m(s(2.6), "demo-etcd", "demo-etcd-0", Stage::StatusWritten),
            // A second member and a restart of the first do not count.
            m(s(2.7), "demo-etcd", "demo-etcd-1", Stage::PodCreated),
            m(s(3.0), "demo-apiserver", "demo-apiserver-0", Stage::PodCreated),
            m(s(3.2), "demo-apiserver", "demo-apiserver-0", Stage::ProcessStarted),
            m(s(5.0), "demo-etcd", "demo-etcd-0", Stage::ProcessStarted),
            m(s(7.2), "demo-apiserver", "demo-apiserver-0", Stage::Ready),
            m(s(7.4), "demo-apiserver", "demo-apiserver-0", Stage::StatusWritten),
        ];
        let starts = first_starts(&milestones);
        assert_eq!(
            starts.iter().map(|s| s.set.as_str()).collect::<Vec<_>>(),
            ["demo-etcd", "demo-apiserver"]
        );
        assert_eq!(starts[0].process, Some(s(1.5)));
        let text = breakdown(t0, s(10.0), &starts);
        // Components: 1.0 + 4.0; runner: 0.5 + 0.1 + 0.2 + 0.2; capn: the remaining 4.0.
        assert!(
            text.contains("apply → Ready 10.00s: components' start-up 5.00s (50%), runner (pod starts, status writes) 1.00s (10%), capn 4.00s (40%)"),
            "{text}"
        );
        assert!(text.contains("demo-apiserver"), "{text}");
        assert!(text.contains("(process start → ready 4.00s)"), "{text}");
    }

    #[test]
    fn a_pod_that_never_became_ready_counts_nothing_past_its_start() {
        let t0 = Instant::now();
        let milestones = vec![
            m(t0, "demo-etcd", "demo-etcd-0", Stage::PodCreated),
            m(
                t0 + Duration::from_secs(1),
                "demo-etcd",
                "demo-etcd-0",
                Stage::ProcessStarted,
            ),
            // A status write before the pod is ready is not the ready status.
            m(
                t0 + Duration::from_secs(1),
                "demo-etcd",
                "demo-etcd-0",
                Stage::StatusWritten,
            ),
        ];
        let starts = first_starts(&milestones);
        assert_eq!(starts[0].ready, None);
        assert_eq!(starts[0].status, None);
        let text = breakdown(t0, t0 + Duration::from_secs(2), &starts);
        assert!(text.contains("ready -"), "{text}");
        assert!(text.contains("components' start-up 0.00s"), "{text}");
    }
}
