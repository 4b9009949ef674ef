//! The reconcilers (design §5, §7), one per kind, on kube-runtime. Each follows
//! read → plan (pure, [`crate::plan`]) → apply (the only writer) → report status.
//!
//! - [`control_plane`]: NestedControlPlane — CAs, component resources, endpoint,
//!   `<cluster>-kubeconfig`, aggregated status.
//! - [`component`]: NestedEtcd, NestedAPIServer, NestedControllerManager — one generic
//!   reconciler; the per-kind steps (prerequisites, certificates) live in [`etcd`],
//!   [`apiserver`] and [`controller_manager`].
//! - [`cluster`]: NestedCluster — the CAPI infrastructure object.

pub mod apiserver;
pub mod certificates;
pub mod cluster;
pub mod component;
pub mod control_plane;
pub mod controller_manager;
mod error;
pub mod etcd;
mod events;
pub mod read;

use std::sync::Arc;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

pub use error::ReconcileError;

use crate::apply::Applier;
use crate::channel::ChannelRegistry;

/// Which controllers run. Each can be switched off so that an out-of-tree controller can
/// replace it (design §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnabledControllers {
    pub control_plane: bool,
    pub etcd: bool,
    pub apiserver: bool,
    pub controller_manager: bool,
    pub cluster: bool,
}

impl Default for EnabledControllers {
    fn default() -> Self {
        Self {
            control_plane: true,
            etcd: true,
            apiserver: true,
            controller_manager: true,
            cluster: true,
        }
    }
}

/// Process-wide settings of the controllers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// DNS domain of the super cluster (for the names tenant pods have there).
    pub super_dns_domain: String,
    /// Watch only this namespace; `None` watches all.
    pub namespace: Option<String>,
    pub enabled: EnabledControllers,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            super_dns_domain: crate::plan::DEFAULT_DNS_DOMAIN.to_string(),
            namespace: None,
            enabled: EnabledControllers::default(),
        }
    }
}

/// What every reconcile gets: the client, the applier, the channels and the settings.
pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub channels: Arc<ChannelRegistry>,
    pub settings: Settings,
    pub recorder: Recorder,
}

impl Context {
    pub fn new(client: Client, channels: Arc<ChannelRegistry>, settings: Settings) -> Self {
        let reporter = Reporter {
            controller: "capn".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            applier: Applier::new(client.clone()),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            channels,
            settings,
        }
    }
}

/// Runs every enabled controller until all of them stop (they stop on SIGTERM/ctrl-c, or
/// when the future is dropped).
pub async fn run(client: Client, channels: Arc<ChannelRegistry>, settings: Settings) {
    let enabled = settings.enabled;
    let ctx = Arc::new(Context::new(client, channels, settings));
    let mut tasks = Vec::new();
    if enabled.control_plane {
        tasks.push(tokio::spawn(control_plane::run(ctx.clone())));
    }
    if enabled.etcd {
        tasks.push(tokio::spawn(component::run::<crate::api::NestedEtcd>(ctx.clone())));
    }
    if enabled.apiserver {
        tasks.push(tokio::spawn(component::run::<crate::api::NestedAPIServer>(ctx.clone())));
    }
    if enabled.controller_manager {
        tasks.push(tokio::spawn(component::run::<crate::api::NestedControllerManager>(
            ctx.clone(),
        )));
    }
    if enabled.cluster {
        tasks.push(tokio::spawn(cluster::run(ctx.clone())));
    }
    // Abort the others when this future is dropped (tests restart controllers this way).
    let _guard = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
    futures::future::join_all(tasks).await;
}

struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}
