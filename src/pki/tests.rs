//! Unit tests of the PKI module. Expected values are written out from docs/reference.md and
//! docs/design.md, not copied from the code's output.

use std::collections::BTreeSet;
use std::net::IpAddr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use time::{Duration, OffsetDateTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::*;

/// 2026-05-28T..Z, whole seconds (X.509 times have second precision).
fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_780_000_000).unwrap()
}

fn der(pem: &str) -> Vec<u8> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    assert_eq!(block.label, "CERTIFICATE");
    block.contents
}

fn with_cert<R>(pem: &str, f: impl FnOnce(&X509Certificate<'_>) -> R) -> R {
    let der = der(pem);
    let (rest, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!(rest.is_empty());
    f(&cert)
}

fn ts(t: &x509_parser::time::ASN1Time) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(t.timestamp()).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn strings(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn ips(v: &[&str]) -> BTreeSet<IpAddr> {
    v.iter().map(|s| ip(s)).collect()
}

/// Whether `leaf_pem` is signed by the key of `ca_pem`'s certificate.
fn verifies(leaf_pem: &str, ca_pem: &str) -> bool {
    with_cert(ca_pem, |ca| {
        with_cert(leaf_pem, |leaf| leaf.verify_signature(Some(ca.public_key())).is_ok())
    })
}

fn san_sets(cert: &X509Certificate<'_>) -> (BTreeSet<String>, BTreeSet<IpAddr>) {
    let mut dns = BTreeSet::new();
    let mut ips = BTreeSet::new();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    for name in &san.value.general_names {
        match name {
            GeneralName::DNSName(n) => {
                dns.insert(n.to_string());
            }
            GeneralName::IPAddress(b) if b.len() == 4 => {
                ips.insert(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap()));
            }
            GeneralName::IPAddress(b) if b.len() == 16 => {
                ips.insert(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap()));
            }
            other => panic!("unexpected SAN {other:?}"),
        }
    }
    (dns, ips)
}

fn cert_sans() -> Vec<String> {
    vec![
        "API.Example.com".to_string(),
        "198.51.100.7".to_string(),
        "localhost".to_string(),
        "*.apps.example.com".to_string(),
        "[fd00:99::1]".to_string(),
    ]
}

fn input<'a>(endpoint: Option<&'a str>, cidr: &'a str, sans: &'a [String]) -> ApiServerSanInput<'a> {
    ApiServerSanInput {
        cluster_name: "demo",
        namespace: "tenants",
        tenant_dns_domain: "cluster.local",
        super_dns_domain: "super.example",
        service_cidr: cidr,
        service_cluster_ip: Some(ip("10.43.0.17")),
        endpoint_host: endpoint,
        cert_sans: sans,
    }
}

/// The DNS SANs docs/reference.md lists for the apiserver of cluster `demo` in `tenants`, with
/// `<d>` = cluster.local and `<sd>` = super.example, plus the certSANs names.
const APISERVER_DNS: [&str; 11] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "demo-apiserver",
    "demo-apiserver.tenants",
    "demo-apiserver.tenants.svc",
    "demo-apiserver.tenants.svc.super.example",
    "localhost",
    "api.example.com",
    "*.apps.example.com",
];

fn assert_no_duplicates(leaf: &LeafSpec) {
    let dns: BTreeSet<_> = leaf.dns_names.iter().collect();
    let ipset: BTreeSet<_> = leaf.ip_addresses.iter().collect();
    assert_eq!(dns.len(), leaf.dns_names.len(), "duplicate DNS SAN in {leaf:?}");
    assert_eq!(ipset.len(), leaf.ip_addresses.len(), "duplicate IP SAN in {leaf:?}");
}

#[test]
fn ca_has_the_rules_of_reference_md() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    with_cert(ca.cert_pem(), |c| {
        assert_eq!(c.subject().to_string(), "CN=kubernetes");
        assert_eq!(c.issuer().to_string(), "CN=kubernetes");
        let bc = c.basic_constraints().unwrap().unwrap();
        assert!(bc.value.ca);
        assert!(bc.critical);
        let ku = c.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign() && ku.crl_sign() && ku.digital_signature());
        assert_eq!(ts(&c.validity().not_before), t0() - Duration::minutes(5));
        assert_eq!(ts(&c.validity().not_after), t0() + Duration::days(3650));
        assert!(
            c.iter_extensions()
                .any(|e| matches!(e.parsed_extension(), ParsedExtension::SubjectKeyIdentifier(_)))
        );
        // Self-signed.
        assert!(c.verify_signature(None).is_ok());
        assert!(c.raw_serial()[0] < 0x80, "serial must be positive");
    });
    assert!(ca.pem().key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
}

#[test]
fn leaf_verifies_against_its_ca_and_not_another() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let other = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let now = t0() + Duration::hours(3);
    let sans = cert_sans();
    let spec = apiserver_leaf(input(Some("203.0.113.10"), "10.96.0.0/12", &sans)).unwrap();
    let leaf = ca.issue(&spec, now, KeyAlgorithm::EcdsaP256).unwrap();

    assert!(verifies(&leaf.cert_pem, ca.cert_pem()));
    assert!(!verifies(&leaf.cert_pem, other.cert_pem()));

    let ca_not_before = with_cert(ca.cert_pem(), |c| ts(&c.validity().not_before));
    let ca_ski = with_cert(ca.cert_pem(), |c| {
        c.iter_extensions()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
                _ => None,
            })
            .unwrap()
    });
    with_cert(&leaf.cert_pem, |c| {
        assert_eq!(c.subject().to_string(), "CN=kube-apiserver");
        assert_eq!(c.issuer().to_string(), "CN=kubernetes");
        let not_before = ts(&c.validity().not_before);
        assert!(not_before < now);
        assert_eq!(not_before, now - Duration::minutes(5));
        assert_ne!(not_before, ca_not_before);
        assert_eq!(ts(&c.validity().not_after), now + Duration::days(365));
        let bc = c.basic_constraints().unwrap().unwrap();
        assert!(!bc.value.ca);
        let eku = c.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth);
        assert!(!eku.client_auth);
        let aki = c
            .iter_extensions()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(a) => a.key_identifier.as_ref().map(|k| k.0.to_vec()),
                _ => None,
            })
            .expect("leaf has an AuthorityKeyIdentifier");
        assert_eq!(aki, ca_ski);
        assert!(
            c.iter_extensions()
                .any(|e| matches!(e.parsed_extension(), ParsedExtension::SubjectKeyIdentifier(_)))
        );
        let (dns, ipset) = san_sets(c);
        assert_eq!(dns, strings(&APISERVER_DNS));
        assert_eq!(
            ipset,
            ips(&[
                "10.96.0.1",
                "10.43.0.17",
                "127.0.0.1",
                "203.0.113.10",
                "198.51.100.7",
                "fd00:99::1"
            ])
        );
    });
    assert_eq!(not_after(&leaf.cert_pem).unwrap(), now + Duration::days(365));
}

#[test]
fn serials_differ_and_are_positive() {
    let ca = CertificateAuthority::generate("etcd-ca", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let a = ca.issue(&admin_leaf(), t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let b = ca.issue(&admin_leaf(), t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let sa = with_cert(&a.cert_pem, |c| c.raw_serial().to_vec());
    let sb = with_cert(&b.cert_pem, |c| c.raw_serial().to_vec());
    let sca = with_cert(ca.cert_pem(), |c| c.raw_serial().to_vec());
    assert_ne!(sa, sb);
    assert_ne!(sa, sca);
    for s in [&sa, &sb, &sca] {
        assert!(s[0] < 0x80 && s.iter().any(|b| *b != 0), "serial {s:?} not positive");
    }
}

#[test]
fn ca_round_trips_through_pem_and_still_signs() {
    let ca = CertificateAuthority::generate("front-proxy-ca", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let loaded = CertificateAuthority::from_pem(&ca.pem().cert_pem, &ca.pem().key_pem).unwrap();
    assert_eq!(loaded.pem(), ca.pem());
    assert_eq!(loaded.cert_der(), ca.cert_der());
    let leaf = loaded
        .issue(&front_proxy_client_leaf(), t0(), KeyAlgorithm::EcdsaP256)
        .unwrap();
    // Verified against the original CA's certificate, not the loaded copy.
    assert!(verifies(&leaf.cert_pem, &ca.pem().cert_pem));
    with_cert(&leaf.cert_pem, |c| {
        assert_eq!(c.issuer().to_string(), "CN=front-proxy-ca");
        assert_eq!(c.subject().to_string(), "CN=front-proxy-client");
        let eku = c.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
    });
    // A leaf issued by the loaded CA is current for the original one.
    assert!(!needs_reissue(&leaf, &ca, &front_proxy_client_leaf(), t0()));
}

#[test]
fn from_pem_rejects_bad_input() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let other = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let err = CertificateAuthority::from_pem(ca.cert_pem(), &other.pem().key_pem).unwrap_err();
    assert!(matches!(err, PkiError::KeyMismatch { .. }), "{err:?}");
    assert_eq!(err.reason(), "KeyMismatch");

    let leaf = ca.issue(&admin_leaf(), t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let err = CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem).unwrap_err();
    assert!(matches!(err, PkiError::NotCa { .. }), "{err:?}");

    let err = CertificateAuthority::from_pem("garbage", &ca.pem().key_pem).unwrap_err();
    assert_eq!(err.reason(), "InvalidPEM");
    let err = CertificateAuthority::from_pem(ca.cert_pem(), "garbage").unwrap_err();
    assert_eq!(err.reason(), "InvalidPEM");
    // Errors never carry the key.
    let key_body = ca.pem().key_pem.lines().nth(1).unwrap().to_string();
    let err = CertificateAuthority::from_pem(ca.cert_pem(), &other.pem().key_pem).unwrap_err();
    assert!(!format!("{err} {err:?}").contains(&key_body));
}

#[test]
fn apiserver_sans_with_ipv4_endpoint() {
    let sans = cert_sans();
    let leaf = apiserver_leaf(input(Some("203.0.113.10"), "10.96.0.0/12", &sans)).unwrap();
    assert_eq!(leaf.common_name, "kube-apiserver");
    assert_eq!(leaf.organization, None);
    assert!(leaf.server && !leaf.client);
    assert_eq!(
        leaf.dns_names.iter().cloned().collect::<BTreeSet<_>>(),
        strings(&APISERVER_DNS)
    );
    assert_eq!(
        leaf.ip_addresses.iter().copied().collect::<BTreeSet<_>>(),
        ips(&[
            "10.96.0.1",
            "10.43.0.17",
            "127.0.0.1",
            "203.0.113.10",
            "198.51.100.7",
            "fd00:99::1"
        ])
    );
    // "localhost" is both built in and in certSANs: it appears once.
    assert_no_duplicates(&leaf);
    assert_eq!(leaf.dns_names.len(), APISERVER_DNS.len());
}

#[test]
fn apiserver_sans_with_ipv6_endpoint_and_service_cidr() {
    let sans = cert_sans();
    let leaf = apiserver_leaf(input(Some("[fd00:10::5]"), "fd00::/108", &sans)).unwrap();
    assert_eq!(
        leaf.dns_names.iter().cloned().collect::<BTreeSet<_>>(),
        strings(&APISERVER_DNS)
    );
    assert_eq!(
        leaf.ip_addresses.iter().copied().collect::<BTreeSet<_>>(),
        ips(&[
            "fd00::1",
            "10.43.0.17",
            "127.0.0.1",
            "fd00:10::5",
            "198.51.100.7",
            "fd00:99::1"
        ])
    );
    assert!(!leaf.dns_names.iter().any(|n| n.contains('[') || n.contains(':')));
    assert_no_duplicates(&leaf);

    // Unbracketed IPv6 endpoint: same IP SAN.
    let leaf = apiserver_leaf(input(Some("fd00:10::5"), "fd00::/108", &[])).unwrap();
    assert!(leaf.ip_addresses.contains(&ip("fd00:10::5")));
}

#[test]
fn apiserver_sans_with_name_endpoint_and_without_endpoint() {
    let leaf = apiserver_leaf(input(Some("cp.example.org"), "10.96.0.0/12", &[])).unwrap();
    assert!(leaf.dns_names.contains(&"cp.example.org".to_string()));
    assert_eq!(
        leaf.ip_addresses.iter().copied().collect::<BTreeSet<_>>(),
        ips(&["10.96.0.1", "10.43.0.17", "127.0.0.1"])
    );
    let mut without = input(None, "10.96.0.0/12", &[]);
    without.service_cluster_ip = None;
    let leaf = apiserver_leaf(without).unwrap();
    assert_eq!(leaf.dns_names.len(), 9);
    assert_eq!(leaf.ip_addresses, vec![ip("10.96.0.1"), ip("127.0.0.1")]);
}

#[test]
fn apiserver_sans_reject_invalid_input() {
    let err = apiserver_leaf(input(None, "10.96.0.0/99", &[])).unwrap_err();
    assert!(matches!(err, PkiError::InvalidCidr { .. }), "{err:?}");
    assert_eq!(err.reason(), "InvalidServiceCIDR");
    let err = apiserver_leaf(input(None, "not-a-cidr", &[])).unwrap_err();
    assert!(matches!(err, PkiError::InvalidCidr { .. }), "{err:?}");
    let bad = vec!["bad_name!".to_string()];
    let err = apiserver_leaf(input(None, "10.96.0.0/12", &bad)).unwrap_err();
    assert!(matches!(err, PkiError::InvalidSan { .. }), "{err:?}");
    let err = apiserver_leaf(input(Some("-bad-.example"), "10.96.0.0/12", &[])).unwrap_err();
    assert_eq!(err.reason(), "InvalidSAN");
    // Wildcards only in certSANs.
    let err = apiserver_leaf(input(Some("*.example.org"), "10.96.0.0/12", &[])).unwrap_err();
    assert_eq!(err.reason(), "InvalidSAN");
}

#[test]
fn first_service_ips() {
    assert_eq!(service_cidr_first_ips("10.96.0.0/12").unwrap(), vec![ip("10.96.0.1")]);
    assert_eq!(service_cidr_first_ips("fd00::/108").unwrap(), vec![ip("fd00::1")]);
    assert_eq!(service_cidr_first_ips("172.20.0.0/16").unwrap(), vec![ip("172.20.0.1")]);
    // Host bits are ignored, as kubeadm does.
    assert_eq!(service_cidr_first_ips("10.96.7.9/12").unwrap(), vec![ip("10.96.0.1")]);
    assert_eq!(
        service_cidr_first_ips("10.96.0.0/12, fd00::/108").unwrap(),
        vec![ip("10.96.0.1"), ip("fd00::1")]
    );
    for bad in [
        "",
        "10.96.0.0",
        "10.0.0.1/32",
        "10.0.0.0/31",
        "fd00::/128",
        "10.96.0.0/12,",
    ] {
        assert!(service_cidr_first_ips(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn etcd_sans_cover_every_member() {
    let hosts = etcd_member_hosts("demo", "tenants", 3);
    assert_eq!(
        hosts,
        vec![
            "demo-etcd-0.demo-etcd.tenants.svc",
            "demo-etcd-1.demo-etcd.tenants.svc",
            "demo-etcd-2.demo-etcd.tenants.svc",
        ]
    );
    let leaf = etcd_server_leaf("demo", "tenants", "super.example", 3);
    assert_eq!(leaf.common_name, "demo-etcd");
    assert!(leaf.server && leaf.client);
    for host in &hosts {
        assert!(leaf.dns_names.contains(host), "{host} missing");
    }
    let mut expected = BTreeSet::new();
    for i in 0..3 {
        for suffix in [
            "",
            ".demo-etcd",
            ".demo-etcd.tenants",
            ".demo-etcd.tenants.svc",
            ".demo-etcd.tenants.svc.super.example",
        ] {
            expected.insert(format!("demo-etcd-{i}{suffix}"));
        }
    }
    for name in [
        "demo-etcd",
        "demo-etcd.tenants",
        "demo-etcd.tenants.svc",
        "demo-etcd.tenants.svc.super.example",
        "localhost",
    ] {
        expected.insert(name.to_string());
    }
    assert_eq!(leaf.dns_names.iter().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(leaf.ip_addresses, vec![ip("127.0.0.1")]);
    assert_no_duplicates(&leaf);

    let ca = CertificateAuthority::generate("etcd-ca", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let pair = ca.issue(&leaf, t0(), KeyAlgorithm::EcdsaP256).unwrap();
    with_cert(&pair.cert_pem, |c| {
        let eku = c.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        assert_eq!(san_sets(c).0, expected);
    });
    // A replica change changes the certificate.
    let bigger = etcd_server_leaf("demo", "tenants", "super.example", 5);
    assert!(needs_reissue(&pair, &ca, &bigger, t0()));
    assert!(!needs_reissue(&pair, &ca, &leaf, t0()));
}

#[test]
fn client_identities_match_reference_md() {
    let cases = [
        (apiserver_etcd_client_leaf(), "kube-apiserver-etcd-client", None),
        (
            apiserver_kubelet_client_leaf(),
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
        ),
        (front_proxy_client_leaf(), "front-proxy-client", None),
        (controller_manager_leaf(), "system:kube-controller-manager", None),
        (admin_leaf(), "kubernetes-admin", Some("system:masters")),
        (etcd_healthcheck_client_leaf(), "kube-etcd-healthcheck-client", None),
    ];
    for (leaf, cn, o) in cases {
        assert_eq!(leaf.common_name, cn);
        assert_eq!(leaf.organization.as_deref(), o);
        assert!(leaf.client && !leaf.server, "{cn}");
        assert!(leaf.dns_names.is_empty() && leaf.ip_addresses.is_empty());
    }
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let pair = ca.issue(&admin_leaf(), t0(), KeyAlgorithm::EcdsaP256).unwrap();
    with_cert(&pair.cert_pem, |c| {
        let o: Vec<_> = c.subject().iter_organization().map(|a| a.as_str().unwrap()).collect();
        let cn: Vec<_> = c.subject().iter_common_name().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(o, ["system:masters"]);
        assert_eq!(cn, ["kubernetes-admin"]);
        assert!(c.subject_alternative_name().unwrap().is_none());
    });
}

#[test]
fn needs_reissue_cases() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let other = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let sans = cert_sans();
    let wanted = apiserver_leaf(input(Some("203.0.113.10"), "10.96.0.0/12", &sans)).unwrap();
    let now = t0() + Duration::days(1);
    let fresh = ca.issue(&wanted, now, KeyAlgorithm::EcdsaP256).unwrap();

    assert!(!needs_reissue(&fresh, &ca, &wanted, now));
    // SAN order does not matter.
    let mut reordered = wanted.clone();
    reordered.dns_names.reverse();
    reordered.ip_addresses.reverse();
    assert!(!needs_reissue(&fresh, &ca, &reordered, now));

    // A SAN change (new certSAN, or the ClusterIP changed).
    let more = vec!["extra.example.com".to_string()];
    let changed = apiserver_leaf(input(Some("203.0.113.10"), "10.96.0.0/12", &more)).unwrap();
    assert!(needs_reissue(&fresh, &ca, &changed, now));
    let mut ip_changed = input(Some("203.0.113.10"), "10.96.0.0/12", &sans);
    ip_changed.service_cluster_ip = Some(ip("10.43.0.18"));
    assert!(needs_reissue(&fresh, &ca, &apiserver_leaf(ip_changed).unwrap(), now));
    // CN, O and usages.
    let mut cn = wanted.clone();
    cn.common_name = "other".to_string();
    assert!(needs_reissue(&fresh, &ca, &cn, now));
    let mut org = wanted.clone();
    org.organization = Some("system:masters".to_string());
    assert!(needs_reissue(&fresh, &ca, &org, now));
    let mut usage = wanted.clone();
    usage.client = true;
    assert!(needs_reissue(&fresh, &ca, &usage, now));

    // Another CA.
    assert!(needs_reissue(&fresh, &other, &wanted, now));

    // Lifetime 365 days: re-issued once 365/3 ≈ 121.7 days or less remain.
    let old = ca
        .issue(&wanted, now - Duration::days(250), KeyAlgorithm::EcdsaP256)
        .unwrap();
    assert!(needs_reissue(&old, &ca, &wanted, now), "115 days left");
    let younger = ca
        .issue(&wanted, now - Duration::days(200), KeyAlgorithm::EcdsaP256)
        .unwrap();
    assert!(!needs_reissue(&younger, &ca, &wanted, now), "165 days left");
    // Expired, and not yet valid.
    assert!(needs_reissue(&fresh, &ca, &wanted, now + Duration::days(400)));
    assert!(needs_reissue(&fresh, &ca, &wanted, now - Duration::hours(1)));

    // Broken pairs.
    let garbage = KeyPairPem {
        cert_pem: "x".into(),
        key_pem: fresh.key_pem.clone(),
    };
    assert!(needs_reissue(&garbage, &ca, &wanted, now));
    let other_leaf = ca.issue(&wanted, now, KeyAlgorithm::EcdsaP256).unwrap();
    let swapped = KeyPairPem {
        cert_pem: fresh.cert_pem.clone(),
        key_pem: other_leaf.key_pem.clone(),
    };
    assert!(needs_reissue(&swapped, &ca, &wanted, now));
    let no_key = KeyPairPem {
        cert_pem: fresh.cert_pem.clone(),
        key_pem: String::new(),
    };
    assert!(needs_reissue(&no_key, &ca, &wanted, now));
}

#[test]
fn service_account_public_key_matches_private_key() {
    let pair = service_account_key_pair(KeyAlgorithm::EcdsaP256).unwrap();
    assert!(pair.cert_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
    assert!(pair.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));

    // Sign something with the private key and verify it with the public key PEM.
    let key = rcgen::KeyPair::from_pem(&pair.key_pem).unwrap();
    let signed = rcgen::CertificateParams::new(vec!["probe".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (_, block) = x509_parser::pem::parse_x509_pem(pair.cert_pem.as_bytes()).unwrap();
    assert_eq!(block.label, "PUBLIC KEY");
    let (_, spki) = SubjectPublicKeyInfo::from_der(&block.contents).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(signed.der()).unwrap();
    assert!(cert.verify_signature(Some(&spki)).is_ok());

    verify_service_account_key_pair(&pair).unwrap();
    let second = service_account_key_pair(KeyAlgorithm::EcdsaP256).unwrap();
    assert_ne!(second.cert_pem, pair.cert_pem);
    let mixed = KeyPairPem {
        cert_pem: pair.cert_pem.clone(),
        key_pem: second.key_pem.clone(),
    };
    let err = verify_service_account_key_pair(&mixed).unwrap_err();
    assert!(matches!(err, PkiError::KeyMismatch { .. }), "{err:?}");
}

#[test]
fn debug_never_prints_keys() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let pair = ca.issue(&admin_leaf(), t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let sa = service_account_key_pair(KeyAlgorithm::EcdsaP256).unwrap();
    for (debug, key_pem) in [
        (format!("{pair:?}"), &pair.key_pem),
        (format!("{sa:?} {sa:#?}"), &sa.key_pem),
        (format!("{ca:?} {:?}", ca.pem()), &ca.pem().key_pem),
    ] {
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        for line in key_pem.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!debug.contains(line), "{debug}");
        }
    }
    let debug = format!("{pair:?}");
    assert!(debug.contains(&fingerprint_sha256(&pair.cert_pem).unwrap()));
}

#[test]
fn fingerprint_is_sha256_of_der() {
    use sha2::Digest;
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let fp = fingerprint_sha256(ca.cert_pem()).unwrap();
    let expected: String = sha2::Sha256::digest(der(ca.cert_pem()))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(fp, expected);
    assert_eq!(fp.len(), 64);
    assert!(fingerprint_sha256("nope").is_err());
    assert_eq!(not_after(ca.cert_pem()).unwrap(), t0() + Duration::days(3650));
}

#[test]
fn kubeconfig_parses_back() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let admin = ca.issue(&admin_leaf(), t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let url = server_url("fd00::1", 6443);
    let text = kubeconfig("demo", &admin_user("demo"), &url, ca.cert_pem(), &admin);
    // Plain one-line scalars: a folded block (`>`) wrapped at whitespace would be harmless,
    // but kubectl-written files never use one.
    assert!(!text.contains(": >"), "{text}");
    let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["kind"], "Config");
    assert_eq!(v["clusters"][0]["name"], "demo");
    assert_eq!(v["clusters"][0]["cluster"]["server"], "https://[fd00::1]:6443");
    assert_eq!(v["users"][0]["name"], "demo-admin");
    assert_eq!(v["contexts"][0]["name"], "demo-admin@demo");
    assert_eq!(v["contexts"][0]["context"]["cluster"], "demo");
    assert_eq!(v["contexts"][0]["context"]["user"], "demo-admin");
    assert_eq!(v["current-context"], "demo-admin@demo");
    let decode = |s: &serde_json::Value| String::from_utf8(STANDARD.decode(s.as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(
        decode(&v["clusters"][0]["cluster"]["certificate-authority-data"]),
        ca.pem().cert_pem
    );
    assert_eq!(
        decode(&v["users"][0]["user"]["client-certificate-data"]),
        admin.cert_pem
    );
    assert_eq!(decode(&v["users"][0]["user"]["client-key-data"]), admin.key_pem);

    // Controller-manager flavour: a user name with a colon.
    let text = kubeconfig(
        "demo",
        CONTROLLER_MANAGER_USER,
        &server_url(&apiserver_service_host("demo", "tenants"), APISERVER_PORT),
        ca.cert_pem(),
        &admin,
    );
    let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(v["users"][0]["name"], "system:kube-controller-manager");
    assert_eq!(v["current-context"], "system:kube-controller-manager@demo");
    assert_eq!(
        v["clusters"][0]["cluster"]["server"],
        "https://demo-apiserver.tenants.svc:6443"
    );
}

#[test]
fn server_urls() {
    assert_eq!(server_url("203.0.113.10", 6443), "https://203.0.113.10:6443");
    assert_eq!(server_url("fd00::1", 443), "https://[fd00::1]:443");
    assert_eq!(server_url("[fd00::1]", 443), "https://[fd00::1]:443");
    assert_eq!(server_url("cp.example.org", 6443), "https://cp.example.org:6443");
}

#[test]
fn secrets_encode_and_decode() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let names = SecretNames::new("demo");
    let s = tls_secret(&names.ca, "tenants", "demo", ca.pem());
    assert_eq!(s.metadata.name.as_deref(), Some("demo-ca"));
    assert_eq!(s.metadata.namespace.as_deref(), Some("tenants"));
    assert_eq!(s.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(
        s.metadata
            .labels
            .as_ref()
            .unwrap()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("demo")
    );
    assert!(s.metadata.owner_references.is_none());
    let data = s.data.as_ref().unwrap();
    assert_eq!(
        data.keys().map(String::as_str).collect::<Vec<_>>(),
        ["tls.crt", "tls.key"]
    );
    assert_eq!(data["tls.crt"].0, ca.pem().cert_pem.as_bytes());
    assert_eq!(&key_pair_from_secret(&s).unwrap(), ca.pem());
    // The decoded pair loads as the same CA.
    let back = key_pair_from_secret(&s).unwrap();
    CertificateAuthority::from_pem(&back.cert_pem, &back.key_pem).unwrap();

    let mut missing = s.clone();
    missing.data.as_mut().unwrap().remove("tls.key");
    match key_pair_from_secret(&missing).unwrap_err() {
        PkiError::MissingKey { secret, key } => {
            assert_eq!(secret, "demo-ca");
            assert_eq!(key, "tls.key");
        }
        other => panic!("{other:?}"),
    }
    let mut empty = s.clone();
    empty.data = None;
    assert_eq!(key_pair_from_secret(&empty).unwrap_err().reason(), "MissingSecretKey");

    let k = kubeconfig_secret(&names.kubeconfig, "tenants", "demo", "apiVersion: v1\n");
    assert_eq!(k.metadata.name.as_deref(), Some("demo-kubeconfig"));
    assert_eq!(k.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(k.data.as_ref().unwrap().keys().collect::<Vec<_>>(), ["value"]);
    assert_eq!(kubeconfig_from_secret(&k).unwrap(), "apiVersion: v1\n");
}

#[test]
fn secret_names_follow_design_table() {
    let n = SecretNames::new("demo");
    assert_eq!(n.ca, "demo-ca");
    assert_eq!(n.etcd_ca, "demo-etcd");
    assert_eq!(n.proxy_ca, "demo-proxy");
    assert_eq!(n.sa, "demo-sa");
    assert_eq!(n.apiserver, "demo-apiserver");
    assert_eq!(n.apiserver_etcd_client, "demo-apiserver-etcd-client");
    assert_eq!(n.etcd_server, "demo-etcd-server");
    assert_eq!(n.apiserver_kubelet_client, "demo-apiserver-kubelet-client");
    assert_eq!(n.front_proxy_client, "demo-front-proxy-client");
    assert_eq!(n.controller_manager_kubeconfig, "demo-controller-manager-kubeconfig");
    assert_eq!(n.kubeconfig, "demo-kubeconfig");
    assert_eq!(n.all().iter().collect::<BTreeSet<_>>().len(), 12);
}

#[test]
fn clusters_of_a_secret_name_are_every_fitting_prefix() {
    fn clusters(name: &str) -> Vec<&str> {
        SecretNames::clusters_of(name).collect()
    }
    assert_eq!(clusters("demo-etcd-server"), ["demo"]);
    assert_eq!(clusters("demo-apiserver-etcd-client"), ["demo"]);
    // `x-etcd` is x's etcd CA; `x-apiserver` is x's serving certificate.
    assert_eq!(clusters("x-etcd"), ["x"]);
    // The CA of a cluster named `a-front-proxy` (`a`'s client is `a-front-proxy-client`).
    assert_eq!(clusters("a-front-proxy-ca"), ["a-front-proxy"]);
    // Ambiguous: `p-kubeconfig` of cluster `p-controller-manager`, or cluster `p`'s CM kubeconfig.
    let mut both = clusters("p-controller-manager-kubeconfig");
    both.sort();
    assert_eq!(both, ["p", "p-controller-manager"]);
    assert!(clusters("kubeconfig").is_empty());
    assert!(clusters("-ca").is_empty());
    assert!(clusters("unrelated").is_empty());
    // Every name of the table maps back to its cluster.
    for name in SecretNames::new("demo").all() {
        assert!(clusters(name).contains(&"demo"), "{name}");
    }
}

#[test]
fn rsa_ca_and_leaves() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::Rsa2048).unwrap();
    with_cert(ca.cert_pem(), |c| {
        assert_eq!(
            c.public_key().algorithm.algorithm.to_id_string(),
            "1.2.840.113549.1.1.1"
        );
        match c.public_key().parsed().unwrap() {
            x509_parser::public_key::PublicKey::RSA(rsa) => assert_eq!(rsa.key_size(), 2048),
            other => panic!("{other:?}"),
        }
    });
    // An RSA CA signs ECDSA leaves, and survives a PEM round trip.
    let loaded = CertificateAuthority::from_pem(ca.cert_pem(), &ca.pem().key_pem).unwrap();
    let leaf = loaded
        .issue(&controller_manager_leaf(), t0(), KeyAlgorithm::EcdsaP256)
        .unwrap();
    assert!(verifies(&leaf.cert_pem, ca.cert_pem()));
    assert!(!needs_reissue(&leaf, &ca, &controller_manager_leaf(), t0()));
    // An ECDSA CA signs RSA leaves with keyEncipherment.
    let ec = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::EcdsaP256).unwrap();
    let leaf = ec.issue(&admin_leaf(), t0(), KeyAlgorithm::Rsa2048).unwrap();
    assert!(verifies(&leaf.cert_pem, ec.cert_pem()));
    with_cert(&leaf.cert_pem, |c| {
        let ku = c.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && ku.key_encipherment());
    });
    let sa = service_account_key_pair(KeyAlgorithm::Rsa2048).unwrap();
    verify_service_account_key_pair(&sa).unwrap();
}

#[test]
fn certificate_authority_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CertificateAuthority>();
    assert_send_sync::<KeyPairPem>();
    assert_send_sync::<PkiError>();
    // Small enough to sit in an enum variant without clippy's large_enum_variant.
    assert!(std::mem::size_of::<CertificateAuthority>() < 200);
}

#[test]
fn renewal_comes_when_a_third_of_the_life_remains_or_earlier_by_policy() {
    let issued = t0();
    let not_before = issued - NOT_BEFORE_BACKDATE;
    let year = RenewalPolicy::default();
    let not_after = issued + Duration::days(360);
    assert_eq!(year.renew_at(not_before, not_after), issued + Duration::days(240));
    // rolloutBefore.certificatesExpiryDays: earlier when it says so...
    let before_150 = RenewalPolicy {
        renew_before: Some(Duration::days(150)),
        ..year
    };
    assert_eq!(before_150.renew_at(not_before, not_after), issued + Duration::days(210));
    // ...never later than the third-of-life rule...
    let before_10 = RenewalPolicy {
        renew_before: Some(Duration::days(10)),
        ..year
    };
    assert_eq!(before_10.renew_at(not_before, not_after), issued + Duration::days(240));
    // ...and never before a third of the life passed, so a long threshold cannot loop.
    let before_1000 = RenewalPolicy {
        renew_before: Some(Duration::days(1000)),
        ..year
    };
    assert_eq!(
        before_1000.renew_at(not_before, not_after),
        issued + Duration::days(120)
    );
    // A short validity is not swallowed by the clock-skew backdate.
    let short = issued + Duration::seconds(90);
    assert_eq!(year.renew_at(not_before, short), issued + Duration::seconds(60));
}

#[test]
fn the_renew_window_is_what_is_left_of_a_new_leaf_at_its_renewal() {
    let year = RenewalPolicy::default();
    assert_eq!(year.renew_window(), Duration::days(365) / 3);
    let before_150 = RenewalPolicy {
        renew_before: Some(Duration::days(150)),
        ..year
    };
    assert_eq!(before_150.renew_window(), Duration::days(150));
    let before_1000 = RenewalPolicy {
        renew_before: Some(Duration::days(1000)),
        ..year
    };
    assert_eq!(before_1000.renew_window(), Duration::days(365) * 2 / 3);
    let short = RenewalPolicy {
        validity: Duration::seconds(90),
        renew_before: None,
    };
    assert_eq!(short.renew_window(), Duration::seconds(30));
}

#[test]
fn check_leaf_keeps_a_leaf_until_its_renewal_time() {
    let ca = CertificateAuthority::generate("kubernetes", t0(), KeyAlgorithm::default()).unwrap();
    let policy = RenewalPolicy {
        validity: Duration::seconds(90),
        renew_before: None,
    };
    let wanted = front_proxy_client_leaf();
    let leaf = ca
        .issue_valid_for(&wanted, t0(), KeyAlgorithm::default(), policy.validity)
        .unwrap();
    let (not_after, renew_at) = check_leaf(&leaf, &ca, &wanted, &policy, t0()).expect("fresh");
    assert_eq!(not_after, t0() + Duration::seconds(90));
    assert_eq!(renew_at, t0() + Duration::seconds(60));
    assert!(check_leaf(&leaf, &ca, &wanted, &policy, t0() + Duration::seconds(59)).is_some());
    assert!(check_leaf(&leaf, &ca, &wanted, &policy, t0() + Duration::seconds(60)).is_none());
}
