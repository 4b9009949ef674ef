//! Issue 39 item 1 (structured authentication), on a booted control plane: a JWT issuer
//! served by this test (HTTPS with a certificate from rcgen, its discovery document and
//! JWKS; tokens signed ES256 with ring) is configured through `spec.authentication`; a token
//! it signs authenticates to the tenant as the mapped user (SelfSubjectReview), and a
//! changed claim mapping (the username prefix) takes effect in the same apiserver process,
//! without a restart. Then the configuration moves to a ConfigMap (`configurationRef`):
//! refused while the ConfigMap is missing, applied when it is created, and an edit of the
//! ConfigMap reaches the same apiserver process.

use std::sync::Arc;

use base64::Engine as _;
use capn::api::NestedAPIServer;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};

use crate::boot::{BOOTED_STEP, StartCapn, boot_with, say, whoami};

const AUDIENCE: &str = "capn-tenant";

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A JWT issuer at `https://<address>:<port>`: serves `/.well-known/openid-configuration`
/// and `/jwks`, and signs tokens with its one ES256 key.
struct Issuer {
    url: String,
    /// The PEM certificate of its server (self-signed, for the issuer's IP address): the
    /// `certificateAuthority` the apiserver trusts it with.
    ca: String,
    key: EcdsaKeyPair,
    task: tokio::task::JoinHandle<()>,
}

impl Issuer {
    async fn start(address: std::net::Ipv4Addr) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        // The public key is the uncompressed point: 0x04, then x and y (32 bytes each).
        let point = key.public_key().as_ref().to_vec();
        let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": "k1",
            "x": b64url(&point[1..33]), "y": b64url(&point[33..65])}]});

        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
            .await
            .unwrap();
        let url = format!("https://{address}:{}", listener.local_addr().unwrap().port());
        let discovery = json!({"issuer": url, "jwks_uri": format!("{url}/jwks"),
            "response_types_supported": ["id_token"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"]});
        let router = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || std::future::ready(axum::Json(discovery.clone()))),
            )
            .route(
                "/jwks",
                axum::routing::get(move || std::future::ready(axum::Json(jwks.clone()))),
            );
        let (ca, task) = serve_https(listener, address, router);
        Issuer { url, ca, key, task }
    }

    /// A token for `subject`, valid for an hour.
    fn token(&self, subject: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": "k1"});
        let claims = json!({"iss": self.url, "aud": AUDIENCE, "sub": subject,
            "iat": now, "nbf": now - 60, "exp": now + 3600});
        let input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature = self.key.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
        format!("{input}.{}", b64url(signature.as_ref()))
    }
}

/// Serves `router` over HTTPS on `listener` with a self-signed certificate (rcgen) for
/// `address`; returns the certificate's PEM (what a client trusts it with) and the task.
pub(crate) fn serve_https(
    listener: tokio::net::TcpListener,
    address: std::net::Ipv4Addr,
    router: axum::Router,
) -> (String, tokio::task::JoinHandle<()>) {
    let certified = rcgen::generate_simple_self_signed(vec![address.to_string()]).unwrap();
    let ca = certified.cert.pem();
    let chain = vec![CertificateDer::from(certified.cert.der().to_vec())];
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                    .await;
            });
        }
    });
    (ca, task)
}

fn configuration(issuer: &Issuer, prefix: &str) -> Value {
    json!({"jwt": [{
        "issuer": {"url": issuer.url, "audiences": [AUDIENCE], "certificateAuthority": issuer.ca},
        "claimMappings": {"username": {"claim": "sub", "prefix": prefix}},
    }]})
}

fn authentication(issuer: &Issuer, prefix: &str) -> Value {
    json!({"spec": {"authentication": {"configuration": configuration(issuer, prefix)}}})
}

/// The ConfigMap `sso` holding the configuration as a whole document under `config.yaml`
/// (JSON, which is YAML).
fn config_map(issuer: &Issuer, prefix: &str) -> ConfigMap {
    let mut document = configuration(issuer, prefix);
    document["apiVersion"] = "apiserver.config.k8s.io/v1".into();
    document["kind"] = "AuthenticationConfiguration".into();
    serde_json::from_value(json!({
        "metadata": {"name": "sso"},
        "data": {"config.yaml": serde_json::to_string_pretty(&document).unwrap()},
    }))
    .unwrap()
}

/// Who `token` is to the tenant apiserver; `None` while no apiserver pod is ready (a roll)
/// or the request fails.
async fn user_of(booted: &crate::boot::Booted, kubeconfig: &str, token: &str) -> Option<String> {
    let mut config = booted.runner.client_config(kubeconfig).await.ok()?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_owned().into()),
        ..kube::config::AuthInfo::default()
    };
    whoami(&kube::Client::try_from(config).ok()?).await.ok()
}

/// The pid and start time of every kube-apiserver process demo-apiserver-0 ran.
fn apiserver_processes(booted: &crate::boot::Booted) -> Vec<(i32, u64)> {
    booted
        .runner
        .processes()
        .into_iter()
        .filter(|p| p.pod == "demo-apiserver-0" && p.container == "kube-apiserver")
        .map(|p| (p.pid, p.start_time))
        .collect()
}

/// What a configuration the apiserver reloads by itself must leave alone: its processes
/// and the StatefulSet's pod template.
pub(crate) struct Unrestarted {
    processes: Vec<(i32, u64)>,
    template: k8s_openapi::api::core::v1::PodTemplateSpec,
}

impl Unrestarted {
    /// Once the apiserver's last roll is over: what runs and the template it runs from.
    pub(crate) async fn take(booted: &crate::boot::Booted) -> Self {
        booted.apiserver_settled().await;
        Self {
            processes: apiserver_processes(booted),
            template: Self::template(booted).await,
        }
    }

    async fn template(booted: &crate::boot::Booted) -> k8s_openapi::api::core::v1::PodTemplateSpec {
        crate::harness::statefulset(&booted.client, &booted.ns, "demo-apiserver")
            .await
            .unwrap()
            .spec
            .unwrap()
            .template
    }

    /// Panics unless the same processes run from the same pod template.
    pub(crate) async fn assert_same(&self, booted: &crate::boot::Booted) {
        assert_eq!(
            apiserver_processes(booted),
            self.processes,
            "no kube-apiserver process was started: the running one reloaded the file"
        );
        assert_eq!(
            Self::template(booted).await,
            self.template,
            "the pod template did not change"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_a_configured_issuer_logs_in_and_a_changed_mapping_applies_without_a_restart() {
    let booted = boot_with("authentication", None, StartCapn::InProcess).await;
    let issuer = Issuer::start(booted.runner.host_address()).await;
    let apiservers = Api::<NestedAPIServer>::namespaced(booted.client.clone(), &booted.ns);
    let before = apiserver_processes(&booted).len();
    apiservers
        .patch(
            "demo-apiserver",
            &PatchParams::default(),
            &Patch::Merge(&authentication(&issuer, "oidc:")),
        )
        .await
        .unwrap();
    let kubeconfig = booted.kubeconfig().await;
    let token = issuer.token("alice");
    // The flag is new: the apiserver rolls once to read the file.
    let user = booted
        .runner
        .wait_for(
            "the issuer's token authenticates as oidc:alice",
            BOOTED_STEP * 2,
            || async {
                let user = user_of(&booted, &kubeconfig, &token).await?;
                (user == "oidc:alice").then_some(user)
            },
        )
        .await;
    // The surge pod answers first; demo-apiserver-0 is replaced once it is ready.
    booted.apiserver_settled().await;
    assert!(
        apiserver_processes(&booted).len() > before,
        "the new flag rolled the apiserver"
    );
    say(&format!("authentication: the issuer's token is {user}"));

    // A new prefix: the apiserver reloads the file; the same process answers.
    let unrestarted = Unrestarted::take(&booted).await;
    let changed = std::time::Instant::now();
    apiservers
        .patch(
            "demo-apiserver",
            &PatchParams::default(),
            &Patch::Merge(&authentication(&issuer, "sso:")),
        )
        .await
        .unwrap();
    booted
        .runner
        .wait_for("the new mapping applies: sso:alice", BOOTED_STEP * 3, || async {
            let user = user_of(&booted, &kubeconfig, &token).await?;
            (user == "sso:alice").then_some(())
        })
        .await;
    say(&format!(
        "authentication: the new prefix applied {:.1?} after the change, in the same process",
        changed.elapsed()
    ));

    // The configuration from a ConfigMap that does not exist yet: refused with a condition
    // naming it; the running apiserver keeps what it has.
    apiservers
        .patch(
            "demo-apiserver",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"authentication": {
                "configuration": null, "configurationRef": {"name": "sso"},
            }}})),
        )
        .await
        .unwrap();
    let refused = booted
        .runner
        .wait_for("the missing ConfigMap is a condition", BOOTED_STEP, || {
            crate::harness::apiserver_refusal(&apiservers, "demo-apiserver", "AuthenticationConfigurationMissing")
        })
        .await;
    assert!(
        refused
            .message
            .contains("spec.authentication.configurationRef: ConfigMap sso key config.yaml: not found"),
        "{}",
        refused.message
    );
    assert_eq!(
        user_of(&booted, &kubeconfig, &token).await.as_deref(),
        Some("sso:alice"),
        "nothing was applied: the apiserver still reads the inline configuration"
    );

    // Its creation wakes the apiserver's reconcile; the new prefix applies.
    let config_maps = Api::<ConfigMap>::namespaced(booted.client.clone(), &booted.ns);
    let created = std::time::Instant::now();
    config_maps
        .create(&PostParams::default(), &config_map(&issuer, "ref:"))
        .await
        .unwrap();
    booted
        .runner
        .wait_for(
            "the referenced configuration applies: ref:alice",
            BOOTED_STEP * 3,
            || async {
                let user = user_of(&booted, &kubeconfig, &token).await?;
                (user == "ref:alice").then_some(())
            },
        )
        .await;
    say(&format!(
        "authentication: the created ConfigMap applied {:.1?} after its creation",
        created.elapsed()
    ));

    // An edit of the ConfigMap, and nothing else, reaches the same process. capn's copy
    // changes when the ConfigMap's change wakes the apiserver's reconcile (the periodic
    // resync is an hour away), then the kubelet refreshes the file and kube-apiserver reloads it.
    let edited = std::time::Instant::now();
    config_maps
        .replace("sso", &PostParams::default(), &config_map(&issuer, "cm:"))
        .await
        .unwrap();
    booted
        .runner
        .wait_for("capn copies the edited ConfigMap", BOOTED_STEP, || async {
            let copy = config_maps.get("demo-authentication").await.ok()?;
            let text = copy.data?.remove("authentication-config.yaml")?;
            text.contains("\"cm:\"").then_some(())
        })
        .await;
    say(&format!(
        "authentication: capn copied the edited ConfigMap {:.1?} after the edit",
        edited.elapsed()
    ));
    booted
        .runner
        .wait_for("the edited ConfigMap applies: cm:alice", BOOTED_STEP * 3, || async {
            let user = user_of(&booted, &kubeconfig, &token).await?;
            (user == "cm:alice").then_some(())
        })
        .await;
    say(&format!(
        "authentication: the edited ConfigMap applied {:.1?} after the edit, in the same process",
        edited.elapsed()
    ));
    unrestarted.assert_same(&booted).await;
    issuer.task.abort();
    booted.stop().await;
}
