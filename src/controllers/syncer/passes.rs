//! The loop that runs a pass over one kind (the volumes pass, the services pass): a pass
//! reads only the caches and writes only what differs, so it simply runs again after every
//! change and every patrol period.

use std::time::Duration;

use futures::{FutureExt, StreamExt};

use super::scope::Tenant;

/// How soon a failed pass is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// Runs `pass` until `wakes` ends: once `ready` (the caches it reads have listed; `false`
/// when they never will), then after each change `wakes` reports (those that arrive during a
/// pass are seen by the next one), and at least every patrol period. `what` names the pass
/// in the log.
pub(super) async fn run<F, Fut>(
    what: &str,
    tenant: &Tenant,
    ready: impl Future<Output = bool>,
    wakes: futures::stream::BoxStream<'static, ()>,
    pass: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let mut wakes = wakes;
    // The tenant caches fill only while `wakes` is polled.
    futures::pin_mut!(ready);
    loop {
        tokio::select! {
            filled = &mut ready => if filled { break } else {
                tracing::warn!(tenant = %tenant.control_plane().key(), pass = what, "a cache of the pass stopped before it filled; the pass stops");
                return;
            },
            woken = wakes.next() => if woken.is_none() { return },
        }
    }
    loop {
        let next = match pass().await {
            Ok(()) => tenant.patrol_every,
            Err(error) => {
                tracing::info!(%error, tenant = %tenant.control_plane().key(), pass = what, "pass failed; trying again");
                RETRY
            }
        };
        tokio::select! {
            woken = wakes.next() => if woken.is_none() { return },
            () = tokio::time::sleep(next) => {}
        }
        while let Some(Some(())) = wakes.next().now_or_never() {}
    }
}
