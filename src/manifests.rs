//! The clusterctl provider artifacts, generated from the code (CAPI provider contract:
//! `metadata.yaml`, one `*-components.yaml` per provider type, each in one Namespace, with
//! `${VAR:=default}` variables clusterctl substitutes). Two providers ship from this one
//! binary: the control plane provider (NestedControlPlane and its components) and the
//! infrastructure provider (NestedCluster), each a Deployment running only its controllers
//! under a least-privilege ClusterRole.

use serde_json::{Value, json};

use crate::api::{CONTROL_PLANE_GROUP, INFRASTRUCTURE_GROUP};
use crate::crds::crds;

/// The two provider types capn ships.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    ControlPlane,
    Infrastructure,
}

impl Provider {
    /// clusterctl's name of the provider (`control-plane-nested`, `infrastructure-nested`).
    pub fn clusterctl_name(self) -> &'static str {
        match self {
            Self::ControlPlane => "control-plane-nested",
            Self::Infrastructure => "infrastructure-nested",
        }
    }

    /// The components file name clusterctl expects.
    pub fn components_file(self) -> &'static str {
        match self {
            Self::ControlPlane => "control-plane-components.yaml",
            Self::Infrastructure => "infrastructure-components.yaml",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Self::ControlPlane => "capn-control-plane",
            Self::Infrastructure => "capn-infrastructure",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Self::ControlPlane => CONTROL_PLANE_GROUP,
            Self::Infrastructure => INFRASTRUCTURE_GROUP,
        }
    }

    /// The `--controllers` this provider's Deployment runs.
    fn controllers(self) -> &'static str {
        match self {
            Self::ControlPlane => "control-plane,etcd,apiserver,controller-manager,public-crds,syncer",
            Self::Infrastructure => "cluster",
        }
    }
}

/// Default namespace of each provider (clusterctl may move it with `--target-namespace`).
fn namespace(p: Provider) -> String {
    format!("${{NAMESPACE:={}-system}}", p.short())
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["get", "list", "watch", "create", "update", "patch"];

/// The least-privilege rules of a provider's ClusterRole. The control plane provider may
/// write what the built-in `stable` channel renders (Services, StatefulSets,
/// PodDisruptionBudgets, NetworkPolicies) and the
/// certificate Secrets; a channel that renders other kinds needs those added.
pub fn cluster_role_rules(p: Provider) -> Vec<Value> {
    match p {
        Provider::ControlPlane => vec![
            rule(
                &[CONTROL_PLANE_GROUP],
                &[
                    "nestedcontrolplanes",
                    "nestedetcds",
                    "nestedapiservers",
                    "nestedcontrollermanagers",
                ],
                WRITE,
            ),
            rule(
                &[CONTROL_PLANE_GROUP],
                &[
                    "nestedcontrolplanes/status",
                    "nestedetcds/status",
                    "nestedapiservers/status",
                    "nestedcontrollermanagers/status",
                ],
                &["get", "update", "patch"],
            ),
            rule(&[CONTROL_PLANE_GROUP], &["nestedcontrolplanetemplates"], READ),
            rule(&["cluster.x-k8s.io"], &["clusters"], READ),
            // Certificates and kubeconfigs. capn deletes only the `<secret>-next` it made for a
            // CA rotation, once the rotation completes; the garbage collector removes the rest.
            rule(
                &[""],
                &["secrets"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            // What the stable channel renders; pruning deletes what is no longer rendered.
            rule(
                &[""],
                &["services"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            rule(
                &["apps"],
                &["statefulsets"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            // etcd's membership ConfigMap.
            rule(
                &[""],
                &["configmaps"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            // A lost etcd member's data is cleared by deleting its claim and its pod, which
            // the StatefulSet controller creates anew, empty. The syncer (docs/design.md §11)
            // writes tenant pods and the claims they use into workload namespaces.
            rule(
                &[""],
                &["persistentvolumeclaims", "pods"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            // The syncer's workload namespaces, each with its ResourceQuota, LimitRange and
            // `default` ServiceAccount (token automount off); the super nodes its pods run on
            // are read for their tenant Nodes, and the volumes bound to its claims for their
            // tenant PersistentVolumes.
            rule(
                &[""],
                &["namespaces", "resourcequotas", "limitranges"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            rule(&[""], &["serviceaccounts"], &["get", "create", "update", "patch"]),
            // `list`: the schedulable super nodes a tenant sees (`spec.workloads.nodes`).
            rule(&[""], &["nodes"], &["get", "list"]),
            rule(&[""], &["persistentvolumes"], READ),
            // The tenant Nodes' kubelet API answers `kubectl logs`, `exec`, `attach` and
            // `port-forward` from the super pods' (a stream is `create`, or `get` over
            // WebSockets); capn run outside the super cluster reaches the control planes'
            // pods by `port-forward` (`crate::reach`).
            rule(&[""], &["pods/log"], &["get"]),
            rule(
                &[""],
                &["pods/exec", "pods/attach", "pods/portforward"],
                &["get", "create"],
            ),
            rule(
                &["policy"],
                &["poddisruptionbudgets"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            rule(
                &["networking.k8s.io"],
                &["networkpolicies"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            // The syncer copies the EndpointSlices of tenant Services without a selector.
            rule(
                &["discovery.k8s.io"],
                &["endpointslices"],
                &["get", "list", "watch", "create", "update", "patch", "delete"],
            ),
            // capn's own Events; the syncer watches the super cluster's Events about the
            // pods it made, to tell them in the tenants.
            rule(&["events.k8s.io"], &["events"], &["list", "watch", "create", "patch"]),
            // The public CRD sync reads the super cluster's CRDs (tenants are written with
            // their own admin kubeconfig).
            rule(&["apiextensions.k8s.io"], &["customresourcedefinitions"], READ),
        ],
        Provider::Infrastructure => vec![
            rule(&[INFRASTRUCTURE_GROUP], &["nestedclusters"], WRITE),
            rule(
                &[INFRASTRUCTURE_GROUP],
                &["nestedclusters/status"],
                &["get", "update", "patch"],
            ),
            rule(&[INFRASTRUCTURE_GROUP], &["nestedclustertemplates"], READ),
            rule(&[CONTROL_PLANE_GROUP], &["nestedcontrolplanes"], READ),
            rule(&["cluster.x-k8s.io"], &["clusters"], READ),
            rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
        ],
    }
}

/// Label of a ClusterRole whose rules capn's control plane provider gets by aggregation:
/// the rights on the custom resource kinds a platform lets tenants sync
/// (`tenancy.x-k8s.io/sync-instances`), which no shipped role can name in advance.
pub const SYNCED_KINDS_LABEL: &str = "controlplane.cluster.x-k8s.io/aggregate-to-capn-syncer";

/// Every object of a provider's components file, in apply order.
pub fn components(p: Provider) -> Vec<Value> {
    let ns = namespace(p);
    let name = p.short();
    let labels = json!({"cluster.x-k8s.io/provider": p.clusterctl_name()});
    let mut objects = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": labels},
    })];
    for crd in crds().into_iter().filter(|c| c.spec.group == p.group()) {
        objects.push(serde_json::to_value(crd).unwrap_or_default());
    }
    if p == Provider::ControlPlane {
        // The components' default PriorityClass: capn creates no cluster-scoped object at
        // run time, so it ships with the provider (docs/guide/maintenance.md "Priority and
        // resources").
        objects.push(crate::plan::policy::priority_class());
    }
    objects.extend([
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": format!("{name}-manager"), "namespace": ns},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": format!("{name}-manager")},
            "rules": cluster_role_rules(p),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{name}-manager")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{name}-manager")},
            "subjects": [{"kind": "ServiceAccount", "name": format!("{name}-manager"), "namespace": ns}],
        }),
    ]);
    if p == Provider::ControlPlane {
        // The custom resource kinds whose instances the syncer copies are the platform's
        // choice, so their rights are too: a ClusterRole labelled SYNCED_KINDS_LABEL is
        // aggregated here (docs/guide/public-crds.md), and nothing more is granted.
        let role = format!("{name}-synced-kinds");
        objects.extend([
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role},
                "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {SYNCED_KINDS_LABEL: "true"}}]},
                "rules": [],
            }),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": format!("{name}-manager"), "namespace": ns}],
            }),
        ]);
    }
    objects.extend([
        // Leader election needs Leases only in the provider's own namespace.
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": format!("{name}-leader-election"), "namespace": ns},
            "rules": [rule(&["coordination.k8s.io"], &["leases"], &["get", "list", "watch", "create", "update", "patch"])],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("{name}-leader-election"), "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("{name}-leader-election")},
            "subjects": [{"kind": "ServiceAccount", "name": format!("{name}-manager"), "namespace": ns}],
        }),
        deployment(p, &ns),
    ]);
    objects
}

fn deployment(p: Provider, ns: &str) -> Value {
    let name = p.short();
    let selector = json!({"control-plane": format!("{name}-manager")});
    // The pods also carry `--self-labels`' default, by which the tenants' NetworkPolicies
    // admit capn (with its namespace, from POD_NAMESPACE) to etcd and the apiserver.
    let mut pod_labels = selector.clone();
    for (k, v) in crate::plan::policy::DEFAULT_CAPN_POD_LABELS
        .split(',')
        .filter_map(|l| l.split_once('='))
    {
        pod_labels[k] = json!(v);
    }
    let env_from_field = |var: &str, path: &str| json!({"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": format!("{name}-manager"), "namespace": ns, "labels": selector},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": format!("{name}-manager"),
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "manager",
                        "image": "${CAPN_IMAGE:=ghcr.io/capn/capn:v0.1.0}",
                        "imagePullPolicy": "IfNotPresent",
                        "args": [
                            "run",
                            "--leader-elect",
                            format!("--leader-election-id={name}"),
                            format!("--controllers={}", p.controllers()),
                            "--super-cluster-dns-domain=${SUPER_CLUSTER_DNS_DOMAIN:=cluster.local}",
                            "--log-format=${CAPN_LOG_FORMAT:=json}",
                            "--metrics-bind-address=0.0.0.0:8080",
                            "--health-probe-bind-address=0.0.0.0:8081",
                        ],
                        // The etcd restore init containers run capn's own image: the same one.
                        // The pod IP is where tenant apiservers reach the syncer's kubelet API,
                        // and tenant pods their DNS (one `--dns-ports` port per tenant).
                        "env": [env_from_field("POD_NAME", "metadata.name"), env_from_field("POD_NAMESPACE", "metadata.namespace"),
                                env_from_field("POD_IP", "status.podIP"),
                                json!({"name": "CAPN_IMAGE", "value": "${CAPN_IMAGE:=ghcr.io/capn/capn:v0.1.0}"})],
                        "ports": [
                            {"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
                            {"name": "healthz", "containerPort": 8081, "protocol": "TCP"},
                            {"name": "kubelet", "containerPort": 10250, "protocol": "TCP"},
                        ],
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "healthz"}},
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "healthz"}},
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                             "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            },
        },
    })
}

/// clusterctl's `metadata.yaml`: which releases implement which Cluster API contract.
pub fn metadata() -> Value {
    let version = semver::Version::parse(env!("CARGO_PKG_VERSION")).unwrap_or(semver::Version::new(0, 1, 0));
    json!({
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [{"major": version.major, "minor": version.minor, "contract": "v1beta2"}],
    })
}

/// `--watch-filter=` with an empty value means no filter.
pub fn empty_watch_filter_is_none(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files in `clusterctl/` must be what the code generates. Regenerate with
    /// `UPDATE_MANIFESTS=1 cargo test --lib clusterctl_files`.
    #[test]
    fn clusterctl_files_match_the_code() {
        let mut files = vec![(
            "metadata.yaml".to_string(),
            format!("---\n{}", serde_saphyr::to_string(&metadata()).unwrap()),
        )];
        for p in [Provider::ControlPlane, Provider::Infrastructure] {
            let mut text = String::new();
            for o in components(p) {
                text.push_str("---\n");
                text.push_str(&serde_saphyr::to_string(&o).unwrap());
            }
            files.push((p.components_file().to_string(), text));
        }
        for (name, text) in files {
            crate::generated::assert_current(
                &format!("clusterctl/{name}"),
                &text,
                "UPDATE_MANIFESTS",
                "cargo test --lib clusterctl_files",
            );
        }
    }

    #[test]
    fn each_components_file_has_one_namespace_and_its_own_crds() {
        for p in [Provider::ControlPlane, Provider::Infrastructure] {
            let objects = components(p);
            let namespaces: Vec<_> = objects.iter().filter(|o| o["kind"] == "Namespace").collect();
            assert_eq!(namespaces.len(), 1);
            let crd_groups: Vec<_> = objects
                .iter()
                .filter(|o| o["kind"] == "CustomResourceDefinition")
                .map(|o| o["spec"]["group"].as_str().unwrap())
                .collect();
            assert!(!crd_groups.is_empty() && crd_groups.iter().all(|g| *g == p.group()));
            for o in objects.iter().filter(|o| o["metadata"]["namespace"].is_string()) {
                assert_eq!(
                    o["metadata"]["namespace"], namespaces[0]["metadata"]["name"],
                    "{}",
                    o["kind"]
                );
            }
        }
    }

    #[test]
    fn the_control_plane_provider_ships_the_default_priority_class_and_labels_its_pods() {
        let objects = components(Provider::ControlPlane);
        let classes: Vec<_> = objects.iter().filter(|o| o["kind"] == "PriorityClass").collect();
        assert_eq!(classes.len(), 1);
        assert_eq!(classes[0]["metadata"]["name"], "capn-control-plane");
        assert_eq!(classes[0]["globalDefault"], false);
        assert!(
            !components(Provider::Infrastructure)
                .iter()
                .any(|o| o["kind"] == "PriorityClass"),
            "one provider owns the PriorityClass"
        );
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let pod = &deployment["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"]["app.kubernetes.io/name"], "capn");
        let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
        assert!(
            env.iter().any(
                |e| e["name"] == "POD_NAMESPACE" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
            ),
            "capn learns its namespace from the downward API"
        );
        assert!(
            env.iter()
                .any(|e| e["name"] == "POD_IP" && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"),
            "the tenant Nodes announce capn's pod IP for the kubelet API"
        );
        // The selector is immutable on an installed Deployment: the new label is not in it.
        assert_eq!(
            deployment["spec"]["selector"]["matchLabels"],
            json!({"control-plane": "capn-control-plane-manager"})
        );
    }

    #[test]
    fn the_control_plane_role_names_every_kind_and_verb() {
        let rules = cluster_role_rules(Provider::ControlPlane);
        assert!(
            rules
                .iter()
                .all(|r| !r["resources"].as_array().unwrap().iter().any(|x| x == "*"))
        );
        assert!(
            rules
                .iter()
                .all(|r| !r["verbs"].as_array().unwrap().iter().any(|x| x == "*"))
        );
    }
}
