//! One tenant's DNS server: UDP and TCP on one port ([`super::ports`]), answers from
//! [`super::zone`], names outside the zone forwarded to the upstream servers.
//!
//! Over UDP an answer longer than the client takes (512 bytes, or its EDNS payload size up
//! to [`MAX_UDP_PAYLOAD`]) is sent truncated (`TC`), and the client asks again over TCP
//! (RFC 1035 §4.2.1, RFC 6891); additional records go first. A query from an address
//! [`Source::admits`] refuses gets `REFUSED`. At most [`IN_FLIGHT`] queries are worked on at
//! once per tenant, and [`TCP_CONNECTIONS`] TCP connections are open; a UDP query or a
//! connection past that is dropped (the client asks again), and an answer a TCP client does
//! not read within 10 s closes its connection, so a flood from one tenant's pods costs the
//! others nothing but capn's CPU.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::ports::Listener;
use super::zone::{self, Resolution, View};

/// The largest UDP answer sent, in bytes: the EDNS payload size DNS Flag Day 2020 settled
/// on, below any common path MTU.
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// Queries worked on at once, per tenant.
pub const IN_FLIGHT: usize = 256;
/// How long an upstream server has to answer, per server tried.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a TCP connection may sit idle between queries, and an answer take to write.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections open at once, per tenant; more are closed at once.
pub const TCP_CONNECTIONS: usize = 64;

/// Where one tenant's answers come from, and whom they are for.
pub trait Source: Send + Sync + 'static {
    /// The tenant's objects, as of now.
    fn view(&self) -> impl Future<Output = View> + Send;
    /// Whether a query from `address` may be answered: not from a pod of another tenant.
    fn admits(&self, address: IpAddr) -> bool;
}

/// The servers names outside the zones are forwarded to, tried in order.
#[derive(Clone, Debug, Default)]
pub struct Upstream {
    pub servers: Vec<SocketAddr>,
}

impl Upstream {
    /// The `nameserver` lines of a `resolv.conf` text, on port 53.
    pub fn from_resolv_conf(text: &str) -> Self {
        let servers = text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("nameserver"))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, 53))
            .collect();
        Upstream { servers }
    }

    /// The answer of the first server that gives one to `packet` (over TCP when `tcp`), or
    /// `None` when none does within [`UPSTREAM_TIMEOUT`] each.
    async fn exchange(&self, packet: &[u8], tcp: bool) -> Option<Vec<u8>> {
        for server in &self.servers {
            let answer = if tcp {
                tokio::time::timeout(UPSTREAM_TIMEOUT, exchange_tcp(*server, packet)).await
            } else {
                tokio::time::timeout(UPSTREAM_TIMEOUT, exchange_udp(*server, packet)).await
            };
            match answer {
                Ok(Ok(answer)) if answer.get(..2) == packet.get(..2) => return Some(answer),
                Ok(Ok(_)) => tracing::debug!(%server, "an upstream DNS server answered another query"),
                Ok(Err(error)) => tracing::debug!(%server, %error, "an upstream DNS server failed"),
                Err(_) => tracing::debug!(%server, "an upstream DNS server did not answer in time"),
            }
        }
        None
    }
}

async fn exchange_udp(server: SocketAddr, packet: &[u8]) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = if server.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(server).await?;
    socket.send(packet).await?;
    let mut buffer = vec![0; 65_535];
    let n = socket.recv(&mut buffer).await?;
    buffer.truncate(n);
    Ok(buffer)
}

async fn exchange_tcp(server: SocketAddr, packet: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(server).await?;
    write_framed(&mut stream, packet).await?;
    read_framed(&mut stream).await
}

/// A DNS message over TCP: a two-byte length, then the message (RFC 1035 §4.2.2).
async fn read_framed(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let length = stream.read_u16().await?;
    let mut message = vec![0; usize::from(length)];
    stream.read_exact(&mut message).await?;
    Ok(message)
}

async fn write_framed(stream: &mut TcpStream, message: &[u8]) -> std::io::Result<()> {
    let length = u16::try_from(message.len()).map_err(|_| std::io::Error::other("a DNS message over 64 KiB"))?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(message);
    stream.write_all(&framed).await
}

/// Serves `listener` until the task is dropped: one tenant's DNS.
pub async fn serve<S: Source>(listener: Listener, source: Arc<S>, upstream: Arc<Upstream>) {
    let Listener { udp, tcp, lease } = listener;
    let udp = Arc::new(udp);
    let limit = Arc::new(Semaphore::new(IN_FLIGHT));
    let datagrams = {
        let (source, upstream, limit) = (source.clone(), upstream.clone(), limit.clone());
        async move {
            let mut buffer = vec![0; 65_535];
            loop {
                let (n, from) = match udp.recv_from(&mut buffer).await {
                    Ok(received) => received,
                    Err(error) => {
                        tracing::debug!(%error, "tenant DNS: a UDP receive failed");
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    continue;
                };
                let packet = buffer[..n].to_vec();
                let (udp, source, upstream) = (udp.clone(), source.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Some(answer) = respond(&packet, from.ip(), &*source, &upstream, false).await {
                        let _ = udp.send_to(&answer, from).await;
                    }
                    drop(permit);
                });
            }
        }
    };
    let open = Arc::new(Semaphore::new(TCP_CONNECTIONS));
    let connections = async move {
        loop {
            let (mut stream, from) = match tcp.accept().await {
                Ok(accepted) => accepted,
                // Out of file descriptors, say: not a busy loop.
                Err(error) => {
                    tracing::debug!(%error, "tenant DNS: a TCP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(connection) = open.clone().try_acquire_owned() else {
                continue;
            };
            let (source, upstream, limit) = (source.clone(), upstream.clone(), limit.clone());
            tokio::spawn(async move {
                while let Ok(Ok(packet)) = tokio::time::timeout(TCP_IDLE, read_framed(&mut stream)).await {
                    let answer = {
                        let Ok(_permit) = limit.acquire().await else { return };
                        respond(&packet, from.ip(), &*source, &upstream, true).await
                    };
                    let Some(answer) = answer else { return };
                    // A client that does not read its answers holds nothing for long.
                    if !matches!(
                        tokio::time::timeout(TCP_IDLE, write_framed(&mut stream, &answer)).await,
                        Ok(Ok(()))
                    ) {
                        return;
                    }
                }
                drop(connection);
            });
        }
    };
    tracing::info!(port = lease.port(), "serving a tenant's DNS");
    tokio::join!(datagrams, connections);
}

/// The answer to the DNS message `packet` from `from`, encoded; `None` for a packet that
/// is not a DNS query at all (nothing to answer).
pub async fn respond<S: Source>(
    packet: &[u8],
    from: IpAddr,
    source: &S,
    upstream: &Upstream,
    tcp: bool,
) -> Option<Vec<u8>> {
    let request = Message::from_vec(packet).ok()?;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.queries = request.queries.clone();
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP_PAYLOAD);
        response.set_edns(edns);
    }
    let limit = if tcp {
        usize::from(u16::MAX)
    } else {
        usize::from(request.max_payload().clamp(512, MAX_UDP_PAYLOAD))
    };
    let code = if request.metadata.op_code != OpCode::Query {
        ResponseCode::NotImp
    } else if !source.admits(from) {
        ResponseCode::Refused
    } else if let [query] = request.queries.as_slice() {
        match zone::resolve(&source.view().await, query.name(), query.query_type()) {
            // A name outside the zone goes upstream as the client sent it, and its answer
            // back as the upstream server wrote it.
            Resolution::Outside => {
                return match upstream.exchange(packet, tcp).await {
                    Some(answer) => Some(answer),
                    None => encode(response, ResponseCode::ServFail, limit),
                };
            }
            Resolution::Answer { answers, additionals } => {
                response.metadata.authoritative = true;
                response.answers = answers;
                response.additionals = additionals;
                ResponseCode::NoError
            }
            Resolution::Alias { cname, target } => {
                response.answers.push(*cname);
                match resolve_upstream(upstream, target, query.query_type()).await {
                    Some((code, answers)) => {
                        response.answers.extend(answers);
                        code
                    }
                    // No address for the alias is no answer: the client may ask again.
                    None => ResponseCode::ServFail,
                }
            }
            Resolution::NxDomain => {
                response.metadata.authoritative = true;
                ResponseCode::NXDomain
            }
        }
    } else {
        ResponseCode::FormErr
    };
    encode(response, code, limit)
}

/// The upstream answer for `target`, for an ExternalName's alias: its code and records
/// (over UDP, again over TCP when that answer came truncated).
async fn resolve_upstream(
    upstream: &Upstream,
    target: Name,
    kind: RecordType,
) -> Option<(ResponseCode, Vec<hickory_proto::rr::Record>)> {
    let mut query = Message::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(target, kind));
    let packet = query.to_vec().ok()?;
    let mut answer = Message::from_vec(&upstream.exchange(&packet, false).await?).ok()?;
    if answer.metadata.truncation {
        answer = Message::from_vec(&upstream.exchange(&packet, true).await?).ok()?;
    }
    Some((answer.metadata.response_code, answer.answers))
}

/// `response` with `code`, encoded; without its additional records when longer than
/// `limit`, and truncated (`TC`, no records) when still longer.
fn encode(mut response: Message, code: ResponseCode, limit: usize) -> Option<Vec<u8>> {
    response.metadata.response_code = code;
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    response.additionals.clear();
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    response.answers.clear();
    response.authorities.clear();
    response.additionals.clear();
    response.metadata.truncation = true;
    response.to_vec().ok()
}

#[cfg(test)]
mod tests;
