//! Logging: structured `tracing` output, text or JSON, filtered by `RUST_LOG`
//! (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are ignored.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
