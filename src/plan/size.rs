//! Sizes (docs/guide/sizes.md): what a component's size sets, turned into the render
//! context, below everything the user sets explicitly.
//!
//! Precedence, highest first: the user's `patches` (applied after rendering), `extraArgs`
//! (replace a flag of the same name), the component's explicit fields (`spec.resources`
//! replaces the size's resources wholesale; NestedEtcd `spec.storage.quotaBackendBytes`
//! replaces the size's quota ceiling), then the size — the component's `spec.size`, else
//! its control plane's, else the channel's `defaults.size` — and last the process's own
//! defaults for what the size leaves out.

use serde::Serialize;

use super::RenderContext;
use crate::api::ComponentSpec;
use crate::channel::Size;
use crate::component::ComponentKind;
use crate::quantity::quantity_bytes;

/// The render context's `size`: what the component's size sets beyond its resources (which
/// go into `component.resources`) and etcd's quota (`etcd.storage.quota_backend_bytes`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct SizeVars {
    /// The size's name (`small`); none when the channel has no sizes.
    pub name: Option<String>,
    /// apiserver: `--max-requests-inflight`, when the size sets it.
    pub max_requests_inflight: Option<u32>,
    /// apiserver: `--max-mutating-requests-inflight`, when the size sets it.
    pub max_mutating_requests_inflight: Option<u32>,
    /// Environment variables of the main container, as `{name, value}` objects: `GOMEMLIMIT`
    /// then `GOGC`, each only when the size sets it; empty otherwise.
    pub env: Vec<serde_json::Value>,
}

/// Puts the component's size into `context`: `size`, and `component.resources` when the
/// spec sets none (the spec's replace the size's wholesale).
pub fn apply(context: &mut RenderContext, kind: ComponentKind, spec: &ComponentSpec, size: Option<(&str, &Size)>) {
    let Some((name, size)) = size else {
        return;
    };
    let settings = size.component(kind);
    if spec.resources.is_none() {
        context.component.resources = settings
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| serde_json::to_value(r).ok());
    }
    let mut env = Vec::new();
    if let Some(bytes) = settings
        .and_then(|s| s.go_mem_limit.as_ref())
        .and_then(|q| quantity_bytes(&q.0))
    {
        env.push(serde_json::json!({"name": "GOMEMLIMIT", "value": go_mem_limit(bytes)}));
    }
    if let Some(gogc) = settings.and_then(|s| s.go_gc) {
        env.push(serde_json::json!({"name": "GOGC", "value": gogc.to_string()}));
    }
    context.size = SizeVars {
        name: Some(name.to_string()),
        max_requests_inflight: settings.and_then(|s| s.max_requests_inflight),
        max_mutating_requests_inflight: settings.and_then(|s| s.max_mutating_requests_inflight),
        env,
    };
}

/// The flags the size sets on `kind`'s main container (`sizes.<size>.<component>.extraArgs`),
/// which the component's own `extraArgs` override flag by flag; empty without a size.
pub fn extra_args(kind: ComponentKind, size: Option<(&str, &Size)>) -> std::collections::BTreeMap<String, String> {
    size.and_then(|(_, s)| s.component(kind))
        .map(|c| c.extra_args.clone())
        .unwrap_or_default()
}

/// etcd: the ceiling the size puts on the quota capn sizes from the volume, in bytes
/// (`None`: etcd's own 2 GiB default; [`super::etcd_quota::quota_backend_bytes`]).
pub fn quota_ceiling(size: Option<(&str, &Size)>) -> Option<u64> {
    size.and_then(|(_, s)| s.etcd.as_ref())
        .and_then(|e| e.quota_backend_bytes.as_ref())
        .and_then(|q| quantity_bytes(&q.0))
}

/// `bytes` as Go's `GOMEMLIMIT` reads it: the largest of its units (`GiB`, `MiB`, `KiB`)
/// that divides it, else plain bytes (<https://pkg.go.dev/runtime#hdr-Environment_Variables>).
pub fn go_mem_limit(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_mem_limit_uses_the_largest_unit_that_divides() {
        assert_eq!(go_mem_limit(3 << 30), "3GiB");
        assert_eq!(go_mem_limit(1536 << 20), "1536MiB");
        assert_eq!(go_mem_limit(180 << 20), "180MiB");
        assert_eq!(go_mem_limit(5 << 10), "5KiB");
        assert_eq!(go_mem_limit(1_000_000), "1000000");
        assert_eq!(go_mem_limit(0), "0");
    }
}
