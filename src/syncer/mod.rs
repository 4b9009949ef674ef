//! The syncer's pure core: how tenant objects become super-cluster objects and how their
//! status comes back (docs/design.md §11). No client, no clock, no I/O: the controller that
//! reads, writes and watches is built on top of it.
//!
//! - [`names`]: the workload namespace, object names, and the tenancy labels and
//!   annotations that lead back to the tenant object;
//! - [`admission`]: what is refused before anything is created (Pod Security Standards at
//!   the tenant's level, and what cannot be synced);
//! - [`pod`]: a tenant Pod translated into the super cluster's Pod;
//! - [`diff`]: the patrol's comparison of the desired and the live super pod, whose each
//!   super object is, and the orphans;
//! - [`upward`]: the tenant pod's status from its super pod, and the node to bind it to;
//! - [`volume`]: a tenant claim's copy, and the tenant volume that shows the super volume
//!   bound to it;
//! - [`service`]: a tenant Service's copy, its super ClusterIP shown back, and the Service
//!   environment variables of a tenant pod;
//! - [`resource`]: the trait every resource syncer implements; [`custom`]: the generic one
//!   for public custom resources; [`config`]: the ConfigMaps and Secrets pods use;
//!   [`pods`]: the pod's rules on the trait.
pub mod admission;
pub mod config;
pub mod custom;
pub mod diff;
pub mod names;
pub mod pod;
pub mod pods;
pub mod resource;
pub mod service;
pub mod upward;
pub mod volume;

#[cfg(test)]
mod fixtures;
