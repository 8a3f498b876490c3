//! Validated identifiers and digests that travel in messages: repo ids, revisions, commits, device
//! ids, short texts, GEMM rates, the model fingerprint and SHA-256 digests.
//!
//! Every type with a grammar has a private field and a `parse`/`new` that checks it, so a value of the
//! type is valid by construction; decoding goes through the same checks.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// Longest namespace or name the Hub accepts.
pub const MAX_REPO_PART: usize = 96;
/// Longest revision (branch, tag, `refs/pr/N` or commit) accepted after `@`.
pub const MAX_REVISION: usize = 255;
/// Longest device id.
pub const MAX_DEVICE_ID: usize = 64;
/// Longest [`Text`] in bytes.
pub const MAX_TEXT: usize = 1024;

macro_rules! digest {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The 32 bytes.
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), hex::encode(self.0))
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                let mut out = [0u8; 32];
                hex::decode_to_slice(s, &mut out).map_err(|_| Error::Digest {
                    value: s.chars().take(80).collect(),
                })?;
                Ok(Self(out))
            }
        }

        /// Hex in human-readable formats (JSON), the 32 raw bytes in binary ones (postcard).
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str(&hex::encode(self.0))
                } else {
                    self.0.serialize(s)
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                if d.is_human_readable() {
                    let s = String::deserialize(d)?;
                    s.parse().map_err(serde::de::Error::custom)
                } else {
                    <[u8; 32]>::deserialize(d).map(Self)
                }
            }
        }
    };
}

digest!(
    /// The model fingerprint: SHA-256 of the repo id, the resolved commit, the `config.json` bytes and
    /// every safetensors header. Two peers holding slices of different models disagree on it.
    Fingerprint
);
digest!(
    /// A SHA-256 digest (activation integrity, kernel probe output).
    Hash
);

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Why a repo id part is refused (checked in this order).
fn check_repo_part(part: &str, what: &'static str) -> Result<(), String> {
    let bytes = part.as_bytes();
    if bytes.is_empty() {
        return Err(format!("empty {what}"));
    }
    if bytes.len() > MAX_REPO_PART {
        return Err(format!(
            "{what} is {} characters, at most {MAX_REPO_PART}",
            bytes.len()
        ));
    }
    if let Some(c) = part
        .chars()
        .find(|&c| !(c.is_ascii() && (is_word(c as u8) || c == '-' || c == '.')))
    {
        return Err(format!(
            "{what} has {c:?}; only A-Z a-z 0-9 _ - . are allowed"
        ));
    }
    if !is_word(bytes[0]) || !is_word(bytes[bytes.len() - 1]) {
        return Err(format!(
            "{what} must start and end with a letter, digit or _"
        ));
    }
    Ok(())
}

/// A Hugging Face repo id, `org/name`, following the Hub's rules: each part 1 to 96 characters of
/// `[A-Za-z0-9._-]` starting and ending with a letter, digit or `_`; no `--` or `..` anywhere; not
/// ending in `.git`; exactly one `/`. Percent-encoding, whitespace and control characters are refused
/// (they fall outside the allowed characters). A revision (`@rev`) is not part of it: see [`ModelRef`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct RepoId(String);

impl RepoId {
    /// Checks `s` against the grammar.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let refuse = |reason: String| Error::RepoId {
            id: s.chars().take(200).collect(),
            reason,
        };
        let Some((org, name)) = s.split_once('/') else {
            return Err(refuse("expected `org/name` with exactly one `/`".into()));
        };
        if name.contains('/') {
            return Err(refuse("expected `org/name` with exactly one `/`".into()));
        }
        check_repo_part(org, "org").map_err(refuse)?;
        check_repo_part(name, "name").map_err(refuse)?;
        if s.contains("--") || s.contains("..") {
            return Err(refuse("`--` and `..` are not allowed".into()));
        }
        if name.ends_with(".git") {
            return Err(refuse("the name must not end in `.git`".into()));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part before the `/`.
    pub fn org(&self) -> &str {
        self.0.split_once('/').map_or("", |(o, _)| o)
    }

    /// The part after the `/`.
    pub fn name(&self) -> &str {
        self.0.split_once('/').map_or("", |(_, n)| n)
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RepoId({:?})", self.0)
    }
}

impl FromStr for RepoId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

/// A revision after `@`: a branch, a tag, `refs/pr/N` or a commit. 1 to 255 characters of
/// `[A-Za-z0-9._/-]`; no `..`, no `//`, no leading or trailing `/` or `.`, no leading `-`, not ending in
/// `.lock`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Revision(String);

impl Revision {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let refuse = |reason: &str| Error::Revision {
            revision: s.chars().take(300).collect(),
            reason: reason.to_owned(),
        };
        if s.is_empty() {
            return Err(refuse("empty revision"));
        }
        if s.len() > MAX_REVISION {
            return Err(refuse("longer than 255 characters"));
        }
        if !s
            .bytes()
            .all(|b| is_word(b) || b == b'-' || b == b'.' || b == b'/')
        {
            return Err(refuse("only A-Z a-z 0-9 _ - . / are allowed"));
        }
        if s.contains("..") || s.contains("//") {
            return Err(refuse("`..` and `//` are not allowed"));
        }
        if s.starts_with(['/', '.', '-']) || s.ends_with(['/', '.']) || s.ends_with(".lock") {
            return Err(refuse(
                "must not start with / . - nor end with / . or .lock",
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Revision({:?})", self.0)
    }
}

/// `org/name[@revision]` as a user writes it on the command line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelRef {
    pub repo: RepoId,
    pub revision: Option<Revision>,
}

impl ModelRef {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s.split_once('@') {
            None => Ok(Self {
                repo: RepoId::parse(s)?,
                revision: None,
            }),
            Some((repo, rev)) => Ok(Self {
                repo: RepoId::parse(repo)?,
                revision: Some(Revision::parse(rev)?),
            }),
        }
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.revision {
            Some(rev) => write!(f, "{}@{rev}", self.repo),
            None => write!(f, "{}", self.repo),
        }
    }
}

impl FromStr for ModelRef {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

/// A resolved commit: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Commit(String);

impl Commit {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let ok = (s.len() == 40 || s.len() == 64)
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !ok {
            return Err(Error::Commit {
                commit: s.chars().take(80).collect(),
            });
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Commit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Commit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Commit({})", self.0)
    }
}

/// A device id: 1 to 64 characters of `[A-Za-z0-9._-]`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct DeviceId(String);

impl DeviceId {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let ok = !s.is_empty()
            && s.len() <= MAX_DEVICE_ID
            && s.bytes().all(|b| is_word(b) || b == b'-' || b == b'.');
        if !ok {
            return Err(Error::DeviceId {
                id: s.chars().take(80).collect(),
            });
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceId({:?})", self.0)
    }
}

impl FromStr for DeviceId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

/// A short free text (backend name, software version, error message): at most 1024 bytes of UTF-8
/// without control characters.
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Text(String);

impl Text {
    pub fn new(s: &str) -> Result<Self, Error> {
        if s.len() > MAX_TEXT {
            return Err(Error::Text {
                len: s.len(),
                reason: "longer than 1024 bytes",
            });
        }
        if s.chars().any(char::is_control) {
            return Err(Error::Text {
                len: s.len(),
                reason: "has a control character",
            });
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A measured GEMM rate in int8 multiply-accumulates per second: finite and positive.
#[derive(Clone, Copy, PartialEq, PartialOrd, Serialize)]
#[serde(transparent)]
pub struct GemmRate(f64);

impl GemmRate {
    pub fn new(macs_per_second: f64) -> Result<Self, Error> {
        if !(macs_per_second.is_finite() && macs_per_second > 0.0) {
            return Err(Error::GemmRate {
                rate: macs_per_second,
            });
        }
        Ok(Self(macs_per_second))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl fmt::Debug for GemmRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GemmRate({:e})", self.0)
    }
}

impl fmt::Display for GemmRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3e} MAC/s", self.0)
    }
}
