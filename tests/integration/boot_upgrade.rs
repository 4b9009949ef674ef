//! Issue 13, proven on booted control planes (the runner plays the kubelet and runs each
//! image's own release): a tenant at 1.35 asked for 1.37 passes through 1.36 one step at a
//! time and ends on 1.37.2 with etcd 3.7.0, keeping its objects and answering `/readyz`
//! between steps; and a tenant that uses an API the step's release removes is stopped by the
//! preflight until the acknowledgement annotation.
//!
//! capn runs in-process with a hook that lets it dial the tenant at the address the runner
//! gives its apiserver Service (the preflight reads the tenant's `/metrics`). Wall times and
//! unavailability per step are printed, not asserted as times.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use capn::api::{NestedControlPlane, UpgradeStatus};
use capn::controllers::Settings;
use capn_testkit::runner::Runner;
use capn_testkit::{cluster, test_namespace};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::boot::say;
use crate::harness::find_listed;
use crate::harness::{Capn, apply_doc, capn_binary, secret, secret_value};

/// From apply to a ready control plane (two cores shared with the other tests).
const BOOT: Duration = Duration::from_secs(360);
/// A whole two-step upgrade, rolling three StatefulSets per step.
const UPGRADE: Duration = Duration::from_secs(1200);

/// A booted control plane `demo` whose capn can reach the tenant apiserver.
struct Tenant {
    client: kube::Client,
    ns: String,
    runner: Arc<Runner>,
    capn: Capn,
}

impl Tenant {
    /// Starts the runner and capn (with the tenant hook) in a fresh namespace, applies `docs`
    /// and waits for `demo` to be ready.
    async fn boot(label: &str, docs: Vec<serde_json::Value>) -> Self {
        let client = cluster().client();
        let ns = test_namespace(&client).await;
        let runner = Arc::new(
            Runner::start(&client, &ns, capn_binary())
                .await
                .unwrap_or_else(|e| panic!("the runner did not start: {e}")),
        );
        let hook = crate::boot::tenant_hook(&runner);
        let mut settings = Settings {
            namespace: Some(ns.clone()),
            tenant_config_hook: Some(hook),
            ..Settings::default()
        };
        settings.enabled.public_crds = false;
        let capn = Capn::start_with_settings(&client, settings, &[]);
        let started = Instant::now();
        for doc in docs {
            apply_doc(&client, &ns, doc).await;
        }
        let tenant = Self {
            client,
            ns,
            runner,
            capn,
        };
        tenant
            .runner
            .wait_for("the NestedControlPlane is ready", BOOT, || async {
                tenant.status().await.filter(|s| s.ready).map(|_| ())
            })
            .await;
        say(&format!("{label}: apply → ready in {:.1?}", started.elapsed()));
        tenant
    }

    async fn status(&self) -> Option<capn::api::NestedControlPlaneStatus> {
        Api::<NestedControlPlane>::namespaced(self.client.clone(), &self.ns)
            .get_opt("demo")
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status)
    }

    /// A client of the tenant through the kubeconfig read fresh from `demo-kubeconfig`, when
    /// an apiserver pod is ready.
    async fn fresh_client(&self) -> Option<kube::Client> {
        let kubeconfig = secret_value(&secret(&self.client, &self.ns, "demo-kubeconfig").await?, "value");
        let config = self.runner.client_config(&kubeconfig).await.ok()?;
        kube::Client::try_from(config).ok()
    }

    /// [`Tenant::fresh_client`], waiting for a ready apiserver.
    async fn tenant_client(&self) -> kube::Client {
        self.runner
            .wait_for("an apiserver pod is ready", Duration::from_secs(90), || {
                self.fresh_client()
            })
            .await
    }

    async fn annotate(&self, key: &str, value: &str) {
        Api::<NestedControlPlane>::namespaced(self.client.clone(), &self.ns)
            .patch(
                "demo",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .unwrap();
    }

    async fn ask_for(&self, version: &str) {
        Api::<NestedControlPlane>::namespaced(self.client.clone(), &self.ns)
            .patch(
                "demo",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"version": version}})),
            )
            .await
            .unwrap();
    }

    async fn stop(self) {
        self.capn.stop().await;
        drop(self.runner);
    }
}

/// One `/readyz` answer: when, and whether it was `ok`.
type Sample = (SystemTime, bool);

/// Asks `/readyz` every second through a kubeconfig read fresh from `demo-kubeconfig`,
/// until `done`; a probe tries a fresh client up to three times (the runner resolves the
/// Service to the pods ready at that moment, and one may be going away).
async fn probe(tenant: &Tenant, done: &AtomicBool, samples: &Mutex<Vec<Sample>>) {
    while !done.load(Ordering::SeqCst) {
        let mut ok = false;
        for _ in 0..3 {
            if let Some(client) = tenant.fresh_client().await
                && let Ok(Ok(text)) = tokio::time::timeout(
                    Duration::from_secs(3),
                    client.request_text(http::Request::get("/readyz").body(Vec::new()).unwrap()),
                )
                .await
                && text == "ok"
            {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        samples.lock().unwrap().push((SystemTime::now(), ok));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Probes, failures and the longest run of failures among the samples in `[from, to]`.
fn unavailability(samples: &[Sample], from: SystemTime, to: SystemTime) -> (usize, usize, Duration) {
    let inside: Vec<&Sample> = samples.iter().filter(|(t, _)| *t >= from && *t <= to).collect();
    let failed = inside.iter().filter(|(_, ok)| !ok).count();
    let mut longest = Duration::ZERO;
    let mut down: Option<SystemTime> = None;
    for (t, ok) in &inside {
        match (ok, down) {
            (false, None) => down = Some(*t),
            (true, Some(since)) => {
                longest = longest.max(t.duration_since(since).unwrap_or_default());
                down = None;
            }
            _ => {}
        }
    }
    if let (Some(since), Some((last, _))) = (down, inside.last()) {
        longest = longest.max(last.duration_since(since).unwrap_or_default());
    }
    (inside.len(), failed, longest)
}

fn system_time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.0.as_second()).unwrap_or(0))
}

/// Prints each step's wall time and the tenant's unavailability during it and between steps.
fn report(label: &str, upgrade: &UpgradeStatus, samples: &[Sample]) {
    let mut previous_end: Option<SystemTime> = None;
    for (i, step) in upgrade.steps.iter().enumerate() {
        let (Some(start), Some(end)) = (step.start_time.as_ref(), step.finish_time.as_ref()) else {
            continue;
        };
        let (start, end) = (system_time(start), system_time(end));
        if let Some(prev) = previous_end {
            let (probes, failed, longest) = unavailability(samples, prev, start);
            say(&format!(
                "{label}: between steps {i} and {}: {probes} probes, {failed} failed, longest outage {longest:.0?}",
                i + 1
            ));
        }
        let (probes, failed, longest) = unavailability(samples, start, end);
        say(&format!(
            "{label}: step {}/{} to {} (etcd {}{}): {} s; {probes} probes, {failed} failed, longest outage {longest:.0?}",
            i + 1,
            upgrade.steps.len(),
            step.kubernetes,
            step.etcd,
            if step.etcd_changes { ", moves" } else { "" },
            step.duration_seconds.unwrap_or_default()
        ));
        previous_end = Some(end);
    }
}

/// Boots 1.35 (etcd at 1.35's default, 3.6.8) with `apiservers` replicas, asks for 1.37, and
/// follows the path to its end while probing `/readyz`.
async fn upgrade_1_35_to_1_37(label: &str, apiservers: i32) {
    let tenant = Tenant::boot(
        label,
        vec![json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "NestedControlPlane",
            "metadata": {"name": "demo"},
            "spec": {"version": "1.35", "replicas": apiservers},
        })],
    )
    .await;
    let start = tenant.status().await.unwrap();
    let components = start.components.clone().unwrap();
    assert_eq!(start.version.as_deref(), Some("1.35.4"));
    assert_eq!(components.etcd.unwrap().version.as_deref(), Some("3.6.8"));
    // Objects made before the upgrade.
    let nested = tenant.tenant_client().await;
    Api::<Namespace>::all(nested.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("before-upgrade".into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("a namespace");
    Api::<ConfigMap>::namespaced(nested, "before-upgrade")
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("kept".into()),
                    ..ObjectMeta::default()
                },
                data: Some([("made-on".to_string(), "1.35.4".to_string())].into()),
                ..ConfigMap::default()
            },
        )
        .await
        .expect("a ConfigMap");

    let asked = Instant::now();
    tenant.ask_for("1.37").await;
    let done = AtomicBool::new(false);
    let samples = Mutex::new(Vec::new());
    let seen = Mutex::new(BTreeSet::new());
    let follow = async {
        let upgrade = tenant
            .runner
            .wait_for("the upgrade to 1.37 completes", UPGRADE, || async {
                let status = tenant.status().await?;
                if let Some(v) = status.version.clone() {
                    seen.lock().unwrap().insert(v);
                }
                // Nothing in this tenant uses a removed API and no step fails: stop at once
                // with the reason rather than at the deadline. (A preflight that waits for a
                // rolled apiserver to leave the EndpointSlice passes by itself.)
                let finding = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "UpgradePreflight" && c.reason == "RemovedAPIsInUse");
                if let Some(u) = &status.upgrade
                    && (u.phase == "Failed" || finding)
                {
                    panic!("the upgrade stopped: {}", u.message);
                }
                let upgrade = status.upgrade.filter(|u| u.phase == "Completed")?;
                (status.ready && status.version.as_deref() == Some("1.37.2")).then_some(upgrade)
            })
            .await;
        done.store(true, Ordering::SeqCst);
        upgrade
    };
    let ((), upgrade) = tokio::join!(probe(&tenant, &done, &samples), follow);
    let samples = samples.into_inner().unwrap();
    say(&format!(
        "{label}: asked for 1.37 → completed in {:.0?}; apiserver releases seen: {:?}",
        asked.elapsed(),
        seen.lock().unwrap()
    ));
    report(label, &upgrade, &samples);

    let steps: Vec<(&str, &str, &str)> = upgrade
        .steps
        .iter()
        .map(|s| (s.kubernetes.as_str(), s.etcd.as_str(), s.state.as_str()))
        .collect();
    assert_eq!(
        steps,
        [("1.36.3", "3.6.8", "Succeeded"), ("1.37.2", "3.7.0", "Succeeded")]
    );
    assert!(
        seen.lock().unwrap().contains("1.36.3"),
        "the apiserver passed through 1.36.3: {:?}",
        seen.lock().unwrap()
    );
    assert!(upgrade.steps[0].finish_time <= upgrade.steps[1].start_time);
    let end = tenant.status().await.unwrap();
    let components = end.components.unwrap();
    assert_eq!(components.etcd.unwrap().version.as_deref(), Some("3.7.0"));
    assert_eq!(
        components.controller_manager.unwrap().version.as_deref(),
        Some("1.37.2")
    );
    // The runner checks each binary's --version against the image tag, so the pods run
    // the releases the status reports.
    // Objects made before are still there.
    let nested = tenant.tenant_client().await;
    let kept = Api::<ConfigMap>::namespaced(nested.clone(), "before-upgrade")
        .get("kept")
        .await
        .expect("the ConfigMap made on 1.35.4");
    assert_eq!(kept.data.unwrap()["made-on"], "1.35.4");
    let readyz = nested
        .request_text(http::Request::get("/readyz").body(Vec::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(readyz, "ok");
    let failed = samples.iter().filter(|(_, ok)| !ok).count();
    say(&format!(
        "{label}: {} probes over the whole upgrade, {failed} failed",
        samples.len()
    ));
    tenant.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_upgrade_1_35_to_1_37_through_1_36_with_one_apiserver() {
    upgrade_1_35_to_1_37("upgrade, 1 apiserver", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_upgrade_1_35_to_1_37_through_1_36_with_three_apiservers() {
    upgrade_1_35_to_1_37("upgrade, 3 apiservers", 3).await;
}

/// `networking.k8s.io/v1beta1` (ServiceCIDR, IPAddress) carries
/// `+k8s:prerelease-lifecycle-gen:removed=1.37` (k8s.io/api v0.36.3,
/// networking/v1beta1/zz_generated.prerelease-lifecycle.go): 1.36 serves it when
/// `--runtime-config` enables it, 1.37 no longer does. The step from 1.36 to 1.37 removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_upgrade_preflight_stops_on_a_removed_api_until_acknowledged() {
    let tenant = Tenant::boot(
        "removed API",
        vec![
            json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                "kind": "NestedAPIServer",
                "metadata": {"name": "demo-apiserver"},
                "spec": {"extraArgs": {"runtime-config": "networking.k8s.io/v1beta1=true"}},
            }),
            json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                "kind": "NestedControlPlane",
                "metadata": {"name": "demo"},
                "spec": {"version": "1.36", "apiserver": {"name": "demo-apiserver"}},
            }),
        ],
    )
    .await;
    // A client of the tenant lists ServiceCIDRs through the deprecated version.
    let nested = tenant.tenant_client().await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.k8s.io", "v1beta1", "ServiceCIDR"),
        "servicecidrs",
    );
    let cidrs = Api::<DynamicObject>::all_with(nested, &ar)
        .list(&ListParams::default())
        .await
        .expect("1.36 serves networking.k8s.io/v1beta1 servicecidrs");
    say(&format!(
        "removed API: v1beta1 lists {} ServiceCIDR(s)",
        cidrs.items.len()
    ));

    tenant.ask_for("1.37").await;
    let stopped = tenant
        .runner
        .wait_for(
            "the preflight stops the step to 1.37",
            Duration::from_secs(120),
            || async {
                let status = tenant.status().await?;
                let upgrade = status.upgrade.clone()?;
                (upgrade.phase == "PreflightFailed").then_some(status)
            },
        )
        .await;
    let preflight = stopped.upgrade.as_ref().unwrap().preflight.clone().unwrap();
    assert_eq!(preflight.step, "1.37.2");
    let found: Vec<(String, String, String, String)> = preflight
        .removed_apis
        .iter()
        .map(|a| {
            (
                a.group.clone(),
                a.version.clone(),
                a.resource.clone(),
                a.removed_release.clone(),
            )
        })
        .collect();
    assert!(
        found.contains(&(
            "networking.k8s.io".into(),
            "v1beta1".into(),
            "servicecidrs".into(),
            "1.37".into()
        )),
        "{found:?}"
    );
    let condition = stopped
        .conditions
        .iter()
        .find(|c| c.type_ == "UpgradePreflight")
        .expect("the UpgradePreflight condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "RemovedAPIsInUse")
    );
    assert!(
        condition
            .message
            .contains("servicecidrs.v1beta1.networking.k8s.io (removed in 1.37)"),
        "{}",
        condition.message
    );
    assert_eq!(stopped.version.as_deref(), Some("1.36.3"), "nothing moved");
    let warned = tenant
        .runner
        .wait_for("a Warning Event names the API", Duration::from_secs(30), || async {
            find_listed(&Api::<Event>::namespaced(tenant.client.clone(), &tenant.ns), |e| {
                e.reason.as_deref() == Some("RemovedAPIsInUse")
                    && e.message.as_deref().unwrap_or_default().contains("servicecidrs")
            })
            .await
        })
        .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));

    tenant.annotate(capn::upgrade::ACKNOWLEDGE_ANNOTATION, "1.37").await;
    let asked = Instant::now();
    let upgrade = tenant
        .runner
        .wait_for("the acknowledged upgrade completes", UPGRADE, || async {
            let status = tenant.status().await?;
            let upgrade = status.upgrade.filter(|u| u.phase == "Completed")?;
            (status.ready && status.version.as_deref() == Some("1.37.2")).then_some(upgrade)
        })
        .await;
    let preflight = upgrade.preflight.unwrap();
    assert!(preflight.passed && preflight.acknowledged, "{preflight:?}");
    say(&format!(
        "removed API: acknowledged → 1.37.2 in {:.0?} (step {} s)",
        asked.elapsed(),
        upgrade.steps[0].duration_seconds.unwrap_or_default()
    ));
    tenant.stop().await;
}
