//! capn talking to a tenant's etcd: its own client identity ([`identity`]), clients per
//! cluster and member dialed by stable names ([`client`]), and the name overrides for dialing
//! from outside the pod network ([`hosts`]); membership steps ([`members`]) and space
//! ([`space`]) decided as pure functions.

pub mod client;
pub mod hosts;
pub mod identity;
pub mod members;
pub mod space;

pub use client::{EtcdClients, EtcdCluster, EtcdError, ListedMember, MemberStatus};
pub use hosts::HostsFile;
pub use identity::{CLIENT_COMMON_NAME, ClientIdentity};
