//! The test kit's node (`capn_testkit::node()`): ordinary pods created without a node are
//! placed by the real kube-scheduler onto it and run there for real, with the status a kubelet
//! writes; deleted pods stop and disappear; the Node stays Ready with a renewed Lease; and the
//! node's pods reach the Services a runner runs in another pod network.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use capn_testkit::net::http_get;
use capn_testkit::runner::Runner;
use capn_testkit::{cluster, node, poll_until, test_namespace};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ContainerState, Node, Pod, Secret, Service, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{capn_binary, local_etcd_release};

/// From creating a pod to it running and ready: scheduling, sandbox, process start, status,
/// on a loaded two-core machine.
const RUN: Duration = Duration::from_secs(90);
/// From deleting a pod to its object being gone.
const GONE: Duration = Duration::from_secs(60);
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.53";

/// A namespace with the `default` ServiceAccount the ServiceAccount admission plugin wants
/// (no controller makes it in the super cluster), once the node runs: pods are run only by
/// a node that was started ([`node`]), which the first test to get here does.
async fn namespace(client: &Client) -> String {
    node();
    let ns = test_namespace(client).await;
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("a ServiceAccount");
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &account)
        .await
        .expect("the default ServiceAccount");
    ns
}

/// A pod without a node and without a service-account token volume (the node does not
/// project tokens: its adaptation 2).
fn pod(name: &str, spec: Value) -> Pod {
    let mut spec = spec;
    spec["automountServiceAccountToken"] = json!(false);
    spec["terminationGracePeriodSeconds"] = json!(5);
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": name}}, "spec": spec})).expect("a Pod")
}

/// agnhost's `netexec` on port 8080, ready when it answers.
fn netexec() -> Value {
    json!({"containers": [{
        "name": "netexec",
        "image": AGNHOST,
        "args": ["netexec", "--http-port=8080"],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
    }]})
}

/// Creates [`pod`] `name` with `spec`.
async fn create(api: &Api<Pod>, name: &str, spec: Value) {
    api.create(&PostParams::default(), &pod(name, spec))
        .await
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
}

fn condition(pod: &Pod, kind: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

/// Waits until `check` holds for the pod, with the node's report on failure.
async fn wait_pod(api: &Api<Pod>, name: &str, what: &str, check: impl Fn(&Pod) -> bool) -> Pod {
    let found = poll_until(RUN, || async {
        let pod = api.get_opt(name).await.ok().flatten()?;
        check(&pod).then_some(pod)
    })
    .await;
    match found {
        Some(pod) => pod,
        None => {
            let last = api.get_opt(name).await.ok().flatten();
            panic!(
                "pod {name} did not become {what} within {RUN:?}; last seen: {:#?}\n{}",
                last.map(|p| p.status),
                node().report()
            )
        }
    }
}

fn running_and_ready(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && condition(pod, "Ready").as_deref() == Some("True")
}

/// The state of the pod's first container (empty before the node reports one).
fn first_state(pod: &Pod) -> ContainerState {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref()?.first()?.state.clone())
        .unwrap_or_default()
}

fn pod_ip(pod: &Pod) -> Ipv4Addr {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no podIP in {:?}", pod.status))
}

/// GETs `path` from port 8080 of `ip` until it answers 200 (the server may still be binding).
async fn get(ip: Ipv4Addr, path: &str) -> String {
    let address = SocketAddr::from((ip, 8080));
    poll_until(RUN, || async {
        match http_get(address, path).await {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    })
    .await
    .unwrap_or_else(|| panic!("GET http://{address}{path} never answered 200\n{}", node().report()))
}

/// Deletes the pod and waits until its object is gone and none of its processes runs.
async fn delete_and_wait(api: &Api<Pod>, ns: &str, name: &str) {
    let key = format!("{ns}/{name}");
    let processes: Vec<(i32, u64)> = node()
        .runner()
        .processes()
        .into_iter()
        .filter(|p| p.pod == key)
        .map(|p| (p.pid, p.start_time))
        .collect();
    api.delete(name, &DeleteParams::default()).await.expect("delete");
    // The API server removes a pod that has ended at once, before the node has seen it go.
    let gone = poll_until(GONE, || async {
        (matches!(api.get_opt(name).await, Ok(None)) && node().pod_ip(ns, name).is_none()).then_some(())
    })
    .await;
    assert!(gone.is_some(), "pod {key} is still there\n{}", node().report());
    for (pid, start_time) in processes {
        // Reaped by the node before it deleted the object: no such process, or another one
        // (the pid reused) that started at another time.
        assert_ne!(
            start_time_of(pid),
            Some(start_time),
            "process {pid} of {key} still runs"
        );
    }
}

/// Field 22 (start time, in clock ticks after boot) of /proc/<pid>/stat.
fn start_time_of(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_places_a_pod_on_the_node_which_runs_it_until_it_is_deleted() {
    let client = cluster().client();
    let node = node();
    let ns = namespace(&client).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&api, "web", netexec()).await;
    let pause = json!({"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]});
    create(&api, "sleeper", pause).await;

    let web = wait_pod(&api, "web", "running and ready", running_and_ready).await;
    let spec = web.spec.as_ref().expect("a spec");
    assert_eq!(spec.node_name.as_deref(), Some(node.name()), "placed by the scheduler");
    let status = web.status.as_ref().expect("a status");
    let ip = pod_ip(&web);
    assert_eq!(node.pod_ip(&ns, "web"), Some(ip));
    assert_eq!(status.host_ip.as_deref(), Some(node.address().to_string().as_str()));
    assert!(status.start_time.is_some());
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    for kind in [
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "PodReadyToStartContainers",
    ] {
        assert_eq!(condition(&web, kind).as_deref(), Some("True"), "{kind}");
    }
    let container = &status.container_statuses.as_ref().expect("container statuses")[0];
    assert_eq!(container.name, "netexec");
    assert!(container.ready && container.started == Some(true));
    assert_eq!(container.restart_count, 0);
    assert!(container.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    assert_eq!(get(ip, "/hostname").await, "web");

    let sleeper = wait_pod(&api, "sleeper", "running", running_and_ready).await;
    assert_ne!(pod_ip(&sleeper), ip);

    let key = format!("{ns}/web");
    assert!(
        node.runner().processes().iter().any(|p| p.pod == key),
        "a process for {key}"
    );
    delete_and_wait(&api, &ns, "web").await;
    delete_and_wait(&api, &ns, "sleeper").await;
    node.runner()
        .check()
        .unwrap_or_else(|e| panic!("{e}\n{}", node.report()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_sees_its_projected_volume_and_its_downward_api_and_env_from_environment() {
    let client = cluster().client();
    let ns = namespace(&client).await;
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "token"}, "stringData": {"token": "s3cret"}}))
            .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the Secret");
    let config_map: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "ca"}, "data": {"ca.crt": "a CA"}})).expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &config_map)
        .await
        .expect("the ConfigMap");
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let files = json!({
            "containers": [{
                "name": "server",
                "image": AGNHOST,
                "args": ["test-webserver", "--port=8080"],
                "envFrom": [{"configMapRef": {"name": "ca"}, "prefix": "FROM_"}],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "token"}}},
                ],
                "volumeMounts": [{"name": "access", "mountPath": "/var/run/secrets/tenant", "readOnly": true}],
            }],
            "volumes": [{"name": "access", "projected": {"sources": [
                {"secret": {"name": "token", "items": [{"key": "token", "path": "token"}]}},
                {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]}}],
    });
    create(&api, "files", files).await;
    let running = wait_pod(&api, "files", "running and ready", running_and_ready).await;
    let ip = pod_ip(&running);
    assert_eq!(get(ip, "/var/run/secrets/tenant/token").await, "s3cret");
    assert_eq!(get(ip, "/var/run/secrets/tenant/ca.crt").await, "a CA");
    assert_eq!(get(ip, "/var/run/secrets/tenant/namespace").await, ns);
    // The pod's own DNS files, as the kubelet writes them for its namespace.
    let resolv = get(ip, "/etc/resolv.conf").await;
    assert!(
        resolv.starts_with(&format!("search {ns}.svc.cluster.local ")),
        "{resolv}"
    );
    let hosts = get(ip, "/etc/hosts").await;
    assert!(hosts.contains(&format!("{ip}\tfiles\n")), "{hosts}");

    let key = format!("{ns}/files");
    let pid = node()
        .runner()
        .pods()
        .into_iter()
        .find(|p| p.name == key)
        .and_then(|p| p.containers[0].pid)
        .expect("a running process");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("its environment");
    let environ: Vec<String> = environ
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    for want in [
        "POD_NAME=files".to_owned(),
        format!("POD_IP={ip}"),
        format!("NODE={}", node().name()),
        "TOKEN=s3cret".to_owned(),
        "FROM_ca.crt=a CA".to_owned(),
    ] {
        assert!(environ.contains(&want), "{want} not in {environ:?}");
    }
    delete_and_wait(&api, &ns, "files").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_end_per_restart_policy_and_unknown_images_are_refused() {
    let client = cluster().client();
    let ns = namespace(&client).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let done = json!({"restartPolicy": "Never", "containers": [{
        "name": "read", "image": AGNHOST, "command": ["/agnhost", "mounttest", "--file_mode=/etc/hostname"]}]});
    create(&api, "done", done).await;
    let fails = json!({"restartPolicy": "Never", "containers": [{
        "name": "exit", "image": AGNHOST, "args": ["fake-subcommand-that-fails"]}]});
    create(&api, "fails", fails).await;
    let elsewhere = json!({"containers": [{"name": "web", "image": "docker.io/library/nginx:1.27"}]});
    create(&api, "elsewhere", elsewhere).await;
    // BusyBox's shell, as the BusyBox image runs it (a Job's `sh -c`) and as the agnhost
    // image holds it.
    let shell = json!({"restartPolicy": "Never", "containers": [{
        "name": "sh", "image": "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
        "command": ["/bin/sh", "-c", "echo from $(cat /etc/hostname); sleep 0.1; exit 3"]}]});
    create(&api, "shell", shell).await;
    // The e2e suite's nginx, as its ReplicationController and EndpointSlice specs run it.
    let web = json!({"containers": [{"name": "web", "image": "registry.k8s.io/e2e-test-images/nginx:1.14-4",
        "ports": [{"containerPort": 80}]}]});
    create(&api, "web", web).await;
    let alpine = json!({"restartPolicy": "Never", "containers": [{
        "name": "sh", "image": AGNHOST, "command": ["sh", "-c", "ls /etc/hostname; nc -h 2>&1 | head -1; dig -v 2>&1; mv /localhost.crt /tmp/ && echo moved"]}]});
    create(&api, "alpine", alpine).await;

    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let done = wait_pod(&api, "done", "Succeeded", |p| phase(p) == "Succeeded").await;
    let terminated = first_state(&done).terminated.expect("terminated");
    assert_eq!(
        (terminated.exit_code, terminated.reason.as_deref()),
        (0, Some("Completed"))
    );
    let fails = wait_pod(&api, "fails", "Failed", |p| phase(p) == "Failed").await;
    assert_eq!(condition(&fails, "Ready").as_deref(), Some("False"));
    let shell = wait_pod(&api, "shell", "Failed", |p| phase(p) == "Failed").await;
    assert_eq!(first_state(&shell).terminated.expect("terminated").exit_code, 3);
    let log = api.logs("shell", &Default::default()).await.unwrap();
    assert_eq!(log, "from shell\n", "the shell ran its applets");
    wait_pod(&api, "alpine", "Succeeded", |p| phase(p) == "Succeeded").await;
    let log = api.logs("alpine", &Default::default()).await.unwrap();
    assert!(
        log.starts_with("/etc/hostname\nOpenBSD netcat") && log.contains("DiG 9.") && log.ends_with("moved\n"),
        "BusyBox's ls, the image's own nc and dig, and its localhost.crt, which a container may move: {log}"
    );

    let web = wait_pod(&api, "web", "running and ready", running_and_ready).await;
    let address = SocketAddr::from((pod_ip(&web), 80));
    let answered = poll_until(RUN, || async {
        matches!(http_get(address, "/").await, Ok((200, _))).then_some(())
    })
    .await;
    assert!(
        answered.is_some(),
        "the nginx stand-in answers on port 80\n{}",
        node().report()
    );

    let refused = wait_pod(&api, "elsewhere", "refused", |p| {
        first_state(p).waiting.and_then(|w| w.reason).as_deref() == Some("ErrImagePull")
    })
    .await;
    assert_eq!(phase(&refused), "Pending");
    let message = first_state(&refused)
        .waiting
        .and_then(|w| w.message)
        .unwrap_or_default();
    assert!(message.contains("agnhost") && message.contains("busybox"), "{message}");
    for name in ["done", "fails", "elsewhere", "shell", "alpine", "web"] {
        delete_and_wait(&api, &ns, name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_stays_ready_and_renews_its_lease() {
    let client = cluster().client();
    let node = node();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone()).map(|t| t.0);
    let first = renewed(&leases.get(node.name()).await.expect("the Lease")).expect("a renewTime");
    // The kubelet renews every 10 s.
    let later = poll_until(Duration::from_secs(60), || async {
        let now = renewed(&leases.get(node.name()).await.ok()?)?;
        (now > first).then_some(now)
    })
    .await;
    assert!(
        later.is_some(),
        "the Lease was not renewed within 60 s\n{}",
        node.report()
    );
    let object = Api::<Node>::all(client).get(node.name()).await.expect("the Node");
    let status = object.status.expect("a status");
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(ready.status, "True");
    assert_eq!(status.allocatable.expect("allocatable")["pods"].0, "110");
    // Its node ports at its InternalIP, its kubelet API at its InternalDNS (adaptation 9).
    let addresses: Vec<_> = status
        .addresses
        .expect("addresses")
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(addresses.contains(&("InternalIP".to_owned(), node.node_port_address().to_string())));
    assert!(addresses.contains(&("InternalDNS".to_owned(), node.address().to_string())));
}

/// A one-member etcd serving clients on its pod address, behind Service `reach`.
fn reach_statefulset(release: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "reach", "labels": {"app.kubernetes.io/managed-by": "capn"}},
        "spec": {
            "serviceName": "reach",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "reach"}},
            "template": {
                "metadata": {"labels": {"app": "reach"}},
                "spec": {"containers": [{
                    "name": "etcd",
                    "image": format!("registry.k8s.io/etcd:{release}-0"),
                    "command": ["etcd"],
                    "args": [
                        "--name=reach",
                        "--data-dir=/var/lib/etcd/data",
                        "--listen-client-urls=http://0.0.0.0:2379",
                        "--advertise-client-urls=http://127.0.0.1:2379",
                        "--listen-peer-urls=http://127.0.0.1:2380",
                        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                        "--initial-cluster=reach=http://127.0.0.1:2380",
                    ],
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
                }],
                "volumes": [{"name": "data", "emptyDir": {}}]},
            },
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_pod_reaches_a_service_that_a_runner_runs_in_another_pod_network() {
    let client = cluster().client();
    let node = node();
    let ns = namespace(&client).await;
    let runner = Runner::start(&client, &ns, capn_binary())
        .await
        .expect("the runner starts");
    crate::harness::apply_doc(&client, &ns, reach_statefulset(&local_etcd_release())).await;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "reach"},
        "spec": {"selector": {"app": "reach"}, "ports": [{"port": 2379, "targetPort": 2379}]},
    }))
    .expect("a Service");
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &service)
        .await
        .expect("the Service");
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&api, "client", netexec()).await;
    let ip = pod_ip(&wait_pod(&api, "client", "running and ready", running_and_ready).await);
    assert_ne!(runner.host_address(), node.address(), "two pod networks");
    for name in [format!("reach.{ns}.svc"), format!("reach.{ns}.svc.cluster.local")] {
        let path = format!("/dial?request=version&protocol=http&host={name}&port=2379&tries=1");
        let answered = runner
            .wait_for(&format!("the node's pod reaches {name}"), RUN, || async {
                let (code, body) = http_get(SocketAddr::from((ip, 8080)), &path).await.ok()?;
                (code == 200 && body.contains("etcdserver")).then_some(body)
            })
            .await;
        assert!(answered.contains(&local_etcd_release()), "{answered}");
    }
    delete_and_wait(&api, &ns, "client").await;
    runner.check().unwrap_or_else(|e| panic!("{e}\n{}", runner.report()));
}
