//! The server over real sockets on the loopback: UDP and TCP, forwarding to an upstream
//! server played by a UDP socket of the test.

use std::collections::BTreeMap;

use hickory_proto::rr::RData;
use serde_json::json;

use super::*;
use crate::dns::Ports;

/// A tenant with a ClusterIP Service `web` (reached at 10.128.0.7) and a headless `many`
/// with `endpoints` ready endpoints; queries from 127.0.0.2 are refused.
struct Tenant {
    endpoints: usize,
}

impl Source for Tenant {
    async fn view(&self) -> View {
        let service = |value: serde_json::Value| Arc::new(serde_json::from_value(value).unwrap());
        let addresses: Vec<String> = (0..self.endpoints)
            .map(|i| format!("198.18.{}.{}", i / 200, i % 200 + 2))
            .collect();
        View {
            domain: "cluster.local".into(),
            services: vec![
                service(json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"clusterIP": "10.96.0.20"}})),
                service(json!({"metadata": {"name": "many", "namespace": "default"}, "spec": {"clusterIP": "None"}})),
            ],
            slices: vec![Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": "many-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "many"}},
                    "addressType": "IPv4",
                    "endpoints": addresses.iter().map(|a| json!({"addresses": [a]})).collect::<Vec<_>>(),
                }))
                .unwrap(),
            )],
            addresses: BTreeMap::from([(("default".into(), "web".into()), "10.128.0.7".parse().unwrap())]),
            apiserver: Vec::new(),
            super_domain: None,
        }
    }

    fn admits(&self, address: IpAddr) -> bool {
        address != IpAddr::from([127, 0, 0, 2])
    }
}

fn query(name: &str, kind: RecordType, edns: bool) -> (u16, Vec<u8>) {
    let mut message = Message::query();
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
    if edns {
        let mut opt = Edns::new();
        opt.set_max_payload(1232);
        message.set_edns(opt);
    }
    (message.metadata.id, message.to_vec().unwrap())
}

/// Starts a server for `tenant` on the loopback with `upstream`: its address.
fn start(tenant: Tenant, upstream: Upstream) -> SocketAddr {
    let ports = Ports::new(20_000..=40_000);
    let listener = ports.bind("127.0.0.1".parse().unwrap(), None).unwrap();
    let address = SocketAddr::new("127.0.0.1".parse().unwrap(), listener.lease.port());
    tokio::spawn(serve(listener, Arc::new(tenant), Arc::new(upstream)));
    address
}

async fn ask_udp(from: &str, server: SocketAddr, packet: &[u8]) -> Message {
    let socket = UdpSocket::bind((from, 0)).await.unwrap();
    socket.send_to(packet, server).await.unwrap();
    let mut buffer = vec![0; 65_535];
    let (n, _) = tokio::time::timeout(Duration::from_secs(30), socket.recv_from(&mut buffer))
        .await
        .expect("an answer")
        .unwrap();
    Message::from_vec(&buffer[..n]).unwrap()
}

fn addresses(message: &Message) -> Vec<String> {
    message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0.to_string()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_tenant_name_is_answered_over_udp_and_other_tenants_pods_are_refused() {
    let server = start(Tenant { endpoints: 1 }, Upstream::default());
    let (id, packet) = query("web.default.svc.cluster.local.", RecordType::A, false);
    let answer = ask_udp("127.0.0.1", server, &packet).await;
    assert_eq!(answer.metadata.id, id);
    assert_eq!(answer.metadata.response_code, ResponseCode::NoError);
    assert!(answer.metadata.authoritative);
    assert_eq!(addresses(&answer), ["10.128.0.7"]);
    let (_, missing) = query("nope.default.svc.cluster.local.", RecordType::A, false);
    let answer = ask_udp("127.0.0.1", server, &missing).await;
    assert_eq!(answer.metadata.response_code, ResponseCode::NXDomain);
    let answer = ask_udp("127.0.0.2", server, &packet).await;
    assert_eq!(answer.metadata.response_code, ResponseCode::Refused);
    assert!(answer.answers.is_empty());
}

#[tokio::test]
async fn a_long_answer_is_truncated_over_udp_and_whole_over_tcp() {
    let server = start(Tenant { endpoints: 300 }, Upstream::default());
    let (_, packet) = query("many.default.svc.cluster.local.", RecordType::A, true);
    let answer = ask_udp("127.0.0.1", server, &packet).await;
    assert!(answer.metadata.truncation, "300 records do not fit 1232 bytes");
    assert!(answer.answers.is_empty());
    let mut stream = TcpStream::connect(server).await.unwrap();
    write_framed(&mut stream, &packet).await.unwrap();
    let whole = Message::from_vec(&read_framed(&mut stream).await.unwrap()).unwrap();
    assert!(!whole.metadata.truncation);
    assert_eq!(addresses(&whole).len(), 300);
    // A second query on the same connection.
    let (_, web) = query("web.default.svc.cluster.local.", RecordType::A, false);
    write_framed(&mut stream, &web).await.unwrap();
    let again = Message::from_vec(&read_framed(&mut stream).await.unwrap()).unwrap();
    assert_eq!(addresses(&again), ["10.128.0.7"]);
}

#[tokio::test]
async fn a_name_outside_the_zone_goes_upstream_and_fails_plainly_without_one() {
    // The upstream server: answers every query with one A record, 192.0.2.1.
    let upstream = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let upstream_address = upstream.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buffer = vec![0; 65_535];
        while let Ok((n, from)) = upstream.recv_from(&mut buffer).await {
            let request = Message::from_vec(&buffer[..n]).unwrap();
            let mut response = Message::response(request.metadata.id, OpCode::Query);
            response.queries = request.queries.clone();
            let name = request.queries[0].name().clone();
            response.add_answer(hickory_proto::rr::Record::from_rdata(
                name,
                60,
                RData::from(std::net::Ipv4Addr::new(192, 0, 2, 1)),
            ));
            upstream.send_to(&response.to_vec().unwrap(), from).await.unwrap();
        }
    });
    let server = start(
        Tenant { endpoints: 1 },
        Upstream {
            servers: vec![upstream_address],
        },
    );
    let (id, packet) = query("example.com.", RecordType::A, false);
    let answer = ask_udp("127.0.0.1", server, &packet).await;
    assert_eq!(answer.metadata.id, id);
    assert_eq!(addresses(&answer), ["192.0.2.1"], "the upstream server's answer");
    assert!(!answer.metadata.authoritative);

    let alone = start(Tenant { endpoints: 1 }, Upstream::default());
    let answer = ask_udp("127.0.0.1", alone, &packet).await;
    assert_eq!(answer.metadata.response_code, ResponseCode::ServFail);
}

#[test]
fn upstream_servers_are_read_from_resolv_conf() {
    let upstream = Upstream::from_resolv_conf(
        "search svc.cluster.local\nnameserver 10.96.0.10\n  nameserver fd00::a # comment\nnameserver bogus\noptions ndots:5\n",
    );
    assert_eq!(
        upstream.servers,
        ["10.96.0.10:53".parse().unwrap(), "[fd00::a]:53".parse().unwrap()]
    );
}
