//! What every controller's reconcile uses: the watch caches and the objects they keep
//! ([`cache`]), reads through them ([`read`]), the Secrets with certificates and keys
//! ([`certificates`]), Events ([`events`]), the memo of status writes ([`status_memo`]) and
//! clients of the tenants' apiservers ([`tenant`]).

pub mod cache;
pub mod certificates;
pub mod events;
pub mod read;
pub mod status_memo;
pub mod tenant;
