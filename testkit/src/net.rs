//! Loopback ports and plain HTTP, for the servers the kit and its callers start and ask.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// `N` distinct free loopback ports: all bound at once so they differ, then released for the
/// servers. Another program could take one in between; then that server fails to start.
///
/// # Errors
/// When no port can be bound.
pub fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot find free loopback ports: {e}"))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(|e| format!("cannot read a bound port: {e}"))?
            .port();
    }
    Ok(ports)
}

/// `GET path` over plain HTTP/1.0: the status code and the body. At most 1 s to connect and
/// 5 s for each read of the answer.
///
/// # Errors
/// Connection failures and answers that are not HTTP.
pub async fn http_get(address: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || http_get_blocking(address, &path))
        .await
        .map_err(io::Error::other)?
}

/// [`http_get`] on this thread, for the start-up threads that run outside any runtime.
pub(crate) fn http_get_blocking(address: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("not an HTTP answer: {head:?}")))?;
    Ok((status, body.to_owned()))
}
