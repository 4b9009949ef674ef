//! Kubeconfig files for the admin user and the kube-controller-manager (docs/reference.md
//! "Cluster API secrets" and "kube-controller-manager").

use std::net::Ipv6Addr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;

use super::KeyPairPem;

/// User name of the kube-controller-manager's kubeconfig (its certificate's CN, as kubeadm's
/// `controller-manager.conf`).
pub const CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// Port the nested kube-apiserver serves on (docs/reference.md "kube-apiserver").
pub const APISERVER_PORT: u16 = 6443;

/// User name of the admin kubeconfig in `<c>-kubeconfig`: `<c>-admin` (docs/reference.md "Cluster
/// API secrets"; the context is then `<c>-admin@<c>`).
pub fn admin_user(cluster_name: &str) -> String {
    format!("{cluster_name}-admin")
}

/// The in-super-cluster host of the nested apiserver, `<c>-apiserver.<ns>.svc`, which the
/// controller-manager's kubeconfig points at (docs/reference.md "kube-controller-manager").
pub fn apiserver_service_host(cluster_name: &str, namespace: &str) -> String {
    format!("{cluster_name}-apiserver.{namespace}.svc")
}

/// `https://<host>:<port>`, with IPv6 hosts bracketed (`https://[fd00::1]:6443`); a host that
/// is already bracketed is kept as is (docs/reference.md "Names clients dial").
pub fn server_url(host: &str, port: u16) -> String {
    let host = host.trim();
    if host.parse::<Ipv6Addr>().is_ok() {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// A kubeconfig (YAML, `apiVersion: v1`, `kind: Config`) with one cluster named
/// `cluster_name` (server `server_url`, `certificate-authority-data` = base64 of
/// `ca_cert_pem`), one user named `user` (`client-certificate-data` and `client-key-data` =
/// base64 of `client`'s PEMs), one context `<user>@<cluster_name>` joining them, and
/// `current-context` set to it. Rules: docs/reference.md "Cluster API secrets" (for the admin:
/// user `<c>-admin`, context `<c>-admin@<c>`), kubeadm's kubeconfig layout.
///
/// The result contains the private key: store it only in a Secret.
pub fn kubeconfig(cluster_name: &str, user: &str, server_url: &str, ca_cert_pem: &str, client: &KeyPairPem) -> String {
    let context = format!("{user}@{cluster_name}");
    let config = Config {
        api_version: "v1",
        kind: "Config",
        clusters: vec![NamedCluster {
            name: cluster_name,
            cluster: Cluster {
                server: server_url,
                certificate_authority_data: STANDARD.encode(ca_cert_pem),
            },
        }],
        users: vec![NamedUser {
            name: user,
            user: User {
                client_certificate_data: STANDARD.encode(&client.cert_pem),
                client_key_data: STANDARD.encode(&client.key_pem),
            },
        }],
        contexts: vec![NamedContext {
            name: &context,
            context: Context {
                cluster: cluster_name,
                user,
            },
        }],
        current_context: &context,
        preferences: Preferences {},
    };
    // Plain scalars, as kubectl and kubeadm write them (no folded `>-` blocks for the long
    // base64 values). Serializing plain strings cannot fail; should it ever, JSON is YAML too.
    let mut options = serde_saphyr::SerializerOptions::default();
    options.prefer_block_scalars = false;
    serde_saphyr::to_string_with_options(&config, options)
        .or_else(|_| serde_json::to_string_pretty(&config))
        .unwrap_or_default()
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Config<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    clusters: Vec<NamedCluster<'a>>,
    users: Vec<NamedUser<'a>>,
    contexts: Vec<NamedContext<'a>>,
    current_context: &'a str,
    preferences: Preferences,
}

#[derive(Serialize)]
struct Preferences {}

#[derive(Serialize)]
struct NamedCluster<'a> {
    name: &'a str,
    cluster: Cluster<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster<'a> {
    server: &'a str,
    certificate_authority_data: String,
}

#[derive(Serialize)]
struct NamedUser<'a> {
    name: &'a str,
    user: User,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    client_certificate_data: String,
    client_key_data: String,
}

#[derive(Serialize)]
struct NamedContext<'a> {
    name: &'a str,
    context: Context<'a>,
}

#[derive(Serialize)]
struct Context<'a> {
    cluster: &'a str,
    user: &'a str,
}
