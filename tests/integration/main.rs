//! Behaviour tests against a real super cluster (design §8). The cluster starts once per test
//! binary; run with `KUBEBUILDER_ASSETS` set (`export KUBEBUILDER_ASSETS=$(hack/kube-assets.sh)`).

mod control_plane;
mod engine;
mod harness;
mod smoke;
mod support;
