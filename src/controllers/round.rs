//! What every reconcile step shares, whichever controller runs it: one clock reading per
//! pass ([`Now`]), whether a component may proceed ([`Gate`]), and when to look again
//! ([`recheck_after`]). A leaf: it imports no controller, so every step can use it.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::plan::Upstream;
use crate::status::Reason;

/// Whether a component may proceed, and with which upstream outputs.
pub enum Gate {
    Open(Upstream),
    Wait { reason: Reason, message: String },
}

/// The longest a component or control plane waits before it looks at its certificates
/// again, when none is due earlier.
pub const CERTIFICATE_RECHECK: Duration = Duration::from_secs(3600);

/// When to look again: at the next renewal, at most [`CERTIFICATE_RECHECK`] from now, plus
/// a spread of up to a tenth derived from `name`, so that a thousand control planes created
/// together do not all look at the same moment. The look is served from the caches unless
/// something is due.
pub fn recheck_after(name: &str, next_renewal: Option<time::OffsetDateTime>, now: time::OffsetDateTime) -> Duration {
    let until_renewal = next_renewal
        .map(|at| Duration::try_from(at - now).unwrap_or(Duration::ZERO))
        .unwrap_or(CERTIFICATE_RECHECK);
    let base = until_renewal.min(CERTIFICATE_RECHECK);
    let spread = name
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
        % 1000;
    // A renewal that is due waits a second at least (a pod's clock skew, a Secret in flight).
    base.max(Duration::from_secs(1)) + base * u32::try_from(spread).unwrap_or(0) / 10_000
}

/// One clock reading per pass, in the two shapes the code needs.
pub struct Now {
    pub time: time::OffsetDateTime,
    pub k8s: Time,
}

impl Now {
    pub fn take() -> Self {
        Self {
            time: time::OffsetDateTime::now_utc(),
            k8s: Time(k8s_openapi::jiff::Timestamp::now()),
        }
    }
}
