//! The kubelet's probes: httpGet (HTTP, or HTTPS without verifying the certificate, success
//! for a status in 200..400) and tcpSocket, with their timing and thresholds.

use std::time::Duration;

use tokio::time::Instant;

/// What a probe does.
#[derive(Clone, Debug)]
pub(super) enum Action {
    Http {
        https: bool,
        host: String,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        host: String,
        port: u16,
    },
}

/// A probe as the container spec defines it, with the API defaults filled in.
#[derive(Clone, Debug)]
pub(super) struct ProbeSpec {
    pub action: Action,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// One probe of one running container: when it runs next and its consecutive results.
pub(super) struct Prober {
    spec: ProbeSpec,
    client: Option<kube::Client>,
    next: Instant,
    successes: u32,
    failures: u32,
    /// The last failure, for reports.
    pub last_error: Option<String>,
}

/// The verdict after a probe ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// successThreshold consecutive successes.
    Passing,
    /// failureThreshold consecutive failures.
    Failing,
    /// Neither threshold reached yet.
    Unchanged,
}

/// When a container's supervise loop wakes next: the earliest deadline of its
/// `[startup, readiness, liveness]` probers, at the latest `latest` (to poll for an exit).
/// A startup probe that passed (`started`) never runs again: its last deadline lies in the
/// past, and counting it would turn the loop's sleep into a busy loop.
pub(super) fn next_wake(
    started: bool,
    [startup, readiness, liveness]: [Option<&Prober>; 3],
    latest: Instant,
) -> Instant {
    let startup = if started { None } else { startup };
    [startup, readiness, liveness]
        .into_iter()
        .flatten()
        .map(Prober::next)
        .fold(latest, Instant::min)
}

impl Prober {
    /// A prober for a container started at `started`.
    pub fn new(spec: ProbeSpec, started: Instant) -> Self {
        Self {
            next: started + spec.initial_delay,
            spec,
            client: None,
            successes: 0,
            failures: 0,
            last_error: None,
        }
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    pub fn next(&self) -> Instant {
        self.next
    }

    /// Skips one period without probing (a readiness probe before the startup probe passed).
    pub fn skip(&mut self) {
        self.next += self.spec.period;
    }

    /// Probes as soon as the initial delay allows: the kubelet triggers a readiness probe
    /// that has no result yet whenever it syncs the pod, such as when the startup probe passed.
    pub fn trigger(&mut self, started: Instant) {
        if self.successes == 0 && self.failures == 0 {
            self.next = self.next.min(Instant::now()).max(started + self.spec.initial_delay);
        }
    }

    /// Runs the probe once and returns the verdict.
    pub async fn run(&mut self) -> Verdict {
        self.next = Instant::now() + self.spec.period;
        let result = tokio::time::timeout(self.spec.timeout, self.attempt())
            .await
            .unwrap_or_else(|_| Err(format!("timed out after {:?}", self.spec.timeout)));
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes += 1;
                self.last_error = None;
                if self.successes >= self.spec.success_threshold {
                    return Verdict::Passing;
                }
            }
            Err(e) => {
                self.successes = 0;
                self.failures += 1;
                self.last_error = Some(e);
                if self.failures >= self.spec.failure_threshold {
                    return Verdict::Failing;
                }
            }
        }
        Verdict::Unchanged
    }

    async fn attempt(&mut self) -> Result<(), String> {
        match self.spec.action.clone() {
            Action::Tcp { host, port } => tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map(drop)
                .map_err(|e| format!("tcp {host}:{port}: {e}")),
            Action::Http {
                https,
                host,
                port,
                path,
                headers,
            } => {
                let scheme = if https { "https" } else { "http" };
                let url = format!("{scheme}://{host}:{port}");
                if self.client.is_none() {
                    self.client = Some(probe_client(&url, &headers, self.spec.timeout)?);
                }
                let client = self.client.as_ref().expect("built above");
                let request = http::Request::get(path.as_str())
                    .header("User-Agent", "kube-probe/1.36")
                    .header("Accept", "*/*")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                // `request_text` fails for 4xx and 5xx: the kubelet's 200..400 rule.
                client
                    .request_text(request)
                    .await
                    .map(drop)
                    .map_err(|e| format!("GET {url}{path}: {e}"))
            }
        }
    }
}

/// A client without credentials that does not verify the server's certificate, as the
/// kubelet's HTTPS probes do not.
fn probe_client(url: &str, headers: &[(String, String)], timeout: Duration) -> Result<kube::Client, String> {
    let mut config = kube::Config::new(url.parse().map_err(|e| format!("bad URL {url}: {e}"))?);
    config.accept_invalid_certs = true;
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    for (name, value) in headers {
        let name = http::HeaderName::try_from(name.as_str()).map_err(|e| e.to_string())?;
        let value = http::HeaderValue::try_from(value.as_str()).map_err(|e| e.to_string())?;
        config.headers.push((name, value));
    }
    kube::Client::try_from(config).map_err(|e| format!("cannot build a probe client: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prober(started: Instant, initial_delay: Duration) -> Prober {
        Prober::new(
            ProbeSpec {
                action: Action::Tcp {
                    host: "127.0.0.1".to_owned(),
                    port: 1,
                },
                initial_delay,
                period: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            },
            started,
        )
    }

    #[test]
    fn a_passed_startup_probe_no_longer_sets_the_wake_up() {
        let now = Instant::now();
        let latest = now + Duration::from_millis(200);
        // Its deadline is long past: it last ran when it passed.
        let startup = prober(now - Duration::from_secs(60), Duration::ZERO);
        let readiness = prober(now, Duration::from_millis(100));
        assert_eq!(
            next_wake(true, [Some(&startup), Some(&readiness), None], latest),
            now + Duration::from_millis(100)
        );
        assert_eq!(next_wake(true, [Some(&startup), None, None], latest), latest);
        // Before it passed, its deadline is what the loop waits for.
        assert_eq!(
            next_wake(false, [Some(&startup), Some(&readiness), None], latest),
            now - Duration::from_secs(60)
        );
    }
}
