//! Staged rotation of a certificate authority or of the service-account key pair (docs/design.md §9:
//! "a CA changes only through an explicit, staged rotation in which old and new CAs are
//! trusted together until every component has rolled").
//!
//! The authority's Secret always has the same shape during a rotation: `tls.crt` holds the
//! signing certificate (or public key) first, then every other one still trusted;
//! `tls.key` holds the key of the first. Because a trust bundle is just that file, every
//! process and kubeconfig that trusts `tls.crt` trusts old and new together while both are
//! in it. The new authority waits in a Secret of its own (`<secret>-next`) from the first
//! stage to the last, so that an interrupted rotation resumes from what the Secrets and the
//! recorded phase say.
//!
//! | phase | `tls.crt` | `tls.key` | what follows |
//! |---|---|---|---|
//! | `NewAuthority` | old | old | the new authority is generated into `<secret>-next` |
//! | `TrustBoth` | old, new | old | every component rolls to trust both |
//! | `SignWithNew` | new, old | new | every leaf is re-issued by the new CA; components roll |
//! | `DropOld` | new | new | components roll to trust only the new; `<secret>-next` goes |
//!
//! When the old authority is lost (its Secret deleted, no backup), there is nothing to trust
//! together: the rotation goes from `NewAuthority` straight to `SignWithNew` with the new
//! authority alone, and clients must fetch the new kubeconfig.

use std::fmt;

use super::KeyPairPem;

/// An authority capn can rotate, named as in the rotation request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Authority {
    /// The cluster CA (`<c>-ca`).
    Cluster,
    /// The etcd CA (`<c>-etcd`).
    Etcd,
    /// The front-proxy CA (`<c>-proxy`).
    FrontProxy,
    /// The service-account key pair (`<c>-sa`).
    ServiceAccount,
}

impl Authority {
    /// All authorities, in the words of a request.
    pub const ALL: [Authority; 4] = [Self::Cluster, Self::Etcd, Self::FrontProxy, Self::ServiceAccount];

    /// The word a request uses: `ca`, `etcd`, `front-proxy`, `sa`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cluster => "ca",
            Self::Etcd => "etcd",
            Self::FrontProxy => "front-proxy",
            Self::ServiceAccount => "sa",
        }
    }

    /// Parses a request's word.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == word)
    }

    /// Whether this is a certificate authority (it signs leaves), not a bare key pair.
    pub fn signs_certificates(self) -> bool {
        self != Self::ServiceAccount
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The phases of a rotation, in order (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    NewAuthority,
    TrustBoth,
    SignWithNew,
    DropOld,
    Completed,
}

impl Phase {
    /// The phase's name in status, conditions and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NewAuthority => "NewAuthority",
            Self::TrustBoth => "TrustBoth",
            Self::SignWithNew => "SignWithNew",
            Self::DropOld => "DropOld",
            Self::Completed => "Completed",
        }
    }

    /// Parses a phase name written by [`Self::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::NewAuthority,
            Self::TrustBoth,
            Self::SignWithNew,
            Self::DropOld,
            Self::Completed,
        ]
        .into_iter()
        .find(|p| p.as_str() == name)
    }

    /// The phase after this one; `old_lost` skips `TrustBoth` (nothing old to trust).
    pub fn next(self, old_lost: bool) -> Self {
        match self {
            Self::NewAuthority if old_lost => Self::SignWithNew,
            Self::NewAuthority => Self::TrustBoth,
            Self::TrustBoth => Self::SignWithNew,
            Self::SignWithNew => Self::DropOld,
            Self::DropOld | Self::Completed => Self::Completed,
        }
    }
}

/// A rotation request from the annotation value: `<authority>` or `<authority>/<id>` (the
/// id only makes a repeated request of the same authority a new one).
///
/// # Errors
/// A message naming the allowed authorities when the word is not one of them.
pub fn parse_request(value: &str) -> Result<Authority, String> {
    let word = value.split_once('/').map_or(value, |(w, _)| w).trim();
    Authority::parse(word).ok_or_else(|| {
        format!(
            "unknown authority {word:?} to rotate; use one of {} (optionally followed by /<request id>)",
            Authority::ALL.map(Authority::as_str).join(", ")
        )
    })
}

/// The PEM blocks of a document, each with its BEGIN and END lines, in order.
pub fn pem_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("-----BEGIN ") {
            current = Some(String::new());
        }
        if let Some(block) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
        if line.starts_with("-----END ")
            && let Some(block) = current.take()
        {
            blocks.push(block);
        }
    }
    blocks
}

/// The content the authority's Secret must hold in `phase`, given what it holds now
/// (`current`, `None` when the Secret is lost) and the new authority (`next`). `None` when
/// the phase leaves it as it is (`NewAuthority`, or `Completed`).
///
/// The blocks of `current` that are not `next`'s are "old": trusted in `TrustBoth` and
/// `SignWithNew`, dropped in `DropOld`. Its key signs until `SignWithNew`.
pub fn desired_content(phase: Phase, current: Option<&KeyPairPem>, next: &KeyPairPem) -> Option<KeyPairPem> {
    let new_blocks = pem_blocks(&next.cert_pem);
    let old_blocks: Vec<String> = current
        .map(|c| pem_blocks(&c.cert_pem))
        .unwrap_or_default()
        .into_iter()
        .filter(|b| !new_blocks.contains(b))
        .collect();
    let join = |blocks: &[String]| blocks.concat();
    match phase {
        Phase::NewAuthority | Phase::Completed => None,
        Phase::TrustBoth => {
            let current = current?;
            Some(KeyPairPem {
                cert_pem: join(&[old_blocks.as_slice(), new_blocks.as_slice()].concat()),
                key_pem: current.key_pem.clone(),
            })
        }
        Phase::SignWithNew => Some(KeyPairPem {
            cert_pem: join(&[new_blocks.as_slice(), old_blocks.as_slice()].concat()),
            key_pem: next.key_pem.clone(),
        }),
        Phase::DropOld => Some(KeyPairPem {
            cert_pem: join(&new_blocks),
            key_pem: next.key_pem.clone(),
        }),
    }
}

/// What the rest of the control plane says about the current phase: each component that
/// mounts the authority (ready, and whether the digest on its pods is the one of the
/// Secrets as they are now).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentObservation {
    pub name: String,
    pub ready: bool,
    pub current_digest: bool,
}

/// Whether the phase has taken effect everywhere: every component ready on the digest of
/// the Secrets as they are now. `Err` names what it still waits for.
pub fn converged(components: &[ComponentObservation]) -> Result<(), String> {
    let waiting: Vec<String> = components
        .iter()
        .filter(|c| !c.ready || !c.current_digest)
        .map(|c| {
            if c.current_digest {
                format!("{} to be ready", c.name)
            } else {
                format!("{} to roll", c.name)
            }
        })
        .collect();
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(format!("waiting for {}", waiting.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cert: &str, key: &str) -> KeyPairPem {
        KeyPairPem {
            cert_pem: format!("-----BEGIN CERTIFICATE-----\n{cert}\n-----END CERTIFICATE-----\n"),
            key_pem: format!("-----BEGIN PRIVATE KEY-----\n{key}\n-----END PRIVATE KEY-----\n"),
        }
    }

    fn certs(p: &KeyPairPem) -> Vec<String> {
        pem_blocks(&p.cert_pem)
            .iter()
            .map(|b| b.lines().nth(1).unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn phases_move_old_and_new_through_the_bundle() {
        let old = pair("OLD", "oldkey");
        let new = pair("NEW", "newkey");
        assert_eq!(desired_content(Phase::NewAuthority, Some(&old), &new), None);
        let both = desired_content(Phase::TrustBoth, Some(&old), &new).unwrap();
        assert_eq!(certs(&both), ["OLD", "NEW"], "the old one still signs: it comes first");
        assert_eq!(both.key_pem, old.key_pem);
        // Resumed from TrustBoth's content: the same again (idempotent).
        assert_eq!(desired_content(Phase::TrustBoth, Some(&both), &new).unwrap(), both);
        let sign = desired_content(Phase::SignWithNew, Some(&both), &new).unwrap();
        assert_eq!(certs(&sign), ["NEW", "OLD"]);
        assert_eq!(sign.key_pem, new.key_pem);
        assert_eq!(desired_content(Phase::SignWithNew, Some(&sign), &new).unwrap(), sign);
        let dropped = desired_content(Phase::DropOld, Some(&sign), &new).unwrap();
        assert_eq!(certs(&dropped), ["NEW"]);
        assert_eq!(dropped.key_pem, new.key_pem);
        assert_eq!(desired_content(Phase::DropOld, Some(&dropped), &new).unwrap(), dropped);
        assert_eq!(desired_content(Phase::Completed, Some(&dropped), &new), None);
    }

    #[test]
    fn a_lost_authority_skips_trusting_both() {
        let new = pair("NEW", "newkey");
        assert_eq!(Phase::NewAuthority.next(true), Phase::SignWithNew);
        assert_eq!(Phase::NewAuthority.next(false), Phase::TrustBoth);
        assert_eq!(desired_content(Phase::TrustBoth, None, &new), None);
        let sign = desired_content(Phase::SignWithNew, None, &new).unwrap();
        assert_eq!(certs(&sign), ["NEW"]);
    }

    #[test]
    fn phases_advance_in_order_and_stop() {
        let mut phase = Phase::NewAuthority;
        let mut seen = vec![phase];
        while phase != Phase::Completed {
            phase = phase.next(false);
            seen.push(phase);
        }
        assert_eq!(
            seen.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
            ["NewAuthority", "TrustBoth", "SignWithNew", "DropOld", "Completed"]
        );
        for p in seen {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
        }
    }

    #[test]
    fn requests_name_an_authority_and_an_optional_id() {
        assert_eq!(parse_request("ca"), Ok(Authority::Cluster));
        assert_eq!(parse_request("etcd/2026-12-01"), Ok(Authority::Etcd));
        assert_eq!(parse_request("front-proxy"), Ok(Authority::FrontProxy));
        assert_eq!(parse_request(" sa "), Ok(Authority::ServiceAccount));
        let err = parse_request("kubelet").unwrap_err();
        assert!(
            err.contains("\"kubelet\"") && err.contains("ca, etcd, front-proxy, sa"),
            "{err}"
        );
    }

    #[test]
    fn convergence_names_what_it_waits_for() {
        let c = |name: &str, ready, current_digest| ComponentObservation {
            name: name.into(),
            ready,
            current_digest,
        };
        assert_eq!(converged(&[c("etcd", true, true), c("apiserver", true, true)]), Ok(()));
        assert_eq!(
            converged(&[
                c("etcd", true, true),
                c("apiserver", false, true),
                c("controller-manager", true, false)
            ]),
            Err("waiting for apiserver to be ready, controller-manager to roll".into())
        );
        assert_eq!(converged(&[]), Ok(()));
    }

    #[test]
    fn pem_blocks_split_bundles() {
        let text = "junk\n-----BEGIN A-----\nx\n-----END A-----\n\n-----BEGIN B-----\ny\n-----END B-----\n";
        assert_eq!(
            pem_blocks(text),
            [
                "-----BEGIN A-----\nx\n-----END A-----\n",
                "-----BEGIN B-----\ny\n-----END B-----\n"
            ]
        );
    }
}
