//! Behaviour tests against a real super cluster (design §8). The cluster starts once per test
//! binary; run with `KUBEBUILDER_ASSETS` set (`export KUBEBUILDER_ASSETS=$(hack/kube-assets.sh)`).

mod boot;
mod capi;
mod control_plane;
mod engine;
mod harness;
mod operations;
mod public_crds;
mod request_budget;
mod smoke;
mod support;
