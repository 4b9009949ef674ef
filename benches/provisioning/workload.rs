//! What both halves provision: `count` copies of `examples/nestedcontrolplane.yaml`, named
//! `cp-0`, `cp-1`, … in one namespace per half.

use serde_json::Value;

const EXAMPLE: &str = include_str!("../../examples/nestedcontrolplane.yaml");

/// The NestedControlPlane `cp-<index>` in `namespace`.
///
/// # Errors
/// The example does not parse as one object (a broken checkout).
pub fn control_plane(namespace: &str, index: usize) -> Result<Value, String> {
    let mut doc: Value =
        serde_saphyr::from_str(EXAMPLE).map_err(|e| format!("examples/nestedcontrolplane.yaml: {e}"))?;
    doc["metadata"] = serde_json::json!({ "name": name(index), "namespace": namespace });
    Ok(doc)
}

/// The name of control plane `index`.
pub fn name(index: usize) -> String {
    format!("cp-{index}")
}

/// Members per etcd the benchmark's hosts file names: more than the example asks for.
const ETCD_MEMBERS: usize = 3;

/// An `/etc/hosts` text mapping every etcd member name of `count` control planes in
/// `namespace` to 127.0.0.2, where nothing listens (see the crate's doc).
pub fn refusing_etcd_hosts(namespace: &str, count: usize) -> String {
    let mut text = String::new();
    for index in 0..count {
        let c = name(index);
        for member in 0..ETCD_MEMBERS {
            text.push_str(&format!("127.0.0.2 {c}-etcd-{member}.{c}-etcd.{namespace}.svc\n"));
        }
    }
    text
}
