//! Signaling between the head and the members: JSON messages over the head's WebSocket (`/ring`),
//! the ring secret proved without being sent, and the session descriptions of every link relayed.
//!
//! A member connects; the head sends a fresh nonce; the member answers with its device name and
//! HMAC-SHA256 of the nonce under the ring secret. The head compares in constant time and refuses a
//! wrong proof before any WebRTC is set up. The secret itself never crosses the wire, never enters a
//! URL the node builds, a log or a file, and is wiped from memory when dropped.
//!
//! Everything here is a pure function of its input (no I/O): what the head accepts from an unknown
//! peer is decided in this crate, and `fuzz/` drives it with arbitrary bytes.

use std::fmt;

use daisy_wire::DeviceId;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use zeroize::Zeroizing;

/// Largest signaling message accepted (a session description with its candidates is a few KiB).
pub const MAX_SIGNAL_BYTES: usize = 64 * 1024;
/// Domain tag of the join proof.
const PROOF_TAG: &[u8] = b"daisy-join-v1";
/// The device name the head goes by in signaling.
pub const HEAD: &str = "head";

/// What signaling refuses, by name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("signaling message of {len} bytes, at most {MAX_SIGNAL_BYTES} accepted")]
    TooLarge { len: usize },
    #[error("malformed signaling message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("the head's nonce is not hex")]
    Nonce,
    #[error("the ring secret has {len} characters, expected at least 32 (128 bits as hex)")]
    SecretShort { len: usize },
    #[error("the ring secret may hold only letters, digits and - _ . ~")]
    SecretCharacters,
    #[error("device name refused: expected 1-64 of A-Z a-z 0-9 . _ -, not `head`")]
    DeviceName,
    #[error("the join URL must start with http:// (the head prints it when it starts)")]
    JoinScheme,
    #[error("the join URL names no head address")]
    JoinAddress,
    #[error("the join URL's address is not host:port: {0}")]
    JoinAuthority(#[from] http::uri::InvalidUri),
}

pub type Result<T> = std::result::Result<T, Error>;

/// One signaling message. Unknown fields and types are refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Signal {
    /// Head → member: prove the secret over this nonce (hex, 32 bytes).
    Challenge { nonce: String },
    /// Member → head: its device name and the proof (hex HMAC-SHA256).
    Auth { device: String, proof: String },
    /// Head → member: admitted, under this device name.
    Welcome { device: String },
    /// Head → member: refused, and why (the connection closes after it).
    Refused { reason: String },
    /// Head → member: open link `link` to `peer`, this member sending on it.
    Connect { link: u64, peer: String },
    /// A session offer for link `link`, its offerer's `attempt`-th (from 1; each attempt is a fresh
    /// offer); `peer` is the other end (the addressee when a member sends it, the sender when the
    /// head relays it).
    Offer {
        link: u64,
        attempt: u32,
        peer: String,
        role: Role,
        sdp: String,
    },
    /// The answer to attempt `attempt` of link `link`'s offer, `peer` read the same way: an answer
    /// that comes after its attempt was given up is told from the next attempt's.
    Answer {
        link: u64,
        attempt: u32,
        peer: String,
        sdp: String,
    },
}

impl Signal {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("signals serialize")
    }

    /// Parse one message, refusing oversized or malformed ones by name.
    pub fn parse(text: &str) -> Result<Self> {
        if text.len() > MAX_SIGNAL_BYTES {
            return Err(Error::TooLarge { len: text.len() });
        }
        Ok(serde_json::from_str(text)?)
    }
}

/// What a link carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The head's control channel to one member (hello, probe, plan, progress, turns, hops).
    Control,
    /// One leg of the ring: activations from the offerer to the answerer.
    Ring,
}

/// A member's device name as the head admits it: `wire`'s device grammar, and never the head's own.
pub fn member_name(device: &str) -> Result<()> {
    if device == HEAD || DeviceId::parse(device).is_err() {
        return Err(Error::DeviceName);
    }
    Ok(())
}

/// The ring secret: at least 128 random bits, shown once in the join URL and otherwise only held.
#[derive(Clone)]
pub struct Secret(Zeroizing<String>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([hidden])")
    }
}

impl Secret {
    /// 128 fresh random bits, as 32 hex digits.
    pub fn random() -> Self {
        let bytes: [u8; 16] = rand::random();
        Self(Zeroizing::new(hex::encode(bytes)))
    }

    /// A secret given by the user: refused when shorter than 32 characters (128 bits of hex), or
    /// when it holds characters that a URL fragment would have to escape.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.len() < 32 {
            return Err(Error::SecretShort { len: text.len() });
        }
        if !text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
        {
            return Err(Error::SecretCharacters);
        }
        Ok(Self(Zeroizing::new(text.to_string())))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    fn mac(&self, nonce: &[u8], device: &str) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(self.0.as_bytes()).expect("HMAC takes any key length");
        mac.update(PROOF_TAG);
        mac.update(&(nonce.len() as u64).to_le_bytes());
        mac.update(nonce);
        mac.update(device.as_bytes());
        mac
    }

    /// The proof a member sends for `nonce` under its device name.
    pub fn prove(&self, nonce: &str, device: &str) -> Result<String> {
        let nonce = hex::decode(nonce).map_err(|_| Error::Nonce)?;
        Ok(hex::encode(
            self.mac(&nonce, device).finalize().into_bytes(),
        ))
    }

    /// Whether `proof` is the proof of `nonce` and `device` (compared in constant time).
    pub fn check(&self, nonce: &[u8], device: &str, proof: &str) -> bool {
        let Ok(proof) = hex::decode(proof) else {
            return false;
        };
        self.mac(nonce, device).verify_slice(&proof).is_ok()
    }
}

/// A fresh challenge nonce.
pub fn nonce() -> [u8; 32] {
    rand::random()
}

/// A join URL split into the head's address and the secret its fragment carries.
pub struct JoinUrl {
    /// `ws://host:port/ring`.
    pub signal: String,
    /// `http://host:port/` (the head's own server, which also serves its model folder).
    pub base: String,
    pub secret: Option<Secret>,
}

impl JoinUrl {
    /// `http://host:port[/join]#secret` (the fragment is optional: the secret can come separately).
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let (url, fragment) = match text.split_once('#') {
            Some((u, f)) => (u, Some(f)),
            None => (text, None),
        };
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(Error::JoinScheme);
        };
        let authority = rest.split('/').next().unwrap_or("");
        if authority.is_empty() || authority.contains(['@', '?']) {
            return Err(Error::JoinAddress);
        }
        authority.parse::<http::uri::Authority>()?;
        let secret = match fragment {
            Some(f) if !f.is_empty() => Some(Secret::parse(f)?),
            _ => None,
        };
        Ok(Self {
            signal: format!("ws://{authority}/ring"),
            base: format!("http://{authority}/"),
            secret,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_checks_only_under_the_same_secret_nonce_and_device() {
        let secret = Secret::random();
        let other = Secret::random();
        let n = nonce();
        let proof = secret.prove(&hex::encode(n), "peer-a").unwrap();
        assert!(secret.check(&n, "peer-a", &proof));
        assert!(!other.check(&n, "peer-a", &proof));
        assert!(!secret.check(&n, "peer-b", &proof));
        assert!(!secret.check(&nonce(), "peer-a", &proof));
        assert!(!secret.check(&n, "peer-a", "zz"));
        assert!(matches!(secret.prove("xyz", "peer-a"), Err(Error::Nonce)));
    }

    #[test]
    fn signals_refuse_unknown_fields_and_types() {
        assert!(Signal::parse(r#"{"type":"welcome","device":"a"}"#).is_ok());
        assert!(Signal::parse(r#"{"type":"welcome","device":"a","x":1}"#).is_err());
        assert!(Signal::parse(r#"{"type":"launch"}"#).is_err());
        assert!(matches!(
            Signal::parse("not json"),
            Err(Error::Malformed(_))
        ));
        assert!(matches!(
            Signal::parse(&"x".repeat(MAX_SIGNAL_BYTES + 1)),
            Err(Error::TooLarge { .. })
        ));
    }

    /// An answer names the attempt it answers, as its offer did; one without is refused.
    #[test]
    fn offers_and_answers_carry_their_attempt() {
        let answer = Signal::Answer {
            link: 3,
            attempt: 2,
            peer: "head".into(),
            sdp: "{}".into(),
        };
        assert_eq!(Signal::parse(&answer.to_json()).unwrap(), answer);
        assert!(Signal::parse(r#"{"type":"answer","link":3,"peer":"head","sdp":"{}"}"#).is_err());
        let offer = r#"{"type":"offer","link":3,"attempt":1,"peer":"a","role":"ring","sdp":"{}"}"#;
        assert!(matches!(
            Signal::parse(offer).unwrap(),
            Signal::Offer { attempt: 1, .. }
        ));
    }

    #[test]
    fn member_names_follow_the_device_grammar_and_never_name_the_head() {
        assert!(member_name("laptop-2").is_ok());
        assert!(member_name("head").is_err());
        assert!(member_name("").is_err());
        assert!(member_name("a b").is_err());
        assert!(member_name(&"a".repeat(65)).is_err());
    }

    #[test]
    fn join_urls_carry_the_secret_in_the_fragment_only() {
        let s = "0123456789abcdef0123456789abcdef";
        let url = JoinUrl::parse(&format!("http://127.0.0.1:8788/join#{s}")).unwrap();
        assert_eq!(url.signal, "ws://127.0.0.1:8788/ring");
        assert_eq!(url.secret.unwrap().expose(), s);
        assert!(
            JoinUrl::parse("http://127.0.0.1:8788")
                .unwrap()
                .secret
                .is_none()
        );
        assert!(matches!(
            JoinUrl::parse("ftp://x:1#aaaa"),
            Err(Error::JoinScheme)
        ));
        assert!(matches!(
            JoinUrl::parse("http://127.0.0.1:8788#short"),
            Err(Error::SecretShort { len: 5 })
        ));
        assert!(matches!(
            JoinUrl::parse("http://user@host:1/"),
            Err(Error::JoinAddress)
        ));
        assert!(format!("{:?}", Secret::parse(s).unwrap()).contains("hidden"));
    }
}
