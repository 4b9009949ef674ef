//! Issue 10, parts 1, 2 and 5: capn talks to a tenant's etcd (its own client certificate,
//! members dialed by name), changes its membership and replaces a lost member, booted with
//! real etcd processes through the runner.
//!
//! Timings and the writer's error counts are printed, not asserted.

use capn::etcd::EtcdClients;
use capn::pki::CertificateAuthority;
use time::OffsetDateTime;

use crate::boot::{StartCapn, boot_with, say};
use crate::harness::{secret, secret_value};

/// The etcd CA of the booted control plane `demo`, as capn loads it.
async fn etcd_ca(client: &kube::Client, ns: &str) -> CertificateAuthority {
    let ca = secret(client, ns, "demo-etcd").await.expect("the etcd CA exists");
    CertificateAuthority::from_pem(&secret_value(&ca, "tls.crt"), &secret_value(&ca, "tls.key")).expect("a CA")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capn_reaches_tenant_etcd_by_name_with_its_own_certificate() {
    let booted = boot_with("etcd client", None, StartCapn::InProcess).await;
    let ns = booted.ns.clone();
    let ca = etcd_ca(&booted.client, &ns).await;
    let now = OffsetDateTime::now_utc();
    let clients = EtcdClients::new(Some(booted.runner.hosts_file()));
    let etcd = clients.cluster(&ns, "demo", &ca, now).unwrap();
    let url = format!("https://demo-etcd-0.demo-etcd.{ns}.svc:2379");
    let members = etcd.member_list(std::slice::from_ref(&url)).await.unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].name, "demo-etcd-0");
    assert_eq!(
        members[0].peer_urls,
        vec![format!("https://demo-etcd-0.demo-etcd.{ns}.svc:2380")]
    );
    assert!(!members[0].learner);
    let status = etcd.status(&url).await.unwrap();
    assert_eq!(status.member_id, members[0].id);
    assert_eq!(status.leader, members[0].id, "a single member leads itself");
    say(&format!("etcd client: member list and status through {url}"));

    // The member's certificate is verified for the name dialed: a name it does not carry,
    // mapped to the same address, is refused.
    let address = booted.runner.resolve(&format!("demo-etcd-0.demo-etcd.{ns}.svc"))[0];
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, format!("{address} not-in-the-certificate.{ns}.svc\n")).unwrap();
    let elsewhere = EtcdClients::new(Some(hosts));
    let wrong_name = elsewhere
        .cluster(&ns, "demo", &ca, now)
        .unwrap()
        .member_list(&[format!("https://not-in-the-certificate.{ns}.svc:2379")])
        .await;
    assert!(
        wrong_name.is_err(),
        "a name outside the certificate must fail TLS: {wrong_name:?}"
    );

    // A client certificate from another CA is refused by etcd (mutual TLS).
    let stranger = CertificateAuthority::generate("etcd-ca", now, capn::pki::KeyAlgorithm::EcdsaP256).unwrap();
    let refused = clients
        .cluster(&ns, "stranger", &stranger, now)
        .unwrap()
        .member_list(std::slice::from_ref(&url))
        .await;
    assert!(refused.is_err(), "another CA's client must be refused: {refused:?}");
    booted.stop().await;
}
