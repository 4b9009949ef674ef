//! The side-by-side report: capn, the floor and the design's floor, from the audit log and
//! the measurements.

use std::fmt::Write as _;
use std::time::Duration;

use capn_testkit::audit::AuditedRequest;
use capn_testkit::requests::Tally;
use k8s_openapi::jiff::Timestamp;

use crate::capn_half::CapnRun;
use crate::cluster::{Party, ServerCpu};

/// How many verb/resource lines the report shows per half.
const TOP: usize = 10;

/// Everything the report is made of.
pub struct Results<'a> {
    pub control_planes: usize,
    pub steady: Duration,
    pub build: &'a str,
    pub floor_elapsed: Duration,
    /// What kube-apiserver and etcd spent from the floor's first apply until all were ready.
    pub floor_server_cpu: ServerCpu,
    pub design_floor_elapsed: Duration,
    /// The same for the design's floor.
    pub design_floor_server_cpu: ServerCpu,
    pub capn: &'a CapnRun,
    pub requests: &'a [AuditedRequest],
}

/// The requests of `party` received in `[from, to]`.
fn tally(requests: &[AuditedRequest], party: Party, from: Option<Timestamp>, to: Option<Timestamp>) -> Tally {
    requests
        .iter()
        .filter(|r| r.identity == party.username())
        .filter(|r| from.is_none_or(|from| r.received >= from) && to.is_none_or(|to| r.received <= to))
        .map(|r| r.key.clone())
        .collect()
}

/// The report, ready to print.
pub fn render(results: &Results<'_>) -> String {
    let n = results.control_planes;
    let capn = tally(results.requests, Party::Capn, None, Some(results.capn.ready));
    let steady = tally(
        results.requests,
        Party::Capn,
        Some(results.capn.ready),
        Some(results.capn.steady_end),
    );
    let floor = tally(results.requests, Party::Floor, None, None);
    let design = tally(results.requests, Party::DesignFloor, None, None);
    let per = |count: u64| count as f64 / n as f64;
    let capn_seconds = results.capn.elapsed.as_secs_f64();
    let floor_seconds = results.floor_elapsed.as_secs_f64();
    let design_seconds = results.design_floor_elapsed.as_secs_f64();
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "capn benchmark: control planes per half: {n}; capn {} build; {}",
        results.build,
        machine()
    );
    let _ = writeln!(out, "{:<44}{:>14}{:>14}{:>14}", "", "capn", "floor", "design floor");
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}x", a / b)
        } else {
            "-".to_owned()
        }
    };
    let _ = writeln!(
        out,
        "{:<44}{:>13.1}s{:>13.1}s{:>13.1}s   capn/floor {}, design floor/floor {}, capn/design floor {}",
        "time until all ready",
        capn_seconds,
        floor_seconds,
        design_seconds,
        ratio(capn_seconds, floor_seconds),
        ratio(design_seconds, floor_seconds),
        ratio(capn_seconds, design_seconds)
    );
    let _ = writeln!(
        out,
        "{:<44}{:>14.1}{:>14.1}{:>14.1}",
        "requests per control plane, Events excluded",
        per(capn.without_event_writes()),
        per(floor.without_event_writes()),
        per(design.without_event_writes())
    );
    let _ = writeln!(
        out,
        "{:<44}{:>14.1}{:>14.1}{:>14.1}",
        "Event writes per control plane",
        per(capn.event_writes()),
        per(floor.event_writes()),
        per(design.event_writes())
    );
    let _ = writeln!(
        out,
        "{:<44}{:>14}{:>14}{}",
        format!("requests in the {}s after all ready", results.steady.as_secs()),
        steady.total(),
        "-",
        last_after(results.requests, results.capn.ready, results.capn.steady_end)
            .map(|last| format!("   the last {last:.1}s after"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "{:<44}{:>10.1} MiB",
        "capn peak RSS (VmHWM)",
        mib(results.capn.usage_at_end.peak_rss_bytes)
    );
    let at_ready = results.capn.usage_at_ready;
    let _ = writeln!(
        out,
        "{:<44}{:>10.1} MiB   {:.1} anonymous + {:.1} file-backed",
        "capn RSS when all were ready",
        mib(at_ready.rss_anon_bytes + at_ready.rss_file_bytes),
        mib(at_ready.rss_anon_bytes),
        mib(at_ready.rss_file_bytes)
    );
    let _ = writeln!(
        out,
        "{:<44}{:>10}   connections to the API server, metrics and probe listeners",
        "capn open sockets when all were ready", at_ready.sockets
    );
    let _ = writeln!(
        out,
        "{:<44}{:>14}",
        "capn CPU seconds: to all ready / to the end",
        format!(
            "{:.2} / {:.2}",
            results.capn.usage_at_ready.cpu_seconds, results.capn.usage_at_end.cpu_seconds
        )
    );
    let (capn_cpu, floor_cpu, design_cpu) = (
        results.capn.server_cpu,
        results.floor_server_cpu,
        results.design_floor_server_cpu,
    );
    // The kernel counts in ticks (10 ms): a tiny run may show none for a floor.
    let _ = writeln!(
        out,
        "{:<44}{:>14.2}{:>14.2}{:>14.2}   capn/floor {}, capn/design floor {}",
        "kube-apiserver CPU seconds until all ready",
        capn_cpu.apiserver_seconds,
        floor_cpu.apiserver_seconds,
        design_cpu.apiserver_seconds,
        ratio(capn_cpu.apiserver_seconds, floor_cpu.apiserver_seconds),
        ratio(capn_cpu.apiserver_seconds, design_cpu.apiserver_seconds)
    );
    let _ = writeln!(
        out,
        "{:<44}{:>14.2}{:>14.2}{:>14.2}",
        "etcd CPU seconds until all ready", capn_cpu.etcd_seconds, floor_cpu.etcd_seconds, design_cpu.etcd_seconds
    );
    // Per request, Events included: tells more requests from costlier ones (a status write
    // costs the API server more the larger the status is). The CPU includes the stand-in's
    // StatefulSet status writes and the watches, so it is an upper bound per request.
    let per_request = |seconds: f64, requests: u64| 1000.0 * seconds / requests.max(1) as f64;
    let _ = writeln!(
        out,
        "{:<44}{:>14.2}{:>14.2}{:>14.2}",
        "kube-apiserver CPU ms per request sent",
        per_request(capn_cpu.apiserver_seconds, capn.total()),
        per_request(floor_cpu.apiserver_seconds, floor.total()),
        per_request(design_cpu.apiserver_seconds, design.total())
    );
    let _ = writeln!(
        out,
        "\ncapn's reconciles per control plane until all ready (count, mean duration):"
    );
    for r in &results.capn.reconciles_at_ready {
        let _ = writeln!(
            out,
            "  {:<28}{:>7.1}  {:>7.1} ms",
            r.controller,
            per(r.count),
            1000.0 * r.seconds / r.count.max(1) as f64
        );
    }
    let _ = writeln!(out, "\ntop requests per control plane (Events included):");
    let _ = writeln!(out, "  {:<48}{:<48}design floor", "capn", "floor");
    let tops = [capn.top(TOP), floor.top(TOP), design.top(TOP)];
    for line in 0..tops.iter().map(Vec::len).max().unwrap_or(0) {
        let cell = |top: &[(capn_testkit::requests::RequestKey, u64)]| {
            top.get(line)
                .map(|(key, count)| format!("{:>7.1}  {key}", per(*count)))
                .unwrap_or_default()
        };
        let _ = writeln!(out, "  {:<48}{:<48}{}", cell(&tops[0]), cell(&tops[1]), cell(&tops[2]));
    }
    if steady.total() > 0 {
        let _ = writeln!(out, "\ncapn's requests after all were ready:\n{}", steady.breakdown());
    }
    out
}

/// Seconds from `ready` to capn's last request before `end`, if it sent any after `ready`:
/// tells a wave that ends soon after Ready from requests all through the window.
fn last_after(requests: &[AuditedRequest], ready: Timestamp, end: Timestamp) -> Option<f64> {
    requests
        .iter()
        .filter(|r| r.identity == Party::Capn.username() && r.received > ready && r.received <= end)
        .map(|r| r.received)
        .max()
        .map(|last| last.duration_since(ready).as_secs_f64())
}

/// The machine, for the record: cores and CPU model.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|line| {
                line.strip_prefix("model name")
                    .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    format!("{cores} cores ({model})")
}
