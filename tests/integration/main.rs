//! Behaviour tests against a real super cluster (docs/design.md §8). The cluster starts once per test
//! binary; run with `KUBEBUILDER_ASSETS` set (`export KUBEBUILDER_ASSETS=$(hack/kube-assets.sh)`).

mod backup;
mod backup_store;
mod boot;
mod boot_audit;
mod boot_authentication;
mod boot_authorization;
mod boot_backup;
mod boot_certificates;
mod boot_connect;
mod boot_custom_resources;
mod boot_encryption;
mod boot_etcd_space;
mod boot_kms;
mod boot_members;
mod boot_projected;
mod boot_reach;
mod boot_services;
mod boot_sleep;
mod boot_surge;
mod boot_syncer;
mod boot_upgrade;
mod capi;
mod certificates;
mod cli;
mod conformance;

mod control_plane;
mod engine;
mod events;
mod harness;
mod helm;
mod maintenance;
mod monitoring;
mod node;
mod operations;
mod public_crds;
mod recipes;
mod request_budget;
mod runner_volumes;
mod security;
mod sizes;
mod smoke;
mod validation;
