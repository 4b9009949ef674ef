//! The ports tenants' DNS servers listen on: one per tenant, from one range
//! (`capn run --dns-ports`). A tenant is told apart by the port its queries arrive at: its
//! pods ask its Service in the super cluster, port 53, whose endpoint is capn's address at
//! the tenant's port (docs/design.md §11 "DNS").

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, UdpSocket};

/// The ports of one capn process's tenant DNS servers.
#[derive(Debug)]
pub struct Ports {
    range: RangeInclusive<u16>,
    taken: Mutex<BTreeSet<u16>>,
}

/// One tenant's DNS sockets, UDP and TCP on the same port, holding the port until dropped.
#[derive(Debug)]
pub struct Listener {
    pub udp: UdpSocket,
    pub tcp: TcpListener,
    pub lease: Lease,
}

/// A port taken from [`Ports`], given back when dropped.
#[derive(Debug)]
pub struct Lease {
    ports: Arc<Ports>,
    port: u16,
}

impl Lease {
    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.ports
            .taken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.port);
    }
}

impl Ports {
    /// The ports of `range`, none taken.
    pub fn new(range: RangeInclusive<u16>) -> Arc<Self> {
        Arc::new(Ports {
            range,
            taken: Mutex::new(BTreeSet::new()),
        })
    }

    /// Binds UDP and TCP on `address` at `preferred` (the port a tenant had before capn
    /// restarted, so that its Service's endpoint need not change) when it is in the range
    /// and free, or else at the first port of the range that this process has not taken and
    /// the host lets it bind.
    ///
    /// # Errors
    /// No port of the range could be bound (the last bind error).
    pub fn bind(self: &Arc<Self>, address: IpAddr, preferred: Option<u16>) -> std::io::Result<Listener> {
        let mut last = std::io::Error::other(format!(
            "every port of {}-{} is taken",
            self.range.start(),
            self.range.end()
        ));
        let candidates = preferred
            .filter(|p| self.range.contains(p))
            .into_iter()
            .chain(self.range.clone());
        for port in candidates {
            if !self.taken.lock().unwrap_or_else(|p| p.into_inner()).insert(port) {
                continue;
            }
            let lease = Lease {
                ports: self.clone(),
                port,
            };
            match bind_both(SocketAddr::new(address, port)) {
                Ok((udp, tcp)) => return Ok(Listener { udp, tcp, lease }),
                Err(error) => last = error,
            }
        }
        Err(last)
    }
}

/// UDP and TCP sockets on `address`, non-blocking for tokio.
fn bind_both(address: SocketAddr) -> std::io::Result<(UdpSocket, TcpListener)> {
    let udp = std::net::UdpSocket::bind(address)?;
    udp.set_nonblocking(true)?;
    let tcp = std::net::TcpListener::bind(address)?;
    tcp.set_nonblocking(true)?;
    Ok((UdpSocket::from_std(udp)?, TcpListener::from_std(tcp)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_is_taken_once_preferred_when_free_and_given_back_when_dropped() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        // A range of free ports: the one the host gives, and the next few.
        let probe = std::net::UdpSocket::bind((loopback, 0)).unwrap();
        let start = probe.local_addr().unwrap().port().min(u16::MAX - 8);
        drop(probe);
        let ports = Ports::new(start..=start + 8);
        let first = ports.bind(loopback, None).unwrap();
        let second = ports.bind(loopback, Some(first.lease.port())).unwrap();
        assert_ne!(
            first.lease.port(),
            second.lease.port(),
            "a taken port is not given twice"
        );
        let wanted = start + 5;
        let third = ports.bind(loopback, Some(wanted));
        if let Ok(third) = &third {
            assert_eq!(third.lease.port(), wanted, "the preferred port, when free");
        }
        let port = first.lease.port();
        drop(first);
        let again = ports.bind(loopback, Some(port)).unwrap();
        assert_eq!(again.lease.port(), port, "a dropped listener's port is free again");
        assert!(
            ports.bind(loopback, Some(1)).is_ok(),
            "a preferred port outside the range is ignored"
        );
    }
}
